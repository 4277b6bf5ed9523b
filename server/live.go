package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/itx-dev/itx"
	"github.com/wI2L/jsondiff"
)

// LiveFrame is one frame of a live-state projection: a snapshot (JSON is the whole document) or
// a patch (JSON is an RFC 6902 array turning revision-1 into Revision). A subscriber that sees a
// patch whose revision is not its last plus one has missed one and resubscribes.
type LiveFrame struct {
	Revision uint64
	Snapshot bool
	JSON     []byte
}

// LiveSink receives frames (the capability layer adapts a LiveSubscriber capability).
type LiveSink interface {
	Send(ctx context.Context, frame LiveFrame) error
}

// LiveCloser is a LiveSink that hears why the server ended its view (not after the client's own
// cancel): the server shutting down, the stream removed, a processor's subscription removed.
type LiveCloser interface {
	Closed(ctx context.Context, reason CloseReason, message string)
}

// LiveEnder is a LiveSink told once its view has ended, whoever ended it (the server, after
// its closed notice, or the client's cancel): what holds the view's place (a login's bound,
// the subscriber's reference) is let go then, not only when the client cancels.
type LiveEnder interface {
	Ended()
}

// The stream's live state document and its rows (defined in package itx, where clients decode
// them too).
type (
	LiveStreamState     = itx.LiveStreamState
	LiveSubscriptionRow = itx.LiveSubscriptionRow
	LiveReaderRow       = itx.LiveReaderRow
	LiveConnectionRow   = itx.LiveConnectionRow
)

// MaxLiveConnectionRows bounds the connections a stream's live state lists.
const MaxLiveConnectionRows = itx.MaxLiveConnectionRows

// liveEngine keeps one stream's live state: it projects what the actor published (and the
// connections' positions) into a document, and when the document changes it takes a new
// revision with the RFC 6902 patch from the last one. It only reads; it never writes state.
// Memory is one document and one patch, whatever the number or speed of subscribers.
type liveEngine struct {
	a       *actor
	project func() any // the document: the stream's live state, or one processor's
	dirty   chan struct{}
	// pokes counts the changes told (poke); the document reflects the first seen of them. A
	// subscriber's first frame waits for every change told before it attached, so its snapshot
	// shows at least what was acknowledged before it asked (a reader registered, a subscription
	// configured), not a document the engine had not yet recomputed.
	pokes atomic.Uint64
	// ctx is the engine's life: the stream's load, or, for a processor's, its subscription's
	// within it (stop ends it when the subscription goes). Its subscribers are detached with it.
	ctx    context.Context
	stop   context.CancelFunc
	exited chan struct{} // closed when run has returned
	// ended says why the engine was stopped, for its subscribers' notice (nil: the stream's
	// load ended, a shutdown or a removal; see endReason).
	ended atomic.Pointer[liveEnd]

	mu      sync.Mutex
	rev     uint64
	doc     []byte
	patch   []byte // revision-1 -> revision
	seen    uint64 // the pokes the document reflects
	changed chan struct{}
}

// liveSubscriber is one attached LiveSink with its pusher.
type liveSubscriber struct {
	engine   *liveEngine // a processor's; nil: the stream's
	sink     LiveSink
	ctx      context.Context
	cancel   context.CancelFunc
	done     chan struct{}
	byClient atomic.Bool // the client cancelled it: no notice
	after    uint64      // the engine's pokes when it attached: its first frame reflects them
}

// liveEnd is why a live engine stopped.
type liveEnd struct {
	reason  CloseReason
	message string
}

// endReason is why the engine's subscribers are being detached: what stopped it, or else the
// stream's end (a project delete, a shutdown).
func (e *liveEngine) endReason() liveEnd {
	if end := e.ended.Load(); end != nil {
		return *end
	}
	if e.a.deleted.Load() {
		return liveEnd{CloseStreamRemoved, e.a.deletedReason()}
	}
	return liveEnd{CloseShuttingDown, "the server is shutting down"}
}

// liveEngine returns the stream's engine, starting it on first use. Actor goroutine only.
func (a *actor) liveEngine() *liveEngine {
	if e := a.liveP.Load(); e != nil {
		return e
	}
	e := newLiveEngine(a, func() any { return a.liveState() })
	a.liveP.Store(e)
	go e.run()
	e.poke()
	return e
}

func newLiveEngine(a *actor, project func() any) *liveEngine {
	e := &liveEngine{a: a, project: project, dirty: make(chan struct{}, 1), changed: make(chan struct{}), exited: make(chan struct{})}
	e.ctx, e.stop = context.WithCancel(a.dctx)
	return e
}

// liveDirty tells the engine (if any) that the state may have changed. Never blocks.
func (a *actor) liveDirty() {
	if e := a.liveP.Load(); e != nil {
		e.poke()
	}
	if m := a.procLiveP.Load(); m != nil {
		for _, e := range *m {
			e.poke()
		}
	}
}

func (e *liveEngine) poke() {
	e.pokes.Add(1)
	select {
	case e.dirty <- struct{}{}:
	default:
	}
}

func (e *liveEngine) attach(s *liveSubscriber) {
	s.after = e.pokes.Load()
	e.a.srv.metrics.LiveSubscribers.Inc()
	go e.push(s)
}

func (e *liveEngine) detach(s *liveSubscriber) { s.cancel() }

// run recomputes the document whenever it is told the state may have changed; a burst of
// changes costs one recomputation (the dirty signal holds one).
func (e *liveEngine) run() {
	defer close(e.exited)
	for {
		select {
		case <-e.dirty:
		case <-e.ctx.Done():
			return
		}
		seen := e.pokes.Load() // before the projection: it reads a state at least this new
		doc, err := json.Marshal(e.project())
		e.mu.Lock()
		// Subscribers waiting for this many changes may go on, whether the document changed
		// or not.
		wake := seen > e.seen
		e.seen = max(e.seen, seen)
		if err == nil && string(doc) != string(e.doc) {
			var patch []byte
			if e.doc != nil {
				if p, err := jsondiff.CompareJSON(e.doc, doc); err == nil {
					patch, _ = json.Marshal(p)
				}
			}
			e.rev++
			e.doc, e.patch = doc, patch
			wake = true
		}
		if wake {
			close(e.changed)
			e.changed = make(chan struct{})
		}
		e.mu.Unlock()
	}
}

// push sends one subscriber the snapshot, then a patch per revision while it keeps up, or a
// fresh snapshot when it fell more than one revision behind: nothing queues for a slow one. A
// frame not accepted within the delivery timeout detaches it, and so does the engine's end.
func (e *liveEngine) push(s *liveSubscriber) {
	srv := e.a.srv
	// refused is the failure of a frame the subscriber answered with an exception: the view
	// ends, and the subscriber hears why (deliveryFailed), as when the server ends it.
	var refused error
	defer func() {
		if closer, ok := s.sink.(LiveCloser); ok && (e.ctx.Err() != nil || refused != nil) && !s.byClient.Load() {
			// The server ended the view: say why, within the delivery timeout (whoever is
			// shutting down does not wait longer for a listener).
			end := e.endReason()
			if refused != nil && e.ctx.Err() == nil {
				end = liveEnd{CloseDeliveryFailed, "the subscriber refused a frame: " + refused.Error()}
			}
			sendWithin(srv, context.Background(), func(ctx context.Context) error {
				closer.Closed(ctx, end.reason, end.message)
				return nil
			})
		}
		s.cancel()
		close(s.done)
		srv.metrics.LiveSubscribers.Dec()
	}()
	// A send ends with the subscriber's context (its client's cancel) or the engine's (the
	// server's end of it).
	sendCtx, stopSend := context.WithCancel(s.ctx)
	defer stopSend()
	defer context.AfterFunc(e.ctx, stopSend)()
	var sent uint64
	for s.ctx.Err() == nil && e.ctx.Err() == nil {
		e.mu.Lock()
		rev, doc, patch, changed, seen := e.rev, e.doc, e.patch, e.changed, e.seen
		e.mu.Unlock()
		if rev == sent || rev == 0 || (sent == 0 && seen < s.after) {
			select {
			case <-changed:
			case <-s.ctx.Done():
			case <-e.ctx.Done():
			}
			continue
		}
		frame := LiveFrame{Revision: rev, Snapshot: true, JSON: doc}
		if sent != 0 && rev == sent+1 && patch != nil {
			frame = LiveFrame{Revision: rev, JSON: patch}
		}
		send := func(ctx context.Context) error { return s.sink.Send(ctx, frame) }
		if slow, ok := s.sink.(slowSink); ok {
			// A connection's state frames: not accepted in time closes the connection as a
			// slow consumer, as for its batches.
			if err := sendWithin(srv, sendCtx, send); err != nil {
				switch {
				case errors.Is(err, errNotAccepted):
					slow.slow()
				case sendCtx.Err() == nil:
					// Refused (or the client gone): the connection ends, as for a refused
					// batch. Left open, it went on delivering events with no state frame
					// ever again, and its client was never told.
					slow.refused(err)
				}
				return
			}
		} else if err := sendUntil(sendCtx, send); err != nil {
			// A LiveSubscriber that answers slowly is waited for (one frame in flight at a
			// time), then gets what changed meanwhile coalesced: the next revision's patch, or
			// a fresh snapshot when it is further behind. Only a failed call ends it, and a
			// subscriber that is still there hears why (not one whose client is gone).
			if sendCtx.Err() == nil && itx.ErrorCode(err) != itx.ECapabilityOffline {
				refused = err
			}
			return
		}
		sent = rev
	}
}

// slowSink is a sink that ends itself when a frame is not accepted within the delivery timeout
// (slow), or is refused (refused): a connection's state frames.
type slowSink interface {
	slow()
	refused(err error)
}

// sendUntil runs send until it answers or ctx ends it (without waiting for a send that is stuck
// writing).
func sendUntil(ctx context.Context, send func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- send(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// errNotAccepted is sendWithin's answer when the delivery timeout passed first.
var errNotAccepted = itx.Errorf(itx.EDeadlineExceeded, "not accepted within the delivery timeout")

// sendWithin runs send, giving up after the delivery timeout without waiting for a send that
// is stuck writing (connections' batches and live-state frames share it).
func sendWithin(srv *Server, ctx context.Context, send func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The timeout is armed before the send starts: a peer that has the call knows its timeout
	// runs. Armed after, a clock moved on once the call arrived (a test's) could pass it by.
	expired := make(chan struct{})
	t := srv.clock.AfterFunc(srv.cfg.DeliveryTimeout, func() { close(expired) })
	defer t.Stop()
	done := make(chan error, 1)
	go func() { done <- send(ctx) }()
	select {
	case err := <-done:
		return err
	case <-expired:
		return errNotAccepted
	case <-ctx.Done():
		return ctx.Err()
	}
}

// liveState projects what the actor last published.
func (a *actor) liveState() LiveStreamState {
	v := a.view()
	out := LiveStreamState{Path: a.ref.Path, StreamID: v.streamID, Head: v.head, LastAppendAt: v.info.lastAppendAt,
		Subscriptions: map[string]LiveSubscriptionRow{}, Readers: map[string]LiveReaderRow{}, Connections: map[string]LiveConnectionRow{}}
	if v.core != nil {
		for name, entry := range v.core.Subscriptions {
			r := v.rows[name]
			row := LiveSubscriptionRow{Kind: entry.Kind(), Status: r.Status, Confirmed: r.ConfirmedOffset,
				Lag: max(0, v.head-r.ConfirmedOffset), LastError: r.LastError, NextAttemptAt: r.NextAttemptAt, Attempt: r.Attempt}
			if entry.Config.ConfirmWindow > 0 {
				row.Delivered = max(r.DeliveredOffset, r.ConfirmedOffset)
			}
			out.Subscriptions[name] = row
		}
	}
	for name, r := range v.readers {
		out.Readers[name] = LiveReaderRow{Checkpoint: r.Checkpoint, Lag: max(0, v.head-r.Checkpoint)}
	}
	if conns := a.connList.Load(); conns != nil {
		out.ConnectionsOpen = conns.open
		for _, c := range conns.first {
			out.Connections[c.key] = LiveConnectionRow{OpenedBy: c.opts.OpenedBy, Delivered: c.delivered.Load()}
		}
	}
	return out
}

// publishedConns is what the live engine reads of a stream's connections: the first
// MaxLiveConnectionRows by key, and how many are open.
type publishedConns struct {
	first []*Connection
	open  int
}

// publishConns makes the connection registry visible to the live engine after a change at
// index changed of connOrder: a copy of its first rows, so that opening n connections costs
// O(n) copies of at most MaxLiveConnectionRows pointers, not n sorts. Actor goroutine only.
func (a *actor) publishConns(changed int) {
	pub := &publishedConns{open: len(a.connOrder)}
	if old := a.connList.Load(); old != nil && changed >= MaxLiveConnectionRows {
		pub.first = old.first // unchanged: the change is past the rows listed
	} else {
		pub.first = slices.Clone(a.connOrder[:min(len(a.connOrder), MaxLiveConnectionRows)])
	}
	a.connList.Store(pub)
}

// SubscribeLive attaches a sink to the stream's live state: a snapshot now, then patches. The
// returned function detaches it; so does a frame it fails. A slow sink is waited for, one frame
// in flight, and then gets what changed meanwhile coalesced. While attached the stream stays
// loaded.
func (s *Server) SubscribeLive(ctx context.Context, ref StreamRef, sink LiveSink) (cancel func(), err error) {
	return s.subscribeLive(ctx, ref, sink, true)
}

func (s *Server) subscribeLive(ctx context.Context, ref StreamRef, sink LiveSink, counted bool) (cancel func(), err error) {
	return s.attachLive(ctx, ref, sink, counted, nil)
}

// attachLive attaches sink to the stream's live state, or, when engine is set, to the engine it
// returns for the loaded actor (a processor's).
func (s *Server) attachLive(ctx context.Context, ref StreamRef, sink LiveSink, counted bool, engine func(a *actor) (*liveEngine, error)) (cancel func(), err error) {
	if err := itx.ValidatePath(ref.Path); err != nil {
		return nil, err
	}
	a, err := s.acquire(ctx, ref)
	if err != nil {
		return nil, err
	}
	if counted {
		if n := a.liveCount.Add(1); n > int64(s.cfg.MaxLiveSubscribersPerStream) {
			a.liveCount.Add(-1)
			s.release(a)
			return nil, itx.Errorf(itx.ELimitExceeded, "a stream serves at most %d live-state subscribers (--max-live-subscribers-per-stream)", s.cfg.MaxLiveSubscribersPerStream)
		}
	}
	sub := &liveSubscriber{sink: sink, done: make(chan struct{})}
	if engine != nil {
		if sub.engine, err = engine(a); err != nil {
			if counted {
				a.liveCount.Add(-1)
			}
			s.release(a)
			return nil, err
		}
	}
	// Not under s.base: only the engine's context, which a shutdown cancels through the
	// actor's, says the server ended the view. The shutdown cancelling both (a parent cancels
	// its children one by one, in no set order) could wake push by this one before the
	// engine's, and push would take it for its client's cancel and tell the view nothing.
	sub.ctx, sub.cancel = context.WithCancel(context.Background())
	select {
	case a.inbox <- &actorMsg{live: sub}:
	case <-ctx.Done():
		if counted {
			a.liveCount.Add(-1)
		}
		s.release(a)
		return nil, itx.Errorf(itx.ECancelled, "live state: %v", ctx.Err())
	}
	// The view's place under the stream's bound is given back as soon as the client cancels
	// (its cancel is answered after this), not once the pusher has stopped: a view asked for
	// next must not be refused for the place of one already ended.
	var freed sync.Once
	free := func() {
		if counted {
			freed.Do(func() { a.liveCount.Add(-1) })
		}
	}
	go func() {
		<-sub.ctx.Done()
		<-sub.done
		free()
		s.release(a)
		if e, ok := sink.(LiveEnder); ok {
			e.Ended()
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { sub.byClient.Store(true); sub.cancel(); free() }) }, nil
}

// String describes a frame for logs and tests.
func (f LiveFrame) String() string {
	kind := "patch"
	if f.Snapshot {
		kind = "snapshot"
	}
	return fmt.Sprintf("%s@%d %s", kind, f.Revision, f.JSON)
}
