package test

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// subEnv is a server on a virtual clock with fixed jitter, so every backoff is exactly
// 1 s x 2^(attempt-1) (capped at 30 min).
type subEnv struct {
	ts    *testServer
	clock *clocktest.Clock
	p     schema.Project
	ctx   context.Context
}

// unloadAll moves the virtual clock past the idle timeout and sweeps until no stream is loaded
// (their summaries are then in the directory).
func (e *subEnv) unloadAll(t *testing.T) {
	t.Helper()
	waitUntil(t, "unloaded", func() bool {
		e.clock.Advance(2 * time.Minute)
		e.ts.srv.Sweep()
		return e.ts.srv.LoadedStreams() == 0
	})
}

func newSubEnv(t *testing.T, cfg server.Config) *subEnv {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	cfg.Clock, cfg.Random = clock, func() float64 { return 0.5 }
	ts := startServer(t, cfg)
	return &subEnv{ts: ts, clock: clock, p: ts.project(t), ctx: ctxT(t)}
}

func (e *subEnv) configure(t *testing.T, s schema.Stream, cfg client.SubscriptionConfig) (string, int64) {
	t.Helper()
	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	name, off, err := client.ConfigureSubscription(e.ctx, subs, cfg)
	require.NoError(t, err)
	return name, off
}

func (e *subEnv) describe(t *testing.T, s schema.Stream, name string) itx.SubscriptionDescription {
	t.Helper()
	return describeSubIn(e.ctx, t, s, name)
}

// describeSub describes one subscription of s (a context of its own: not for polling loops,
// which use describeSubIn with one context).
func describeSub(t *testing.T, s schema.Stream, name string) itx.SubscriptionDescription {
	t.Helper()
	return describeSubIn(ctxT(t), t, s, name)
}

func describeSubIn(ctx context.Context, t *testing.T, s schema.Stream, name string) itx.SubscriptionDescription {
	t.Helper()
	sub := client.Subscription(ctx, s, name)
	defer sub.Release()
	d, err := client.DescribeSubscription(ctx, sub)
	require.NoError(t, err)
	return d
}

// waitUntil polls an observable condition (never a fixed sleep).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 20*time.Second, time.Millisecond, what)
}

func (e *subEnv) list(t *testing.T, s schema.Stream) []itx.SubscriptionSummary {
	t.Helper()
	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	list, err := client.ListSubscriptions(e.ctx, subs)
	require.NoError(t, err)
	return list
}

// settle waits until the stream has taken every queued input and has no delivery in flight.
func (e *subEnv) settle(t *testing.T, path string) {
	t.Helper()
	require.NoError(t, e.ts.srv.Settle(e.ctx, server.StreamRef{ProjectID: "default", Path: path}))
}

func (e *subEnv) waitProcessed(t *testing.T, s schema.Stream, name string, offset int64) int64 {
	t.Helper()
	sub := client.Subscription(e.ctx, s, name)
	defer sub.Release()
	confirmed, err := client.WaitUntilProcessed(e.ctx, sub, offset, 15*time.Second)
	require.NoError(t, err)
	return confirmed
}

func newSecret(t *testing.T) (string, []byte) {
	key := make([]byte, 24)
	_, err := rand.Read(key)
	require.NoError(t, err)
	return "whsec_" + base64.StdEncoding.EncodeToString(key), key
}

func TestSubscription_WebhookFailsThenDelivers(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := newHook(t, func(n int, b itx.WebhookBody) int {
		if n < 2 {
			return 503
		}
		return 200
	})
	s := stream(t, e.p, "/orders")
	secret, key := newSecret(t)
	name, birth := e.configure(t, s, client.SubscriptionConfig{Name: " hook ", FilterTypes: []string{"order"},
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url(), Secret: secret}})
	require.Equal(t, "hook", name, "names are trimmed")
	require.Equal(t, int64(1), birth)
	mustAppend(t, s, ev("order", `{"id":1}`), ev("order", `{"id":2}`))

	waitUntil(t, "first failure recorded", func() bool { return e.describe(t, s, name).Attempt == 1 })
	d := e.describe(t, s, name)
	require.Contains(t, d.LastError, "503")
	require.Equal(t, int64(1), d.ConfirmedOffset, "the birth event did not match: the watermark passed it")
	require.Equal(t, e.clock.Now().Add(time.Second).UnixMilli(), d.NextAttemptAt)

	e.clock.Advance(time.Second)
	waitUntil(t, "second failure recorded", func() bool { return e.describe(t, s, name).Attempt == 2 })
	e.clock.Advance(2 * time.Second)
	require.Equal(t, int64(3), e.waitProcessed(t, s, name, 3))
	require.Equal(t, []int64{2, 2, 2, 3}, h.received())

	d = e.describe(t, s, name)
	require.Zero(t, d.Attempt)
	require.Empty(t, d.LastError)
	require.Equal(t, "active", d.Status)

	// Every request is signed the Standard Webhooks way: recompute each signature here, with
	// the standard library only, over the exact bytes received.
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Len(t, h.raw, 4)
	for i, hdr := range h.headers {
		id, ts, sig := hdr.Get("webhook-id"), hdr.Get("webhook-timestamp"), hdr.Get("webhook-signature")
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(id + "." + ts + "."))
		mac.Write(h.raw[i])
		require.Equal(t, "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)), sig, "request %d", i)
		var body map[string]any
		require.NoError(t, json.Unmarshal(h.raw[i], &body))
		require.Equal(t, name, body["subscription"])
	}
	require.Equal(t, h.headers[0].Get("webhook-id"), h.headers[2].Get("webhook-id"), "a retry keeps its webhook-id")
	require.NotEqual(t, h.headers[2].Get("webhook-id"), h.headers[3].Get("webhook-id"))
}

// The signature covers the exact bytes sent; verified with a hand-rolled HMAC, not the server's.
func TestSubscription_WebhookSignature(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	var mu sync.Mutex
	var raw []byte
	var hdr map[string]string
	h := newHook(t, nil)
	h.srv.Config.Handler = captureRaw(&mu, &raw, &hdr)
	s := stream(t, e.p, "/signed")
	secret, key := newSecret(t)
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "signed", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url(), Secret: secret,
			Headers: []client.Header{{Name: "X-Tenant", Value: "acme"}}}})
	res := mustAppend(t, s, ev("x", `{"v":1}`))
	e.waitProcessed(t, s, name, res.HeadOffset)

	mu.Lock()
	defer mu.Unlock()
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(hdr["webhook-id"] + "." + hdr["webhook-timestamp"] + "."))
	mac.Write(raw)
	require.Equal(t, "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)), hdr["webhook-signature"])

	// client.VerifyWebhook, what a Go receiver calls, accepts exactly this delivery.
	header := http.Header{}
	for k, v := range hdr {
		header.Set(k, v)
	}
	now := e.clock.Now()
	require.NoError(t, client.VerifyWebhook(secret, header, raw, now))
	requireCode(t, client.VerifyWebhook(secret, header, append(append([]byte(nil), raw...), ' '), now), itx.EUnauthenticated)
	other, _ := newSecret(t)
	requireCode(t, client.VerifyWebhook(other, header, raw, now), itx.EUnauthenticated)
	requireCode(t, client.VerifyWebhook(secret, header, raw, now.Add(client.WebhookTolerance+time.Second)), itx.EInvalid)
	rotated := header.Clone() // several signatures (a key rotation): any one matching is enough
	rotated.Set("webhook-signature", "v1,"+base64.StdEncoding.EncodeToString([]byte("not this one"))+" "+hdr["webhook-signature"])
	require.NoError(t, client.VerifyWebhook(secret, rotated, raw, now))
	unsigned := header.Clone()
	unsigned.Del("webhook-signature")
	requireCode(t, client.VerifyWebhook(secret, unsigned, raw, now), itx.EUnauthenticated)

	require.Equal(t, "acme", hdr["X-Tenant"])
	require.Equal(t, "application/json", hdr["Content-Type"])
	var body itx.WebhookBody
	require.NoError(t, json.Unmarshal(raw, &body))
	require.Equal(t, int64(2), body.Event.Offset)
	require.Equal(t, "/signed", body.Path)
	require.Equal(t, res.StreamID, body.StreamID)
}

func TestSubscription_LadderHaltsThenResumes(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	var broken sync.Map
	broken.Store("on", true)
	h := newHook(t, func(n int, b itx.WebhookBody) int {
		if v, _ := broken.Load("on"); v == true {
			return 500
		}
		return 204
	})
	s := stream(t, e.p, "/ladder")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "fragile", Start: "now", FilterTypes: []string{"job"},
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	res := mustAppend(t, s, ev("job", `{"n":1}`))

	var waited time.Duration
	for attempt := 1; attempt < itx.MaxDeliveryAttempts; attempt++ {
		waitUntil(t, fmt.Sprintf("attempt %d failed", attempt), func() bool { return e.describe(t, s, name).Attempt == attempt })
		backoff := itx.Backoff(attempt, 0.5)
		waited += backoff
		e.clock.Advance(backoff)
	}
	waitUntil(t, "halted", func() bool { return e.describe(t, s, name).Status == "halted" })
	require.Equal(t, itx.MaxDeliveryAttempts, h.count(), "15 attempts, then the halt")
	require.Equal(t, 1.0, testutil.ToFloat64(e.ts.srv.Metrics().SubscriptionHalts), "the halt is counted for the operator")
	require.True(t, waited > 2*time.Hour && waited < 150*time.Minute, "the ladder spans about 2-2.5 h: %s", waited)

	halts, err := client.GetEvents(e.ctx, s, itx.Query{Types: []string{itx.TypeSubscriptionHalted}})
	require.NoError(t, err)
	require.Len(t, halts, 1)
	var halted itx.HaltedPayload
	require.NoError(t, json.Unmarshal(halts[0].Payload, &halted))
	require.Equal(t, name, halted.Name)
	require.Equal(t, itx.MaxDeliveryAttempts, halted.Attempts)
	require.Contains(t, halted.Error, "500")
	require.Equal(t, res.HeadOffset-1, halted.AfterOffset)

	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	list, err := client.ListSubscriptions(e.ctx, subs)
	require.NoError(t, err)
	require.Equal(t, "halted", list[0].Status)
	require.Contains(t, list[0].LastError, "500")
	require.Equal(t, int64(2), list[0].Lag, "the job and the halt event are both behind the cursor")

	// Halted means halted: time passing sends nothing, once the stream has taken every timer
	// that came due (Settle) and has no delivery in flight.
	mustAppend(t, s, ev("job", `{"n":2}`))
	e.clock.Advance(24 * time.Hour)
	e.settle(t, "/ladder")
	require.Equal(t, itx.MaxDeliveryAttempts, h.count())

	broken.Store("on", false)
	_, err = client.ResumeSubscription(e.ctx, s, name)
	require.NoError(t, err)
	head, _ := client.Describe(e.ctx, s)
	e.waitProcessed(t, s, name, head.HeadOffset)
	require.Equal(t, itx.MaxDeliveryAttempts+2, h.count(), "the job delivered once more, then the job appended while halted")
	require.Equal(t, []int64{res.HeadOffset, res.HeadOffset + 2}, h.distinct())
	d := e.describe(t, s, name)
	require.Equal(t, "active", d.Status)
	require.Zero(t, d.Attempt)

	_, err = client.ResumeSubscription(e.ctx, s, name)
	requireCode(t, err, itx.EFailedPrecondition)
}

func TestSubscription_SeekBackAndForward(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := newHook(t, func(n int, b itx.WebhookBody) int {
		if strings.Contains(string(b.Event.Payload), "skip") {
			return 503 // stuck retrying until the seek moves past it
		}
		return 200
	})
	s := stream(t, e.p, "/seek")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "tail", FilterTypes: []string{"order"},
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	mustAppend(t, s, ev("order", `{"n":1}`), ev("order", `{"n":2}`), ev("order", `{"n":3}`))
	e.waitProcessed(t, s, name, 4)
	require.Equal(t, []int64{2, 3, 4}, h.received())

	seekOffset, err := client.SetSubscriptionCursor(e.ctx, s, name, 2)
	require.NoError(t, err)
	e.waitProcessed(t, s, name, seekOffset)
	require.Equal(t, []int64{2, 3, 4, 3, 4}, h.received(), "rewound: everything after offset 2 again")
	d := e.describe(t, s, name)
	require.Equal(t, seekOffset, d.CursorChangedAtOffset, "the seek is the new epoch")

	mustAppend(t, s, ev("order", `{"n":4}`), ev("order", `{"n":5}`)) // offsets 6, 7
	e.waitProcessed(t, s, name, 7)
	seekOffset, err = client.SetSubscriptionCursor(e.ctx, s, name, 7)
	require.NoError(t, err)
	mustAppend(t, s, ev("order", `{"n":6}`))
	e.waitProcessed(t, s, name, seekOffset+1)
	require.Equal(t, []int64{2, 3, 4, 3, 4, 6, 7, 9}, h.received())

	// Forward past events the receiver keeps refusing: they are never delivered again.
	mustAppend(t, s, ev("order", `{"skip":1}`), ev("order", `{"skip":2}`)) // 10, 11
	waitUntil(t, "offset 10 refused", func() bool { return e.describe(t, s, name).Attempt == 1 })
	_, err = client.SetSubscriptionCursor(e.ctx, s, name, 11)
	require.NoError(t, err)
	head := mustAppend(t, s, ev("order", `{"after":1}`))
	e.waitProcessed(t, s, name, head.HeadOffset)
	require.Equal(t, []int64{2, 3, 4, 3, 4, 6, 7, 9, 10, 13}, h.received(), "11 skipped, 10 not retried")

	_, err = client.SetSubscriptionCursor(e.ctx, s, name, 1000)
	requireCode(t, err, itx.EInvalid)
	_, err = client.SetSubscriptionCursor(e.ctx, s, "nobody", 0)
	requireCode(t, err, itx.ENotFound)
}

func TestSubscription_FilterWatermark(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := newHook(t, nil)
	s := stream(t, e.p, "/watermark")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "big-orders",
		FilterTypes: []string{"order"}, FilterCondition: "payload.total > 10",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	mustAppend(t, s, ev("order", `{"total":5}`), ev("note", `{}`), ev("order", `{"total":20}`), ev("note", `{}`))
	eph := ev("order", `{"total":99}`)
	eph.Ephemeral = true
	mustAppend(t, s, eph) // offset 6: subscriptions never see ephemeral events

	require.Equal(t, int64(6), e.waitProcessed(t, s, name, 6), "resolves for offsets the receiver never saw")
	require.Equal(t, []int64{4}, h.received())
	require.Equal(t, int64(6), e.waitProcessed(t, s, name, 3))

	sub := client.Subscription(e.ctx, s, name)
	defer sub.Release()
	timers := e.clock.Pending()
	errc := make(chan error, 1)
	go func() {
		_, err := client.WaitUntilProcessed(e.ctx, sub, 50, 5*time.Second)
		errc <- err
	}()
	waitUntil(t, "barrier armed", func() bool { return e.clock.Pending() > timers })
	e.clock.Advance(5 * time.Second)
	err := <-errc
	requireCode(t, err, itx.EDeadlineExceeded)
	require.Contains(t, itx.ErrorMessage(err), "confirmed 6 < 50")
	missing := client.Subscription(e.ctx, s, "missing")
	defer missing.Release()
	_, err = client.WaitUntilProcessed(e.ctx, missing, 1, time.Second)
	requireCode(t, err, itx.ENotFound)
}

func TestSubscription_SkipPolicy(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := newHook(t, func(n int, b itx.WebhookBody) int {
		if strings.Contains(string(b.Event.Payload), "poison") {
			return 422
		}
		return 200
	})
	s := stream(t, e.p, "/skip")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "lenient", Start: "now", OnFailingEvent: "skip", FilterTypes: []string{"m"},
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	mustAppend(t, s, ev("m", `{"ok":1}`), ev("m", `{"poison":true}`), ev("m", `{"ok":2}`)) // 2, 3, 4

	for attempt := 1; attempt < itx.FailingEventConfirmAttempts; attempt++ {
		waitUntil(t, "poison failed", func() bool { return e.describe(t, s, name).FailingEventAttempt == attempt })
		require.Equal(t, int64(3), e.describe(t, s, name).FailingEventOffset)
		e.clock.Advance(itx.Backoff(attempt, 0.5))
	}
	e.waitProcessed(t, s, name, 4)
	require.Equal(t, []int64{2, 3, 3, 3, 4}, h.received())
	errs, err := client.GetEvents(e.ctx, s, itx.Query{Types: []string{itx.TypeErrorOccurred}})
	require.NoError(t, err)
	require.Len(t, errs, 1)
	require.Contains(t, string(errs[0].Payload), "skipped failing event at offset 3")
	require.Equal(t, "active", e.describe(t, s, name).Status)
	require.Equal(t, 1.0, testutil.ToFloat64(e.ts.srv.Metrics().SkippedEvents), "the skip is counted for the operator")
	require.Zero(t, testutil.ToFloat64(e.ts.srv.Metrics().SubscriptionHalts))
}

// A late acknowledgement from an older epoch is refused: the receiver answers 200 for a
// delivery made before a seek, and the cursor does not move past the seek because of it.
func TestSubscription_LateAckRefused(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	release := make(chan struct{})
	h := newHook(t, func(n int, b itx.WebhookBody) int {
		if n == 0 {
			<-release // the first delivery hangs until the seek has committed
		}
		return 200
	})
	s := stream(t, e.p, "/late")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "slow", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	mustAppend(t, s, ev("a", `{}`), ev("b", `{}`)) // 2, 3
	waitUntil(t, "first delivery in flight", func() bool { return h.count() == 1 })

	seek, err := client.SetSubscriptionCursor(e.ctx, s, name, 1) // offset 4: a new seek epoch
	require.NoError(t, err)
	late := testutil.ToFloat64(e.ts.srv.Metrics().LateAcks)
	close(release)
	waitUntil(t, "late ack refused", func() bool { return testutil.ToFloat64(e.ts.srv.Metrics().LateAcks) == late+1 })

	e.waitProcessed(t, s, name, seek)
	require.Equal(t, []int64{2, 2, 3, 4}, h.received(), "offset 2 redelivered under the new epoch")
}

// receiverServer is a client-side Receiver capability recording what it is given.
type receiverServer struct {
	mu     sync.Mutex
	events []itx.Event
	seen   chan struct{}
}

func newReceiverServer() *receiverServer { return &receiverServer{seen: make(chan struct{}, 1000)} }

func (r *receiverServer) receive(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
	r.mu.Lock()
	r.events = append(r.events, b.Events...)
	r.mu.Unlock()
	r.seen <- struct{}{}
	return 0, nil
}

func (r *receiverServer) types() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		out = append(out, e.Type)
	}
	return out
}

// mountReceiver mounts a Receiver under name on its own connection and returns a function that
// drops the connection.
func mountReceiver(t *testing.T, addr, token, name string, r *receiverServer) (disconnect func()) {
	return mountReceive(t, addr, token, name, r.receive)
}

// mountReceive mounts a Receiver serving receive under name on its own connection and returns
// a function that drops the connection.
func mountReceive(t *testing.T, addr, token, name string, receive func(context.Context, itx.DeliveryBatch) (int64, error)) (disconnect func()) {
	conn := dial(t, addr)
	ctx := context.Background()
	p := conn.Login(ctx, token)
	handle, err := client.MountReceiver(ctx, p, name, client.ServeReceiver(receive))
	require.NoError(t, err)
	return func() {
		handle.Release()
		p.Release()
		conn.Close()
	}
}

func TestSubscription_ITXCallReceiverReconnects(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/calls")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "app", FilterTypes: []string{"msg"},
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}})

	first := newReceiverServer()
	disconnect := mountReceiver(t, e.ts.addr, e.ts.creds.ProjectToken, "inbox", first)
	mustAppend(t, s, ev("msg", `{"n":1}`))
	e.waitProcessed(t, s, name, 2)
	require.Equal(t, []string{"msg"}, first.types())

	disconnect()
	waitUntil(t, "unmounted", func() bool { return len(e.ts.srv.Mounts("default")) == 0 })
	mustAppend(t, s, ev("msg", `{"n":2}`))
	// An absent receiver parks the subscription: no attempt is burnt, nothing is skipped.
	waitUntil(t, "parked", func() bool { return e.describe(t, s, name).Status == "parked" })
	d := e.describe(t, s, name)
	require.Contains(t, d.LastError, "offline")
	require.Equal(t, int64(2), d.ConfirmedOffset)
	require.Zero(t, d.Attempt, "parking burns no attempts")
	require.Equal(t, "parked", e.list(t, s)[0].Status, "list shows the parked status")

	// Re-mounting is the presence signal: delivery resumes without waiting out the backoff
	// (the virtual clock does not move here).
	second := newReceiverServer()
	defer mountReceiver(t, e.ts.addr, e.ts.creds.ProjectToken, "inbox", second)()
	e.waitProcessed(t, s, name, 3)
	require.Equal(t, []string{"msg"}, second.types())
	require.Equal(t, []string{"msg"}, first.types(), "the departed receiver got nothing more")
}

func TestSubscription_CopyChainWithTransform(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	a, b, c := stream(t, e.p, "/a"), stream(t, e.p, "/b"), stream(t, e.p, "/c")
	ab, _ := e.configure(t, a, client.SubscriptionConfig{Name: "to-b", FilterTypes: []string{"order"},
		Transform: `{"type": "copied/" & type, "payload": {"total": payload.total * 2}}`,
		Receiver:  client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/b"}})
	bc, _ := e.configure(t, b, client.SubscriptionConfig{Name: "to-c", FilterTypes: []string{"copied/order"},
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/c"}})
	src := mustAppend(t, a, ev("order", `{"total":21}`), ev("note", `{}`))

	e.waitProcessed(t, a, ab, src.HeadOffset)
	bHead, err := client.Describe(e.ctx, b)
	require.NoError(t, err)
	e.waitProcessed(t, b, bc, bHead.HeadOffset)
	got, err := client.GetEvents(e.ctx, c, itx.Query{})
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, "copied/order", got[0].Type)
	require.JSONEq(t, `{"total":42}`, string(got[0].Payload))
	require.Len(t, got[0].Provenance, 2)
	require.Equal(t, "/a", got[0].Provenance[0].Path)
	require.Equal(t, "order", got[0].Provenance[0].Type, "the hop records the source as it was")
	require.Equal(t, int64(2), got[0].Provenance[0].Offset)
	require.Equal(t, src.StreamID, got[0].Provenance[0].StreamID)
	require.Equal(t, "/b", got[0].Provenance[1].Path)

	// A client cannot forge provenance or use the server's key namespace.
	_, err = client.Append(e.ctx, c, []itx.EventInput{{Type: "x", IdempotencyKey: itx.InternalKeyPrefix + "copy:x"}}, itx.AppendOptions{})
	requireCode(t, err, itx.EInvalid)
}

func TestSubscription_CopyCycleSuppressed(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	x, y := stream(t, e.p, "/x"), stream(t, e.p, "/y")
	xy, _ := e.configure(t, x, client.SubscriptionConfig{Name: "x-to-y", FilterTypes: []string{"ping", itx.TypeErrorOccurred},
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/y"}})
	yx, _ := e.configure(t, y, client.SubscriptionConfig{Name: "y-to-x", FilterTypes: []string{"ping", itx.TypeErrorOccurred},
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/x"}})
	mustAppend(t, x, ev("ping", `{"n":1}`))

	waitUntil(t, "the drop audited on /x", func() bool {
		audits, err := client.GetEvents(e.ctx, x, itx.Query{Types: []string{itx.TypeErrorOccurred}})
		return err == nil && len(audits) > 0
	})
	// Then both sides caught up, with heads that did not move while we looked: the loop ended.
	waitUntil(t, "both caught up", func() bool {
		hx, _ := client.Describe(e.ctx, x)
		hy, _ := client.Describe(e.ctx, y)
		dx, dy := e.describe(t, x, xy), e.describe(t, y, yx)
		hx2, _ := client.Describe(e.ctx, x)
		hy2, _ := client.Describe(e.ctx, y)
		return hx == hx2 && hy == hy2 && dx.ConfirmedOffset == hx.HeadOffset && dy.ConfirmedOffset == hy.HeadOffset
	})
	ys, err := client.GetEvents(e.ctx, y, itx.Query{Types: []string{"ping"}})
	require.NoError(t, err)
	require.Len(t, ys, 1, "/y got the ping once")
	xs, err := client.GetEvents(e.ctx, x, itx.Query{Types: []string{"ping"}})
	require.NoError(t, err)
	require.Len(t, xs, 1, "the copy back into /x was suppressed")
	audits, err := client.GetEvents(e.ctx, x, itx.Query{Types: []string{itx.TypeErrorOccurred}})
	require.NoError(t, err)
	require.Len(t, audits, 1, "one audit record of the drop, on the stream that refused it")
	require.Contains(t, string(audits[0].Payload), "already contains this stream")
	hx, _ := client.Describe(e.ctx, x)
	hy, _ := client.Describe(e.ctx, y)
	require.Less(t, hx.HeadOffset+hy.HeadOffset, int64(10), "no runaway loop")
}

// Raw appends of control events are validated exactly like the verbs that append them.
func TestSubscription_ControlEventValidation(t *testing.T) {
	e := newSubEnv(t, server.Config{MaxSubscriptions: 3})
	s := stream(t, e.p, "/ctl")
	h := newHook(t, nil)
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "ok",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	webhook := `"receiver":{"action":"webhook-post","url":"` + h.url() + `"}`
	for _, tc := range []struct {
		name    string
		typ     string
		payload string
		code    itx.Code
	}{
		{"name too long", itx.TypeSubscriptionConfigured, `{"name":"` + strings.Repeat("n", 501) + `",` + webhook + `}`, itx.EInvalid},
		{"unknown receiver", itx.TypeSubscriptionConfigured, `{"receiver":{"action":"carrier-pigeon"}}`, itx.EInvalid},
		{"unknown field", itx.TypeSubscriptionConfigured, `{"colour":"red",` + webhook + `}`, itx.EInvalid},
		{"bad filter", itx.TypeSubscriptionConfigured, `{"filter":{"jsonataCondition":"payload.("},` + webhook + `}`, itx.EInvalid},
		{"empty filter types", itx.TypeSubscriptionConfigured, `{"filter":{"eventTypes":[]},` + webhook + `}`, itx.EInvalid},
		{"bad transform", itx.TypeSubscriptionConfigured, `{"receiver":{"action":"itx-call","capability":"c","jsonataTransform":"$$$("}}`, itx.EInvalid},
		{"transform on processor-wake", itx.TypeSubscriptionConfigured, `{"receiver":{"action":"processor-wake","jsonataTransform":"$"}}`, itx.EInvalid},
		{"copy into itself", itx.TypeSubscriptionConfigured, `{"receiver":{"action":"copy-to-stream","receivingStreamPath":"/ctl"}}`, itx.EInvalid},
		{"copy may not skip", itx.TypeSubscriptionConfigured, `{"receiver":{"action":"copy-to-stream","receivingStreamPath":"/z","delivery":{"start":"now","onFailingEvent":"skip"}}}`, itx.EInvalid},
		{"webhook not http", itx.TypeSubscriptionConfigured, `{"receiver":{"action":"webhook-post","url":"ftp://x"}}`, itx.EInvalid},
		{"generated namespace", itx.TypeSubscriptionConfigured, `{"name":"subscription:99",` + webhook + `}`, itx.EInvalid},
		{"cursor-set unknown", itx.TypeSubscriptionCursorSet, `{"name":"nobody","afterOffset":0}`, itx.ENotFound},
		{"cursor-set beyond head", itx.TypeSubscriptionCursorSet, `{"name":"ok","afterOffset":99}`, itx.EInvalid},
		{"resume not halted", itx.TypeSubscriptionResumed, `{"name":"ok"}`, itx.EFailedPrecondition},
		{"halt is the server's", itx.TypeSubscriptionHalted, `{"name":"ok","reason":"delivery-failed","afterOffset":0,"attempts":1}`, itx.EInvalid},
		{"remove unknown", itx.TypeSubscriptionRemoved, `{"name":"nobody","reason":"requested"}`, itx.ENotFound},
		{"remove without reason", itx.TypeSubscriptionRemoved, `{"name":"ok"}`, itx.EInvalid},
		{"woken is the server's", itx.TypeWoken, `{}`, itx.EInvalid},
		{"error without message", itx.TypeErrorOccurred, `{"message":" "}`, itx.EInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, err := client.Describe(e.ctx, s)
			require.NoError(t, err)
			_, err = client.Append(e.ctx, s, []itx.EventInput{ev("ok", `{}`), ev(tc.typ, tc.payload)}, itx.AppendOptions{})
			requireCode(t, err, tc.code)
			after, err := client.Describe(e.ctx, s)
			require.NoError(t, err)
			require.Equal(t, before.HeadOffset, after.HeadOffset, "nothing written")
		})
	}

	t.Run("a raw configure is a configure", func(t *testing.T) {
		res := mustAppend(t, s, ev(itx.TypeSubscriptionConfigured, `{`+webhook+`}`))
		subs := client.Subscriptions(e.ctx, s)
		defer subs.Release()
		list, err := client.ListSubscriptions(e.ctx, subs)
		require.NoError(t, err)
		require.Len(t, list, 2)
		require.Equal(t, fmt.Sprintf("subscription:%d", res.Offsets[0]), list[1].Name)
		require.Equal(t, "webhook-post", list[1].Kind)
	})
	t.Run("the cap on subscriptions per stream", func(t *testing.T) {
		e.configure(t, s, client.SubscriptionConfig{Name: "third", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
		subs := client.Subscriptions(e.ctx, s)
		defer subs.Release()
		_, _, err := client.ConfigureSubscription(e.ctx, subs, client.SubscriptionConfig{Name: "fourth",
			Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
		requireCode(t, err, itx.ELimitExceeded)
		// Reconfiguring an existing name is not a new subscription.
		e.configure(t, s, client.SubscriptionConfig{Name: "third", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	})
	t.Run("removal", func(t *testing.T) {
		subs := client.Subscriptions(e.ctx, s)
		defer subs.Release()
		_, err := client.RemoveSubscription(e.ctx, subs, name)
		require.NoError(t, err)
		list, err := client.ListSubscriptions(e.ctx, subs)
		require.NoError(t, err)
		for _, l := range list {
			require.NotEqual(t, name, l.Name)
		}
	})
}

func TestSubscription_EgressPolicy(t *testing.T) {
	e := newSubEnv(t, server.Config{Egress: server.EgressPolicy{DenyPrivate: true}})
	s := stream(t, e.p, "/egress")
	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	h := newHook(t, nil)
	_, _, err := client.ConfigureSubscription(e.ctx, subs, client.SubscriptionConfig{Name: "local",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	requireCode(t, err, itx.EInvalid)
	require.Contains(t, itx.ErrorMessage(err), "private")

	// A name reserved for local use is refused at configure too; a name that resolves to a
	// refused address is refused at connect (server/egress_test.go).
	_, _, err = client.ConfigureSubscription(e.ctx, subs, client.SubscriptionConfig{Name: "by-name",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: strings.Replace(h.url(), "127.0.0.1", "localhost", 1)}})
	requireCode(t, err, itx.EInvalid)
	require.Contains(t, itx.ErrorMessage(err), "reserved for local use")
	require.Zero(t, h.count())
}

func TestStreams_ListShowsSubscriptions(t *testing.T) {
	e := newSubEnv(t, server.Config{IdleTimeout: time.Minute})
	s := stream(t, e.p, "/listed")
	for _, name := range []string{"one", "two"} {
		e.configure(t, s, client.SubscriptionConfig{Name: name, FilterTypes: []string{"never"},
			Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "x"}})
	}
	e.waitProcessed(t, s, "two", 2) // caught up by watermark: nothing pins the stream
	list, err := client.ListStreams(e.ctx, e.p, "/listed")
	require.NoError(t, err)
	require.Equal(t, 2, list[0].SubscriptionCount, "live, while loaded")

	// A deliverer finishing its pass still pins the stream for a moment after the ack that
	// waitProcessed saw, and its release counts as a use; a later idle period unloads it.
	waitUntil(t, "the idle stream unloaded", func() bool {
		e.clock.Advance(2 * time.Minute)
		e.ts.srv.Sweep()
		return e.ts.srv.LoadedStreams() == 0
	})
	list, err = client.ListStreams(e.ctx, e.p, "/listed")
	require.NoError(t, err)
	require.False(t, list[0].Loaded)
	require.Equal(t, 2, list[0].SubscriptionCount, "from the directory summary")
}

// A transform that runs away is a failing delivery like any other: recorded, retried, and the
// server keeps serving (unbounded, this recursion overflows the Go stack and ends the process,
// and the stored subscription would end it again on every restart).
func TestSubscription_RunawayTransformFailsTheDelivery(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	src := stream(t, e.p, "/runaway")
	name, _ := e.configure(t, src, client.SubscriptionConfig{Name: "copy", FilterTypes: []string{"order"},
		Transform: `($f := function($x){ $f($x) + 1 }; {"payload": {"n": $f(1)}})`,
		Receiver:  client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/runaway-copy"}})
	mustAppend(t, src, ev("order", `{"id":1}`))

	waitUntil(t, "the failure recorded", func() bool { return e.describe(t, src, name).Attempt == 1 })
	require.Contains(t, e.describe(t, src, name).LastError, "depth limit")
	// The failure is evidence on the stream too: one stream/error-occurred at offset 3.
	res := mustAppend(t, src, ev("note", `{}`))
	require.Equal(t, []int64{4}, res.Offsets, "the server still serves")
	evs, err := client.GetEvents(e.ctx, src, itx.Query{})
	require.NoError(t, err)
	require.Equal(t, "stream/error-occurred", evs[2].Type)
	require.Contains(t, string(evs[2].Payload), "depth limit")
}

// Webhook requests open at once are bounded over every subscription (each holds a socket): with
// room for 2, the other deliveries wait for a slot, holding no socket and losing nothing.
func TestSubscription_WebhooksInFlightBounded(t *testing.T) {
	e := newSubEnv(t, server.Config{MaxWebhooksInFlight: 2})
	var mu sync.Mutex
	inFlight, most := 0, 0
	hold := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		defer func() { mu.Lock(); inFlight--; mu.Unlock() }()
		select {
		case <-hold:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	var streams []schema.Stream
	for i := range 4 {
		s := stream(t, e.p, fmt.Sprintf("/hooks/%d", i))
		e.configure(t, s, client.SubscriptionConfig{Name: "hook", Start: "now",
			Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: srv.URL}})
		streams = append(streams, s)
	}
	timers := e.clock.Pending()
	for _, s := range streams {
		mustAppend(t, s, ev("x", `{}`))
	}
	waitUntil(t, "two requests open", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return inFlight == 2
	})
	require.Equal(t, 2.0, testutil.ToFloat64(e.ts.srv.Metrics().WebhooksInFlight))
	require.Equal(t, timers+2, e.clock.Pending(), "only the two sent have a delivery timeout running")
	close(hold)
	for _, s := range streams {
		e.waitProcessed(t, s, "hook", 2)
	}
	mu.Lock()
	require.Equal(t, 2, most, "requests open at once")
	mu.Unlock()
}
