package capability

import (
	"context"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A connection is closed when every session on it is revoked, but not while another login on it
// is still in progress: that login's session keeps the connection (it failed CI once, as a
// "connection closed" for the second session of TestAccess_RevokeTakesEffectAtOnce).
func TestGateway_RevocationWaitsForLoginsInProgress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := t.TempDir()
	srv, err := server.Open(ctx, server.Config{DataDir: dir})
	require.NoError(t, err)
	defer srv.Close(ctx)
	creds, err := server.ReadCredentials(dir)
	require.NoError(t, err)
	admin := server.Admin{TokenID: "tok_test", ProjectID: creds.ProjectID}
	tok, info, err := srv.CreateToken(ctx, admin, creds.ProjectID, "revoked", 0, itx.Scope{})
	require.NoError(t, err)

	g := &gateway{srv: srv}
	require.False(t, g.allRevoked(), "no session yet: nothing to close")
	x, err := srv.OpenSession(ctx, tok, g.revoked)
	require.NoError(t, err)
	g.sessions = append(g.sessions, x)
	g.logins = 1 // a second login on the connection, still looking its token up
	require.NoError(t, srv.RevokeToken(ctx, admin, creds.ProjectID, info.ID))
	require.True(t, x.Revoked())
	g.mu.Lock()
	require.False(t, g.allRevoked(), "a login in progress keeps the connection")
	g.logins = 0
	require.True(t, g.allRevoked(), "the login failed: nothing valid is left")
	kept, err := srv.OpenSession(ctx, creds.ProjectToken, g.revoked)
	require.NoError(t, err)
	g.sessions = append(g.sessions, kept)
	require.False(t, g.allRevoked(), "the login succeeded: its session keeps the connection")
	g.mu.Unlock()
}
