package test

import (
	"fmt"
	"testing"

	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A type filter holding "*" means every type (as for reads and waitForEvent), on the catch-up
// from the log as on the live tail: a connection opened behind the head must not miss the
// events before the seam.
func TestAudit_WildcardTypeFilterCatchesUp(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/audit/wildcard")
	mustAppend(t, s, ev("a", `{}`), ev("b", `{}`), ev("c", `{}`))
	for _, types := range [][]string{{"*"}, {"a", "*"}} {
		sink := newTestSink()
		_, err := openConn(t, s, connOpts{types: types, maxEvents: 2, noState: true}, sink)
		require.NoError(t, err)
		waitUntil(t, fmt.Sprintf("caught up under %q", types), func() bool {
			return len(sink.offsets()) >= 3
		})
		require.Equal(t, []int64{1, 2, 3}, sink.offsets(), "types %q", types)
	}
	sink := newTestSink()
	_, err := openConn(t, s, connOpts{types: []string{"*"}, noState: true}, sink)
	require.NoError(t, err)
	mustAppend(t, s, ev("d", `{}`))
	waitUntil(t, "live", func() bool { return len(sink.offsets()) == 4 })
	require.Equal(t, []int64{1, 2, 3, 4}, sink.offsets())
}
