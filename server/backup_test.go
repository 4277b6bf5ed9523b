package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// While a backup takes its instant no loaded stream commits: an append sent then is answered
// only after, and is not in the copy; the copy opens as a data directory of its own.
func TestBackup_LoadedStreamsStandStillForTheInstant(t *testing.T) {
	ctx := context.Background()
	dataDir := t.TempDir()
	s, projectID := mustOpen(t, Config{DataDir: dataDir})
	x := StreamRef{ProjectID: projectID, Path: "/x"}
	_, err := s.Append(ctx, x, []itx.EventInput{{Type: "before"}}, itx.AppendOptions{})
	require.NoError(t, err)

	during := make(chan error, 1)
	backupFrozenHook = func() {
		go func() {
			_, err := s.Append(ctx, x, []itx.EventInput{{Type: "during"}}, itx.AppendOptions{})
			during <- err
		}()
		select {
		case err := <-during:
			t.Errorf("an append was answered while the streams stood still (err %v)", err)
			during <- err
		case <-time.After(200 * time.Millisecond):
		}
	}
	t.Cleanup(func() { backupFrozenHook = nil })
	dest := filepath.Join(t.TempDir(), "copy")
	res, err := s.Backup(ctx, Admin{}, dest)
	require.NoError(t, err)
	require.Equal(t, 1, res.Streams)
	require.NoError(t, <-during)
	require.Equal(t, 1.0, testutil.ToFloat64(s.metrics.Backups.WithLabelValues("ok")))
	require.Equal(t, float64(res.At.UnixMilli())/1000, testutil.ToFloat64(s.metrics.BackupLastOK))
	backupFrozenHook = nil

	c, cp := mustOpen(t, Config{DataDir: dest})
	require.Equal(t, projectID, cp)
	page, err := c.ReadEvents(ctx, StreamRef{ProjectID: cp, Path: "/x"}, itx.Query{})
	require.NoError(t, err)
	require.Len(t, page.Events, 1)
	require.Equal(t, "before", page.Events[0].Type)
}

// One backup at a time; one cancelled while the streams stand still releases them at once and
// leaves nothing behind.
func TestBackup_OneAtATimeAndCancelled(t *testing.T) {
	ctx := context.Background()
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir()})
	x := StreamRef{ProjectID: projectID, Path: "/x"}
	_, err := s.Append(ctx, x, []itx.EventInput{{Type: "before"}}, itx.AppendOptions{})
	require.NoError(t, err)
	parent := t.TempDir()

	cctx, cancel := context.WithCancel(ctx)
	var second error
	backupFrozenHook = func() {
		_, second = s.Backup(ctx, Admin{}, filepath.Join(parent, "second"))
		cancel()
	}
	t.Cleanup(func() { backupFrozenHook = nil })
	_, err = s.Backup(cctx, Admin{}, filepath.Join(parent, "first"))
	backupFrozenHook = nil
	require.Equal(t, itx.EFailedPrecondition, itx.ErrorCode(second), "%v", second)
	require.Equal(t, itx.ECancelled, itx.ErrorCode(err), "%v", err)
	require.Equal(t, 1.0, testutil.ToFloat64(s.metrics.Backups.WithLabelValues(string(itx.ECancelled))))
	require.Equal(t, 1.0, testutil.ToFloat64(s.metrics.Backups.WithLabelValues(string(itx.EFailedPrecondition))))
	require.Equal(t, 0.0, testutil.ToFloat64(s.metrics.BackupLastOK))
	entries, err := os.ReadDir(parent)
	require.NoError(t, err)
	require.Empty(t, entries)

	// The stream was released: it takes appends, and the next backup holds them.
	_, err = s.Append(ctx, x, []itx.EventInput{{Type: "after"}}, itx.AppendOptions{})
	require.NoError(t, err)
	res, err := s.Backup(ctx, Admin{}, filepath.Join(parent, "third"))
	require.NoError(t, err)
	require.Equal(t, 1, res.Streams)
}

// A backup whose copy would not leave the margin free on its disk is refused before anything is
// written, resourceExhausted, saying what it needs.
func TestBackup_RefusedWithoutRoom(t *testing.T) {
	ctx := context.Background()
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir()})
	_, err := s.Append(ctx, StreamRef{ProjectID: projectID, Path: "/x"}, []itx.EventInput{{Type: "e"}}, itx.AppendOptions{})
	require.NoError(t, err)
	parent := t.TempDir()
	backupFreeBytes = func(string) (int64, bool) { return 10 << 20, true }
	t.Cleanup(func() { backupFreeBytes = freeBytes })
	_, err = s.Backup(ctx, Admin{}, filepath.Join(parent, "copy"))
	require.Equal(t, itx.EResourceExhausted, itx.ErrorCode(err), "%v", err)
	require.ErrorContains(t, err, "MiB free")
	entries, err := os.ReadDir(parent)
	require.NoError(t, err)
	require.Empty(t, entries)

	backupFreeBytes = func(string) (int64, bool) { return 1 << 40, true }
	_, err = s.Backup(ctx, Admin{}, filepath.Join(parent, "copy"))
	require.NoError(t, err)
}

// A backup on the data directory's own disk leaves the disk reserve free, not only its own margin:
// appends would be refused below the reserve. On another disk the reserve does not count.
func TestBackup_LeavesTheDiskReserveOnTheDataDisk(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, projectID := mustOpen(t, Config{DataDir: filepath.Join(root, "data"), MinFreeDisk: 1 << 30})
	_, err := s.Append(ctx, StreamRef{ProjectID: projectID, Path: "/x"}, []itx.EventInput{{Type: "e"}}, itx.AppendOptions{})
	require.NoError(t, err)
	backupFreeBytes = func(string) (int64, bool) { return 512 << 20, true } // the margin alone fits
	t.Cleanup(func() { backupFreeBytes = freeBytes })
	_, err = s.Backup(ctx, Admin{}, filepath.Join(root, "copy"))
	require.Equal(t, itx.EResourceExhausted, itx.ErrorCode(err), "%v", err)
	require.ErrorContains(t, err, "--min-free-disk-bytes")

	if other, err := os.MkdirTemp("/dev/shm", "backup"); err == nil && !sameFileSystem(other, root) {
		defer os.RemoveAll(other)
		_, err = s.Backup(ctx, Admin{}, filepath.Join(other, "copy"))
		require.NoError(t, err, "another disk: its own margin")
	}
}

// A project deleted while a backup copies (after its instant) is in the copy as it was: the
// removal of its stream's file waits for the backup to hold it.
func TestBackup_ProjectDeletedDuringTheCopy(t *testing.T) {
	ctx := context.Background()
	clock := clocktest.New(time.Unix(1_800_000_000, 0))
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir(), Clock: clock, IdleTimeout: time.Minute})
	info, _, _, err := s.CreateProject(ctx, Admin{}, "doomed")
	require.NoError(t, err)
	for i := 0; i < 4; i++ {
		_, err = s.Append(ctx, StreamRef{ProjectID: projectID, Path: fmt.Sprintf("/x%d", i)}, []itx.EventInput{{Type: "e"}}, itx.AppendOptions{})
		require.NoError(t, err)
	}
	_, err = s.Append(ctx, StreamRef{ProjectID: info.ID, Path: "/y"}, []itx.EventInput{{Type: "kept"}}, itx.AppendOptions{})
	require.NoError(t, err)
	// Every stream unloaded: the backup holds them as it copies, one by one.
	unloadIdle(t, s, clock)

	var deleted error
	backupCopiedHook = func() { deleted = s.DeleteProject(ctx, Admin{}, info.ID, true) }
	t.Cleanup(func() { backupCopiedHook = nil })
	dest := filepath.Join(t.TempDir(), "copy")
	res, err := s.Backup(ctx, Admin{}, dest)
	backupCopiedHook = nil
	require.NoError(t, err)
	require.NoError(t, deleted)
	require.Equal(t, 6, res.Streams) // and the deployment's /audit, which recorded the creation

	c, _ := mustOpen(t, Config{DataDir: dest})
	page, err := c.ReadEvents(ctx, StreamRef{ProjectID: info.ID, Path: "/y"}, itx.Query{})
	require.NoError(t, err)
	require.Len(t, page.Events, 1)
	require.Equal(t, "kept", page.Events[0].Type)
}

// A stream deleted while a backup copies (after its instant) is in the copy as it was, and the
// stream beside it too.
func TestBackup_StreamDeletedDuringTheCopy(t *testing.T) {
	ctx := context.Background()
	clock := clocktest.New(time.Unix(1_800_000_000, 0))
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir(), Clock: clock, IdleTimeout: time.Minute})
	for i := 0; i < 4; i++ {
		_, err := s.Append(ctx, StreamRef{ProjectID: projectID, Path: fmt.Sprintf("/x%d", i)}, []itx.EventInput{{Type: "e"}}, itx.AppendOptions{})
		require.NoError(t, err)
	}
	_, err := s.Append(ctx, StreamRef{ProjectID: projectID, Path: "/y"}, []itx.EventInput{{Type: "kept"}}, itx.AppendOptions{})
	require.NoError(t, err)
	unloadIdle(t, s, clock)

	var deleted error
	backupCopiedHook = func() {
		backupCopiedHook = nil
		_, deleted = s.DeleteStream(ctx, Admin{}, StreamRef{ProjectID: projectID, Path: "/y"}, false)
	}
	t.Cleanup(func() { backupCopiedHook = nil })
	dest := filepath.Join(t.TempDir(), "copy")
	res, err := s.Backup(ctx, Admin{}, dest)
	require.NoError(t, err)
	require.NoError(t, deleted)
	require.Equal(t, 5, res.Streams)
	page, err := s.ReadEvents(ctx, StreamRef{ProjectID: projectID, Path: "/y"}, itx.Query{})
	require.NoError(t, err)
	require.Empty(t, page.Events, "deleted here")

	c, _ := mustOpen(t, Config{DataDir: dest})
	page, err = c.ReadEvents(ctx, StreamRef{ProjectID: projectID, Path: "/y"}, itx.Query{})
	require.NoError(t, err)
	require.Len(t, page.Events, 1, "kept in the copy")
	require.Equal(t, "kept", page.Events[0].Type)
}

// unloadIdle unloads every stream of s, all idle, past an idle timeout under a minute.
func unloadIdle(t *testing.T, s *Server, clock *clocktest.Clock) {
	t.Helper()
	clock.Advance(2 * time.Minute)
	s.Sweep()
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.actors) == 0 && len(s.unloading) == 0
	}, 10*time.Second, time.Millisecond)
}
