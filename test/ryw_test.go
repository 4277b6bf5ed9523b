package test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Read-your-writes and monotonic reads: once a call is answered, every later call (on this RPC
// connection or another) sees its effect, and what a reader sees never goes backwards.

// closeConnection closes c and waits for the answer.
func closeConnection(t *testing.T, c schema.Connection) {
	t.Helper()
	fut, release := c.Close(context.Background(), func(p schema.Connection_close_Params) error { return p.SetReason("bye") })
	defer release()
	_, err := fut.Struct()
	require.NoError(t, err)
}

// A connection's close, once answered, has freed its key: a subscription configured under it
// is not refused as naming an open connection, and a live view asked for next does not list it.
func TestConnection_CloseIsSeenOnceAnswered(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/ryw/close")
	mustAppend(t, s, ev("a", `{}`))
	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	for i := range 50 {
		key := fmt.Sprintf("tab-%d", i)
		c, err := openConn(t, s, connOpts{key: key, noState: true}, newTestSink())
		require.NoError(t, err)
		closeConnection(t, c)
		_, _, err = client.ConfigureSubscription(e.ctx, subs, client.SubscriptionConfig{Name: key, Start: "now",
			Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "nobody"}})
		require.NoError(t, err, "round %d: the closed connection still holds its key", i)

		other := fmt.Sprintf("other-%d", i)
		c, err = openConn(t, s, connOpts{key: other, noState: true}, newTestSink())
		require.NoError(t, err)
		closeConnection(t, c)
		view := &liveView{}
		h := subscribeLive(t, s, view)
		var doc map[string]any
		waitUntil(t, "the first snapshot", func() bool {
			var rev uint64
			rev, doc = view.state()
			return rev > 0
		})
		conns, _ := doc["connections"].(map[string]any)
		require.NotContains(t, conns, other, "round %d: the first snapshot lists a connection closed before it was asked for", i)
		require.Equal(t, float64(0), doc["connectionsOpen"], "round %d", i)
		h.Release()
	}
}

// Streams.list never shows a stream older than an answered append left it, nor loses it, while
// the stream unloads for idleness: an unloading stream has left the loaded set before its
// directory summary is refreshed.
func TestStreamsList_UnloadShowsNoOlderHead(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	ts := startServer(t, server.Config{Clock: clock, IdleTimeout: time.Minute})
	ctx := ctxT(t)
	p := ts.project(t)
	sf, releaseStreams := p.Streams(ctx, nil)
	defer releaseStreams()
	streams := sf.Streams()
	for i := range 30 {
		path := fmt.Sprintf("/ryw/unload/%02d", i)
		s := stream(t, p, path)
		mustAppend(t, s, ev("a", `{}`), ev("a", `{}`)) // a stream created by this append: no summary before it
		unloaded := make(chan struct{})
		go func() {
			defer close(unloaded)
			clock.Advance(2 * time.Minute)
			ts.srv.Sweep()
		}()
		for done := false; !done; {
			select {
			case <-unloaded:
				done = true // one more listing, after the unload
			default:
			}
			page, _, err := client.ListStreamsPage(ctx, streams, path, "", 0)
			require.NoError(t, err)
			require.Len(t, page, 1, "round %d: the stream is missing from the listing", i)
			require.Equal(t, int64(2), page[0].HeadOffset, "round %d", i)
		}
		require.Zero(t, ts.srv.LoadedStreams())
	}
}

// A live view cancelled (the cancel answered) no longer counts against the stream's bound on
// live-state subscribers, and a connection closed no longer counts against its login's bound on
// live connections and views: the next one is not refused for a place the first still held.
func TestLive_EndedViewsFreeTheirPlaceOnceAnswered(t *testing.T) {
	t.Run("views per stream", func(t *testing.T) {
		ts := startServer(t, server.Config{MaxLiveSubscribersPerStream: 1})
		s := stream(t, ts.project(t), "/ryw/live-bound")
		mustAppend(t, s, ev("a", `{}`))
		for i := range 50 {
			fut, release := s.LiveState(context.Background(), func(p schema.Stream_liveState_Params) error {
				return p.SetSubscriber(schema.LiveSubscriber_ServerToClient(&liveView{}))
			})
			res, err := fut.Struct()
			require.NoError(t, err, "round %d: the view cancelled before still counts", i)
			cf, releaseCancel := res.Handle().Cancel(context.Background(), nil)
			_, err = cf.Struct()
			require.NoError(t, err)
			releaseCancel()
			release()
		}
	})
	t.Run("connections per login", func(t *testing.T) {
		ts := startServer(t, server.Config{MaxLivePerSession: 1})
		s := stream(t, ts.project(t), "/ryw/login-bound")
		mustAppend(t, s, ev("a", `{}`))
		for i := range 300 {
			c, err := openConn(t, s, connOpts{noState: true}, newTestSink())
			require.NoError(t, err, "round %d: the connection closed before still counts", i)
			closeConnection(t, c)
		}
	})
}

// A subscription's confirmed cursor, once shown, does not go back when an unrelated append is
// refused for a full disk: the stream reloads its state from storage then, and the delivery
// progress it had not yet written (the cursor's lazy flush) must not be forgotten with the
// refused step. (A redelivery is allowed at least once; this receiver never answers one, so the
// cursor can only have come back by forgetting.)
func TestSubscriptions_ConfirmedDoesNotGoBackAfterARefusedCommit(t *testing.T) {
	fs := mountTmpfs(t, "3m")
	ts := startServer(t, server.Config{DataDir: filepath.Join(fs, "data"), CursorFlushDelay: time.Hour})
	ctx := ctxT(t)
	p := ts.project(t)
	s := stream(t, p, "/ryw/full")
	var mu sync.Mutex
	var confirmed int64
	h, err := client.MountReceiver(ctx, p, "sink", client.ServeReceiver(func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
		last := b.Events[len(b.Events)-1].Offset
		mu.Lock()
		again := last <= confirmed
		confirmed = max(confirmed, last)
		mu.Unlock()
		if again {
			<-ctx.Done() // a redelivery: never confirmed again
			return 0, ctx.Err()
		}
		return last, nil
	}))
	require.NoError(t, err)
	defer h.Release()
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "sink",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "sink"}})
	require.NoError(t, err)
	sub := client.Subscription(ctx, s, "sink")
	defer sub.Release()
	var shown int64
	for i := 0; ; i++ {
		require.Less(t, i, 1000, "3 MiB never filled up")
		res, err := client.Append(ctx, s, kibEvents(20, i*20), itx.AppendOptions{})
		if err != nil {
			requireCode(t, err, itx.EResourceExhausted)
			break
		}
		shown, err = client.WaitUntilProcessed(ctx, sub, res.HeadOffset, 0)
		require.NoError(t, err)
	}
	d, err := client.DescribeSubscription(ctx, sub)
	require.NoError(t, err)
	require.GreaterOrEqual(t, d.ConfirmedOffset, shown, "the confirmed cursor went back")
}

// Streams.list after a clean restart on the same data directory shows no older head or standing
// than before it, delivery progress the cursor's lazy flush still held included.
func TestStreamsList_RestartShowsNoOlderStanding(t *testing.T) {
	dir := t.TempDir()
	ctx := ctxT(t)
	ts := startServer(t, server.Config{DataDir: dir, CursorFlushDelay: time.Hour})
	p := ts.project(t)
	s := stream(t, p, "/ryw/restart")
	h, err := client.MountReceiver(ctx, p, "sink", client.ServeReceiver(func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
		return b.Events[len(b.Events)-1].Offset, nil
	}))
	require.NoError(t, err)
	subs := client.Subscriptions(ctx, s)
	_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "sink",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "sink"}})
	require.NoError(t, err)
	subs.Release()
	head := mustAppend(t, s, ev("a", `{}`), ev("a", `{}`)).HeadOffset
	sub := client.Subscription(ctx, s, "sink")
	_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	sub.Release()
	before := listedStream(t, p, "/ryw/restart")
	require.Equal(t, []any{head, int64(0)}, []any{before.HeadOffset, before.MaxLag})
	h.Release()
	s.Release()
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, ts.srv.Close(cctx))

	ts2 := startServer(t, server.Config{DataDir: dir})
	after := listedStream(t, ts2.project(t), "/ryw/restart")
	require.Equal(t, []any{before.HeadOffset, before.MaxLag, before.HaltedSubscriptions, before.SubscriptionCount},
		[]any{after.HeadOffset, after.MaxLag, after.HaltedSubscriptions, after.SubscriptionCount})
}

// A connection replaced under its key by another login gives back its place under its own
// login's bound once the replacing open is answered: that login's next open is not refused.
func TestConnection_ReplacedGivesItsPlaceBackOnceAnswered(t *testing.T) {
	ts := startServer(t, server.Config{MaxLivePerSession: 1})
	a := stream(t, ts.project(t), "/ryw/cross-login")
	b := stream(t, ts.project(t), "/ryw/cross-login")
	mustAppend(t, a, ev("e", `{}`))
	for i := range 50 {
		key := fmt.Sprintf("tab-%d", i)
		_, err := openConn(t, a, connOpts{key: key, noState: true}, newTestSink())
		require.NoError(t, err, "round %d: the first login's replaced connection still counts", i)
		replacing, err := openConn(t, b, connOpts{key: key, noState: true}, newTestSink())
		require.NoError(t, err)
		closeConnection(t, replacing)
	}
}
