package test

import (
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A connection's key is its opener's: another token that reads the stream (it sees the key in
// the stream's live state) is refused permissionDenied when it opens under it, and the
// connection carries on; the same token, from another login (a reconnect) and through a
// read-only attenuation, still replaces it. Before, any reader closed another tenant's
// connections at will by reusing their keys.
func TestAccess_ConnectionKeyIsItsTokens(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	writer := stream(t, ts.project(t), "/shared")
	mustAppend(t, writer, ev("note", `{"n":1}`))

	owner := stream(t, ts.project(t), "/shared")
	dashboard := newTestSink()
	_, err := openConn(t, owner, connOpts{key: "dashboard", noState: true}, dashboard)
	require.NoError(t, err)
	waitUntil(t, "event 1 delivered", func() bool { return len(dashboard.offsets()) == 1 })

	tok, _ := ts.token(t, itx.Scope{Rights: []itx.Right{itx.RightRead}})
	other := stream(t, ts.login(t, tok), "/shared")
	for _, s := range []schema.Stream{other, client.ReadOnly(ctx, other)} {
		_, err = openConn(t, s, connOpts{key: "dashboard", noState: true}, newTestSink())
		requireCode(t, err, itx.EPermissionDenied)
		require.Contains(t, err.Error(), "another token")
	}
	mustAppend(t, writer, ev("note", `{"n":2}`))
	waitUntil(t, "event 2 delivered to the owner's connection", func() bool { return len(dashboard.offsets()) == 2 })
	require.Nil(t, dashboard.closeReason(), "the refused opens closed nothing")

	// The owner's token reconnecting, from a new login and through readOnly, replaces it.
	again := newTestSink()
	_, err = openConn(t, client.ReadOnly(ctx, stream(t, ts.project(t), "/shared")), connOpts{key: "dashboard", after: 2, noState: true}, again)
	require.NoError(t, err)
	waitUntil(t, "the old connection closed as replaced", func() bool { return dashboard.closeReason() != nil })
	require.Equal(t, schema.CloseReason_replaced, *dashboard.closeReason())
	mustAppend(t, writer, ev("note", `{"n":3}`))
	waitUntil(t, "event 3 delivered to the new connection", func() bool { return len(again.offsets()) == 1 })
}
