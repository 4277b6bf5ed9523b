package test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/rpc"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/capability"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/internal/flowconn"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/wire"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// The capability graph's lifecycle: what the server holds for a client's capabilities, and what
// happens to it when they are released, replaced or lost.

// A provider that re-mounts its Receiver from a new session while the server is still calling
// the old one (a reconnect racing the old session's death): the old one's disconnection is not
// an absence, since a receiver is mounted under the name. The subscription must not park with a
// receiver mounted; it delivers to the new one.
func TestSubscription_ReceiverReplacedWhileCalledDoesNotPark(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/replaced")
	xStarted := make(chan struct{}, 1)
	oldConn := dial(t, e.ts.addr)
	op := oldConn.Login(e.ctx, e.ts.creds.ProjectToken)
	oldHandle, err := client.MountReceiver(e.ctx, op, "inbox", client.ServeReceiver(func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
		if b.Subscription == "y" {
			return 0, itx.Errorf(itx.EUnavailable, "not now") // an outage: y waits out a backoff
		}
		select {
		case xStarted <- struct{}{}:
		default:
		}
		<-ctx.Done() // x: never answered, until the connection dies
		return 0, ctx.Err()
	}))
	require.NoError(t, err)
	e.configure(t, s, client.SubscriptionConfig{Name: "y", FilterTypes: []string{"y"}, Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}})
	mustAppend(t, s, ev("y", `{}`))
	waitUntil(t, "y backs off", func() bool { return e.describe(t, s, "y").NextAttemptAt != 0 })
	e.configure(t, s, client.SubscriptionConfig{Name: "x", FilterTypes: []string{"x"}, Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}})
	mustAppend(t, s, ev("x", `{}`))
	select {
	case <-xStarted:
	case <-e.ctx.Done():
		t.Fatal("x's batch never reached the first receiver")
	}

	// The provider re-mounts from a new session; y's backoff is cut by the mount (the virtual
	// clock does not move), which shows the stream has taken the presence signal.
	fresh := newReceiverServer()
	defer mountReceiver(t, e.ts.addr, e.ts.creds.ProjectToken, "inbox", fresh)()
	e.waitProcessed(t, s, "y", 4)
	// Now the old session dies with x's batch in flight.
	oldHandle.Release()
	op.Release()
	oldConn.Close()
	// x's cursor passes its event once a receiver has taken it: the one mounted now, since the
	// old one never answered. (A failed call the old session's end answered as a success, as
	// go-capnp did unpatched, confirms x without any receiver having it.)
	waitUntil(t, "x's cursor passes its event", func() bool { return e.describe(t, s, "x").ConfirmedOffset >= 4 })
	require.Equal(t, []string{"y", "x"}, fresh.types(), "x confirmed without reaching the receiver mounted now")
	require.Equal(t, "active", e.describe(t, s, "x").Status)
}

// A provider that vanished without its connection ending (no reset: the library does not see
// it), re-mounted from a new session while the server calls the old receiver: the old call runs
// out its delivery timeout after the new mount's presence signal was taken. The timeout is the
// old receiver's, no verdict on the events nor on the receiver mounted now: the batch goes to the
// new mount at once, with no attempt burnt (the clock moves only by the delivery timeout, so a
// backoff would never end).
func TestSubscription_ReceiverReplacedWhileCalledTimesOutRedeliversAtOnce(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/silent")
	xStarted := make(chan struct{}, 1)
	disconnectOld := mountReceive(t, e.ts.addr, e.ts.creds.ProjectToken, "inbox", func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
		if b.Subscription == "y" {
			return 0, itx.Errorf(itx.EUnavailable, "not now") // an outage: y waits out a backoff
		}
		select {
		case xStarted <- struct{}{}:
		default:
		}
		<-ctx.Done() // x: never answered (the server gives up on it)
		return 0, ctx.Err()
	})
	defer disconnectOld()
	e.configure(t, s, client.SubscriptionConfig{Name: "y", FilterTypes: []string{"y"}, Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}})
	mustAppend(t, s, ev("y", `{}`))
	waitUntil(t, "y backs off", func() bool { return e.describe(t, s, "y").NextAttemptAt != 0 })
	e.configure(t, s, client.SubscriptionConfig{Name: "x", FilterTypes: []string{"x"}, Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}})
	mustAppend(t, s, ev("x", `{}`))
	select {
	case <-xStarted:
	case <-e.ctx.Done():
		t.Fatal("x's batch never reached the first receiver")
	}

	type delivery struct {
		types   []string
		attempt int
	}
	got := make(chan delivery, 10)
	defer mountReceive(t, e.ts.addr, e.ts.creds.ProjectToken, "inbox", func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
		d := delivery{attempt: b.Attempt}
		for _, ev := range b.Events {
			d.types = append(d.types, ev.Type)
		}
		got <- d
		return 0, nil
	})()
	// y's backoff is cut by the mount (the clock has not moved): the stream took the signal, while
	// x's call to the old receiver is still under way.
	e.waitProcessed(t, s, "y", 4)
	require.Equal(t, delivery{types: []string{"y"}, attempt: 2}, <-got)
	e.clock.Advance(itx.DeliveryTimeout) // x's call to the old receiver times out
	select {
	case d := <-got:
		require.Equal(t, delivery{types: []string{"x"}, attempt: 1}, d, "redelivered as the first attempt")
	case <-time.After(20 * time.Second): // within e.ctx, so that describe still answers
		t.Fatalf("x never reached the receiver mounted now: %+v", e.describe(t, s, "x").CursorState)
	}
	require.Equal(t, "active", e.describe(t, s, "x").Status)
}

// A receiver replaced under its name while the server calls it, whose call then fails with its
// session alive (a provider that hands over to its new session and refuses what is in flight
// on the old one): the refusal is the old receiver's, no verdict on the events. The batch goes
// to the new mount at once, with no attempt burnt (the virtual clock does not move, so a
// backoff would never end).
func TestSubscription_ReceiverReplacedThenCallFailsRedeliversAtOnce(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/handover")
	called, refuse := make(chan struct{}, 1), make(chan struct{})
	disconnectOld := mountReceive(t, e.ts.addr, e.ts.creds.ProjectToken, "inbox", func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
		select {
		case called <- struct{}{}:
		default:
		}
		<-refuse
		return 0, itx.Errorf(itx.EUnavailable, "handing over to the new session")
	})
	defer disconnectOld()
	e.configure(t, s, client.SubscriptionConfig{Name: "x", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}})
	mustAppend(t, s, ev("x", `{}`))
	select {
	case <-called:
	case <-e.ctx.Done():
		t.Fatal("x's batch never reached the first receiver")
	}

	type delivery struct {
		types   []string
		attempt int
	}
	got := make(chan delivery, 10)
	defer mountReceive(t, e.ts.addr, e.ts.creds.ProjectToken, "inbox", func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
		d := delivery{attempt: b.Attempt}
		for _, ev := range b.Events {
			d.types = append(d.types, ev.Type)
		}
		got <- d
		return 0, nil
	})()
	close(refuse) // the old receiver refuses x's batch, after the new one is mounted
	select {
	case d := <-got:
		require.Equal(t, delivery{types: []string{"x"}, attempt: 1}, d, "redelivered as the first attempt")
	case <-time.After(20 * time.Second): // within e.ctx, so that describe still answers
		t.Fatalf("x never reached the receiver mounted now: %+v", e.describe(t, s, "x").CursorState)
	}
	d := e.describe(t, s, "x")
	require.Equal(t, "active", d.Status)
}

// waitForNever sends a waitForEvent for a type never appended (a minute's timeout) and returns
// where its answer lands: a barrier under way, for a test to end some other way.
func waitForNever(t *testing.T, ctx context.Context, s schema.Stream) <-chan error {
	wf, release := s.WaitForEvent(ctx, func(p schema.Stream_waitForEvent_Params) error {
		p.SetTimeoutMs(uint32(time.Minute.Milliseconds()))
		pr, err := p.NewPredicate()
		if err != nil {
			return err
		}
		return wire.SetPredicate(pr, itx.Predicate{Types: []string{"never"}})
	})
	t.Cleanup(release)
	waited := make(chan error, 1)
	go func() {
		_, err := wf.Struct()
		waited <- err
	}()
	return waited
}

// A forced delete of a project whose stream is in use (an open connection, a live view, a
// barrier waiting) deletes it at the first try: the connection is closed as streamRemoved (its
// client keeps its RPC connection through another login, so it hears why), the barrier ends
// notFound, and the stream unloads. (It failed "in use; retry the delete", having already ended
// the project's sessions, and the connection heard accessEnded at best.)
func TestAdmin_DeleteProjectEndsWhatItsStreamsServe(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	a := client.Admin(ctx, ts.deployment(t))
	defer a.Release()
	info, tok, _, err := client.CreateProject(ctx, a, "team-a")
	require.NoError(t, err)
	conn := dial(t, ts.addr)
	keep := conn.Login(ctx, ts.creds.ProjectToken) // keeps the RPC connection
	require.NoError(t, capnp.Client(keep).Resolve(ctx))
	p := conn.Login(ctx, tok)
	s := client.Stream(ctx, p, "/orders")
	mustAppend(t, s, ev("a", `{}`))
	sink := newTestSink()
	_, err = openConn(t, s, connOpts{noState: true}, sink)
	require.NoError(t, err)
	waitUntil(t, "caught up", func() bool { return len(sink.offsets()) == 1 })
	// Sent before the live view on the same capability, so it is under way when the view is.
	waited := waitForNever(t, ctx, s)
	view := &liveView{}
	subscribeLive(t, s, view)
	waitUntil(t, "live", func() bool { rev, _ := view.state(); return rev > 0 })
	require.NoError(t, client.DeleteProject(ctx, a, info.ID, true))
	waitUntil(t, "told", func() bool { return sink.closeReason() != nil })
	require.Equal(t, schema.CloseReason_streamRemoved, *sink.closeReason(), sink.closeMs)
	select {
	case err := <-waited:
		requireCode(t, err, itx.ENotFound)
	case <-ctx.Done():
		t.Fatal("waitForEvent still waits")
	}
	_, err = client.DescribeProject(ctx, p)
	requireCode(t, err, itx.EUnauthenticated) // the project's session ended after its streams
}

// Closing the server (itxd's SIGTERM: Server.Close, then the RPC connections) tells what its
// streams serve: a connection hears serverShuttingDown, barriers waiting fail unavailable at
// once instead of running out their timeout. A connection opened through a pipelined chain on
// a stream with no append yet is served like any other.
func TestServer_CloseEndsWhatStreamsServe(t *testing.T) {
	dir := t.TempDir()
	srv, err := server.Open(context.Background(), server.Config{DataDir: dir})
	require.NoError(t, err)
	creds, err := server.ReadCredentials(dir)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l := capability.NewListener(srv)
	go l.Serve(ln)
	ctx := ctxT(t)
	p := dial(t, ln.Addr().String()).Login(ctx, creds.ProjectToken)
	s := client.Stream(ctx, p, "/a")
	defer s.Release()
	mustAppend(t, s, ev("a", `{}`))
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "app", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}})
	require.NoError(t, err)
	// Both barriers are sent before the calls below, which reach itxd after them.
	wf, releaseWF := s.WaitForEvent(ctx, func(p schema.Stream_waitForEvent_Params) error {
		p.SetTimeoutMs(uint32(time.Minute.Milliseconds()))
		pr, err := p.NewPredicate()
		if err != nil {
			return err
		}
		return wire.SetPredicate(pr, itx.Predicate{Types: []string{"never"}})
	})
	defer releaseWF()
	sub := client.Subscription(ctx, s, "app")
	defer sub.Release()
	wp, releaseWP := sub.WaitUntilProcessed(ctx, func(p schema.Subscription_waitUntilProcessed_Params) error {
		p.SetOffset(100)
		p.SetTimeoutMs(uint32(time.Minute.Milliseconds()))
		return nil
	})
	defer releaseWP()
	barriers := make(chan error, 2)
	go func() { _, err := wf.Struct(); barriers <- err }()
	go func() { _, err := wp.Struct(); barriers <- err }()
	fresh := client.Stream(ctx, p, "/fresh")
	defer fresh.Release()
	sink := newTestSink()
	_, err = openConn(t, fresh, connOpts{noState: true}, sink)
	require.NoError(t, err)
	mustAppend(t, fresh, ev("first", `{}`))
	waitUntil(t, "delivered", func() bool { return len(sink.offsets()) == 1 })

	ln.Close()
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, srv.Close(cctx))
	l.CloseConnections(cctx)
	for range 2 {
		requireCode(t, <-barriers, itx.EUnavailable)
	}
	r := sink.closeReason()
	require.NotNil(t, r, "the sink was told before the connections closed")
	require.Equal(t, schema.CloseReason_serverShuttingDown, *r)
}

// The Go client's pipelined helpers release the answers they ask for, so a capability the caller
// releases is released by itxd too: a client that logs in, opens admin or narrows a stream over
// and over, releasing each, stays far below --rpc-max-capabilities. (Conn.Login, Admin,
// ReadOnly and AppendOnly dropped their answer's release, so each call kept one capability
// exported for the life of the connection, and the 31st aborted it here.)
func TestClient_PipelinedHelpersReleaseTheirCapabilities(t *testing.T) {
	dir := t.TempDir()
	srv, err := server.Open(context.Background(), server.Config{DataDir: dir})
	require.NoError(t, err)
	creds, err := server.ReadCredentials(dir)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l := capability.NewListenerWithLimits(srv, flowconn.Limits{Capabilities: 30})
	go l.Serve(ln)
	t.Cleanup(func() {
		ln.Close()
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Close(cctx)
		l.CloseConnections(cctx)
	})
	ctx := ctxT(t)
	conn := dial(t, ln.Addr().String())
	s := client.Stream(ctx, conn.Login(ctx, creds.ProjectToken), "/narrowed")
	defer s.Release()
	mustAppend(t, s, ev("a", `{}`))
	for i := range 100 {
		p := conn.Login(ctx, creds.ProjectToken) // the same token: the session is shared
		_, err := client.DescribeProject(ctx, p)
		require.NoError(t, err, "round %d: %v", i, conn.Err())
		a := client.Admin(ctx, p)
		_, err = client.ListTokens(ctx, a, creds.ProjectID)
		require.NoError(t, err, "round %d: %v", i, conn.Err())
		a.Release()
		p.Release()

		ro := client.ReadOnly(ctx, s)
		_, err = client.GetEvents(ctx, ro, itx.Query{})
		require.NoError(t, err, "round %d: %v", i, conn.Err())
		ro.Release()
		ao := client.AppendOnly(ctx, s)
		_, err = client.GetEvents(ctx, ao, itx.Query{})
		requireCode(t, err, itx.EPermissionDenied)
		ao.Release()
	}
	require.NoError(t, conn.Err())
}

// unansweringHost is a ProcessorHost that never answers a wake while its connection lives.
type unansweringHost struct{ woken chan struct{} }

func (h *unansweringHost) Wake(ctx context.Context, call schema.ProcessorHost_wake) error {
	call.Go()
	select {
	case h.woken <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return ctx.Err()
}

func (h *unansweringHost) GetRuntimeState(ctx context.Context, call schema.ProcessorHost_getRuntimeState) error {
	return nil
}

func (h *unansweringHost) Stop(context.Context, schema.ProcessorHost_stop) error { return nil }

// silentStateHost is a ProcessorHost that answers neither a wake nor getRuntimeState.
type silentStateHost struct {
	unansweringHost
	asked chan struct{}
}

func (h *silentStateHost) GetRuntimeState(ctx context.Context, call schema.ProcessorHost_getRuntimeState) error {
	call.Go()
	select {
	case h.asked <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return ctx.Err()
}

// A remote processor's runtime state is asked of its host within the delivery timeout: a host
// that never answers fails the call deadlineExceeded instead of holding it (and the stream
// loaded) for as long as the caller waits.
func TestRemote_RuntimeStateOfASilentHostIsBounded(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/remote/silent")
	configureRemote(t, s, "forwarder")
	spy := &silentStateHost{unansweringHost: unansweringHost{woken: make(chan struct{}, 1)}, asked: make(chan struct{}, 1)}
	h, err := mountHostServing(e.ctx, e.p, "spy", spy, []itx.ProcessorInfo{{Name: "forwarder", ReducerVersion: "1", ConsumedTypes: []string{"inbox/message"}}})
	require.NoError(t, err)
	defer h.Release()
	sub := client.Subscription(e.ctx, s, "forwarder")
	defer sub.Release()
	pf, prel := sub.Processor(e.ctx, nil)
	defer prel()
	proc := pf.Processor()
	timers := e.clock.Pending()
	got := make(chan error, 1)
	go func() { _, err := client.RuntimeState(e.ctx, proc); got <- err }()
	<-spy.asked
	waitUntil(t, "a watchdog armed", func() bool { return e.clock.Pending() > timers })
	e.clock.Advance(itx.DeliveryTimeout)
	select {
	case err := <-got:
		requireCode(t, err, itx.EDeadlineExceeded)
	case <-time.After(10 * time.Second):
		t.Fatal("getRuntimeState still waits for the silent host")
	}
}

// describeChain sends a whole chain to a subscription's describe, awaiting only the end.
func describeChain(ctx context.Context, conn *client.Conn, token, path, name string) error {
	p := conn.Login(ctx, token)
	defer p.Release()
	sf, r1 := p.Streams(ctx, nil)
	defer r1()
	gf, r2 := sf.Streams().Get(ctx, func(a schema.Streams_get_Params) error { return a.SetPath(path) })
	defer r2()
	subsf, r3 := gf.Stream().Subscriptions(ctx, nil)
	defer r3()
	subf, r4 := subsf.Subscriptions().Get(ctx, func(a schema.Subscriptions_get_Params) error { return a.SetName(name) })
	defer r4()
	df, r5 := subf.Subscription().Describe(ctx, nil)
	defer r5()
	_, err := df.Struct()
	return err
}

// A long chain sent in one go (login -> streams -> get(path) -> subscriptions -> get(name) ->
// describe) answers a failure anywhere along it with that step's typed error at its end, and
// creates nothing: a bad token, a bad path, a path outside the token's scope, a stream with no
// append yet, an unknown subscription.
func TestPipelining_LongChainErrorsArriveTyped(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	scoped, _ := ts.token(t, itx.Scope{Prefix: "/a", Rights: []itx.Right{itx.RightRead}})
	conn := dial(t, ts.addr)
	before := itxtest.StreamDatabases(t, ts.dir) // the audit stream of the token's creation
	requireCode(t, describeChain(ctx, conn, "itx_wrong", "/a", "x"), itx.EUnauthenticated)
	requireCode(t, describeChain(ctx, conn, ts.creds.ProjectToken, "//bad", "x"), itx.EInvalid)
	requireCode(t, describeChain(ctx, conn, scoped, "/b", "x"), itx.EPermissionDenied)
	requireCode(t, describeChain(ctx, conn, scoped, "/a", "x"), itx.ENotFound)
	requireCode(t, describeChain(ctx, conn, ts.creds.ProjectToken, "/not-yet", "x"), itx.ENotFound)
	require.Equal(t, before, itxtest.StreamDatabases(t, ts.dir), "no stream was created")
	mustAppend(t, stream(t, ts.project(t), "/a"), ev("a", `{}`))
	requireCode(t, describeChain(ctx, conn, scoped, "/a", "x"), itx.ENotFound)
}

// rawDial connects over TCP that the test can cut without the RPC layer saying goodbye.
func rawDial(t *testing.T, addr string) (schema.Gateway, net.Conn, *rpc.Conn) {
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	conn := rpc.NewConn(rpc.NewStreamTransport(nc), nil)
	t.Cleanup(func() { conn.Close() })
	return schema.Gateway(conn.Bootstrap(context.Background())), nc, conn
}

// A client whose TCP connection is cut (no Abort, no Finish) releases everything it held on a
// stream: its connection, live view, barriers and mounted receiver end, the stream unloads at
// the idle timeout, and no goroutine is left.
func TestConnection_CutReleasesTheStream(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	ts := startServer(t, server.Config{Clock: clock, IdleTimeout: time.Minute})
	ctx := ctxT(t)
	setup := stream(t, ts.project(t), "/held")
	mustAppend(t, setup, ev("a", `{}`))
	subs := client.Subscriptions(ctx, setup)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "app", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}})
	require.NoError(t, err)
	subs.Release()
	setup.Release()
	waitUntil(t, "unloaded", func() bool {
		clock.Advance(2 * time.Minute)
		ts.srv.Sweep()
		return ts.srv.LoadedStreams() == 0
	})
	// The watcher's connection's goroutines predate the check: its login is answered (the Go
	// client's Login returns before that, pipelined) before the goroutines are counted.
	watcher := ts.project(t)
	_, err = client.DescribeProject(ctx, watcher)
	require.NoError(t, err)
	opts := []goleak.Option{goleak.IgnoreCurrent()}

	gw, nc, rc := rawDial(t, ts.addr)
	lf, _ := gw.Login(ctx, func(p schema.Gateway_login_Params) error { return p.SetToken(ts.creds.ProjectToken) })
	p := lf.Project()
	s := client.Stream(ctx, p, "/held")
	sink := newTestSink()
	_, err = openConn(t, s, connOpts{}, sink)
	require.NoError(t, err)
	subscribeLive(t, s, &liveView{})
	barriers := make(chan error, 2)
	go func() {
		_, err := client.WaitForEvent(context.Background(), s, itx.Predicate{Types: []string{"never"}}, 0, 9*time.Minute)
		barriers <- err
	}()
	go func() {
		_, err := client.WaitUntilProcessed(context.Background(), client.Subscription(ctx, s, "app"), 100, 9*time.Minute)
		barriers <- err
	}()
	delivering := make(chan struct{}, 1)
	_, err = client.MountReceiver(ctx, p, "inbox", client.ServeReceiver(func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
		select {
		case delivering <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return 0, ctx.Err()
	}))
	require.NoError(t, err)
	mustAppend(t, s, ev("b", `{}`))
	<-delivering
	waitUntil(t, "sink caught up", func() bool { return len(sink.offsets()) == 3 })

	nc.Close()
	<-rc.Done()
	for range 2 {
		require.Error(t, <-barriers)
	}
	// The delivery in flight fails with the receiver's session: the subscription parks (no
	// retry is scheduled, so no alarm loads the stream again once it has unloaded).
	waitParked(t, watcher, "/held", "app")
	waitUntil(t, "unloaded at the idle timeout", func() bool {
		clock.Advance(2 * time.Minute)
		ts.srv.Sweep()
		return ts.srv.LoadedStreams() == 0
	})
	require.Empty(t, ts.srv.Mounts("default"), "the receiver is unmounted")
	verifyNoLeak(t, opts...)
}

// The same for a processor host cut mid-wake with a processor's live view open: the host is
// dropped, the stream unloads, and no goroutine is left.
func TestRemote_CutHostReleasesTheStream(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	ts := startServer(t, server.Config{Clock: clock, IdleTimeout: time.Minute})
	ctx := ctxT(t)
	setup := stream(t, ts.project(t), "/remote/held")
	configureRemote(t, setup, "forwarder")
	mustAppend(t, setup, ev("x", `{}`))
	setup.Release()
	waitUntil(t, "unloaded", func() bool {
		clock.Advance(2 * time.Minute)
		ts.srv.Sweep()
		return ts.srv.LoadedStreams() == 0
	})
	// The watcher's connection's goroutines predate the check: its login is answered (the Go
	// client's Login returns before that, pipelined) before the goroutines are counted.
	watcher := ts.project(t)
	_, err := client.DescribeProject(ctx, watcher)
	require.NoError(t, err)
	opts := []goleak.Option{goleak.IgnoreCurrent()}

	gw, nc, rc := rawDial(t, ts.addr)
	lf, _ := gw.Login(ctx, func(p schema.Gateway_login_Params) error { return p.SetToken(ts.creds.ProjectToken) })
	p := lf.Project()
	spy := &unansweringHost{woken: make(chan struct{}, 1)}
	info := []itx.ProcessorInfo{{Name: "forwarder", ReducerVersion: "1", ConsumedTypes: []string{"inbox/message"}}}
	handle, err := mountHostServing(ctx, p, "spy", spy, info)
	require.NoError(t, err)
	defer handle.Release()
	s := client.Stream(ctx, p, "/remote/held")
	mustAppend(t, s, ev("inbox/message", `{}`))
	<-spy.woken
	sub := client.Subscription(ctx, s, "forwarder")
	pf, prel := sub.Processor(ctx, nil)
	defer prel()
	lv, lrel := pf.Processor().LiveState(ctx, func(a schema.Processor_liveState_Params) error {
		return a.SetSubscriber(schema.LiveSubscriber_ServerToClient(&liveView{}))
	})
	defer lrel()
	_, err = lv.Struct()
	require.NoError(t, err)

	nc.Close()
	<-rc.Done()
	// The wake in flight fails with the host's session: the subscription parks (no retry is
	// scheduled, so no alarm loads the stream again once it has unloaded).
	waitParked(t, watcher, "/remote/held", "forwarder")
	waitUntil(t, "unloadable", func() bool {
		clock.Advance(2 * time.Minute)
		ts.srv.Sweep()
		return ts.srv.LoadedStreams() == 0
	})
	waitUntil(t, "host gone", func() bool { return len(ts.srv.ProcessorHostMounts("default")) == 0 })
	verifyNoLeak(t, opts...)
}

// A barrier and a live view on a stream with no append yet wait for it: the append that creates
// the stream answers them.
func TestStream_BarriersBeforeTheStreamExists(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	s := stream(t, p, "/later")
	got := make(chan error, 1)
	go func() {
		e, err := client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"b"}}, 0, 20*time.Second)
		if err == nil && e.Offset != 2 {
			err = fmt.Errorf("offset %d", e.Offset)
		}
		got <- err
	}()
	view := &liveView{}
	subscribeLive(t, s, view)
	waitUntil(t, "empty snapshot", func() bool { rev, _ := view.state(); return rev > 0 })
	w := client.Stream(ctx, p, "/later")
	mustAppend(t, w, ev("a", `{}`), ev("b", `{}`))
	require.NoError(t, <-got)
	waitUntil(t, "head in live state", func() bool { _, doc := view.state(); h, _ := doc["head"].(float64); return h == 2 })
}

// throwingSink is an EventSink whose deliver fails with err; the rest is testSink's.
type throwingSink struct {
	*testSink
	err error
}

func (k throwingSink) Deliver(ctx context.Context, call schema.EventSink_deliver) error { return k.err }

// An EventSink that answers a batch with an exception is told deliveryFailed, whatever the
// exception says, even one that carries itx.capabilityOffline: its session is alive and hears
// the notice. (A thrown capabilityOffline was taken for a lost session: closed as
// connectionLost, and no notice sent.)
func TestConnection_SinkThatThrowsHearsDeliveryFailed(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/throwing")
	mustAppend(t, s, ev("a", `{}`))
	for _, thrown := range []error{
		itx.Errorf(itx.EInvalid, "not this one"),
		itx.Errorf(itx.ECapabilityOffline, "my own backend is offline"),
	} {
		sink := throwingSink{testSink: newTestSink(), err: thrown}
		_, err := openConn(t, s, connOpts{noState: true}, sink)
		require.NoError(t, err)
		waitUntil(t, "told", func() bool { return sink.closeReason() != nil })
		require.Equal(t, schema.CloseReason_deliveryFailed, *sink.closeReason(), "%v: %s", thrown, sink.closeMs)
	}
}

// offlineSayingHost is a ProcessorHost that answers every wake with itx.capabilityOffline.
type offlineSayingHost struct{ unansweringHost }

func (h *offlineSayingHost) Wake(ctx context.Context, call schema.ProcessorHost_wake) error {
	return itx.Errorf(itx.ECapabilityOffline, "my own backend is offline")
}

// A mounted processor host that answers a wake with itx.capabilityOffline is there: an outage
// (the ladder backs off), not an absence that parks the subscription until the next mount, as
// for a mounted Receiver saying so.
func TestRemote_MountedHostSayingOfflineIsAnOutage(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/remote/offline")
	configureRemote(t, s, "forwarder")
	h, err := mountHostServing(e.ctx, e.p, "says-offline", &offlineSayingHost{}, []itx.ProcessorInfo{{Name: "forwarder", ReducerVersion: "1", ConsumedTypes: []string{"inbox/message"}}})
	require.NoError(t, err)
	defer h.Release()
	mustAppend(t, s, ev("inbox/message", `{}`))
	// The wake may first find nothing mounted (the host mounts after the configure) and park;
	// the mount resumes it. Wait for the host's own answer.
	waitUntil(t, "the host's failure recorded", func() bool {
		return strings.Contains(e.describe(t, s, "forwarder").LastError, "my own backend is offline")
	})
	d := e.describe(t, s, "forwarder")
	require.Equal(t, "active", d.Status, d.LastError)
	require.Equal(t, 1, d.Attempt, "an outage backs off along the ladder")
}

// bulkyStateHost is a ProcessorHost that answers getRuntimeState with a JSON object of about
// 2 MiB: 100,000 tiny members, each a map entry once parsed.
type bulkyStateHost struct{ unansweringHost }

func (h *bulkyStateHost) GetRuntimeState(ctx context.Context, call schema.ProcessorHost_getRuntimeState) error {
	var b strings.Builder
	b.WriteString("{")
	for i := range 100_000 {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"k%d":{}`, i)
	}
	b.WriteString("}")
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return res.SetState(b.String())
}

// A remote processor's runtime state comes from its host, which itxd decodes to add its own
// fields: a host answering megabytes of small members made every getRuntimeState call build
// them all as Go maps (about ten times their size), 128 calls at once per client. A runtime state
// (cursors and observations; the reduced state is the snapshot's, from the committed record) is
// at most 64 KiB: a larger one fails the call with tooLarge.
func TestRemote_RuntimeStateOfABulkyHostIsBounded(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/remote/bulky")
	configureRemote(t, s, "forwarder")
	host := &bulkyStateHost{unansweringHost{woken: make(chan struct{}, 1)}}
	h, err := mountHostServing(e.ctx, e.p, "bulky", host, []itx.ProcessorInfo{{Name: "forwarder", ReducerVersion: "1", ConsumedTypes: []string{"inbox/message"}}})
	require.NoError(t, err)
	defer h.Release()
	sub := client.Subscription(e.ctx, s, "forwarder")
	defer sub.Release()
	pf, prel := sub.Processor(e.ctx, nil)
	defer prel()
	_, err = client.RuntimeState(e.ctx, pf.Processor())
	requireCode(t, err, itx.ETooLarge)
}

// waitParked waits until subscription name of the stream at path is parked, looking through p
// (a project whose connection predates any goroutine-leak check).
func waitParked(t *testing.T, p schema.Project, path, name string) {
	t.Helper()
	ctx := ctxT(t)
	waitUntil(t, name+" parked", func() bool {
		s := client.Stream(ctx, p, path)
		defer s.Release()
		sub := client.Subscription(ctx, s, name)
		defer sub.Release()
		d, err := client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		return d.Status == itx.StatusParked
	})
}
