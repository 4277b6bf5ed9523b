package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// batchRecorder is a Receiver that records each delivery's offsets.
type batchRecorder struct {
	mu      sync.Mutex
	batches [][]int64
}

func (r *batchRecorder) receive(_ context.Context, b itx.DeliveryBatch) (int64, error) {
	var offs []int64
	for _, e := range b.Events {
		offs = append(offs, e.Offset)
	}
	r.mu.Lock()
	r.batches = append(r.batches, offs)
	r.mu.Unlock()
	return 0, nil
}

func (r *batchRecorder) got() [][]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]int64(nil), r.batches...)
}

// Per-subscription delivery controls narrow each delivery: maxDeliveryEvents caps the events,
// maxDeliveryBytes the bytes (the first event always goes); describe reports them, and the same
// config configured again is unchanged.
func TestSubscription_DeliveryControls_ITXCall(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	events := &batchRecorder{}
	h, err := client.MountReceiver(e.ctx, e.p, "by-two", client.ServeReceiver(events.receive))
	require.NoError(t, err)
	defer h.Release()
	sized := &batchRecorder{}
	h2, err := client.MountReceiver(e.ctx, e.p, "by-bytes", client.ServeReceiver(sized.receive))
	require.NoError(t, err)
	defer h2.Release()

	s, s2 := stream(t, e.p, "/controls"), stream(t, e.p, "/controls-bytes")
	cfg := client.SubscriptionConfig{Name: "two", Start: "now", MaxDeliveryEvents: 2,
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "by-two"}}
	_, birth := e.configure(t, s, cfg)
	_, birth2 := e.configure(t, s2, client.SubscriptionConfig{Name: "bytes", Start: "now", MaxDeliveryBytes: 800,
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "by-bytes"}})
	// 5 events of ~300 bytes in one append: at most 2 per delivery by count; by bytes (800) at
	// most 2 as well, since a third would pass the bound.
	big := `{"p":"` + strings.Repeat("x", 300) + `"}`
	five := []itx.EventInput{ev("a", big), ev("a", big), ev("a", big), ev("a", big), ev("a", big)}
	e.waitProcessed(t, s, "two", mustAppend(t, s, five...).HeadOffset)
	e.waitProcessed(t, s2, "bytes", mustAppend(t, s2, five...).HeadOffset)

	f, f2 := birth+1, birth2+1
	require.Equal(t, [][]int64{{f, f + 1}, {f + 2, f + 3}, {f + 4}}, events.got())
	require.Equal(t, [][]int64{{f2, f2 + 1}, {f2 + 2, f2 + 3}, {f2 + 4}}, sized.got())

	d := e.describe(t, s, "two")
	require.Equal(t, 2, d.Config.MaxDeliveryEvents)
	require.Zero(t, d.Config.MaxDeliveryBytes)
	require.Equal(t, 800, e.describe(t, s2, "bytes").Config.MaxDeliveryBytes)

	// Configured again, the same: nothing appended, the original offset returned.
	_, again := e.configure(t, s, cfg)
	require.Equal(t, birth, again)
}

// A webhook asking for more than one event per delivery gets them as an "events" array, one
// request per delivery, signed over the exact bytes; without the control it gets one "event".
func TestSubscription_DeliveryControls_WebhookBatches(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	var mu sync.Mutex
	var bodies []map[string]json.RawMessage
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var b map[string]json.RawMessage
		if json.Unmarshal(raw, &b) != nil {
			w.WriteHeader(400)
			return
		}
		mu.Lock()
		bodies = append(bodies, b)
		mu.Unlock()
	}))
	defer srv.Close()

	s := stream(t, e.p, "/hooked")
	e.configure(t, s, client.SubscriptionConfig{Name: "batched", Start: "now", MaxDeliveryEvents: 3,
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: srv.URL + "/batched"}})
	var in []itx.EventInput
	for i := range 7 {
		in = append(in, ev("order", fmt.Sprintf(`{"n":%d}`, i)))
	}
	res := mustAppend(t, s, in...)
	head := res.HeadOffset
	e.waitProcessed(t, s, "batched", head)

	mu.Lock()
	defer mu.Unlock()
	var offsets []int64
	for _, b := range bodies {
		require.NotContains(t, b, "event", "a batched webhook body carries events, not event")
		var events []itx.Event
		require.NoError(t, json.Unmarshal(b["events"], &events))
		require.NotEmpty(t, events)
		require.LessOrEqual(t, len(events), 3)
		for _, ev := range events {
			offsets = append(offsets, ev.Offset)
		}
		var sub string
		require.NoError(t, json.Unmarshal(b["subscription"], &sub))
		require.Equal(t, "batched", sub)
	}
	require.Len(t, bodies, 3, "7 events in deliveries of at most 3")
	var want []int64
	for o := res.Offsets[0]; o <= head; o++ {
		want = append(want, o)
	}
	require.Equal(t, want, offsets, "every event once, in order")
}

// Delivery controls out of range, or on a processor-wake subscription, are refused with
// invalidArgument and nothing is written.
func TestSubscription_DeliveryControls_Refused(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/refused")
	mustAppend(t, s, ev("a", `{}`))
	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	rcv := client.Receiver{Kind: client.ReceiverItxCall, Capability: "x"}
	for _, cfg := range []client.SubscriptionConfig{
		{Name: "many", MaxDeliveryEvents: itx.DeliveryBatchEvents + 1, Receiver: rcv},
		{Name: "huge", MaxDeliveryBytes: itx.DeliveryBatchBytes + 1, Receiver: rcv},
		{Name: "proc", MaxDeliveryEvents: 10, Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}},
	} {
		_, _, err := client.ConfigureSubscription(e.ctx, subs, cfg)
		requireCode(t, err, itx.EInvalid)
	}
	page, err := client.GetEventPage(e.ctx, s, itx.Query{})
	require.NoError(t, err)
	require.Len(t, page.Events, 1, "nothing written")
}

// A webhook that answers 2xx and then keeps its body open has acknowledged: the delivery is done
// once its status arrives (the body is drained for a second at most), not redelivered after the
// 20 s delivery timeout as an outage.
func TestSubscription_WebhookAckedThenHangingBody(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	release := make(chan struct{})
	var mu sync.Mutex
	requests := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(200)
		w.Write([]byte("working on it"))
		w.(http.Flusher).Flush()
		mu.Lock()
		requests++ // counted once its status is out
		mu.Unlock()
		select { // the body never ends (until the test does)
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer func() { close(release); srv.Close() }() // release the handler first: Close waits for it
	s := stream(t, e.p, "/hanging-body")
	e.configure(t, s, client.SubscriptionConfig{Name: "hook", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: srv.URL}})
	head := mustAppend(t, s, ev("a", `{}`)).HeadOffset
	// The clock moves once the status is out, not while the request is on its way: each look
	// moves it 100 ms, and as many looks as a loaded machine takes to send the request would
	// run out the delivery timeout before the drain's bound was even armed.
	waitUntil(t, "the status sent", func() bool { mu.Lock(); defer mu.Unlock(); return requests == 1 })
	require.Eventually(t, func() bool {
		if e.describe(t, s, "hook").ConfirmedOffset == head {
			return true
		}
		e.clock.Advance(100 * time.Millisecond) // the drain bound, well short of the 20 s timeout
		return false
	}, 15*time.Second, 20*time.Millisecond)
	d := e.describe(t, s, "hook")
	require.Zero(t, d.Attempt)
	require.Empty(t, d.LastError)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, requests, "delivered once")
}

// A retry of the same events keeps its delivery id (the webhook-id of a webhook), even when
// events the filter passes over were appended in between: the id names the events delivered,
// not how far the scan read.
func TestSubscription_RetryKeepsItsDeliveryIDPastFilteredAppends(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	var mu sync.Mutex
	var ids []string
	h, err := client.MountReceiver(e.ctx, e.p, "ids", client.ServeReceiver(func(_ context.Context, b itx.DeliveryBatch) (int64, error) {
		mu.Lock()
		defer mu.Unlock()
		ids = append(ids, b.DeliveryID)
		if len(ids) == 1 {
			return 0, itx.Errorf(itx.EUnavailable, "not now")
		}
		return 0, nil
	}))
	require.NoError(t, err)
	defer h.Release()
	s := stream(t, e.p, "/retry-ids")
	e.configure(t, s, client.SubscriptionConfig{Name: "only-a", Start: "now", FilterTypes: []string{"a"},
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "ids"}})
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`))
	waitUntil(t, "the first try failed", func() bool { return e.describe(t, s, "only-a").Attempt == 1 })
	head := mustAppend(t, s, ev("b", `{}`), ev("b", `{}`)).HeadOffset // passed over by the filter
	e.clock.Advance(time.Second)
	e.waitProcessed(t, s, "only-a", head)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, ids, 2)
	require.Equal(t, ids[0], ids[1], "the retry of the same two events keeps its id")
}

// A webhook answering 429 or 503 with Retry-After is retried no sooner than it asked (seconds or
// an HTTP date), capped at the ladder's 30 min; without it, the ladder's backoff applies.
func TestSubscription_WebhookRetryAfter(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	var mu sync.Mutex
	header := "120"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		if header != "" {
			w.Header().Set("Retry-After", header)
		}
		mu.Unlock()
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	s := stream(t, e.p, "/retry-after")
	e.configure(t, s, client.SubscriptionConfig{Name: "hook", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: srv.URL}})
	mustAppend(t, s, ev("a", `{}`))
	waitUntil(t, "first failure", func() bool { return e.describe(t, s, "hook").Attempt == 1 })
	d := e.describe(t, s, "hook")
	require.Equal(t, e.clock.Now().Add(120*time.Second).UnixMilli(), d.NextAttemptAt, "Retry-After: 120")
	require.Contains(t, d.LastError, "Retry-After")

	mu.Lock()
	header = e.clock.Now().Add(time.Hour).UTC().Format(http.TimeFormat) // past the 30 min cap
	mu.Unlock()
	e.clock.Advance(120 * time.Second)
	waitUntil(t, "second failure", func() bool { return e.describe(t, s, "hook").Attempt == 2 })
	d = e.describe(t, s, "hook")
	require.Equal(t, e.clock.Now().Add(30*time.Minute).UnixMilli(), d.NextAttemptAt, "an HTTP date, capped")
	require.Contains(t, d.LastError, "(Retry-After 30m0s)", "lastError names the wait that applies, not the hour asked for")

	mu.Lock()
	header = ""
	mu.Unlock()
	e.clock.Advance(30 * time.Minute)
	waitUntil(t, "third failure", func() bool { return e.describe(t, s, "hook").Attempt == 3 })
	require.Equal(t, e.clock.Now().Add(4*time.Second).UnixMilli(), e.describe(t, s, "hook").NextAttemptAt, "no header: the ladder's 4 s")
}

// An offset-acking webhook: a 2xx whose body is {"confirmedOffset": N} confirms through N, as an
// itx-call Receiver's return does, and the events after N are delivered again at once; a body
// without it (or not JSON) acknowledges the whole delivery.
func TestDeliveryControls_WebhookConfirmsPartOfABatch(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	var mu sync.Mutex
	var batches [][]int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b itx.WebhookBatchBody
		if json.NewDecoder(r.Body).Decode(&b) != nil {
			w.WriteHeader(400)
			return
		}
		var offs []int64
		for _, e := range b.Events {
			offs = append(offs, e.Offset)
		}
		mu.Lock()
		batches = append(batches, offs)
		first := len(batches) == 1
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if first { // take the first two of the batch only
			fmt.Fprintf(w, `{"confirmedOffset": %d}`, offs[1])
			return
		}
		w.Write([]byte(`{"ok": true}`))
	}))
	defer srv.Close()
	s := stream(t, e.p, "/acking")
	e.configure(t, s, client.SubscriptionConfig{Name: "acking", Start: "now", MaxDeliveryEvents: 5,
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: srv.URL}})
	var in []itx.EventInput
	for i := range 5 {
		in = append(in, ev("order", fmt.Sprintf(`{"n":%d}`, i)))
	}
	res := mustAppend(t, s, in...) // 2..6
	e.waitProcessed(t, s, "acking", res.HeadOffset)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, [][]int64{{2, 3, 4, 5, 6}, {4, 5, 6}}, batches)
}

// With one POST per event (no batches, not offset-acking) the 2xx alone acknowledges and the
// body is discarded (seed 000): an answer that happens to name a confirmedOffset below the event
// does not hold the subscription back.
func TestDeliveryControls_SingleEventWebhookDiscardsTheBody(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	var posts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"ok": true, "confirmedOffset": 1}`))
	}))
	defer srv.Close()
	s := stream(t, e.p, "/plain")
	e.configure(t, s, client.SubscriptionConfig{Name: "plain", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: srv.URL}})
	res := mustAppend(t, s, ev("a", `{}`), ev("b", `{}`), ev("c", `{}`)) // 2..4
	e.waitProcessed(t, s, "plain", res.HeadOffset)
	d := e.describe(t, s, "plain")
	require.Equal(t, res.HeadOffset, d.ConfirmedOffset)
	require.Zero(t, d.Attempt)
	require.Equal(t, int64(3), posts.Load(), "one POST per event, none again")
}
