package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// batches records what a client.Connection delivered.
type batches struct {
	mu      sync.Mutex
	sizes   []int
	offsets []int64
	changed chan struct{}
}

func newBatches() *batches { return &batches{changed: make(chan struct{}, 1)} }

func (b *batches) deliver(ctx context.Context, batch itx.DeliveryBatch) error {
	b.mu.Lock()
	b.sizes = append(b.sizes, len(batch.Events))
	for _, e := range batch.Events {
		b.offsets = append(b.offsets, e.Offset)
	}
	b.mu.Unlock()
	select {
	case b.changed <- struct{}{}:
	default:
	}
	return nil
}

func (b *batches) got() ([]int64, []int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int64(nil), b.offsets...), append([]int(nil), b.sizes...)
}

// closedWhy waits for c to end and returns why.
func closedWhy(t *testing.T, c *client.Connection) *client.ConnectionClosed {
	t.Helper()
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the connection did not end")
	}
	var cc *client.ConnectionClosed
	require.ErrorAs(t, c.Err(), &cc)
	return cc
}

// The Go client's OpenConnection: catch-up after an offset, then the live tail, in batches
// within the caps, with ping following; Close ends it with closedByClient and nothing more is
// delivered.
func TestClientConnection_CatchesUpThenTails(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/client/conn")
	for i := range 5 {
		mustAppend(t, s, ev("e", fmt.Sprintf(`{"i": %d}`, i)))
	}
	ctx := ctxT(t)
	b := newBatches()
	c, err := client.OpenConnection(ctx, s, client.ConnectionOptions{After: 2, MaxDeliveryEvents: 2, Key: "mirror", OpenedBy: "test"},
		client.ConnectionHandler{Deliver: b.deliver})
	require.NoError(t, err)
	require.Equal(t, "mirror", c.Key())
	waitUntil(t, "the catch-up", func() bool { o, _ := b.got(); return len(o) == 3 })
	mustAppend(t, s, ev("e", `{}`), ev("e", `{}`), ev("e", `{}`), ev("e", `{}`), ev("e", `{}`)) // 6..10
	waitUntil(t, "the tail", func() bool { o, _ := b.got(); return len(o) == 8 })
	offsets, sizes := b.got()
	require.Equal(t, offsetsFrom(3, 10), offsets)
	for _, n := range sizes {
		require.LessOrEqual(t, n, 2, "batch sizes %v", sizes)
	}
	waitUntil(t, "ping", func() bool {
		head, delivered, err := c.Ping(ctx)
		require.NoError(t, err)
		return head == 10 && delivered == 10
	})
	require.NoError(t, c.Err(), "open")

	require.NoError(t, c.Close(ctx))
	require.Equal(t, schema.CloseReason_closedByClient, closedWhy(t, c).Why)
	mustAppend(t, s, ev("e", `{}`))
	// A connection opened after the append gets it; the closed one never does.
	b2 := newBatches()
	c2, err := client.OpenConnection(ctx, s, client.ConnectionOptions{After: 10}, client.ConnectionHandler{Deliver: b2.deliver})
	require.NoError(t, err)
	defer c2.Release()
	waitUntil(t, "the later connection", func() bool { o, _ := b2.got(); return len(o) == 1 })
	offsets, _ = b.got()
	require.Equal(t, offsetsFrom(3, 10), offsets, "delivered after Close")
	require.NoError(t, c.Close(ctx), "closing again")
}

// Opening a key that is open replaces that connection (replaced); a refused open (an offset
// past the head) comes back from OpenConnection with its code and leaves the open one as it is.
func TestClientConnection_ReplacedAndRefused(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/client/replace")
	mustAppend(t, s, ev("e", `{}`))
	ctx := ctxT(t)
	first := newBatches()
	a, err := client.OpenConnection(ctx, s, client.ConnectionOptions{Key: "k"}, client.ConnectionHandler{Deliver: first.deliver})
	require.NoError(t, err)
	defer a.Release()
	// The catch-up is delivered asynchronously: wait for it, or the replacement below may
	// legitimately end the connection before it was sent.
	waitUntil(t, "the first connection's catch-up", func() bool { o, _ := first.got(); return len(o) == 1 })
	_, err = client.OpenConnection(ctx, s, client.ConnectionOptions{Key: "k", After: 5}, client.ConnectionHandler{Deliver: first.deliver})
	require.Equal(t, itx.EInvalid, itx.ErrorCode(err), "%v", err)
	_, _, err = a.Ping(ctx)
	require.NoError(t, err, "the refused open left the open connection alone")
	require.NoError(t, a.Err())

	second := newBatches()
	b, err := client.OpenConnection(ctx, s, client.ConnectionOptions{Key: "k"}, client.ConnectionHandler{Deliver: second.deliver})
	require.NoError(t, err)
	defer b.Release()
	require.Equal(t, schema.CloseReason_replaced, closedWhy(t, a).Why)
	mustAppend(t, s, ev("e", `{}`))
	waitUntil(t, "the new connection", func() bool { o, _ := second.got(); return len(o) == 2 })
	o, _ := first.got()
	require.Equal(t, []int64{1}, o, "the replaced connection got nothing after it was replaced")

	_, err = client.OpenConnection(ctx, s, client.ConnectionOptions{}, client.ConnectionHandler{})
	require.Equal(t, itx.EInvalid, itx.ErrorCode(err), "no Deliver: %v", err)
}

// A Deliver that fails closes the connection with deliveryFailed; a Deliver that closes its own
// connection does not wedge it; the end of the client's RPC session ends its connections with
// connectionLost.
func TestClientConnection_Ends(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/client/ends")
	mustAppend(t, s, ev("e", `{}`))

	failing, err := client.OpenConnection(ctx, s, client.ConnectionOptions{}, client.ConnectionHandler{
		Deliver: func(context.Context, itx.DeliveryBatch) error { return errors.New("the handler's own failure") }})
	require.NoError(t, err)
	defer failing.Release()
	cc := closedWhy(t, failing)
	require.Equal(t, schema.CloseReason_deliveryFailed, cc.Why)
	require.NotNil(t, cc.Reason)
	require.Contains(t, cc.Reason.Message, "the handler's own failure")

	var self *client.Connection
	ready := make(chan struct{})
	closedInside := make(chan error, 1)
	self, err = client.OpenConnection(ctx, s, client.ConnectionOptions{}, client.ConnectionHandler{
		Deliver: func(ctx context.Context, _ itx.DeliveryBatch) error {
			<-ready
			closedInside <- self.Close(ctx)
			return nil
		}})
	require.NoError(t, err)
	close(ready)
	select {
	case err := <-closedInside:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Close called from Deliver did not return")
	}
	require.Equal(t, schema.CloseReason_closedByClient, closedWhy(t, self).Why)

	conn := dial(t, ts.addr)
	other := stream(t, conn.Login(ctx, ts.creds.ProjectToken), "/client/ends")
	lost, err := client.OpenConnection(ctx, other, client.ConnectionOptions{}, client.ConnectionHandler{
		Deliver: func(context.Context, itx.DeliveryBatch) error { return nil }})
	require.NoError(t, err)
	conn.Close()
	require.Equal(t, schema.CloseReason_connectionLost, closedWhy(t, lost).Why)
}

// A connection that asks for State gets the stream's live state as a whole document after each
// frame, following the head.
func TestClientConnection_State(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/client/state")
	mustAppend(t, s, ev("e", `{}`))
	var mu sync.Mutex
	var heads []int64
	var last uint64
	c, err := client.OpenConnection(ctx, s, client.ConnectionOptions{Key: "watcher", OpenedBy: "the test"}, client.ConnectionHandler{
		Deliver: func(context.Context, itx.DeliveryBatch) error { return nil },
		State: func(rev uint64, state json.RawMessage) {
			st, err := (client.LiveState{Revision: rev, State: state}).Stream()
			if err != nil {
				panic(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if rev <= last {
				panic(fmt.Sprintf("revision %d after %d", rev, last))
			}
			last = rev
			heads = append(heads, st.Head)
		}})
	require.NoError(t, err)
	defer c.Release()
	for range 3 {
		mustAppend(t, s, ev("e", `{}`))
	}
	waitUntil(t, "the state at head 4", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(heads) > 0 && heads[len(heads)-1] == 4
	})
}

// WatchStream keeps the stream's live state current: the client's document after each frame
// equals a fresh snapshot taken by another view at the same revision, it shows subscriptions,
// readers and connections as they come, and Cancel ends it without an error.
func TestClientWatchStream(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	s := stream(t, p, "/client/watch")
	mustAppend(t, s, ev("e", `{}`))
	v, err := client.WatchStream(ctx, s)
	require.NoError(t, err)
	st, err := v.Current().Stream()
	require.NoError(t, err)
	require.Equal(t, int64(1), st.Head)

	_, _, err = client.ConfigureSubscription(ctx, client.Subscriptions(ctx, s),
		client.SubscriptionConfig{Name: "copy", Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/client/watch-copy"}})
	require.NoError(t, err)
	readers := client.Readers(ctx, s)
	defer readers.Release()
	require.NoError(t, client.RegisterReader(ctx, readers, "mirror", 1))
	c, err := client.OpenConnection(ctx, s, client.ConnectionOptions{Key: "tail", OpenedBy: "watch test"},
		client.ConnectionHandler{Deliver: func(context.Context, itx.DeliveryBatch) error { return nil }})
	require.NoError(t, err)
	defer c.Release()
	for range 5 {
		mustAppend(t, s, ev("e", `{}`))
	}
	got, err := v.StreamState(ctx, func(st itx.LiveStreamState) bool {
		sub, ok := st.Subscriptions["copy"]
		conn, open := st.Connections["tail"]
		return st.Head == 7 && ok && sub.Lag == 0 && st.Readers["mirror"].Lag == 6 && open && conn.Delivered == 7
	})
	require.NoError(t, err)
	require.Equal(t, "copy-to-stream", got.Subscriptions["copy"].Kind)
	require.Equal(t, "watch test", got.Connections["tail"].OpenedBy)

	// The patched document is the server's: a second view's first snapshot at the same
	// revision is the same document. (Cancelled with a context that already ended: as
	// Connection.Close, Cancel still asks the server and answers its outcome.)
	ended, endNow := context.WithCancel(ctx)
	endNow()
	for {
		fresh, err := client.WatchStream(ctx, s)
		require.NoError(t, err)
		a, b := v.Current(), fresh.Current()
		require.NoError(t, fresh.Cancel(ended))
		if a.Revision == b.Revision {
			require.JSONEq(t, string(b.State), string(a.State))
			break
		}
	}
	require.Zero(t, v.Resubscribes())
	require.NoError(t, v.Cancel(ctx))
	<-v.Done()
	require.NoError(t, v.Err())
	require.NoError(t, v.Cancel(ctx), "cancelling again")
}

// WatchProcessor follows a processor's live view: its processed offset as it processes, and
// the view ends with subscriptionRemoved when its subscription is removed.
func TestClientWatchProcessor(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "guestbook")})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/client/procview")
	configureProcessor(t, s, "guestbook")
	head := signGuestbook(t, s, 2)
	_, proc := processorOf(t, s, "guestbook")
	v, err := client.WatchProcessor(ctx, proc)
	require.NoError(t, err)
	defer v.Cancel(ctx)
	processed := func(want int64) func(json.RawMessage) bool {
		return func(state json.RawMessage) bool {
			var doc struct {
				ProcessedOffset int64 `json:"processedOffset"`
			}
			return json.Unmarshal(state, &doc) == nil && doc.ProcessedOffset == want
		}
	}
	_, err = v.Wait(ctx, processed(head))
	require.NoError(t, err)
	head = signGuestbook(t, s, 3)
	_, err = v.Wait(ctx, processed(head))
	require.NoError(t, err)

	_, err = client.RemoveSubscription(ctx, client.Subscriptions(ctx, s), "guestbook")
	require.NoError(t, err)
	select {
	case <-v.Done():
	case <-ctx.Done():
		t.Fatal("the view did not end with its subscription")
	}
	var cc *client.ConnectionClosed
	require.ErrorAs(t, v.Err(), &cc)
	require.Equal(t, schema.CloseReason_subscriptionRemoved, cc.Why)
}

// A connection reopened after a checkpoint with the stream id its offset belongs to is refused,
// notFound, when the path holds another stream (the one meant deleted and created again, its
// offsets starting over) or none, and delivers nothing: without the id it would open after
// the checkpoint on the new stream, silently skipping the new stream's first events.
func TestClientConnection_ExpectedStreamID(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	s := stream(t, p, "/client/expect")
	mustAppend(t, s, ev("old", `{}`), ev("old", `{}`))
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	old := info.StreamID

	// The stream it names: opens, delivers after the offset.
	b := newBatches()
	c, err := client.OpenConnection(ctx, s, client.ConnectionOptions{After: 1, ExpectedStreamID: old}, client.ConnectionHandler{Deliver: b.deliver})
	require.NoError(t, err)
	waitUntil(t, "the event after 1", func() bool { o, _ := b.got(); return len(o) == 1 })
	require.NoError(t, c.Close(ctx))

	_, err = client.DeleteStream(ctx, p, "/client/expect", true)
	require.NoError(t, err)
	// No stream at the path.
	none := newBatches()
	_, err = client.OpenConnection(ctx, s, client.ConnectionOptions{ExpectedStreamID: old}, client.ConnectionHandler{Deliver: none.deliver})
	require.Equal(t, itx.ENotFound, itx.ErrorCode(err), "%v", err)
	require.Contains(t, err.Error(), "holds no stream now")

	// Another stream at the path, as long as the old one was: after 1 of it would skip its event 1.
	mustAppend(t, s, ev("new", `{}`), ev("new", `{}`), ev("new", `{}`))
	info, err = client.Describe(ctx, s)
	require.NoError(t, err)
	_, err = client.OpenConnection(ctx, s, client.ConnectionOptions{After: 1, ExpectedStreamID: old}, client.ConnectionHandler{Deliver: none.deliver})
	require.Equal(t, itx.ENotFound, itx.ErrorCode(err), "%v", err)
	require.Contains(t, err.Error(), info.StreamID, "names the stream the path holds now")
	// The refused opens left nothing open under the key space, and delivered nothing.
	h, err := client.OpenConnection(ctx, s, client.ConnectionOptions{ExpectedStreamID: info.StreamID}, client.ConnectionHandler{Deliver: none.deliver})
	require.NoError(t, err)
	waitUntil(t, "the new stream's events", func() bool { o, _ := none.got(); return len(o) == 3 })
	o, _ := none.got()
	require.Equal(t, []int64{1, 2, 3}, o, "only the connection that named the new stream delivered")
	require.NoError(t, h.Close(ctx))

	_, err = client.OpenConnection(ctx, s, client.ConnectionOptions{ExpectedStreamID: strings.Repeat("x", 65)}, client.ConnectionHandler{Deliver: none.deliver})
	require.Equal(t, itx.EInvalid, itx.ErrorCode(err), "%v", err)
}
