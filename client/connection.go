package client

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/wire"
)

// ConnectionOptions are Stream.openConnection's options.
type ConnectionOptions struct {
	// After: events with an offset above it are delivered (0: from the start). It may not be
	// past the stream's head.
	After int64
	// Types keeps only these event types (empty: every type).
	Types []string
	// MaxDeliveryEvents and MaxDeliveryBytes cap each batch (0: 1,000 events, 1 MiB); the first
	// event of a batch always goes.
	MaxDeliveryEvents, MaxDeliveryBytes int
	// OpenedBy says who opened it, shown in the stream's live state.
	OpenedBy string
	// Key names the connection in the stream's name space (shared with subscriptions and
	// readers): opening a key that is open replaces that connection (closed: replaced). Empty:
	// the server makes one up.
	Key string
	// IncludeEphemeral: the catch-up also delivers the ephemeral events still buffered from
	// before the open (those appended while open are always delivered).
	IncludeEphemeral bool
	// ExpectedStreamID, when set, is the stream After is an offset of (the StreamID of the
	// batches delivered before): if the path holds another stream, or none (the one meant was
	// deleted, perhaps created again with its offsets starting over), the open is refused,
	// notFound, and nothing is delivered. Set it when reopening after a checkpoint, so a
	// recreated stream's first events are not skipped as if they were the old one's.
	ExpectedStreamID string
}

// ConnectionHandler is what a connection pushes into.
type ConnectionHandler struct {
	// Deliver gets each batch, in offset order, one at a time. Returning accepts it (the server
	// keeps a few in flight and sends the next as each is accepted); an error closes the
	// connection with CloseReason_deliveryFailed, and no batch after it reaches Deliver.
	// Required.
	Deliver func(ctx context.Context, batch itx.DeliveryBatch) error
	// State, when set, gets the stream's live state (head, subscriptions, readers,
	// connections) each time it changes: its revision and the whole document. Left nil, the
	// connection asks for no state frames.
	State func(revision uint64, state json.RawMessage)
}

// ConnectionClosed is why a connection (or a live view) ended: Why is the reason to switch
// on, Reason the server's error (nil when the RPC session ended without one).
type ConnectionClosed struct {
	Why    schema.CloseReason
	Reason *itx.Error
}

func (e *ConnectionClosed) Error() string {
	if e.Reason == nil {
		return "closed: " + e.Why.String()
	}
	return fmt.Sprintf("closed: %s: %v", e.Why, e.Reason)
}

// Unwrap is the server's error, for itx.ErrorCode and errors.As; a connection whose RPC
// session was lost without one (connectionLost) unwraps to an itx.EDisconnected error: the
// events delivered until then were delivered, the rest will be after a reopen from its
// checkpoint.
func (e *ConnectionClosed) Unwrap() error {
	if e.Reason != nil {
		return e.Reason
	}
	if e.Why == schema.CloseReason_connectionLost {
		return itx.Errorf(itx.EDisconnected, "the connection to itxd was lost")
	}
	return nil
}

// Connection is a live connection opened with OpenConnection. Its handler's Deliver runs on
// the RPC connection's goroutines until the connection ends: Done is closed then, and Err says
// why.
type Connection struct {
	conn schema.Connection
	key  string
	sink *sink
	once sync.Once
	// let go is set once Close or Release gave the capability back: a call on it then would
	// fail inside go-capnp ("call on released client", code internal), where the server answers
	// a closed connection's ping failedPrecondition.
	letGo atomic.Bool
}

// OpenConnection opens a live connection on s: it catches up from the log after o.After and
// then tails the stream, with no gap and no duplicate at the seam, pushing every batch into
// h.Deliver. It returns once the server accepted the open (a refusal, such as an offset past
// the head, comes back here with its code). Release the Connection (or Close it) when done.
func OpenConnection(ctx context.Context, s schema.Stream, o ConnectionOptions, h ConnectionHandler) (*Connection, error) {
	if h.Deliver == nil {
		return nil, itx.Errorf(itx.EInvalid, "ConnectionHandler.Deliver is required")
	}
	// Refused, not taken for 0: After -1 delivered the whole stream, a negative cap the default.
	if err := offsetArg("ConnectionOptions.After", o.After); err != nil {
		return nil, err
	}
	if o.MaxDeliveryEvents < 0 || o.MaxDeliveryBytes < 0 {
		return nil, itx.Errorf(itx.EInvalid, "ConnectionOptions.MaxDeliveryEvents and MaxDeliveryBytes must not be negative (0: the default)")
	}
	k := &sink{h: h, done: make(chan struct{})}
	if h.State != nil {
		k.live = &liveDoc{}
	}
	if err := NotSent(ctx, "OpenConnection"); err != nil {
		return nil, err
	}
	fut, release := s.OpenConnection(ctx, func(p schema.Stream_openConnection_Params) error {
		opts, err := p.NewOptions()
		if err != nil {
			return err
		}
		opts.SetAfter(uint64(o.After))
		// Past 32 bits a cap is sent as the largest, which the server refuses as out of range.
		opts.SetMaxDeliveryEvents(uint32(min(max(o.MaxDeliveryEvents, 0), math.MaxUint32)))
		opts.SetMaxDeliveryBytes(uint32(min(max(o.MaxDeliveryBytes, 0), math.MaxUint32)))
		opts.SetNoState(h.State == nil)
		opts.SetIncludeEphemeral(o.IncludeEphemeral)
		if err := opts.SetOpenedBy(o.OpenedBy); err != nil {
			return err
		}
		if err := opts.SetKey(o.Key); err != nil {
			return err
		}
		if err := opts.SetExpectedStreamId(o.ExpectedStreamID); err != nil {
			return err
		}
		if err := wire.SetTextList(o.Types, opts.NewTypes); err != nil {
			return err
		}
		return p.SetSink(schema.EventSink_ServerToClient(k))
	})
	defer ReleaseAfter(ctx, release)
	kf, releaseKey := fut.Connection().Key(ctx, nil) // pipelined: no second round trip
	defer releaseKey()
	res, err := Await(ctx, fut)
	if err != nil {
		return nil, err
	}
	kr, err := kf.Struct()
	if err != nil {
		return nil, disconnected(err)
	}
	key, err := kr.Key()
	if err != nil {
		return nil, err
	}
	return &Connection{conn: res.Connection().AddRef(), key: key, sink: k}, nil
}

// Key is the connection's key (the one asked for, or the one the server made up).
func (c *Connection) Key() string { return c.key }

// Ping returns the stream's head and the offset this connection delivered through.
func (c *Connection) Ping(ctx context.Context) (head, delivered int64, err error) {
	if c.letGo.Load() {
		return 0, 0, itx.Errorf(itx.EFailedPrecondition, "Connection.ping: the connection was closed or released by this client")
	}
	if err := NotSent(ctx, "Ping"); err != nil {
		return 0, 0, err
	}
	fut, release := c.conn.Ping(ctx, nil)
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return 0, 0, err
	}
	return int64(res.HeadOffset()), int64(res.DeliveredOffset()), nil
}

// Close closes the connection (CloseReason_closedByClient) and releases it. Batches that arrive
// after that are dropped, not handed to Deliver (a Deliver already running finishes); closing
// it again does nothing. It waits for the server's answer until ctx's deadline (10 s without
// one), but not past it: a cancelled ctx alone does not cut the wait short, so Close may be
// called from Deliver with Deliver's ctx, which the server cancels as it closes the connection.
func (c *Connection) Close(ctx context.Context) error {
	var err error
	c.once.Do(func() {
		deadline, ok := ctx.Deadline()
		if !ok {
			deadline = time.Now().Add(10 * time.Second)
		}
		ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
		defer cancel()
		fut, release := c.conn.Close(ctx, func(p schema.Connection_close_Params) error { return p.SetReason("closed by client") })
		_, err = Await(ctx, fut)
		release()
		c.letGo.Store(true)
		c.conn.Release()
		c.sink.end(&ConnectionClosed{Why: schema.CloseReason_closedByClient})
	})
	return err
}

// Release drops the connection without asking the server to close it first: the server
// closes it once it sees the capability released.
func (c *Connection) Release() {
	c.once.Do(func() {
		c.letGo.Store(true)
		c.conn.Release()
	})
}

// Done is closed when the connection has ended: closed by either side, replaced, or its RPC
// session gone (lost, closed, or silent: Options.PingEvery), connectionLost.
func (c *Connection) Done() <-chan struct{} { return c.sink.done }

// Err is why the connection ended (a *ConnectionClosed), nil while it is open.
func (c *Connection) Err() error {
	c.sink.mu.Lock()
	defer c.sink.mu.Unlock()
	if c.sink.closed == nil {
		return nil
	}
	return c.sink.closed
}

// sink is the EventSink a Connection hands the server.
type sink struct {
	h    ConnectionHandler
	live *liveDoc // State's document (nil: no state asked for)

	mu     sync.Mutex
	closed *ConnectionClosed
	done   chan struct{}
	// failed is the error Deliver answered a batch with: the server closes the connection
	// (deliveryFailed), and the batches it already sent after that one are not handed to
	// Deliver, so a handler never sees events past a batch it failed.
	failed error
}

func (k *sink) Deliver(ctx context.Context, call schema.EventSink_deliver) error {
	if k.ended() {
		return nil // closed by the client: nothing reaches the handler after Close
	}
	k.mu.Lock()
	failed := k.failed
	k.mu.Unlock()
	if failed != nil {
		return failed // a batch before this one failed: the connection is closing
	}
	batch, err := batchOf(call.Args().Batch())
	if err != nil {
		return err
	}
	if err := k.h.Deliver(ctx, batch); err != nil {
		k.mu.Lock()
		k.failed = err
		k.mu.Unlock()
		return err
	}
	return nil
}

func (k *sink) Closed(ctx context.Context, call schema.EventSink_closed) error {
	reason, err := call.Args().Reason()
	k.end(closedWith(call.Args().Why(), reason, err))
	return nil
}

// closedWith is the ConnectionClosed a closed call (a sink's or a live subscriber's) carries.
func closedWith(why schema.CloseReason, reason schema.Error, err error) *ConnectionClosed {
	c := &ConnectionClosed{Why: why}
	if err == nil && reason.IsValid() {
		msg, _ := reason.Message_()
		c.Reason = &itx.Error{Code: itx.Code(reason.Code().String()), Message: msg}
	}
	return c
}

func (k *sink) State(ctx context.Context, call schema.EventSink_state) error {
	if k.live == nil || k.ended() {
		return nil
	}
	js, err := call.Args().Json()
	if err != nil {
		return err
	}
	rev := call.Args().Revision()
	if doc, ok := k.live.apply(rev, call.Args().Snapshot(), []byte(js)); ok {
		k.h.State(rev, doc)
	}
	return nil
}

// Shutdown runs once the server dropped the sink: after closed, or when the RPC session ended
// without it (connectionLost).
func (k *sink) Shutdown() { k.end(&ConnectionClosed{Why: schema.CloseReason_connectionLost}) }

// end records the first reason the connection ended and closes done.
func (k *sink) end(c *ConnectionClosed) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed == nil {
		k.closed = c
		close(k.done)
	}
}

func (k *sink) ended() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.closed != nil
}
