package test

import (
	"context"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A Receiver is told when itxd lets it go by name, not only when its own handle ends: a mount of
// its name from another connection of the same token replaces it (a reconnecting provider),
// and an unmount by name removes it. itxd releases the Receiver, so its client sees the
// capability's last reference go (client.ServeReceiverDone's channel closes; go-capnp's
// Shutdown, a C++ destructor), while the first mount's handle is still held. Before, itxd held
// it until that handle ended, and a replaced provider went on waiting for batches that went to
// its successor.
func TestReceiver_ToldWhenReplacedOrUnmountedByName(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	first, second := ts.project(t), ts.project(t) // one token, two connections
	s := stream(t, first, "/mounts/ended")
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "call",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}})
	require.NoError(t, err)

	got := make(chan string, 16)
	serve := func(who string) func(context.Context, itx.DeliveryBatch) (int64, error) {
		return func(_ context.Context, b itx.DeliveryBatch) (int64, error) {
			for _, e := range b.Events {
				if e.Type == "e" { // not the stream's own configured record
					got <- who
				}
			}
			return 0, nil
		}
	}
	ended := func(done <-chan struct{}) bool {
		select {
		case <-done:
			return true
		case <-time.After(20 * time.Second):
			return false
		}
	}

	r1, done1 := client.ServeReceiverDone(serve("first"))
	h1, err := client.MountReceiver(ctx, first, "inbox", r1)
	require.NoError(t, err)
	defer h1.Release() // held on purpose: the replacement, not the handle, must end it
	sub := client.Subscription(ctx, s, "call")
	defer sub.Release()
	confirmed := func(through int64) {
		t.Helper()
		require.Eventually(t, func() bool {
			d, err := client.DescribeSubscription(ctx, sub)
			require.NoError(t, err)
			return d.ConfirmedOffset == through
		}, 20*time.Second, 5*time.Millisecond, "confirmed through %d", through)
	}
	mustAppend(t, s, ev("e", `{"n":1}`))
	require.Equal(t, "first", <-got)
	confirmed(2) // its answer landed: the replacement is not handed it again

	r2, done2 := client.ServeReceiverDone(serve("second"))
	h2, err := client.MountReceiver(ctx, second, "inbox", r2)
	require.NoError(t, err)
	defer h2.Release()
	require.True(t, ended(done1), "the replaced Receiver was never let go")
	mustAppend(t, s, ev("e", `{"n":2}`))
	require.Equal(t, "second", <-got, "the replacement receives")
	confirmed(3)
	select {
	case <-done2:
		t.Fatal("the mount in force was let go")
	default:
	}

	require.NoError(t, unmount(t, first, "inbox"))
	require.True(t, ended(done2), "the Receiver unmounted by name was never let go")
	mustAppend(t, s, ev("e", `{"n":3}`))
	require.Eventually(t, func() bool {
		d, err := client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		return d.Status == itx.StatusParked && d.ConfirmedOffset == 3 // the configured record and two events
	}, 20*time.Second, 5*time.Millisecond, "parked after what its receivers confirmed, no attempt burnt")
	d, err := client.DescribeSubscription(ctx, sub)
	require.NoError(t, err)
	require.Zero(t, d.Attempt)
	require.Empty(t, got, "nothing delivered after the unmount")
}
