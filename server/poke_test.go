package server

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Mounting signals presence to the project's loaded streams in the background; a client that
// mounts and unmounts in a loop must not start a goroutine per mount: signals for one name run
// one at a time, the ones asked for meanwhile folded into one more run.
func TestSchedulePoke_OneRunAtATimePerName(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, Config{DataDir: t.TempDir()})
	require.NoError(t, err)
	defer func() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		s.Close(cctx)
	}()
	for i := range 50 { // loaded streams of the project, each posted to by every run
		a, err := s.acquire(ctx, StreamRef{ProjectID: "p", Path: fmt.Sprintf("/s%d", i)})
		require.NoError(t, err)
		s.release(a)
	}
	for range 10_000 {
		s.schedulePoke("p", "", "cap")
	}
	// The signal's own goroutines, not runtime.NumGoroutine: each run's posts have the streams
	// read their databases, and database/sql starts a short-lived goroutine per query with a
	// context (initContextClose), which on a loaded machine were still there to count (11 once).
	require.LessOrEqual(t, signalGoroutines(), 1, "goroutines started by 10,000 mounts of one name")
	require.Eventually(t, func() bool {
		s.recv.pokeMu.Lock()
		defer s.recv.pokeMu.Unlock()
		return len(s.recv.pokes) == 0
	}, 10*time.Second, time.Millisecond, "the signals end")
}

// signalGoroutines counts the goroutines Server.signal started that are running.
func signalGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	return strings.Count(string(buf), "created by github.com/itx-dev/itx/server.(*Server).signal in goroutine")
}
