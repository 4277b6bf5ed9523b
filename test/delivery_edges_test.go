package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Edge cases of push delivery, each stated from the README's "Subscriptions" section.

// A filter condition whose error text is huge (JSONata's $error takes any string up to 1 MiB)
// is an event-specific failure like any other: recorded once as stream/error-occurred, with its
// text bounded, and retried along the ladder. The record must never be too large to write, or
// the stream could never record the failure and would retry at once, forever.
func TestDelivery_HugeExpressionErrorIsBounded(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := newHook(t, nil)
	s := stream(t, e.p, "/huge-error")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "picky", Start: "now",
		FilterCondition: `payload.bad ? $error($pad("", 1048570, "x")) : true`,
		Receiver:        client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	mustAppend(t, s, ev("m", `{"bad":false}`), ev("m", `{"bad":true}`)) // 2, 3

	waitUntil(t, "the failure recorded", func() bool { return e.describe(t, s, name).Attempt == 1 })
	d := e.describe(t, s, name)
	require.Equal(t, int64(2), d.ConfirmedOffset, "the healthy prefix went through")
	require.LessOrEqual(t, len(d.LastError), itx.MaxCursorErrorLength)
	require.Contains(t, d.LastError, "filter condition failed on offset 3")

	errs := e.events(t, s, itx.TypeErrorOccurred)
	require.Len(t, errs, 1)
	var rec itx.ErrorOccurredPayload
	require.NoError(t, json.Unmarshal(errs[0].Payload, &rec))
	require.LessOrEqual(t, len(rec.Message), itx.MaxHaltErrorLength)
	require.True(t, strings.HasPrefix(rec.Message, `subscription "picky": filter condition failed on offset 3`), rec.Message[:80])
	require.Equal(t, []int64{2}, h.received())
}

// The same bound holds for the record of a skipped event: a receiver's refusal can say anything
// at any length, and the skip record carries at most MaxHaltErrorLength of it.
func TestDelivery_HugeRefusalIsBoundedInTheSkipRecord(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	huge := strings.Repeat("x", 2<<20)
	r := &scriptedReceiver{answer: func([]int64, []itx.Event) (uint64, error) {
		return 0, errors.New(huge)
	}}
	defer mountScripted(t, e, "refuser", r)()
	s := stream(t, e.p, "/huge-refusal")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "lenient", Start: "now", OnFailingEvent: "skip",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "refuser"}})
	res := mustAppend(t, s, ev("m", `{}`))
	for attempt := 1; attempt < itx.FailingEventConfirmAttempts; attempt++ {
		waitUntil(t, "refused", func() bool { return e.describe(t, s, name).FailingEventAttempt == attempt })
		e.clock.Advance(itx.Backoff(attempt, 0.5))
	}
	e.waitProcessed(t, s, name, res.HeadOffset)
	errs := e.events(t, s, itx.TypeErrorOccurred)
	require.Len(t, errs, 1)
	var rec itx.ErrorOccurredPayload
	require.NoError(t, json.Unmarshal(errs[0].Payload, &rec))
	require.Contains(t, rec.Message, "skipped failing event at offset 2")
	require.LessOrEqual(t, len(rec.Message), itx.MaxHaltErrorLength)
}

// Error texts are cut to their bounds on a character boundary: last_error and the records stay
// valid UTF-8 (and keep no replacement character) whatever the receiver's language. Three
// subscriptions shift the text by one byte each, so one of them has a 3-byte character
// straddling every bound.
func TestDelivery_ErrorTextCutOnACharacter(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := newHook(t, nil)
	s := stream(t, e.p, "/utf8-errors")
	var names []string
	for i, pad := range []string{"", "a", "aa"} {
		name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "s" + strings.Repeat("-", i), Start: "now",
			FilterCondition: `$error("` + pad + `" & $pad("", 3000, "€"))`,
			Receiver:        client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
		names = append(names, name)
	}
	mustAppend(t, s, ev("m", `{}`))
	for _, name := range names {
		waitUntil(t, "the failure recorded", func() bool { return e.describe(t, s, name).Attempt == 1 })
		d := e.describe(t, s, name)
		require.True(t, utf8.ValidString(d.LastError), "%s: last error cut inside a character: %q", name, d.LastError[len(d.LastError)-4:])
		require.Greater(t, len(d.LastError), itx.MaxCursorErrorLength-4, "cut at the bound, not before")
	}
	errs := e.events(t, s, itx.TypeErrorOccurred)
	require.Len(t, errs, len(names))
	for _, rec := range errs {
		var p itx.ErrorOccurredPayload
		require.NoError(t, json.Unmarshal(rec.Payload, &p))
		require.NotContains(t, p.Message, "\uFFFD", "the record's text was cut inside a character")
		require.LessOrEqual(t, len(p.Message), itx.MaxHaltErrorLength)
	}
}

// A webhook that accepts the request and never answers is an outage once the delivery timeout
// passes on the server's clock: the ladder backs off from there, and the same event (same
// webhook-id) goes again.
func TestDelivery_HangingWebhookTimesOut(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	release := make(chan struct{})
	h := newHook(t, func(n int, b itx.WebhookBody) int {
		if n == 0 {
			<-release
		}
		return 200
	})
	defer close(release)
	s := stream(t, e.p, "/hangs")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "slow", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	res := mustAppend(t, s, ev("m", `{}`))
	waitUntil(t, "the request open", func() bool { return h.count() == 1 })
	e.clock.Advance(itx.DeliveryTimeout)
	waitUntil(t, "the timeout recorded", func() bool { return e.describe(t, s, name).Attempt == 1 })
	d := e.describe(t, s, name)
	require.Contains(t, d.LastError, "timed out")
	require.Equal(t, e.clock.Now().Add(time.Second).UnixMilli(), d.NextAttemptAt, "an outage: the ladder's first step")
	require.Zero(t, d.FailingEventAttempt, "an outage is not held against the event")
	e.clock.Advance(time.Second)
	e.waitProcessed(t, s, name, res.HeadOffset)
	require.Equal(t, []int64{2, 2}, h.received())
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Equal(t, h.headers[0].Get("webhook-id"), h.headers[1].Get("webhook-id"))
}

// A configured event naming a webhook secret reference this project does not hold (a raw append,
// an import from another server with --with-control) can never deliver: nothing is sent
// unsigned in its place, and it is a terminal failure, halting at once with the exact error. It
// is not the event's fault, so under "skip" it must not skip events one after another.
func TestDelivery_UnknownSecretReferenceIsTerminal(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := newHook(t, nil)
	s := stream(t, e.p, "/foreign-secret")
	raw, err := json.Marshal(map[string]any{"name": "imported", "receiver": map[string]any{"action": "webhook-post",
		"url": h.url(), "secret": itx.SecretRefPrefix + strings.Repeat("ab", 16),
		"delivery": map[string]any{"start": "now", "onFailingEvent": "skip"}}})
	require.NoError(t, err)
	mustAppend(t, s, itx.EventInput{Type: itx.TypeSubscriptionConfigured, Payload: raw})
	mustAppend(t, s, ev("m", `{"n":1}`), ev("m", `{"n":2}`)) // 2, 3

	waitUntil(t, "halted", func() bool { return e.describe(t, s, "imported").Status == "halted" })
	d := e.describe(t, s, "imported")
	require.Equal(t, 1, d.Attempt, "halted at attempt 1")
	require.Equal(t, int64(1), d.ConfirmedOffset, "nothing skipped")
	require.Contains(t, d.LastError, "secret reference")
	require.Empty(t, e.events(t, s, itx.TypeErrorOccurred), "no skip records")
	halts := e.events(t, s, itx.TypeSubscriptionHalted)
	require.Len(t, halts, 1)
	require.Contains(t, string(halts[0].Payload), "secret reference")
	require.Zero(t, h.count(), "nothing sent unsigned")
}

// A redirect is not followed (the 2xx alone acknowledges, and the egress policy judged this
// URL), and it says nothing against the event: it is an outage, backing off along the ladder,
// so under "skip" a moved endpoint does not cost events.
func TestDelivery_RedirectIsAnOutage(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	target := newHook(t, nil)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.url(), http.StatusTemporaryRedirect)
	}))
	t.Cleanup(srv.Close)
	s := stream(t, e.p, "/moved")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "lenient", Start: "now", OnFailingEvent: "skip",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: srv.URL + "/old"}})
	mustAppend(t, s, ev("m", `{}`))
	for attempt := 1; attempt <= itx.FailingEventConfirmAttempts+1; attempt++ {
		waitUntil(t, fmt.Sprintf("attempt %d", attempt), func() bool { return e.describe(t, s, name).Attempt == attempt })
		d := e.describe(t, s, name)
		require.Contains(t, d.LastError, "307")
		require.Zero(t, d.FailingEventAttempt, "not held against the event")
		require.Equal(t, e.clock.Now().Add(itx.Backoff(attempt, 0.5)).UnixMilli(), d.NextAttemptAt)
		e.clock.Advance(itx.Backoff(attempt, 0.5))
	}
	require.Equal(t, int64(1), e.describe(t, s, name).ConfirmedOffset, "nothing skipped")
	require.Empty(t, e.events(t, s, itx.TypeErrorOccurred))
	require.Zero(t, target.count(), "the redirect is not followed")
}

// A provider that reconnects mounts its Receiver again before its old session is seen to end:
// the batch in flight to the old session then fails as absent, but a Receiver is mounted, so the
// subscription must not park (no later mount would come to resume it): it goes to the new one.
func TestDelivery_AbsentOutcomeAfterARemountDoesNotPark(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/remount")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "app", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}})

	got := make(chan struct{}, 1)
	conn := dial(t, e.ts.addr)
	p := conn.Login(e.ctx, e.ts.creds.ProjectToken)
	handle, err := client.MountReceiver(e.ctx, p, "inbox", client.ServeReceiver(func(ctx context.Context, _ itx.DeliveryBatch) (int64, error) {
		got <- struct{}{}
		<-ctx.Done() // the old session never answers: it ends under the call
		return 0, ctx.Err()
	}))
	require.NoError(t, err)
	dropOld := func() { handle.Release(); p.Release(); conn.Close() }
	res := mustAppend(t, s, ev("msg", `{}`))
	<-got

	second := newReceiverServer()
	defer mountReceiver(t, e.ts.addr, e.ts.creds.ProjectToken, "inbox", second)()
	dropOld() // the call in flight to the old session fails: disconnected

	waitUntil(t, "delivered to the new session, or parked", func() bool {
		d := e.describe(t, s, name)
		return d.Status == "parked" || d.ConfirmedOffset == res.HeadOffset
	})
	d := e.describe(t, s, name)
	require.Equal(t, "active", d.Status, "parked with a Receiver mounted: %s", d.LastError)
	require.Zero(t, d.Attempt, "no attempt burnt")
	require.Equal(t, []string{"msg"}, second.types())
}

// The webhook body is documented field by field (README): a receiver in any language dedupes on
// streamId and event.offset, and deliveryId is the webhook-id header.
func TestDelivery_WebhookBodyAsDocumented(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := newHook(t, func(n int, _ itx.WebhookBody) int {
		if n == 0 {
			return 503
		}
		return 200
	})
	s := stream(t, e.p, "/documented")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "hook", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	in := keyed("order", `{"id":7}`, "order-7")
	in.Metadata = json.RawMessage(`{"by":"test"}`)
	res := mustAppend(t, s, in)
	waitUntil(t, "the first try failed", func() bool { return e.describe(t, s, name).Attempt == 1 })
	e.clock.Advance(time.Second)
	e.waitProcessed(t, s, name, res.HeadOffset)

	h.mu.Lock()
	defer h.mu.Unlock()
	require.Len(t, h.raw, 2)
	for i, raw := range h.raw {
		var body map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(raw, &body))
		var keys []string
		for k := range body {
			keys = append(keys, k)
		}
		require.ElementsMatch(t, []string{"projectId", "streamId", "path", "subscription", "configuredAtOffset",
			"cursorChangedAtOffset", "deliveryId", "attempt", "headOffset", "event"}, keys)
		require.JSONEq(t, fmt.Sprintf(`{"offset":%d,"type":"order","payload":{"id":7},"createdAt":%d,"idempotencyKey":"order-7","metadata":{"by":"test"}}`,
			res.HeadOffset, e.clock.Now().Add(-time.Second).UnixMilli()), string(body["event"]))
		require.JSONEq(t, fmt.Sprintf("%q", res.StreamID), string(body["streamId"]))
		require.JSONEq(t, fmt.Sprint(i+1), string(body["attempt"]), "the attempt counts the tries")
		var id string
		require.NoError(t, json.Unmarshal(body["deliveryId"], &id))
		require.Equal(t, id, h.headers[i].Get("webhook-id"))
	}
}

// Copies carry their provenance for at most MaxProvenanceHops hops: an event copied down a chain
// arrives with 32 hops, and the next copy is dropped with an audit record instead.
func TestDelivery_CopyProvenanceEndsAt32Hops(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	path := func(i int) string { return fmt.Sprintf("/hop/%d", i) }
	hops := itx.MaxProvenanceHops
	for i := 0; i <= hops; i++ {
		e.configure(t, stream(t, e.p, path(i)), client.SubscriptionConfig{Name: "next", FilterTypes: []string{"x"},
			Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: path(i + 1)}})
	}
	mustAppend(t, stream(t, e.p, path(0)), ev("x", `{"n":1}`))

	last := stream(t, e.p, path(hops))
	waitUntil(t, "the copy down the chain", func() bool { return len(e.events(t, last, "x")) == 1 })
	got := e.events(t, last, "x")[0]
	require.Len(t, got.Provenance, hops)
	require.Equal(t, path(0), got.Provenance[0].Path)
	require.Equal(t, path(hops-1), got.Provenance[hops-1].Path)

	beyond := stream(t, e.p, path(hops+1))
	waitUntil(t, "the drop audited", func() bool { return len(e.events(t, beyond, itx.TypeErrorOccurred)) == 1 })
	require.Contains(t, string(e.events(t, beyond, itx.TypeErrorOccurred)[0].Payload), fmt.Sprintf("reached %d hops", hops))
	require.Empty(t, e.events(t, beyond, "x"))
	head, err := client.Describe(e.ctx, last)
	require.NoError(t, err)
	e.waitProcessed(t, last, "next", head.HeadOffset)
}

// One source may copy into one receiving stream through at most 64 subscriptions; the 65th is
// refused with limitExceeded and writes nothing, and other receiving streams are unaffected.
func TestDelivery_CopiesIntoOneStreamBounded(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/fan")
	for i := 0; i < itx.MaxCopySubscriptionsPerTarget; i++ {
		e.configure(t, s, client.SubscriptionConfig{Name: fmt.Sprintf("c%d", i), FilterTypes: []string{"never"},
			Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/fan-in"}})
	}
	before, err := client.Describe(e.ctx, s)
	require.NoError(t, err)
	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	_, _, err = client.ConfigureSubscription(e.ctx, subs, client.SubscriptionConfig{Name: "one-more",
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/fan-in"}})
	requireCode(t, err, itx.ELimitExceeded)
	after, err := client.Describe(e.ctx, s)
	require.NoError(t, err)
	require.Equal(t, before.HeadOffset, after.HeadOffset, "nothing written")
	// A reconfigure of one of them is not one more; another receiving stream is not counted.
	e.configure(t, s, client.SubscriptionConfig{Name: "c0", FilterTypes: []string{"still-never"},
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/fan-in"}})
	e.configure(t, s, client.SubscriptionConfig{Name: "elsewhere",
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/other"}})
}

// A copy's transform that fails on an event is an event-specific failure, recorded and retried
// along the ladder, also when the events before it in the batch did not match the filter (the
// watermark passes them): it must not leave the cursor where it was with nothing to show.
func TestDelivery_CopyTransformFailsAfterFilteredEvents(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/shaped")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "copy", FilterTypes: []string{"x"},
		Transform: `{"type": payload.t}`,
		Receiver:  client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/shaped-copy"}})
	mustAppend(t, s, ev("y", `{}`), ev("x", `{"t":"not a type"}`), ev("x", `{"t":"fine"}`)) // 2, 3, 4

	waitUntil(t, "the failure recorded", func() bool { return e.describe(t, s, name).Attempt == 1 })
	d := e.describe(t, s, name)
	require.Equal(t, int64(2), d.ConfirmedOffset, "the watermark passed what did not match")
	require.Equal(t, int64(3), d.FailingEventOffset)
	require.Contains(t, d.LastError, "transform failed on offset 3")
	require.Len(t, e.events(t, s, itx.TypeErrorOccurred), 1)
	require.Empty(t, e.events(t, stream(t, e.p, "/shaped-copy")), "nothing copied past the cursor")
}
