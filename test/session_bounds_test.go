package test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// What one RPC client holds on itxd without sending anything big is bounded too: replies it never
// finishes, capabilities it never releases, connections, and time before login. Each bound
// aborts (or refuses) the connection with an Abort whose reason says which bound and which flag.
func TestItxd_SessionBounds(t *testing.T) {
	metrics := freeAddr(t)
	p := startItxd(t, t.TempDir(), "--metrics", metrics,
		"--rpc-preauth-max-unfinished-replies", "10", "--rpc-max-capabilities", "20",
		"--rpc-max-connections", "3", "--rpc-login-timeout", "300ms")
	ctx := ctxT(t)

	t.Run("unfinished replies", func(t *testing.T) {
		r := itxtest.DialRaw(t, p.addr)
		for q := uint32(0); q <= 30; q++ {
			// never finished; each reply holds the Gateway (a reply without capabilities, as
			// version()'s, needs no Finish and is not held)
			r.Bootstrap(q)
		}
		returns, reason := r.UntilAbort()
		require.True(t, strings.HasPrefix(reason, "itx.limitExceeded: "), "abort reason %q", reason)
		require.Contains(t, reason, "--rpc-preauth-max-unfinished-replies")
		require.Less(t, returns, 31, "the abort came before every bootstrap was answered")
	})

	t.Run("capabilities", func(t *testing.T) {
		// A client that releases what it gets is never cut off, however many it asks for.
		conn := dial(t, p.addr)
		proj := conn.Login(ctx, p.creds.ProjectToken)
		defer proj.Release()
		for i := range 100 {
			s := client.Stream(ctx, proj, fmt.Sprintf("/caps/%d", i))
			require.NoError(t, s.Resolve(ctx))
			s.Release()
		}
		_, err := client.Append(ctx, client.Stream(ctx, proj, "/caps/ok"), []itx.EventInput{ev("t", `{}`)}, itx.AppendOptions{})
		require.NoError(t, err)

		// One that keeps them all is aborted past the bound.
		leaky := dial(t, p.addr)
		lproj := leaky.Login(ctx, p.creds.ProjectToken)
		var held []schema.Stream
		defer func() {
			for _, s := range held {
				s.Release()
			}
		}()
		var last error
		for i := range 100 {
			s := client.Stream(ctx, lproj, fmt.Sprintf("/caps/%d", i))
			held = append(held, s)
			if last = s.Resolve(ctx); last == nil {
				f, release := s.Describe(ctx, nil)
				_, last = f.Struct()
				release()
			}
			if last != nil {
				break
			}
		}
		require.Error(t, last, "a client holding 100 capabilities was not cut off at 20")
		require.LessOrEqual(t, len(held), 25)
		select {
		case <-leaky.Done():
		case <-ctx.Done():
			t.Fatal("the leaky connection is still open")
		}
		// The client learns why from the server's Abort.
		require.Equal(t, itx.ELimitExceeded, itx.ErrorCode(leaky.Err()), "%v", leaky.Err())
		require.Contains(t, leaky.Err().Error(), "--rpc-max-capabilities")
		require.NoError(t, conn.Err(), "the well-behaved connection is open")
	})

	t.Run("login timeout", func(t *testing.T) {
		r := itxtest.DialRaw(t, p.addr)
		_, reason := r.UntilAbort() // sends nothing: aborted after 300 ms
		require.True(t, strings.HasPrefix(reason, "itx.deadlineExceeded: no login within 300ms"), "abort reason %q", reason)
	})

	t.Run("connections", func(t *testing.T) {
		require.Eventually(t, func() bool { return scrapeMetric(t, metrics, "itx_rpc_connections") == 0 },
			10*time.Second, 5*time.Millisecond, "the earlier connections are gone")
		var open []capnp.Client
		for range 3 {
			c := dial(t, p.addr)
			proj := c.Login(ctx, p.creds.ProjectToken)
			require.NoError(t, proj.Resolve(ctx))
			open = append(open, capnp.Client(proj))
		}
		defer func() {
			for _, c := range open {
				c.Release()
			}
		}()
		r := itxtest.DialRaw(t, p.addr)
		r.Bootstrap(0)
		_, reason := r.UntilAbort()
		require.True(t, strings.HasPrefix(reason, "itx.limitExceeded: itxd serves at most 3 connections"), "abort reason %q", reason)
	})

	for _, m := range []string{"itx_rpc_connections_aborted_total", "itx_rpc_connections_refused_total"} {
		require.GreaterOrEqual(t, scrapeMetric(t, metrics, m), 1.0, m)
	}
	require.True(t, strings.HasPrefix(p.addr, "127.0.0.1:"))
}

// Logging in again on a connection with the same token shares its session (no new session, no
// directory write), so an application that logs in per request stays bounded; a connection
// logs in with at most 64 distinct tokens. A revoked token still ends every project of it.
func TestGateway_LoginsPerConnectionAreBounded(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	sessions := func() float64 { return testutil.ToFloat64(ts.srv.Metrics().Sessions) }
	base := sessions()
	conn := dial(t, ts.addr)
	var projects []schema.Project
	for range 200 {
		p := conn.Login(ctx, ts.creds.ProjectToken)
		_, err := client.DescribeProject(ctx, p)
		require.NoError(t, err)
		projects = append(projects, p)
	}
	require.Equal(t, base+1, sessions(), "200 logins with one token hold one session")

	tokens := make([]string, 64)
	for i := range tokens {
		tokens[i], _ = ts.token(t, itx.Scope{})
	}
	for i, tok := range tokens[:63] { // with the project token: 64 distinct
		_, err := client.DescribeProject(ctx, conn.Login(ctx, tok))
		require.NoError(t, err, "token %d", i)
	}
	_, err := client.DescribeProject(ctx, conn.Login(ctx, tokens[63]))
	requireCode(t, err, itx.ELimitExceeded)
	_, err = client.DescribeProject(ctx, conn.Login(ctx, tokens[0]))
	require.NoError(t, err, "a token already logged in still logs in")
	_, err = client.DescribeProject(ctx, dial(t, ts.addr).Login(ctx, tokens[63]))
	require.NoError(t, err, "on another connection")

	// Revoking a token ends every project its logins returned, shared session and all.
	tok, info := ts.token(t, itx.Scope{})
	other := dial(t, ts.addr)
	a, b := other.Login(ctx, tok), other.Login(ctx, tok)
	_, err = client.DescribeProject(ctx, a)
	require.NoError(t, err)
	admin := client.Admin(ctx, ts.deployment(t))
	defer admin.Release()
	require.NoError(t, client.RevokeToken(ctx, admin, "default", info.ID))
	for _, p := range []schema.Project{a, b} {
		_, err = client.DescribeProject(ctx, p)
		requireRevoked(t, err)
	}
	for _, p := range projects {
		p.Release()
	}
}

// Streams held in use (here by open connections) are bounded: past MaxHeldStreams, a call that
// needs one more stream loaded fails with limitExceeded, writing nothing; once one is released
// the call goes through. Idle loaded streams never count against it (they are unloaded).
func TestServer_HeldStreamsBounded(t *testing.T) {
	ts := startServer(t, server.Config{MaxHeldStreams: 3})
	p := ts.project(t)
	ctx := ctxT(t)
	var conns []schema.Connection
	for i := range 3 {
		c, err := openConn(t, stream(t, p, fmt.Sprintf("/held/%d", i)), connOpts{noState: true}, newTestSink())
		require.NoError(t, err)
		conns = append(conns, c)
	}
	fourth := stream(t, p, "/held/3")
	_, err := client.Append(ctx, fourth, []itx.EventInput{ev("x", `{}`)}, itx.AppendOptions{})
	requireCode(t, err, itx.ELimitExceeded)
	require.Contains(t, itx.ErrorMessage(err), "--max-held-streams")
	_, err = openConn(t, fourth, connOpts{noState: true}, newTestSink())
	requireCode(t, err, itx.ELimitExceeded)

	fut, release := conns[0].Close(ctx, nil)
	_, err = fut.Struct()
	release()
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := client.Append(ctx, fourth, []itx.EventInput{ev("x", `{}`)}, itx.AppendOptions{})
		return err == nil
	}, 10*time.Second, 5*time.Millisecond, "a released stream makes room")
	events, err := client.GetEvents(ctx, fourth, itx.Query{})
	require.NoError(t, err)
	require.Len(t, events, 1, "the refused appends wrote nothing")
}
