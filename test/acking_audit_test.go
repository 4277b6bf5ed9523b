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
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// flakyAcker is an itx-call receiver for offset-acking subscriptions: it records each batch,
// fails the ones fail says to (an exception: event-specific), and confirms what confirm says
// (nil: nothing).
type flakyAcker struct {
	mu      sync.Mutex
	batches [][]int64
	types   []string
	fail    func(b itx.DeliveryBatch) error
	confirm func(last int64) int64
}

func (r *flakyAcker) receive(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var batch []int64
	for _, e := range b.Events {
		batch = append(batch, e.Offset)
		r.types = append(r.types, e.Type)
	}
	r.batches = append(r.batches, batch)
	if r.fail != nil {
		if err := r.fail(b); err != nil {
			return 0, err
		}
	}
	if r.confirm != nil {
		return r.confirm(batch[len(batch)-1]), nil
	}
	return 0, nil
}

func (r *flakyAcker) got() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int64
	for _, b := range r.batches {
		out = append(out, b...)
	}
	return out
}

func (r *flakyAcker) gotBatches() [][]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]int64(nil), r.batches...)
}

func mountFlaky(t *testing.T, e *subEnv, name string, r *flakyAcker) (disconnect func()) {
	return mountReceive(t, e.ts.addr, e.ts.creds.ProjectToken, name, r.receive)
}

// toNextRetry moves the virtual clock to a subscription's next retry, unless a delivery is in
// flight (the clock would time it out) or none is pending.
func (e *subEnv) toNextRetry(t *testing.T, s schema.Stream, name string) {
	t.Helper()
	d := e.describe(t, s, name)
	if d.InFlightDeadlineAt != 0 || d.NextAttemptAt == 0 {
		return
	}
	if wait := time.UnixMilli(d.NextAttemptAt).Sub(e.clock.Now()); wait > 0 {
		e.clock.Advance(wait)
	}
}

// hasPayload says whether a batch carries an event whose payload contains s.
func hasPayload(b itx.DeliveryBatch, s string) bool {
	for _, e := range b.Events {
		if strings.Contains(string(e.Payload), s) {
			return true
		}
	}
	return false
}

// A receiver that confirms later (never in its answers) and fails on one event: the failing
// event still climbs the ladder and is skipped after three event-specific attempts, though the
// healthy events before it, delivered and unconfirmed, go again before each retry.
func TestAcking_FailingEventBehindAnUnconfirmedPrefixIsSkipped(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks-skip")
	name, b := e.configure(t, s, client.SubscriptionConfig{Name: "loader", Start: "now", ConfirmWindow: 10, OnFailingEvent: "skip", FilterTypes: []string{"row"},
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "loader"}})
	r := &flakyAcker{fail: func(b itx.DeliveryBatch) error {
		if hasPayload(b, "bad") {
			return fmt.Errorf("cannot load this row")
		}
		return nil
	}}
	defer mountFlaky(t, e, "loader", r)()
	mustAppend(t, s, ev("row", `{"n":1}`), ev("row", `{"n":2}`), ev("row", `{"bad":true}`), ev("row", `{"n":4}`))
	bad := b + 3

	// Each failure is visible (attempt, lastError); time passes between retries. Each attempt is
	// waited for before the clock moves to the next (sampling while moving it could miss one).
	for attempt := 1; attempt < itx.FailingEventConfirmAttempts; attempt++ {
		var d itx.SubscriptionDescription
		waitUntil(t, fmt.Sprintf("attempt %d failed", attempt), func() bool {
			d = e.describe(t, s, name)
			return d.FailingEventOffset == bad && d.FailingEventAttempt == attempt && d.NextAttemptAt != 0 && d.InFlightDeadlineAt == 0
		})
		require.Contains(t, d.LastError, "cannot load this row")
		require.Equal(t, attempt, d.Attempt, "the ladder's attempt counts the failing event's tries")
		e.toNextRetry(t, s, name)
	}
	waitUntil(t, "the failing event is skipped", func() bool {
		skips, err := client.GetEvents(e.ctx, s, itx.Query{Types: []string{itx.TypeErrorOccurred}})
		return err == nil && len(skips) > 0
	})

	// The skip goes after the unconfirmed events before it: the event after it goes out, and
	// the cursor stays where the receiver confirmed (nothing) until it confirms them.
	waitUntil(t, "the event after the skipped one delivered", func() bool {
		got := r.got()
		return len(got) > 0 && got[len(got)-1] == b+4
	})
	waitUntil(t, "delivered through the skip's own record", func() bool { return e.describe(t, s, name).DeliveredOffset == b+5 })
	d := e.describe(t, s, name)
	require.Equal(t, b, d.ConfirmedOffset, "a skip never confirms what the receiver took and did not confirm")
	require.Equal(t, "active", d.Status)
	sub := client.Subscription(e.ctx, s, name)
	defer sub.Release()
	confirmed, err := client.ConfirmSubscription(e.ctx, sub, b+2)
	require.NoError(t, err)
	require.Equal(t, bad, confirmed, "confirming the events before it passes the skipped event too")
	require.Equal(t, []int64{b + 1, b + 2, b + 3, b + 4}, r.gotBatches()[0], "the first try")
	skips, err := client.GetEvents(e.ctx, s, itx.Query{Types: []string{itx.TypeErrorOccurred}})
	require.NoError(t, err)
	require.Len(t, skips, 1)
	require.Contains(t, string(skips[0].Payload), "skipped failing event")
}

// The same receiver under the halt policy: the failing event halts the subscription after the
// ladder's attempts, with the error shown.
func TestAcking_FailingEventBehindAnUnconfirmedPrefixHalts(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks-halt")
	name, b := e.configure(t, s, client.SubscriptionConfig{Name: "loader", Start: "now", ConfirmWindow: 10,
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "loader"}})
	r := &flakyAcker{fail: func(b itx.DeliveryBatch) error {
		if hasPayload(b, "bad") {
			return fmt.Errorf("cannot load this row")
		}
		return nil
	}}
	defer mountFlaky(t, e, "loader", r)()
	mustAppend(t, s, ev("row", `{"n":1}`), ev("row", `{"bad":true}`))
	require.Eventually(t, func() bool {
		if e.describe(t, s, name).Status == "halted" {
			return true
		}
		e.toNextRetry(t, s, name)
		return false
	}, 20*time.Second, 20*time.Millisecond, "halted")
	d := e.describe(t, s, name)
	require.Equal(t, itx.MaxDeliveryAttempts, d.Attempt)
	require.Equal(t, b+2, d.FailingEventOffset)
	require.Contains(t, d.LastError, "cannot load this row")
	require.Equal(t, b, d.ConfirmedOffset)
}

// ackHook is a webhook that takes batches and answers {"confirmedOffset": answer(batch)}.
type ackHook struct {
	mu      sync.Mutex
	batches [][]int64
	answer  func(offsets []int64) int64
	down    bool                      // answer 503
	status  func(offsets []int64) int // a status instead of the answer (0: the answer)
	srv     *httptest.Server
}

func newAckHook(t *testing.T, answer func(offsets []int64) int64) *ackHook {
	h := &ackHook{answer: answer}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var offsets []int64
		var batch itx.WebhookBatchBody
		if json.Unmarshal(raw, &batch) == nil && len(batch.Events) > 0 {
			for _, e := range batch.Events {
				offsets = append(offsets, e.Offset)
			}
		} else {
			var one itx.WebhookBody
			if err := json.Unmarshal(raw, &one); err != nil {
				w.WriteHeader(400)
				return
			}
			offsets = []int64{one.Event.Offset}
		}
		h.mu.Lock()
		h.batches = append(h.batches, offsets)
		answer, down, status := h.answer, h.down, h.status
		h.mu.Unlock()
		if down {
			w.WriteHeader(503)
			return
		}
		if status != nil {
			if code := status(offsets); code != 0 {
				w.WriteHeader(code)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		var n int64
		if answer != nil {
			n = answer(offsets)
		}
		fmt.Fprintf(w, `{"confirmedOffset": %d}`, n)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *ackHook) gotBatches() [][]int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([][]int64(nil), h.batches...)
}

// A webhook-post receiver delivers batches (maxDeliveryEvents) and its 2xx answer's
// confirmedOffset confirms through there; the rest of the batch stays delivered, not confirmed,
// and is not sent again while delivery goes on.
func TestAcking_WebhookBatchConfirmsWhatItsAnswerNames(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks-hook")
	h := newAckHook(t, func(offsets []int64) int64 {
		if len(offsets) < 2 {
			return 0
		}
		return offsets[len(offsets)-2] // all but the last
	})
	name, b := e.configure(t, s, client.SubscriptionConfig{Name: "hook", Start: "now", ConfirmWindow: 5, MaxDeliveryEvents: 3,
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.srv.URL + "/hook"}})
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`), ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))
	// [b+1..b+3] confirms b+2; the window (5) has room for b+4..b+6 (unconfirmed: b+3..b+6, 4).
	waitUntil(t, "two batches", func() bool { return len(h.gotBatches()) == 2 })
	e.settle(t, "/acks-hook")
	require.Equal(t, [][]int64{{b + 1, b + 2, b + 3}, {b + 4, b + 5, b + 6}}, h.gotBatches())
	d := e.describe(t, s, name)
	require.Equal(t, b+5, d.ConfirmedOffset)
	require.Equal(t, b+6, d.DeliveredOffset)

	sub := client.Subscription(e.ctx, s, name)
	defer sub.Release()
	c, err := client.ConfirmSubscription(e.ctx, sub, b+6)
	require.NoError(t, err)
	require.Equal(t, b+6, c)
	e.waitProcessed(t, s, name, b+6)
}

// An answer that names an offset past the batch confirms the batch, not what was never sent.
func TestAcking_AnswerBeyondTheBatchConfirmsOnlyTheBatch(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks-beyond")
	name, b := e.configure(t, s, client.SubscriptionConfig{Name: "loader", Start: "now", ConfirmWindow: 2, MaxDeliveryEvents: 1,
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "loader"}})
	r := &flakyAcker{confirm: func(last int64) int64 { return last + 1000 }}
	defer mountFlaky(t, e, "loader", r)()
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))
	e.waitProcessed(t, s, name, b+3)
	require.Equal(t, offsetsFrom(b+1, b+3), r.got())
	mustAppend(t, s, ev("a", `{}`))
	e.waitProcessed(t, s, name, b+4)
	e.settle(t, "/acks-beyond")
	require.Equal(t, offsetsFrom(b+1, b+4), r.got())
	d := e.describe(t, s, name)
	require.Equal(t, []int64{b + 4, b + 4}, []int64{d.ConfirmedOffset, d.DeliveredOffset})
}

// A filter passes over the tail: confirming the last event delivered confirms it too, so
// waitUntilProcessed(head) resolves, whether the tail was read with the event or after it,
// and whether it came before or after the confirmation.
func TestAcking_ConfirmingTheLastEventPassesTheFilteredTail(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks-filter")
	name, b := e.configure(t, s, client.SubscriptionConfig{Name: "loader", Start: "now", ConfirmWindow: 3, FilterTypes: []string{"a"},
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "loader"}})
	r := &flakyAcker{}
	defer mountFlaky(t, e, "loader", r)()
	sub := client.Subscription(e.ctx, s, name)
	defer sub.Release()

	// Read together: a, then b b.
	mustAppend(t, s, ev("a", `{}`), ev("b", `{}`), ev("b", `{}`))
	waitUntil(t, "a delivered", func() bool { return len(r.got()) == 1 })
	e.settle(t, "/acks-filter")
	c, err := client.ConfirmSubscription(e.ctx, sub, b+1)
	require.NoError(t, err)
	require.Equal(t, b+3, c, "the filtered tail goes with the last event")

	// Read apart: a, then b b appended after it was delivered, then the confirmation.
	mustAppend(t, s, ev("a", `{}`))
	waitUntil(t, "a delivered", func() bool { return len(r.got()) == 2 })
	e.settle(t, "/acks-filter")
	mustAppend(t, s, ev("b", `{}`), ev("b", `{}`))
	e.settle(t, "/acks-filter")
	c, err = client.ConfirmSubscription(e.ctx, sub, b+4)
	require.NoError(t, err)
	require.Equal(t, b+6, c)
	e.waitProcessed(t, s, name, b+6)

	// Confirmed first, then the tail appended.
	mustAppend(t, s, ev("a", `{}`))
	waitUntil(t, "a delivered", func() bool { return len(r.got()) == 3 })
	e.settle(t, "/acks-filter")
	c, err = client.ConfirmSubscription(e.ctx, sub, b+7)
	require.NoError(t, err)
	require.Equal(t, b+7, c)
	mustAppend(t, s, ev("b", `{}`), ev("b", `{}`))
	e.waitProcessed(t, s, name, b+9)
	require.Equal(t, []int64{b + 1, b + 4, b + 7}, r.got())
}

// Many confirmations at once on the same subscription: each answers a cursor at least as far as
// it asked, and the cursor ends at the highest.
func TestAcking_ConcurrentConfirms(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks-concurrent")
	name, b := e.configure(t, s, client.SubscriptionConfig{Name: "loader", Start: "now", ConfirmWindow: 50,
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "loader"}})
	r := &flakyAcker{}
	defer mountFlaky(t, e, "loader", r)()
	var in []itx.EventInput
	for i := 0; i < 40; i++ {
		in = append(in, ev("a", `{}`))
	}
	mustAppend(t, s, in...)
	waitUntil(t, "all delivered", func() bool { return len(r.got()) == 40 && e.describe(t, s, name).DeliveredOffset == b+40 })
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := int64(1); i <= 40; i++ {
		wg.Add(1)
		go func(o int64) {
			defer wg.Done()
			sub := client.Subscription(e.ctx, s, name)
			defer sub.Release()
			c, err := client.ConfirmSubscription(e.ctx, sub, b+o)
			if err == nil && c < b+o {
				err = fmt.Errorf("confirm %d answered %d", b+o, c)
			}
			errs <- err
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	d := e.describe(t, s, name)
	require.Equal(t, []int64{b + 40, b + 40}, []int64{d.ConfirmedOffset, d.DeliveredOffset})
}

// A parked subscription (its receiver went away) still takes confirmations of what it delivered;
// the next mount gets only what was not confirmed.
func TestAcking_ConfirmWhileParked(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks-parked")
	name, b := e.configure(t, s, client.SubscriptionConfig{Name: "loader", Start: "now", ConfirmWindow: 10,
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "loader"}})
	first := &flakyAcker{}
	disconnect := mountFlaky(t, e, "loader", first)
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))
	// Delivered as itxd counts it: the receiver's answer taken, not only the events received (a
	// batch whose answer the disconnect cuts off was not delivered).
	waitUntil(t, "delivered", func() bool { return len(first.got()) == 3 && e.describe(t, s, name).DeliveredOffset == b+3 })
	disconnect()
	waitUntil(t, "unmounted", func() bool { return len(e.ts.srv.Mounts("default")) == 0 })
	mustAppend(t, s, ev("a", `{}`))
	waitUntil(t, "parked", func() bool { return e.describe(t, s, name).Status == "parked" })

	sub := client.Subscription(e.ctx, s, name)
	defer sub.Release()
	c, err := client.ConfirmSubscription(e.ctx, sub, b+2)
	require.NoError(t, err)
	require.Equal(t, b+2, c)
	d := e.describe(t, s, name)
	require.Equal(t, "parked", d.Status)
	require.Equal(t, b+3, d.DeliveredOffset)

	second := &flakyAcker{confirm: func(last int64) int64 { return last }}
	defer mountFlaky(t, e, "loader", second)()
	e.waitProcessed(t, s, name, b+4)
	require.Equal(t, []int64{b + 3, b + 4}, second.got())
}

// Reconfigured off, the delivered and unconfirmed events go again and each answer confirms its
// batch; reconfigured on again, delivery runs ahead of the cursor; a changed window takes effect
// and what was out goes again within it.
func TestAcking_ReconfigureWindowOffOnChanged(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks-reconf")
	cfg := client.SubscriptionConfig{Name: "loader", Start: "now", ConfirmWindow: 3, FilterTypes: []string{"a"},
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "loader"}}
	name, b := e.configure(t, s, cfg)
	r := &flakyAcker{}
	defer mountFlaky(t, e, "loader", r)()
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))
	waitUntil(t, "the window delivered", func() bool { return len(r.got()) == 3 })
	e.settle(t, "/acks-reconf")

	// Off: 0 now means the whole batch.
	cfg.ConfirmWindow = 0
	_, at := e.configure(t, s, cfg)
	e.waitProcessed(t, s, name, at)
	e.settle(t, "/acks-reconf")
	require.Equal(t, []int64{b + 1, b + 2, b + 3, b + 1, b + 2, b + 3, b + 4}, r.got())
	d := e.describe(t, s, name)
	require.Equal(t, []int64{at, at}, []int64{d.ConfirmedOffset, d.DeliveredOffset})
	sub := client.Subscription(e.ctx, s, name)
	defer sub.Release()
	_, err := client.ConfirmSubscription(e.ctx, sub, at)
	requireCode(t, err, itx.EFailedPrecondition)

	// On again, window 5.
	cfg.ConfirmWindow = 5
	_, at2 := e.configure(t, s, cfg)
	e.waitProcessed(t, s, name, at2)
	n := len(r.got())
	res := mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))
	first := res.HeadOffset - 2
	waitUntil(t, "three more delivered", func() bool { return len(r.got()) == n+3 })
	e.settle(t, "/acks-reconf")
	d = e.describe(t, s, name)
	require.Equal(t, []int64{at2, first + 2}, []int64{d.ConfirmedOffset, d.DeliveredOffset})

	// Window 2: the three go again, two at a time.
	cfg.ConfirmWindow = 2
	e.configure(t, s, cfg)
	waitUntil(t, "two went again", func() bool { return len(r.got()) == n+5 })
	e.settle(t, "/acks-reconf")
	require.Equal(t, []int64{first, first + 1}, r.got()[n+3:])
	d = e.describe(t, s, name)
	require.Equal(t, first+1, d.DeliveredOffset)
	c, err := client.ConfirmSubscription(e.ctx, sub, first+1)
	require.NoError(t, err)
	require.Equal(t, first+1, c)
	waitUntil(t, "the last went", func() bool { return len(r.got()) == n+6 })
}

// A rewind (cursor-set) while events are delivered and unconfirmed: they go again from the new
// cursor, and may be confirmed once delivered again; an answer in flight before it is fenced.
func TestAcking_RewindWhileUnconfirmed(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks-rewind")
	name, b := e.configure(t, s, client.SubscriptionConfig{Name: "loader", Start: "now", ConfirmWindow: 10, FilterTypes: []string{"a"},
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "loader"}})
	r := &flakyAcker{}
	defer mountFlaky(t, e, "loader", r)()
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))
	waitUntil(t, "delivered", func() bool { return len(r.got()) == 5 })
	// The receiver holds the events before its answer reaches itxd, which marks them delivered.
	waitUntil(t, "marked delivered", func() bool { return e.describe(t, s, name).DeliveredOffset >= b+5 })
	sub := client.Subscription(e.ctx, s, name)
	defer sub.Release()
	c, err := client.ConfirmSubscription(e.ctx, sub, b+3)
	require.NoError(t, err)
	require.Equal(t, b+3, c)

	at, err := client.SetSubscriptionCursor(e.ctx, s, name, b+1)
	require.NoError(t, err)
	waitUntil(t, "delivered again from the new cursor", func() bool { return len(r.got()) == 9 })
	e.settle(t, "/acks-rewind")
	require.Equal(t, offsetsFrom(b+2, b+5), r.got()[5:])
	d := e.describe(t, s, name)
	require.Equal(t, []int64{b + 1, at, at}, []int64{d.ConfirmedOffset, d.DeliveredOffset, d.CursorChangedAtOffset})
	c, err = client.ConfirmSubscription(e.ctx, sub, b+5)
	require.NoError(t, err)
	require.Equal(t, at, c, "through the cursor-set event the filter passes over")

	// Forward past what was delivered: the cursor-set moves both.
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`))
	waitUntil(t, "delivered", func() bool { return len(r.got()) == 11 })
	e.settle(t, "/acks-rewind")
	head, _ := client.Describe(e.ctx, s)
	at2, err := client.SetSubscriptionCursor(e.ctx, s, name, head.HeadOffset)
	require.NoError(t, err)
	e.waitProcessed(t, s, name, at2)
	e.settle(t, "/acks-rewind")
	d = e.describe(t, s, name)
	require.Equal(t, []int64{at2, at2}, []int64{d.ConfirmedOffset, d.DeliveredOffset})
	require.Len(t, r.got(), 11)
	_, err = client.ConfirmSubscription(e.ctx, sub, at2+1)
	requireCode(t, err, itx.EInvalid)
}

// Removed and configured again under the same name: nothing of the old delivered offset is
// kept, and the new one starts clean.
func TestAcking_RemoveAndRecreate(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks-recreate")
	cfg := client.SubscriptionConfig{Name: "loader", Start: "now", ConfirmWindow: 10, FilterTypes: []string{"a"},
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "loader"}}
	name, b := e.configure(t, s, cfg)
	r := &flakyAcker{}
	defer mountFlaky(t, e, "loader", r)()
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))
	waitUntil(t, "delivered", func() bool { return len(r.got()) == 3 })
	e.settle(t, "/acks-recreate")
	subs := client.Subscriptions(e.ctx, s)
	_, err := client.RemoveSubscription(e.ctx, subs, name)
	subs.Release()
	require.NoError(t, err)
	cfg.ConfirmWindow = 2
	_, born := e.configure(t, s, cfg)
	e.settle(t, "/acks-recreate")
	d := e.describe(t, s, name)
	require.Equal(t, []int64{born, born}, []int64{d.ConfirmedOffset, d.DeliveredOffset})
	sub := client.Subscription(e.ctx, s, name)
	defer sub.Release()
	c, err := client.ConfirmSubscription(e.ctx, sub, b+3) // behind the new cursor
	require.NoError(t, err)
	require.Equal(t, born, c)
	_, err = client.ConfirmSubscription(e.ctx, sub, born+1)
	requireCode(t, err, itx.EInvalid)
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))
	waitUntil(t, "the new window delivered", func() bool { return len(r.got()) == 5 })
	e.settle(t, "/acks-recreate")
	require.Equal(t, []int64{born + 1, born + 2}, r.got()[3:])
}

// A batch bigger than the window carries only the window; each confirmation frees exactly its
// room.
func TestAcking_WindowBoundary(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks-boundary")
	name, b := e.configure(t, s, client.SubscriptionConfig{Name: "loader", Start: "now", ConfirmWindow: 2, MaxDeliveryEvents: 10,
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "loader"}})
	r := &flakyAcker{}
	defer mountFlaky(t, e, "loader", r)()
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))
	waitUntil(t, "the window", func() bool { return len(r.got()) == 2 })
	e.settle(t, "/acks-boundary")
	require.Equal(t, [][]int64{{b + 1, b + 2}}, r.gotBatches())
	sub := client.Subscription(e.ctx, s, name)
	defer sub.Release()
	_, err := client.ConfirmSubscription(e.ctx, sub, b+1)
	require.NoError(t, err)
	waitUntil(t, "one more", func() bool { return len(r.got()) == 3 })
	e.settle(t, "/acks-boundary")
	require.Equal(t, [][]int64{{b + 1, b + 2}, {b + 3}}, r.gotBatches())
	_, err = client.ConfirmSubscription(e.ctx, sub, b+3)
	require.NoError(t, err)
	waitUntil(t, "two more", func() bool { return len(r.got()) == 5 })
	e.settle(t, "/acks-boundary")
	require.Equal(t, [][]int64{{b + 1, b + 2}, {b + 3}, {b + 4, b + 5}}, r.gotBatches())
}

// A transform that fails on one event of an offset-acking subscription: the event is skipped
// after its attempts, the others delivered transformed.
func TestAcking_TransformFailureSkipped(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks-transform")
	name, b := e.configure(t, s, client.SubscriptionConfig{Name: "loader", Start: "now", ConfirmWindow: 10, OnFailingEvent: "skip",
		FilterTypes: []string{"x"}, Transform: `{"type": payload.t}`,
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "loader"}})
	r := &flakyAcker{}
	defer mountFlaky(t, e, "loader", r)()
	mustAppend(t, s, ev("x", `{"t":"fine"}`), ev("x", `{"t":"not a type"}`), ev("x", `{"t":"good"}`))
	require.Eventually(t, func() bool {
		// Skipped: sending goes past it (the cursor waits for the receiver to confirm b+1).
		if e.describe(t, s, name).DeliveredOffset >= b+2 {
			return true
		}
		e.toNextRetry(t, s, name)
		return false
	}, 20*time.Second, 20*time.Millisecond, "skipped")
	waitUntil(t, "the last delivered", func() bool {
		got := r.got()
		return len(got) > 0 && got[len(got)-1] == b+3
	})
	r.mu.Lock()
	types := append([]string(nil), r.types...)
	r.mu.Unlock()
	require.Equal(t, "good", types[len(types)-1])
	require.Equal(t, "fine", types[0])
}

func (h *ackHook) seen() map[int64]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[int64]int{}
	for _, b := range h.batches {
		for _, o := range b {
			out[o]++
		}
	}
	return out
}

func (h *ackHook) maxSeen() int64 {
	m := int64(0)
	for o := range h.seen() {
		m = max(m, o)
	}
	return m
}

// kill -9 of a real itxd with deliveries delivered and unconfirmed: after the restart the
// confirmed cursor is at least every confirmation answered (also one that changed nothing in
// memory, the receiver's answer having confirmed it already), and every event after it arrives
// at least once.
func TestAcking_Kill9WithUnconfirmedDeliveries(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	lazy := newAckHook(t, nil) // confirms nothing in its answers
	eager := newAckHook(t, func(offsets []int64) int64 { return offsets[len(offsets)-1] })
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	src := client.Stream(ctx, p, "/src")
	subs := client.Subscriptions(ctx, src)
	for name, h := range map[string]*ackHook{"lazy": lazy, "eager": eager} {
		_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: name, FilterTypes: []string{"e"},
			ConfirmWindow: 20, MaxDeliveryEvents: 5, Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.srv.URL + "/hook"}})
		require.NoError(t, err)
	}
	subs.Release()

	const n = 200
	var offsets []int64
	for i := 0; i < n; i += 20 {
		batch := make([]itx.EventInput, 20)
		for j := range batch {
			batch[j] = ev("e", fmt.Sprintf(`{"i":%d}`, i+j))
		}
		res, err := client.Append(ctx, src, batch, itx.AppendOptions{})
		require.NoError(t, err)
		offsets = append(offsets, res.Offsets...)
	}
	last := offsets[len(offsets)-1]

	// The lazy receiver's loader confirms what it got, some way behind, until about half.
	lazySub := client.Subscription(ctx, src, "lazy")
	var answered int64
	for answered < offsets[n/2] {
		got := lazy.maxSeen()
		if got-5 > answered {
			c, err := client.ConfirmSubscription(ctx, lazySub, got-5)
			require.NoError(t, err)
			answered = c
		}
		time.Sleep(time.Millisecond)
	}
	// The eager receiver confirms everything in its answers; confirming its last again answers
	// once that is written (one more event, so its answer is fresh in memory).
	eagerSub := client.Subscription(ctx, src, "eager")
	waitUntil(t, "eager took everything", func() bool { return eager.maxSeen() == last })
	res, err := client.Append(ctx, src, []itx.EventInput{ev("e", `{"i":"last"}`)}, itx.AppendOptions{})
	require.NoError(t, err)
	offsets = append(offsets, res.Offsets...)
	last = res.Offsets[0]
	waitUntil(t, "eager took the last", func() bool { return eager.maxSeen() == last })
	var eagerAnswered int64
	require.Eventually(t, func() bool {
		c, err := client.ConfirmSubscription(ctx, eagerSub, last)
		eagerAnswered = c
		return err == nil
	}, 10*time.Second, time.Millisecond)
	eager.mu.Lock()
	eager.down = true // what the restart finds is what was written, not a new answer
	eager.mu.Unlock()
	proc.kill9(t)
	lazySub.Release()
	eagerSub.Release()
	src.Release()
	p.Release()
	require.Equal(t, last, eagerAnswered)
	lazyBefore := lazy.seen()
	from := len(lazy.gotBatches()) // what the loader gets from the restart on

	proc = startItxd(t, dataDir)
	p2 := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	defer p2.Release()
	src2 := stream(t, p2, "/src")
	d := func(name string) itx.SubscriptionDescription {
		sub := client.Subscription(ctx, src2, name)
		defer sub.Release()
		d, err := client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		return d
	}
	require.GreaterOrEqual(t, d("eager").ConfirmedOffset, last, "the answered confirmation was written")
	restartCursor := d("lazy").ConfirmedOffset
	require.GreaterOrEqual(t, restartCursor, answered, "every answered confirmation was written")

	// The loader goes on confirming what it gets from now on; everything after the cursor
	// arrives again.
	lazySub2 := client.Subscription(ctx, src2, "lazy")
	defer lazySub2.Release()
	require.Eventually(t, func() bool {
		got := int64(0)
		for _, b := range lazy.gotBatches()[from:] {
			got = max(got, b[len(b)-1])
		}
		if got > 0 {
			if _, err := client.ConfirmSubscription(ctx, lazySub2, got); err != nil {
				return false
			}
		}
		return d("lazy").ConfirmedOffset >= last
	}, 30*time.Second, 5*time.Millisecond, "the lazy receiver confirmed everything")
	after := lazy.seen()
	for _, o := range offsets {
		require.NotZero(t, after[o], "offset %d delivered", o)
		if o > restartCursor {
			require.Greater(t, after[o], lazyBefore[o], "offset %d (after the cursor at the restart) delivered after it", o)
		}
	}
}

// A receiver that answers itx.unavailable while holding unconfirmed events: an outage, retried
// along the backoff with attempt and lastError shown; once it is back, the unconfirmed events go
// again and delivery goes on.
func TestAcking_OutageRetriesAndRedelivers(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks-outage")
	var mu sync.Mutex
	down := false
	name, b := e.configure(t, s, client.SubscriptionConfig{Name: "loader", Start: "now", ConfirmWindow: 10, FilterTypes: []string{"a"},
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "loader"}})
	r := &flakyAcker{fail: func(itx.DeliveryBatch) error {
		mu.Lock()
		defer mu.Unlock()
		if down {
			return itx.Errorf(itx.EUnavailable, "warehouse down")
		}
		return nil
	}}
	defer mountFlaky(t, e, "loader", r)()
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`))
	waitUntil(t, "delivered", func() bool { return len(r.got()) == 2 })
	e.settle(t, "/acks-outage")
	mu.Lock()
	down = true
	mu.Unlock()
	mustAppend(t, s, ev("a", `{}`))
	for attempt := 1; attempt <= 3; attempt++ {
		waitUntil(t, fmt.Sprintf("attempt %d", attempt), func() bool { return e.describe(t, s, name).Attempt == attempt })
		d := e.describe(t, s, name)
		require.Contains(t, d.LastError, "warehouse down")
		require.Equal(t, []int64{b, b + 2}, []int64{d.ConfirmedOffset, d.DeliveredOffset})
		if attempt > 1 {
			// After the failure it resends from the cursor: the first event, which it takes, then
			// the next failure; the attempts still count up.
		}
		e.clock.Advance(itx.Backoff(attempt, 0.5))
	}
	mu.Lock()
	down = false
	r.confirm = func(last int64) int64 { return last }
	mu.Unlock()
	require.Eventually(t, func() bool {
		if e.describe(t, s, name).ConfirmedOffset >= b+3 {
			return true
		}
		e.toNextRetry(t, s, name)
		return false
	}, 20*time.Second, 20*time.Millisecond, "delivered once the receiver is back")
	d := e.describe(t, s, name)
	require.Zero(t, d.Attempt)
	require.Empty(t, d.LastError)
}

// A token limited to a prefix configures, receives and confirms an offset-acking subscription in
// it; a token limited to another prefix cannot confirm it.
func TestAcking_ScopedTokenConfirms(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	tokA, _ := e.ts.token(t, itx.Scope{Prefix: "/tenantA"})
	tokB, _ := e.ts.token(t, itx.Scope{Prefix: "/tenantB"})
	a, bp := e.ts.login(t, tokA), e.ts.login(t, tokB)
	s := stream(t, a, "/tenantA/acks")
	subs := client.Subscriptions(e.ctx, s)
	name, b, err := client.ConfigureSubscription(e.ctx, subs, client.SubscriptionConfig{Name: "loader", Start: "now", ConfirmWindow: 5,
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "loader"}})
	subs.Release()
	require.NoError(t, err)
	r := &flakyAcker{}
	h, err := client.MountReceiver(e.ctx, a, "loader", client.ServeReceiver(r.receive))
	require.NoError(t, err)
	defer h.Release()
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`))
	waitUntil(t, "delivered", func() bool { return len(r.got()) == 2 })
	e.settle(t, "/tenantA/acks")

	other := client.Subscription(e.ctx, client.Stream(e.ctx, bp, "/tenantA/acks"), name)
	_, err = client.ConfirmSubscription(e.ctx, other, b+2)
	other.Release()
	require.Error(t, err)
	sub := client.Subscription(e.ctx, s, name)
	defer sub.Release()
	c, err := client.ConfirmSubscription(e.ctx, sub, b+2)
	require.NoError(t, err)
	require.Equal(t, b+2, c)
}

// A filter that passes over many events between two matching ones: the window bounds the events
// the receiver holds unconfirmed, so one event held in a window of 2 does not stop the next
// matching one.
func TestAcking_WindowCountsEventsNotFilteredOffsets(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks-gap")
	name, b := e.configure(t, s, client.SubscriptionConfig{Name: "loader", Start: "now", ConfirmWindow: 2, FilterTypes: []string{"a"},
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "loader"}})
	r := &flakyAcker{}
	defer mountFlaky(t, e, "loader", r)()
	mustAppend(t, s, ev("a", `{}`))
	waitUntil(t, "the first", func() bool { return len(r.got()) == 1 })
	e.settle(t, "/acks-gap")
	mustAppend(t, s, ev("b", `{}`), ev("b", `{}`), ev("b", `{}`))
	e.settle(t, "/acks-gap")
	mustAppend(t, s, ev("a", `{}`))
	waitUntil(t, "the second", func() bool { return len(r.got()) == 2 })
	require.Equal(t, []int64{b + 1, b + 5}, r.got())

	// Two held: the next waits, however many offsets lie between.
	mustAppend(t, s, ev("b", `{}`), ev("a", `{}`))
	e.settle(t, "/acks-gap")
	require.Equal(t, []int64{b + 1, b + 5}, r.got())
	sub := client.Subscription(e.ctx, s, name)
	defer sub.Release()
	c, err := client.ConfirmSubscription(e.ctx, sub, b+1)
	require.NoError(t, err)
	require.Equal(t, b+4, c, "through the filtered offsets after the first")
	waitUntil(t, "the third", func() bool { return len(r.got()) == 3 })
	require.Equal(t, []int64{b + 1, b + 5, b + 7}, r.got())
}

// A stream idle with events delivered and unconfirmed is not unloaded for idleness (README: the
// unload forgot them and the reload delivered them again); it does not deliver them again
// (nothing failed, nothing was mounted, nothing restarted), the receiver still confirms them
// after, and confirmed, the stream idles out as any other.
func TestAcking_IdleUnloadDoesNotRedeliver(t *testing.T) {
	e := newSubEnv(t, server.Config{IdleTimeout: time.Second})
	s := stream(t, e.p, "/acks-idle")
	name, b := e.configure(t, s, client.SubscriptionConfig{Name: "loader", Start: "now", ConfirmWindow: 10,
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "loader"}})
	r := &flakyAcker{}
	defer mountFlaky(t, e, "loader", r)()
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`))
	waitUntil(t, "delivered", func() bool { return len(r.got()) == 2 })
	// The receiver holds the events before its answer reaches itxd, which marks them delivered
	// (until then they are in flight, and a stream unloaded then sends them again).
	waitUntil(t, "marked delivered", func() bool { return e.describe(t, s, name).DeliveredOffset >= b+2 })
	s.Release()
	// Idle well past the timeout, each sweep run to its end (Sweep returns once its unloads
	// finished), not for a fixed while of sleeps: the stream stays loaded (an unload would
	// forget what it holds, and the reload deliver it again), and nothing goes again.
	for range 10 {
		e.clock.Advance(2 * time.Second)
		e.ts.srv.Sweep()
	}
	require.Equal(t, 1, e.ts.srv.LoadedStreams(), "a stream holding unconfirmed events is not unloaded for idleness")
	require.Equal(t, []int64{b + 1, b + 2}, r.got(), "nothing delivered again")

	s = stream(t, e.p, "/acks-idle")
	sub := client.Subscription(e.ctx, s, name)
	c, err := client.ConfirmSubscription(e.ctx, sub, b+2)
	require.NoError(t, err)
	require.Equal(t, b+2, c)
	e.settle(t, "/acks-idle")
	require.Equal(t, []int64{b + 1, b + 2}, r.got())

	// Confirmed, it idles out as any stream does.
	sub.Release()
	s.Release()
	waitUntil(t, "unloaded once nothing is held", func() bool {
		e.clock.Advance(2 * time.Second)
		e.ts.srv.Sweep()
		return e.ts.srv.LoadedStreams() == 0
	})
	require.Equal(t, []int64{b + 1, b + 2}, r.got())
}

// An offset-acking webhook that refuses one event (422) in a batch, confirming nothing in its
// answers: the batch is isolated, the event skipped into the dead-letter stream after its
// attempts, and delivery goes on.
func TestAcking_WebhookRefusalSkippedToDeadLetter(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks-dead")
	var bad int64
	h := newAckHook(t, nil)
	h.status = func(offsets []int64) int {
		for _, o := range offsets {
			if o == bad {
				return 422
			}
		}
		return 0
	}
	name, b := e.configure(t, s, client.SubscriptionConfig{Name: "hook", Start: "now", ConfirmWindow: 10, MaxDeliveryEvents: 5,
		OnFailingEvent: "skip", DeadLetterPath: "/acks-dead/letters", FilterTypes: []string{"row"},
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.srv.URL + "/hook"}})
	h.mu.Lock()
	bad = b + 3
	h.mu.Unlock()
	mustAppend(t, s, ev("row", `{}`), ev("row", `{}`), ev("row", `{}`), ev("row", `{}`))
	require.Eventually(t, func() bool {
		// Skipped: sending goes past it; the cursor waits for the receiver to confirm before it.
		if e.describe(t, s, name).DeliveredOffset >= b+3 {
			return true
		}
		e.toNextRetry(t, s, name)
		return false
	}, 20*time.Second, 20*time.Millisecond, "skipped")
	letters, err := client.GetEvents(e.ctx, stream(t, e.p, "/acks-dead/letters"), itx.Query{Types: []string{itx.TypeDeadLetter}})
	require.NoError(t, err)
	require.Len(t, letters, 1)
	require.Contains(t, string(letters[0].Payload), fmt.Sprintf(`"offset":%d`, b+3))
	waitUntil(t, "the event after it delivered", func() bool { return h.maxSeen() == b+4 })
	d := e.describe(t, s, name)
	require.Equal(t, b, d.ConfirmedOffset, "the events before it are not confirmed by the skip")
	require.Equal(t, "active", d.Status)
	sub := client.Subscription(e.ctx, s, name)
	defer sub.Release()
	confirmed, err := client.ConfirmSubscription(e.ctx, sub, b+2)
	require.NoError(t, err)
	require.Equal(t, b+3, confirmed, "confirming them passes the dead-lettered event too")
}

// Halted by a failing event while it held events unconfirmed, resumed once the receiver is
// fixed: everything after the confirmed cursor goes again.
func TestAcking_HaltThenResumeRedelivers(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks-resume")
	var mu sync.Mutex
	broken := true
	name, b := e.configure(t, s, client.SubscriptionConfig{Name: "loader", Start: "now", ConfirmWindow: 10, FilterTypes: []string{"row"},
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "loader"}})
	r := &flakyAcker{fail: func(b itx.DeliveryBatch) error {
		mu.Lock()
		defer mu.Unlock()
		if broken && hasPayload(b, "bad") {
			return fmt.Errorf("cannot load this row")
		}
		return nil
	}}
	defer mountFlaky(t, e, "loader", r)()
	mustAppend(t, s, ev("row", `{"n":1}`), ev("row", `{"bad":true}`), ev("row", `{"n":3}`))
	require.Eventually(t, func() bool {
		if e.describe(t, s, name).Status == "halted" {
			return true
		}
		e.toNextRetry(t, s, name)
		return false
	}, 20*time.Second, 20*time.Millisecond, "halted")
	e.settle(t, "/acks-resume")
	n := len(r.got())
	mu.Lock()
	broken = false
	r.confirm = func(last int64) int64 { return last }
	mu.Unlock()
	_, err := client.ResumeSubscription(e.ctx, s, name)
	require.NoError(t, err)
	head, _ := client.Describe(e.ctx, s)
	e.waitProcessed(t, s, name, head.HeadOffset)
	require.Equal(t, []int64{b + 1, b + 2, b + 3}, r.got()[n:])
}

// A new receiver mounted under the name while a delivery to the old one is in flight: whatever
// the old one answers, every event reaches a receiver and the cursor reaches the head.
func TestAcking_NewMountWhileInFlight(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks-remount")
	name, b := e.configure(t, s, client.SubscriptionConfig{Name: "loader", Start: "now", ConfirmWindow: 10,
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "loader"}})
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	old := &flakyAcker{confirm: func(last int64) int64 { return last }}
	oldRecv := func(ctx context.Context, batch itx.DeliveryBatch) (int64, error) {
		once.Do(func() { close(entered); <-release })
		return old.receive(ctx, batch)
	}
	conn := dial(t, e.ts.addr)
	p := conn.Login(e.ctx, e.ts.creds.ProjectToken)
	h, err := client.MountReceiver(e.ctx, p, "loader", client.ServeReceiver(oldRecv))
	require.NoError(t, err)
	defer h.Release()
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`))
	<-entered
	second := &flakyAcker{confirm: func(last int64) int64 { return last }}
	defer mountFlaky(t, e, "loader", second)()
	close(release)
	mustAppend(t, s, ev("a", `{}`))
	e.waitProcessed(t, s, name, b+3)
	seen := map[int64]bool{}
	for _, o := range append(old.got(), second.got()...) {
		seen[o] = true
	}
	for o := b + 1; o <= b+3; o++ {
		require.True(t, seen[o], "offset %d delivered", o)
	}
	d := e.describe(t, s, name)
	require.Equal(t, []int64{b + 3, b + 3}, []int64{d.ConfirmedOffset, d.DeliveredOffset})
}

// An offset-acking webhook that confirms later and answers 500 for one event (an outage, by its
// class): the ladder still climbs to the halt, though the events before it, delivered and
// unconfirmed, are taken again before each retry.
func TestAcking_WebhookOutageOnOneEventHalts(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks-500")
	var bad int64
	h := newAckHook(t, nil)
	h.status = func(offsets []int64) int {
		for _, o := range offsets {
			if o == bad {
				return 500
			}
		}
		return 0
	}
	name, b := e.configure(t, s, client.SubscriptionConfig{Name: "hook", Start: "now", ConfirmWindow: 10, FilterTypes: []string{"row"},
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.srv.URL + "/hook"}})
	h.mu.Lock()
	bad = b + 3
	h.mu.Unlock()
	mustAppend(t, s, ev("row", `{}`), ev("row", `{}`), ev("row", `{}`), ev("row", `{}`))
	seen := 0
	for i := 0; i < 200; i++ {
		e.settle(t, "/acks-500")
		d := e.describe(t, s, name)
		if d.Status == "halted" {
			break
		}
		if d.Attempt > 0 {
			require.Contains(t, d.LastError, "500")
		}
		seen = max(seen, d.Attempt)
		e.toNextRetry(t, s, name)
		time.Sleep(5 * time.Millisecond)
	}
	d := e.describe(t, s, name)
	require.Equal(t, "halted", d.Status, "attempts seen: up to %d", seen)
	require.Equal(t, itx.MaxDeliveryAttempts, d.Attempt)
	require.Equal(t, b, d.ConfirmedOffset)
}
