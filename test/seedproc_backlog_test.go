package test

import (
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Seed 002, a new subscriber over a history longer than any page (catch-up pages are transport,
// never semantics), over real RPC against itxd, in-process and on a remote host: "a new
// subscriber ... can still run processEvent over historical events, with event-time state", one
// event at a time, and caughtUp is true only on the last consumed event of the scan that reaches
// the observed raw head, here one followed by an unconsumed tail (which the filter-aware answer
// looks past: no eventless pass). 1,300 consumed events among 325 others, three catch-up pages
// and more.
func TestSeedProc_NewSubscriberCatchesUpOverPagesOverRPC(t *testing.T) {
	const consumed = 1300
	for _, placement := range []string{"", "remote"} {
		name := "in-process"
		if placement != "" {
			name = placement
		}
		t.Run(name, func(t *testing.T) {
			rec := &bbRecorder{}
			host := processors.NewHost("bb")
			require.NoError(t, processors.Add(host, bbCounter(rec)))
			cfg := server.Config{}
			if placement == "" {
				cfg.Processors = host
			}
			ts := startServer(t, cfg)
			if placement == "remote" {
				runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "bb-host", host)
			}
			s := stream(t, ts.project(t), "/seedproc/backlog")
			var batch []itx.EventInput
			var want []int64 // the consumed offsets, in order
			next := int64(1)
			for i := 1; i <= consumed; i++ {
				batch = append(batch, ev("bb/item", `{}`))
				want = append(want, next)
				next++
				if i%4 == 0 {
					batch = append(batch, ev("bb/other", `{}`))
					next++
				}
				if len(batch) >= 250 {
					mustAppend(t, s, batch...)
					batch = nil
				}
			}
			batch = append(batch, ev("bb/other", `{}`), ev("bb/other", `{}`))
			mustAppend(t, s, batch...)

			ctx := ctxT(t)
			subs := client.Subscriptions(ctx, s)
			defer subs.Release()
			_, birth, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{
				Name: "counter", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Placement: placement},
			})
			require.NoError(t, err)
			sub := client.Subscription(ctx, s, "counter")
			defer sub.Release()
			_, err = client.WaitUntilProcessed(ctx, sub, birth, 25*time.Second)
			require.NoError(t, err)

			calls := rec.take()
			require.Len(t, calls, consumed, "one call per consumed event, no eventless pass")
			for i, c := range calls {
				require.Equal(t, want[i], c.Offset, "call %d", i)
				require.Equal(t, i, c.Prev, "call %d: PreviousState is the fold before the event", i)
				require.Equal(t, i+1, c.State, "call %d: State is the fold through the event", i)
				require.Equal(t, i == consumed-1, c.CaughtUp, "call %d (offset %d): CaughtUp", i, c.Offset)
			}
		})
	}
}
