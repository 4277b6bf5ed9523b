package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

// CloseReason is why a connection closed: a closed set clients can switch on.
type CloseReason string

// The close reasons, in the schema's CloseReason order.
const (
	CloseByClient       CloseReason = "closedByClient"
	CloseReplaced       CloseReason = "replaced"
	CloseShuttingDown   CloseReason = "serverShuttingDown"
	CloseStreamRemoved  CloseReason = "streamRemoved"
	CloseSlowConsumer   CloseReason = "slowConsumer"
	CloseDeliveryFailed CloseReason = "deliveryFailed"
	CloseConnectionLost CloseReason = "connectionLost"
	CloseAccessEnded    CloseReason = "accessEnded" // the opening token was revoked or expired
	// CloseSubscriptionRemoved ends a processor's live view: its subscription was removed.
	CloseSubscriptionRemoved CloseReason = "subscriptionRemoved"
)

// Connection limits (DESIGN.md "Resource bounds"): a connection has at most
// ConnectionWindow batches in flight, each of at most MaxConnectionBatchEvents events.
const (
	ConnectionWindow         = 4
	MaxConnectionBatchEvents = 10_000
	MaxConnectionBatchBytes  = 8 << 20
)

// ConnectionOptions are a connection's per-channel controls (seed 000: properties of the channel,
// not of an intent).
type ConnectionOptions struct {
	Key               string // shares the subscription name space; empty: one is generated
	After             int64  // deliver events with offset > After
	MaxDeliveryEvents int    // per batch; 0: itx.DeliveryBatchEvents
	MaxDeliveryBytes  int    // per batch; 0: itx.DeliveryBatchBytes; the first event always goes
	NoState           bool   // no live-state frames on this connection
	OpenedBy          string
	Types             []string // empty: every type
	IncludeEphemeral  bool     // catch-up includes buffered ephemeral events from before the open
}

// ConnectionSink is the client side of a connection (the capability layer adapts an EventSink).
// Deliver starts sending a batch and returns a wait that reports the client's answer; up to
// ConnectionWindow waits are outstanding at once. Closed is the last call; its ctx ends after
// the delivery timeout, so a client that never answers it holds nothing.
type ConnectionSink interface {
	Deliver(ctx context.Context, batch *itx.DeliveryBatch) (wait func() error)
	State(ctx context.Context, frame LiveFrame) error
	Closed(ctx context.Context, reason CloseReason, message string)
}

// Connection is an open connection: no row, no durability, gone with its RPC session.
type Connection struct {
	srv      *Server
	a        *actor
	key      string
	opts     ConnectionOptions
	sink     ConnectionSink
	openedAt int64 // the head when it opened: later ephemeral events are its to receive
	types    map[string]bool

	delivered  atomic.Int64 // every offset at or below it was delivered or passed over
	notify     chan struct{}
	ctx        context.Context
	cancel     context.CancelFunc
	once       sync.Once
	closedWith atomic.Pointer[string] // "reason: message" once closed
	done       chan struct{}
}

// Key is the connection's key.
func (c *Connection) Key() string { return c.key }

// Ping returns the stream's head and the offset the connection delivered through; a closed
// connection answers failedPrecondition with its close reason.
func (c *Connection) Ping() (head, delivered int64, err error) {
	if r := c.closedWith.Load(); r != nil {
		return 0, 0, itx.Errorf(itx.EFailedPrecondition, "the connection is closed: %s", *r)
	}
	return c.a.view().head, c.delivered.Load(), nil
}

// Close closes the connection with a reason; a closed connection receives nothing more.
func (c *Connection) Close(reason CloseReason, message string) {
	c.once.Do(func() {
		why := string(reason) + ": " + message
		c.closedWith.Store(&why)
		c.cancel()
		go c.a.post(actorMsg{closeConn: c}) // never blocks the actor, which may be the caller
		// Server.Close waits for the notice (bounded by the delivery timeout), so that itxd
		// tells serverShuttingDown before it closes the RPC connections. The pusher still holds
		// its reference here (the first Close always comes before it lets go), so the count is
		// above zero.
		c.srv.inflight.Add(1)
		go func() {
			defer c.srv.inflight.Done()
			<-c.done // the pusher has stopped: nothing is delivered after Closed
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			t := c.srv.clock.AfterFunc(c.srv.cfg.DeliveryTimeout, cancel)
			defer t.Stop()
			c.sink.Closed(ctx, reason, message)
		}()
	})
}

// Done is closed once the connection has stopped delivering.
func (c *Connection) Done() <-chan struct{} { return c.done }

// OpenConnection opens a connection on a stream: it catches up from the log after opts.After and
// then tails the stream live, with no gap and no duplicate at the seam, because it always reads
// by its own position from the log the actor committed. Opening under a key that is open
// replaces that connection (closed as replaced); a key that names a subscription is refused.
func (s *Server) OpenConnection(ctx context.Context, ref StreamRef, opts ConnectionOptions, sink ConnectionSink) (*Connection, error) {
	p, err := s.StartOpenConnection(ctx, ref, opts, sink)
	if err != nil {
		return nil, err
	}
	return p.Wait(ctx)
}

// PendingOpen is an open queued on its stream's actor. Opens queued on one stream are decided
// in queue order (the later of two under one key replaces the earlier): the caller may release
// its RPC call queue (call.Go) only after StartOpenConnection returns.
type PendingOpen struct {
	srv   *Server
	ref   StreamRef
	c     *Connection
	reply chan error
}

// StartOpenConnection validates an open and queues it on the stream (see OpenConnection).
func (s *Server) StartOpenConnection(ctx context.Context, ref StreamRef, opts ConnectionOptions, sink ConnectionSink) (*PendingOpen, error) {
	if err := itx.ValidatePath(ref.Path); err != nil {
		return nil, err
	}
	opts.Key = strings.TrimSpace(opts.Key)
	if opts.Key != "" {
		if err := itx.ValidateSubscriptionName(opts.Key); err != nil {
			return nil, itx.Errorf(itx.EInvalid, "connection key: %s", itx.ErrorMessage(err))
		}
	}
	switch {
	case opts.After < 0:
		return nil, itx.Errorf(itx.EInvalid, "after must not be negative")
	case opts.MaxDeliveryEvents < 0 || opts.MaxDeliveryEvents > MaxConnectionBatchEvents:
		return nil, itx.Errorf(itx.EInvalid, "maxDeliveryEvents must be 0..%d", MaxConnectionBatchEvents)
	case opts.MaxDeliveryBytes < 0 || opts.MaxDeliveryBytes > MaxConnectionBatchBytes:
		return nil, itx.Errorf(itx.EInvalid, "maxDeliveryBytes must be 0..%d", MaxConnectionBatchBytes)
	case len(opts.OpenedBy) > itx.MaxSubscriptionNameLength:
		return nil, itx.Errorf(itx.EInvalid, "openedBy is at most %d bytes", itx.MaxSubscriptionNameLength)
	}
	if err := itx.ValidateTypeFilter("types", opts.Types); err != nil {
		return nil, err // kept for the connection's life: bounded and valid
	}
	if typeSet(opts.Types) == nil {
		// Empty, or holding "*": every type, on the log's catch-up as on the live tail (the
		// log's query would take "*" for a type name).
		opts.Types = nil
	}
	if opts.MaxDeliveryEvents == 0 {
		opts.MaxDeliveryEvents = itx.DeliveryBatchEvents
	}
	if opts.MaxDeliveryBytes == 0 {
		opts.MaxDeliveryBytes = itx.DeliveryBatchBytes
	}
	a, err := s.acquire(ctx, ref)
	if err != nil {
		return nil, err
	}
	c := &Connection{srv: s, a: a, key: opts.Key, opts: opts, sink: sink, notify: make(chan struct{}, 1), done: make(chan struct{}),
		types: typeSet(opts.Types)}
	c.ctx, c.cancel = context.WithCancel(s.base)
	reply := make(chan error, 1)
	select {
	case a.inbox <- &actorMsg{openConn: c, connReply: reply}:
	case <-ctx.Done():
		s.release(a)
		return nil, itx.Errorf(itx.ECancelled, "open connection: %v", ctx.Err())
	}
	return &PendingOpen{srv: s, ref: ref, c: c, reply: reply}, nil
}

// Wait waits for the actor's decision and, once registered, starts the connection.
func (p *PendingOpen) Wait(ctx context.Context) (*Connection, error) {
	s, c := p.srv, p.c
	if err := <-p.reply; err != nil {
		s.release(c.a)
		return nil, err
	}
	s.metrics.OpenConnections.Inc()
	if !c.opts.NoState {
		// State frames: the stream's live state, pushed into the same sink.
		if stop, err := s.subscribeLive(ctx, p.ref, stateSink{c}, false); err == nil {
			go func() { <-c.done; stop() }()
		}
	}
	go c.run()
	return c, nil
}

// register is the actor's half of an open: validated against the head and the subscription
// catalog at one instant, between steps, so the position and the seam are exact.
func (a *actor) register(c *Connection) error {
	if a.dctx.Err() != nil {
		return a.ended() // deleted (its connections were closed) or shutting down
	}
	st := a.st
	if c.opts.After > st.head {
		return itx.Errorf(itx.EInvalid, "after %d is beyond the stream's head offset %d", c.opts.After, st.head)
	}
	for c.key == "" {
		// A generated key never takes a name already in use (a caller may open
		// "connection:1" itself, or name a subscription so).
		a.connSeq++
		if k := fmt.Sprintf("connection:%d", a.connSeq); a.conns[k] == nil && st.core.Subscriptions[k] == nil {
			c.key = k
		}
	}
	if st.core.Subscriptions[c.key] != nil {
		return itx.Errorf(itx.EFailedPrecondition, "%q names a subscription of this stream: connection keys share the subscription name space", c.key)
	}
	if err := notGenerated("connection key", c.key); err != nil {
		return err
	}
	old := a.conns[c.key]
	if old == nil && len(a.conns) >= a.srv.cfg.MaxConnectionsPerStream {
		return itx.Errorf(itx.ELimitExceeded, "a stream serves at most %d open connections (--max-connections-per-stream)", a.srv.cfg.MaxConnectionsPerStream)
	}
	if old != nil {
		old.Close(CloseReplaced, "a new connection opened under the same key")
	}
	c.openedAt = st.head
	c.delivered.Store(c.opts.After)
	a.conns[c.key] = c
	a.publishConns()
	a.liveDirty()
	return nil
}

// unregister drops a closed connection from the actor's registry (if it is still the one under
// its key).
func (a *actor) unregister(c *Connection) {
	if a.conns[c.key] == c {
		delete(a.conns, c.key)
		a.publishConns()
		a.liveDirty()
	}
}

// notifyConnections wakes every connection after a commit moved the head.
func (a *actor) notifyConnections() {
	for _, c := range a.conns {
		select {
		case c.notify <- struct{}{}:
		default:
		}
	}
}

// run is the connection's pusher: it reads by position from the committed log and sends batches,
// at most ConnectionWindow in flight. A connection that falls behind simply reads further back;
// nothing queues in memory beyond one page read ahead. A sink that does not answer a batch within
// the delivery timeout is closed as a slow consumer; a failed delivery closes it too.
//
// Reading and sending overlap: read feeds pages to the sending loop through a one-page channel,
// so the next page is read while the last one is encoded and written. A page with no events
// marks the tail (or a stretch the filter passed over): the sender then settles every batch in
// flight and records the position.
func (c *Connection) run() {
	s := c.srv
	pages := make(chan connPage, 1)
	go c.read(pages)
	defer func() {
		c.Close(CloseShuttingDown, "the server is shutting down") // no-op if already closed
		for range pages {
		}
		close(c.done)
		s.metrics.OpenConnections.Dec()
		s.release(c.a)
	}()
	type pending struct {
		wait    func() error
		through int64
	}
	var window []pending
	drain := func(all bool) bool {
		for len(window) > 0 && (all || len(window) >= ConnectionWindow) {
			p := window[0]
			if err := c.await(p.wait); err != nil {
				return false
			}
			window = window[1:]
			c.delivered.Store(p.through)
			c.a.liveDirty()
		}
		return true
	}
	for p := range pages {
		if len(p.batch.Events) == 0 {
			if !drain(true) {
				return
			}
			if p.through > c.delivered.Load() {
				c.delivered.Store(p.through)
				c.a.liveDirty()
			}
			continue
		}
		if !drain(false) {
			return
		}
		wait := c.sink.Deliver(c.ctx, p.batch)
		window = append(window, pending{wait: wait, through: p.through})
		s.metrics.ConnectionEvents.Add(float64(len(p.batch.Events)))
	}
}

// connPage is one batch to send and the position it covers; no events: a marker (see run).
type connPage struct {
	batch   *itx.DeliveryBatch
	through int64
}

// read produces the pages of run, from the last commit in memory or from the log, until the
// connection ends; it closes pages when it stops.
func (c *Connection) read(pages chan<- connPage) {
	defer close(pages)
	send := func(p connPage) bool {
		select {
		case pages <- p:
			return true
		case <-c.ctx.Done():
			return false
		}
	}
	scanned := c.opts.After
	for c.ctx.Err() == nil {
		v := c.a.view()
		if scanned >= v.head || v.store == nil {
			if !send(connPage{batch: &itx.DeliveryBatch{}, through: scanned}) {
				return
			}
			select {
			case <-c.notify:
			case <-c.ctx.Done():
			}
			continue
		}
		through := v.head
		events, fromMemory := c.fromRecent(v, scanned)
		if fromMemory {
			if len(events) == c.opts.MaxDeliveryEvents {
				through = events[len(events)-1].Offset
			}
		} else {
			// Bounded by the batch's bytes too: the loop below keeps no more than those.
			q := storage.Query{After: scanned, UpTo: v.head, Limit: c.opts.MaxDeliveryEvents,
				MaxBytes: c.opts.MaxDeliveryBytes, Types: c.opts.Types, IncludeEphemeral: true}
			var err error
			if events, err = v.store.Events(c.ctx, q); err != nil {
				if c.ctx.Err() == nil {
					c.Close(CloseDeliveryFailed, "reading the log: "+err.Error())
				}
				return
			}
			if q.Cut(events) {
				through = events[len(events)-1].Offset
			}
		}
		batch := events[:0] // events is this page's own slice: filter it in place
		size := 0
		for _, e := range events {
			if e.Ephemeral && e.Offset <= c.openedAt && !c.opts.IncludeEphemeral {
				continue // buffered before the open, and not asked for
			}
			size += len(e.Type) + len(e.Payload) + len(e.Metadata) + 64
			if size > c.opts.MaxDeliveryBytes && len(batch) > 0 {
				through = batch[len(batch)-1].Offset
				break
			}
			batch = append(batch, e)
		}
		scanned = through
		if len(batch) == 0 {
			continue
		}
		if !send(connPage{batch: &itx.DeliveryBatch{DeliveryEnvelope: itx.DeliveryEnvelope{
			ProjectID: c.a.ref.ProjectID, StreamID: v.streamID, Path: c.a.ref.Path, HeadOffset: v.head, Attempt: 1,
		}, Events: batch}, through: through}) {
			return
		}
	}
}

// fromRecent serves a connection at the tail from the last commit's events, when they are
// exactly what follows its position: the same events, in the same order, as reading the log.
func (c *Connection) fromRecent(v view, scanned int64) ([]itx.Event, bool) {
	r := v.recent
	if len(r) == 0 || r[0].Offset != scanned+1 || r[len(r)-1].Offset != v.head {
		return nil, false
	}
	out := make([]itx.Event, 0, min(len(r), c.opts.MaxDeliveryEvents))
	for _, e := range r {
		if c.types == nil || c.types[e.Type] {
			out = append(out, e)
			if len(out) == c.opts.MaxDeliveryEvents {
				break
			}
		}
	}
	return out, true
}

// await waits for one batch's answer within the delivery timeout, closing the connection if it
// does not come or is a failure.
func (c *Connection) await(wait func() error) error {
	err := sendWithin(c.srv, c.ctx, func(context.Context) error { return wait() })
	switch {
	case err == nil || c.ctx.Err() != nil:
	case errors.Is(err, errNotAccepted):
		c.Close(CloseSlowConsumer, fmt.Sprintf("the sink did not accept a batch within %s", c.srv.cfg.DeliveryTimeout))
	case itx.ErrorCode(err) == itx.ECapabilityOffline:
		c.Close(CloseConnectionLost, err.Error())
	default:
		c.Close(CloseDeliveryFailed, err.Error())
	}
	return err
}

// stateSink sends live-state frames into a connection's sink.
type stateSink struct{ c *Connection }

func (s stateSink) Send(ctx context.Context, f LiveFrame) error {
	if s.c.ctx.Err() != nil {
		// Closed: it receives nothing more (the frame saying it left is not its own to hear).
		return itx.Errorf(itx.EFailedPrecondition, "the connection is closed")
	}
	return s.c.sink.State(ctx, f)
}

func (s stateSink) slow() {
	s.c.Close(CloseSlowConsumer, "a live-state frame was not accepted within the delivery timeout")
}
