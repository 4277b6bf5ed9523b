package server

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/stretchr/testify/require"
)

// fullDiskBackend is the SQLite backend on a disk too full to open a stream for writing (SQLite
// cannot make the -shm file an ordinary open needs): Open fails with ENOSPC, while the file can
// still be read alone (Snapshot, promoted from sqliteBackend).
type fullDiskBackend struct{ sqliteBackend }

func (fullDiskBackend) Open(context.Context, string) (streamStore, error) {
	return nil, fmt.Errorf("open stream: %w", syscall.ENOSPC)
}

// A read that joins a load failing for a full disk reads the stream's file alone, even when it
// comes while the failed load is being given up. abandonLoad published the failure (ready
// closed) before it took the actor out of the registry: a read in between joined the same
// failed load on each of whileFull's 64 turns, at once, and answered the load's error
// (TestDiskFull_UnloadedStreamsStayReadable, about 1 run in 30 on a loaded machine).
func TestReadEvents_JoiningAnAbandonedLoadReadsTheFile(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	clk := clocktest.New(time.Unix(1_800_000_000, 0))
	s, projectID := mustOpen(t, Config{DataDir: dir, Clock: clk})
	ref := StreamRef{ProjectID: projectID, Path: "/full"}
	_, err := s.Append(ctx, ref, []itx.EventInput{{Type: "a"}, {Type: "b"}}, itx.AppendOptions{})
	require.NoError(t, err)
	clk.Advance(2 * s.cfg.IdleTimeout)
	s.Sweep()
	require.Equal(t, 0, s.LoadedStreams())
	s.backend = fullDiskBackend{sqliteBackend{dir: filepath.Join(dir, "streams")}}

	// The second read runs inside the first read's failed load, as it is given up.
	type answer struct {
		page itx.Page
		err  error
	}
	var inner answer
	var entered atomic.Bool // the inner read's own failed load runs the hook too
	loadAbandonedHook = func(r StreamRef) {
		if r == ref && entered.CompareAndSwap(false, true) {
			inner.page, inner.err = s.ReadEvents(ctx, ref, itx.Query{})
		}
	}
	t.Cleanup(func() { loadAbandonedHook = nil })
	outer, err := s.ReadEvents(ctx, ref, itx.Query{})
	require.NoError(t, err, "the read whose load failed")
	require.Len(t, outer.Events, 2)
	require.NoError(t, inner.err, "the read that came while the failed load was given up")
	require.Len(t, inner.page.Events, 2)
	require.Equal(t, int64(2), inner.page.StreamMaxOffset)
}
