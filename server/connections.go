package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

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

// Said is the close's text: the reason, then the message when there is one (a client's close
// without a reason said "closedByClient: ").
func (r CloseReason) Said(message string) string {
	if message == "" {
		return string(r)
	}
	return string(r) + ": " + message
}

// Connection limits (DESIGN.md "Resource bounds"): a connection has at most
// ConnectionWindow batches in flight, each of at most MaxConnectionBatchEvents events.
const (
	ConnectionWindow         = 4
	MaxConnectionBatchEvents = 10_000
	MaxConnectionBatchBytes  = 8 << 20
	maxStreamIDLength        = 64 // longer than any stream id (a UUID, 36 bytes)
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
	// ExpectedStreamID, when set, is the stream After is an offset of: the path holding
	// another stream (or none) refuses the open, notFound.
	ExpectedStreamID string
	// Opener, when set, is the login the connection counts against (Session.TakeLive), taken by
	// the actor once the open is decided: one that replaces a connection the same login opened
	// takes over that one's place instead, so a replace at the bound succeeds (the count does
	// not grow). The place is given back when the connection has stopped.
	Opener *Session
	// NoHold: opened without the subscribe right (see ReaderCaller.NoHold): the connection's
	// delivered offset holds back no trim, and events trimmed ahead of it are passed as a gap.
	NoHold bool
}

// ConnectionSink is the client side of a connection (the capability layer adapts an EventSink).
// Deliver starts sending a batch and returns a wait that reports the client's answer; up to
// ConnectionWindow waits are outstanding at once. Closed is the last call, after every Deliver
// and State has returned; its ctx ends after the delivery timeout, so a client that never
// answers it holds nothing (a Closed whose ctx is already done sends nothing: it comes so when
// a State was still stuck at the timeout).
type ConnectionSink interface {
	Deliver(ctx context.Context, batch *itx.DeliveryBatch) (wait func() error)
	// TryDeliver is Deliver without ever waiting: false (nothing sent) when the sink's flow
	// limit leaves no room for the batch.
	TryDeliver(ctx context.Context, batch *itx.DeliveryBatch) (wait func() error, ok bool)
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

	delivered atomic.Int64 // every offset at or below it was delivered or passed over
	// sent: every offset at or below it was handed to the sink (its answer perhaps still on
	// the way), is being handed to it, or was passed over. Ping waits for delivered to reach
	// it (see Ping).
	sent atomic.Int64
	// A waiting Ping's wake-up: settled closes pingSettled when delivered moves while
	// pingWaiting > 0 (nobody waiting: no lock taken per answer).
	pingWaiting atomic.Int32
	pingMu      sync.Mutex
	pingSettled chan struct{}
	notify      chan struct{}

	// The tail's short path (pushDirect): the actor hands a commit's events to the sink itself
	// when the reader waits at the tail and every page it made is in the sink's hands, instead
	// of waking the reader, which wakes the sender (two goroutine hand-offs per commit).
	mu       sync.Mutex
	scanned  int64 // the reader's position (guarded by mu)
	parked   bool  // the reader waits at the tail for a commit (guarded by mu)
	produced int64 // pages the reader has made, markers included (guarded by mu)
	consumed atomic.Int64
	inflight atomic.Int32  // batches handed to the sink and not yet answered
	direct   chan connPage // batches the actor handed to the sink, for run to await; cap ConnectionWindow

	ctx        context.Context
	cancel     context.CancelFunc
	once       sync.Once
	closedWith atomic.Pointer[string] // "reason: message" once closed
	done       chan struct{}
	told       chan struct{} // closed once the Closed notice returned (or was given up)
	// left is closed by the actor once the closed connection is out of its registry: its key
	// is free and the live state no longer counts it (see CloseAndLeave).
	left chan struct{}

	// State frames in the sink's hands (stateSink.Send): the Closed notice waits until none
	// is, so that no frame goes out after it. Guarded by stateMu, which is never held across
	// a send (a frame may wait for room in the sink's flow limit).
	stateMu   sync.Mutex
	stateBusy int
	stateIdle chan struct{} // closed when stateBusy drops to zero; nil: no one waits

	liveMu sync.Mutex
	untake func() // gives back the place counted against opts.Opener; nil: none held (guarded by liveMu)
}

// takeOverLive moves old's place under the login to c; false when old holds none (it was given
// back already).
func (c *Connection) takeOverLive(old *Connection) bool {
	old.liveMu.Lock()
	u := old.untake
	old.untake = nil
	old.liveMu.Unlock()
	if u == nil {
		return false
	}
	c.liveMu.Lock()
	c.untake = u
	c.liveMu.Unlock()
	return true
}

// giveBackLive gives back the place c holds under its login, if any, once.
func (c *Connection) giveBackLive() {
	c.liveMu.Lock()
	u := c.untake
	c.untake = nil
	c.liveMu.Unlock()
	if u != nil {
		u()
	}
}

// Key is the connection's key.
func (c *Connection) Key() string { return c.key }

// PingSettleWait bounds how long a ping waits for the answers of the batches sent before it.
const PingSettleWait = time.Second

// Ping returns the stream's head and the offset the connection delivered through (the sink
// answered every batch up to it); a closed connection answers failedPrecondition with its
// close reason. It first waits, at most PingSettleWait, for the answers to the batches already
// sent: a client whose sink holds the events through n pings after they arrived, and its
// answer to their batch may reach itxd after the ping (they cross on the wire, or the sink's
// handler has not returned yet), so the ping would say less than the client has. A sink that
// is stuck makes a ping wait that long, then answer what it accepted.
func (c *Connection) Ping(ctx context.Context) (head, delivered int64, err error) {
	if r := c.closedWith.Load(); r != nil {
		return 0, 0, itx.Errorf(itx.EFailedPrecondition, "the connection is closed: %s", *r)
	}
	if target := c.sent.Load(); c.delivered.Load() < target {
		c.pingWaiting.Add(1)
		defer c.pingWaiting.Add(-1)
		expired := make(chan struct{})
		t := c.srv.clock.AfterFunc(PingSettleWait, func() { close(expired) })
		defer t.Stop()
	wait:
		for {
			c.pingMu.Lock()
			if c.pingSettled == nil {
				c.pingSettled = make(chan struct{})
			}
			moved := c.pingSettled
			c.pingMu.Unlock()
			// Checked after taking the channel: a settle after this closes it.
			if c.delivered.Load() >= target {
				break
			}
			select {
			case <-moved:
			case <-c.done:
				break wait
			case <-expired:
				break wait
			case <-ctx.Done():
				break wait
			}
		}
		if r := c.closedWith.Load(); r != nil {
			return 0, 0, itx.Errorf(itx.EFailedPrecondition, "the connection is closed: %s", *r)
		}
	}
	return c.a.view().head, c.delivered.Load(), nil
}

// wakePings wakes the pings waiting for delivered to move.
func (c *Connection) wakePings() {
	if c.pingWaiting.Load() == 0 {
		return
	}
	c.pingMu.Lock()
	if c.pingSettled != nil {
		close(c.pingSettled)
		c.pingSettled = nil
	}
	c.pingMu.Unlock()
}

// markSent moves sent up to through (the actor's pushDirect and run both send).
func (c *Connection) markSent(through int64) {
	for {
		was := c.sent.Load()
		if through <= was || c.sent.CompareAndSwap(was, through) {
			return
		}
	}
}

// Close closes the connection with a reason; a closed connection receives nothing more.
func (c *Connection) Close(reason CloseReason, message string) {
	c.once.Do(func() {
		why := reason.Said(message)
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
			defer close(c.told)
			<-c.done // the pusher has stopped: nothing is delivered after Closed
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			t := c.srv.clock.AfterFunc(c.srv.cfg.DeliveryTimeout, cancel)
			defer t.Stop()
			// Nor is a state frame: the one in the sink's hands, if any, goes first (its
			// context is cancelled as the connection's live-state view stops with done). None
			// starts once the context is cancelled. Past the delivery timeout ctx is done, and
			// Closed sends nothing after a frame still stuck.
			select {
			case <-c.stateSettled():
			case <-ctx.Done():
			}
			c.sink.Closed(ctx, reason, message)
		}()
	})
}

// CloseAndLeave closes the connection, as Close does, and returns once its stream no longer
// holds it (its key is free for a subscription, a reader or another connection, and the live
// state neither lists nor counts it) and its pusher has stopped (its place under its login's
// bound is given back). A client's close is answered only then, so every call it makes next
// sees the connection gone (Close alone only starts both).
func (c *Connection) CloseAndLeave(ctx context.Context, reason CloseReason, message string) error {
	c.Close(reason, message)
	select {
	case <-c.left:
	case <-c.a.done: // the stream's registry went with its actor
	case <-ctx.Done():
		return itx.Errorf(itx.ECancelled, "close: %v", ctx.Err())
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		return itx.Errorf(itx.ECancelled, "close: %v", ctx.Err())
	}
	return nil
}

// Done is closed once the connection has stopped delivering.
func (c *Connection) Done() <-chan struct{} { return c.done }

// Told is closed once the connection, closed, has been told why: its Closed notice returned, or
// was given up after the delivery timeout.
func (c *Connection) Told() <-chan struct{} { return c.told }

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
	key := strings.TrimSpace(opts.Key)
	if key == "" && opts.Key != "" {
		// As a subscription's name: blank is refused, not taken for a key left out (generated).
		return nil, itx.Errorf(itx.EInvalid, "connection key %q is blank: leave it out for a generated key", opts.Key)
	}
	opts.Key = key
	if opts.Key != "" {
		// The subscription name's rules (one name space), in the key's words.
		if err := itx.ValidateName("connection key", opts.Key); err != nil {
			return nil, err
		}
	}
	switch {
	case opts.After < 0:
		return nil, itx.Errorf(itx.EInvalid, "after must not be negative")
	case opts.MaxDeliveryEvents < 0 || opts.MaxDeliveryEvents > MaxConnectionBatchEvents:
		return nil, itx.Errorf(itx.EInvalid, "maxDeliveryEvents must be 0..%d", MaxConnectionBatchEvents)
	case opts.MaxDeliveryBytes < 0 || opts.MaxDeliveryBytes > MaxConnectionBatchBytes:
		return nil, itx.Errorf(itx.EInvalid, "maxDeliveryBytes must be 0..%d", MaxConnectionBatchBytes)
	case len(opts.ExpectedStreamID) > maxStreamIDLength:
		// A stream id is a UUID: bounded before an error message quotes it.
		return nil, itx.Errorf(itx.EInvalid, "expectedStreamId is at most %d bytes (a stream id is a UUID, as a DeliveryBatch's streamId)", maxStreamIDLength)
	case len(opts.OpenedBy) > utf8.UTFMax*itx.MaxSubscriptionNameLength:
		// Bounded before it is scanned; ValidateName below counts its characters, as a key's.
		return nil, itx.Errorf(itx.EInvalid, "openedBy is at most %d characters", itx.MaxSubscriptionNameLength)
	}
	// openedBy names who opened the connection in the stream's live state: a name like the key.
	opts.OpenedBy = strings.TrimSpace(opts.OpenedBy)
	if opts.OpenedBy != "" {
		if err := itx.ValidateName("openedBy", opts.OpenedBy); err != nil {
			return nil, err
		}
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
	c := &Connection{srv: s, a: a, key: opts.Key, opts: opts, sink: sink, notify: make(chan struct{}, 1), done: make(chan struct{}), told: make(chan struct{}), left: make(chan struct{}),
		types: typeSet(opts.Types), scanned: opts.After, direct: make(chan connPage, ConnectionWindow)}
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
	if want := c.opts.ExpectedStreamID; want != "" && a.identity() != want {
		// Offsets are positions in one stream's life: after N of another stream (the one meant
		// deleted, the path made anew) would skip that one's first N events.
		if a.identity() == "" {
			return itx.Errorf(itx.ENotFound, "stream %q is no longer at %s, which holds no stream now", want, a.ref.Path)
		}
		return itx.Errorf(itx.ENotFound, "stream %q is no longer at %s, which holds another stream now (id %s, its offsets starting over)", want, a.ref.Path, st.streamID)
	}
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
	if old != nil && !sameToken(old.opts.Opener, c.opts.Opener) {
		// Any holder that reads the stream sees its connections' keys (its live state): were a
		// key anyone's to take, one tenant, or a read-only capability handed to a browser, could
		// close another's connection at will. A replace is the opener's own reconnect.
		return itx.Errorf(itx.EPermissionDenied, "connection key %q is held by a connection another token opened: only a login with that token (or one made with its label and scope) replaces it (pick another key)", c.key)
	}
	if old == nil && len(a.conns) >= a.srv.cfg.MaxConnectionsPerStream {
		return itx.Errorf(itx.ELimitExceeded, "a stream serves at most %d open connections (--max-connections-per-stream)", a.srv.cfg.MaxConnectionsPerStream)
	}
	if x := c.opts.Opener; x != nil && (old == nil || old.opts.Opener != x || !c.takeOverLive(old)) {
		untake, err := x.TakeLive()
		if err != nil {
			return err
		}
		c.liveMu.Lock()
		c.untake = untake
		c.liveMu.Unlock()
	}
	if old != nil {
		old.Close(CloseReplaced, "a new connection opened under the same key")
		// Its place under its own login's bound is given back now, not once its pusher has
		// stopped: the replacing open is answered after this, and the replaced login may
		// open another at once. (No-op when c took the place over.)
		old.giveBackLive()
	}
	c.openedAt = st.head
	c.delivered.Store(c.opts.After)
	c.sent.Store(c.opts.After)
	a.conns[c.key] = c
	i, found := a.connIndex(c.key)
	if found {
		a.connOrder[i] = c
	} else {
		a.connOrder = slices.Insert(a.connOrder, i, c)
	}
	a.publishConns(i)
	a.liveDirty()
	return nil
}

// identity is the stream's id as readers see it (a batch's, getEventPage's): "" until the first
// commit has landed (an id planned for a stream not yet made is no identity).
func (a *actor) identity() string {
	if st := a.st; st.born && a.store != nil {
		return st.streamID
	}
	return ""
}

// sameToken says whether two logins (nil: opened by the server itself, or in-process) use the
// same token of the same project.
func sameToken(a, b *Session) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Project.ID == b.Project.ID && (a.Token.ID == b.Token.ID || a.Token.Principal() == b.Token.Principal())
}

// unregister drops a closed connection from the actor's registry (if it is still the one under
// its key).
func (a *actor) unregister(c *Connection) {
	if a.conns[c.key] == c {
		delete(a.conns, c.key)
		if i, found := a.connIndex(c.key); found {
			a.connOrder = slices.Delete(a.connOrder, i, i+1)
			a.publishConns(i)
		}
		a.liveDirty() // before left: a view asked for after it counts this change
	}
	close(c.left) // each connection's close posts once (Close runs once)
}

// connIndex is where key is, or belongs, in connOrder.
func (a *actor) connIndex(key string) (int, bool) {
	return slices.BinarySearchFunc(a.connOrder, key, func(c *Connection, key string) int { return strings.Compare(c.key, key) })
}

// directMaxConns is the most connections a stream may have for the actor to send a commit's
// events to them itself (pushDirect): it encodes one batch per connection, so with many of them
// it would hold up the next commit, and the connections' own goroutines encode in parallel.
var directMaxConns = 8

// notifyConnections hands a commit's events to every connection at the tail (pushDirect) when
// the stream has few, and wakes the others, after a commit moved the head.
func (a *actor) notifyConnections() {
	direct := len(a.conns) <= directMaxConns
	var v view
	if direct && len(a.conns) > 0 {
		v = a.view()
	}
	for _, c := range a.conns {
		if direct && c.pushDirect(v) {
			continue
		}
		select {
		case c.notify <- struct{}{}:
		default:
		}
	}
}

// pushDirect is the tail's short path, run by the actor right after a commit: when the reader
// waits at the tail, run has handed every page it made to the sink, the window has room and the
// commit's events fit in one batch, the actor sends that batch itself and gives run its answer
// to await. The batch is exactly the one the reader would have made (the same filter and caps);
// otherwise it returns false and the reader is woken. It never blocks: the sink's Deliver only
// queues the call (TryDeliver sends only into room under the sink's flow limit), and direct
// holds a slot for every batch in flight.
func (c *Connection) pushDirect(v view) bool {
	if !c.mu.TryLock() {
		return false // the reader is at work
	}
	defer c.mu.Unlock()
	if !c.parked || c.ctx.Err() != nil || c.produced != c.consumed.Load() || c.inflight.Load() >= ConnectionWindow {
		return false
	}
	events, ok := c.fromRecent(v, c.scanned)
	if !ok {
		return false
	}
	through := v.head
	if len(events) == c.opts.MaxDeliveryEvents {
		through = events[len(events)-1].Offset
	}
	batch, through := c.cut(events, through)
	if len(batch) == 0 || through != v.head || batchBytes(batch) > directMaxBytes {
		return false // nothing to send, more than one batch or a large one: the reader's work
	}
	// Marked before the send: the client may have the batch, and ping, before this goroutine
	// runs again. Not sent now, the reader sends these events soon (a ping waits for them).
	c.markSent(through)
	wait, ok := c.sink.TryDeliver(c.ctx, c.batch(v, batch))
	if !ok {
		return false // the sink's flow limit is taken: the reader waits for room
	}
	c.scanned = through
	c.inflight.Add(1)
	c.srv.metrics.ConnectionDirect.Inc()
	select {
	case c.direct <- connPage{through: through, wait: wait, events: len(batch)}:
	default: // cannot happen (inflight < ConnectionWindow); the answer is then not awaited
	}
	return true
}

// directMaxBytes is the largest batch the actor encodes itself (pushDirect); a larger commit
// goes through the reader.
const directMaxBytes = 64 << 10

func batchBytes(events []itx.Event) int {
	n := 0
	for i := range events {
		n += len(events[i].Type) + len(events[i].Payload) + len(events[i].Metadata)
	}
	return n
}

// batch wraps a page's events for the sink.
func (c *Connection) batch(v view, events []itx.Event) *itx.DeliveryBatch {
	return &itx.DeliveryBatch{DeliveryEnvelope: itx.DeliveryEnvelope{
		ProjectID: c.a.ref.ProjectID, StreamID: v.streamID, Path: c.a.ref.Path, HeadOffset: v.head, Attempt: 1,
	}, Events: events}
}

// cut filters a page in place (ephemeral events buffered before the open, unless asked for) and
// cuts it at the batch's bytes (the first event always goes), returning the batch and the
// position it covers.
func (c *Connection) cut(events []itx.Event, through int64) ([]itx.Event, int64) {
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
	return batch, through
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
	type pending struct {
		wait    func() error
		through int64
	}
	var window []pending
	// takeDirect moves the batches the actor sent (pushDirect) into the window. Each is older
	// than any page or marker the reader makes after it (it is in direct before the reader can
	// move on), and newer than every batch in the window (the actor sends only once run has
	// handed every page to the sink), so taking them before each page keeps the window in order.
	takeDirect := func() {
		for {
			select {
			case p := <-c.direct:
				window = append(window, pending{wait: p.wait, through: p.through})
				s.metrics.ConnectionEvents.Add(float64(p.events))
			default:
				return
			}
		}
	}
	defer func() {
		c.Close(CloseShuttingDown, "the server is shutting down") // no-op if already closed
		// The context is cancelled now: a pushDirect that saw it live has queued its batch
		// once the lock is free, so the Closed notice (after done) comes after that batch.
		c.mu.Lock()
		c.mu.Unlock() //nolint:staticcheck // an empty critical section: a barrier
		for range pages {
		}
		// Batches sent and not awaited: their calls end with the cancelled context; waiting
		// for that releases them (else each stays in the RPC connection's question table
		// until that connection ends).
		takeDirect()
		if len(window) > 0 {
			left := window
			go func() {
				for _, p := range left {
					_ = p.wait()
				}
			}()
		}
		c.giveBackLive() // before done: a close answered once done is closed has given it back
		close(c.done)
		s.metrics.OpenConnections.Dec()
		s.release(c.a)
	}()
	settled := func(through int64) {
		if through > c.delivered.Load() {
			c.delivered.Store(through)
			c.wakePings()
			c.a.liveDirty()
		}
	}
	drain := func(all bool) bool {
		for len(window) > 0 && (all || len(window) >= ConnectionWindow) {
			p := window[0]
			window = window[1:] // awaited (and released) whatever the answer
			if err := c.await(p.wait); err != nil {
				return false
			}
			c.inflight.Add(-1)
			settled(p.through)
		}
		return true
	}
	for {
		var p connPage
		select {
		case p = <-c.direct: // see takeDirect

		default:
			var ok bool
			select {
			case p = <-c.direct:
			case p, ok = <-pages:
				if !ok {
					return
				}
			}
		}
		switch {
		case p.wait != nil: // sent by the actor at the tail: await it, as after a marker
			window = append(window, pending{wait: p.wait, through: p.through})
			s.metrics.ConnectionEvents.Add(float64(p.events))
			takeDirect()
			if !drain(true) {
				return
			}
		case len(p.batch.Events) == 0: // a marker: the tail, or a stretch the filter passed over
			takeDirect()
			c.markSent(p.through) // every page before it was sent
			c.consumed.Add(1)
			if !drain(true) {
				return
			}
			settled(p.through)
		default:
			takeDirect()
			if !drain(false) {
				return
			}
			c.inflight.Add(1)
			c.markSent(p.through) // before the send, as in pushDirect
			wait := c.sink.Deliver(c.ctx, p.batch)
			window = append(window, pending{wait: wait, through: p.through})
			c.consumed.Add(1)
			s.metrics.ConnectionEvents.Add(float64(len(p.batch.Events)))
		}
	}
}

// connPage is one batch to send and the position it covers; no events: a marker (see run). A
// page with wait was sent by the actor (pushDirect): run only awaits it.
type connPage struct {
	batch   *itx.DeliveryBatch
	through int64
	wait    func() error
	events  int
}

// read produces the pages of run, from the last commit in memory or from the log, until the
// connection ends; it closes pages when it stops. Its position is c.scanned, which the actor
// moves too while the reader is parked at the tail (pushDirect).
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
	for {
		// The view first, then the context: a close cancels the context in the actor before
		// it publishes any later commit, so a view that holds events appended after a replace
		// (or any close) is never read for a connection whose context is live here.
		v := c.a.view()
		if c.ctx.Err() != nil {
			return
		}
		c.mu.Lock()
		scanned := c.scanned
		if scanned >= v.head || v.store == nil {
			c.produced++
			c.mu.Unlock()
			if !send(connPage{batch: &itx.DeliveryBatch{}, through: scanned}) {
				return
			}
			c.mu.Lock()
			c.parked = true
			c.mu.Unlock()
			select {
			case <-c.notify:
			case <-c.ctx.Done():
			}
			c.mu.Lock()
			c.parked = false
			c.mu.Unlock()
			continue
		}
		c.mu.Unlock()
		through := v.head
		events, fromMemory := c.fromRecent(v, scanned)
		if fromMemory {
			if len(events) == c.opts.MaxDeliveryEvents {
				through = events[len(events)-1].Offset
			}
		} else {
			// Bounded by the batch's bytes too: cut keeps no more than those.
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
		batch, through := c.cut(events, through)
		c.mu.Lock()
		c.scanned = through
		if len(batch) > 0 {
			c.produced++
		}
		c.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		if !send(connPage{batch: c.batch(v, batch), through: through}) {
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
	c := s.c
	c.stateMu.Lock()
	if c.ctx.Err() != nil {
		c.stateMu.Unlock()
		// Closed: it receives nothing more (the frame saying it left is not its own to hear).
		return itx.Errorf(itx.EFailedPrecondition, "the connection is closed")
	}
	c.stateBusy++ // under stateMu with the check: the Closed notice waits for this frame
	c.stateMu.Unlock()
	defer c.stateSent()
	return c.sink.State(ctx, f)
}

// stateSent ends a state frame's send.
func (c *Connection) stateSent() {
	c.stateMu.Lock()
	defer c.stateMu.Unlock()
	if c.stateBusy--; c.stateBusy == 0 && c.stateIdle != nil {
		close(c.stateIdle)
		c.stateIdle = nil
	}
}

// stateSettled is closed once no state frame is in the sink's hands. After Close none starts
// (stateSink.Send checks the cancelled context under stateMu), so it stays so.
func (c *Connection) stateSettled() <-chan struct{} {
	c.stateMu.Lock()
	defer c.stateMu.Unlock()
	if c.stateBusy == 0 {
		idle := make(chan struct{})
		close(idle)
		return idle
	}
	if c.stateIdle == nil {
		c.stateIdle = make(chan struct{})
	}
	return c.stateIdle
}

func (s stateSink) slow() {
	s.c.Close(CloseSlowConsumer, "a live-state frame was not accepted within the delivery timeout")
}

// refused closes the connection whose sink failed a state frame, as await does for a batch.
func (s stateSink) refused(err error) {
	if itx.ErrorCode(err) == itx.ECapabilityOffline {
		s.c.Close(CloseConnectionLost, err.Error())
		return
	}
	s.c.Close(CloseDeliveryFailed, "the sink refused a live-state frame: "+err.Error())
}
