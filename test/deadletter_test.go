package test

import (
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// deadLetters reads the dead letters of a dead-letter stream.
func (e *subEnv) deadLetters(t *testing.T, path string) []itx.DeadLetterPayload {
	t.Helper()
	var out []itx.DeadLetterPayload
	for _, d := range e.events(t, stream(t, e.p, path), itx.TypeDeadLetter) {
		var p itx.DeadLetterPayload
		require.NoError(t, json.Unmarshal(d.Payload, &p))
		out = append(out, p)
	}
	return out
}

// refuseUntilSkipped walks a failing event of subscription name up the ladder until it is
// skipped: each event-specific failure after the first waits for its backoff.
func (e *subEnv) refuseUntilSkipped(t *testing.T, path, name string, offset int64) {
	t.Helper()
	s := stream(t, e.p, path)
	for attempt := 1; attempt < itx.FailingEventConfirmAttempts; attempt++ {
		waitUntil(t, "refused", func() bool { return e.describe(t, s, name).FailingEventAttempt == attempt })
		e.clock.Advance(itx.Backoff(attempt, 0.5))
	}
	e.waitProcessed(t, s, name, offset)
}

// A skipped event lands once, whole, in the dead-letter stream with its error, and the healthy
// events around it are delivered. The dead letters can be replayed to the receiver once it is
// fixed: a subscription on the dead-letter stream that reshapes each letter into its event.
func TestDeadLetter_SkippedEventLandsOnceAndReplays(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	var fixed atomic.Bool
	h := newHook(t, func(_ int, b itx.WebhookBody) int {
		if !fixed.Load() && strings.Contains(string(b.Event.Payload), "poison") {
			return 422
		}
		return 200
	})
	s := stream(t, e.p, "/orders")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "mailer", Start: "now", OnFailingEvent: "skip", FilterTypes: []string{"order.placed"},
		DeadLetterPath: "/orders/dead", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	poison := itx.EventInput{Type: "order.placed", Payload: json.RawMessage(`{"poison":true,"id":7}`),
		Metadata: json.RawMessage(`{"trace":"t-7"}`), IdempotencyKey: "order-7"}
	res := mustAppend(t, s, ev("order.placed", `{"id":6}`), poison, ev("order.placed", `{"id":8}`)) // 2, 3, 4
	e.refuseUntilSkipped(t, "/orders", name, res.HeadOffset)

	letters := e.deadLetters(t, "/orders/dead")
	require.Len(t, letters, 1)
	l := letters[0]
	require.Equal(t, "/orders", l.Path)
	require.Equal(t, name, l.Subscription)
	require.Equal(t, int64(3), l.Offset)
	require.Equal(t, itx.FailingEventConfirmAttempts, l.Attempts)
	require.Contains(t, l.Error, "422")
	require.False(t, l.EventOmitted)
	require.Equal(t, int64(3), l.Event.Offset)
	require.Equal(t, "order.placed", l.Event.Type)
	require.JSONEq(t, `{"poison":true,"id":7}`, string(l.Event.Payload))
	require.JSONEq(t, `{"trace":"t-7"}`, string(l.Event.Metadata))
	require.Equal(t, "order-7", l.Event.IdempotencyKey)
	require.NotEmpty(t, l.StreamID)
	raw := e.events(t, stream(t, e.p, "/orders/dead"), itx.TypeDeadLetter)[0]
	require.Len(t, raw.Provenance, 1, "a letter comes from its stream as a copy does")
	require.Equal(t, "/orders", raw.Provenance[0].Path)
	require.Equal(t, int64(3), raw.Provenance[0].Offset)

	d := e.describe(t, s, name)
	require.GreaterOrEqual(t, d.ConfirmedOffset, res.HeadOffset)
	require.Equal(t, "active", d.Status)
	skips := e.events(t, s, itx.TypeErrorOccurred)
	require.Len(t, skips, 1, "the skip is still recorded at the source")
	require.Contains(t, string(skips[0].Payload), `its dead letter is in \"/orders/dead\"`)
	require.Equal(t, []int64{2, 3, 3, 3, 4}, h.received())

	// Replay: the receiver is fixed; a subscription on the dead-letter stream gives it each
	// skipped event again, reshaped from its letter.
	fixed.Store(true)
	dead := stream(t, e.p, "/orders/dead")
	replay, _ := e.configure(t, dead, client.SubscriptionConfig{Name: "replay", FilterTypes: []string{itx.TypeDeadLetter},
		Transform: `{"type": payload.event.type, "payload": payload.event.payload, "metadata": payload.event.metadata}`,
		Receiver:  client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	head := e.events(t, dead)
	e.waitProcessed(t, dead, replay, head[len(head)-1].Offset)
	last := h.bodies[len(h.bodies)-1]
	require.Equal(t, "order.placed", last.Event.Type)
	require.JSONEq(t, `{"poison":true,"id":7}`, string(last.Event.Payload))
	require.JSONEq(t, `{"trace":"t-7"}`, string(last.Event.Metadata))
}

// The skip waits for its dead letter: while the dead-letter stream refuses appends (here its
// circuit breaker is open), the failing event is not skipped, the cursor stays before it and
// lastError says why; once the breaker has refilled the letter lands and the skip follows.
func TestDeadLetter_SkipWaitsForTheDeadLetterStream(t *testing.T) {
	e := newSubEnv(t, server.Config{BreakerBurst: 5, BreakerRefillPerMinute: 1})
	h := poisonHook(t)
	s := stream(t, e.p, "/in")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "lenient", Start: "now", OnFailingEvent: "skip",
		DeadLetterPath: "/in-dead", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	dead := stream(t, e.p, "/in-dead")
	for i := 0; i < 5; i++ {
		mustAppend(t, dead, ev("m", `{}`)) // the dead-letter stream's whole burst
	}
	res := mustAppend(t, s, ev("m", `{"poison":1}`))
	for attempt := 1; attempt < itx.FailingEventConfirmAttempts; attempt++ {
		waitUntil(t, "refused", func() bool { return e.describe(t, s, name).FailingEventAttempt == attempt })
		e.clock.Advance(itx.Backoff(attempt, 0.5))
	}
	waitUntil(t, "the dead letter refused", func() bool {
		return strings.Contains(e.describe(t, s, name).LastError, "the dead-letter stream refused")
	})
	d := e.describe(t, s, name)
	require.Equal(t, res.HeadOffset-1, d.ConfirmedOffset, "not skipped without its dead letter")
	require.Zero(t, d.FailingEventSkips)
	require.Empty(t, e.events(t, s, itx.TypeErrorOccurred))
	require.Empty(t, e.deadLetters(t, "/in-dead"))

	e.clock.Advance(2 * time.Minute) // the breaker refills, and the retry is due
	// A stream's wake timer sleeps at most a minute and is armed again from the actor: one armed
	// while the advance ran may lie inside it, unfired. A second a look moves it on.
	waitUntil(t, "the retry after the refill", func() bool {
		if e.describe(t, s, name).ConfirmedOffset >= res.HeadOffset {
			return true
		}
		e.clock.Advance(time.Second)
		return false
	})
	e.waitProcessed(t, s, name, res.HeadOffset)
	letters := e.deadLetters(t, "/in-dead")
	require.Len(t, letters, 1)
	require.Equal(t, res.HeadOffset, letters[0].Offset)
	require.Len(t, e.events(t, s, itx.TypeErrorOccurred), 1)
}

// An event too large to travel inside its letter keeps its offset, type and time; the letter
// says so, and the event stays readable at its offset.
func TestDeadLetter_LargeEventIsNamedNotCopied(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	r := &scriptedReceiver{answer: func([]int64, []itx.Event) (uint64, error) { return 0, errors.New("refused") }}
	defer mountScripted(t, e, "refuser", r)()
	s := stream(t, e.p, "/big-in")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "lenient", Start: "now", OnFailingEvent: "skip",
		DeadLetterPath: "/big-dead", Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "refuser"}})
	filler := strings.Repeat("x", itx.MaxEventBytes-len("big")-len(`{"f":""}`))
	res := mustAppend(t, s, ev("big", `{"f":"`+filler+`"}`))
	e.refuseUntilSkipped(t, "/big-in", name, res.HeadOffset)
	letters := e.deadLetters(t, "/big-dead")
	require.Len(t, letters, 1)
	require.True(t, letters[0].EventOmitted)
	require.Equal(t, "big", letters[0].Event.Type)
	require.Equal(t, res.HeadOffset, letters[0].Event.Offset)
}

// An event nested as deep as an append takes (Go's JSON decoder stops at 10,000 levels) cannot
// sit inside a letter, two levels deeper: its letter names it, as a letter too large to hold it
// does, instead of being refused by the dead-letter stream at every retry until the
// subscription halts.
func TestDeadLetter_DeepEventIsNamedNotCopied(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	r := &scriptedReceiver{answer: func([]int64, []itx.Event) (uint64, error) { return 0, errors.New("refused") }}
	defer mountScripted(t, e, "refuser", r)()
	s := stream(t, e.p, "/deep-in")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "lenient", Start: "now", OnFailingEvent: "skip",
		DeadLetterPath: "/deep-dead", Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "refuser"}})
	deep := strings.Repeat(`{"a":`, itx.MaxJSONDepth) + "1" + strings.Repeat("}", itx.MaxJSONDepth) // as deep as an append takes
	res := mustAppend(t, s, ev("deep", deep))
	e.refuseUntilSkipped(t, "/deep-in", name, res.HeadOffset)
	letters := e.deadLetters(t, "/deep-dead")
	require.Len(t, letters, 1)
	require.True(t, letters[0].EventOmitted)
	require.Equal(t, "deep", letters[0].Event.Type)
	require.Equal(t, res.HeadOffset, letters[0].Event.Offset)
}

// A dead-letter path is refused, writing nothing, where it cannot work: without the skip
// policy, into the subscription's own stream, on a processor-wake or copy-to-stream receiver,
// or not a path.
func TestDeadLetter_ConfigRefused(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := newHook(t, nil)
	s := stream(t, e.p, "/refusals")
	hook := client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}
	for what, cfg := range map[string]client.SubscriptionConfig{
		"halt policy":    {Name: "a", DeadLetterPath: "/dead", Receiver: hook},
		"own stream":     {Name: "b", OnFailingEvent: "skip", DeadLetterPath: "/refusals", Receiver: hook},
		"not a path":     {Name: "c", OnFailingEvent: "skip", DeadLetterPath: "dead", Receiver: hook},
		"copy-to-stream": {Name: "d", DeadLetterPath: "/dead", Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/elsewhere"}},
	} {
		subs := client.Subscriptions(e.ctx, s)
		_, _, err := client.ConfigureSubscription(e.ctx, subs, cfg)
		subs.Release()
		require.Error(t, err, what)
		require.Equal(t, itx.EInvalid, itx.AsError(err).Code, "%s: %v", what, err)
	}
	_, err := (&client.SubscriptionConfig{Name: "p", DeadLetterPath: "/dead",
		Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}}).Config()
	require.Equal(t, itx.EInvalid, itx.AsError(err).Code)
	subs, err := client.ListSubscriptions(e.ctx, client.Subscriptions(e.ctx, s))
	require.NoError(t, err)
	require.Empty(t, subs, "nothing was configured")
}

// kill -9 as soon as the dead letter is visible, which is between the letter's commit and the
// skip's or just after both: the restarted itxd ends with exactly one letter, one skip record,
// and the cursor past the event, wherever the kill landed.
func TestCrash_Kill9AroundADeadLetter(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	h := poisonHook(t)
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	s := client.Stream(ctx, p, "/dl-kill")
	subs := client.Subscriptions(ctx, s)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "hook", Start: "now", OnFailingEvent: "skip",
		FilterTypes: []string{"job"}, DeadLetterPath: "/dl-kill/dead", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	require.NoError(t, err)
	subs.Release()
	res := mustAppend(t, s, ev("job", `{"poison":true}`))
	dead := client.Stream(ctx, p, "/dl-kill/dead")
	waitUntil(t, "the dead letter", func() bool {
		evs, err := client.GetEvents(ctx, dead, itx.Query{Types: []string{itx.TypeDeadLetter}})
		require.NoError(t, err)
		return len(evs) == 1
	})
	proc.kill9(t)
	dead.Release()
	s.Release()
	p.Release()

	proc = startItxd(t, dataDir)
	p = dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	defer p.Release()
	s = stream(t, p, "/dl-kill")
	sub := client.Subscription(ctx, s, "hook")
	defer sub.Release()
	waitUntil(t, "the skip after the restart", func() bool {
		d, err := client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		return d.ConfirmedOffset >= res.HeadOffset
	})
	letters, err := client.GetEvents(ctx, stream(t, p, "/dl-kill/dead"), itx.Query{Types: []string{itx.TypeDeadLetter}})
	require.NoError(t, err)
	require.Len(t, letters, 1, "one letter, wherever the kill landed")
	skips, err := client.GetEvents(ctx, s, itx.Query{Types: []string{itx.TypeErrorOccurred}})
	require.NoError(t, err)
	require.Len(t, skips, 1)
}

// A letter carries the skipped event as the configuring token reads it: a subscription a token
// limited to /in configured does not learn, through its dead letters, the paths outside /in that
// a copied event's provenance names.
func TestDeadLetter_ScopedSubscriptionLearnsNothingOutside(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	full := ts.project(t)
	out := stream(t, full, "/out/src")
	subs := client.Subscriptions(ctx, out)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "feed", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/in/a"}})
	subs.Release()
	require.NoError(t, err)

	tok, _ := ts.token(t, itx.Scope{Prefix: "/in"})
	in := stream(t, ts.login(t, tok), "/in/a")
	h := newHook(t, func(int, itx.WebhookBody) int { return 400 })
	subs = client.Subscriptions(ctx, in)
	_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "lenient", Start: "now", OnFailingEvent: "skip",
		FilterTypes: []string{"secret/thing"}, DeadLetterPath: "/in/dead", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	subs.Release()
	require.NoError(t, err)
	mustAppend(t, out, ev("secret/thing", `{"n": 1}`))
	dead := stream(t, full, "/in/dead")
	waitUntil(t, "the letter", func() bool {
		evs, err := client.GetEvents(ctx, dead, itx.Query{Types: []string{itx.TypeDeadLetter}})
		require.NoError(t, err)
		return len(evs) == 1
	})
	evs, err := client.GetEvents(ctx, dead, itx.Query{Types: []string{itx.TypeDeadLetter}}) // read as stored
	require.NoError(t, err)
	var l itx.DeadLetterPayload
	require.NoError(t, json.Unmarshal(evs[0].Payload, &l))
	require.Len(t, l.Event.Provenance, 1, "the copied event's hop")
	require.NotContains(t, string(evs[0].Payload), "/out/", "the letter names nothing outside the configuring token's scope")
}

// A session limited to a prefix learns nothing of a dead-letter stream outside it that a wider
// token's subscription names: not from the subscription's describe, its lastError while that
// stream refuses the letter, subscriptions.list, nor its configured event in the log.
func TestDeadLetter_ScopedSessionLearnsNothingOfAWiderDeadLetterStream(t *testing.T) {
	e := newSubEnv(t, server.Config{MaxStreamsPerProject: 1}) // /out/dead cannot be created
	h := poisonHook(t)
	s := stream(t, e.p, "/in/a")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "lenient", Start: "now", OnFailingEvent: "skip",
		DeadLetterPath: "/out/dead", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	mustAppend(t, s, ev("m", `{"poison":1}`))
	for attempt := 1; attempt < itx.FailingEventConfirmAttempts; attempt++ {
		waitUntil(t, "refused", func() bool { return e.describe(t, s, name).FailingEventAttempt == attempt })
		e.clock.Advance(itx.Backoff(attempt, 0.5))
	}
	waitUntil(t, "the dead letter refused", func() bool {
		return strings.Contains(e.describe(t, s, name).LastError, "dead-letter stream")
	})

	tok, _ := e.ts.token(t, itx.Scope{Prefix: "/in"})
	scoped := stream(t, e.ts.login(t, tok), "/in/a")
	seen := map[string]any{"describe": e.describe(t, scoped, name), "list": e.list(t, scoped)}
	events, err := client.GetEvents(e.ctx, scoped, itx.Query{})
	require.NoError(t, err)
	seen["getEvents"] = events
	for what, v := range seen {
		assert.NotContains(t, dump(t, v), "/out", "%s names a stream outside /in", what)
	}
}

// A session limited to a prefix that holds a dead-letter stream, fed by a wider token's
// subscription on a stream outside the prefix, reads the letters as it reads a copy: the skipped
// event whole, but no path outside the prefix (the letter's source, the event's provenance).
func TestDeadLetter_ScopedReaderOfTheDeadLetterStreamLearnsNothingOutside(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := poisonHook(t)
	src := stream(t, e.p, "/out/src")
	name, _ := e.configure(t, src, client.SubscriptionConfig{Name: "lenient", Start: "now", OnFailingEvent: "skip",
		DeadLetterPath: "/in/dead", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	res := mustAppend(t, src, ev("m", `{"poison":1}`))
	e.refuseUntilSkipped(t, "/out/src", name, res.HeadOffset)
	letters := e.deadLetters(t, "/in/dead")
	require.Len(t, letters, 1)
	require.Equal(t, "/out/src", letters[0].Path, "the whole-project token reads the letter as stored")

	tok, _ := e.ts.token(t, itx.Scope{Prefix: "/in"})
	events, err := client.GetEvents(e.ctx, stream(t, e.ts.login(t, tok), "/in/dead"), itx.Query{})
	require.NoError(t, err)
	require.Len(t, events, 1)
	require.Contains(t, string(events[0].Payload), "poison", "the letter still carries the event")
	assert.NotContains(t, dump(t, events), "/out", "the scoped session's read of the dead-letter stream")
}

// poisonHook is a webhook that refuses (400) every event whose payload mentions "poison".
func poisonHook(t *testing.T) *hook {
	return newHook(t, func(_ int, b itx.WebhookBody) int {
		if strings.Contains(string(b.Event.Payload), "poison") {
			return 400
		}
		return 200
	})
}
