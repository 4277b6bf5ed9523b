package server

import (
	"context"
	"fmt"
	"runtime"
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
	before := runtime.NumGoroutine()
	for range 10_000 {
		s.schedulePoke("p", "", "cap")
	}
	require.Less(t, runtime.NumGoroutine()-before, 10, "goroutines started by 10,000 mounts of one name")
	require.Eventually(t, func() bool {
		s.recv.pokeMu.Lock()
		defer s.recv.pokeMu.Unlock()
		return len(s.recv.pokes) == 0
	}, 10*time.Second, time.Millisecond, "the signals end")
}
