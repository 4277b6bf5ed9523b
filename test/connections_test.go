package test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/wire"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// testSink is a client-side EventSink recording batches, state frames and the close.
type testSink struct {
	mu      sync.Mutex
	batches [][]int64
	events  []itx.Event
	frames  []string
	closed  *schema.CloseReason
	closeMs string
	changed chan struct{}
	block   chan struct{} // when set, deliver blocks until it is closed
	// when set, closed() never answers on its own: it waits for the server to give up on the
	// call, and then closes gaveUp
	holdClosed bool
	held       chan struct{} // closed when closed() arrives (with holdClosed)
	gaveUp     chan struct{}
}

func newTestSink() *testSink { return &testSink{changed: make(chan struct{}, 1)} }

func (k *testSink) signal() {
	select {
	case k.changed <- struct{}{}:
	default:
	}
}

func (k *testSink) Deliver(ctx context.Context, call schema.EventSink_deliver) error {
	if k.block != nil {
		<-k.block
	}
	b, err := call.Args().Batch()
	if err != nil {
		return err
	}
	list, err := b.Events()
	if err != nil {
		return err
	}
	events, err := wire.EventsFromSchema(list)
	if err != nil {
		return err
	}
	var offsets []int64
	for _, e := range events {
		offsets = append(offsets, e.Offset)
	}
	k.mu.Lock()
	k.batches = append(k.batches, offsets)
	k.events = append(k.events, events...)
	k.mu.Unlock()
	k.signal()
	return nil
}

func (k *testSink) Closed(ctx context.Context, call schema.EventSink_closed) error {
	if k.holdClosed {
		close(k.held)
		<-ctx.Done()
		close(k.gaveUp)
		return ctx.Err()
	}
	why := call.Args().Why()
	r, _ := call.Args().Reason()
	msg, _ := r.Message_()
	k.mu.Lock()
	k.closed, k.closeMs = &why, msg
	k.mu.Unlock()
	k.signal()
	return nil
}

func (k *testSink) State(ctx context.Context, call schema.EventSink_state) error {
	j, _ := call.Args().Json()
	k.mu.Lock()
	kind := "patch"
	if call.Args().Snapshot() {
		kind = "snapshot"
	}
	k.frames = append(k.frames, fmt.Sprintf("%s@%d %s", kind, call.Args().Revision(), j))
	k.mu.Unlock()
	k.signal()
	return nil
}

func (k *testSink) offsets() []int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := []int64{}
	for _, e := range k.events {
		out = append(out, e.Offset)
	}
	return out
}

func (k *testSink) frameCount() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.frames)
}

func (k *testSink) closeReason() *schema.CloseReason {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.closed
}

type connOpts struct {
	key              string
	after            uint64
	maxEvents        uint32
	maxBytes         uint32
	noState          bool
	includeEphemeral bool
	types            []string
}

func openConn(t testing.TB, s schema.Stream, o connOpts, sink schema.EventSink_Server) (schema.Connection, error) {
	t.Helper()
	fut, release := s.OpenConnection(context.Background(), func(p schema.Stream_openConnection_Params) error {
		opts, err := p.NewOptions()
		if err != nil {
			return err
		}
		opts.SetAfter(o.after)
		opts.SetMaxDeliveryEvents(o.maxEvents)
		opts.SetMaxDeliveryBytes(o.maxBytes)
		opts.SetNoState(o.noState)
		opts.SetIncludeEphemeral(o.includeEphemeral)
		if err := opts.SetKey(o.key); err != nil {
			return err
		}
		if err := wire.SetTextList(o.types, opts.NewTypes); err != nil {
			return err
		}
		if err := opts.SetOpenedBy("test"); err != nil {
			return err
		}
		return p.SetSink(schema.EventSink_ServerToClient(sink))
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return schema.Connection{}, err
	}
	c := res.Connection().AddRef()
	t.Cleanup(c.Release)
	return c, nil
}

func ping(t testing.TB, c schema.Connection) (head, delivered int64, err error) {
	// Bounded: a ping waits for the answers to the batches already sent, on the server's clock,
	// which a test's virtual clock may never move; a test stuck so fails instead of hanging its
	// package until the binary's timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fut, release := c.Ping(ctx, nil)
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return 0, 0, err
	}
	return int64(res.HeadOffset()), int64(res.DeliveredOffset()), nil
}

// A connection waiting at the tail gets each commit straight from the stream's writer
// (pushDirect), one batch per commit, in order, with ping's delivered offset following; a commit
// larger than one batch still goes through the connection's reader, split by the caps.
func TestConnection_TailBatchesGoStraightFromTheCommit(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/tail")
	mustAppend(t, s, ev("e", `{}`))
	sink := newTestSink()
	c, err := openConn(t, s, connOpts{maxEvents: 3, noState: true}, sink)
	require.NoError(t, err)
	waitUntil(t, "the first event", func() bool { return len(sink.offsets()) == 1 })
	direct := func() float64 { return testutil.ToFloat64(ts.srv.Metrics().ConnectionDirect) }
	before := direct()
	const n = 20
	for i := 2; i <= n+1; i++ {
		mustAppend(t, s, ev("e", fmt.Sprintf(`{"i":%d}`, i)))
		waitUntil(t, "delivered and settled", func() bool {
			_, delivered, err := ping(t, c)
			return err == nil && delivered == int64(i) && len(sink.offsets()) == i
		})
	}
	// The reader parks a moment after it settles, so an append may find it not yet parked
	// and wake it instead; most must have gone straight.
	require.GreaterOrEqual(t, direct()-before, float64(n/2), "batches sent by the writer at the tail")
	before = direct()
	mustAppend(t, s, ev("e", `{}`), ev("e", `{}`), ev("e", `{}`), ev("e", `{}`), ev("e", `{}`))
	waitUntil(t, "all", func() bool { return len(sink.offsets()) == n+6 })
	require.Equal(t, before, direct(), "five events under a cap of three are the reader's to split")
	var want [][]int64
	for o := int64(1); o <= n+1; o++ {
		want = append(want, []int64{o})
	}
	want = append(want, []int64{n + 2, n + 3, n + 4}, []int64{n + 5, n + 6})
	sink.mu.Lock()
	defer sink.mu.Unlock()
	require.Equal(t, want, sink.batches)
}

// Connections opened at random offsets while appends race each receive exactly the events after
// their offset, in order, once: catch-up and live tail meet with no gap and no duplicate.
func TestConnection_RandomOffsetsWhileAppendsRace(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	s := stream(t, p, "/race")
	mustAppend(t, s, ev("e", `{}`))
	rng := rand.New(rand.NewPCG(7, 11))

	done := make(chan struct{})
	var total int64
	go func() {
		defer close(done)
		ctx := context.Background()
		for i := 0; i < 60; i++ {
			n := 1 + i%7
			var evs []itx.EventInput
			for j := 0; j < n; j++ {
				evs = append(evs, ev("e", fmt.Sprintf(`{"i":%d,"j":%d}`, i, j)))
			}
			res, err := client.Append(ctx, s, evs, itx.AppendOptions{})
			if err != nil {
				t.Error(err)
				return
			}
			total = res.HeadOffset
		}
	}()
	type opened struct {
		after int64
		sink  *testSink
	}
	var conns []opened
	for i := 0; i < 8; i++ {
		head := mustDescribe(t, s).HeadOffset
		after := rng.Int64N(head + 1)
		sink := newTestSink()
		_, err := openConn(t, s, connOpts{after: uint64(after), maxEvents: uint32(1 + rng.IntN(20)), noState: true}, sink)
		require.NoError(t, err)
		conns = append(conns, opened{after, sink})
	}
	<-done
	for _, c := range conns {
		waitUntil(t, "caught up", func() bool {
			got := c.sink.offsets()
			return len(got) > 0 && got[len(got)-1] == total || c.after == total
		})
		var want []int64
		for o := c.after + 1; o <= total; o++ {
			want = append(want, o)
		}
		got := c.sink.offsets()
		if len(want) == 0 {
			require.Empty(t, got)
			continue
		}
		require.Equal(t, want, got, "opened after %d", c.after)
	}
}

func TestConnection_BatchCaps(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/caps")
	sink := newTestSink()
	c, err := openConn(t, s, connOpts{maxEvents: 2, noState: true}, sink)
	require.NoError(t, err)
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))
	waitUntil(t, "all five", func() bool { return len(sink.offsets()) == 5 })
	sink.mu.Lock()
	require.Equal(t, [][]int64{{1, 2}, {3, 4}, {5}}, sink.batches)
	sink.mu.Unlock()
	waitUntil(t, "pinged", func() bool {
		head, delivered, err := ping(t, c)
		return err == nil && head == 5 && delivered == 5
	})

	// A type filter: only matching events, and the position still passes the others.
	typed := newTestSink()
	_, err = openConn(t, s, connOpts{types: []string{"b"}, noState: true}, typed)
	require.NoError(t, err)
	mustAppend(t, s, ev("a", `{}`), ev("b", `{}`))
	waitUntil(t, "the b", func() bool { return len(typed.offsets()) == 1 })
	require.Equal(t, []int64{7}, typed.offsets())

	_, err = openConn(t, s, connOpts{after: 1000, noState: true}, newTestSink())
	requireCode(t, err, itx.EInvalid)
	_, err = openConn(t, s, connOpts{maxEvents: 1_000_000, noState: true}, newTestSink())
	requireCode(t, err, itx.EInvalid)
}

// A connection allowed the largest batches (maxDeliveryBytes 8 MiB) over the largest events
// (1 MiB) gets every event: a batch bigger than the bytes the server lets be in flight toward
// one sink waits until the sink has answered the others, then goes alone. (It used to panic
// itxd: go-capnp's flow limiter panics on a message larger than its whole allowance.) Live-state
// frames and subscriptions' pushes to mounted receivers go through the same limiter.
func TestConnection_BatchLargerThanTheFlowLimit(t *testing.T) {
	p := startItxd(t, t.TempDir())
	ctx := ctxT(t)
	conn := dial(t, p.addr)
	proj := conn.Login(ctx, p.creds.ProjectToken)
	defer proj.Release()
	s := stream(t, proj, "/big")
	big := strings.Repeat("x", itx.MaxEventBytes-200)
	for range 2 {
		events := make([]itx.EventInput, 7)
		for i := range events {
			events[i] = ev("big", fmt.Sprintf(`{"x":%q}`, big))
		}
		mustAppend(t, s, events...)
	}
	sink := newTestSink()
	_, err := openConn(t, s, connOpts{maxBytes: 8 << 20, noState: true}, sink)
	require.NoError(t, err)
	waitUntil(t, "all 14 events", func() bool { return len(sink.offsets()) == 14 })
	sink.mu.Lock()
	require.Greater(t, len(sink.batches[0]), 4, "the first batch is over 4 MiB")
	sink.mu.Unlock()
	res := mustAppend(t, s, ev("small", `{}`))
	require.Equal(t, []int64{15}, res.Offsets, "itxd is still up")
}

func TestConnection_ReplaceByKey(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/keys")
	mustAppend(t, s, ev("a", `{}`))
	first := newTestSink()
	c1, err := openConn(t, s, connOpts{key: "tab", noState: true}, first)
	require.NoError(t, err)
	waitUntil(t, "the first caught up", func() bool { return len(first.offsets()) == 1 })

	// A refused open leaves the open connection under that key alone.
	_, err = openConn(t, s, connOpts{key: "tab", after: 99, noState: true}, newTestSink())
	requireCode(t, err, itx.EInvalid)
	_, _, err = ping(t, c1)
	require.NoError(t, err, "still open")

	second := newTestSink()
	_, err = openConn(t, s, connOpts{key: "tab", noState: true}, second)
	require.NoError(t, err)
	waitUntil(t, "the first closed as replaced", func() bool {
		r := first.closeReason()
		return r != nil && *r == schema.CloseReason_replaced
	})
	_, _, err = ping(t, c1)
	requireCode(t, err, itx.EFailedPrecondition)
	mustAppend(t, s, ev("b", `{}`))
	waitUntil(t, "the second receives", func() bool { return len(second.offsets()) == 2 })
	require.Equal(t, []int64{1}, first.offsets(), "a closed connection receives nothing more")

	// Keys share the subscription name space.
	e.configure(t, s, client.SubscriptionConfig{Name: "hook", Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "x"}})
	_, err = openConn(t, s, connOpts{key: "hook", noState: true}, newTestSink())
	requireCode(t, err, itx.EFailedPrecondition)
}

func TestConnection_EphemeralEvents(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/eph")
	eph := ev("typing", `{}`)
	eph.Ephemeral = true
	mustAppend(t, s, ev("a", `{}`), eph) // 1, 2 (ephemeral, buffered)

	live := newTestSink()
	_, err := openConn(t, s, connOpts{noState: true}, live)
	require.NoError(t, err)
	withBuffered := newTestSink()
	_, err = openConn(t, s, connOpts{noState: true, includeEphemeral: true}, withBuffered)
	require.NoError(t, err)
	mustAppend(t, s, eph, ev("b", `{}`)) // 3 (ephemeral, live), 4
	waitUntil(t, "delivered", func() bool { return len(live.offsets()) == 3 && len(withBuffered.offsets()) == 4 })
	require.Equal(t, []int64{1, 3, 4}, live.offsets(), "buffered ephemeral events only when asked; live ones always")
	require.Equal(t, []int64{1, 2, 3, 4}, withBuffered.offsets())
}

// A sink that never answers is closed as a slow consumer after the delivery timeout; nothing
// queues for it meanwhile, and the appender is never held up.
func TestConnection_SlowConsumerClosed(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/slow")
	sink := newTestSink()
	sink.block = make(chan struct{})
	defer close(sink.block)
	c, err := openConn(t, s, connOpts{maxEvents: 10, noState: true}, sink)
	require.NoError(t, err)
	timers := e.clock.Pending()
	for i := 0; i < 200; i++ {
		mustAppend(t, s, ev("a", `{}`)) // never blocked by the stuck sink
	}
	waitUntil(t, "a batch awaits its answer", func() bool { return e.clock.Pending() > timers })
	e.clock.Advance(itx.DeliveryTimeout)
	waitUntil(t, "closed", func() bool {
		_, _, err := ping(t, c)
		return err != nil
	})
	_, _, err = ping(t, c)
	requireCode(t, err, itx.EFailedPrecondition)
	require.Contains(t, err.Error(), "slowConsumer")
	waitUntil(t, "released", func() bool { return testutil.ToFloat64(e.ts.srv.Metrics().OpenConnections) == 0 })
}

// A client that never answers closed() holds nothing on the server past the delivery timeout:
// replacing a connection over and over must not leave a call (and its goroutines) per old one.
func TestConnection_ClosedNoticeIsBounded(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/closing")
	mute := newTestSink()
	mute.holdClosed, mute.held, mute.gaveUp = true, make(chan struct{}), make(chan struct{})
	_, err := openConn(t, s, connOpts{key: "k", noState: true}, mute)
	require.NoError(t, err)
	_, err = openConn(t, s, connOpts{key: "k", noState: true}, newTestSink()) // replaces it
	require.NoError(t, err)
	// The server arms the notice's timer before it calls closed(): once the call has reached
	// the sink, advance the server's clock by the delivery timeout until the server gives up
	// (it never does if the call is unbounded). Advancing earlier could cancel the call before
	// it reached the sink, which then never hears it.
	select {
	case <-mute.held:
	case <-ctxT(t).Done():
		t.Fatal("closed() never reached the replaced connection's sink")
	}
	waitUntil(t, "the server gave up on the closed() call", func() bool {
		e.clock.Advance(itx.DeliveryTimeout)
		select {
		case <-mute.gaveUp:
			return true
		default:
			return false
		}
	})
}

// Losing the client's session releases everything the connection held.
func TestConnection_DisconnectReleasesEverything(t *testing.T) {
	ts := startServer(t, server.Config{})
	setup := stream(t, ts.project(t), "/leak")
	mustAppend(t, setup, ev("a", `{}`))
	// What the loaded stream itself holds (its read pool, its live-state engine) is started
	// first: only what the connections hold must go.
	warm := newTestSink()
	_, err := openConn(t, setup, connOpts{}, warm)
	require.NoError(t, err)
	waitUntil(t, "warm", func() bool {
		return len(warm.offsets()) == 1 && testutil.ToFloat64(ts.srv.Metrics().LiveSubscribers) == 1 && warm.frameCount() > 0
	})
	opts := []goleak.Option{goleak.IgnoreCurrent()}

	conn := dial(t, ts.addr)
	p := conn.Login(context.Background(), ts.creds.ProjectToken)
	s := client.Stream(context.Background(), p, "/leak")
	for i := 0; i < 5; i++ {
		sink := newTestSink()
		_, err := openConn(t, s, connOpts{}, sink)
		require.NoError(t, err)
		waitUntil(t, "caught up", func() bool { return len(sink.offsets()) == 1 })
	}
	require.Equal(t, 6.0, testutil.ToFloat64(ts.srv.Metrics().OpenConnections))
	s.Release()
	p.Release()
	conn.Close()
	waitUntil(t, "connections closed", func() bool { return testutil.ToFloat64(ts.srv.Metrics().OpenConnections) == 1 })
	waitUntil(t, "live subscribers gone", func() bool { return testutil.ToFloat64(ts.srv.Metrics().LiveSubscribers) == 1 })
	verifyNoLeak(t, opts...)
}

// liveView applies live-state frames the way a client does: snapshot, then patches in revision
// order; a gap would be a resubscribe.
type liveView struct {
	mu     sync.Mutex
	rev    uint64
	doc    []byte
	gaps   int
	closed schema.CloseReason // why the server ended the view
	ended  bool
}

func (l *liveView) Closed(ctx context.Context, call schema.LiveSubscriber_closed) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed, l.ended = call.Args().Why(), true
	return nil
}

// endedWith is why the server ended the view, and whether it did.
func (l *liveView) endedWith() (schema.CloseReason, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed, l.ended
}

func (l *liveView) Snapshot(ctx context.Context, call schema.LiveSubscriber_snapshot) error {
	st, _ := call.Args().State()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rev, l.doc = call.Args().Revision(), []byte(st)
	return nil
}

func (l *liveView) Patch(ctx context.Context, call schema.LiveSubscriber_patch) error {
	ops, _ := call.Args().Ops()
	l.mu.Lock()
	defer l.mu.Unlock()
	if call.Args().Revision() != l.rev+1 {
		l.gaps++
		return nil
	}
	patch, err := jsonpatch.DecodePatch([]byte(ops))
	if err != nil {
		return err
	}
	doc, err := patch.Apply(l.doc)
	if err != nil {
		return err
	}
	l.rev, l.doc = call.Args().Revision(), doc
	return nil
}

func (l *liveView) state() (uint64, map[string]any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var m map[string]any
	_ = json.Unmarshal(l.doc, &m)
	return l.rev, m
}

func subscribeLive(t *testing.T, s schema.Stream, l *liveView) schema.Handle {
	fut, release := s.LiveState(context.Background(), func(p schema.Stream_liveState_Params) error {
		return p.SetSubscriber(schema.LiveSubscriber_ServerToClient(l))
	})
	defer release()
	res, err := fut.Struct()
	require.NoError(t, err)
	h := res.Handle().AddRef()
	t.Cleanup(h.Release)
	return h
}

// A client applying the patches reproduces the server's snapshot at every revision.
func TestLiveState_PatchesReproduceTheSnapshot(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/live")
	mustAppend(t, s, ev("a", `{}`))
	follower := &liveView{}
	subscribeLive(t, s, follower)
	waitUntil(t, "snapshot", func() bool { rev, _ := follower.state(); return rev > 0 })

	h := newHook(t, nil)
	e.configure(t, s, client.SubscriptionConfig{Name: "hook", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	rf, releaseReaders := s.Readers(context.Background(), nil)
	defer releaseReaders()
	readers := rf.Readers()
	for i := 0; i < 5; i++ {
		mustAppend(t, s, ev("a", fmt.Sprintf(`{"i":%d}`, i)))
		fut, release := readers.Register(context.Background(), func(p schema.Readers_register_Params) error {
			p.SetCheckpoint(uint64(i + 1))
			return p.SetName("mirror")
		})
		_, err := fut.Struct()
		release()
		require.NoError(t, err)
		_, err = openConn(t, s, connOpts{key: fmt.Sprintf("c%d", i%2), noState: true}, newTestSink())
		require.NoError(t, err)
	}
	head := mustDescribe(t, s).HeadOffset
	e.waitProcessed(t, s, "hook", head)

	// A fresh subscriber's snapshot is the truth; the follower must reach the same document.
	fresh := &liveView{}
	subscribeLive(t, s, fresh)
	// The engine projects asynchronously: wait until the fresh snapshot shows the last changes,
	// then for the follower, which only ever applied patches, to be at that same document.
	waitUntil(t, "converged", func() bool {
		r1, d1 := follower.state()
		r2, d2 := fresh.state()
		readers, _ := d2["readers"].(map[string]any)
		mirror, _ := readers["mirror"].(map[string]any)
		subs, _ := d2["subscriptions"].(map[string]any)
		hook, _ := subs["hook"].(map[string]any)
		return mirror["checkpoint"] == float64(5) && hook["confirmed"] == float64(head) &&
			r1 > 1 && r1 == r2 && fmt.Sprint(d1) == fmt.Sprint(d2)
	})
	_, doc := follower.state()
	require.Equal(t, float64(head), doc["head"])
	sub := doc["subscriptions"].(map[string]any)["hook"].(map[string]any)
	require.Equal(t, "active", sub["status"])
	require.Equal(t, float64(head), sub["confirmed"])
	require.Equal(t, float64(5), doc["readers"].(map[string]any)["mirror"].(map[string]any)["checkpoint"])
	require.Len(t, doc["connections"].(map[string]any), 2, "replaced keys leave one row each")
	require.Zero(t, follower.gaps)
}

func TestReaders_RegisterMoveListRemove(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/readers")
	ctx := context.Background()
	rf, releaseReaders := s.Readers(ctx, nil)
	defer releaseReaders()
	r := rf.Readers()
	register := func(name string, checkpoint uint64) error {
		fut, release := r.Register(ctx, func(p schema.Readers_register_Params) error {
			p.SetCheckpoint(checkpoint)
			return p.SetName(name)
		})
		defer release()
		_, err := fut.Struct()
		return err
	}
	requireCode(t, register("early", 2), itx.EInvalid) // beyond the head, 0 before the first append (readers_unborn_test.go: at 0)
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))
	require.NoError(t, register("mirror", 1))
	require.NoError(t, register("mirror", 2))
	require.NoError(t, register("audit", 0))
	requireCode(t, register("beyond", 4), itx.EInvalid)
	requireCode(t, register(" ", 1), itx.EInvalid)

	fut, release := r.List(ctx, nil)
	res, err := fut.Struct()
	require.NoError(t, err)
	list, _ := res.Readers()
	require.Equal(t, 2, list.Len())
	a, m := list.At(0), list.At(1)
	an, _ := a.Name()
	mn, _ := m.Name()
	require.Equal(t, []any{"audit", uint64(0), uint64(3)}, []any{an, a.Checkpoint(), a.Lag()})
	require.Equal(t, []any{"mirror", uint64(2), uint64(1)}, []any{mn, m.Checkpoint(), m.Lag()})
	release()

	rm := func(name string) error {
		fut, release := r.Remove(ctx, func(p schema.Readers_remove_Params) error { return p.SetName(name) })
		defer release()
		_, err := fut.Struct()
		return err
	}
	require.NoError(t, rm("audit"))
	requireCode(t, rm("audit"), itx.ENotFound)

	// Readers stand beside subscriptions in the lag view.
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	rows, err := client.ListSubscriptions(ctx, subs)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, []any{"mirror", "reader", int64(2), int64(1)}, []any{rows[0].Name, rows[0].Kind, rows[0].ConfirmedOffset, rows[0].Lag})
	// Delivered is never behind confirmed: a reader's checkpoint stands in both, as a
	// subscription's cursor does when it is not offset-acking.
	require.Equal(t, int64(2), rows[0].DeliveredOffset)
}

// The number of connections and live subscribers one stream serves is bounded by flags.
func TestConnection_PerStreamBounds(t *testing.T) {
	ts := startServer(t, server.Config{MaxConnectionsPerStream: 2, MaxLiveSubscribersPerStream: 1})
	s := stream(t, ts.project(t), "/bounded")
	mustAppend(t, s, ev("a", `{}`))
	_, err := openConn(t, s, connOpts{key: "a"}, newTestSink())
	require.NoError(t, err)
	_, err = openConn(t, s, connOpts{key: "b"}, newTestSink())
	require.NoError(t, err)
	_, err = openConn(t, s, connOpts{key: "c"}, newTestSink())
	requireCode(t, err, itx.ELimitExceeded)
	_, err = openConn(t, s, connOpts{key: "b"}, newTestSink())
	require.NoError(t, err, "replacing a key does not count twice")

	subscribeLive(t, s, &liveView{})
	fut, release := s.LiveState(context.Background(), func(p schema.Stream_liveState_Params) error {
		return p.SetSubscriber(schema.LiveSubscriber_ServerToClient(&liveView{}))
	})
	defer release()
	_, err = fut.Struct()
	requireCode(t, err, itx.ELimitExceeded)
}

// One login holds at most --max-live-per-login live connections and live-state views, on any
// streams together: past it an open is refused with limitExceeded naming the flag, another
// login counts its own, and closing one makes room again.
func TestConnection_PerLoginBound(t *testing.T) {
	ts := startServer(t, server.Config{MaxLivePerSession: 3})
	p := ts.project(t)
	a, b := stream(t, p, "/a"), stream(t, p, "/b")
	mustAppend(t, a, ev("e", `{}`))
	mustAppend(t, b, ev("e", `{}`))
	first, err := openConn(t, a, connOpts{noState: true}, newTestSink())
	require.NoError(t, err)
	_, err = openConn(t, b, connOpts{noState: true}, newTestSink())
	require.NoError(t, err)
	subscribeLive(t, a, &liveView{})

	_, err = openConn(t, b, connOpts{noState: true}, newTestSink())
	requireCode(t, err, itx.ELimitExceeded)
	require.Contains(t, err.Error(), "--max-live-per-login")
	fut, release := b.LiveState(context.Background(), func(p schema.Stream_liveState_Params) error {
		return p.SetSubscriber(schema.LiveSubscriber_ServerToClient(&liveView{}))
	})
	_, err = fut.Struct()
	release()
	requireCode(t, err, itx.ELimitExceeded)

	other := stream(t, ts.project(t), "/b")
	_, err = openConn(t, other, connOpts{noState: true}, newTestSink())
	require.NoError(t, err, "another login counts its own")

	cf, release := first.Close(context.Background(), func(p schema.Connection_close_Params) error { return p.SetReason("done") })
	_, err = cf.Struct()
	release()
	require.NoError(t, err)
	waitUntil(t, "room again", func() bool {
		_, err := openConn(t, b, connOpts{noState: true}, newTestSink())
		return err == nil
	})
}

// Over all logins at most --max-live live connections and live-state views are open: each login
// (one per RPC connection) under its own bound, a client on many connections held logins times
// that. Past it an open is refused with limitExceeded naming the flag, whichever login asks, and
// closing one makes room again.
func TestConnection_GlobalLiveBound(t *testing.T) {
	ts := startServer(t, server.Config{MaxLive: 3})
	a := stream(t, ts.project(t), "/a")
	b := stream(t, ts.project(t), "/a")
	mustAppend(t, a, ev("e", `{}`))
	first, err := openConn(t, a, connOpts{noState: true}, newTestSink())
	require.NoError(t, err)
	_, err = openConn(t, a, connOpts{noState: true}, newTestSink())
	require.NoError(t, err)
	subscribeLive(t, b, &liveView{})

	_, err = openConn(t, b, connOpts{noState: true}, newTestSink())
	requireCode(t, err, itx.ELimitExceeded)
	require.Contains(t, err.Error(), "--max-live")
	fut, release := stream(t, ts.project(t), "/a").LiveState(context.Background(), func(p schema.Stream_liveState_Params) error {
		return p.SetSubscriber(schema.LiveSubscriber_ServerToClient(&liveView{}))
	})
	_, err = fut.Struct()
	release()
	requireCode(t, err, itx.ELimitExceeded)

	cf, release := first.Close(context.Background(), func(p schema.Connection_close_Params) error { return p.SetReason("done") })
	_, err = cf.Struct()
	release()
	require.NoError(t, err)
	waitUntil(t, "room again", func() bool {
		_, err := openConn(t, b, connOpts{noState: true}, newTestSink())
		return err == nil
	})
}

// At the per-login bound, reopening under a key the same login already holds open replaces that
// connection (the count does not grow: the new one takes over the old one's place), while a new
// key is still refused; the replaced connection's place is not given back twice.
func TestConnection_PerLoginBoundReplaceByKey(t *testing.T) {
	ts := startServer(t, server.Config{MaxLivePerSession: 2})
	p := ts.project(t)
	a := stream(t, p, "/a")
	mustAppend(t, a, ev("e", `{}`))
	oldSink := newTestSink()
	_, err := openConn(t, a, connOpts{key: "tab", noState: true}, oldSink)
	require.NoError(t, err)
	_, err = openConn(t, a, connOpts{key: "other", noState: true}, newTestSink())
	require.NoError(t, err)

	_, err = openConn(t, a, connOpts{key: "new", noState: true}, newTestSink())
	requireCode(t, err, itx.ELimitExceeded)

	var last schema.Connection
	for i := 0; i < 3; i++ {
		sink := newTestSink()
		last, err = openConn(t, a, connOpts{key: "tab", noState: true}, sink)
		require.NoError(t, err, "a replace at the bound does not grow the count")
		waitUntil(t, "the old one told replaced", func() bool {
			r := oldSink.closeReason()
			return r != nil && *r == schema.CloseReason_replaced
		})
		waitUntil(t, "the new one delivers", func() bool { return len(sink.offsets()) == 1 })
		oldSink = sink
	}
	// The replaced ones gave nothing back that the replacements hold: a new key is still refused
	// once every replaced connection's pusher has stopped (the gauge falls after its give-back).
	waitUntil(t, "the replaced pushers stopped", func() bool {
		return testutil.ToFloat64(ts.srv.Metrics().OpenConnections) == 2
	})
	_, err = openConn(t, a, connOpts{key: "new", noState: true}, newTestSink())
	requireCode(t, err, itx.ELimitExceeded)
	// And the last replacement gives its place back when it closes.
	fut, release := last.Close(context.Background(), func(p schema.Connection_close_Params) error { return p.SetReason("done") })
	_, err = fut.Struct()
	release()
	require.NoError(t, err)
	waitUntil(t, "room again", func() bool {
		_, err := openConn(t, a, connOpts{key: "new", noState: true}, newTestSink())
		return err == nil
	})
}

// A client that lets go of the Connection capability while its session lives ends the
// connection, and its sink, which it still serves, hears connectionLost saying why.
func TestConnection_ReleasedCapabilityTellsTheSink(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/released")
	mustAppend(t, s, ev("a", `{}`))
	sink := newTestSink()
	c, err := openConn(t, s, connOpts{noState: true}, sink)
	require.NoError(t, err)
	waitUntil(t, "caught up", func() bool { return len(sink.offsets()) == 1 })
	c.Release()
	waitUntil(t, "told", func() bool { return sink.closeReason() != nil })
	require.Equal(t, schema.CloseReason_connectionLost, *sink.closeReason())
	sink.mu.Lock()
	require.Contains(t, sink.closeMs, "reference to the connection is gone")
	sink.mu.Unlock()
	mustAppend(t, s, ev("a", `{}`))
	require.Equal(t, []int64{1}, sink.offsets(), "a closed connection receives nothing more")
}

// Closing by the client: the sink hears closedByClient with the reason given, and a closed
// connection answers ping with failedPrecondition.
func TestConnection_CloseByClient(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/closing")
	mustAppend(t, s, ev("a", `{}`))
	sink := newTestSink()
	c, err := openConn(t, s, connOpts{noState: true}, sink)
	require.NoError(t, err)
	waitUntil(t, "caught up", func() bool { return len(sink.offsets()) == 1 })
	fut, release := c.Close(context.Background(), func(p schema.Connection_close_Params) error { return p.SetReason("tab closed") })
	_, err = fut.Struct()
	release()
	require.NoError(t, err)
	waitUntil(t, "closed", func() bool { r := sink.closeReason(); return r != nil && *r == schema.CloseReason_closedByClient })
	sink.mu.Lock()
	require.Contains(t, sink.closeMs, "tab closed")
	sink.mu.Unlock()
	_, _, err = ping(t, c)
	requireCode(t, err, itx.EFailedPrecondition)
	mustAppend(t, s, ev("b", `{}`))
	require.Equal(t, []int64{1}, sink.offsets(), "nothing after the close")
}

// The live state lists at most MaxLiveConnectionRows connections (the first by key) and counts
// them all: every connection may receive the document, so it must not grow with their number.
func TestLiveState_ConnectionRowsBounded(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/crowd")
	n := server.MaxLiveConnectionRows + 44
	for i := range n {
		_, err := openConn(t, s, connOpts{key: fmt.Sprintf("c%04d", i), noState: true}, newTestSink())
		require.NoError(t, err)
	}
	view := &liveView{}
	subscribeLive(t, s, view)
	waitUntil(t, "every connection counted", func() bool {
		_, doc := view.state()
		open, _ := doc["connectionsOpen"].(float64)
		return int(open) == n
	})
	_, doc := view.state()
	rows, _ := doc["connections"].(map[string]any)
	require.Len(t, rows, server.MaxLiveConnectionRows)
	require.Contains(t, rows, "c0000")
	require.NotContains(t, rows, fmt.Sprintf("c%04d", n-1), "the first by key are listed")
}

// The listed rows follow opens and closes in any key order: the first MaxLiveConnectionRows keys
// of the connections open now, whatever order they were opened and closed in.
func TestLiveState_ConnectionRowsFollowOpensAndClosesInAnyOrder(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/shuffled")
	view := &liveView{}
	subscribeLive(t, s, view)
	n := server.MaxLiveConnectionRows + 60
	conns := map[string]schema.Connection{}
	for _, i := range rand.Perm(n) {
		key := fmt.Sprintf("c%04d", i)
		c, err := openConn(t, s, connOpts{key: key, noState: true}, newTestSink())
		require.NoError(t, err)
		conns[key] = c
	}
	// Close some listed ones and some past the listed rows, in no order.
	for _, i := range []int{n - 1, 3, 0, server.MaxLiveConnectionRows + 7, 100, server.MaxLiveConnectionRows - 1} {
		key := fmt.Sprintf("c%04d", i)
		fut, release := conns[key].Close(context.Background(), func(p schema.Connection_close_Params) error { return p.SetReason("done") })
		_, err := fut.Struct()
		release()
		require.NoError(t, err)
		delete(conns, key)
	}
	keys := slices.Sorted(maps.Keys(conns))
	want := keys[:server.MaxLiveConnectionRows]
	waitUntil(t, "the rows of the connections open now", func() bool {
		_, doc := view.state()
		open, _ := doc["connectionsOpen"].(float64)
		rows, _ := doc["connections"].(map[string]any)
		if int(open) != len(keys) || len(rows) != len(want) {
			return false
		}
		for _, k := range want {
			if _, ok := rows[k]; !ok {
				return false
			}
		}
		return true
	})
}

// waitUntilProcessed waits on a registered reader by its declared checkpoint (readers stand
// beside the subscriptions in lag views), and describing one through subscriptions.get says it
// is a reader, not that nothing of that name exists.
func TestReaders_WaitUntilProcessedFollowsAReader(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/mirrored")
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))
	fut, release := s.Readers(ctx, nil)
	defer release()
	readers := fut.Readers()
	require.NoError(t, client.RegisterReader(ctx, readers, "mirror", 1))
	sub := client.Subscription(ctx, s, "mirror")
	defer sub.Release()

	got, err := client.WaitUntilProcessed(ctx, sub, 1, 0)
	require.NoError(t, err)
	require.Equal(t, int64(1), got)
	type answer struct {
		at  int64
		err error
	}
	done := make(chan answer, 1)
	go func() {
		at, err := client.WaitUntilProcessed(ctx, sub, 3, 30*time.Second)
		done <- answer{at, err}
	}()
	require.NoError(t, client.RegisterReader(ctx, readers, "mirror", 2))
	select {
	case a := <-done:
		t.Fatalf("resolved at checkpoint 2 for offset 3: %+v", a)
	default:
	}
	require.NoError(t, client.RegisterReader(ctx, readers, "mirror", 3))
	a := <-done
	require.NoError(t, a.err)
	require.Equal(t, int64(3), a.at)

	_, err = client.DescribeSubscription(ctx, sub)
	requireCode(t, err, itx.ENotFound)
	require.Contains(t, err.Error(), "registered reader")
	_, err = client.WaitUntilProcessed(ctx, client.Subscription(ctx, s, "nobody"), 1, 0)
	requireCode(t, err, itx.ENotFound)
}

// A live view's first snapshot shows at least everything acknowledged before it was asked for:
// a reader registered (its answer received) and then a view subscribed sees the reader, even
// while the engine, already running for another view, is still recomputing a large document.
func TestLiveState_FirstSnapshotShowsWhatWasAcknowledged(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/acknowledged")
	events := make([]itx.EventInput, 100)
	for i := range events {
		events[i] = ev("a", `{}`)
	}
	mustAppend(t, s, events...)
	subscribeLive(t, s, &liveView{}) // the engine runs from here on
	rf, release := s.Readers(ctx, nil)
	defer release()
	readers := rf.Readers()
	// A large document, so that each recomputation takes a while.
	var rels []capnp.ReleaseFunc
	var futs []schema.Readers_register_Results_Future
	for i := range 400 {
		fut, rel := readers.Register(ctx, func(p schema.Readers_register_Params) error {
			p.SetCheckpoint(uint64(i % 100))
			return p.SetName(fmt.Sprintf("bulk-%04d", i))
		})
		futs, rels = append(futs, fut), append(rels, rel)
	}
	for i, f := range futs {
		_, err := f.Struct()
		require.NoError(t, err)
		rels[i]()
	}
	for i := 1; i <= 20; i++ {
		require.NoError(t, client.RegisterReader(ctx, readers, "mirror", int64(i)))
		fresh := &liveView{}
		h := subscribeLive(t, s, fresh)
		var doc map[string]any
		waitUntil(t, "the first snapshot", func() bool {
			var rev uint64
			rev, doc = fresh.state()
			return rev > 0
		})
		mirror, _ := doc["readers"].(map[string]any)["mirror"].(map[string]any)
		require.Equal(t, float64(i), mirror["checkpoint"], "round %d: the first snapshot predates the registration it followed", i)
		h.Release()
	}
}
