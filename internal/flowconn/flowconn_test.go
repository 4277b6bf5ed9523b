package flowconn_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/rpc"
	"github.com/itx-dev/itx/internal/flowconn"
	"github.com/itx-dev/itx/schema"
)

// bigReply is the version string every call answers: large, so replies fill the socket buffers.
var bigReply = strings.Repeat("v", 64<<10)

// gateway answers version() with bigReply and login() by lifting its connection's bounds.
type gateway struct{ t *flowconn.Transport }

func (g *gateway) Login(ctx context.Context, call schema.Gateway_login) error {
	g.t.Authenticate()
	return nil
}

func (g *gateway) Version(ctx context.Context, call schema.Gateway_version) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return res.SetServer(bigReply)
}

// serve accepts connections on a real loopback listener, each flow-controlled against pool.
func serve(t *testing.T, pool *flowconn.Pool) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	t.Cleanup(func() { ln.Close(); conns.Wait() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tr := flowconn.New(c, pool)
			conn := rpc.NewConn(tr, &rpc.Options{BootstrapClient: capnp.Client(schema.Gateway_ServerToClient(&gateway{t: tr}))})
			conns.Add(1)
			go func() { defer conns.Done(); <-conn.Done() }()
			t.Cleanup(func() { conn.Close() })
		}
	}()
	return ln.Addr().String()
}

// gatedConn is a client socket that reads nothing until open is closed: a client that pipelines
// calls and never reads the replies.
type gatedConn struct {
	net.Conn
	open chan struct{}
}

func (g *gatedConn) Read(b []byte) (int, error) {
	<-g.open
	return g.Conn.Read(b)
}

// dialGated returns the bootstrap Gateway of a client connection whose reads wait for open.
func dialGated(t *testing.T, addr string, open chan struct{}) schema.Gateway {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	conn := rpc.NewConn(rpc.NewStreamTransport(&gatedConn{Conn: c, open: open}), nil)
	t.Cleanup(func() { conn.Close() })
	return schema.Gateway(conn.Bootstrap(context.Background()))
}

func waitFor(t *testing.T, pool *flowconn.Pool, what string, cond func(flowconn.Stats) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !pool.WaitFor(ctx.Done(), cond) {
		t.Fatalf("timed out waiting for %s: %+v", what, pool.Stats())
	}
}

func TestTransport_StopsReadingAtTheBound(t *testing.T) {
	for _, tc := range []struct {
		name  string
		login bool
		calls int // the bound that applies
	}{
		{"before login", false, 4},
		{"after login", true, 32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := flowconn.NewPool(flowconn.Limits{PreAuthCalls: 4, PreAuthBytes: 1 << 30, Calls: 32, Bytes: 1 << 30})
			addr := serve(t, pool)
			open := make(chan struct{})
			gw := dialGated(t, addr, open)
			if tc.login {
				// The login's reply is small enough for the socket buffers, so it is written
				// and its call closed even though the client reads nothing.
				gw.Login(context.Background(), nil)
				waitFor(t, pool, "the login answered", func(s flowconn.Stats) bool { return s.Calls == 0 })
			}
			const n = 200
			futures := make([]schema.Gateway_version_Results_Future, n)
			for i := range futures {
				var release capnp.ReleaseFunc
				futures[i], release = gw.Version(context.Background(), nil)
				defer release()
			}
			// Runs before the releases, which wait for answers the client must read, so a
			// failing test ends instead of hanging.
			openOnce := sync.OnceFunc(func() { close(open) })
			defer openOnce()
			waitFor(t, pool, "a pause", func(s flowconn.Stats) bool { return s.Pauses >= 1 && s.Calls >= tc.calls })
			if got := pool.Stats().Calls; got != tc.calls {
				t.Fatalf("calls in flight = %d, want %d (the bound)", got, tc.calls)
			}

			// Once the client reads, every call is answered: the server pushed back, it did
			// not drop anything.
			openOnce()
			for i, f := range futures {
				res, err := f.Struct()
				if err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
				if s, _ := res.Server(); s != bigReply {
					t.Fatalf("call %d: a reply of %d bytes, want %d", i, len(s), len(bigReply))
				}
			}
			waitFor(t, pool, "all calls closed", func(s flowconn.Stats) bool { return s.Calls == 0 && s.Bytes == 0 })
		})
	}
}

func TestTransport_ByteBound(t *testing.T) {
	// One reply of 64 KiB is over the bound: after the first call is answered (and stuck in the
	// client's unread socket), nothing more is read until the peer reads.
	pool := flowconn.NewPool(flowconn.Limits{PreAuthCalls: 1000, PreAuthBytes: 1})
	addr := serve(t, pool)
	open := make(chan struct{})
	gw := dialGated(t, addr, open)
	var futures []schema.Gateway_version_Results_Future
	for range 1000 { // 64 MiB of replies if nothing pushed back
		f, release := gw.Version(context.Background(), nil)
		defer release()
		futures = append(futures, f)
	}
	openOnce := sync.OnceFunc(func() { close(open) })
	defer openOnce() // before the releases: see TestTransport_StopsReadingAtTheBound
	waitFor(t, pool, "a pause", func(s flowconn.Stats) bool { return s.Pauses >= 1 && s.Bytes > 0 })
	// Replies already in the socket buffers were written; what is queued is bounded by the calls
	// read before the pause, not by the 2,000 sent.
	if s := pool.Stats(); s.Calls >= 1000 {
		t.Fatalf("calls in flight = %d: the byte bound did not stop reading", s.Calls)
	}
	openOnce()
	for i, f := range futures {
		if _, err := f.Struct(); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
}

func TestTransport_GlobalBoundKeepsAReserve(t *testing.T) {
	pool := flowconn.NewPool(flowconn.Limits{PreAuthCalls: 100, PreAuthBytes: 1 << 30,
		GlobalCalls: 10, GlobalBytes: 1 << 30, ReserveCalls: 2})
	addr := serve(t, pool)
	gate := make(chan struct{})
	abuser := dialGated(t, addr, gate)
	for range 200 {
		_, release := abuser.Version(context.Background(), nil)
		defer release()
	}
	defer close(gate) // before the releases: a release waits for the client's own sends
	waitFor(t, pool, "the global bound", func(s flowconn.Stats) bool { return s.Pauses >= 1 && s.Calls >= 10 })
	if got := pool.Stats().Calls; got != 10 {
		t.Fatalf("calls in flight = %d, want the global bound 10", got)
	}
	// Another client still gets its calls through within its reserve.
	open := make(chan struct{})
	close(open)
	polite := dialGated(t, addr, open)
	for i := range 20 {
		f, release := polite.Version(context.Background(), nil)
		if _, err := f.Struct(); err != nil {
			t.Fatalf("polite call %d: %v", i, err)
		}
		release()
	}
}
