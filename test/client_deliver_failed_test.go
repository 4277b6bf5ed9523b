package test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A Deliver that fails a batch sees no batch after it: the server keeps up to 4 batches in
// flight, and those it sent after the failing one used to reach Deliver before the connection's
// closed, so a mirror recording its last offset (and Follow, whose answer is where to resume)
// went past the events it had failed to store. Offsets 1-4 are in flight as soon as the
// catch-up starts, so without the fix 4 always reached Deliver.
func TestClientConnection_NoBatchAfterAFailedOne(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/deliver-failed")
	for i := range 20 {
		mustAppend(t, s, ev("a", fmt.Sprintf(`{"i":%d}`, i)))
	}
	storeFailed := errors.New("store failed")
	deliverUpTo3 := func(mu *sync.Mutex, seen *[]int64) func(context.Context, itx.DeliveryBatch) error {
		return func(ctx context.Context, b itx.DeliveryBatch) error {
			mu.Lock()
			defer mu.Unlock()
			for _, e := range b.Events {
				*seen = append(*seen, e.Offset)
			}
			if b.Events[0].Offset == 3 {
				return storeFailed
			}
			return nil
		}
	}

	var mu sync.Mutex
	var seen []int64
	c, err := client.OpenConnection(ctxT(t), s, client.ConnectionOptions{MaxDeliveryEvents: 1},
		client.ConnectionHandler{Deliver: deliverUpTo3(&mu, &seen)})
	require.NoError(t, err)
	t.Cleanup(c.Release)
	<-c.Done()
	var why *client.ConnectionClosed
	require.ErrorAs(t, c.Err(), &why)
	require.Equal(t, schema.CloseReason_deliveryFailed, why.Why)
	mu.Lock()
	require.Equal(t, []int64{1, 2, 3}, seen, "nothing after the failed batch reaches Deliver")
	mu.Unlock()

	// Follow answers the last offset delivered: the one before the failed batch.
	var fseen []int64
	last, err := client.Follow(ctxT(t), client.FollowConfig{Addr: ts.addr, Token: ts.creds.ProjectToken,
		Path: "/deliver-failed", Connection: client.ConnectionOptions{MaxDeliveryEvents: 1}}, deliverUpTo3(&mu, &fseen))
	require.ErrorIs(t, err, storeFailed)
	require.Equal(t, int64(2), last, "resume after 2: offset 3 was not stored")
	mu.Lock()
	require.Equal(t, []int64{1, 2, 3}, fseen)
	mu.Unlock()
}
