package test

import (
	"fmt"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A receiver that confirms later and refuses two events, under "skip": each is skipped once and
// the rows after them are delivered. The second one's failure sends the unconfirmed events again
// from the cursor, the skipped first one among them; it stays skipped (refused again, with no
// attempt burnt) instead of climbing the ladder anew: it was skipped again and again, the second
// one never reached its third attempt, and nothing after it was ever delivered.
func TestAcking_SecondFailingEventLeavesTheFirstSkipped(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks-two-bad")
	name, b := e.configure(t, s, client.SubscriptionConfig{Name: "loader", Start: "now", ConfirmWindow: 10, OnFailingEvent: "skip",
		FilterTypes: []string{"row"}, DeadLetterPath: "/acks-two-bad-dead", Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "loader"}})
	r := &flakyAcker{fail: func(b itx.DeliveryBatch) error {
		if hasPayload(b, "bad") {
			return fmt.Errorf("cannot load this row")
		}
		return nil
	}}
	defer mountFlaky(t, e, "loader", r)()
	mustAppend(t, s, ev("row", `{"n":1}`), ev("row", `{"bad":1}`), ev("row", `{"n":3}`), ev("row", `{"bad":2}`), ev("row", `{"n":5}`))
	last := b + 5

	waitUntil(t, "both refused rows skipped and the row after them delivered", func() bool {
		skips, err := client.GetEvents(e.ctx, s, itx.Query{Types: []string{itx.TypeErrorOccurred}})
		require.NoError(t, err)
		if d := e.describe(t, s, name); len(skips) == 2 && d.DeliveredOffset >= last && d.FailingEventOffset == 0 {
			return true
		}
		e.toNextRetry(t, s, name)
		return false
	})
	d := e.describe(t, s, name)
	require.Equal(t, itx.StatusActive, d.Status, d.LastError)
	require.Zero(t, d.FailingEventSkips, "the row after them was a success")
	skips, err := client.GetEvents(e.ctx, s, itx.Query{Types: []string{itx.TypeErrorOccurred}})
	require.NoError(t, err)
	require.Len(t, skips, 2, "each skipped once")
	letters, err := client.ReadAll(e.ctx, stream(t, e.p, "/acks-two-bad-dead"), itx.Query{Types: []string{itx.TypeDeadLetter}})
	require.NoError(t, err)
	require.Len(t, letters, 2)
	sub := client.Subscription(e.ctx, s, name)
	defer sub.Release()
	confirmed, err := client.ConfirmSubscription(e.ctx, sub, last)
	require.NoError(t, err)
	require.GreaterOrEqual(t, confirmed, last)
}

// kill -9 after an offset-acking webhook skipped two refused events while its receiver held the
// rest unconfirmed: after the restart the unconfirmed events go again, and each skipped event is
// passed over, as skipped (its skip record says so), without being sent again: it was sent once
// more (to be refused and passed then), and before that climbed the ladder again, counting toward
// the halt a second time.
func TestCrash_Kill9AckingSkipsStandAfterTheRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	h := newHook(t, func(_ int, b itx.WebhookBody) int {
		if b.Event.Type == "poison" {
			return 422
		}
		return 200 // no confirmedOffset: taken, not confirmed yet
	})
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	p := loginItxd(t, proc)
	s := stream(t, p, "/acking-skip")
	subs := client.Subscriptions(ctx, s)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "loader", Start: "now", OnFailingEvent: "skip",
		FilterTypes: []string{"ok", "poison"}, DeadLetterPath: "/acking-skip-dead", ConfirmWindow: 100,
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	require.NoError(t, err)
	subs.Release()
	res := mustAppend(t, s, ev("ok", `{}`), ev("poison", `{}`), ev("ok", `{}`), ev("poison", `{}`), ev("ok", `{}`))
	last := res.Offsets[4]
	waitUntil(t, "both poisons skipped and the last event taken", func() bool {
		got := h.received() // one snapshot: the hook may take another send between two looks
		return len(got) > 0 && got[len(got)-1] == last && describeSub(t, s, "loader").FailingEventSkips == 0
	})
	proc.kill9(t)
	from := h.count()

	proc = startItxd(t, dataDir)
	p = loginItxd(t, proc)
	s = stream(t, p, "/acking-skip")
	waitUntil(t, "the last event taken again after the restart", func() bool {
		got := h.received()
		return len(got) > from && got[len(got)-1] == last
	})
	sends := map[int64]int{}
	for _, o := range h.received()[from:] {
		sends[o]++
	}
	require.Zero(t, sends[res.Offsets[1]], "the first skipped event is not sent again: %v", h.received()[from:])
	require.Zero(t, sends[res.Offsets[3]], "the second skipped event is not sent again: %v", h.received()[from:])
	require.Equal(t, 1, sends[res.Offsets[0]], "the unconfirmed events go again: %v", h.received()[from:])
	d := describeSub(t, s, "loader")
	require.Equal(t, itx.StatusActive, d.Status, d.LastError)
	require.Zero(t, d.FailingEventSkips)
	sub := client.Subscription(ctx, s, "loader")
	defer sub.Release()
	c, err := client.ConfirmSubscription(ctx, sub, last)
	require.NoError(t, err)
	require.GreaterOrEqual(t, c, last)
	letters, err := client.ReadAll(ctx, stream(t, p, "/acking-skip-dead"), itx.Query{Types: []string{itx.TypeDeadLetter}})
	require.NoError(t, err)
	require.Len(t, letters, 2)
	skips, err := client.GetEvents(ctx, s, itx.Query{Types: []string{itx.TypeErrorOccurred}})
	require.NoError(t, err)
	require.Len(t, skips, 2)
}

// kill -9 right after an offset-acking subscription got past an event it skipped (the next event
// delivered): the success that cleared its skip count is written at once, as the skip was, so
// the restarted itxd does not count the skip again. Left to the lazy flush, the count came back
// (the resends after the restart do not clear it: they carry nothing the receiver had not taken),
// and two more skips would have halted a subscription that had recovered in between.
func TestCrash_Kill9AfterRecoveryKeepsTheClearedSkips(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	h := newHook(t, func(_ int, b itx.WebhookBody) int {
		if b.Event.Type == "poison" {
			return 422
		}
		return 200 // taken, not confirmed
	})
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	s := stream(t, loginItxd(t, proc), "/recovery")
	subs := client.Subscriptions(ctx, s)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "loader", Start: "now", OnFailingEvent: "skip",
		FilterTypes: []string{"ok", "poison"}, ConfirmWindow: 100, Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	require.NoError(t, err)
	subs.Release()
	mustAppend(t, s, ev("ok", `{}`), ev("poison", `{}`))
	waitUntil(t, "skipped", func() bool { return describeSub(t, s, "loader").FailingEventSkips == 1 })
	res := mustAppend(t, s, ev("ok", `{}`))
	waitUntil(t, "got past it", func() bool { return describeSub(t, s, "loader").FailingEventSkips == 0 })
	proc.kill9(t) // at once: well within the lazy flush's delay

	proc = startItxd(t, dataDir)
	s = stream(t, loginItxd(t, proc), "/recovery")
	waitUntil(t, "the unconfirmed events taken again", func() bool {
		got := h.received()
		return got[len(got)-1] == res.HeadOffset && describeSub(t, s, "loader").InFlightDeadlineAt == 0
	})
	d := describeSub(t, s, "loader")
	require.Zero(t, d.FailingEventSkips, "the skip before the recovery is not counted again")
	require.Equal(t, itx.StatusActive, d.Status)
}
