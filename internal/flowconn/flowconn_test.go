package flowconn_test

import (
	"context"
	"errors"
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

// gateway answers version() with bigReply and login() by lifting its connection's bounds. With
// hold set, version() waits for it to close first; answered gets one value per version answered.
type gateway struct {
	t        *flowconn.Transport
	project  bool // login() answers with a capability (as itxd's does), so its reply awaits a Finish
	hold     <-chan struct{}
	answered chan<- struct{}
}

func (g *gateway) Login(ctx context.Context, call schema.Gateway_login) error {
	g.t.Authenticate()
	if !g.project {
		return nil
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	// A capability in the reply, so that it waits for the client's Finish.
	return res.SetProject(schema.Project(capnp.ErrorClient(errors.New("a test project"))))
}

func (g *gateway) Version(ctx context.Context, call schema.Gateway_version) error {
	if g.hold != nil {
		select {
		case <-g.hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if g.answered != nil {
		defer func() { g.answered <- struct{}{} }()
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return res.SetServer(bigReply)
}

// noLoginTimeout is the login deadline of pools whose clients never log in and whose tests are
// about another bound: longer than any run. The 30 s default aborted TestTransport_ByteBound's
// connection mid-test (1,300 calls of 64 KiB replies took 47 s under -race on a loaded machine,
// and its calls failed "connection closed").
const noLoginTimeout = time.Hour

// serve accepts connections on a real loopback listener, each flow-controlled against pool.
func serve(t *testing.T, pool *flowconn.Pool) string { return serveHeld(t, pool, nil, nil) }

// serveHeld is serve whose version() calls wait for hold and report on answered.
func serveHeld(t *testing.T, pool *flowconn.Pool, hold <-chan struct{}, answered chan<- struct{}) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// The connections are closed by the one cleanup registered here: a t.Cleanup from the accept
	// goroutine raced with the test's end (seen under -race).
	var (
		conns  sync.WaitGroup
		mu     sync.Mutex
		open   []*rpc.Conn
		closed bool
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		closed = true
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		conns.Wait()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tr, err := pool.Open(c)
			if err != nil {
				continue // refused: the client got an Abort saying why
			}
			conn := rpc.NewConn(tr, &rpc.Options{BootstrapClient: capnp.Client(schema.Gateway_ServerToClient(&gateway{t: tr, project: true, hold: hold, answered: answered}))})
			mu.Lock()
			if closed {
				mu.Unlock()
				conn.Close()
				return
			}
			conns.Add(1) // before the cleanup's Wait, which comes after closed is set
			open = append(open, conn)
			mu.Unlock()
			go func() { defer conns.Done(); <-conn.Done() }()
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
			pool := flowconn.NewPool(flowconn.Limits{PreAuthCalls: 4, PreAuthBytes: 1 << 30, Calls: 32, Bytes: 1 << 30, PreAuthUnfinished: 1 << 20, PreAuthUnfinishedBytes: 1 << 40,
				LoginTimeout: noLoginTimeout})
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
			// Never past the bound. (A reply that still fits in the socket's buffers ends its
			// call, and the server then reads the next: a later reading may be one below it.)
			if got := pool.Stats().Calls; got > tc.calls {
				t.Fatalf("calls in flight = %d, above the bound %d", got, tc.calls)
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
	// Replies of 64 KiB to a client that reads nothing: once the socket buffers are full they
	// queue, and from then on the connection reads no more calls until the peer reads. Calls read
	// before any reply queued are bounded by the call bound, not this one, so the test first lets
	// 300 calls in with their answers held (19 MiB of replies, more than loopback's socket
	// buffers take), releases the answers, and only then sends the calls the bound must leave
	// unread.
	pool := flowconn.NewPool(flowconn.Limits{PreAuthCalls: 2000, PreAuthBytes: 1, PreAuthUnfinished: 1 << 20, PreAuthUnfinishedBytes: 1 << 40,
		LoginTimeout: noLoginTimeout})
	hold := make(chan struct{})
	answered := make(chan struct{}, 2000)
	addr := serveHeld(t, pool, hold, answered)
	open := make(chan struct{})
	gw := dialGated(t, addr, open)
	var futures []schema.Gateway_version_Results_Future
	var releases []capnp.ReleaseFunc
	openOnce := sync.OnceFunc(func() { close(open) })
	releaseHold := sync.OnceFunc(func() { close(hold) })
	defer func() {
		releaseHold()
		openOnce() // before the releases: see TestTransport_StopsReadingAtTheBound
		for _, release := range releases {
			release()
		}
	}()
	call := func(n int) {
		for range n {
			f, release := gw.Version(context.Background(), nil)
			releases = append(releases, release)
			futures = append(futures, f)
		}
	}
	call(300)
	waitFor(t, pool, "the first calls read", func(s flowconn.Stats) bool { return s.Calls == 300 })
	releaseHold()
	for i := range 300 {
		select {
		case <-answered:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of the first 300 calls answered", i)
		}
	}
	waitFor(t, pool, "their replies queued", func(s flowconn.Stats) bool { return s.Bytes > 0 })
	read := pool.Stats().Calls
	call(1000) // 64 MiB more if nothing pushed back
	waitFor(t, pool, "a pause", func(s flowconn.Stats) bool { return s.Pauses >= 1 })
	// At most the call the reader was already waiting for got in after the replies queued.
	if s := pool.Stats(); s.Calls > read+1 {
		t.Fatalf("calls in flight = %d, %d before the second step: the byte bound did not stop reading", s.Calls, read)
	}
	openOnce()
	for i, f := range futures {
		if _, err := f.Struct(); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
}

func TestTransport_GlobalBoundKeepsAReserve(t *testing.T) {
	pool := flowconn.NewPool(flowconn.Limits{PreAuthCalls: 100, PreAuthBytes: 1 << 30, PreAuthUnfinished: 1 << 20, PreAuthUnfinishedBytes: 1 << 40,
		GlobalCalls: 10, GlobalBytes: 1 << 30, ReserveCalls: 2, LoginTimeout: noLoginTimeout})
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
