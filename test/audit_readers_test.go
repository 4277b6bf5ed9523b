package test

import (
	"runtime"
	"testing"

	"capnproto.org/go/capnp/v3"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A reader's moves sent on one Readers capability without waiting take effect in the order sent
// (Cap'n Proto delivers calls on one capability in order, as appends on one stream commit in
// order): the checkpoint ends where the last call put it, and a remove pipelined after a register
// removes it. A reader moving backwards because two calls swapped would lower the retention floor
// (seed 000: "the safe eviction floor is min(confirmed) over subscriptions plus registered
// readers") and show a false lag.
func TestAudit_ReaderCallsOnOneCapabilityApplyInOrder(t *testing.T) {
	// More Ps than this machine's cores make the server run a released call queue's next call
	// beside the one before it, as it does on a larger machine (the server is in this process).
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/audit/reader-order")
	const n = 200
	events := make([]itx.EventInput, n)
	for i := range events {
		events[i] = ev("a", `{}`)
	}
	mustAppend(t, s, events...)
	rf, release := s.Readers(ctx, nil)
	defer release()
	r := rf.Readers()
	for round := range 40 {
		var futs []schema.Readers_register_Results_Future
		var rels []capnp.ReleaseFunc
		for i := 1; i <= n; i++ {
			fut, rel := r.Register(ctx, func(p schema.Readers_register_Params) error {
				p.SetCheckpoint(uint64(i))
				return p.SetName("mirror")
			})
			futs, rels = append(futs, fut), append(rels, rel)
		}
		// register, then remove, then register again, pipelined.
		f1, r1 := r.Register(ctx, func(p schema.Readers_register_Params) error { p.SetCheckpoint(1); return p.SetName("flip") })
		f2, r2 := r.Remove(ctx, func(p schema.Readers_remove_Params) error { return p.SetName("flip") })
		f3, r3 := r.Register(ctx, func(p schema.Readers_register_Params) error { p.SetCheckpoint(2); return p.SetName("flip") })
		f4, r4 := r.Remove(ctx, func(p schema.Readers_remove_Params) error { return p.SetName("flip") })
		for i, f := range futs {
			_, err := f.Struct()
			require.NoError(t, err)
			rels[i]()
		}
		for _, err := range []error{struct0(f1, r1), struct0(f2, r2), struct0(f3, r3), struct0(f4, r4)} {
			require.NoError(t, err, "round %d", round)
		}
		list, err := client.ListReaders(ctx, r)
		require.NoError(t, err)
		require.Len(t, list, 1, "round %d: flip was removed last", round)
		require.Equal(t, int64(n), list[0].Checkpoint, "round %d: the last move wins", round)
	}
}
