package test

import (
	"context"
	"runtime"
	"testing"

	"capnproto.org/go/capnp/v3"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Re-opening a key replaces the connection open under it: opens of one key sent on one Stream
// capability without waiting replace in the order sent, so the connection left open is the one
// sent last, and every other one hears replaced.
func TestAudit_PipelinedOpensOfOneKeyReplaceInOrder(t *testing.T) {
	// More Ps than this machine's cores make the server run a released call queue's next call
	// beside the one before it, as it does on a larger machine (the server is in this process).
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/audit/open-order")
	mustAppend(t, s, ev("a", `{}`))
	const n = 16
	for round := range 100 {
		sinks := make([]*testSink, n)
		futs := make([]schema.Stream_openConnection_Results_Future, n)
		rels := make([]capnp.ReleaseFunc, n)
		for i := range n {
			sinks[i] = newTestSink()
			futs[i], rels[i] = s.OpenConnection(context.Background(), func(p schema.Stream_openConnection_Params) error {
				opts, err := p.NewOptions()
				if err != nil {
					return err
				}
				opts.SetNoState(true)
				if err := opts.SetKey("tab"); err != nil {
					return err
				}
				return p.SetSink(schema.EventSink_ServerToClient(sinks[i]))
			})
		}
		conns := make([]schema.Connection, n)
		for i, f := range futs {
			res, err := f.Struct()
			require.NoError(t, err)
			conns[i] = res.Connection().AddRef()
			t.Cleanup(conns[i].Release)
			rels[i]()
		}
		_, _, err := ping(t, conns[n-1])
		require.NoError(t, err, "round %d: the open sent last stays open", round)
		for i := range n - 1 {
			_, _, err := ping(t, conns[i])
			requireCode(t, err, itx.EFailedPrecondition)
			waitUntil(t, "replaced", func() bool {
				r := sinks[i].closeReason()
				return r != nil && *r == schema.CloseReason_replaced
			})
		}
		require.Nil(t, sinks[n-1].closeReason())
	}
}
