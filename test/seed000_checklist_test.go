package test

// Statements of seed 000 (durable subscriptions) that the checklist in
// docs/seed-000-subscriptions-checklist.md found pinned by no test over RPC: names are opaque
// (the platform parses nothing out of one, so any name within the rules is a name, addressed
// verbatim by every verb), and the repair verbs, called as verbs rather than as raw appends,
// refuse what the TypeScript core refuses with a typed error and write nothing.

import (
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Seed 000: "Names are opaque. The platform never parses structure out of a name (the
// ${durableObjectName}#${slug} convention was exactly that disease and dies). One reserved prefix
// survives: auto-generated names are subscription:<offset>"; "Caller-chosen, per-stream unique,
// 1-500 chars, trimmed". A name that looks like a path, a placement address, another case of the
// reserved prefix, or that carries the prefix anywhere but at its start, is an ordinary name:
// listed, described, seeked and removed under exactly that string. 500 characters inside
// whitespace is 500 characters once trimmed.
func TestSeed000_NamesAreOpaque(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/seed000/opaque")
	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	h := newHook(t, nil)
	long := strings.Repeat("n", itx.MaxSubscriptionNameLength)
	for _, tc := range []struct{ given, name string }{
		{"agents/a1#agent", "agents/a1#agent"},
		{"Subscription:1", "Subscription:1"},
		{"x subscription:1", "x subscription:1"},
		{"a:b:c", "a:b:c"},
		{"名前 🎉 two words", "名前 🎉 two words"},
		{"👩\u200d💻", "👩\u200d💻"}, // a zero-width joiner (Unicode Cf) inside the name
		{"  " + long + "\t", long},
	} {
		t.Run(tc.name[:min(len(tc.name), 20)], func(t *testing.T) {
			name, birth, err := client.ConfigureSubscription(e.ctx, subs, client.SubscriptionConfig{Name: tc.given,
				FilterTypes: []string{"never"}, Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
			require.NoError(t, err)
			require.Equal(t, tc.name, name)

			var listed []string
			for _, l := range e.list(t, s) {
				listed = append(listed, l.Name)
			}
			require.Contains(t, listed, tc.name)
			d := e.describe(t, s, tc.name)
			require.Equal(t, tc.name, d.Config.Name)
			require.Equal(t, birth, d.ConfiguredAtOffset)

			seek, err := client.SetSubscriptionCursor(e.ctx, s, tc.name, 0)
			require.NoError(t, err)
			require.Equal(t, seek, e.describe(t, s, tc.name).CursorChangedAtOffset)
			_, err = client.RemoveSubscription(e.ctx, subs, tc.name)
			require.NoError(t, err)
			for _, l := range e.list(t, s) {
				require.NotEqual(t, tc.name, l.Name)
			}
		})
	}
}

// The repair verbs as verbs (stream.setSubscriptionCursor, stream.resumeSubscription,
// subscriptions.remove, subscription.waitUntilProcessed, subscription.processor), against the TypeScript core's
// validation (core-processor.ts): a cursor may be set to any offset up to the head and not past
// it ("afterOffset N is beyond this stream's current maximum offset"), a resume needs a halted
// (or parked) subscription ("is neither halted nor parked"), and every verb on a name no
// subscription holds is refused ("does not exist"). Each refusal is typed and writes nothing.
func TestSeed000_RepairVerbsRefuseWithTypedErrors(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/seed000/verbs")
	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	// Once holding, the hook keeps every delivery until the test ends, so the final seek's own
	// stream/subscription-cursor-set record is not delivered (and confirmed past the head)
	// before the cursor is read back.
	var holding atomic.Bool
	held := make(chan struct{})
	h := newHook(t, func(int, itx.WebhookBody) int {
		if holding.Load() {
			<-held
		}
		return 200
	})
	t.Cleanup(func() { close(held) }) // before the hook's server closes, which waits for it
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "hook", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	head := mustAppend(t, s, ev("a", `{}`), ev("b", `{}`)).HeadOffset
	e.waitProcessed(t, s, name, head)

	nothingWritten := func(t *testing.T) {
		t.Helper()
		requireNothingWritten(t, s, head)
	}
	t.Run("cursor past the head", func(t *testing.T) {
		_, err := client.SetSubscriptionCursor(e.ctx, s, name, head+1)
		requireCode(t, err, itx.EInvalid)
		require.Contains(t, itx.ErrorMessage(err), "head")
		nothingWritten(t)
	})
	t.Run("cursor on a name nobody holds", func(t *testing.T) {
		_, err := client.SetSubscriptionCursor(e.ctx, s, "nobody", 0)
		requireCode(t, err, itx.ENotFound)
		nothingWritten(t)
	})
	t.Run("resume of an active subscription", func(t *testing.T) {
		_, err := client.ResumeSubscription(e.ctx, s, name)
		requireCode(t, err, itx.EFailedPrecondition)
		require.Contains(t, itx.ErrorMessage(err), "neither halted nor parked")
		nothingWritten(t)
	})
	t.Run("resume of a name nobody holds", func(t *testing.T) {
		_, err := client.ResumeSubscription(e.ctx, s, "nobody")
		requireCode(t, err, itx.ENotFound)
		nothingWritten(t)
	})
	t.Run("removal of a name nobody holds", func(t *testing.T) {
		_, err := client.RemoveSubscription(e.ctx, subs, "nobody")
		requireCode(t, err, itx.ENotFound)
		nothingWritten(t)
	})
	t.Run("barrier on a name nobody holds", func(t *testing.T) {
		sub := client.Subscription(e.ctx, s, "nobody")
		defer sub.Release()
		_, err := client.WaitUntilProcessed(e.ctx, sub, 1, 0)
		requireCode(t, err, itx.ENotFound)
		nothingWritten(t)
	})
	t.Run("describe of a name nobody holds", func(t *testing.T) {
		sub := client.Subscription(e.ctx, s, "nobody")
		defer sub.Release()
		_, err := client.DescribeSubscription(e.ctx, sub)
		requireCode(t, err, itx.ENotFound)
		nothingWritten(t)
	})

	// Seed 000's itx surface: ".processor // present iff processor-wake".
	t.Run("processor of a push subscription", func(t *testing.T) {
		sub := client.Subscription(e.ctx, s, name)
		defer sub.Release()
		fut, release := sub.Processor(e.ctx, nil)
		defer release()
		_, err := fut.Struct()
		requireCode(t, err, itx.EFailedPrecondition)
		require.Contains(t, itx.ErrorMessage(err), "only processor-wake subscriptions have a processor")
		nothingWritten(t)
	})

	// The head itself is a cursor (caught up), and setting one is a seek: a new seek epoch.
	holding.Store(true)
	seek, err := client.SetSubscriptionCursor(e.ctx, s, name, head)
	require.NoError(t, err)
	d := e.describe(t, s, name)
	require.Equal(t, seek, d.CursorChangedAtOffset)
	require.Equal(t, head, d.ConfirmedOffset)
}

// Seed 000: halt is "the terminal outcome of the retry ladder; subscription-delivery-resumed
// un-halts". The TypeScript sender clears the retry block when it halts, and takes a halt after
// a resume at an unmoved cursor for "a NEW transition [that] must land as a new event". So a
// resumed subscription whose receiver is still down climbs the whole ladder again (15 attempts,
// not one), then halts again with a second halted event: a resume is a fresh try, not one more.
func TestSeed000_ResumedAndStillFailingClimbsTheLadderAgain(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	const path = "/seed000/resume-ladder"
	s := stream(t, e.p, path)
	h := newHook(t, func(int, itx.WebhookBody) int { return 503 })
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "down", Start: "now", FilterTypes: []string{"job"},
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	job := mustAppend(t, s, ev("job", `{}`)).HeadOffset
	halted := func(d itx.SubscriptionDescription) bool { return d.Status == itx.StatusHalted }

	d := driveLadder(t, e, path, name, halted)
	require.Equal(t, itx.MaxDeliveryAttempts, d.Attempt)
	require.Equal(t, itx.MaxDeliveryAttempts, h.count())
	require.Len(t, e.events(t, s, itx.TypeSubscriptionHalted), 1)

	_, err := client.ResumeSubscription(e.ctx, s, name)
	require.NoError(t, err)
	d = driveLadder(t, e, path, name, halted)
	require.Equal(t, 2*itx.MaxDeliveryAttempts, h.count(), "the ladder climbed again from its first rung")
	require.Equal(t, itx.MaxDeliveryAttempts, d.Attempt)
	require.Less(t, d.ConfirmedOffset, job, "nothing skipped")
	halts := e.events(t, s, itx.TypeSubscriptionHalted)
	require.Len(t, halts, 2, "the second halt is a new transition, recorded as such")
	var second itx.HaltedPayload
	require.NoError(t, json.Unmarshal(halts[1].Payload, &second))
	require.Equal(t, []any{name, itx.MaxDeliveryAttempts}, []any{second.Name, second.Attempts})
	require.Contains(t, second.Error, "503")
}
