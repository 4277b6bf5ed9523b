package test

import (
	"context"
	"fmt"
	"testing"

	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Read-your-writes and monotonic reads: once a call is answered, every later call (on this RPC
// connection or another) sees its effect, and what a reader sees never goes backwards.

// closeConnection closes c and waits for the answer.
func closeConnection(t *testing.T, c schema.Connection) {
	t.Helper()
	fut, release := c.Close(context.Background(), func(p schema.Connection_close_Params) error { return p.SetReason("bye") })
	defer release()
	_, err := fut.Struct()
	require.NoError(t, err)
}

// A connection's close, once answered, has freed its key: a subscription configured under it
// is not refused as naming an open connection, and a live view asked for next does not list it.
func TestConnection_CloseIsSeenOnceAnswered(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/ryw/close")
	mustAppend(t, s, ev("a", `{}`))
	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	for i := range 50 {
		key := fmt.Sprintf("tab-%d", i)
		c, err := openConn(t, s, connOpts{key: key, noState: true}, newTestSink())
		require.NoError(t, err)
		closeConnection(t, c)
		_, _, err = client.ConfigureSubscription(e.ctx, subs, client.SubscriptionConfig{Name: key, Start: "now",
			Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "nobody"}})
		require.NoError(t, err, "round %d: the closed connection still holds its key", i)

		other := fmt.Sprintf("other-%d", i)
		c, err = openConn(t, s, connOpts{key: other, noState: true}, newTestSink())
		require.NoError(t, err)
		closeConnection(t, c)
		view := &liveView{}
		h := subscribeLive(t, s, view)
		var doc map[string]any
		waitUntil(t, "the first snapshot", func() bool {
			var rev uint64
			rev, doc = view.state()
			return rev > 0
		})
		conns, _ := doc["connections"].(map[string]any)
		require.NotContains(t, conns, other, "round %d: the first snapshot lists a connection closed before it was asked for", i)
		require.Equal(t, float64(0), doc["connectionsOpen"], "round %d", i)
		h.Release()
	}
}
