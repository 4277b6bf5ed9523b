package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	sqlite3 "github.com/mattn/go-sqlite3"
	"github.com/psanford/sqlite3vfs"
	"github.com/stretchr/testify/require"
)

// A power cut, unlike kill -9, loses what the page cache held: only synced bytes survive. kill -9
// cannot catch a missing or misplaced fsync, so this test runs the stream's storage on a VFS
// that keeps every file's written bytes apart from its synced bytes and, at a cut, keeps only the
// synced ones. psanford/sqlite3vfs serves no shared memory, so the connection uses WAL with
// exclusive locking (the WAL index lives in the connection's heap instead).

// memFS is an in-memory file system whose files remember what was last synced.
type memFS struct {
	mu       sync.Mutex
	files    map[string]*memFile
	ops      int  // writes, truncates and syncs since armed
	failAt   int  // the op at which the power goes (0: never)
	down     bool // the power is gone: every write, truncate and sync fails
	skipSync bool // a broken fsync, to show the check catches it
}

type memFile struct {
	fs     *memFS
	data   []byte // what the process sees (page cache)
	synced []byte // what survives a power cut
}

var errPowerCut = errors.New("power cut")

// step counts one mutating op and reports whether the power is already gone.
func (fs *memFS) step() error {
	if fs.down {
		return errPowerCut
	}
	fs.ops++
	if fs.failAt > 0 && fs.ops >= fs.failAt {
		fs.down = true
		return errPowerCut
	}
	return nil
}

// cut loses every unsynced byte and restores the power.
func (fs *memFS) cut() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, f := range fs.files {
		f.data = slices.Clone(f.synced)
	}
	fs.down, fs.failAt, fs.ops = false, 0, 0
}

func (fs *memFS) Open(name string, flags sqlite3vfs.OpenFlag) (sqlite3vfs.File, sqlite3vfs.OpenFlag, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	f := fs.files[name]
	if f == nil {
		if flags&sqlite3vfs.OpenCreate == 0 {
			return nil, 0, sqlite3vfs.CantOpenError
		}
		f = &memFile{fs: fs} // creating a file is durable at once (a simplification)
		fs.files[name] = f
	}
	return f, flags, nil
}

func (fs *memFS) Delete(name string, dirSync bool) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	delete(fs.files, name)
	return nil
}

func (fs *memFS) Access(name string, flag sqlite3vfs.AccessFlag) (bool, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	_, ok := fs.files[name]
	return ok, nil
}

func (fs *memFS) FullPathname(name string) string { return name }

func (f *memFile) Close() error { return nil }

func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	n := 0
	if off < int64(len(f.data)) {
		n = copy(p, f.data[off:])
	}
	if n < len(p) {
		clear(p[n:]) // SQLite expects a short read zero-filled
		return n, sqlite3vfs.IOErrorShortRead
	}
	return n, nil
}

func (f *memFile) WriteAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.fs.step(); err != nil {
		return 0, err
	}
	if end := off + int64(len(p)); end > int64(len(f.data)) {
		f.data = append(f.data, make([]byte, end-int64(len(f.data)))...)
	}
	return copy(f.data[off:], p), nil
}

func (f *memFile) Truncate(size int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.fs.step(); err != nil {
		return err
	}
	if size < int64(len(f.data)) {
		f.data = f.data[:size]
	}
	return nil
}

func (f *memFile) Sync(sqlite3vfs.SyncType) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.fs.step(); err != nil {
		return err
	}
	if !f.fs.skipSync {
		f.synced = slices.Clone(f.data)
	}
	return nil
}

func (f *memFile) FileSize() (int64, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	return int64(len(f.data)), nil
}

func (f *memFile) Lock(sqlite3vfs.LockType) error                         { return nil }
func (f *memFile) Unlock(sqlite3vfs.LockType) error                       { return nil }
func (f *memFile) CheckReservedLock() (bool, error)                       { return false, nil }
func (f *memFile) SectorSize() int64                                      { return 4096 }
func (f *memFile) DeviceCharacteristics() sqlite3vfs.DeviceCharacteristic { return 0 }

// powerVFS routes the registered VFS to the current test's file system.
type powerVFS struct {
	mu sync.Mutex
	fs *memFS
}

func (v *powerVFS) cur() *memFS { v.mu.Lock(); defer v.mu.Unlock(); return v.fs }
func (v *powerVFS) Open(name string, flags sqlite3vfs.OpenFlag) (sqlite3vfs.File, sqlite3vfs.OpenFlag, error) {
	return v.cur().Open(name, flags)
}
func (v *powerVFS) Delete(name string, dirSync bool) error { return v.cur().Delete(name, dirSync) }
func (v *powerVFS) Access(name string, flag sqlite3vfs.AccessFlag) (bool, error) {
	return v.cur().Access(name, flag)
}
func (v *powerVFS) FullPathname(name string) string { return name }

var (
	powerOnce sync.Once
	power     = &powerVFS{}
)

// usePowerCutVFS points storage's connections at a fresh memFS for the rest of the test.
func usePowerCutVFS(t *testing.T) *memFS {
	powerOnce.Do(func() {
		if err := sqlite3vfs.RegisterVFS("itxpowercut", power); err != nil {
			panic(err)
		}
		sql.Register("sqlite3_itx_powercut", &sqlite3.SQLiteDriver{
			ConnectHook: func(c *sqlite3.SQLiteConn) error {
				for _, p := range []string{
					"PRAGMA locking_mode=EXCLUSIVE", // before WAL: this VFS has no shared memory
					"PRAGMA journal_mode=WAL",
					"PRAGMA synchronous=FULL",
					"PRAGMA foreign_keys=ON",
				} {
					if _, err := c.Exec(p, nil); err != nil {
						return fmt.Errorf("%s: %w", p, err)
					}
				}
				return nil
			},
		})
	})
	fs := &memFS{files: map[string]*memFile{}}
	power.mu.Lock()
	power.fs = fs
	power.mu.Unlock()
	openDriver, openDSNSuffix = "sqlite3_itx_powercut", "&vfs=itxpowercut&_locking_mode=EXCLUSIVE"
	t.Cleanup(func() { openDriver, openDSNSuffix = driverName, "" })
	return fs
}

// powerCutRun appends batches with a subscription's confirmed offset until the power goes at
// op failAt, cuts it, reopens and returns what was acknowledged and what survived.
type powerCutResult struct {
	ackedHead, ackedConfirmed int64
	cutMidWorkload            bool
	offsets                   []int64
	head, confirmed           int64
}

func powerCutRun(t *testing.T, fs *memFS, file string, failAt int, rnd *rand.Rand) powerCutResult {
	ctx := context.Background()
	s, err := CreateStream(ctx, file, StreamMeta{StreamID: "sid", ProjectID: "p", Path: "/a", CreatedAt: 1})
	require.NoError(t, err)
	fs.mu.Lock()
	fs.failAt, fs.ops = failAt, 0
	fs.mu.Unlock()

	var res powerCutResult
	head := int64(0)
	for i := 0; i < 200; i++ {
		n := 1 + rnd.Intn(20)
		batch := events(head+1, n, 0)
		c := Commit{Events: batch, HeadOffset: head + int64(n), LastAppendAt: 100,
			CursorUpserts: []CursorRow{{Name: "sub", ConfiguredAtOffset: 1, ConfirmedOffset: head, Status: "active"}}}
		if err := s.Commit(ctx, c); err != nil {
			res.cutMidWorkload = true
			break // the power went during this commit: it was never acknowledged
		}
		head += int64(n)
		res.ackedHead, res.ackedConfirmed = head, c.CursorUpserts[0].ConfirmedOffset
	}
	s.Close() // with the power gone nothing more reaches the files
	fs.cut()

	s, err = OpenStream(ctx, file)
	require.NoError(t, err, "reopen after the power cut")
	defer s.Close()
	rows, err := s.w.QueryContext(ctx, `select offset from events order by offset`)
	require.NoError(t, err)
	for rows.Next() {
		var o int64
		require.NoError(t, rows.Scan(&o))
		res.offsets = append(res.offsets, o)
	}
	require.NoError(t, rows.Err())
	require.NoError(t, s.w.QueryRowContext(ctx, `select head_offset from stream_meta`).Scan(&res.head))
	err = s.w.QueryRowContext(ctx, `select confirmed_offset from subscription_cursors where name = 'sub'`).Scan(&res.confirmed)
	if !errors.Is(err, sql.ErrNoRows) {
		require.NoError(t, err)
	}
	return res
}

// TestStream_PowerCutKeepsEveryAcknowledgedCommit cuts the power at seeded random points of an
// append-and-confirm workload: after reopening, every acknowledged event and confirmed cursor is
// there, the log has no gap, and the head matches the log.
func TestStream_PowerCutKeepsEveryAcknowledgedCommit(t *testing.T) {
	rnd := rand.New(rand.NewSource(8))
	withAcks := 0
	defer func() { require.Greater(t, withAcks, 10, "rounds that acknowledged something before the cut") }()
	for round := 0; round < 25; round++ {
		fs := usePowerCutVFS(t)
		failAt := 1 + rnd.Intn(400)
		res := powerCutRun(t, fs, filepath.Join(t.TempDir(), "s.db"), failAt, rnd)
		msg := fmt.Sprintf("round %d, power cut at op %d", round, failAt)
		require.True(t, res.cutMidWorkload, "%s: the workload ended before the power went", msg)
		if res.ackedHead > 0 {
			withAcks++
		}
		require.GreaterOrEqual(t, res.head, res.ackedHead, "%s: an acknowledged event was lost", msg)
		require.GreaterOrEqual(t, res.confirmed, res.ackedConfirmed, "%s: a confirmed cursor went back", msg)
		require.Len(t, res.offsets, int(res.head), "%s: the log and its head disagree", msg)
		for i, o := range res.offsets {
			require.Equal(t, int64(i+1), o, "%s: a gap in the log", msg)
		}
	}
}

// The check can fail: with fsync broken (a sync that persists nothing), acknowledged events are
// lost at a power cut and the same comparison sees it.
func TestStream_PowerCutCatchesABrokenFsync(t *testing.T) {
	fs := usePowerCutVFS(t)
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "s.db")
	s, err := CreateStream(ctx, file, StreamMeta{StreamID: "sid", ProjectID: "p", Path: "/a", CreatedAt: 1})
	require.NoError(t, err)
	fs.mu.Lock()
	fs.skipSync = true
	fs.mu.Unlock()
	require.NoError(t, s.Commit(ctx, Commit{Events: events(1, 5, 0), HeadOffset: 5, LastAppendAt: 100}))
	fs.mu.Lock()
	fs.down = true // the power goes before the close can write anything
	fs.mu.Unlock()
	s.Close()
	fs.cut()
	s, err = OpenStream(ctx, file)
	require.NoError(t, err)
	defer s.Close()
	var head int64
	require.NoError(t, s.w.QueryRowContext(ctx, `select head_offset from stream_meta`).Scan(&head))
	require.Less(t, head, int64(5), "a commit whose fsync persisted nothing must not survive the cut")
}

// TestStream_PowerCutDuringVacuum cuts the power at seeded random points while a trimmed
// stream gives its space back, appends going on between the vacuum's turns: after reopening,
// the file passes SQLite's integrity check, every acknowledged append is there, the events the
// trim kept are intact and the trimmed ones stay gone.
func TestStream_PowerCutDuringVacuum(t *testing.T) {
	rnd := rand.New(rand.NewSource(9))
	ctx := context.Background()
	cutInVacuum := 0
	defer func() { require.Greater(t, cutInVacuum, 8, "rounds whose power went inside a vacuum") }()
	for round := 0; round < 24; round++ {
		fs := usePowerCutVFS(t)
		file := filepath.Join(t.TempDir(), "s.db")
		s, err := CreateStream(ctx, file, StreamMeta{StreamID: "sid", ProjectID: "p", Path: "/a", CreatedAt: 1})
		require.NoError(t, err)
		head := fillKiB(t, s, 0, 4000)
		kept := []int64{50, 1500}[round%2] // most of the file cut off its end, or pages moved too
		for {
			n, _, _, err := s.Trim(ctx, head-kept, 5000)
			require.NoError(t, err)
			if n == 0 {
				break
			}
		}
		trimmedThrough := head - kept
		failAt := 1 + rnd.Intn(300) // the vacuum and its appends take 250-350 ops
		msg := fmt.Sprintf("round %d (%d events kept), power cut at op %d", round, kept, failAt)
		fs.mu.Lock()
		fs.failAt, fs.ops = failAt, 0
		fs.mu.Unlock()
		acked := head
		for {
			if _, left, err := s.Vacuum(ctx, 256<<10); err != nil {
				cutInVacuum++
				break
			} else if left == 0 {
				break
			}
			batch := events(acked+1, 1+rnd.Intn(3), 0)
			next := acked + int64(len(batch))
			if err := s.Commit(ctx, Commit{Events: batch, HeadOffset: next, LastAppendAt: 100}); err != nil {
				break // never acknowledged
			}
			acked = next
		}
		s.Close()
		fs.cut()

		s, err = OpenStream(ctx, file)
		require.NoError(t, err, "%s: reopen", msg)
		var check string
		require.NoError(t, s.w.QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&check))
		require.Equal(t, "ok", check, msg)
		m, err := s.Meta(ctx)
		require.NoError(t, err)
		require.GreaterOrEqual(t, m.HeadOffset, acked, "%s: an acknowledged append was lost", msg)
		require.Equal(t, trimmedThrough, m.TrimmedThrough, msg)
		got, err := s.Events(ctx, Query{After: 0, UpTo: m.HeadOffset, Limit: 10_000})
		require.NoError(t, err)
		require.Len(t, got, int(m.HeadOffset-trimmedThrough), "%s: the events after the trim, no more, no fewer", msg)
		for i, e := range got {
			require.Equal(t, trimmedThrough+1+int64(i), e.Offset, "%s: a gap", msg)
		}
		require.NoError(t, s.Close())
	}
}
