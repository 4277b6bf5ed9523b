package server

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
	"github.com/stretchr/testify/require"
)

// A start refreshes the summaries a kill -9 left stale (every stream that was loaded) in a few
// directory commits, not two per stream: each is an fsync, and 1,024 streams took seconds.
func TestServer_RefreshStaleSummariesInFewCommits(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	const streams = 120
	s, projectID := mustOpen(t, Config{DataDir: dir})
	for i := range streams {
		events := []itx.EventInput{{Type: "x"}}
		if i%2 == 1 {
			events = append(events, itx.EventInput{Type: "y"})
		}
		_, err := s.Append(ctx, StreamRef{ProjectID: projectID, Path: fmt.Sprintf("/s/%03d", i)}, events, itx.AppendOptions{})
		require.NoError(t, err)
	}
	mustClose(t, s)

	// As a kill -9 leaves them: marked stale, the summaries behind the streams.
	d, err := storage.OpenDirectory(ctx, filepath.Join(dir, "directory.db"))
	require.NoError(t, err)
	entries, err := d.ListStreams(ctx, projectID, "", "", 1000)
	require.NoError(t, err)
	require.Len(t, entries, streams)
	for _, e := range entries {
		require.NoError(t, d.UpdateStreamSummary(ctx, e.StreamID, storage.StreamSummary{Born: true}))
		require.NoError(t, d.MarkSummaryStale(ctx, e.StreamID))
	}
	require.NoError(t, d.Close())

	s, _ = mustOpen(t, Config{DataDir: dir})
	if got := s.dir.Commits(); got > 20 {
		t.Errorf("the start committed %d times to the directory for %d stale streams, want at most 20", got, streams)
	}
	stale, err := s.dir.StaleStreams(ctx)
	require.NoError(t, err)
	require.Empty(t, stale, "streams left stale")
	entries, err = s.dir.ListStreams(ctx, projectID, "", "", 1000)
	require.NoError(t, err)
	for i, e := range entries {
		if want := int64(1 + i%2); e.HeadOffset != want {
			t.Errorf("%s: got head %d, want %d", e.Path, e.HeadOffset, want)
		}
	}
}

// Close unloads the loaded streams several at a time (each checkpoints its database and writes
// its summary): one after another, 1,024 took 23 s on a busy machine.
func TestServer_CloseUnloadsStreamsInParallel(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(ctx, Config{DataDir: dir})
	require.NoError(t, err)
	creds, err := ReadCredentials(dir)
	require.NoError(t, err)
	proj, err := s.Login(ctx, creds.ProjectToken)
	require.NoError(t, err)
	for i := range 4 {
		_, err := s.Append(ctx, StreamRef{ProjectID: proj.ID, Path: fmt.Sprintf("/s/%d", i)}, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
		require.NoError(t, err)
	}
	// Each unload waits until a second one has begun: closed one after another, the first
	// waits in vain.
	var arrived atomic.Int32
	var once sync.Once
	second := make(chan struct{})
	var alone atomic.Bool
	closeUnloadHook = func() {
		if arrived.Add(1) == 2 {
			once.Do(func() { close(second) })
		}
		select {
		case <-second:
		case <-time.After(10 * time.Second):
			alone.Store(true)
		}
	}
	t.Cleanup(func() { closeUnloadHook = nil })
	mustClose(t, s)
	if alone.Load() {
		t.Errorf("an unload waited 10 s for a second to begin: Close unloads the streams one at a time")
	}
	require.Equal(t, int32(4), arrived.Load(), "unloads")
}
