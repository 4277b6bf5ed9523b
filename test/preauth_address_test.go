package test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/schema"
	"github.com/stretchr/testify/require"
)

// nonLoopbackIP is an address of this machine's that is not loopback (a peer dialing it from
// here is seen from that address), or skips the test.
func nonLoopbackIP(t *testing.T) string {
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	t.Skip("no non-loopback IPv4 address on this machine: the per-address bound exempts loopback")
	return ""
}

// A peer with no token may hold only --rpc-preauth-max-connections-per-address connections not
// logged in yet: past them, its next connection from that address is refused at accept with an
// Abort naming the flag, counted on /metrics and logged naming the address. Without the bound,
// connections that never log in held every --rpc-max-connections slot for the login window
// (and again at once after each abort), and nobody, of any project, could connect. A login
// gives its connection's place back; loopback peers are not counted.
func TestItxd_PreAuthConnectionsPerAddress(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	ip := nonLoopbackIP(t)
	metrics := freeAddr(t)
	p := startItxd(t, t.TempDir(), "--listen", "0.0.0.0:0", "--insecure",
		"--metrics", metrics, "--rpc-preauth-max-connections-per-address", "4")
	_, port, err := net.SplitHostPort(p.addr)
	require.NoError(t, err)
	remote, local := net.JoinHostPort(ip, port), net.JoinHostPort("127.0.0.1", port)

	// served holds a raw connection that never logs in, once itxd answered its bootstrap.
	served := func(addr string) *itxtest.RawClient {
		r := itxtest.DialRaw(t, addr)
		r.Bootstrap(0)
		r.UntilReturn(0)
		return r
	}
	refused := func() {
		t.Helper()
		r := itxtest.DialRaw(t, remote)
		r.Bootstrap(0)
		_, reason := r.UntilAbort()
		require.True(t, strings.HasPrefix(reason, "itx.limitExceeded: itxd serves at most 4 connections not logged in yet from one address"), "abort reason %q", reason)
		require.Contains(t, reason, "--rpc-preauth-max-connections-per-address")
	}

	var idle []*itxtest.RawClient
	for range 4 {
		idle = append(idle, served(remote))
	}
	refused()
	// Loopback peers are not counted: local processor hosts and clients all share 127.0.0.1.
	for range 8 {
		served(local)
	}

	// A login gives its connection's place back: once one idle connection is gone, a client
	// from that address logs in, and then the address again holds 4 not logged in.
	idle[0].Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var proj schema.Project
	waitUntil(t, "a client from the address logs in once an idle connection closed", func() bool {
		c, err := client.Dial(ctx, remote)
		if err != nil {
			return false
		}
		pr := c.Login(ctx, p.creds.ProjectToken)
		// (Resolve answers nil for a login that failed too: a call tells.)
		s := client.Stream(ctx, pr, "/after-refusals")
		_, err = client.Append(ctx, s, []itx.EventInput{ev("a", `{}`)}, itx.AppendOptions{})
		s.Release()
		if err != nil {
			pr.Release()
			c.Close()
			return false
		}
		t.Cleanup(func() { c.Close() })
		proj = pr
		return true
	})
	defer proj.Release()
	_ = served(remote)
	refused()
	s := stream(t, proj, "/after-refusals")
	mustAppend(t, s, ev("a", `{}`))

	require.GreaterOrEqual(t, scrapeMetric(t, metrics, "itx_rpc_connections_refused_per_address_total"), 2.0)
	require.Zero(t, scrapeMetric(t, metrics, "itx_rpc_connections_refused_total"), "--rpc-max-connections was not reached")
	// (itxd's stderr reaches the test through a pipe: waited for, not read at once.)
	waitUntil(t, "the refusal is logged", func() bool { return strings.Contains(p.logs.String(), "rpc connection refused at accept") })
	require.Contains(t, p.logs.String(), "remote="+ip+":", "the warning names the address")
	require.Equal(t, 1, strings.Count(p.logs.String(), "rpc connection refused at accept"), "one warning per 10 s, not one per refusal")
}

// Connections not logged in yet are at most --rpc-preauth-max-connections over every address:
// one more closes the oldest of them with an Abort naming the flag. Peers on many addresses,
// each under its per-address bound, held every --rpc-max-connections slot for the login
// window, and no client could connect; now a client whose login comes before that many newer
// connections do gets in, and the peers hold at most that many slots.
func TestItxd_PreAuthConnectionsOldestGiveWay(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	metrics := freeAddr(t)
	p := startItxd(t, t.TempDir(), "--metrics", metrics, "--rpc-preauth-max-connections", "3")
	ctx := ctxT(t)
	served := func() *itxtest.RawClient {
		r := itxtest.DialRaw(t, p.addr)
		r.Bootstrap(0)
		r.UntilReturn(0)
		return r
	}
	evicted := func(r *itxtest.RawClient) {
		t.Helper()
		_, reason := r.UntilAbort()
		require.True(t, strings.HasPrefix(reason, "itx.limitExceeded: itxd keeps at most 3 connections not logged in yet (--rpc-preauth-max-connections): the oldest is closed"), "abort reason %q", reason)
	}
	idle := []*itxtest.RawClient{served(), served(), served()}
	fourth := served()
	evicted(idle[0])

	// A client logging in while peers hold every place takes the oldest one's.
	proj := dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
	defer proj.Release()
	mustAppend(t, stream(t, proj, "/in"), ev("a", `{}`))
	evicted(idle[1])
	require.Equal(t, 2.0, scrapeMetric(t, metrics, "itx_rpc_preauth_evicted_total"))
	require.Equal(t, 2.0, scrapeMetric(t, metrics, "itx_rpc_preauth_connections"), "the two newest raw connections; the client logged in")
	fourth.Bootstrap(1)
	fourth.UntilReturn(1)
	idle[2].Bootstrap(1)
	idle[2].UntilReturn(1)
	// Logged at warn naming the address, at most once per 10 s.
	const closed = "rpc connection not logged in yet closed for a newer one"
	waitUntil(t, "the eviction is logged", func() bool { return strings.Contains(p.logs.String(), closed) })
	require.Equal(t, 1, strings.Count(p.logs.String(), closed), "one warning for the two")
	require.Contains(t, p.logs.String(), "remote=127.0.0.1:")
}
