package server

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// fileBytes is the size of a stream's database file with its WAL.
func fileBytes(t *testing.T, file string) int64 {
	t.Helper()
	var n int64
	for _, f := range []string{file, file + "-wal"} {
		if st, err := os.Stat(f); err == nil {
			n += st.Size()
		} else if !os.IsNotExist(err) {
			require.NoError(t, err)
		}
	}
	return n
}

// A trim's freed space goes back to the file system after the trim, a turn at a time, the
// stream's appends taking turns between them: an append made once the first turn committed is
// acknowledged before the last one commits, and the file ends far smaller.
func TestStream_VacuumTurnsLetAppendsThrough(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, projectID := mustOpen(t, Config{DataDir: dir})
	ref := StreamRef{ProjectID: projectID, Path: "/big"}
	payload := []byte(`{"p":"` + strings.Repeat("x", 1024) + `"}`)
	var head int64
	for range 16 {
		batch := make([]itx.EventInput, 1000)
		for i := range batch {
			batch[i] = itx.EventInput{Type: "e", Payload: payload}
		}
		res, err := s.Append(ctx, ref, batch, itx.AppendOptions{})
		require.NoError(t, err)
		head = res.HeadOffset
	}
	entry, err := s.dir.Stream(ctx, projectID, ref.Path)
	require.NoError(t, err)
	file := filepath.Join(dir, "streams", entry.StreamID+".db")
	before := fileBytes(t, file)

	var (
		mu       sync.Mutex
		turns    []time.Time // when each turn committed
		ackedAt  time.Time   // when the append made after the first turn was acknowledged
		appended = make(chan error, 1)
		done     = make(chan struct{})
	)
	vacuumChunkCommittedHook = func(freed, left int64) {
		mu.Lock()
		defer mu.Unlock()
		turns = append(turns, time.Now())
		if len(turns) == 1 {
			go func() {
				_, err := s.Append(ctx, ref, []itx.EventInput{{Type: "during", Payload: []byte(`{}`)}}, itx.AppendOptions{})
				mu.Lock()
				ackedAt = time.Now()
				mu.Unlock()
				appended <- err
			}()
		}
		if left == 0 {
			close(done)
		}
	}
	t.Cleanup(func() { vacuumChunkCommittedHook = nil })

	res, err := s.TrimStream(ctx, Admin{}, ref, head-100, 0)
	require.NoError(t, err)
	require.Equal(t, head-100, res.TrimmedThrough)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the vacuum did not finish")
	}
	require.NoError(t, <-appended)
	mu.Lock()
	defer mu.Unlock()
	require.Greater(t, len(turns), 5, "the space went back in several turns")
	require.True(t, ackedAt.Before(turns[len(turns)-1]), "the append was acknowledged before the last of %d turns", len(turns))
	after := fileBytes(t, file)
	require.Less(t, after, before/2, "the file gave the trimmed events' space back: %d bytes, from %d", after, before)
	require.Greater(t, testutil.ToFloat64(s.metrics.VacuumedBytes), float64(before-after)/2, "counted")
	t.Logf("%d turns; %d bytes, then %d", len(turns), before, after)
}

// The space an ephemeral sweep frees goes back to the file system as a trim's does.
func TestStream_VacuumAfterEphemeralSweep(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	clk := clocktest.New(time.Unix(1_800_000_000, 0))
	s, projectID := mustOpen(t, Config{DataDir: dir, Clock: clk, IdleTimeout: 1000 * time.Hour}) // loaded throughout
	ref := StreamRef{ProjectID: projectID, Path: "/live"}
	payload := []byte(`{"p":"` + strings.Repeat("x", 1024) + `"}`)
	for range 8 { // about 8 MiB of ephemeral rows, under the buffer's 10 MiB
		batch := make([]itx.EventInput, 1000)
		for i := range batch {
			batch[i] = itx.EventInput{Type: "e", Payload: payload, Ephemeral: true}
		}
		_, err := s.Append(ctx, ref, batch, itx.AppendOptions{})
		require.NoError(t, err)
	}
	entry, err := s.dir.Stream(ctx, projectID, ref.Path)
	require.NoError(t, err)
	file := filepath.Join(dir, "streams", entry.StreamID+".db")
	beforeDB, err := os.Stat(file)
	require.NoError(t, err)
	done := make(chan struct{})
	var given int64 // only the actor writes it until done is closed
	vacuumChunkCommittedHook = func(freed, left int64) {
		if given += freed; left == 0 {
			close(done)
		}
	}
	t.Cleanup(func() { vacuumChunkCommittedHook = nil })

	clk.Advance(2 * time.Hour) // past the ephemeral rows' hour: the next append sweeps them
	_, err = s.Append(ctx, ref, []itx.EventInput{{Type: "d", Payload: []byte(`{}`)}}, itx.AppendOptions{})
	require.NoError(t, err)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the sweep's space was not given back")
	}
	require.Greater(t, given, int64(6<<20), "most of the 8 MiB swept")
	// The database file alone: its WAL keeps the size the sweep's transaction gave it (a few
	// MiB) while the stream stays loaded, and goes when it unloads.
	after, err := os.Stat(file)
	require.NoError(t, err)
	require.Less(t, after.Size(), beforeDB.Size()/2, "%d bytes, from %d", after.Size(), beforeDB.Size())
}
