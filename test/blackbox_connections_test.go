package test

// Black-box checks of seed 000's connections, readers and live state, written from the seed, the
// schema and the client's documentation alone, over real RPC against a real itxd.

import (
	"context"
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

// bbSink collects what a connection delivers.
type bbSink struct {
	mu      sync.Mutex
	batches []itx.DeliveryBatch
	changed chan struct{}
}

func newBBSink() *bbSink { return &bbSink{changed: make(chan struct{}, 1)} }

func (s *bbSink) handler() client.ConnectionHandler {
	return client.ConnectionHandler{Deliver: func(_ context.Context, b itx.DeliveryBatch) error {
		s.mu.Lock()
		s.batches = append(s.batches, b)
		s.mu.Unlock()
		select {
		case s.changed <- struct{}{}:
		default:
		}
		return nil
	}}
}

func (s *bbSink) offsets() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int64
	for _, b := range s.batches {
		for _, e := range b.Events {
			out = append(out, e.Offset)
		}
	}
	return out
}

// waitFor waits until the sink holds n events, failing after the context ends.
func (s *bbSink) waitFor(t *testing.T, ctx context.Context, n int) []int64 {
	t.Helper()
	for {
		if got := s.offsets(); len(got) >= n {
			return got
		}
		select {
		case <-s.changed:
		case <-ctx.Done():
			t.Fatalf("waiting for %d events, have %v", n, s.offsets())
		}
	}
}

// A sink that holds the events through n pings back delivered n: its answer to their batch
// and the ping cross on the wire, and itxd answered the ping first, with less than the client
// had (about one round in two).
func TestBlackbox_ConnectionPingAfterTheEventsArrived(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/bb/ping")
	sink := newBBSink()
	c, err := client.OpenConnection(ctx, s, client.ConnectionOptions{}, sink.handler())
	require.NoError(t, err)
	defer c.Release()
	for n := int64(1); n <= 20; n++ {
		mustAppend(t, s, ev("a", `{}`))
		sink.waitFor(t, ctx, int(n))
		head, delivered, err := c.Ping(ctx)
		require.NoError(t, err)
		require.Equal(t, []int64{n, n}, []int64{head, delivered}, "round %d: head, delivered", n)
	}
}

// A stuck sink makes a ping wait at most PingSettleWait, then answer what the sink accepted.
func TestBlackbox_ConnectionPingOfAStuckSinkAnswers(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/bb/ping-stuck")
	mustAppend(t, s, ev("a", `{}`))
	arrived, unblock := make(chan struct{}), make(chan struct{})
	defer close(unblock)
	c, err := client.OpenConnection(ctx, s, client.ConnectionOptions{}, client.ConnectionHandler{
		Deliver: func(context.Context, itx.DeliveryBatch) error {
			close(arrived)
			<-unblock
			return nil
		}})
	require.NoError(t, err)
	defer c.Release()
	<-arrived
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	head, delivered, err := c.Ping(pctx)
	require.NoError(t, err)
	require.Equal(t, []int64{1, 0}, []int64{head, delivered})
}

// Close, then ping, through the Go client: failedPrecondition, as itxd answers a ping on a closed
// connection (the client gave the capability back at Close: the call reached go-capnp's released
// client, code internal). A replaced connection's ping says so too, and a second Close does
// nothing.
func TestBlackbox_ConnectionPingAfterClose(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/bb/close")
	mustAppend(t, s, ev("a", `{}`))
	sink := newBBSink()
	c, err := client.OpenConnection(ctx, s, client.ConnectionOptions{}, sink.handler())
	require.NoError(t, err)
	sink.waitFor(t, ctx, 1)
	require.NoError(t, c.Close(ctx))
	_, _, err = c.Ping(ctx)
	requireCode(t, err, itx.EFailedPrecondition)
	require.NoError(t, c.Close(ctx), "closing again does nothing")

	r, err := client.OpenConnection(ctx, s, client.ConnectionOptions{Key: "tab"}, newBBSink().handler())
	require.NoError(t, err)
	defer r.Release()
	r2, err := client.OpenConnection(ctx, s, client.ConnectionOptions{Key: "tab"}, newBBSink().handler())
	require.NoError(t, err)
	defer r2.Release()
	<-r.Done()
	_, _, err = r.Ping(ctx)
	requireCode(t, err, itx.EFailedPrecondition)
	r.Release()
	_, _, err = r.Ping(ctx)
	requireCode(t, err, itx.EFailedPrecondition)
}

// A close without a reason (the schema's reason is plain Text; itx's c.close() sends none) is
// told as "closedByClient", not "closedByClient: ", to the sink and to a later ping.
func TestBlackbox_ConnectionCloseWithoutAReason(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/bb/close-quiet")
	sink := newTestSink()
	c, err := openConn(t, s, connOpts{noState: true}, sink)
	require.NoError(t, err)
	// A second reference, to ping after the close.
	also := c.AddRef()
	defer also.Release()
	fut, release := c.Close(ctx, func(p schema.Connection_close_Params) error { return p.SetReason("") })
	_, err = fut.Struct()
	release()
	require.NoError(t, err)
	waitUntil(t, "closed", func() bool { return sink.closeReason() != nil })
	sink.mu.Lock()
	msg := sink.closeMs
	sink.mu.Unlock()
	require.Equal(t, "closedByClient", msg)
	_, _, err = ping(t, also)
	requireCode(t, err, itx.EFailedPrecondition)
	require.Equal(t, "the connection is closed: closedByClient", itx.ErrorMessage(err))
}

// A bad reader name or connection key is refused in its own words, not a subscription's.
func TestBlackbox_NamesRefusedInTheirOwnWords(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/bb/names")
	mustAppend(t, s, ev("a", `{}`))
	r := client.Readers(ctx, s)
	defer r.Release()
	err := client.RegisterReader(ctx, r, "", 1)
	requireCode(t, err, itx.EInvalid)
	require.Equal(t, "reader name must not be empty", itx.ErrorMessage(err))
	err = client.RegisterReader(ctx, r, strings.Repeat("r", 501), 1)
	requireCode(t, err, itx.EInvalid)
	require.Equal(t, "reader name is 501 characters, at most 500", itx.ErrorMessage(err))
	_, err = client.OpenConnection(ctx, s, client.ConnectionOptions{Key: strings.Repeat("k", 501)}, newBBSink().handler())
	requireCode(t, err, itx.EInvalid)
	require.Equal(t, "connection key is 501 characters, at most 500", itx.ErrorMessage(err))
}
