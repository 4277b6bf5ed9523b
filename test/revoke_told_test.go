package test

import (
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Every connection a revoked login opened hears accessEnded, though the revocation closes that
// login's RPC connection (it has no valid login left) right after. The session's ends used to
// start the connections' notices and return, and the RPC connection was closed under notices
// still waiting for their pusher to stop (TestAudit2_EachEndIsToldOnce missed one in about 25
// race runs); now the end returns once the client has been told. Many connections make a miss
// near certain: without the fix this test failed 5 runs in 5.
func TestAccess_RevokedLoginsConnectionsHearWhy(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	mine := ts.project(t)
	tok, info := ts.token(t, itx.Scope{})
	revoked := ts.login(t, tok)
	var sinks []*closingSink
	for i := range 4 {
		path := "/revoke-told/" + string(rune('a'+i))
		mustAppend(t, stream(t, mine, path), ev("a", `{}`))
		s := stream(t, revoked, path)
		for range 8 {
			sink := &closingSink{}
			_, err := openConn(t, s, connOpts{}, sink)
			require.NoError(t, err)
			sinks = append(sinks, sink)
		}
	}
	a := client.Admin(ctx, ts.deployment(t))
	defer a.Release()
	require.NoError(t, client.RevokeToken(ctx, a, "default", info.ID))
	// RevokeToken returns once the revoked login's ends were told; a notice lost with the RPC
	// connection never comes.
	waitUntil(t, "every connection told", func() bool {
		for _, k := range sinks {
			if k.n.Load() == 0 {
				return false
			}
		}
		return true
	})
	for _, k := range sinks {
		_, why := k.snapshot()
		require.Equal(t, int32(1), k.n.Load())
		require.Equal(t, schema.CloseReason_accessEnded, *why)
	}
}
