package test

import (
	"fmt"
	"runtime"
	"testing"

	"capnproto.org/go/capnp/v3"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/wire"
	"github.com/stretchr/testify/require"
)

// The subscription verbs append the stream's control events (seed 000: a subscription is "born,
// reconfigured, rewound, and killed by appended events"). Verbs sent on one capability without
// waiting commit in the order sent, as appends on one stream do: each answer's offset is above
// the one before, and the last config or cursor sent is the one that stands.
func TestAudit_SubscriptionVerbsOnOneCapabilityCommitInOrder(t *testing.T) {
	// More Ps than this machine's cores make the server run a released call queue's next call
	// beside the one before it, as it does on a larger machine (the server is in this process).
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/audit/verb-order")
	mustAppend(t, s, ev("a", `{}`))
	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	const n = 40
	for round := range 10 {
		name := fmt.Sprintf("parked-%d", round)
		var futs []schema.Subscriptions_configure_Results_Future
		var rels []capnp.ReleaseFunc
		for i := 1; i <= n; i++ {
			cfg := client.SubscriptionConfig{Name: name, Description: fmt.Sprint(i), Start: "now",
				Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "nobody"}}
			ic, err := cfg.Config()
			require.NoError(t, err)
			fut, rel := subs.Configure(e.ctx, func(p schema.Subscriptions_configure_Params) error {
				c, err := p.NewConfig()
				if err != nil {
					return err
				}
				return wire.SetSubscriptionConfig(c, &ic)
			})
			futs, rels = append(futs, fut), append(rels, rel)
		}
		last := uint64(0)
		for i, f := range futs {
			res, err := f.Struct()
			require.NoError(t, err)
			require.Greater(t, res.Offset(), last, "round %d: configure %d committed before one sent earlier", round, i+1)
			last = res.Offset()
		}
		// Another capability: sent once the configures are answered (no order holds across two).
		var cursorFuts []schema.Stream_setSubscriptionCursor_Results_Future
		for i := 1; i <= n; i++ {
			fut, rel := s.SetSubscriptionCursor(e.ctx, func(p schema.Stream_setSubscriptionCursor_Params) error {
				p.SetAfterOffset(uint64(i))
				return p.SetName(name)
			})
			cursorFuts, rels = append(cursorFuts, fut), append(rels, rel)
		}
		last = 0
		for i, f := range cursorFuts {
			res, err := f.Struct()
			require.NoError(t, err, "round %d: cursor %d", round, i+1)
			require.Greater(t, res.Offset(), last, "round %d: cursor-set %d committed before one sent earlier", round, i+1)
			last = res.Offset()
		}
		for _, rel := range rels {
			rel()
		}
		d := e.describe(t, s, name)
		require.Equal(t, fmt.Sprint(n), d.Config.Description, "round %d: the last config sent stands", round)
		require.Equal(t, int64(n), d.ConfirmedOffset, "round %d: the last cursor sent stands", round)
	}
}
