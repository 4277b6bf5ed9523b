package test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// A second independent pass over issue 9 (connections, flow control, readers, live state), from
// seed 000's wording: "Offset supplied by the caller ... maxDeliveryEvents / maxDeliveryBytes /
// state: false ... openedBy, the ping side-channel, and close reasons"; readers "a name plus a
// declared checkpoint ... so lag is visible"; live state "snapshot + structural patches,
// revision-numbered, resubscribe on gap".

// registerRaw registers a reader with a checkpoint as the wire carries it (a UInt64).
func registerRaw(ctx context.Context, r schema.Readers, name string, checkpoint uint64) error {
	fut, release := r.Register(ctx, func(p schema.Readers_register_Params) error {
		p.SetCheckpoint(checkpoint)
		return p.SetName(name)
	})
	defer release()
	_, err := fut.Struct()
	return err
}

func connKey(t *testing.T, c schema.Connection) string {
	t.Helper()
	f, release := c.Key(context.Background(), nil)
	defer release()
	res, err := f.Struct()
	require.NoError(t, err)
	k, err := res.Key()
	require.NoError(t, err)
	return k
}

// A checkpoint beyond the head is refused whatever its size: one past int64 (which read as a
// signed offset would be negative, so "at most the head") must not register, and what was
// registered stays as it was.
func TestAudit2_ReaderCheckpointBeyondInt64(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/audit2/reader-huge")
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`))
	rf, release := s.Readers(ctx, nil)
	defer release()
	r := rf.Readers()
	require.NoError(t, registerRaw(ctx, r, "mirror", 1))
	for _, cp := range []uint64{3, math.MaxInt64, math.MaxInt64 + 1, math.MaxUint64 - 1, math.MaxUint64} {
		requireCode(t, registerRaw(ctx, r, "mirror", cp), itx.EInvalid)
		requireCode(t, registerRaw(ctx, r, "fresh", cp), itx.EInvalid)
	}
	list, err := client.ListReaders(ctx, r)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, []any{"mirror", int64(1), int64(1)}, []any{list[0].Name, list[0].Checkpoint, list[0].Lag})
	require.Equal(t, int64(1), mustDescribe(t, s).MaxLag)
}

// Names are trimmed (seed 000: "Caller-chosen, per-stream unique, 1–500 chars, trimmed") and one
// name space holds subscriptions, connection keys and readers: a name that differs from a
// subscription's only by surrounding spaces is that subscription's name.
func TestAudit2_NamesAreTrimmedAcrossTheNameSpace(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/audit2/trim")
	mustAppend(t, s, ev("a", `{}`))
	e.configure(t, s, client.SubscriptionConfig{Name: "hook", Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "x"}})
	rf, release := s.Readers(e.ctx, nil)
	defer release()
	r := rf.Readers()

	_, err := openConn(t, s, connOpts{key: " hook ", noState: true}, newTestSink())
	requireCode(t, err, itx.EFailedPrecondition)
	requireCode(t, client.RegisterReader(e.ctx, r, " hook", 1), itx.EFailedPrecondition)

	// A reader registered with spaces is the trimmed name: moving it by the bare name moves it.
	require.NoError(t, client.RegisterReader(e.ctx, r, " mirror ", 1))
	require.NoError(t, client.RegisterReader(e.ctx, r, "mirror", 0))
	list, err := client.ListReaders(e.ctx, r)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "mirror", list[0].Name)
	require.Equal(t, int64(0), list[0].Checkpoint)

	// A connection key with spaces is the trimmed key: reopening by the bare key replaces it.
	first := newTestSink()
	c, err := openConn(t, s, connOpts{key: " tab ", noState: true}, first)
	require.NoError(t, err)
	require.Equal(t, "tab", connKey(t, c))
	_, err = openConn(t, s, connOpts{key: "tab", noState: true}, newTestSink())
	require.NoError(t, err)
	waitUntil(t, "replaced", func() bool { r := first.closeReason(); return r != nil && *r == schema.CloseReason_replaced })
	// and the subscription side: a configure under a reader's name with spaces is refused.
	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	_, _, err = client.ConfigureSubscription(e.ctx, subs, client.SubscriptionConfig{Name: " mirror ",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "x"}})
	requireCode(t, err, itx.EFailedPrecondition)
	_, _, err = client.ConfigureSubscription(e.ctx, subs, client.SubscriptionConfig{Name: "tab ",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "x"}})
	requireCode(t, err, itx.EFailedPrecondition)
}

// Connections opened without a key get one each: they never replace each other, key() names it,
// it is not in the reserved subscription: space, and the live state lists each by it with its
// openedBy and delivered offset; a close takes its row away.
func TestAudit2_KeylessConnectionsAreDistinct(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/audit2/keyless")
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`))
	view, _ := watchLive(t, s)
	a, b := newTestSink(), newTestSink()
	ca, err := openConn(t, s, connOpts{noState: true}, a)
	require.NoError(t, err)
	cb, err := openConn(t, s, connOpts{after: 1, noState: true}, b)
	require.NoError(t, err)
	ka, kb := connKey(t, ca), connKey(t, cb)
	require.NotEmpty(t, ka)
	require.NotEqual(t, ka, kb)
	for _, k := range []string{ka, kb} {
		require.False(t, strings.HasPrefix(k, "subscription:"), k)
	}
	waitUntil(t, "both listed with what they delivered", func() bool {
		_, doc := view.state()
		rows, _ := doc["connections"].(map[string]any)
		ra, _ := rows[ka].(map[string]any)
		rb, _ := rows[kb].(map[string]any)
		return doc["connectionsOpen"] == float64(2) && ra["openedBy"] == "test" && rb["openedBy"] == "test" &&
			ra["delivered"] == float64(2) && rb["delivered"] == float64(2)
	})
	require.Nil(t, a.closeReason())
	require.Nil(t, b.closeReason())
	require.Equal(t, []int64{1, 2}, a.offsets())
	require.Equal(t, []int64{2}, b.offsets())

	fut, release := ca.Close(context.Background(), func(p schema.Connection_close_Params) error { return p.SetReason("bye") })
	_, err = fut.Struct()
	release()
	require.NoError(t, err)
	waitUntil(t, "the closed one's row is gone", func() bool {
		_, doc := view.state()
		rows, _ := doc["connections"].(map[string]any)
		return doc["connectionsOpen"] == float64(1) && rows[ka] == nil && rows[kb] != nil
	})
}

// The defaults: maxDeliveryEvents 0 means 1,000 a batch, on catch-up.
func TestAudit2_DefaultCapIsAThousand(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/audit2/default-cap")
	for range 3 {
		evs := make([]itx.EventInput, 500)
		for i := range evs {
			evs[i] = ev("a", `{}`)
		}
		mustAppend(t, s, evs...)
	}
	sink := newTestSink()
	_, err := openConn(t, s, connOpts{noState: true}, sink)
	require.NoError(t, err)
	waitUntil(t, "all", func() bool { return len(sink.offsets()) == 1500 })
	var sizes []int
	for _, b := range sink.batchList() {
		sizes = append(sizes, len(b))
		require.LessOrEqual(t, len(b), 1000)
	}
	require.Equal(t, 1000, sizes[0], "catch-up fills a batch up to the default cap: %v", sizes)
	want := make([]int64, 1500)
	for i := range want {
		want[i] = int64(i + 1)
	}
	require.Equal(t, want, sink.offsets())
}

// A type-filtered connection's position passes the events it does not match: ping's delivered
// offset reaches the head though none of them was sent, and the live state says so too.
func TestAudit2_FilteredConnectionPingPassesOtherTypes(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/audit2/filtered-ping")
	mustAppend(t, s, ev("a", `{}`), ev("b", `{}`))
	sink := newTestSink()
	c, err := openConn(t, s, connOpts{key: "f", types: []string{"b"}, noState: true}, sink)
	require.NoError(t, err)
	waitUntil(t, "the b", func() bool { return len(sink.offsets()) == 1 })
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`))
	waitUntil(t, "delivered passes the a's", func() bool {
		head, d, err := ping(t, c)
		return err == nil && head == 4 && d == 4
	})
	require.Equal(t, []int64{2}, sink.offsets())
	view, _ := watchLive(t, s)
	waitUntil(t, "the live state shows it", func() bool {
		_, doc := view.state()
		rows, _ := doc["connections"].(map[string]any)
		f, _ := rows["f"].(map[string]any)
		return f["delivered"] == float64(4)
	})
}

// A connection behind the live tail (its sink slow, one event a batch) reads back from the log
// and from the ephemeral buffer: every event appended while it was open, durable or ephemeral,
// arrives once, in offset order, however the appends interleave.
func TestAudit2_BehindTheTailEphemeralInOrder(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/audit2/behind-eph")
	mustAppend(t, s, ev("a", `{}`))
	sink := newTestSink()
	sink.block = make(chan struct{})
	c, err := openConn(t, s, connOpts{maxEvents: 1, noState: true}, sink)
	require.NoError(t, err)
	var want []int64
	want = append(want, 1)
	for i := range 30 {
		e := ev("e", fmt.Sprintf(`{"i":%d}`, i))
		e.Ephemeral = i%3 != 0
		res := mustAppend(t, s, e, ev("d", `{}`))
		want = append(want, res.Offsets...)
	}
	close(sink.block)
	waitUntil(t, "everything", func() bool { return len(sink.offsets()) == len(want) })
	require.Equal(t, want, sink.offsets())
	// The sink holds the last batch before its answer reaches itxd, which then counts it.
	waitUntil(t, "delivered through the last", func() bool {
		_, d, err := ping(t, c)
		require.NoError(t, err)
		return d == want[len(want)-1]
	})
}

// Ephemeral rows evicted from the buffer (past its 10 MiB, the oldest first) leave gaps that a
// connection asking for the buffered ones tolerates: it gets what is left, strictly increasing,
// and stays open; one that was open and behind when they were evicted does the same.
func TestAudit2_EvictedEphemeralGapsAreTolerated(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/audit2/eph-gaps")
	behind := newTestSink()
	behind.block = make(chan struct{})
	cb, err := openConn(t, s, connOpts{maxEvents: 1, noState: true}, behind)
	require.NoError(t, err)
	big := strings.Repeat("x", itx.MaxEventBytes-1024)
	var durable []int64
	for i := range 14 {
		e := ev("big", fmt.Sprintf(`{"x":%q}`, big))
		e.Ephemeral = true
		mustAppend(t, s, e)
		if i%4 == 0 {
			durable = append(durable, mustAppend(t, s, ev("d", fmt.Sprintf(`{"i":%d}`, i))).Offsets...)
		}
	}
	head := mustDescribe(t, s).HeadOffset
	late := newTestSink()
	cl, err := openConn(t, s, connOpts{includeEphemeral: true, noState: true}, late)
	require.NoError(t, err)
	close(behind.block)
	for _, k := range []struct {
		name string
		sink *testSink
		c    schema.Connection
	}{{"late", late, cl}, {"behind", behind, cb}} {
		waitUntil(t, k.name+" reached the head", func() bool {
			_, d, err := ping(t, k.c)
			return err == nil && d == head
		})
		got := k.sink.offsets()
		require.True(t, slices.IsSorted(got) && len(slices.Compact(slices.Clone(got))) == len(got), "%s: %v", k.name, got)
		for _, o := range durable {
			require.Contains(t, got, o, "%s: every durable event", k.name)
		}
		require.Less(t, len(got), int(head), "%s: the oldest ephemeral rows were evicted", k.name)
		require.Equal(t, head, got[len(got)-1], "%s: the newest is kept", k.name)
		require.Nil(t, k.sink.closeReason(), k.name)
	}
}

// A key reopened after its connection closed, and a replace while the old one has batches in
// flight: the old sink's last call is closed(replaced); no batch reaches it after that; the new
// one delivers from its own offset.
func TestAudit2_ReplaceWhileBatchesInFlight(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/audit2/replace-inflight")
	mustAppend(t, s, ev("a", `{}`))
	old := &orderedSink{}
	gate := make(chan struct{})
	blocking := &gatedSink{orderedSink: old, gate: gate}
	_, err := openConn(t, s, connOpts{key: "tab", maxEvents: 1, noState: true}, blocking)
	require.NoError(t, err)
	for range 10 {
		mustAppend(t, s, ev("a", `{}`))
	}
	waitUntil(t, "batches in flight", func() bool { return blocking.entered() >= 1 })
	next := newTestSink()
	_, err = openConn(t, s, connOpts{key: "tab", after: 5, noState: true}, next)
	require.NoError(t, err)
	close(gate)
	waitUntil(t, "the old one told", func() bool { _, r := old.snapshot(); return r != nil })
	waitUntil(t, "the new one from its offset", func() bool { return len(next.offsets()) == 6 })
	require.Equal(t, []int64{6, 7, 8, 9, 10, 11}, next.offsets())
	mustAppend(t, s, ev("a", `{}`))
	waitUntil(t, "the new one gets the next", func() bool { return len(next.offsets()) == 7 })
	log, r := old.snapshot()
	require.Equal(t, schema.CloseReason_replaced, *r)
	require.Equal(t, "closed replaced", log[len(log)-1], "nothing after the close: %v", log)
	var got []int64
	old.mu.Lock()
	got = append(got, old.events...)
	old.mu.Unlock()
	for i, o := range got {
		require.Equal(t, int64(i+1), o, "the old one's events are a prefix, in order: %v", got)
	}
}

// gatedSink holds every deliver until gate closes, counting those that entered.
type gatedSink struct {
	*orderedSink
	gate chan struct{}
	mu2  sync.Mutex
	in   int
}

func (k *gatedSink) entered() int {
	k.mu2.Lock()
	defer k.mu2.Unlock()
	return k.in
}

func (k *gatedSink) Deliver(ctx context.Context, call schema.EventSink_deliver) error {
	k.mu2.Lock()
	k.in++
	k.mu2.Unlock()
	<-k.gate
	return k.orderedSink.Deliver(ctx, call)
}

// An open that names no sink is a malformed request: refused (invalidArgument) like a bad cap,
// and the connection open under its key is left alone (it is not replaced by one that can never
// deliver). A live-state view with no subscriber is refused the same way.
func TestAudit2_OpenWithoutASinkIsRefused(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "guestbook")})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/audit2/null-sink")
	mustAppend(t, s, ev("a", `{}`))
	held := newTestSink()
	c, err := openConn(t, s, connOpts{key: "tab", noState: true}, held)
	require.NoError(t, err)
	waitUntil(t, "caught up", func() bool { return len(held.offsets()) == 1 })

	fut, release := s.OpenConnection(ctx, func(p schema.Stream_openConnection_Params) error {
		opts, err := p.NewOptions()
		if err != nil {
			return err
		}
		opts.SetNoState(true)
		return opts.SetKey("tab") // and no sink
	})
	_, err = fut.Struct()
	release()
	requireCode(t, err, itx.EInvalid)
	_, _, err = ping(t, c)
	require.NoError(t, err, "the connection under the key is untouched")
	require.Nil(t, held.closeReason())
	mustAppend(t, s, ev("a", `{}`))
	waitUntil(t, "it still receives", func() bool { return len(held.offsets()) == 2 })

	lf, lrel := s.LiveState(ctx, nil)
	_, err = lf.Struct()
	lrel()
	requireCode(t, err, itx.EInvalid)
	configureProcessor(t, s, "guestbook")
	_, proc := processorOf(t, s, "guestbook")
	pf, prel := proc.LiveState(ctx, nil)
	_, err = pf.Struct()
	prel()
	requireCode(t, err, itx.EInvalid)
	require.Zero(t, testutil.CollectAndCount(ts.srv.Metrics().HandlerPanics), "no handler panicked")
}

// callGoSink answers deliver calls concurrently (call.Go) and holds each until released, so the
// number of batches the server has in flight toward it is visible.
type callGoSink struct {
	testSink
	gmu     sync.Mutex
	now     int
	most    int
	release chan struct{}
}

func (k *callGoSink) Deliver(ctx context.Context, call schema.EventSink_deliver) error {
	call.Go()
	k.gmu.Lock()
	k.now++
	k.most = max(k.most, k.now)
	k.gmu.Unlock()
	<-k.release
	k.gmu.Lock()
	k.now--
	k.gmu.Unlock()
	return k.testSink.Deliver(ctx, call)
}

func (k *callGoSink) inFlight() (now, most int) {
	k.gmu.Lock()
	defer k.gmu.Unlock()
	return k.now, k.most
}

// Flow control: a connection has a bounded number of batches in flight (4); the rest wait in
// the log, not in memory, and arrive once the sink answers.
func TestAudit2_BatchesInFlightAreBounded(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/audit2/window")
	sink := &callGoSink{testSink: testSink{changed: make(chan struct{}, 1)}, release: make(chan struct{})}
	var once sync.Once
	free := func() { once.Do(func() { close(sink.release) }) }
	defer free()
	_, err := openConn(t, s, connOpts{maxEvents: 1, noState: true}, sink)
	require.NoError(t, err)
	for range 20 {
		mustAppend(t, s, ev("a", `{}`))
	}
	waitUntil(t, "the window is full", func() bool { now, _ := sink.inFlight(); return now == server.ConnectionWindow })
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`))
	mustDescribe(t, s) // a round trip on the stream after the appends
	now, most := sink.inFlight()
	require.Equal(t, server.ConnectionWindow, most, "never more than the window in flight")
	require.Equal(t, server.ConnectionWindow, now)
	free()
	waitUntil(t, "everything", func() bool { return len(sink.offsets()) == 22 })
	_, most = sink.inFlight()
	require.Equal(t, server.ConnectionWindow, most)
}

// A connection another login replaces under its key gives back the place it held under its own
// login's bound: that login may open another.
func TestAudit2_ReplacedByAnotherLoginGivesItsPlaceBack(t *testing.T) {
	ts := startServer(t, server.Config{MaxLivePerSession: 1})
	a := stream(t, ts.project(t), "/audit2/cross-login")
	b := stream(t, ts.project(t), "/audit2/cross-login")
	mustAppend(t, a, ev("e", `{}`))
	first := newTestSink()
	_, err := openConn(t, a, connOpts{key: "tab", noState: true}, first)
	require.NoError(t, err)
	_, err = openConn(t, a, connOpts{key: "other", noState: true}, newTestSink())
	requireCode(t, err, itx.ELimitExceeded)
	_, err = openConn(t, b, connOpts{key: "tab", noState: true}, newTestSink())
	require.NoError(t, err, "another login counts its own")
	waitUntil(t, "replaced", func() bool { r := first.closeReason(); return r != nil && *r == schema.CloseReason_replaced })
	waitUntil(t, "the first login has its place again", func() bool {
		_, err := openConn(t, a, connOpts{key: "other", noState: true}, newTestSink())
		return err == nil
	})
}

// A connection with state frames that closes receives nothing more: no batch and no state frame
// after closed(), whatever changes on the stream afterwards.
func TestAudit2_NothingAfterClosed(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/audit2/after-closed")
	mustAppend(t, s, ev("a", `{}`))
	sink := &orderedSink{}
	c, err := openConn(t, s, connOpts{key: "tab"}, sink)
	require.NoError(t, err)
	waitUntil(t, "an event and a state frame", func() bool {
		log, _ := sink.snapshot()
		return slices.ContainsFunc(log, func(l string) bool { return strings.HasPrefix(l, "deliver") }) &&
			slices.ContainsFunc(log, func(l string) bool { return strings.HasPrefix(l, "state") })
	})
	fut, release := c.Close(ctx, func(p schema.Connection_close_Params) error { return p.SetReason("bye") })
	_, err = fut.Struct()
	release()
	require.NoError(t, err)
	waitUntil(t, "closed", func() bool { _, r := sink.snapshot(); return r != nil })
	rf, rrel := s.Readers(ctx, nil)
	defer rrel()
	for i := range 5 {
		mustAppend(t, s, ev("a", `{}`))
		require.NoError(t, client.RegisterReader(ctx, rf.Readers(), "mirror", int64(i+1)))
	}
	// A live view that has seen all of that is past any frame the connection could still get.
	view, _ := watchLive(t, s)
	waitUntil(t, "the changes are out", func() bool {
		_, doc := view.state()
		readers, _ := doc["readers"].(map[string]any)
		m, _ := readers["mirror"].(map[string]any)
		return m["checkpoint"] == float64(5)
	})
	mustDescribe(t, s)
	log, r := sink.snapshot()
	require.Equal(t, schema.CloseReason_closedByClient, *r)
	require.Equal(t, "closed closedByClient", log[len(log)-1], "nothing after closed: %v", log)
}

// A project deleted under an open view: a LiveSubscriber hears streamRemoved, and a connection
// with state frames hears it too, with nothing after it.
func TestAudit2_StreamRemovedEndsViewsWithWhy(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	a := client.Admin(ctx, ts.deployment(t))
	defer a.Release()
	info, tok, _, err := client.CreateProject(ctx, a, "team-r")
	require.NoError(t, err)
	conn := dial(t, ts.addr)
	keep := conn.Login(ctx, ts.creds.ProjectToken) // keeps the RPC connection
	defer keep.Release()
	_, err = client.DescribeProject(ctx, keep)
	require.NoError(t, err)
	p := conn.Login(ctx, tok)
	defer p.Release()
	s := client.Stream(ctx, p, "/gone")
	defer s.Release()
	mustAppend(t, s, ev("a", `{}`))
	view := &closingLive{}
	lf, lrel := s.LiveState(ctx, func(p schema.Stream_liveState_Params) error {
		return p.SetSubscriber(schema.LiveSubscriber_ServerToClient(view))
	})
	defer lrel()
	_, err = lf.Struct()
	require.NoError(t, err)
	waitUntil(t, "the first snapshot", func() bool { rev, _ := view.state(); return rev > 0 })
	sink := &orderedSink{}
	_, err = openConn(t, s, connOpts{key: "tab"}, sink)
	require.NoError(t, err)
	waitUntil(t, "a state frame", func() bool {
		log, _ := sink.snapshot()
		return slices.ContainsFunc(log, func(l string) bool { return strings.HasPrefix(l, "state") })
	})
	require.NoError(t, client.DeleteProject(ctx, a, info.ID, true))
	waitUntil(t, "the view heard why", func() bool { return len(view.reasons()) > 0 })
	// The project's sessions end after its streams: a view told streamRemoved must not then be
	// told accessEnded too (closed is the last call; one reason to switch on).
	mustDescribe(t, stream(t, keep, "/other"))
	_, err = client.DescribeProject(ctx, p)
	requireCode(t, err, itx.EUnauthenticated)
	require.Equal(t, []schema.CloseReason{schema.CloseReason_streamRemoved}, view.reasons())
	waitUntil(t, "the connection heard why", func() bool { _, r := sink.snapshot(); return r != nil })
	log, r := sink.snapshot()
	require.Equal(t, schema.CloseReason_streamRemoved, *r)
	require.Equal(t, "closed streamRemoved", log[len(log)-1], "nothing after closed: %v", log)
}

// The live state's subscription row shows the retry ladder: lastError and nextAttemptAt while a
// delivery fails, both gone once it succeeds; the lag follows the confirmed cursor.
func TestAudit2_LiveRowFollowsTheLadder(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/audit2/live-ladder")
	var fail sync.Map
	fail.Store("on", true)
	h := newHook(t, func(n int, b itx.WebhookBody) int {
		if v, _ := fail.Load("on"); v == true {
			return 503
		}
		return 200
	})
	mustAppend(t, s, ev("a", `{}`))
	view, _ := watchLive(t, s)
	e.configure(t, s, client.SubscriptionConfig{Name: "hook", Start: "now", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	mustAppend(t, s, ev("a", `{}`))
	row := func() map[string]any {
		_, doc := view.state()
		subs, _ := doc["subscriptions"].(map[string]any)
		r, _ := subs["hook"].(map[string]any)
		return r
	}
	waitUntil(t, "failing", func() bool {
		r := row()
		return r["status"] == "active" && r["kind"] == "webhook-post" && r["lastError"] != nil &&
			r["nextAttemptAt"] == float64(e.clock.Now().Add(time.Second).UnixMilli()) && r["confirmed"] == float64(2) && r["lag"] == float64(1)
	})
	fail.Store("on", false)
	e.clock.Advance(time.Second)
	waitUntil(t, "recovered", func() bool {
		r := row()
		_, hasErr := r["lastError"]
		_, hasNext := r["nextAttemptAt"]
		return r["confirmed"] == float64(3) && r["lag"] == float64(0) && !hasErr && !hasNext
	})
}

// A client whose RPC session dies takes its connections out of the stream's live state.
func TestAudit2_LostSessionLeavesTheLiveState(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/audit2/lost")
	mustAppend(t, s, ev("a", `{}`))
	view, _ := watchLive(t, s)
	_, err := openConn(t, s, connOpts{key: "stays", noState: true}, newTestSink())
	require.NoError(t, err)
	conn := dial(t, ts.addr)
	p := conn.Login(context.Background(), ts.creds.ProjectToken)
	other := client.Stream(context.Background(), p, "/audit2/lost")
	for _, k := range []string{"gone-1", "gone-2"} {
		_, err := openConn(t, other, connOpts{key: k, noState: true}, newTestSink())
		require.NoError(t, err)
	}
	waitUntil(t, "three open", func() bool { _, doc := view.state(); return doc["connectionsOpen"] == float64(3) })
	conn.Close()
	waitUntil(t, "one left", func() bool {
		_, doc := view.state()
		rows, _ := doc["connections"].(map[string]any)
		return doc["connectionsOpen"] == float64(1) && len(rows) == 1 && rows["stays"] != nil
	})
}

// Registered readers survive a restart with their checkpoints; the lag views (readers.list,
// subscriptions.list, the live state) show them against the head after it, and a reader removed
// before the restart stays removed.
func TestAudit2_ReadersSurviveARestart(t *testing.T) {
	dir := t.TempDir()
	ctx := ctxT(t)
	ts := startServer(t, server.Config{DataDir: dir})
	s := client.Stream(ctx, ts.project(t), "/audit2/restart")
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))
	rf, release := s.Readers(ctx, nil)
	require.NoError(t, client.RegisterReader(ctx, rf.Readers(), "mirror", 2))
	require.NoError(t, client.RegisterReader(ctx, rf.Readers(), "gone", 1))
	require.NoError(t, client.RemoveReader(ctx, rf.Readers(), "gone"))
	release()
	s.Release()
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, ts.srv.Close(cctx))

	ts2 := startServer(t, server.Config{DataDir: dir})
	s2 := stream(t, ts2.project(t), "/audit2/restart")
	mustAppend(t, s2, ev("a", `{}`))
	rf2, release2 := s2.Readers(ctx, nil)
	defer release2()
	list, err := client.ListReaders(ctx, rf2.Readers())
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, []any{"mirror", int64(2), int64(2)}, []any{list[0].Name, list[0].Checkpoint, list[0].Lag})
	subs := client.Subscriptions(ctx, s2)
	defer subs.Release()
	rows, err := client.ListSubscriptions(ctx, subs)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, []any{"mirror", "reader", int64(2)}, []any{rows[0].Name, rows[0].Kind, rows[0].Lag})
	view, _ := watchLive(t, s2)
	_, doc := view.state()
	readers, _ := doc["readers"].(map[string]any)
	require.Len(t, readers, 1)
	require.Equal(t, map[string]any{"checkpoint": float64(2), "lag": float64(2)}, readers["mirror"])
	requireCode(t, client.RemoveReader(ctx, rf2.Readers(), "gone"), itx.ENotFound)
}

// A barrier waiting on a reader that is removed while it waits ends at once (notFound), as a
// waitUntilProcessed on a name nothing holds does, instead of running out its timeout.
func TestAudit2_WaitOnARemovedReaderEnds(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/audit2/wait-removed")
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`))
	rf, release := s.Readers(ctx, nil)
	defer release()
	require.NoError(t, client.RegisterReader(ctx, rf.Readers(), "mirror", 1))
	sub := client.Subscription(ctx, s, "mirror")
	defer sub.Release()
	done := make(chan error, 1)
	go func() {
		_, err := client.WaitUntilProcessed(ctx, sub, 2, 25*time.Second)
		done <- err
	}()
	// The wait is under way once a later call on the stream has been answered... the barrier
	// is on the Subscription capability, so give the server its registration by a round trip
	// on that capability's stream (describe answers after the actor took the earlier input).
	mustDescribe(t, s)
	require.NoError(t, client.RemoveReader(ctx, rf.Readers(), "mirror"))
	select {
	case err := <-done:
		requireCode(t, err, itx.ENotFound)
	case <-time.After(10 * time.Second):
		t.Fatal("the barrier still waits on a reader that is gone")
	}
}

// closingLive is a liveView that keeps every closed() it hears.
type closingLive struct {
	liveView
	cmu sync.Mutex
	all []schema.CloseReason
}

func (l *closingLive) Closed(ctx context.Context, call schema.LiveSubscriber_closed) error {
	l.cmu.Lock()
	l.all = append(l.all, call.Args().Why())
	l.cmu.Unlock()
	return l.liveView.Closed(ctx, call)
}

func (l *closingLive) reasons() []schema.CloseReason {
	l.cmu.Lock()
	defer l.cmu.Unlock()
	return slices.Clone(l.all)
}

// closingSink is an orderedSink that counts the closed() calls it hears.
type closingSink struct {
	orderedSink
	n atomic.Int32
}

func (k *closingSink) Closed(ctx context.Context, call schema.EventSink_closed) error {
	k.n.Add(1)
	return k.orderedSink.Closed(ctx, call)
}

// Every end is told once, with its own reason: a token revoked tells its connection and its live
// view accessEnded, once each; a shutdown then tells the views and connections of another login
// serverShuttingDown, once each.
func TestAudit2_EachEndIsToldOnce(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	mine := stream(t, ts.project(t), "/audit2/told-once")
	mustAppend(t, mine, ev("a", `{}`))
	tok, info := ts.token(t, itx.Scope{})
	revoked := stream(t, ts.login(t, tok), "/audit2/told-once")

	open := func(s schema.Stream) (*closingSink, *closingLive) {
		sink := &closingSink{}
		_, err := openConn(t, s, connOpts{}, sink)
		require.NoError(t, err)
		view := &closingLive{}
		lf, lrel := s.LiveState(ctx, func(p schema.Stream_liveState_Params) error {
			return p.SetSubscriber(schema.LiveSubscriber_ServerToClient(view))
		})
		res, err := lf.Struct()
		require.NoError(t, err)
		h := res.Handle().AddRef()
		t.Cleanup(h.Release)
		lrel()
		waitUntil(t, "the first snapshot", func() bool { rev, _ := view.state(); return rev > 0 })
		return sink, view
	}
	rs, rv := open(revoked)
	ms, mv := open(mine)
	a := client.Admin(ctx, ts.deployment(t))
	defer a.Release()
	require.NoError(t, client.RevokeToken(ctx, a, "default", info.ID))
	waitUntil(t, "the revoked login's ends told", func() bool { return rs.n.Load() > 0 && len(rv.reasons()) > 0 })

	closeCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, ts.srv.Close(closeCtx))
	waitUntil(t, "the shutdown told", func() bool { return ms.n.Load() > 0 && len(mv.reasons()) > 0 })
	_, r := rs.snapshot()
	require.Equal(t, []any{int32(1), schema.CloseReason_accessEnded}, []any{rs.n.Load(), *r})
	require.Equal(t, []schema.CloseReason{schema.CloseReason_accessEnded}, rv.reasons())
	_, r = ms.snapshot()
	require.Equal(t, []any{int32(1), schema.CloseReason_serverShuttingDown}, []any{ms.n.Load(), *r})
	require.Equal(t, []schema.CloseReason{schema.CloseReason_serverShuttingDown}, mv.reasons())
}

// A sink that stops answering is closed as a slow consumer after the delivery timeout however
// large its batches: with megabytes in flight toward it the next batch waits for room, and that
// wait must not keep the connection from timing out the batches already sent.
func TestAudit2_StuckSinkWithLargeBatchesIsASlowConsumer(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/audit2/stuck-large")
	sink := newTestSink()
	sink.block = make(chan struct{})
	defer close(sink.block)
	c, err := openConn(t, s, connOpts{maxEvents: 3, maxBytes: 8 << 20, noState: true}, sink)
	require.NoError(t, err)
	big := strings.Repeat("x", itx.MaxEventBytes-200)
	for range 3 {
		mustAppend(t, s, ev("big", fmt.Sprintf(`{"x":%q}`, big)), ev("big", fmt.Sprintf(`{"x":%q}`, big)))
	}
	waitUntil(t, "closed as a slow consumer", func() bool {
		e.clock.Advance(itx.DeliveryTimeout)
		_, _, err := ping(t, c)
		return err != nil
	})
	_, _, err = ping(t, c)
	requireCode(t, err, itx.EFailedPrecondition)
	require.Contains(t, err.Error(), "slowConsumer")
}

// Subscriptions never receive ephemeral events and their cursors pass over them: a caught-up
// subscription shows no lag after ephemeral appends, in subscriptions.list, the live state and
// the stream's standing.
func TestAudit2_EphemeralTailLeavesNoSubscriptionLag(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/audit2/eph-lag")
	h := newHook(t, nil)
	mustAppend(t, s, ev("a", `{}`))
	e.configure(t, s, client.SubscriptionConfig{Name: "hook", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	mustAppend(t, s, ev("a", `{}`))
	e.waitProcessed(t, s, "hook", 3)
	typing := ev("typing", `{}`)
	typing.Ephemeral = true
	res := mustAppend(t, s, typing, typing)
	head := res.Offsets[1]
	require.Equal(t, int64(5), head)
	e.waitProcessed(t, s, "hook", head)
	view, _ := watchLive(t, s)
	waitUntil(t, "no lag in the live state", func() bool {
		_, doc := view.state()
		subs, _ := doc["subscriptions"].(map[string]any)
		row, _ := subs["hook"].(map[string]any)
		return doc["head"] == float64(head) && row["lag"] == float64(0) && row["confirmed"] == float64(head)
	})
	rows := e.list(t, s)
	require.Len(t, rows, 1)
	require.Zero(t, rows[0].Lag)
	require.Zero(t, mustDescribe(t, s).MaxLag)
	require.Equal(t, []int64{1, 2, 3}, h.distinct(), "no ephemeral event delivered")
}

// An open refused for its login's bound leaves the connection open under its key alone, even
// one another login opened.
func TestAudit2_RefusedForTheLoginsBoundReplacesNothing(t *testing.T) {
	ts := startServer(t, server.Config{MaxLivePerSession: 1})
	a := stream(t, ts.project(t), "/audit2/bound-replace")
	b := stream(t, ts.project(t), "/audit2/bound-replace")
	mustAppend(t, a, ev("e", `{}`))
	held := newTestSink()
	c, err := openConn(t, a, connOpts{key: "tab", noState: true}, held)
	require.NoError(t, err)
	_, err = openConn(t, b, connOpts{key: "x", noState: true}, newTestSink())
	require.NoError(t, err)
	_, err = openConn(t, b, connOpts{key: "tab", noState: true}, newTestSink())
	requireCode(t, err, itx.ELimitExceeded)
	_, _, err = ping(t, c)
	require.NoError(t, err)
	require.Nil(t, held.closeReason())
	mustAppend(t, a, ev("e", `{}`))
	waitUntil(t, "it still receives", func() bool { return len(held.offsets()) == 2 })
}

// A model check of what each connection receives, over a seeded mix of appends (durable and
// ephemeral, of several types, one to seven a call) and connections opened between them with
// random options (after, types, caps, includeEphemeral), some sinks slow, more than the tail's
// short path serves: each gets exactly the events after its offset that its filter matches, the
// ephemeral ones only if appended after it opened or asked for, in offset order, once, in
// batches within its caps.
func TestAudit2_ConnectionsAgainstAModel(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/audit2/model")
	rng := rand.New(rand.NewPCG(2026, 9))
	types := []string{"a", "b", "c"}
	type appended struct {
		offset    int64
		typ       string
		ephemeral bool
	}
	var log []appended
	appendSome := func() {
		n := 1 + rng.IntN(7)
		var in []itx.EventInput
		for range n {
			e := ev(types[rng.IntN(len(types))], fmt.Sprintf(`{"r":%d}`, rng.IntN(1000)))
			e.Ephemeral = rng.IntN(3) == 0
			in = append(in, e)
		}
		res := mustAppend(t, s, in...)
		for i, o := range res.Offsets {
			log = append(log, appended{o, in[i].Type, in[i].Ephemeral})
		}
	}
	type opened struct {
		opts     connOpts
		openedAt int64
		sink     *testSink
		c        schema.Connection
	}
	var conns []*opened
	for range 3 {
		appendSome()
	}
	for i := range 14 {
		head := int64(0)
		if len(log) > 0 {
			head = log[len(log)-1].offset
		}
		o := connOpts{after: uint64(rng.Int64N(head + 1)), maxEvents: uint32(rng.IntN(4)), noState: true,
			includeEphemeral: rng.IntN(2) == 0}
		if rng.IntN(2) == 0 {
			o.types = []string{types[rng.IntN(len(types))]}
		}
		if rng.IntN(3) == 0 {
			o.maxBytes = uint32(1 + rng.IntN(200))
		}
		sink := newTestSink()
		if i%4 == 0 {
			sink.block = make(chan struct{}) // slow: released after the appends
		}
		c, err := openConn(t, s, o, sink)
		require.NoError(t, err)
		conns = append(conns, &opened{opts: o, openedAt: head, sink: sink, c: c})
		appendSome()
		appendSome()
	}
	for _, k := range conns {
		if k.sink.block != nil {
			close(k.sink.block)
		}
	}
	head := log[len(log)-1].offset
	for i, k := range conns {
		var want []int64
		for _, e := range log {
			switch {
			case e.offset <= int64(k.opts.after):
			case len(k.opts.types) > 0 && k.opts.types[0] != e.typ:
			case e.ephemeral && e.offset <= k.openedAt && !k.opts.includeEphemeral:
			default:
				want = append(want, e.offset)
			}
		}
		waitUntil(t, fmt.Sprintf("connection %d delivered through the head", i), func() bool {
			_, d, err := ping(t, k.c)
			return err == nil && d == head
		})
		require.Equal(t, want, k.sink.offsets(), "connection %d %+v opened at %d", i, k.opts, k.openedAt)
		for _, b := range k.sink.batchList() {
			if k.opts.maxEvents > 0 {
				require.LessOrEqual(t, len(b), int(k.opts.maxEvents), "connection %d: a batch within maxDeliveryEvents", i)
			}
		}
		require.Nil(t, k.sink.closeReason(), "connection %d", i)
	}
}

// Opens under one key sent on one Stream capability without waiting take effect in the order
// sent: the last one is the connection left open, every earlier one is closed as replaced.
func TestAudit2_PipelinedOpensUnderOneKeyKeepTheLast(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/audit2/pipelined-opens")
	mustAppend(t, s, ev("a", `{}`))
	for round := range 10 {
		const n = 8
		sinks := make([]*testSink, n)
		var futs []schema.Stream_openConnection_Results_Future
		var rels []capnp.ReleaseFunc
		for i := range n {
			sinks[i] = newTestSink()
			fut, rel := s.OpenConnection(ctx, func(p schema.Stream_openConnection_Params) error {
				opts, err := p.NewOptions()
				if err != nil {
					return err
				}
				opts.SetNoState(true)
				if err := opts.SetKey(fmt.Sprintf("tab-%d", round)); err != nil {
					return err
				}
				return p.SetSink(schema.EventSink_ServerToClient(sinks[i]))
			})
			futs, rels = append(futs, fut), append(rels, rel)
		}
		var last schema.Connection
		for i, f := range futs {
			res, err := f.Struct()
			require.NoError(t, err)
			if i == n-1 {
				last = res.Connection().AddRef()
				defer last.Release()
			}
		}
		waitUntil(t, "the earlier ones replaced", func() bool {
			for _, k := range sinks[:n-1] {
				if r := k.closeReason(); r == nil || *r != schema.CloseReason_replaced {
					return false
				}
			}
			return true
		})
		_, _, err := ping(t, last)
		require.NoError(t, err, "round %d: the last one sent is open", round)
		require.Nil(t, sinks[n-1].closeReason(), "round %d", round)
		for _, rel := range rels[:n-1] {
			rel()
		}
		rels[n-1]()
	}
}

// A connection lives as long as its own capability and session: releasing the Stream capability
// that opened it (and the project) ends nothing.
func TestAudit2_ConnectionOutlivesTheStreamCapability(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	conn := dial(t, ts.addr)
	p := conn.Login(ctx, ts.creds.ProjectToken)
	s := client.Stream(ctx, p, "/audit2/outlives")
	mustAppend(t, s, ev("a", `{}`))
	sink := newTestSink()
	c, err := openConn(t, s, connOpts{noState: true}, sink)
	require.NoError(t, err)
	waitUntil(t, "caught up", func() bool { return len(sink.offsets()) == 1 })
	s.Release()
	p.Release()
	other := stream(t, ts.project(t), "/audit2/outlives")
	mustAppend(t, other, ev("a", `{}`))
	waitUntil(t, "still delivering", func() bool { return len(sink.offsets()) == 2 })
	waitUntil(t, "ping says so", func() bool {
		_, d, err := ping(t, c)
		return err == nil && d == 2
	})
	require.Nil(t, sink.closeReason())
}
