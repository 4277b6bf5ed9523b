package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

// BackupFreezeTimeout bounds the backup's freeze: how long it may take to bring every loaded
// stream to a stop between two commits. A freeze that takes longer (a stream whose writer is
// stuck) gives up, releases every stream and fails the backup with unavailable.
const BackupFreezeTimeout = 10 * time.Second

// backupFrozenHook, when set (tests), runs while every loaded stream stands still for a backup;
// backupCopiedHook once the backup has copied its first stream.
var backupFrozenHook, backupCopiedHook func()

// BackupResult says what a backup wrote.
type BackupResult struct {
	Path    string
	Streams int   // stream databases copied
	Bytes   int64 // bytes of the database files written
	// At is the instant the copy holds: every append acknowledged before it is in the copy,
	// none acknowledged after it.
	At time.Time
	// Frozen is how long the loaded streams stood still (appends to them waited) while the
	// instant was taken.
	Frozen time.Duration
}

// backupRun is a backup in progress: the streams that were not loaded at its instant and that
// it has not held yet. A load or a removal of one of those holds it first (claim), so nothing
// written after the instant reaches the copy.
type backupRun struct {
	gate chan struct{} // closed when the freeze ends; loads wait for it meanwhile

	mu      sync.Mutex
	pending map[string]bool
	taken   map[string]*storage.BackupSource
	err     error // a stream that could not be held
	// born: the streams whose first commit the directory records: a store missing under one
	// fails the backup (README, Damaged storage) rather than leaving the stream out of a copy
	// that would count as good and could replace the last backup holding it.
	born map[string]bool
}

// freezeReq asks a stream's actor to hold its store as it stands between two commits and then
// to write nothing until the freeze's release is closed.
type freezeReq struct {
	*freeze
	reply chan<- freezeReply
}

// freeze is one backup's instant being taken. When it fails (aborted, set before release is
// closed), each actor closes the source it held itself: the backup may not have read its reply.
type freeze struct {
	release chan struct{}
	aborted atomic.Bool
}

type freezeReply struct {
	streamID string
	src      *storage.BackupSource // nil: the stream has no store yet (nothing acknowledged)
	err      error
}

// holdForBackup runs on the actor: called between two commits, it holds the store as it stands
// and, when that worked, waits for the backup's instant to be taken by every other stream too.
func (a *actor) holdForBackup(r *freezeReq) {
	reply := freezeReply{streamID: a.st.streamID}
	// A stream being deleted with its project is gone from the directory the backup holds.
	if a.store != nil && !a.deleted.Load() {
		if h, ok := a.store.(interface {
			HoldForBackup(context.Context) (*storage.BackupSource, error)
		}); ok {
			reply.src, reply.err = h.HoldForBackup(context.Background())
		} else {
			reply.err = errors.New("this stream's store cannot be backed up")
		}
	}
	r.reply <- reply
	if reply.err == nil {
		<-r.release
		if r.aborted.Load() && reply.src != nil {
			reply.src.Close()
		}
	}
}

// Backup writes a copy of the data directory, as it stood at one instant, to dest: a new
// directory that itxd can be started on. dest must be an absolute path that does not exist,
// outside the data directory, whose parent exists. One backup runs at a time.
//
// The instant is taken by stopping every loaded stream between two commits (appends to them
// wait, for about a fraction of a millisecond per loaded stream), holding each database there
// in a read transaction, and the directory with them; then the streams go on while the copy is
// made from what was held. A stream that was not loaded is held before anything writes to it
// again (when it loads, or before it is removed). So the copy is the data directory as a kill -9
// at that instant would have left it: cursors written lazily may stand a little behind their
// receivers, which then see those events again, as after a crash.
//
// The deployment's /audit stream records each backup written (admin/backup-written: its path,
// what it holds, who asked), after the instant, so not in the copy itself.
func (s *Server) Backup(ctx context.Context, by Admin, dest string) (BackupResult, error) {
	parent, err := s.checkBackupDest(dest)
	if err != nil {
		s.metrics.Backups.WithLabelValues(string(itx.ErrorCode(err))).Inc()
		return BackupResult{}, err
	}
	return s.backupTo(ctx, by, parent, dest, dest)
}

// backupTo writes the backup to dest, a new folder in parent; audited as written to label
// ("": neither audited nor counted, the caller does both once the backup has reached its owner).
func (s *Server) backupTo(ctx context.Context, by Admin, parent, dest, label string) (res BackupResult, err error) {
	if label != "" {
		defer func() { s.countBackup(res, err) }()
	}
	if !s.backupMu.TryLock() {
		return BackupResult{}, itx.Errorf(itx.EFailedPrecondition, "a backup is already running")
	}
	defer s.backupMu.Unlock()
	// Counted as a call in flight: Close cancels it and waits for its temporary folder to go.
	if err := s.enterInflight(); err != nil {
		return BackupResult{}, err
	}
	defer s.inflight.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.base, cancel)
	defer stop()

	if err := s.checkBackupRoom(parent); err != nil {
		return BackupResult{}, err
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dest)+".itx-backup-")
	if err != nil {
		return BackupResult{}, itx.Errorf(storage.ErrorCode(err), "backup: %v", err)
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Mkdir(filepath.Join(tmp, "streams"), DataDirMode); err != nil {
		return BackupResult{}, itx.Errorf(storage.ErrorCode(err), "backup: %v", err)
	}

	run := &backupRun{gate: make(chan struct{}), pending: map[string]bool{}, taken: map[string]*storage.BackupSource{}}
	defer s.endBackup(run)
	dirSrc, held, at, frozen, err := s.freezeForBackup(ctx, run)
	if err != nil {
		return BackupResult{}, err
	}
	res = BackupResult{Path: dest, At: at, Frozen: frozen}

	n, err := dirSrc.CopyTo(ctx, filepath.Join(tmp, "directory.db"))
	dirSrc.Close()
	if err != nil {
		if ctx.Err() != nil {
			return BackupResult{}, s.backupCancelled(ctx)
		}
		return BackupResult{}, backupError(err)
	}
	res.Bytes += n
	copyStream := func(id string, src *storage.BackupSource) error {
		defer src.Close()
		n, err := src.CopyTo(ctx, filepath.Join(tmp, "streams", id+".db"))
		if err != nil {
			if ctx.Err() != nil {
				return s.backupCancelled(ctx)
			}
			return backupError(err)
		}
		res.Bytes += n
		if res.Streams++; res.Streams == 1 && backupCopiedHook != nil {
			backupCopiedHook()
		}
		return nil
	}
	for id, src := range held {
		delete(held, id)
		if err := copyStream(id, src); err != nil {
			for _, src := range held {
				src.Close()
			}
			return BackupResult{}, err
		}
	}
	for {
		id, src, more, err := run.next(s.backend)
		if err != nil {
			return BackupResult{}, backupError(err)
		}
		if !more {
			break
		}
		if src == nil {
			continue // no store was ever made: nothing acknowledged
		}
		if err := copyStream(id, src); err != nil {
			return BackupResult{}, err
		}
		if ctx.Err() != nil {
			return BackupResult{}, s.backupCancelled(ctx)
		}
	}

	// The tokens a fresh data directory printed, so `itx --data` works on the copy too.
	if b, err := os.ReadFile(filepath.Join(s.cfg.DataDir, CredentialsFile)); err == nil {
		if err := WriteFileDurably(filepath.Join(tmp, CredentialsFile), b, 0o600); err != nil {
			return BackupResult{}, backupError(err)
		}
	}
	for _, d := range []string{filepath.Join(tmp, "streams"), tmp} {
		if err := syncDir(d); err != nil {
			return BackupResult{}, backupError(err)
		}
	}
	if err := os.Rename(tmp, dest); err != nil {
		return BackupResult{}, backupError(err)
	}
	done = true
	if err := syncDir(parent); err != nil {
		return BackupResult{}, backupError(err)
	}
	if label != "" {
		s.auditBackup(by, label, res)
	}
	return res, nil
}

// countBackup counts a backup's outcome in the metrics.
func (s *Server) countBackup(res BackupResult, err error) {
	if err != nil {
		s.metrics.Backups.WithLabelValues(string(itx.ErrorCode(err))).Inc()
		return
	}
	s.metrics.Backups.WithLabelValues("ok").Inc()
	s.metrics.BackupLastOK.Set(float64(res.At.UnixMilli()) / 1000)
	s.metrics.BackupLastFrozen.Set(res.Frozen.Seconds())
}

// auditBackup logs a backup written and records it in the deployment's /audit stream.
func (s *Server) auditBackup(by Admin, label string, res BackupResult) {
	s.log.Info().Str("path", label).Int("streams", res.Streams).Int64("bytes", res.Bytes).
		Dur("frozen", res.Frozen).Str("by", by.TokenID).Msg("backup written")
	if rec, err := auditRecord(by, AuditBackupWritten, map[string]any{
		"path": label, "at": itx.UnixMilli(res.At), "streams": res.Streams, "bytes": res.Bytes,
	}); err == nil {
		// Kept in the directory first: an append that fails (the server shutting down right
		// after the copy was written or the download's last part accepted) leaves it pending,
		// appended at the next start (appendPendingAudits).
		if err := s.dir.KeepAudit(context.Background(), rec); err != nil {
			s.log.Error().Err(err).Msg("the backup's audit record is not kept for the next start; appending it now")
		}
		s.audit(context.Background(), rec)
	}
}

// backupCancelled is why a backup whose context ended stopped: the server shutting down, or the
// caller gone.
func (s *Server) backupCancelled(ctx context.Context) error {
	if s.base.Err() != nil {
		return itx.Errorf(itx.EUnavailable, "backup: the server is shutting down; nothing was written")
	}
	return itx.Errorf(itx.ECancelled, "backup: %v; nothing was written", ctx.Err())
}

func backupError(err error) error {
	if itx.ErrorCode(err) != itx.EInternal {
		return err
	}
	return itx.Errorf(storage.ErrorCode(err), "backup: %v", err)
}

// backupRoomMargin is the space a backup leaves free beyond its copy's expected size (the data
// directory's database files, plus a tenth): a backup on the data directory's disk must not fill
// it, or appends would fail for want of space.
const backupRoomMargin = 64 << 20

// backupFreeBytes reads a file system's free space (tests replace it).
var backupFreeBytes = freeBytes

// checkBackupRoom refuses a backup whose copy would not fit on parent's file system with the
// margin to spare (resourceExhausted), before anything is written.
func (s *Server) checkBackupRoom(parent string) error {
	free, ok := backupFreeBytes(parent)
	if !ok {
		return nil
	}
	size := dataDirBytes(s.cfg.DataDir)
	margin, why := int64(backupRoomMargin), "the margin a backup leaves"
	if s.cfg.MinFreeDisk > margin && sameFileSystem(parent, s.cfg.DataDir) {
		// On the data directory's disk the copy leaves the disk reserve free (appends would be
		// refused below it).
		margin, why = s.cfg.MinFreeDisk, "the data directory's disk reserve (--min-free-disk-bytes) left free"
	}
	if need := size + size/10 + margin; free < need {
		return itx.Errorf(itx.EResourceExhausted, "backup: %s has %d MiB free; a copy of the data directory (%d MiB) needs about %d MiB with %s", parent, free>>20, size>>20, need>>20, why)
	}
	return nil
}

// dataDirBytes is the size of the data directory's database files (with their write-ahead logs).
func dataDirBytes(dir string) int64 {
	var total int64
	for _, d := range []string{dir, filepath.Join(dir, "streams")} {
		entries, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range entries {
			if e.IsDir() {
				continue
			}
			if info, err := e.Info(); err == nil {
				total += info.Size()
			}
		}
	}
	return total
}

// checkBackupDest refuses a destination that is not a new directory outside the data directory,
// and returns its parent.
func (s *Server) checkBackupDest(dest string) (string, error) {
	if dest == "" || !filepath.IsAbs(dest) {
		return "", itx.Errorf(itx.EInvalid, "backup: the destination must be an absolute path on the server, not %q", dest)
	}
	dest = filepath.Clean(dest)
	if _, err := os.Lstat(dest); err == nil {
		return "", itx.Errorf(itx.EFailedPrecondition, "backup: %s exists (a backup writes a new directory)", dest)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", itx.Errorf(itx.EFailedPrecondition, "backup: %v", err)
	}
	parent := filepath.Dir(dest)
	if st, err := os.Stat(parent); err != nil || !st.IsDir() {
		return "", itx.Errorf(itx.EFailedPrecondition, "backup: the folder %s does not exist", parent)
	}
	data, err := filepath.Abs(s.cfg.DataDir)
	if err != nil {
		return "", itx.Errorf(itx.EInternal, "backup: %v", err)
	}
	realParent, err := filepath.EvalSymlinks(parent)
	if err != nil {
		return "", itx.Errorf(itx.EFailedPrecondition, "backup: %v", err)
	}
	if realData, err := filepath.EvalSymlinks(data); err == nil {
		data = realData
	}
	if realParent == data || strings.HasPrefix(realParent, data+string(filepath.Separator)) {
		return "", itx.Errorf(itx.EInvalid, "backup: %s is inside the data directory %s", dest, s.cfg.DataDir)
	}
	return parent, nil
}

// freezeForBackup takes the backup's instant: no new stream loads meanwhile, every loaded stream
// stops between two commits and holds its database, then the directory is held. It returns the
// directory's source and the loaded streams' (by stream ID); run.pending holds the other
// streams of the directory, which loads and removals hold from now on.
func (s *Server) freezeForBackup(ctx context.Context, run *backupRun) (dirSrc *storage.BackupSource, held map[string]*storage.BackupSource, at time.Time, frozen time.Duration, err error) {
	fctx, cancel := context.WithTimeout(ctx, BackupFreezeTimeout)
	defer cancel()
	timedOut := func() error {
		if ctx.Err() != nil {
			return s.backupCancelled(ctx)
		}
		return itx.Errorf(itx.EUnavailable, "backup: the loaded streams did not all stop within %s; nothing was written", BackupFreezeTimeout)
	}

	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return nil, nil, time.Time{}, 0, itx.Errorf(itx.EUnavailable, "the server is shutting down")
	}
	s.backup = run
	actors := make([]*actor, 0, len(s.actors))
	for _, a := range s.actors {
		actors = append(actors, a)
	}
	// A stream on its way out may still write its last acknowledgements: it stands still too
	// (its stop reads its inbox while its pushes end), or is shut before the instant.
	for _, a := range s.unloading {
		actors = append(actors, a)
	}
	s.mu.Unlock()

	held = map[string]*storage.BackupSource{}
	fr := &freeze{release: make(chan struct{})}
	defer func() {
		if err != nil {
			fr.aborted.Store(true) // each actor closes what it held
			held = nil
		}
		close(fr.release)
	}()
	start := time.Now()
	empty := map[string]bool{}
	replies := make([]chan freezeReply, len(actors))
	// Loads under way end first: one may wait for its stream's previous incarnation to shut,
	// which must not stand still meanwhile.
	for _, a := range actors {
		select {
		case <-a.ready:
		case <-fctx.Done():
			return nil, nil, time.Time{}, 0, timedOut()
		}
	}
	for i, a := range actors {
		if a.loadErr != nil {
			continue
		}
		replies[i] = make(chan freezeReply, 1)
		select {
		case a.inbox <- &actorMsg{freeze: &freezeReq{freeze: fr, reply: replies[i]}}:
		case <-a.done:
			replies[i] = nil // unloaded meanwhile: closed, so held like any stream not loaded
		case <-fctx.Done():
			return nil, nil, time.Time{}, 0, timedOut()
		}
	}
	for i, a := range actors {
		if replies[i] == nil {
			continue
		}
		select {
		case r := <-replies[i]:
			if r.err != nil {
				return nil, nil, time.Time{}, 0, backupError(fmt.Errorf("stream %s: %w", a.ref.Path, r.err))
			}
			if r.src != nil {
				held[r.streamID] = r.src
			} else if r.streamID != "" {
				empty[r.streamID] = true
			}
		case <-a.done:
			// It stopped before it read the request (an actor that held its store stands
			// still until the release, so it cannot be done): shut now, nothing writes it.
		case <-fctx.Done():
			return nil, nil, time.Time{}, 0, timedOut()
		}
	}
	// Every loaded stream stands still: this is the instant.
	if backupFrozenHook != nil {
		backupFrozenHook()
	}
	at = s.clock.Now()
	dirSrc, err = s.dir.HoldForBackup(fctx)
	if err != nil {
		if fctx.Err() != nil {
			return nil, nil, time.Time{}, 0, timedOut()
		}
		return nil, nil, time.Time{}, 0, backupError(err)
	}
	ids, born, err := dirSrc.StreamIDs(fctx)
	if err != nil {
		dirSrc.Close()
		if fctx.Err() != nil {
			return nil, nil, time.Time{}, 0, timedOut()
		}
		return nil, nil, time.Time{}, 0, backupError(err)
	}
	listed := make(map[string]bool, len(ids))
	run.mu.Lock()
	run.born = born
	for _, id := range ids {
		listed[id] = true
		if held[id] == nil && !empty[id] {
			run.pending[id] = true
		}
	}
	run.mu.Unlock()
	// A stream the directory no longer lists (deleted with its project before the instant, its
	// actor not yet told) is not part of the copy.
	for id, src := range held {
		if !listed[id] {
			src.Close()
			delete(held, id)
		}
	}
	frozen = time.Since(start)
	close(run.gate)
	return dirSrc, held, at, frozen, nil
}

// endBackup forgets run: loads and removals no longer hold anything for it.
func (s *Server) endBackup(run *backupRun) {
	s.mu.Lock()
	if s.backup == run {
		s.backup = nil
	}
	s.mu.Unlock()
	select {
	case <-run.gate:
	default:
		close(run.gate)
	}
	run.mu.Lock()
	defer run.mu.Unlock()
	for id, src := range run.taken {
		src.Close()
		delete(run.taken, id)
	}
	run.pending = map[string]bool{}
}

// backupClaim holds the stream for the running backup, if it is one the backup still owes, before
// anything writes to it or removes it.
func (s *Server) backupClaim(streamID string) {
	s.mu.Lock()
	run := s.backup
	s.mu.Unlock()
	if run != nil {
		run.claim(streamID, s.backend)
	}
}

// backupGateLocked is the channel a load must wait for (nil: none): while a backup takes its instant,
// no stream loads. Called with s.mu held.
func (s *Server) backupGateLocked() <-chan struct{} {
	if s.backup == nil {
		return nil
	}
	select {
	case <-s.backup.gate:
		return nil
	default:
		return s.backup.gate
	}
}

func (r *backupRun) claim(streamID string, b streamBackend) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.claimLocked(streamID, b)
}

func (r *backupRun) claimLocked(streamID string, b streamBackend) {
	if !r.pending[streamID] {
		return
	}
	delete(r.pending, streamID)
	src, err := b.HoldForBackup(context.Background(), streamID)
	if err == nil && src == nil && r.born[streamID] {
		err = itx.Errorf(itx.EUnavailable, "stream %s: its database %s is missing, though the directory records events on it: restore the file (README, Damaged storage)", streamID, b.Where(streamID))
	}
	if err != nil {
		if r.err == nil {
			r.err = fmt.Errorf("stream %s (%s): %w", streamID, b.Where(streamID), err)
		}
		return
	}
	if src != nil {
		r.taken[streamID] = src
	}
}

// next returns a stream the backup still has to copy: one held already, else the next one owed
// (its source nil when it has no store); more is false when none is left.
func (r *backupRun) next(b streamBackend) (id string, src *storage.BackupSource, more bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return "", nil, false, r.err
	}
	for id, src := range r.taken {
		delete(r.taken, id)
		return id, src, true, nil
	}
	for id := range r.pending {
		r.claimLocked(id, b)
		if r.err != nil {
			return "", nil, false, r.err
		}
		src := r.taken[id]
		delete(r.taken, id)
		return id, src, true, nil
	}
	return "", nil, false, nil
}

// enterInflight counts a long call (a backup, a download) or the server's own background work
// (the alarm wake-up, the idle sweep) as in flight, so that Close cancels it and waits for it
// before it closes the databases that work uses; refused once the server is closing. The caller
// calls s.inflight.Done.
func (s *Server) enterInflight() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return itx.Errorf(itx.EUnavailable, "the server is shutting down")
	}
	s.inflight.Add(1)
	return nil
}
