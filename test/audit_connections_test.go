package test

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Edge cases of connections and readers that the seed's connection model promises (seed 000
// "Connection": "Offset supplied by the caller; ... maxDeliveryEvents / maxDeliveryBytes ...
// openedBy, the ping side-channel, and close reasons").

func (k *testSink) batchList() [][]int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([][]int64(nil), k.batches...)
}

// Boundary offsets: 0 on a stream that does not exist yet, the head itself, head+1 and offsets
// far beyond (2^63-1, 2^63, 2^64-1). The ones beyond the head are refused with invalidArgument
// and leave the open connection under the same key as it was.
func TestAudit_ConnectionBoundaryOffsets(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)

	// A stream with no append yet: after 0 opens, and the first append arrives.
	early := newTestSink()
	fresh := stream(t, p, "/audit/boundary-new")
	_, err := openConn(t, fresh, connOpts{noState: true}, early)
	require.NoError(t, err)
	_, err = openConn(t, fresh, connOpts{after: 1, noState: true}, newTestSink())
	requireCode(t, err, itx.EInvalid)
	mustAppend(t, fresh, ev("a", `{}`))
	waitUntil(t, "the first append reaches a connection opened before it", func() bool { return len(early.offsets()) == 1 })

	s := stream(t, p, "/audit/boundary")
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))
	held := newTestSink()
	c, err := openConn(t, s, connOpts{key: "held", after: 3, noState: true}, held)
	require.NoError(t, err, "after = head opens")
	for _, after := range []uint64{4, math.MaxInt64, math.MaxInt64 + 1, math.MaxUint64} {
		_, err := openConn(t, s, connOpts{key: "held", after: after, noState: true}, newTestSink())
		requireCode(t, err, itx.EInvalid)
		require.Contains(t, err.Error(), fmt.Sprint(after), "the offset is reported as sent")
	}
	head, delivered, err := ping(t, c)
	require.NoError(t, err, "refused opens leave the same-key connection open")
	require.Equal(t, []int64{3, 3}, []int64{head, delivered})
	require.Nil(t, held.closeReason())
	mustAppend(t, s, ev("b", `{}`))
	waitUntil(t, "the held connection still receives", func() bool { return len(held.offsets()) == 1 })
	require.Equal(t, []int64{4}, held.offsets(), "after = head: only what follows")

	all := newTestSink()
	_, err = openConn(t, s, connOpts{after: 0, noState: true}, all)
	require.NoError(t, err)
	waitUntil(t, "everything from offset 1", func() bool { return len(all.offsets()) == 4 })
	require.Equal(t, []int64{1, 2, 3, 4}, all.offsets())
}

// Per-batch caps at their bounds and beyond: a refused cap is invalidArgument and changes
// nothing; a byte cap smaller than any event still delivers every event, one a batch (the first
// event of a batch always goes); caps hold on the catch-up and the live path alike.
func TestAudit_ConnectionCapsAtTheirBounds(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/audit/caps")
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))

	held := newTestSink()
	c, err := openConn(t, s, connOpts{key: "k", maxEvents: server.MaxConnectionBatchEvents, maxBytes: server.MaxConnectionBatchBytes, noState: true}, held)
	require.NoError(t, err, "the largest caps are allowed")
	waitUntil(t, "caught up in one batch", func() bool { return len(held.offsets()) == 3 })
	require.Equal(t, [][]int64{{1, 2, 3}}, held.batchList())

	for _, o := range []connOpts{
		{key: "k", maxEvents: server.MaxConnectionBatchEvents + 1},
		{key: "k", maxEvents: math.MaxUint32},
		{key: "k", maxBytes: server.MaxConnectionBatchBytes + 1},
		{key: "k", maxBytes: math.MaxUint32},
		{key: "k", types: []string{""}},
		{key: "k", types: []string{"has space"}},
		{key: "k\x00"},
		{key: strings.Repeat("k", itx.MaxSubscriptionNameLength+1)},
	} {
		o.noState = true
		_, err := openConn(t, s, o, newTestSink())
		requireCode(t, err, itx.EInvalid)
	}
	_, _, err = ping(t, c)
	require.NoError(t, err, "refused opens leave the connection under the key open")
	require.Nil(t, held.closeReason())

	// A byte cap below any event: one event a batch, on catch-up and then live.
	tiny := newTestSink()
	_, err = openConn(t, s, connOpts{maxBytes: 1, noState: true}, tiny)
	require.NoError(t, err)
	waitUntil(t, "caught up", func() bool { return len(tiny.offsets()) == 3 })
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`))
	waitUntil(t, "live", func() bool { return len(tiny.offsets()) == 5 })
	require.Equal(t, [][]int64{{1}, {2}, {3}, {4}, {5}}, tiny.batchList())

	// One event a batch under a type filter: the cap counts what is delivered.
	one := newTestSink()
	_, err = openConn(t, s, connOpts{maxEvents: 1, types: []string{"b"}, noState: true}, one)
	require.NoError(t, err)
	mustAppend(t, s, ev("b", `{}`), ev("a", `{}`), ev("b", `{}`), ev("b", `{}`))
	waitUntil(t, "the three b", func() bool { return len(one.offsets()) == 3 })
	require.Equal(t, [][]int64{{6}, {8}, {9}}, one.batchList())
	waitUntil(t, "delivered through the head", func() bool {
		_, d, err := ping(t, c)
		return err == nil && d == 9
	})
}

// Appends a connection must not see: an idempotent retry (a duplicate of what its key holds),
// a conditional append whose expected head is not the head, an idempotency conflict. A batch
// mixing a duplicate with new events delivers only the new ones, once.
func TestAudit_ConnectionSeesOnlyWhatIsWritten(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/audit/idem")
	ctx := ctxT(t)
	mustAppend(t, s, keyed("order", `{"n":1}`, "o1")) // 1
	sink := newTestSink()
	c, err := openConn(t, s, connOpts{noState: true}, sink)
	require.NoError(t, err)
	waitUntil(t, "caught up", func() bool { return len(sink.offsets()) == 1 })

	dup, err := client.Append(ctx, s, []itx.EventInput{keyed("order", `{"n":1}`, "o1")}, itx.AppendOptions{})
	require.NoError(t, err)
	require.Equal(t, []int64{1}, dup.Offsets)
	_, err = client.Append(ctx, s, []itx.EventInput{keyed("order", `{"n":2}`, "o1")}, itx.AppendOptions{})
	requireCode(t, err, itx.EIdempotencyConflict)
	_, err = client.Append(ctx, s, []itx.EventInput{ev("x", `{}`)}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 0})
	requireCode(t, err, itx.EOffsetConflict)
	_, err = client.Append(ctx, s, []itx.EventInput{ev("x", `{}`)}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 2})
	requireCode(t, err, itx.EOffsetConflict)
	// A retry of a conditional append whose every event is a duplicate is answered from the log.
	again, err := client.Append(ctx, s, []itx.EventInput{keyed("order", `{"n":1}`, "o1")}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 0})
	require.NoError(t, err)
	require.Equal(t, []int64{1}, again.Offsets)

	mixed, err := client.Append(ctx, s, []itx.EventInput{keyed("order", `{"n":1}`, "o1"), keyed("order", `{"n":3}`, "o3")},
		itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 1})
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2}, mixed.Offsets)
	require.Equal(t, []bool{true, false}, mixed.Duplicate)
	waitUntil(t, "the new event", func() bool { return len(sink.offsets()) == 2 })
	waitUntil(t, "delivered through the head", func() bool {
		head, d, err := ping(t, c)
		return err == nil && head == 2 && d == 2
	})
	require.Equal(t, []int64{1, 2}, sink.offsets(), "nothing but what was written, once")
}

// Opens of one key racing each other: exactly one connection stays open under the key, every
// other one is closed as replaced, and only the survivor receives later events.
func TestAudit_ReplaceByKeyRace(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	s := stream(t, p, "/audit/race-key")
	mustAppend(t, s, ev("a", `{}`))
	const n = 8
	sinks := make([]*testSink, n)
	conns := make([]schema.Connection, n)
	var wg sync.WaitGroup
	for i := range n {
		sinks[i] = newTestSink()
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := openConn(t, s, connOpts{key: "tab", noState: true}, sinks[i])
			if err != nil {
				t.Error(err)
				return
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	require.False(t, t.Failed())
	waitUntil(t, "all but one replaced", func() bool {
		replaced := 0
		for _, k := range sinks {
			if r := k.closeReason(); r != nil && *r == schema.CloseReason_replaced {
				replaced++
			}
		}
		return replaced == n-1
	})
	survivor := -1
	for i, k := range sinks {
		if k.closeReason() == nil {
			survivor = i
		}
	}
	require.NotEqual(t, -1, survivor)
	for i, c := range conns {
		_, _, err := ping(t, c)
		if i == survivor {
			require.NoError(t, err)
		} else {
			requireCode(t, err, itx.EFailedPrecondition)
		}
	}
	view, _ := watchLive(t, s)
	waitUntil(t, "one connection open", func() bool {
		_, doc := view.state()
		open, _ := doc["connectionsOpen"].(float64)
		rows, _ := doc["connections"].(map[string]any)
		return open == 1 && len(rows) == 1 && rows["tab"] != nil
	})
	before := make([]int, n)
	for i, k := range sinks {
		before[i] = len(k.offsets())
	}
	mustAppend(t, s, ev("b", `{}`))
	waitUntil(t, "the survivor receives", func() bool { return len(sinks[survivor].offsets()) == before[survivor]+1 })
	for i, k := range sinks {
		if i != survivor {
			require.Equal(t, before[i], len(k.offsets()), "a replaced connection receives nothing more")
		}
	}
}

// A type filter applies to ephemeral events too, in offset order with the durable ones; the
// buffered ones arrive on catch-up only when asked.
func TestAudit_TypeFilterOverEphemeralEvents(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/audit/eph-filter")
	typing := ev("typing", `{}`)
	typing.Ephemeral = true
	other := ev("cursor", `{}`)
	other.Ephemeral = true
	mustAppend(t, s, ev("msg", `{}`), typing, other, ev("note", `{}`)) // 1, 2~, 3~, 4

	asked := newTestSink()
	_, err := openConn(t, s, connOpts{types: []string{"typing", "msg"}, includeEphemeral: true, noState: true}, asked)
	require.NoError(t, err)
	unasked := newTestSink()
	_, err = openConn(t, s, connOpts{types: []string{"typing", "msg"}, noState: true}, unasked)
	require.NoError(t, err)
	mustAppend(t, s, other, typing, ev("msg", `{}`), typing) // 5~, 6~, 7, 8~
	waitUntil(t, "delivered", func() bool { return len(asked.offsets()) == 5 && len(unasked.offsets()) == 4 })
	require.Equal(t, []int64{1, 2, 6, 7, 8}, asked.offsets())
	require.Equal(t, []int64{1, 6, 7, 8}, unasked.offsets())
	asked.mu.Lock()
	defer asked.mu.Unlock()
	for _, e := range asked.events {
		require.Contains(t, []string{"typing", "msg"}, e.Type)
		require.Equal(t, e.Type == "typing", e.Ephemeral)
	}
}

// ping on a closed connection fails failedPrecondition whatever closed it, and saying close
// again is harmless; key() still names it.
func TestAudit_PingAfterClose(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/audit/ping")
	mustAppend(t, s, ev("a", `{}`))
	sink := newTestSink()
	c, err := openConn(t, s, connOpts{key: "tab", noState: true}, sink)
	require.NoError(t, err)
	closeConn := func() error {
		fut, release := c.Close(context.Background(), func(p schema.Connection_close_Params) error { return p.SetReason("bye") })
		defer release()
		_, err := fut.Struct()
		return err
	}
	require.NoError(t, closeConn())
	_, _, err = ping(t, c)
	requireCode(t, err, itx.EFailedPrecondition)
	require.Contains(t, err.Error(), "closedByClient")
	require.NoError(t, closeConn(), "closing a closed connection is harmless")
	waitUntil(t, "one closed notice", func() bool { return sink.closeReason() != nil })
	require.Equal(t, schema.CloseReason_closedByClient, *sink.closeReason())
	kf, release := c.Key(context.Background(), nil)
	res, err := kf.Struct()
	require.NoError(t, err)
	key, _ := res.Key()
	release()
	require.Equal(t, "tab", key)

	// The key is free again: a new open under it is not a replacement of anything open.
	next := newTestSink()
	c2, err := openConn(t, s, connOpts{key: "tab", noState: true}, next)
	require.NoError(t, err)
	_, _, err = ping(t, c2)
	require.NoError(t, err)
}

// A reader registered at the head has lag 0; when the head moves, its lag grows in every lag
// view: readers.list, subscriptions.list (kind reader), the stream's live state, and the stream's
// standing (describe's maxLag).
func TestAudit_ReaderAtHeadThenTheHeadMoves(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/audit/reader-head")
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`))
	rf, release := s.Readers(ctx, nil)
	defer release()
	r := rf.Readers()
	require.NoError(t, client.RegisterReader(ctx, r, "mirror", 2))
	list, err := client.ListReaders(ctx, r)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, []int64{2, 0}, []int64{list[0].Checkpoint, list[0].Lag})
	require.Zero(t, mustDescribe(t, s).MaxLag)

	view, _ := watchLive(t, s)
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))
	list, err = client.ListReaders(ctx, r)
	require.NoError(t, err)
	require.Equal(t, []int64{2, 3}, []int64{list[0].Checkpoint, list[0].Lag})
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	rows, err := client.ListSubscriptions(ctx, subs)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, []any{"mirror", "reader", int64(2), int64(3)}, []any{rows[0].Name, rows[0].Kind, rows[0].ConfirmedOffset, rows[0].Lag})
	require.Equal(t, int64(3), mustDescribe(t, s).MaxLag)
	waitUntil(t, "the live state shows the lag", func() bool {
		_, doc := view.state()
		readers, _ := doc["readers"].(map[string]any)
		m, _ := readers["mirror"].(map[string]any)
		return doc["head"] == float64(5) && m["lag"] == float64(3) && m["checkpoint"] == float64(2)
	})
	requireCode(t, client.RegisterReader(ctx, r, "mirror", 6), itx.EInvalid)
	require.NoError(t, client.RegisterReader(ctx, r, "mirror", 5), "moves to the new head")
	require.Zero(t, mustDescribe(t, s).MaxLag)
}

// Names: a reader may carry an open connection's key (a mirror registers its checkpoint under
// its own name); a removed subscription's name is free for a connection and a reader; readers
// that do not exist are notFound to remove.
func TestAudit_ReaderAndConnectionNames(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/audit/names")
	mustAppend(t, s, ev("a", `{}`))
	rf, release := s.Readers(e.ctx, nil)
	defer release()
	r := rf.Readers()
	_, err := openConn(t, s, connOpts{key: "mirror", noState: true}, newTestSink())
	require.NoError(t, err)
	require.NoError(t, client.RegisterReader(e.ctx, r, "mirror", 1), "a connection and a reader may carry one name")

	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "gone", Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "x"}})
	requireCode(t, client.RegisterReader(e.ctx, r, name, 1), itx.EFailedPrecondition)
	requireCode(t, client.RemoveReader(e.ctx, r, name), itx.ENotFound)
	_, err = openConn(t, s, connOpts{key: name, noState: true}, newTestSink())
	requireCode(t, err, itx.EFailedPrecondition)
	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	_, err = client.RemoveSubscription(e.ctx, subs, name)
	require.NoError(t, err)
	_, err = openConn(t, s, connOpts{key: name, noState: true}, newTestSink())
	require.NoError(t, err, "a removed subscription's name is free")
	require.NoError(t, client.RegisterReader(e.ctx, r, name, 1))
	requireCode(t, client.RemoveReader(e.ctx, r, "never"), itx.ENotFound)
}

// A client following the stream's live state by its patches reproduces a fresh snapshot across
// a subscription's whole life (configure, failing, halt, resume, reconfigure, remove), readers
// and connections coming and going, and names holding the JSON Pointer's special characters.
func TestAudit_LivePatchesReproduceTheSnapshotAcrossALife(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	const path = "/audit/live-life"
	s := stream(t, e.p, path)
	mustAppend(t, s, ev("a", `{}`))
	follower, _ := watchLive(t, s)
	converge := func(what string, check func(doc map[string]any) bool) {
		t.Helper()
		fresh, _ := watchLive(t, s)
		waitUntil(t, what, func() bool {
			r1, d1 := follower.state()
			r2, d2 := fresh.state()
			return check(d2) && r1 == r2 && reflect.DeepEqual(d1, d2)
		})
	}
	sub := func(doc map[string]any, name string) map[string]any {
		subs, _ := doc["subscriptions"].(map[string]any)
		row, _ := subs[name].(map[string]any)
		return row
	}

	const name = "a/b~c"
	var broken sync.Map
	broken.Store("on", true)
	haltWebhook(t, e, path, name, &broken)
	converge("halted", func(doc map[string]any) bool {
		row := sub(doc, name)
		return row["status"] == "halted" && row["lastError"] != nil && row["kind"] == "webhook-post"
	})

	broken.Store("on", false)
	_, err := client.ResumeSubscription(e.ctx, s, name)
	require.NoError(t, err)
	head := mustDescribe(t, s).HeadOffset
	e.waitProcessed(t, s, name, head)
	converge("resumed", func(doc map[string]any) bool {
		row := sub(doc, name)
		return row["status"] == "active" && row["confirmed"] == float64(head) && row["lag"] == float64(0) && row["lastError"] == nil
	})

	rf, release := s.Readers(e.ctx, nil)
	defer release()
	r := rf.Readers()
	for _, rn := range []string{"~0/", "x~1y", "/"} {
		require.NoError(t, client.RegisterReader(e.ctx, r, rn, 1))
	}
	for _, k := range []string{"tab/1", "~", "tab/1"} {
		_, err := openConn(t, s, connOpts{key: k, noState: true}, newTestSink())
		require.NoError(t, err)
	}
	converge("readers and connections", func(doc map[string]any) bool {
		readers, _ := doc["readers"].(map[string]any)
		conns, _ := doc["connections"].(map[string]any)
		return len(readers) == 3 && len(conns) == 2 && conns["tab/1"] != nil && conns["~"] != nil
	})

	require.NoError(t, client.RemoveReader(e.ctx, r, "x~1y"))
	require.NoError(t, client.RegisterReader(e.ctx, r, "~0/", 2))
	h := newHook(t, nil)
	e.configure(t, s, client.SubscriptionConfig{Name: name, Start: "now", FilterTypes: []string{"job"},
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	e.configure(t, s, client.SubscriptionConfig{Name: "q~/", Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "nobody"}})
	mustAppend(t, s, ev("job", `{}`))
	converge("reconfigured, a parked one", func(doc map[string]any) bool {
		return sub(doc, "q~/")["status"] == "parked" && sub(doc, name)["lag"] == float64(0)
	})

	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	_, err = client.RemoveSubscription(e.ctx, subs, name)
	require.NoError(t, err)
	require.NoError(t, client.RemoveReader(e.ctx, r, "/"))
	converge("removed", func(doc map[string]any) bool {
		readers, _ := doc["readers"].(map[string]any)
		return sub(doc, name) == nil && len(readers) == 1
	})
	follower.mu.Lock()
	defer follower.mu.Unlock()
	require.Zero(t, follower.gaps)
}

// envelopeSink records each batch's envelope.
type envelopeSink struct {
	testSink
	emu  sync.Mutex
	envs []itx.DeliveryEnvelope
}

func (k *envelopeSink) Deliver(ctx context.Context, call schema.EventSink_deliver) error {
	b, err := call.Args().Batch()
	if err != nil {
		return err
	}
	id, _ := b.StreamId()
	path, _ := b.Path()
	k.emu.Lock()
	k.envs = append(k.envs, itx.DeliveryEnvelope{StreamID: id, Path: path, HeadOffset: int64(b.HeadOffset())})
	k.emu.Unlock()
	return k.testSink.Deliver(ctx, call)
}

// A connection's batches name the stream (its id, the one appends return, and its path) so a
// client dedupes by (streamId, offset), and carry the head, at or past their last event; from a
// connection opened before the stream's first append too.
func TestAudit_ConnectionBatchEnvelope(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/audit/envelope")
	sink := &envelopeSink{testSink: testSink{changed: make(chan struct{}, 1)}}
	_, err := openConn(t, s, connOpts{maxEvents: 1, noState: true}, sink)
	require.NoError(t, err)
	res := mustAppend(t, s, ev("a", `{}`), ev("a", `{}`))
	require.NotEmpty(t, res.StreamID)
	waitUntil(t, "both", func() bool { return len(sink.offsets()) == 2 })
	sink.emu.Lock()
	defer sink.emu.Unlock()
	for i, env := range sink.envs {
		require.Equal(t, res.StreamID, env.StreamID)
		require.Equal(t, "/audit/envelope", env.Path)
		require.GreaterOrEqual(t, env.HeadOffset, int64(i+1))
	}
}

// Flow control: a sink that answers late but within the delivery timeout is not closed (only one
// that does not answer within it is a slow consumer), and while it is stuck another connection on
// the stream, the stream's live state and appends go on.
func TestAudit_LateSinkWithinTheTimeoutStaysOpen(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/audit/late-sink")
	mustAppend(t, s, ev("a", `{}`))
	timers := e.clock.Pending()
	late := newTestSink()
	late.block = make(chan struct{})
	var unblock sync.Once
	release := func() { unblock.Do(func() { close(late.block) }) }
	defer release() // a failure must not leave the server's calls into the sink hanging
	c, err := openConn(t, s, connOpts{maxEvents: 5, noState: true}, late)
	require.NoError(t, err)
	healthy := newTestSink()
	_, err = openConn(t, s, connOpts{maxEvents: 5, noState: true}, healthy)
	require.NoError(t, err)
	view, _ := watchLive(t, s)
	for range 40 {
		mustAppend(t, s, ev("a", `{}`))
	}
	waitUntil(t, "the healthy connection has everything", func() bool { return len(healthy.offsets()) == 41 })
	waitUntil(t, "the live state goes on", func() bool { _, doc := view.state(); return doc["head"] == float64(41) })
	waitUntil(t, "a batch awaits its answer", func() bool { return e.clock.Pending() > timers })
	e.clock.Advance(itx.DeliveryTimeout - time.Second)
	release()
	waitUntil(t, "the late sink has everything", func() bool { return len(late.offsets()) == 41 })
	_, d, err := ping(t, c)
	require.NoError(t, err, "answered within the timeout: still open")
	require.Nil(t, late.closeReason())
	want := make([]int64, 41)
	for i := range want {
		want[i] = int64(i + 1)
	}
	require.Equal(t, want, late.offsets())
	waitUntil(t, "delivered through the head", func() bool { _, d, err = ping(t, c); return err == nil && d == 41 })
}
