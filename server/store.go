package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

// streamStore is all a stream actor asks of its log: the narrow seam that the simulation's
// fault-injecting wrapper implements, and that a second backend (a replicated log) would. Nothing
// above it assumes the log is a local file.
type streamStore interface {
	Meta(ctx context.Context) (storage.StreamMeta, error)
	KV(ctx context.Context, key string) ([]byte, error)
	// KVUsage counts the kv rows under a key prefix and their bytes (keys after the prefix, values).
	KVUsage(ctx context.Context, prefix string) (keys int, bytes int64, err error)
	CursorRows(ctx context.Context) ([]storage.CursorRow, error)
	Readers(ctx context.Context) ([]storage.Reader, error)
	// Scheduled appends: keys and times (what memory keeps), events by key, a bounded listing.
	ScheduledDue(ctx context.Context) ([]storage.Scheduled, error)
	ScheduledByKeys(ctx context.Context, keys []string) (map[string][]byte, error)
	ScheduledEvents(ctx context.Context, limit, maxBytes int) ([]storage.Scheduled, error)
	EventsByKeys(ctx context.Context, keys []string) (map[string]*itx.Event, error)
	Events(ctx context.Context, q storage.Query) ([]itx.Event, error)
	// Commit writes c in one transaction and returns once it is durable.
	Commit(ctx context.Context, c storage.Commit) error
	EphemeralBytes(ctx context.Context) (int64, error)
	EphemeralCutoff(ctx context.Context, need int64) (through, freed int64, err error)
	DeleteEphemeral(ctx context.Context, through, before int64) (int64, error)
	// TrimNoting deletes at most limit durable events (not stream/* records) through an offset,
	// in one transaction with the KV entries note returns, and returns how far the stream is
	// trimmed now and the deleted events' size (see storage.Stream.Trim).
	TrimNoting(ctx context.Context, through int64, limit int, note func(deleted, reached int64) map[string][]byte) (deleted, reached, bytes int64, err error)
	// TrimmableBytes and TrimmableThroughBytes measure what a trim could delete (retention's
	// maxBytes; see storage.Stream).
	TrimmableBytes(ctx context.Context, after, upTo int64, limit int) (bytes, last int64, n int, err error)
	TrimmableThroughBytes(ctx context.Context, want int64, limit int) (through, bytes int64, n int, err error)
	// LastCreatedBefore is the offset of the last event created before t (epoch ms).
	LastCreatedBefore(ctx context.Context, t int64) (int64, error)
	// OldestTrimmable is the offset and creation time of the first event a trim could delete.
	OldestTrimmable(ctx context.Context) (offset, createdAt int64, err error)
	// Vacuum gives space that deletes freed back to the file system, about maxBytes per call in
	// one transaction; left > 0 says more calls are owed (see storage.Stream.Vacuum).
	Vacuum(ctx context.Context, maxBytes int64) (freed, left int64, err error)
	Close() error
}

var _ streamStore = (*storage.Stream)(nil)

// streamBackend makes and opens the stores of streams: the seam a second backend (a replicated
// log) implements. Nothing above it knows a stream is a local SQLite file.
type streamBackend interface {
	// Create makes the store of a new stream; it fails if one exists.
	Create(ctx context.Context, meta storage.StreamMeta) (streamStore, error)
	// Open opens a stream's store. It returns nil, nil when the stream's directory entry
	// committed but its store was never made, or never finished (a crash in between: nothing
	// was acknowledged); Create then makes it.
	Open(ctx context.Context, streamID string) (streamStore, error)
	// Remove deletes the stores of streams that no longer exist, whatever of each is there (one
	// already gone is no error), and returns the IDs of those now gone for good: durably, so
	// neither a crash nor a power cut brings one back. err says why the others are not.
	Remove(ctx context.Context, streamIDs []string) (removed []string, err error)
	// HoldForBackup holds the store of a stream that nothing has open, as it stands, for a
	// backup to copy; nil, nil when the stream has no store.
	HoldForBackup(ctx context.Context, streamID string) (*storage.BackupSource, error)
	// DiskBytes is the size of a stream's files on disk now (0: none).
	DiskBytes(streamID string) int64
	// Where names a stream's store as an operator finds it (its file), for errors and logs.
	Where(streamID string) string
}

// sqliteBackend keeps each stream in its own SQLite file under dir.
type sqliteBackend struct{ dir string }

func (b sqliteBackend) file(streamID string) string { return filepath.Join(b.dir, streamID+".db") }

func (b sqliteBackend) Create(ctx context.Context, meta storage.StreamMeta) (streamStore, error) {
	return storage.CreateStream(ctx, b.file(meta.StreamID), meta)
}

func (b sqliteBackend) Open(ctx context.Context, streamID string) (streamStore, error) {
	file := b.file(streamID)
	if _, err := os.Stat(file); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	s, err := storage.OpenStream(ctx, file)
	if err != nil {
		if errors.Is(err, storage.ErrNotCreated) {
			return nil, nil
		}
		return nil, err
	}
	return s, nil
}

func (b sqliteBackend) Where(streamID string) string { return b.file(streamID) }

func (b sqliteBackend) DiskBytes(streamID string) int64 {
	file, n := b.file(streamID), int64(0)
	for _, name := range []string{file, file + "-wal", file + "-shm"} {
		if fi, err := os.Stat(name); err == nil {
			n += fi.Size()
		}
	}
	return n
}

func (b sqliteBackend) HoldForBackup(ctx context.Context, streamID string) (*storage.BackupSource, error) {
	return storage.OpenBackupSource(ctx, b.file(streamID))
}

// Remove deletes each stream's database with its WAL and shared-memory files, then syncs the
// folder, so the removals are on disk before the caller forgets the streams.
func (b sqliteBackend) Remove(ctx context.Context, streamIDs []string) ([]string, error) {
	var removed []string
	var errs []error
	for _, id := range streamIDs {
		f := b.file(id)
		var failed bool
		for _, name := range []string{f, f + "-wal", f + "-shm"} {
			if err := os.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
				failed = true
			}
		}
		if !failed {
			removed = append(removed, id)
		}
	}
	if len(removed) > 0 {
		if err := syncDir(b.dir); err != nil {
			return nil, errors.Join(append(errs, fmt.Errorf("sync %s: %w", b.dir, err))...)
		}
	}
	return removed, errors.Join(errs...)
}

// syncDir makes the entries removed from (or added to) a folder durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// StorageCode is the domain code of a storage failure (storage.ErrorCode): EResourceExhausted for
// a full disk, EUnavailable for a failing one (an I/O error), EInternal otherwise. The capability layer asks it here rather than importing
// storage.
func StorageCode(err error) itx.Code { return storage.ErrorCode(err) }

// unreadableStore marks a load (or a read) refused because the stream's store itself cannot be
// opened or read: lost, damaged, or a file itxd may not open. The directory failing, a full
// disk or the server closing are not it. A forced delete of such a stream goes ahead unread
// (deleteUnread), and the alarm's wake-up does not log it again (noteDamaged logged it once).
type unreadableStore struct{ err error }

func (e *unreadableStore) Error() string { return e.err.Error() }
func (e *unreadableStore) Unwrap() error { return e.err }

// storeUnreadable reports whether err is a stream's store that cannot be opened or read.
func storeUnreadable(err error) bool {
	_, ok := errors.AsType[*unreadableStore](err)
	return ok
}

// storeLost is the refusal to load a stream whose directory entry records its first commit
// while its store is missing or holds no stream (its file deleted, truncated to nothing, or on a
// file system that is not mounted): made anew, it would answer an empty log and reissue
// acknowledged offsets from 1. Logged as noteDamaged logs.
func (s *Server) storeLost(e storage.StreamEntry) error {
	err := itx.Errorf(itx.EUnavailable, "load stream %s: its database %s is missing or holds no stream, though the directory records events on it (head %d when last summarized): it was deleted, truncated or is on a file system that is not mounted; restore the file from a backup (README, Damaged storage), itxd does not make it anew empty",
		e.Path, s.backend.Where(e.StreamID), e.HeadOffset)
	s.noteDamaged(e.ProjectID, e.Path, e.StreamID, err)
	return &unreadableStore{err}
}

// readFailure is the error of a read of a stream's store, with the storage's code (a failing
// disk or a damaged file is unavailable: it was internal); a damaged file is named and logged.
func (s *Server) readFailure(streamID string, err error) error {
	if !storage.Damaged(err) {
		return itx.Errorf(storage.ErrorCode(err), "%v", err)
	}
	s.noteDamaged("", "", streamID, err)
	return itx.Errorf(itx.EUnavailable, "stream %s: its database %s is damaged (%v): restore the file from a backup (README, Damaged storage)",
		streamID, s.backend.Where(streamID), err)
}

// noteDamaged logs, at error level, a stream whose store could not be opened or read for a
// reason no retry mends by itself (a damaged or missing file, a file itxd may not open): an
// operator must act, and the client that met it may not say. Once per stream and message per
// process, so a client retrying does not flood the log; a full disk is the disk reserve's to
// log. projectID and path may be empty (a read knows the stream by its id).
func (s *Server) noteDamaged(projectID, path, streamID string, err error) {
	if storage.ErrorCode(err) == itx.EResourceExhausted {
		return
	}
	msg := err.Error()
	if prev, ok := s.damaged.Swap(streamID, msg); ok && prev == msg {
		return
	}
	s.log.Error().Err(err).Str("project", projectID).Str("path", path).Str("streamId", streamID).Str("file", s.backend.Where(streamID)).
		Msg("a stream cannot be served from its database (its calls answer unavailable; other streams are served): see README, Damaged storage")
}

// noteOpened logs what opening a stream's store did that an operator must hear of: a schema
// migration (an upgrade: the directory migrates at start, each stream as it is first opened
// after it, which the start's line does not cover).
func (s *Server) noteOpened(store streamStore, projectID, path, streamID string) {
	m, ok := store.(interface{ Migrated() (from, to int) })
	if !ok {
		return
	}
	if from, to := m.Migrated(); from > 0 && from != to {
		s.log.Info().Str("project", projectID).Str("path", path).Str("streamId", streamID).Int("from", from).Int("to", to).
			Msg("upgraded a stream's schema")
	}
}

// noteOldFileTrimmed logs, once per stream and process, that a trim of a stream whose file
// predates auto_vacuum gave no space back to the file system (its freed pages stay in the file
// for its next events), and how to convert the file. An operator trimming to free a filling
// disk saw nothing happen, and nothing said why.
func (a *actor) noteOldFileTrimmed(deleted int64) {
	f, ok := a.store.(interface {
		Incremental() bool
		File() string
	})
	if !ok || f.Incremental() || deleted == 0 {
		return
	}
	if _, logged := a.srv.oldFiles.LoadOrStore(a.st.streamID, true); logged {
		return
	}
	a.srv.log.Warn().Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Str("file", f.File()).Int64("deleted", deleted).
		Msg("trimmed a stream whose file an itxd before auto_vacuum made: the space stays in its file for its next events, not given back to the file system; to convert it, stop itxd and run sqlite3 <file> 'PRAGMA auto_vacuum = INCREMENTAL; VACUUM;' (README, Upgrading)")
}
