package capability

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// tryReserve never waits: it takes room while there is some, and a call carrying its context is
// counted against that room instead of waiting for more; releasing gives it back.
func TestPushLimiter_TryReserveNeverWaits(t *testing.T) {
	l := newPushLimiter()
	ctx := context.Background()
	release, err := l.StartMessage(ctx, uint64(pushFlowLimit-100)) // a big batch in flight
	require.NoError(t, err)
	_, ok := l.tryReserve(ctx, 200)
	require.False(t, ok, "no room for 200 bytes")
	rctx, ok := l.tryReserve(ctx, 100)
	require.True(t, ok)
	done := make(chan func())
	go func() {
		r, err := l.StartMessage(rctx, 5000) // the reserved call: the room is already its own
		require.NoError(t, err)
		done <- r
	}()
	var rel func()
	select {
	case rel = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a call with reserved room waited")
	}
	release()
	_, ok = l.tryReserve(ctx, int(pushFlowLimit-100))
	require.True(t, ok, "the big batch's room is back, the reserved 100 bytes still held")
	_, ok = l.tryReserve(ctx, 1)
	require.False(t, ok)
	rel()
	_, ok = l.tryReserve(ctx, 100)
	require.True(t, ok)
}
