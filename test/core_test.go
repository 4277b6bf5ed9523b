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
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// The stream core's delivery semantics, end to end over TCP against a real server: each test
// here failed on the server before the core became one writer.

// scriptedReceiver is a client-side Receiver that answers each batch with whatever answer says,
// recording every batch's offsets.
type scriptedReceiver struct {
	mu      sync.Mutex
	batches [][]int64
	answer  func(offsets []int64, events []itx.Event) (confirmed uint64, err error)
}

func (r *scriptedReceiver) receive(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
	var offsets []int64
	for _, e := range b.Events {
		offsets = append(offsets, e.Offset)
	}
	r.mu.Lock()
	r.batches = append(r.batches, offsets)
	r.mu.Unlock()
	confirmed, err := r.answer(offsets, b.Events)
	return int64(confirmed), err
}

func (r *scriptedReceiver) seen() [][]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]int64(nil), r.batches...)
}

func mountScripted(t *testing.T, e *subEnv, name string, r *scriptedReceiver) func() {
	conn := dial(t, e.ts.addr)
	ctx := context.Background()
	p := conn.Login(ctx, e.ts.creds.ProjectToken)
	handle, err := client.MountReceiver(ctx, p, name, client.ServeReceiver(r.receive))
	require.NoError(t, err)
	return func() { handle.Release(); p.Release(); conn.Close() }
}

func (e *subEnv) events(t *testing.T, s schema.Stream, types ...string) []itx.Event {
	t.Helper()
	evs, err := client.GetEvents(e.ctx, s, itx.Query{Types: types})
	require.NoError(t, err)
	return evs
}

func TestCore_ConfigureIsIdempotent(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	var down sync.Map
	h := newHook(t, func(n int, b itx.WebhookBody) int {
		if v, _ := down.Load("on"); v == true {
			return 503
		}
		return 200
	})
	s := stream(t, e.p, "/ensure")
	cfg := client.SubscriptionConfig{Name: "svc", FilterTypes: []string{"job"}, Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}}
	name, birth := e.configure(t, s, cfg)
	mustAppend(t, s, ev("job", `{"n":1}`))
	e.waitProcessed(t, s, name, 2)

	// The receiver goes down; events are owed to it.
	down.Store("on", true)
	mustAppend(t, s, ev("job", `{"n":2}`), ev("job", `{"n":3}`)) // 3, 4
	waitUntil(t, "the outage recorded", func() bool { return e.describe(t, s, name).Attempt == 1 })

	// The service reboots and ensures its subscription: nothing is appended, nothing is skipped.
	again, off := e.configure(t, s, cfg)
	require.Equal(t, name, again)
	require.Equal(t, birth, off, "the original offset")
	require.Equal(t, int64(4), mustDescribe(t, s).HeadOffset, "nothing appended")
	d := e.describe(t, s, name)
	require.Equal(t, int64(2), d.ConfirmedOffset, "the cursor stays")
	require.Equal(t, 1, d.Attempt, "the retry state stays")

	down.Store("on", false)
	e.clock.Advance(time.Second)
	e.waitProcessed(t, s, name, 4)
	require.Equal(t, []int64{2, 3, 4}, h.distinct(), "the events owed were delivered, none skipped")

	// A changed config appends and keeps the cursor.
	h2 := newHook(t, nil)
	cfg.Receiver.URL = h2.url()
	_, off2 := e.configure(t, s, cfg)
	require.Equal(t, int64(5), off2)
	mustAppend(t, s, ev("job", `{"n":4}`)) // 6
	e.waitProcessed(t, s, name, 6)
	require.Equal(t, []int64{6}, h2.distinct(), "the new receiver takes over where the old one stopped")

	// A nameless configure needs an idempotency key; a retry with it returns the original.
	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	nameless := client.SubscriptionConfig{Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/ensure-copy"}}
	_, _, err := client.ConfigureSubscription(e.ctx, subs, nameless)
	requireCode(t, err, itx.EInvalid)
	nameless.IdempotencyKey = "setup-copy-1"
	n1, o1, err := client.ConfigureSubscription(e.ctx, subs, nameless)
	require.NoError(t, err)
	n2, o2, err := client.ConfigureSubscription(e.ctx, subs, nameless)
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("subscription:%d", o1), n1)
	require.Equal(t, []any{n1, o1}, []any{n2, o2}, "the retry returns the original event and generated name")
	require.Len(t, e.list(t, s), 2)
}

func TestCore_IdenticalConfigureKeepsAHalt(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/halted")
	cfg := client.SubscriptionConfig{Name: "proc", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}}
	name, off := e.configure(t, s, cfg)
	waitUntil(t, "halted", func() bool { return e.describe(t, s, name).Status == "halted" })
	_, again := e.configure(t, s, cfg)
	require.Equal(t, off, again)
	require.Equal(t, "halted", e.describe(t, s, name).Status, "halted stays halted")
}

// A failure that can never succeed halts at once, attempt 1, with the exact error.
func TestCore_TerminalFailureHaltsAtOnce(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/terminal")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "no-such-contract", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}})
	waitUntil(t, "halted", func() bool { return e.describe(t, s, name).Status == "halted" })
	d := e.describe(t, s, name)
	require.Equal(t, 1, d.Attempt)
	require.Equal(t, `itx.notFound: no processor is registered under the name "no-such-contract"`, d.LastError)
	halts := e.events(t, s, itx.TypeSubscriptionHalted)
	require.Len(t, halts, 1)
	var p itx.HaltedPayload
	require.NoError(t, json.Unmarshal(halts[0].Payload, &p))
	require.Equal(t, 1, p.Attempts)
	require.Equal(t, d.LastError, p.Error)
}

// A batch refused for one bad event: the healthy prefix is delivered alone first, then the bad
// event alone; under halt the cursor never passes it.
func TestCore_BatchFailureIsolates(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	r := &scriptedReceiver{answer: func(offsets []int64, events []itx.Event) (uint64, error) {
		for _, ev := range events {
			if strings.Contains(string(ev.Payload), "bad") {
				return 0, errors.New("cannot handle this event")
			}
		}
		return 0, nil
	}}
	defer mountScripted(t, e, "inbox", r)()
	s := stream(t, e.p, "/isolate")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "app", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}})
	mustAppend(t, s, ev("m", `{"ok":1}`), ev("m", `{"ok":2}`), ev("m", `{"bad":3}`)) // 2, 3, 4
	waitUntil(t, "the bad event failed alone", func() bool { return e.describe(t, s, name).Attempt == 1 })
	e.settle(t, "/isolate")
	require.Equal(t, [][]int64{{2, 3, 4}, {2}, {3}, {4}}, r.seen())
	d := e.describe(t, s, name)
	require.Equal(t, int64(3), d.ConfirmedOffset, "the healthy prefix got through")
	require.Equal(t, int64(4), d.FailingEventOffset)
	require.Contains(t, d.LastError, "cannot handle this event")
	e.clock.Advance(time.Second)
	waitUntil(t, "second try", func() bool { return e.describe(t, s, name).Attempt == 2 })
	require.Equal(t, int64(3), e.describe(t, s, name).ConfirmedOffset, "never past the failing event")
}

// A filter or a transform that throws leaves one stream/error-occurred per failing event, not
// per retry (issue 7), and nothing is delivered past it.
func TestCore_FilterFailureIsRecordedOnce(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  client.SubscriptionConfig
	}{
		{"filter", client.SubscriptionConfig{FilterCondition: `$number(payload.n) > 1`}},
		{"transform", client.SubscriptionConfig{Transform: `{"payload": {"n": $number(payload.n)}}`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newSubEnv(t, server.Config{})
			h := newHook(t, nil)
			s := stream(t, e.p, "/throws")
			cfg := c.cfg
			cfg.Name, cfg.Start, cfg.Receiver = "picky", "now", client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}
			name, _ := e.configure(t, s, cfg)
			mustAppend(t, s, ev("m", `{"n":"5"}`), ev("m", `{"n":"five"}`), ev("m", `{"n":"7"}`)) // 2, 3, 4
			waitUntil(t, "the failure recorded", func() bool { return e.describe(t, s, name).Attempt == 1 })
			for attempt := 2; attempt <= 3; attempt++ {
				e.clock.Advance(itx.Backoff(attempt-1, 0.5))
				waitUntil(t, "retried", func() bool { return e.describe(t, s, name).Attempt == attempt })
			}
			errs := e.events(t, s, itx.TypeErrorOccurred)
			require.Len(t, errs, 1, "one record per failing event")
			require.Contains(t, string(errs[0].Payload), "offset 3")
			d := e.describe(t, s, name)
			require.Equal(t, int64(2), d.ConfirmedOffset, "never past the failing event")
			require.Equal(t, []int64{2}, h.distinct())
		})
	}
}

// Outages never count toward skip: a webhook that is down backs off, even under skip.
func TestCore_OutageNeverSkips(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := newHook(t, func(int, itx.WebhookBody) int { return 503 })
	s := stream(t, e.p, "/down")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "lenient", Start: "now", OnFailingEvent: "skip",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	mustAppend(t, s, ev("m", `{}`))
	for attempt := 1; attempt <= 6; attempt++ {
		waitUntil(t, fmt.Sprintf("attempt %d", attempt), func() bool { return e.describe(t, s, name).Attempt == attempt })
		e.clock.Advance(itx.Backoff(attempt, 0.5))
	}
	// The seventh attempt is due after the last advance; after it nothing moves until the clock does.
	waitUntil(t, "attempt 7", func() bool { return e.describe(t, s, name).Attempt == 7 })
	d := e.describe(t, s, name)
	require.Equal(t, int64(1), d.ConfirmedOffset, "nothing skipped")
	require.Zero(t, d.FailingEventSkips)
	// The listing shows where the ladder stands too, beside describe.
	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	rows, err := client.ListSubscriptions(e.ctx, subs)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, d.Attempt, rows[0].Attempt)
	require.Equal(t, d.NextAttemptAt, rows[0].NextAttemptAt)
	require.NotZero(t, rows[0].NextAttemptAt)
	require.Empty(t, e.events(t, s, itx.TypeErrorOccurred))
	require.Equal(t, "active", d.Status)
}

// A receiver that confirms no progress is a failure with backoff, not a busy loop.
func TestCore_NoProgressBacksOff(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	r := &scriptedReceiver{answer: func([]int64, []itx.Event) (uint64, error) { return 1, nil }}
	defer mountScripted(t, e, "stuck", r)()
	s := stream(t, e.p, "/stuck")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "app", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "stuck"}})
	mustAppend(t, s, ev("m", `{}`))
	waitUntil(t, "the failure recorded", func() bool { return e.describe(t, s, name).Attempt == 1 })
	e.settle(t, "/stuck")
	require.Len(t, r.seen(), 1, "no resend before the backoff")
	require.Contains(t, e.describe(t, s, name).LastError, "no progress")
	e.clock.Advance(time.Second)
	waitUntil(t, "retried after the backoff", func() bool { return e.describe(t, s, name).Attempt == 2 })
	require.Len(t, r.seen(), 2)
}

// Copies of any event accepted at the source can be appended: an event at the size limit, and
// a subscription with a 500-character name.
func TestCore_CopiesOfAnyAcceptedEvent(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/big")
	long := strings.Repeat("n", itx.MaxSubscriptionNameLength)
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: long, FilterTypes: []string{"big"},
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/big-copy"}})
	require.Equal(t, long, name)
	filler := strings.Repeat("x", itx.MaxEventBytes-len("big")-len(`{"f":""}`)-len("k")-1)
	res := mustAppend(t, s, keyed("big", `{"f":"`+filler+`"}`, "k"))
	e.waitProcessed(t, s, name, res.HeadOffset)
	copies := e.events(t, stream(t, e.p, "/big-copy"), "big")
	require.Len(t, copies, 1)
	require.Len(t, copies[0].Provenance, 1)
	require.Equal(t, "active", e.describe(t, s, name).Status)
}

// An operator can always steer subscriptions, even with the circuit breaker open.
func TestCore_ControlEventsPassTheBreaker(t *testing.T) {
	e := newSubEnv(t, server.Config{BreakerBurst: 3, BreakerRefillPerMinute: 1})
	s := stream(t, e.p, "/runaway")
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))
	_, err := client.Append(e.ctx, s, []itx.EventInput{ev("a", `{}`)}, itx.AppendOptions{})
	requireCode(t, err, itx.ERateLimited)
	h := newHook(t, nil)
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "ops", Start: "now", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	_, err = client.SetSubscriptionCursor(e.ctx, s, name, 0)
	require.NoError(t, err)
	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	_, err = client.RemoveSubscription(e.ctx, subs, name)
	require.NoError(t, err)
}

func mustDescribe(t *testing.T, s schema.Stream) itx.StreamInfo {
	t.Helper()
	info, err := client.Describe(context.Background(), s)
	require.NoError(t, err)
	return info
}

// A parked subscription on a stream that has since been unloaded resumes when its receiver
// mounts: the mount alone loads the stream.
func TestCore_MountResumesAnUnloadedParkedStream(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/parked-away")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "app", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "late-inbox"}})
	mustAppend(t, s, ev("m", `{"n":1}`))
	waitUntil(t, "parked", func() bool { return e.describe(t, s, name).Status == "parked" })
	require.Equal(t, 1.0, testutil.ToFloat64(e.ts.srv.Metrics().SubscriptionParks), "the park is counted for the operator")
	require.Zero(t, testutil.ToFloat64(e.ts.srv.Metrics().SubscriptionHalts), "an absent receiver does not halt")
	s.Release()
	e.unloadAll(t)

	got := make(chan []int64, 1)
	r := &scriptedReceiver{answer: func(offsets []int64, _ []itx.Event) (uint64, error) {
		got <- offsets
		return 0, nil
	}}
	defer mountScripted(t, e, "late-inbox", r)()
	select {
	case offsets := <-got:
		require.Equal(t, []int64{2}, offsets)
	case <-time.After(15 * time.Second):
		t.Fatal("the mount did not resume the parked subscription of the unloaded stream")
	}
}
