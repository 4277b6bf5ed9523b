package flowconn_test

import (
	"context"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/rpc"
	"github.com/itx-dev/itx/internal/flowconn"
	"github.com/itx-dev/itx/schema"
)

// TestTransport_ReserveReply: a reservation that would pass the connection's reply-bytes bound
// waits until one held is released; one with nothing held always goes; a waiting one gives up
// when its caller's context ends.
func TestTransport_ReserveReply(t *testing.T) {
	pool := flowconn.NewPool(flowconn.Limits{Bytes: 100, GlobalBytes: 1 << 20})
	c, peer := net.Pipe()
	defer peer.Close()
	tr := flowconn.New(c, pool)
	defer tr.Close()
	ctx := context.Background()

	first, err := tr.ReserveReply(ctx, 500, nil) // above the bound, but nothing is held: it goes
	if err != nil {
		t.Fatal(err)
	}
	granted := make(chan func(), 1)
	go func() {
		release, err := tr.ReserveReply(ctx, 10, nil)
		if err != nil {
			t.Error(err)
		}
		granted <- release
	}()
	inner, cancel := context.WithCancel(ctx)
	cctx := &checkedCtx{Context: inner, checked: make(chan struct{})}
	gaveUp, waited := make(chan error, 1), 0
	go func() {
		_, err := tr.ReserveReply(cctx, 10, func() { waited++ })
		gaveUp <- err
	}()
	<-cctx.checked                     // it found its context live under the pool's lock: it waits, and the end wakes it
	for pool.Stats().ReplyWaits != 2 { // the other waiter (10 bytes) too
		runtime.Gosched()
	}
	cancel()
	if err := <-gaveUp; err != context.Canceled {
		t.Fatalf("a waiting reservation whose context ended: %v, want context.Canceled", err)
	}
	if waited != 1 {
		t.Fatalf("onWait ran %d times before the wait, want once", waited)
	}
	select {
	case <-granted:
		t.Fatal("a reservation went past the bound while 500 bytes were held")
	default:
	}
	first()
	first() // releasing twice releases once
	(<-granted)()
	if n := pool.Stats().ReplyWaits; n != 0 {
		t.Fatalf("%d reservations still counted as waiting", n)
	}
	// Nothing held again (each release counted): 60 and 40 fit the bound of 100 together.
	for _, n := range []int64{60, 40} {
		if _, err := tr.ReserveReply(ctx, n, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// checkedCtx closes checked the first time its Err is asked.
type checkedCtx struct {
	context.Context
	checked chan struct{}
	once    sync.Once
}

func (c *checkedCtx) Err() error {
	err := c.Context.Err()
	c.once.Do(func() { close(c.checked) })
	return err
}

// reservingGateway's version() runs concurrently with other calls (as itxd's reads do), each
// running handle with its number (1, 2, ... in the order they arrive) before it answers.
type reservingGateway struct {
	t      *flowconn.Transport
	calls  atomic.Int32
	handle func(ctx context.Context, t *flowconn.Transport, n int32) error
}

func (g *reservingGateway) Login(ctx context.Context, call schema.Gateway_login) error {
	g.t.Authenticate()
	return nil
}

func (g *reservingGateway) Version(ctx context.Context, call schema.Gateway_version) error {
	call.Go()
	if err := g.handle(ctx, g.t, g.calls.Add(1)); err != nil {
		return err
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return res.SetServer("ok")
}

// A call's reservation counts until its reply is queued, not only until the call releases it:
// go-capnp queues the reply after the handler returns (and so after its deferred release), and a
// read reserving in between went past the bound (TestItxd_PipelinedLargeReadsStayWithinTheReplyBound
// saw 26.4 MiB queued against a bound of 16 MiB and two pages, once, in CI). The queued reply
// hands the room on at once, though another call (one that reserves nothing) is still in flight.
func TestTransport_ReservationCountsUntilTheReplyIsQueued(t *testing.T) {
	pool := flowconn.NewPool(reservingLimits)
	released, blocking, granted := make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{}, 1)
	goOn, unblock := make(chan struct{}), make(chan struct{})
	letGoOn := sync.OnceFunc(func() { close(goOn) })
	defer close(unblock) // also on a failure: the handlers must return for the connection to close
	defer letGoOn()
	conn, gw := serveReserving(t, pool, &reservingGateway{handle: func(ctx context.Context, tr *flowconn.Transport, n int32) error {
		switch n {
		case 1: // reserves 80 bytes and releases them; its reply is queued once goOn is closed
			release, err := tr.ReserveReply(ctx, 80, nil)
			if err != nil {
				return err
			}
			release()
			released <- struct{}{}
			<-goOn
		case 2: // in flight till the end, holding nothing
			blocking <- struct{}{}
			<-unblock
		default: // reserves 30 bytes
			release, err := tr.ReserveReply(ctx, 30, nil)
			if err != nil {
				return err
			}
			release()
			granted <- struct{}{}
		}
		return nil
	}})
	first, rel := gw.Version(context.Background(), nil)
	defer rel()
	<-released // the first call released its 80 bytes; its reply is not queued yet
	_, relBlocker := gw.Version(context.Background(), nil)
	defer relBlocker()
	<-blocking
	third, rel3 := gw.Version(context.Background(), nil)
	defer rel3()
	defer conn.Close() // first on a failure: the releases above wait for answers otherwise

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for pool.Stats().ReplyWaits != 1 { // the third call waits (counted without a wake-up)
		select {
		case <-granted:
			t.Fatal("30 bytes were reserved while the 80 released by a call whose reply is not queued still counted against the bound of 100")
		case <-ctx.Done():
			t.Fatal("the third call's reservation neither waited nor was granted")
		default:
			runtime.Gosched()
		}
	}
	letGoOn() // the first handler returns: its reply is queued, and its reservation goes with it
	select {
	case <-granted:
	case <-ctx.Done():
		t.Fatal("the reservation was not granted once the first call's reply was queued")
	}
	if _, err := first.Struct(); err != nil {
		t.Fatal(err)
	}
	if _, err := third.Struct(); err != nil {
		t.Fatal(err)
	}
}

// reservingLimits: a reply-bytes bound of 100 and room for everything else.
var reservingLimits = flowconn.Limits{Bytes: 100, GlobalBytes: 1 << 20, Calls: 8, CallBytes: 1 << 20, GlobalCallBytes: 1 << 20,
	PreAuthCalls: 8, PreAuthBytes: 1 << 20, Unfinished: 8, UnfinishedBytes: 1 << 20, PreAuthUnfinished: 8, PreAuthUnfinishedBytes: 1 << 20, LoginTimeout: noLoginTimeout}

// serveReserving serves g on a connection of pool (setting g.t) and returns a logged-in client.
func serveReserving(t *testing.T, pool *flowconn.Pool, g *reservingGateway) (*rpc.Conn, schema.Gateway) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan *rpc.Conn, 1)
	t.Cleanup(func() {
		ln.Close()
		if conn := <-served; conn != nil {
			conn.Close()
		}
	})
	go func() {
		defer close(served)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		tr, err := pool.Open(c)
		if err != nil {
			return
		}
		g.t = tr
		served <- rpc.NewConn(tr, &rpc.Options{BootstrapClient: capnp.Client(schema.Gateway_ServerToClient(g))})
	}()
	conn, gw := dialGateway(t, ln.Addr().String())
	login, release := gw.Login(context.Background(), nil)
	call(t, login, release) // before login a connection reads one call at a time
	return conn, gw
}

// A reservation released after its call's reply was queued (no handler in itxd does that) is
// handed on by no reply: with nothing else held and no other call to hand it on, the next call's
// reservation goes rather than wait for ever.
func TestTransport_ReservationReleasedAfterItsReplyBlocksNoOne(t *testing.T) {
	pool := flowconn.NewPool(reservingLimits)
	late, granted, started, reserveNow := make(chan func(), 1), make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{})
	conn, gw := serveReserving(t, pool, &reservingGateway{handle: func(ctx context.Context, tr *flowconn.Transport, n int32) error {
		if n == 1 { // reserves 80 bytes and answers; the test releases them after the reply
			release, err := tr.ReserveReply(ctx, 80, nil)
			if err != nil {
				return err
			}
			late <- release
			return nil
		}
		started <- struct{}{}
		<-reserveNow
		release, err := tr.ReserveReply(ctx, 30, nil)
		if err != nil {
			return err
		}
		release()
		granted <- struct{}{}
		return nil
	}})
	first, rel := gw.Version(context.Background(), nil)
	defer rel()
	if _, err := first.Struct(); err != nil { // its reply is queued (and read)
		t.Fatal(err)
	}
	second, rel2 := gw.Version(context.Background(), nil)
	defer rel2()
	defer conn.Close() // first on a failure: the releases above wait for answers otherwise
	<-started          // the second call is in flight
	(<-late)()         // 80 bytes released now, with no reply to come for them but the second call's
	close(reserveNow)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	select {
	case <-granted:
	case <-ctx.Done():
		t.Fatal("a call waited for room held by a reservation no reply will hand on")
	}
	if _, err := second.Struct(); err != nil {
		t.Fatal(err)
	}
}
