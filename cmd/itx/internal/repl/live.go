package repl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"capnproto.org/go/capnp/v3"
	"github.com/dop251/goja"
	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/wire"
)

// Live views: a connection (Stream.openConnection, pushed events) and a live-state
// registration (Stream.liveState, Processor.liveState: a snapshot then patches). The server
// calls back into capabilities this process serves, which buffer what arrives until a script
// or a command (.tail, .watch) reads it.

// liveHandle is something the session ends when it closes.
type liveHandle interface{ release() }

// maxBuffered bounds what a connection or live view keeps unread; older entries are dropped
// (and counted) so a forgotten connection cannot grow without bound. A connection's events are
// bounded by their bytes too (itx.Event.Size): 10,000 events of up to a MiB each would be 10 GiB.
const (
	maxBuffered      = 10_000
	maxBufferedBytes = 64 << 20
)

// eventSink is the EventSink served for a connection opened from itx.
type eventSink struct {
	mu      sync.Mutex
	events  []itx.Event
	dropped int
	closed  *itx.Error // the close reason, once the server closed the connection
	why     string     // closed's CloseReason ("serverShuttingDown", ...), to switch on
	wake    chan struct{}
	// keepOldest (.tail's sink) keeps the oldest events when the buffer is full and discards
	// every later one, so what it holds is a run without a gap: the tail prints it and opens
	// again after its last offset. Otherwise the oldest are dropped (a script's connection).
	keepOldest bool
	full       bool // keepOldest: the buffer filled; every later event was discarded
	bytes      int  // the Size of the events held
	// streamID is the stream the connection delivers (learned from its first batch, or set
	// before the open to the stream a reopened .tail continues): a batch of another stream
	// (the one tailed was deleted and the path holds a new one, its offsets starting over) is
	// refused, and the sink closed as streamRemoved, so nothing of it is taken for the rest.
	streamID string
	refused  bool // this sink closed itself (another stream): the server's close does not replace why
	// quietThrough: ephemeral events at or below it are not kept (.tail --from: they were
	// appended before the tail started; see runTail).
	quietThrough int64
}

func newEventSink() *eventSink { return &eventSink{wake: make(chan struct{}, 1)} }

func (k *eventSink) signal() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

func (k *eventSink) Deliver(ctx context.Context, call schema.EventSink_deliver) error {
	batch, err := call.Args().Batch()
	if err != nil {
		return err
	}
	list, err := batch.Events()
	if err != nil {
		return err
	}
	events, err := wire.EventsFromSchema(list)
	if err != nil {
		return err
	}
	id, err := batch.StreamId()
	if err != nil {
		return err
	}
	if err := k.sameStream(id); err != nil {
		k.signal()
		return err
	}
	if k.quietThrough > 0 {
		kept := events[:0]
		for _, e := range events {
			if !e.Ephemeral || e.Offset > k.quietThrough {
				kept = append(kept, e)
			}
		}
		events = kept
	}
	k.add(events)
	k.signal()
	return nil
}

// sameStream checks that a batch of the stream id is of the sink's stream (see streamID); one
// of another stream closes the sink as streamRemoved.
func (k *eventSink) sameStream(id string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case k.refused:
		return errors.New("the connection delivers another stream")
	case id == "" || id == k.streamID:
		return nil
	case k.streamID == "":
		k.streamID = id
		return nil
	}
	k.closed, k.why, k.refused = streamReplaced(k.streamID, id), "streamRemoved", true
	return errors.New("the connection delivers another stream")
}

// streamReplaced is the close reason of a connection (or a reopening) that found another
// stream than the one it followed (was) at its path (now; "" for none).
func streamReplaced(was, now string) *itx.Error {
	msg := fmt.Sprintf("streamRemoved: the stream followed (id %s) was deleted", was)
	if now != "" {
		msg += fmt.Sprintf("; its path holds another stream now (id %s), whose offsets started over", now)
	}
	return &itx.Error{Code: itx.ENotFound, Message: msg}
}

// add keeps a delivered batch within maxBuffered events and maxBufferedBytes (one event is
// always kept when none is held, whatever its size).
func (k *eventSink) add(events []itx.Event) {
	k.mu.Lock()
	defer k.mu.Unlock()
	fits := func(e *itx.Event) bool {
		return len(k.events) == 0 || len(k.events) < maxBuffered && k.bytes+e.Size() <= maxBufferedBytes
	}
	if k.keepOldest {
		// Once full, nothing more is kept, even when the tail has taken some: an event kept
		// after a discarded one would leave a gap.
		kept := 0
		for i := range events {
			if k.full || !fits(&events[i]) {
				k.full = true
				break
			}
			k.events = append(k.events, events[i])
			k.bytes += events[i].Size()
			kept++
		}
		k.dropped += len(events) - kept
		return
	}
	for i := range events {
		k.events = append(k.events, events[i])
		k.bytes += events[i].Size()
	}
	over := 0
	for len(k.events)-over > 1 && (len(k.events)-over > maxBuffered || k.bytes > maxBufferedBytes) {
		k.bytes -= k.events[over].Size()
		over++
	}
	if over > 0 {
		k.events = append([]itx.Event(nil), k.events[over:]...)
		k.dropped += over
	}
}

func (k *eventSink) Closed(ctx context.Context, call schema.EventSink_closed) error {
	reason := &itx.Error{Code: itx.ECancelled, Message: "closed"}
	if r, err := call.Args().Reason(); err == nil {
		reason.Code = itx.Code(r.Code().String())
		reason.Message, _ = r.Message_()
	}
	k.mu.Lock()
	if !k.refused {
		k.closed, k.why = reason, call.Args().Why().String()
	}
	k.mu.Unlock()
	k.signal()
	return nil
}

// Shutdown runs once itxd dropped the sink: after closed (which said why), or when the RPC
// session ended without a word (itxd killed, the network gone): the connection is over then,
// and take() says so at once instead of waiting out its timeout.
func (k *eventSink) Shutdown() {
	k.closedBy(&itx.Error{Code: itx.EUnavailable, Message: "connectionLost: the connection to itxd ended"}, schema.CloseReason_connectionLost.String())
}

// closedBy records why the connection closed, unless the server said so first.
func (k *eventSink) closedBy(reason *itx.Error, why string) {
	k.mu.Lock()
	if k.closed == nil {
		k.closed, k.why = reason, why
	}
	k.mu.Unlock()
	k.signal()
}

// take returns and forgets what arrived since the last take.
// State takes the stream's live-state frames; the REPL's connections ask for noState by
// default, and .watch uses liveState, so they are accepted and dropped here.
func (k *eventSink) State(ctx context.Context, call schema.EventSink_state) error { return nil }

// closedWhy is the CloseReason the server closed the connection with, "" while it is open.
func (k *eventSink) closedWhy() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.why
}

func (k *eventSink) take() (events []itx.Event, dropped int, closed *itx.Error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	events, dropped, closed = k.events, k.dropped, k.closed
	k.events, k.dropped, k.bytes = nil, 0, 0
	return events, dropped, closed
}

// held is how many events the sink holds unread, and whether the server closed the connection.
func (k *eventSink) held() (n int, closed bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.events), k.closed != nil
}

// waitHeld is take's and patches' wait. It reads (min?, timeoutMs?) from args: with neither it
// returns at once; with either it waits until held reports min items (1 when only timeoutMs is
// given; at most limit, what the view can hold) or done (closed, ended, replaced), at most
// timeoutMs (0 or none: itx.DefaultWaitTimeout), and throws deadlineExceeded saying how many
// arrived (they stay held), or the evaluation's end (Ctrl-C). wake is signalled on every change.
func (s *Session) waitHeld(what, items string, args []goja.Value, limit int, wake <-chan struct{}, held func() (n int, done bool)) {
	o, err := s.params(what, args, []string{"min", "timeoutMs"}, "min", "timeoutMs")
	if err != nil {
		panic(s.throw(err))
	}
	least, ms := o.uint("min"), o.uint("timeoutMs")
	if least > int64(limit) {
		o.fail("min", "at most %d (what it holds unread), got %d", limit, least)
	}
	if err := o.err(); err != nil {
		panic(s.throw(err))
	}
	if least == 0 && o.has("timeoutMs") {
		least = 1
	}
	if least == 0 {
		return
	}
	timeout := msDuration(ms)
	if timeout == 0 {
		timeout = itx.DefaultWaitTimeout
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	ctx := s.ctx()
	for {
		n, done := held()
		if done || int64(n) >= least {
			return
		}
		select {
		case <-wake:
		case <-ctx.Done():
			panic(s.throw(ctx.Err()))
		case <-t.C:
			if n, done := held(); !done && int64(n) < least {
				panic(s.throw(itx.Errorf(itx.EDeadlineExceeded, "%s: %d of %d %s arrived within %s (they stay for the next call)", what, n, least, items, timeout)))
			}
		}
	}
}

// liveConnection is a connection opened from itx.
type liveConnection struct {
	s    *Session
	conn schema.Connection
	sink *eventSink
	once sync.Once
	// released is set once the connection is closed or released (with the session, or when
	// a reconnect replaced the connection to itxd it lived on): calls on it answer
	// failedPrecondition instead of reaching a released client.
	released atomic.Bool
	// stream and key are the capability path of the stream it was opened on and the key it
	// was opened under ("" when the server chose one): another open under the key replaces it.
	stream, key string
}

func (c *liveConnection) release() {
	c.once.Do(func() {
		c.released.Store(true)
		c.conn.Release()
		// Let go with the session, or a reconnect to itxd, without a word from itxd: take()
		// says it is over (a loop over take() answered {events: []} at once, again and again,
		// never learning the connection was gone).
		c.sink.closedBy(&itx.Error{Code: itx.EUnavailable, Message: "connectionLost: the connection to itxd was replaced (the session reconnected or ended)"}, schema.CloseReason_connectionLost.String())
	})
}

// errConnectionClosed answers a call on a connection closed or released before.
var errConnectionClosed = itx.Errorf(itx.EFailedPrecondition, "the connection is closed")

// close asks the server to close the connection, then releases it. Closing it again does
// nothing.
func (c *liveConnection) close(ctx context.Context, reason string) error {
	if c.released.Load() {
		return nil
	}
	defer c.s.forget(c)
	fut, release := c.conn.Close(ctx, func(p schema.Connection_close_Params) error { return p.SetReason(reason) })
	defer release()
	if _, err := fut.Struct(); err != nil {
		return err
	}
	// The server tells the sink why (closedByClient) with a call of its own, which may come
	// after this answer: a take() right after close() says closed all the same.
	msg := "closedByClient"
	if reason != "" {
		msg += ": " + reason // close() without a reason said "closedByClient: "
	}
	c.sink.closedBy(&itx.Error{Code: itx.ECancelled, Message: msg}, schema.CloseReason_closedByClient.String())
	return nil
}

// replaced marks the connections of this session that conn, just opened, replaced: those opened
// under its key on the same stream, which itxd closed before it answered the open. The server
// tells their sinks why (replaced) with a call of its own, which may come after that answer: a
// take() on one right after the open says closed all the same.
func (s *Session) replaced(conn *liveConnection) {
	if conn.key == "" {
		return
	}
	s.liveMu.Lock()
	defer s.liveMu.Unlock()
	for h := range s.live {
		if old, ok := h.(*liveConnection); ok && old != conn && old.stream == conn.stream && old.key == conn.key {
			old.sink.closedBy(&itx.Error{Code: itx.EFailedPrecondition, Message: "replaced: a new connection opened under the same key"}, schema.CloseReason_replaced.String())
		}
	}
}

// openConnection opens a connection on the stream at p with a buffering sink.
// "state" is the seed's spelling of the live-state switch (state: false), "noState" the schema's;
// "filter" is the TypeScript surface's ({eventTypes}: the types).
var connectionKeys = []string{"after", "types", "maxDeliveryEvents", "maxDeliveryBytes", "noState", "state", "openedBy", "key", "includeEphemeral", "expectedStreamId", "filter"}

func (s *Session) openConnection(ctx context.Context, stream capnp.Client, v goja.Value) (*liveConnection, error) {
	return s.openConnectionTo(ctx, stream, v, newEventSink())
}

// openConnectionTo opens a connection delivering into sink.
func (s *Session) openConnectionTo(ctx context.Context, stream capnp.Client, v goja.Value, sink *eventSink) (*liveConnection, error) {
	o, err := s.optsSpelled("openConnection", v, connectionSpellings, connectionKeys...)
	if err != nil {
		return nil, err
	}
	after, types := o.uint("after"), o.strings("types")
	maxEvents, maxBytes := o.uint("maxDeliveryEvents"), o.uint("maxDeliveryBytes")
	noState, openedBy := o.bool("noState"), ""
	if v, ok := o.get("openedBy").(*goja.Object); ok && v.ClassName() == "Object" {
		// The TypeScript surface's openedBy: {description}, of which this server keeps the text.
		ob, err := s.opts("openConnection: openedBy", v, "description")
		if err != nil {
			return nil, err
		}
		if openedBy = ob.str("description"); openedBy == "" && ob.err() == nil {
			ob.fail("description", "is required in an openedBy object (or give openedBy as a string)")
		}
		if err := ob.err(); err != nil {
			return nil, err
		}
	} else {
		openedBy = o.str("openedBy")
	}
	key, includeEphemeral := o.str("key"), o.bool("includeEphemeral")
	expectedStreamID := o.str("expectedStreamId")
	if f := o.get("filter"); f != nil {
		// The TypeScript surface's filter: {eventTypes, jsonataCondition}. A connection here
		// filters by type alone: a condition is refused rather than dropped (every event would
		// arrive as if it matched).
		fo, err := s.opts("openConnection: filter", f, "eventTypes", "jsonataCondition")
		if err != nil {
			return nil, err
		}
		if fo.has("jsonataCondition") {
			return nil, itx.Errorf(itx.EInvalid, "openConnection: filter: jsonataCondition: a connection filters by type only (eventTypes); a subscription's filterCondition or waitForEvent's where evaluates JSONata")
		}
		if fo.has("eventTypes") {
			if o.has("types") {
				return nil, itx.Errorf(itx.EInvalid, "openConnection: filter.eventTypes and %s are one option; give one", o.given("types"))
			}
			types = fo.strings("eventTypes")
		}
		if err := fo.err(); err != nil {
			return nil, err
		}
	}
	if o.get("state") != nil {
		if state := o.bool("state"); o.get("noState") != nil && state == noState {
			o.fail("state", "state and noState say the opposite; give one")
		} else {
			noState = !state
		}
	}
	if err := o.err(); err != nil {
		return nil, err
	}
	if openedBy == "" {
		openedBy = "itx"
	}
	fut, release := schema.Stream(stream).OpenConnection(ctx, func(p schema.Stream_openConnection_Params) error {
		opts, err := p.NewOptions()
		if err != nil {
			return err
		}
		opts.SetAfter(uint64(after))
		// Past 32 bits a value is sent as the largest, which the server refuses as out of
		// range, instead of wrapping into another.
		opts.SetMaxDeliveryEvents(uint32(min(maxEvents, math.MaxUint32)))
		opts.SetMaxDeliveryBytes(uint32(min(maxBytes, math.MaxUint32)))
		opts.SetNoState(noState)
		opts.SetIncludeEphemeral(includeEphemeral)
		if err := opts.SetKey(key); err != nil {
			return err
		}
		if err := opts.SetOpenedBy(openedBy); err != nil {
			return err
		}
		if err := opts.SetExpectedStreamId(expectedStreamID); err != nil {
			return err
		}
		if err := wire.SetTextList(types, opts.NewTypes); err != nil {
			return err
		}
		return p.SetSink(schema.EventSink_ServerToClient(sink))
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return nil, err
	}
	c := &liveConnection{s: s, conn: res.Connection().AddRef(), sink: sink}
	s.remember(c)
	return c, nil
}

func streamOpenConnection(ctx context.Context, s *Session, c capnp.Client, p capPath, args []goja.Value) (any, error) {
	o, err := s.paramsSpelled("openConnection", args, []string{"after"}, connectionSpellings, connectionKeys...)
	if err != nil {
		return nil, err
	}
	conn, err := s.openConnection(ctx, c, o.obj)
	if err != nil {
		return nil, err
	}
	conn.stream, conn.key = p.key(), o.str("key")
	s.replaced(conn)
	vm := s.vm
	obj := vm.NewObject()
	label := "[Connection " + p.steps[len(p.steps)-1].arg + "]"
	s.setLabel(obj, label)
	obj.Set("take", s.method("take", func(call goja.FunctionCall) goja.Value {
		s.waitHeld("Connection.take", "events", call.Arguments, maxBuffered, conn.sink.wake, func() (int, bool) {
			n, closed := conn.sink.held()
			return n, closed || conn.released.Load()
		})
		events, dropped, closed := conn.sink.take()
		out := struct {
			Events  []eventJS `json:"events"`
			Dropped int       `json:"dropped,omitempty"`
			Closed  *Failure  `json:"closed,omitempty"`
		}{Events: eventsJS(events), Dropped: dropped}
		if closed != nil {
			out.Closed = &Failure{Code: string(closed.Code), Message: closed.Message}
		}
		return s.toJS(out)
	}))
	obj.Set("ping", s.method("ping", s.noArgs("Connection.ping", func(goja.FunctionCall) goja.Value {
		if conn.released.Load() {
			panic(s.throw(errConnectionClosed))
		}
		fut, release := conn.conn.Ping(s.ctx(), nil)
		defer release()
		res, err := fut.Struct()
		if err != nil {
			panic(s.throw(err))
		}
		return s.toJS(struct {
			HeadOffset      int64 `json:"headOffset"`
			DeliveredOffset int64 `json:"deliveredOffset"`
		}{int64(res.HeadOffset()), int64(res.DeliveredOffset())})
	})))
	obj.Set("key", s.method("key", s.noArgs("Connection.key", func(goja.FunctionCall) goja.Value {
		if conn.released.Load() {
			panic(s.throw(errConnectionClosed))
		}
		fut, release := conn.conn.Key(s.ctx(), nil)
		defer release()
		res, err := fut.Struct()
		if err != nil {
			panic(s.throw(err))
		}
		key, err := res.Key()
		if err != nil {
			panic(s.throw(err))
		}
		return vm.ToValue(key)
	})))
	obj.Set("close", s.method("close", func(call goja.FunctionCall) goja.Value {
		for _, extra := range call.Arguments[min(1, len(call.Arguments)):] {
			if !isAbsent(extra) {
				panic(s.throw(itx.Errorf(itx.EInvalid, "Connection.close: takes a reason, got %s after it", describeValue(extra))))
			}
		}
		reason, ok := exportString(call.Argument(0))
		if !ok && !isAbsent(call.Argument(0)) {
			panic(s.throw(itx.Errorf(itx.EInvalid, "Connection.close: reason: expected a string, got %s", describeValue(call.Argument(0)))))
		}
		if err := conn.close(s.ctx(), reason); err != nil {
			panic(s.throw(err))
		}
		return goja.Undefined()
	}))
	return obj, nil
}

// liveView is the LiveSubscriber served for a live-state registration: it keeps the latest
// snapshot and the patches since.
type liveView struct {
	mu       sync.Mutex
	revision uint64          // the latest revision, snapshot or patch
	snapshot uint64          // the revision of the latest snapshot (see fold)
	state    json.RawMessage // the latest snapshot's state, with any folded patches applied
	patches  []patchJS
	dropped  int
	// maxPatches bounds the patches held unread (maxBuffered; lower in tests).
	maxPatches int
	wake       chan struct{}
	// first is closed when the first snapshot has arrived.
	first     chan struct{}
	firstOnce sync.Once
	// ended is why the server ended the view ("" while it runs): its closed call's message;
	// endedWhy is its CloseReason ("serverShuttingDown", ...), to switch on, and endedCode the
	// error code it came with (notFound for streamRemoved, ...).
	ended, endedWhy string
	endedCode       itx.Code

	s        *Session
	handle   schema.Handle
	once     sync.Once
	released atomic.Bool // cancelled, or released with the session or a replaced connection
	// cancelled is set as cancel() starts: itxd drops the subscriber as it answers, and that
	// (Shutdown) is then the cancel's doing, not a lost connection.
	cancelled atomic.Bool

	// times: the document is a stream's live state, whose times (epoch ms on the wire) are
	// shown as ISO-8601 strings, as itx shows every time. A processor's state is the
	// processor's own data and is shown as it is.
	times bool
}

type patchJS struct {
	Revision uint64          `json:"revision"`
	Ops      json.RawMessage `json:"ops"`
}

func (v *liveView) signal() {
	select {
	case v.wake <- struct{}{}:
	default:
	}
}

func (v *liveView) Snapshot(ctx context.Context, call schema.LiveSubscriber_snapshot) error {
	state, err := call.Args().State()
	if err != nil {
		return err
	}
	raw := rawJSON(state)
	if v.times {
		raw = isoTimes(raw, "")
	}
	v.mu.Lock()
	v.revision, v.state, v.patches = call.Args().Revision(), raw, nil
	v.snapshot = v.revision
	v.mu.Unlock()
	v.firstOnce.Do(func() { close(v.first) })
	v.signal()
	return nil
}

// firstSnapshotWait bounds how long liveState() waits for the server's first snapshot (the
// server sends it as soon as it has computed the document, normally at once).
const firstSnapshotWait = 10 * time.Second

// waitFirstSnapshot waits until the first snapshot has arrived, so that snapshot() right after
// liveState() shows the state, not an empty revision 0. If it does not come in time (or ctx
// ends first: Ctrl-C) the registration is cancelled and the error says why.
func (v *liveView) waitFirstSnapshot(ctx context.Context) error {
	t := time.NewTimer(firstSnapshotWait)
	defer t.Stop()
	var err error
	select {
	case <-v.first:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-t.C:
		err = itx.Errorf(itx.EDeadlineExceeded, "liveState: no snapshot arrived within %s", firstSnapshotWait)
	}
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v.cancel(cctx)
	return err
}

// Closed records why the server ended the view (the last call it makes).
func (v *liveView) Closed(ctx context.Context, call schema.LiveSubscriber_closed) error {
	reason, err := call.Args().Reason()
	if err != nil {
		return err
	}
	msg, _ := reason.Message_()
	v.end(msg, call.Args().Why().String(), itx.Code(reason.Code().String()))
	return nil
}

// Shutdown runs once itxd dropped the subscriber: after closed (which said why), after the
// view was cancelled, or when the RPC session ended without a word (itxd killed, the network
// gone), which ends the view as connectionLost: a script waiting in patches() hears it then
// instead of waiting out its timeout, and .watch goes on on a new view.
func (v *liveView) Shutdown() {
	if v.released.Load() || v.cancelled.Load() {
		return
	}
	v.end("connectionLost: the connection to itxd ended", schema.CloseReason_connectionLost.String(), itx.EUnavailable)
}

// end records the first reason the view ended.
func (v *liveView) end(msg, why string, code itx.Code) {
	v.mu.Lock()
	if v.ended == "" && v.endedWhy == "" {
		if code == "" {
			code = itx.EUnavailable
		}
		v.ended, v.endedWhy, v.endedCode = msg, why, code
	}
	v.mu.Unlock()
	v.firstOnce.Do(func() { close(v.first) })
	v.signal()
}

// endedErr is why the view receives nothing more: the server ended it (its closed call's
// code and message), or this process cancelled it or let it go (with the session, or a
// reconnect); nil while it runs.
func (v *liveView) endedErr() *itx.Error {
	v.mu.Lock()
	defer v.mu.Unlock()
	switch {
	case v.ended != "" || v.endedWhy != "":
		return &itx.Error{Code: v.endedCode, Message: "the live view ended: " + v.ended}
	case v.released.Load() || v.cancelled.Load():
		return &itx.Error{Code: itx.EFailedPrecondition, Message: "the live view was cancelled (or its connection to itxd replaced)"}
	}
	return nil
}

// endedWith is why the server ended the view, "" while it runs: its message and its
// CloseReason.
func (v *liveView) endedWith() (message, why string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.ended, v.endedWhy
}

func (v *liveView) Patch(ctx context.Context, call schema.LiveSubscriber_patch) error {
	ops, err := call.Args().Ops()
	if err != nil {
		return err
	}
	raw := rawJSON(ops)
	if v.times {
		raw = isoTimesInPatch(raw)
	}
	v.mu.Lock()
	v.revision = call.Args().Revision()
	v.patches = append(v.patches, patchJS{Revision: v.revision, Ops: raw})
	if len(v.patches) > v.maxPatches {
		v.fold(len(v.patches) - v.maxPatches/2)
	}
	v.mu.Unlock()
	v.signal()
	return nil
}

// fold applies the oldest n patches to the snapshot, which takes the last one's revision, so a
// view read rarely (a script, .watch writing into a paused pipe) holds a bounded number of
// patches and its snapshot and the patches after it still make the current state, without a
// gap. Should they not apply (the server computed them from one document to the next, but the
// patch library cannot replace a document that is a bare number or string), they are dropped
// and counted instead, as before there was folding. Called with v.mu held.
func (v *liveView) fold(n int) {
	folded := v.patches[:n]
	ops := []json.RawMessage{}
	var err error
	for _, p := range folded {
		var some []json.RawMessage
		if err = json.Unmarshal(p.Ops, &some); err != nil {
			break
		}
		ops = append(ops, some...)
	}
	var state json.RawMessage
	if err == nil && v.state != nil {
		state, err = applyOps(v.state, ops)
	}
	if err == nil && state != nil {
		v.state, v.snapshot = state, folded[n-1].Revision
	} else {
		v.dropped += n
	}
	v.patches = append([]patchJS(nil), v.patches[n:]...)
}

// applyOps applies RFC 6902 operations to a JSON document.
func applyOps(doc json.RawMessage, ops []json.RawMessage) (json.RawMessage, error) {
	raw, err := json.Marshal(ops)
	if err != nil {
		return nil, err
	}
	patch, err := jsonpatch.DecodePatch(raw)
	if err != nil {
		return nil, err
	}
	return patch.Apply(doc)
}

func (v *liveView) release() {
	v.once.Do(func() {
		v.released.Store(true)
		if v.handle.IsValid() {
			v.handle.Release()
		}
	})
}

// cancel ends the registration on the server, then releases it. Cancelling it again does
// nothing.
func (v *liveView) cancel(ctx context.Context) error {
	if v.released.Load() {
		return nil
	}
	v.cancelled.Store(true)
	defer v.s.forget(v)
	fut, release := v.handle.Cancel(ctx, nil)
	defer release()
	_, err := fut.Struct()
	return err
}

// takePatches returns and forgets the patches since the last call, with the latest snapshot
// (its revision and state).
func (v *liveView) takePatches() (snapshot uint64, state json.RawMessage, patches []patchJS, dropped int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	snapshot, state, patches, dropped = v.snapshot, v.state, v.patches, v.dropped
	v.patches, v.dropped = nil, 0
	return
}

// readPatches returns and forgets the patches since the last call, as a script's patches()
// reads them, and applies them to the snapshot, which takes the last one's revision: what was
// read is part of the view's state, so snapshot() afterwards shows the state through the patches
// read (not the older snapshot they followed), and snapshot() with the patches() after it always
// make the current state. (.watch reads with takePatches: it prints each snapshot once.) Should
// they not apply, the snapshot stays as it was.
func (v *liveView) readPatches() []patchJS {
	v.mu.Lock()
	defer v.mu.Unlock()
	patches := v.patches
	v.patches, v.dropped = nil, 0
	if len(patches) == 0 || v.state == nil {
		return patches
	}
	ops := []json.RawMessage{}
	for _, p := range patches {
		var some []json.RawMessage
		if err := json.Unmarshal(p.Ops, &some); err != nil {
			return patches
		}
		ops = append(ops, some...)
	}
	if state, err := applyOps(v.state, ops); err == nil {
		v.state, v.snapshot = state, patches[len(patches)-1].Revision
	}
	return patches
}

// subscribeLive registers a live view through register, which sends the liveState call with
// the subscriber capability it is given. times says the document is a stream's live state.
func (s *Session) subscribeLive(times bool, register func(schema.LiveSubscriber) (schema.Handle, error)) (*liveView, error) {
	v := &liveView{s: s, wake: make(chan struct{}, 1), first: make(chan struct{}), times: times, maxPatches: maxBuffered}
	h, err := register(schema.LiveSubscriber_ServerToClient(v))
	if err != nil {
		return nil, err
	}
	v.handle = h
	s.remember(v)
	return v, nil
}

func streamLiveView(ctx context.Context, s *Session, c capnp.Client) (*liveView, error) {
	return s.subscribeLive(true, func(sub schema.LiveSubscriber) (schema.Handle, error) {
		fut, release := schema.Stream(c).LiveState(ctx, func(p schema.Stream_liveState_Params) error { return p.SetSubscriber(sub) })
		defer release()
		res, err := fut.Struct()
		if err != nil {
			return schema.Handle{}, err
		}
		return res.Handle().AddRef(), nil
	})
}

func streamLiveState(ctx context.Context, s *Session, c capnp.Client, p capPath, _ []goja.Value) (any, error) {
	v, err := streamLiveView(ctx, s, c)
	if err != nil {
		return nil, err
	}
	if err := v.waitFirstSnapshot(ctx); err != nil {
		return nil, err
	}
	return s.liveObject(v, "[LiveState "+p.steps[len(p.steps)-1].arg+"]"), nil
}

// processorLiveView registers a live view on the processor capability c.
func processorLiveView(ctx context.Context, s *Session, c capnp.Client) (*liveView, error) {
	return s.subscribeLive(false, func(sub schema.LiveSubscriber) (schema.Handle, error) {
		fut, release := schema.Processor(c).LiveState(ctx, func(p schema.Processor_liveState_Params) error { return p.SetSubscriber(sub) })
		defer release()
		res, err := fut.Struct()
		if err != nil {
			return schema.Handle{}, err
		}
		return res.Handle().AddRef(), nil
	})
}

func processorLiveState(ctx context.Context, s *Session, c capnp.Client, p capPath, _ []goja.Value) (any, error) {
	v, err := processorLiveView(ctx, s, c)
	if err != nil {
		return nil, err
	}
	if err := v.waitFirstSnapshot(ctx); err != nil {
		return nil, err
	}
	// [LiveState Processor /a agent], not [LiveState [Processor /a agent]].
	return s.liveObject(v, "[LiveState "+strings.TrimSuffix(strings.TrimPrefix(p.label(), "["), "]")+"]"), nil
}

func (s *Session) liveObject(v *liveView, label string) *goja.Object {
	vm := s.vm
	obj := vm.NewObject()
	s.setLabel(obj, label)
	obj.Set("snapshot", s.method("snapshot", s.noArgs("LiveView.snapshot", func(goja.FunctionCall) goja.Value {
		var closed *Failure
		if e := v.endedErr(); e != nil {
			closed = &Failure{Code: string(e.Code), Message: e.Message}
		}
		v.mu.Lock()
		defer v.mu.Unlock()
		// closed, as a connection's take() says it: the view receives nothing more, and why.
		return s.toJS(struct {
			Revision uint64          `json:"revision"`
			State    json.RawMessage `json:"state"`
			Closed   *Failure        `json:"closed,omitempty"`
		}{v.snapshot, v.state, closed})
	})))
	obj.Set("patches", s.method("patches", func(call goja.FunctionCall) goja.Value {
		v.mu.Lock()
		snapshot := v.snapshot
		v.mu.Unlock()
		// A fold keeps half the bound unread, so a min up to that is always reached.
		s.waitHeld("LiveView.patches", "patches", call.Arguments, v.maxPatches/2, v.wake, func() (int, bool) {
			v.mu.Lock()
			defer v.mu.Unlock()
			// A fresh snapshot replaces the patches held: the caller reads snapshot().
			return len(v.patches), v.snapshot != snapshot || v.ended != "" || v.endedWhy != "" || v.released.Load()
		})
		patches := v.readPatches()
		if len(patches) == 0 {
			// Nothing will come: say why rather than answer [] at once, again and again (a
			// script's loop over patches() would spin without ever learning the view ended).
			if e := v.endedErr(); e != nil {
				panic(s.throw(e))
			}
			patches = []patchJS{}
		}
		return s.toJS(patches)
	}))
	obj.Set("cancel", s.method("cancel", s.noArgs("LiveView.cancel", func(goja.FunctionCall) goja.Value {
		if err := v.cancel(s.ctx()); err != nil {
			panic(s.throw(err))
		}
		return goja.Undefined()
	})))
	return obj
}

// noArgs refuses the arguments of a method that takes none, as binding.run does for the
// capabilities' methods.
func (s *Session) noArgs(what string, fn func(goja.FunctionCall) goja.Value) func(goja.FunctionCall) goja.Value {
	return func(call goja.FunctionCall) goja.Value {
		for _, a := range call.Arguments {
			if !isAbsent(a) {
				panic(s.throw(itx.Errorf(itx.EInvalid, "%s: takes no arguments, got %s", what, describeValue(a))))
			}
		}
		return fn(call)
	}
}

func (s *Session) remember(h liveHandle) {
	s.liveMu.Lock()
	s.live[h] = struct{}{}
	s.liveMu.Unlock()
}

// forget releases h and stops tracking it.
func (s *Session) forget(h liveHandle) {
	s.liveMu.Lock()
	delete(s.live, h)
	s.liveMu.Unlock()
	h.release()
}

// isoTimes rewrites, in a stream's live state, every number under a key ending in "At"
// (lastAppendAt, nextAttemptAt) as an ISO-8601 time; key order and every other value stay as
// sent (offsets beyond 2^53 too). key is the key the document itself sits under: "" for a
// snapshot, the last segment of a patch operation's path for its value. The rewrite is the
// same for the snapshot and the patches, so the patches still apply to the snapshot.
func isoTimes(raw json.RawMessage, key string) json.RawMessage {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	type level struct {
		object bool
		n      int    // values written at this level
		key    string // in an object: the key of the value that comes next
		keyed  bool   // in an object: that key was read
	}
	var out bytes.Buffer
	var stack []level
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return out.Bytes()
		}
		if err != nil {
			return raw
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			out.WriteByte(byte(d))
			stack = stack[:len(stack)-1]
			continue
		}
		under := key
		if len(stack) > 0 {
			top := &stack[len(stack)-1]
			if top.object && !top.keyed {
				if top.n > 0 {
					out.WriteByte(',')
				}
				k, _ := tok.(string)
				out.Write(marshalText(k))
				out.WriteByte(':')
				top.key, top.keyed = k, true
				continue
			}
			if !top.object && top.n > 0 {
				out.WriteByte(',')
			}
			top.n++
			under = ""
			if top.object {
				under, top.keyed = top.key, false
			}
		}
		switch v := tok.(type) {
		case json.Delim:
			out.WriteByte(byte(v))
			stack = append(stack, level{object: v == '{'})
		case json.Number:
			ms, err := v.Int64()
			if strings.HasSuffix(under, "At") && err == nil {
				out.Write(marshalText(msTime(ms)))
			} else {
				out.WriteString(v.String())
			}
		default:
			out.Write(marshalText(v))
		}
	}
}

// marshalText encodes v as JSON without escaping <, > and & (an error message stays readable).
func marshalText(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// isoTimesInPatch rewrites the values of an RFC 6902 patch of a stream's live state as
// isoTimes does its snapshot.
func isoTimesInPatch(raw json.RawMessage) json.RawMessage {
	var ops []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &ops); err != nil {
		return raw
	}
	for _, op := range ops {
		value, ok := op["value"]
		if !ok {
			continue
		}
		var path string
		_ = json.Unmarshal(op["path"], &path)
		key := path[strings.LastIndexByte(path, '/')+1:]
		key = strings.NewReplacer("~1", "/", "~0", "~").Replace(key)
		op["value"] = isoTimes(value, key)
	}
	return marshalText(ops)
}
