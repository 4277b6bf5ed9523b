package client

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The waits double from the first up to the ceiling, each within ±50% of its step; an attempt
// that stayed up longer than the ceiling starts over.
func TestBackoff_DoublesJittersAndStartsOver(t *testing.T) {
	b := NewBackoff(100*time.Millisecond, time.Second)
	within := func(step time.Duration, got time.Duration) {
		t.Helper()
		require.GreaterOrEqual(t, got, step/2, "step %v", step)
		require.LessOrEqual(t, got, step+step/2+1, "step %v", step)
	}
	for _, step := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		within(step*time.Millisecond, b.Next(0))
	}
	within(time.Second, b.Next(time.Second)) // up exactly as long as the ceiling: no start over
	within(100*time.Millisecond, b.Next(time.Second+1))
	within(200*time.Millisecond, b.Next(0))

	// A ceiling below the first wait is the first wait.
	b = NewBackoff(time.Second, time.Millisecond)
	within(time.Second, b.Next(0))
	within(time.Second, b.Next(0))

	// Jittered: 50 waits of one step are not all the same.
	seen := map[time.Duration]bool{}
	for range 50 {
		seen[NewBackoff(time.Second, time.Second).Next(0)] = true
	}
	require.Greater(t, len(seen), 1)
}

func TestSleep_EndsWithItsContext(t *testing.T) {
	require.NoError(t, Sleep(context.Background(), time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, Sleep(ctx, time.Hour), context.Canceled)
}
