package flowconn_test

import (
	"context"
	"encoding/binary"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/rpc"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/internal/flowconn"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/schema"
)

// dialGateway opens a go-capnp client connection to addr, closed when the test ends, and
// returns it with its bootstrap Gateway.
func dialGateway(t *testing.T, addr string) (*rpc.Conn, schema.Gateway) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	conn := rpc.NewConn(rpc.NewStreamTransport(c), nil)
	t.Cleanup(func() { conn.Close() })
	return conn, schema.Gateway(conn.Bootstrap(context.Background()))
}

// call makes one call and fails the test if it fails.
func call[R any](t *testing.T, f interface{ Struct() (R, error) }, release func()) {
	t.Helper()
	defer release()
	if _, err := f.Struct(); err != nil {
		t.Fatal(err)
	}
}

// A client that never sends Finish keeps every reply holding a capability in go-capnp's answer
// table (here: bootstraps, each answering with the gateway); past the bound its connection is
// aborted with limitExceeded, and everything it held is returned.
func TestTransport_AbortsAClientThatNeverFinishes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limits flowconn.Limits
	}{
		{"count", flowconn.Limits{PreAuthUnfinished: 8, PreAuthUnfinishedBytes: 1 << 30}},
		// A bootstrap's reply is under 100 bytes: the bound falls within the 40.
		{"bytes", flowconn.Limits{PreAuthUnfinished: 1 << 20, PreAuthUnfinishedBytes: 1_000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := flowconn.NewPool(tc.limits)
			r := itxtest.DialRaw(t, serve(t, pool))
			const calls = 40
			for q := uint32(0); q < calls; q++ {
				r.Bootstrap(q)
			}
			returns, reason := r.UntilAbort()
			if !strings.HasPrefix(reason, "itx.limitExceeded: ") || !strings.Contains(reason, "not finished") {
				t.Fatalf("abort reason %q, want limitExceeded about unfinished replies", reason)
			}
			if returns >= calls {
				t.Fatalf("%d returns before the abort: the connection kept answering past the bound", returns)
			}
			waitFor(t, pool, "the connection's use returned", func(s flowconn.Stats) bool {
				return s.Conns == 0 && s.Unfinished == 0 && s.UnfinishedBytes == 0 && s.Calls == 0 && s.Aborts == 1
			})
		})
	}
}

// After login the connection's own bounds apply, and the abort names their flags.
func TestTransport_AbortsAClientThatNeverFinishes_AfterLogin(t *testing.T) {
	pool := flowconn.NewPool(flowconn.Limits{Unfinished: 8, UnfinishedBytes: 1 << 30, Calls: 4})
	r := itxtest.DialRaw(t, serve(t, pool))
	r.Bootstrap(0)
	r.Login(1, 0)
	r.UntilReturn(1)
	for q := uint32(2); q <= 40; q++ {
		r.Login(q, 0) // each reply holds a Project
	}
	returns, reason := r.UntilAbort()
	if !strings.HasPrefix(reason, "itx.limitExceeded: ") || !strings.Contains(reason, "(--rpc-max-unfinished-replies,") {
		t.Fatalf("abort reason %q, want limitExceeded naming the logged-in bound", reason)
	}
	if returns > 1+8+1+4 { // the login, the bound, the one that crossed it, the calls read by then
		t.Fatalf("%d returns before the abort: the connection kept reading calls past the bound", returns)
	}
}

// A reply without capabilities needs no Finish (go-capnp says noFinishNeeded and forgets it as it
// sends it): a client that never finishes any makes many more calls than the bound, and a
// Finish sent anyway is ignored.
func TestTransport_RepliesWithoutCapabilitiesAreNotHeld(t *testing.T) {
	pool := flowconn.NewPool(flowconn.Limits{PreAuthUnfinished: 4, PreAuthUnfinishedBytes: 200_000})
	r := itxtest.DialRaw(t, serve(t, pool))
	r.Bootstrap(0)
	r.UntilReturn(0)
	for q := uint32(1); q <= 40; q++ {
		r.Version(q, 0) // 64 KiB each: the fourth would cross the bytes bound if it were held
		r.UntilReturn(q)
	}
	r.Finish(7) // late, and not needed: ignored
	r.Version(41, 0)
	r.UntilReturn(41)
	if s := pool.Stats(); s.Aborts != 0 || s.Conns != 1 || s.Unfinished != 1 {
		t.Fatalf("replies without capabilities were held: %+v (want only the bootstrap's)", s)
	}
}

// Replies the client finishes are not held against it, also when the Finish comes before the
// Return (a cancelled call): a client finishing each reply makes many more calls than the bound.
func TestTransport_FinishedRepliesAreNotHeld(t *testing.T) {
	hold := make(chan struct{})
	pool := flowconn.NewPool(flowconn.Limits{PreAuthUnfinished: 4, PreAuthUnfinishedBytes: 1 << 30})
	addr := serveHeld(t, pool, hold, nil)
	r := itxtest.DialRaw(t, addr)
	r.Bootstrap(0)
	r.UntilReturn(0)

	// Finished before its Return: the server cancels it, and its Return is not counted.
	r.Version(1, 0)
	waitFor(t, pool, "the call read", func(s flowconn.Stats) bool { return s.Calls == 1 })
	r.Finish(1)
	r.UntilReturn(1)
	close(hold)

	for q := uint32(2); q < 100; q++ {
		r.Version(q, 0)
		r.UntilReturn(q)
		r.Finish(q)
	}
	r.Finish(0)
	waitFor(t, pool, "every reply finished", func(s flowconn.Stats) bool {
		return s.Unfinished == 0 && s.UnfinishedBytes == 0 && s.Calls == 0
	})
	if s := pool.Stats(); s.Aborts != 0 || s.Conns != 1 {
		t.Fatalf("a client finishing its replies was cut off: %+v", s)
	}
}

// go-capnp clients finish every reply holding a capability (250 ms after it): their replies are
// all released.
func TestTransport_GoClientsFinishTheirReplies(t *testing.T) {
	pool := flowconn.NewPool(flowconn.Limits{})
	_, gw := dialGateway(t, serve(t, pool))
	for range 50 {
		f, release := gw.Login(context.Background(), nil)
		call(t, f, release)
	}
	waitFor(t, pool, "50 replies held", func(s flowconn.Stats) bool { return s.Unfinished > 0 })
	gw.Release()
	waitFor(t, pool, "every reply finished", func(s flowconn.Stats) bool { return s.Unfinished == 0 && s.UnfinishedBytes == 0 })
}

// A connection that has not logged in within LoginTimeout is aborted; one that has, is not.
func TestTransport_LoginTimeout(t *testing.T) {
	clk := clocktest.New(time.Unix(1_800_000_000, 0))
	pool := flowconn.NewPool(flowconn.Limits{LoginTimeout: 30 * time.Second, Clock: clk})
	addr := serve(t, pool)

	r := itxtest.DialRaw(t, addr)
	r.Bootstrap(0)
	r.UntilReturn(0) // the transport (and its login deadline) exists

	_, gw := dialGateway(t, addr)
	login, release := gw.Login(context.Background(), nil)
	call(t, login, release)
	if n := clk.Pending(); n != 1 {
		t.Fatalf("%d login deadlines armed, want 1 (the logged-in connection's is stopped)", n)
	}

	clk.Advance(30 * time.Second)
	_, reason := r.UntilAbort()
	if !strings.HasPrefix(reason, "itx.deadlineExceeded: no login within 30s") {
		t.Fatalf("abort reason %q", reason)
	}
	f, release := gw.Version(context.Background(), nil)
	call(t, f, release) // the logged-in connection is served
	waitFor(t, pool, "one connection left", func(s flowconn.Stats) bool { return s.Conns == 1 && s.Aborts == 1 })
}

// Past Connections, a new connection gets an Abort saying so and is closed; once one closes,
// the next is served.
func TestPool_RefusesConnectionsPastTheBound(t *testing.T) {
	pool := flowconn.NewPool(flowconn.Limits{Connections: 2})
	addr := serve(t, pool)
	var conns []*rpc.Conn
	for range 2 {
		conn, gw := dialGateway(t, addr)
		f, release := gw.Version(context.Background(), nil)
		call(t, f, release)
		conns = append(conns, conn)
	}

	r := itxtest.DialRaw(t, addr)
	_, reason := r.UntilAbort()
	if !strings.HasPrefix(reason, "itx.limitExceeded: itxd serves at most 2 connections") {
		t.Fatalf("abort reason %q", reason)
	}
	if s := pool.Stats(); s.Refused != 1 || s.Conns != 2 {
		t.Fatalf("stats %+v, want 1 refused and 2 open", s)
	}

	conns[0].Close()
	waitFor(t, pool, "a connection closed", func(s flowconn.Stats) bool { return s.Conns == 1 })
	r = itxtest.DialRaw(t, addr)
	r.Bootstrap(0)
	r.UntilReturn(0)
}

// go-capnp answers a Call whose results go elsewhere (sendResultsTo yourself or a third party)
// with an Unimplemented message echoing it, never a Return. The call is answered all the same:
// it must not stay counted in flight, or a client that sent as many as the calls bound had its
// connection never read again (a long hostile connection stopped being read after 128 of them).
func TestTransport_CallsAnsweredUnimplementedAreNotInFlight(t *testing.T) {
	pool := flowconn.NewPool(flowconn.Limits{PreAuthCalls: 4, LoginTimeout: noLoginTimeout})
	r := itxtest.DialRaw(t, serve(t, pool))
	r.Bootstrap(0)
	r.UntilReturn(0)
	for q := uint32(1); q <= 40; q++ {
		r.CallMsg(itxtest.RawCall{Q: q, Target: itxtest.OnAnswer(0), Iface: schema.Gateway_TypeID, Method: 1,
			Build: func(c rpccp.Call) error { c.SendResultsTo().SetYourself(); return nil }})
	}
	r.Version(41, 0)
	r.UntilReturn(41)
	waitFor(t, pool, "no call in flight", func(s flowconn.Stats) bool { return s.Calls == 0 && s.CallBytes == 0 })
	if s := pool.Stats(); s.Aborts != 0 || s.Conns != 1 {
		t.Fatalf("%+v", s)
	}
}

// A client that closes its connection while the connection is held back at its call bound is
// seen gone at the next HangupPoll: the connection ends, and the calls it held end with their
// contexts. Before, nothing read the socket while held back, so the close was seen only when
// one of those calls ended by itself (a waitForEvent may run for minutes).
func TestTransport_HeldBackConnectionSeesItsClientClose(t *testing.T) {
	clk := clocktest.New(time.Unix(1_800_000_000, 0))
	pool := flowconn.NewPool(flowconn.Limits{PreAuthCalls: 4, PreAuthBytes: 1 << 30,
		PreAuthUnfinished: 1 << 20, PreAuthUnfinishedBytes: 1 << 40, LoginTimeout: time.Hour, Clock: clk})
	addr := serveHeld(t, pool, make(chan struct{}), nil) // version() ends only with its context
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	conn := rpc.NewConn(rpc.NewStreamTransport(c), nil)
	t.Cleanup(func() { conn.Close() })
	gw := schema.Gateway(conn.Bootstrap(context.Background()))
	for range 8 {
		_, release := gw.Version(context.Background(), nil)
		t.Cleanup(release)
	}
	t.Cleanup(func() { c.Close() }) // first: the releases wait for answers
	waitFor(t, pool, "the connection held back", func(s flowconn.Stats) bool { return s.Pauses >= 1 && s.Calls >= 4 })
	// Checks while the client is still there leave the connection alone (Advance runs them).
	clk.Advance(3 * flowconn.HangupPoll)
	if s := pool.Stats(); s.Conns != 1 {
		t.Fatalf("a held-back connection whose client is still there ended: %+v", s)
	}
	c.Close()
	// The FIN reaches the server's socket a moment after the close: a check may come first and
	// look again one HangupPoll later.
	ended := func(s flowconn.Stats) bool { return s.Conns == 0 && s.Calls == 0 }
	deadline := time.Now().Add(10 * time.Second)
	for {
		clk.Advance(flowconn.HangupPoll)
		poll, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		done := pool.WaitFor(poll.Done(), ended)
		cancel()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the connection did not end: %+v", pool.Stats())
		}
	}
}

// unreadableBootstrap is a Bootstrap message whose Bootstrap struct lies outside the message:
// go-capnp cannot read it, reports it and answers nothing.
func unreadableBootstrap() []byte {
	b := make([]byte, 8+3*8)
	binary.LittleEndian.PutUint32(b[0:], 0)           // one segment
	binary.LittleEndian.PutUint32(b[4:], 3)           // of three words
	binary.LittleEndian.PutUint64(b[8:], 1<<32|1<<48) // root: a struct of one data word and one pointer
	binary.LittleEndian.PutUint16(b[16:], uint16(rpccp.Message_Which_bootstrap))
	binary.LittleEndian.PutUint64(b[24:], uint64(1000<<2)|1<<32|1<<48) // the Bootstrap, 1,000 words past the end
	return b
}

// A Call or Bootstrap go-capnp cannot read is dropped unanswered, so it is not a call in
// flight. Counted, it stayed open for good (found by test/rpc_wire_fuzz_test.go): against the
// connection's calls bound and the pool's, and before login a message above the pre-login
// bound waits for the open calls to end, so such a connection read nothing more and outlived
// its client's close until its login deadline.
func TestTransport_UnreadableCallIsNotInFlight(t *testing.T) {
	pool := flowconn.NewPool(flowconn.Limits{PreAuthCalls: 4, LoginTimeout: noLoginTimeout})
	r := itxtest.DialRaw(t, serve(t, pool))
	for range 3 { // below the calls bound: counted, they would stop the reads after one more
		if err := r.WriteRaw(unreadableBootstrap()); err != nil {
			t.Fatal(err)
		}
	}
	r.Bootstrap(0)
	r.UntilReturn(0)
	waitFor(t, pool, "no call in flight", func(s flowconn.Stats) bool { return s.Calls == 0 && s.CallBytes == 0 })
	// Before login, a message above the pre-login bound is read once no call is open: here it
	// is too large for the connection, which ends at once.
	if err := r.WriteRaw([]byte{0, 0, 0, 0, 0, 0, 1, 0}); err != nil { // one segment of 65,536 words
		t.Fatal(err)
	}
	waitFor(t, pool, "the connection ended", func(s flowconn.Stats) bool { return s.Conns == 0 })
}

// failingWrites is a server socket whose writes fail, as a socket the client reset does.
type failingWrites struct{ net.Conn }

func (f failingWrites) Write([]byte) (int, error) { return 0, syscall.EPIPE }

// A connection whose write failed is torn down by its writer (what it held goes back to the
// pool) while its reader may still be between two messages: the capabilities it counts next
// are not the pool's any more. They were added back, for good: every client that reset its
// socket while itxd wrote to it left what it held in itx_rpc_capabilities and in the count
// --rpc-global-max-capabilities is checked against, so after enough of them itxd aborted
// clients holding almost nothing (found by test/residue_test.go: 72 held with one connection
// holding 7).
func TestTransport_CapabilitiesOfATornDownConnectionLeaveThePool(t *testing.T) {
	pool := flowconn.NewPool(flowconn.Limits{LoginTimeout: noLoginTimeout})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		tr, err := pool.Open(failingWrites{c})
		if err != nil {
			return
		}
		var counts atomic.Int32
		tr.CountCapabilities(func() int {
			// The reader's second count comes once the writer tore the connection down (the
			// bootstrap's answer failed to write): the order the race takes in the field.
			if counts.Add(1) == 2 {
				pool.WaitFor(nil, func(s flowconn.Stats) bool { return s.Conns == 0 })
			}
			return 7
		})
		conn := rpc.NewConn(tr, &rpc.Options{BootstrapClient: capnp.Client(schema.Gateway_ServerToClient(&gateway{t: tr}))})
		<-conn.Done()
	}()
	r := itxtest.DialRaw(t, ln.Addr().String())
	r.Bootstrap(0)
	<-done
	if s := pool.Stats(); s.Conns != 0 || s.Capabilities != 0 {
		t.Fatalf("once its connection ended the pool holds %d connections, %d capabilities; want 0, 0", s.Conns, s.Capabilities)
	}
}

// A peer is counted under its IPv4 address or its IPv6 /64 (a host is given a whole /64, so one
// peer would otherwise have as many addresses as it likes); loopback peers are not counted.
func TestAddressKey(t *testing.T) {
	for _, c := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 1}, "192.0.2.7"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.7"), Port: 1}, "192.0.2.7"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:aaaa::1"), Port: 1}, "2001:db8:1:2::/64"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:bbbb::9"), Port: 2}, "2001:db8:1:2::/64"},
		{&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 1, Zone: "eth0"}, "fe80::1"},
		{&net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 1}, ""},
		{&net.TCPAddr{IP: net.ParseIP("127.3.2.1"), Port: 1}, ""},
		{&net.TCPAddr{IP: net.ParseIP("::1"), Port: 1}, ""},
		{&net.UnixAddr{Name: "/tmp/sock", Net: "unix"}, ""},
		{nil, ""},
	} {
		if got := flowconn.AddressKey(c.addr); got != c.want {
			t.Errorf("AddressKey(%v) = %q, want %q", c.addr, got, c.want)
		}
	}
}
