package test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Seed 002: high-volume traffic rides ephemeral appends, "which never reach processor delivery
// at all" (the TS runner runs no batch that carries no durable event). Streaming chunks appended
// ephemeral to a processor's stream, over real RPC against itxd, run no ProcessEvent pass (not
// even the eventless one), while the processing cursor still passes them: a barrier at the head
// resolves and the subscription shows no lag. In both placements.
func TestProcessors_EphemeralAppendsRunNoPass(t *testing.T) {
	for _, remote := range []bool{false, true} {
		name := "in-process"
		if remote {
			name = "remote"
		}
		t.Run(name, func(t *testing.T) {
			var passes atomic.Int64
			h := processors.NewHost("test")
			require.NoError(t, processors.Add(h, func() processors.Contract[int] {
				return processors.Contract[int]{
					Name: "watcher", ConsumedTypes: []string{"w/item"}, ReducerVersion: "1",
					InitialState: func() int { return 0 },
					Reduce:       func(n int, e itx.Event) int { return n + 1 },
					ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
						passes.Add(1)
						return nil
					},
				}
			}))
			sc := client.SubscriptionConfig{Name: "watcher", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}}
			var ts *testServer
			if remote {
				ts = startServer(t, server.Config{})
				sc.Receiver.Placement = "remote"
			} else {
				ts = startServer(t, server.Config{Processors: h})
			}
			ctx := ctxT(t)
			s := stream(t, ts.project(t), "/processors/ephemeral-chunks")
			subs := client.Subscriptions(ctx, s)
			defer subs.Release()
			_, _, err := client.ConfigureSubscription(ctx, subs, sc)
			require.NoError(t, err)
			if remote {
				awaitMount(t, runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "worker-1", h))
			}
			head := mustAppend(t, s, ev("w/item", `{}`)).HeadOffset
			sub, proc := processorOf(t, s, "watcher")
			_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
			require.NoError(t, err)
			before := passes.Load()
			require.Positive(t, before)

			for range 5 {
				chunk := ev("w/item", `{}`)
				chunk.Ephemeral = true
				head = mustAppend(t, s, chunk).HeadOffset
				processed, err := client.WaitUntilProcessed(ctx, sub, head, 0)
				require.NoError(t, err)
				require.GreaterOrEqual(t, processed, head)
			}
			require.Equal(t, before, passes.Load(), "ephemeral appends ran ProcessEvent passes")
			d, err := client.DescribeSubscription(ctx, sub)
			require.NoError(t, err)
			require.Equal(t, head, d.ConfirmedOffset, "the cursor passes the ephemeral tail")
			snap, err := client.Snapshot(ctx, proc)
			require.NoError(t, err)
			require.JSONEq(t, "1", snap.State, "an ephemeral item was reduced")

			// A durable event after them is delivered as usual.
			head = mustAppend(t, s, ev("w/item", `{}`)).HeadOffset
			_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
			require.NoError(t, err)
			require.Greater(t, passes.Load(), before)
		})
	}
}
