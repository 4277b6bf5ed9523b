package test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A closed connection receives nothing more: once close() has answered, its sink hears closed()
// and nothing else, no state frame either (the stream's live state changes as the connection
// leaves it, and that change is not this connection's to receive).
func TestAudit_ClosedConnectionGetsNoStateFrame(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/audit/closed-quiet")
	mustAppend(t, s, ev("a", `{}`))
	view, _ := watchLive(t, s)
	for round := range 20 {
		sink := &orderedSink{}
		key := fmt.Sprintf("tab-%d", round)
		c, err := openConn(t, s, connOpts{key: key}, sink)
		require.NoError(t, err)
		// Every frame issued before the close has arrived: the sink is at the revision a live
		// view shows this connection delivered through the head at.
		waitUntil(t, "the sink's state is current", func() bool {
			rev, doc := view.state()
			conns, _ := doc["connections"].(map[string]any)
			me, _ := conns[key].(map[string]any)
			log, _ := sink.snapshot()
			return me["delivered"] == float64(1) && len(log) > 0 && strings.HasPrefix(log[len(log)-1], fmt.Sprintf("state@%d ", rev))
		})
		fut, release := c.Close(context.Background(), func(p schema.Connection_close_Params) error { return p.SetReason("done") })
		_, err = fut.Struct()
		release()
		require.NoError(t, err)
		before, _ := sink.snapshot()
		waitUntil(t, "closed", func() bool { _, why := sink.snapshot(); return why != nil })
		log, _ := sink.snapshot()
		for _, l := range log[len(before):] {
			require.True(t, strings.HasPrefix(l, "closed "), "round %d: after close() answered the sink got %q", round, l)
		}
	}
}
