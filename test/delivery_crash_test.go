package test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A retry that is due after a restart is resumed by the stream's persisted alarm: nothing is
// appended to wake it.
func TestSubscription_RestartResumesPendingRetry(t *testing.T) {
	dir := t.TempDir()
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	var healthy = make(chan struct{})
	h := newHook(t, func(n int, b itx.WebhookBody) int {
		select {
		case <-healthy:
			return 200
		default:
			return 503
		}
	})
	ts := startServer(t, server.Config{DataDir: dir, Clock: clock, Random: func() float64 { return 0.5 }})
	e := &subEnv{ts: ts, clock: clock, p: ts.project(t), ctx: ctxT(t)}
	s := stream(t, e.p, "/retry")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "later", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	res := mustAppend(t, s, ev("job", `{}`))
	waitUntil(t, "first failure", func() bool { return e.describe(t, s, name).Attempt == 1 })
	closeCtx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, ts.srv.Close(closeCtx)) // a deploy

	close(healthy)
	ts2 := startServer(t, server.Config{DataDir: dir, Clock: clock, Random: func() float64 { return 0.5 }})
	require.Equal(t, 0, ts2.srv.LoadedStreams(), "the retry is not due yet: nothing loaded")
	clock.Advance(time.Second) // the retry comes due; only the alarm can wake the stream
	waitUntil(t, "delivered after the restart", func() bool { return h.count() == 2 })
	require.Equal(t, []int64{res.HeadOffset, res.HeadOffset}, h.received())
}

// kill -9 of a real itxd while it delivers to a webhook and copies into another stream; after a
// restart every event reaches the webhook at least once, first deliveries in offset order, and
// the copy holds each source event exactly once (redelivered copies dedupe).
func TestCrash_Kill9MidDelivery(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	h := newHook(t, nil)
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	src := client.Stream(ctx, p, "/src")
	subs := client.Subscriptions(ctx, src)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "hook", FilterTypes: []string{"e"},
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	require.NoError(t, err)
	_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "mirror", FilterTypes: []string{"e"},
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/mirror"}})
	require.NoError(t, err)
	subs.Release()

	const n = 600
	var streamID string
	for i := 0; i < n; i += 50 {
		batch := make([]itx.EventInput, 50)
		for j := range batch {
			batch[j] = ev("e", fmt.Sprintf(`{"i":%d}`, i+j))
		}
		res, err := client.Append(ctx, src, batch, itx.AppendOptions{})
		require.NoError(t, err)
		streamID = res.StreamID
	}
	src.Release()
	p.Release()
	waitUntil(t, "delivery under way", func() bool { return h.count() >= n/4 })
	proc.kill9(t)
	before := h.count()

	proc = startItxd(t, dataDir)
	waitUntil(t, "every event delivered after the restart", func() bool { return len(h.distinct()) >= n })
	first := h.distinct()
	for i := 1; i < len(first); i++ {
		require.Less(t, first[i-1], first[i], "first deliveries in offset order")
	}
	h.mu.Lock()
	for _, b := range h.bodies {
		require.Equal(t, streamID, b.StreamID, "receivers dedupe by (streamId, offset)")
	}
	h.mu.Unlock()
	t.Logf("%d webhook requests before the kill, %d in all for %d events", before, h.count(), n)

	p2 := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	defer p2.Release()
	src2 := stream(t, p2, "/src")
	mirror := stream(t, p2, "/mirror")
	sub := client.Subscription(ctx, src2, "mirror")
	defer sub.Release()
	head, err := client.Describe(ctx, src2)
	require.NoError(t, err)
	_, err = client.WaitUntilProcessed(ctx, sub, head.HeadOffset, 20*time.Second)
	require.NoError(t, err)
	copies, err := client.ReadAll(ctx, mirror, itx.Query{Types: []string{"e"}})
	require.NoError(t, err)
	require.Len(t, copies, n, "each source event copied exactly once")
	for i, c := range copies {
		require.Equal(t, int64(i+3), c.Provenance[0].Offset, "copies in source order")
	}
}

// A stream loaded by its alarm (not by a configure in the same incarnation) that fails again and
// idles out must still record its next retry, or the retry is lost until the next append.
func TestSubscription_RetryAlarmSurvivesRepeatedUnloads(t *testing.T) {
	dir := t.TempDir()
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	var mu sync.Mutex
	failures := 2
	h := newHook(t, func(n int, b itx.WebhookBody) int {
		mu.Lock()
		defer mu.Unlock()
		if failures > 0 {
			failures--
			return 503
		}
		return 200
	})
	cfg := server.Config{DataDir: dir, Clock: clock, Random: func() float64 { return 0.5 }, IdleTimeout: 100 * time.Millisecond}
	ts := startServer(t, cfg)
	e := &subEnv{ts: ts, clock: clock, p: ts.project(t), ctx: ctxT(t)}
	s := stream(t, e.p, "/again")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "again", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	res := mustAppend(t, s, ev("job", `{}`))
	waitUntil(t, "first failure", func() bool { return e.describe(t, s, name).Attempt == 1 })
	closeCtx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, ts.srv.Close(closeCtx))

	// A new incarnation: nothing configures anything in it.
	ts2 := startServer(t, cfg)
	clock.Advance(time.Second) // retry 1 due: the alarm loads the stream, the attempt fails again
	waitUntil(t, "second failure", func() bool { return h.count() == 2 })
	waitUntil(t, "unloaded while backing off", func() bool {
		clock.Advance(50 * time.Millisecond) // idle sweeps, well short of the 2 s backoff
		return ts2.srv.LoadedStreams() == 0
	})
	clock.Advance(2 * time.Second) // retry 2 due: only a recorded alarm can wake the stream
	waitUntil(t, "delivered", func() bool { return h.count() == 3 })
	require.Equal(t, []int64{res.HeadOffset}, h.distinct())
}

// kill -9 right after a delivery failed: the retry state the ladder just decided (attempt, next
// attempt time, last error) is what the restarted itxd shows and goes by, not a fresh ladder;
// the pending retry fires with nothing appended.
func TestCrash_Kill9KeepsRetryState(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	const failures = 2
	hang := make(chan struct{})
	h := newHook(t, func(n int, b itx.WebhookBody) int {
		if n < failures {
			return 503
		}
		<-hang // the retry after the restart: in flight until the test ends
		return 200
	})
	t.Cleanup(func() { close(hang) }) // before the hook's server closes
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	s := client.Stream(ctx, p, "/retry-kill")
	subs := client.Subscriptions(ctx, s)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "hook", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	require.NoError(t, err)
	subs.Release()
	mustAppend(t, s, ev("job", `{}`))
	sub := client.Subscription(ctx, s, "hook")
	var before itx.SubscriptionDescription
	waitUntil(t, "the second failure", func() bool {
		before, err = client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		return before.Attempt == failures
	})
	proc.kill9(t) // at once: before any later write of the row could happen
	sub.Release()
	s.Release()
	p.Release()

	proc = startItxd(t, dataDir)
	p = dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	defer p.Release()
	sub = client.Subscription(ctx, stream(t, p, "/retry-kill"), "hook")
	defer sub.Release()
	after, err := client.DescribeSubscription(ctx, sub)
	require.NoError(t, err)
	require.Equal(t, before.Attempt, after.Attempt, "attempt")
	require.Equal(t, before.NextAttemptAt, after.NextAttemptAt, "next attempt time")
	require.Equal(t, before.LastError, after.LastError, "last error")
	require.Equal(t, before.ConfirmedOffset, after.ConfirmedOffset)
	waitUntil(t, "the pending retry fires after the restart", func() bool { return h.count() == failures+1 })
}
