package test

// An audit of durable subscriptions against seeds/000 ("Stream subscriptions, connections, and
// readers"), statement by statement, for the statements no other test pinned: what a name
// configured again after a removal starts from, what setSubscriptionCursor does to the retry
// block and to a halt, the epoch fences against a receiver that answers after its subscription
// was removed or replaced, the mass-skip fuse, and generated names.

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/server"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// readAt returns the durable event at offset of the stream at path.
func readAt(t *testing.T, e *subEnv, path string, offset int64) itx.Event {
	t.Helper()
	s := stream(t, e.p, path)
	evs, err := client.GetEvents(e.ctx, s, itx.Query{After: offset - 1, Limit: 1})
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, offset, evs[0].Offset)
	return evs[0]
}

// driveLadder advances the virtual clock to each retry the subscription schedules until done
// holds for its description (the ladder's own nextAttemptAt, so no backoff is assumed).
func driveLadder(t *testing.T, e *subEnv, path, name string, done func(itx.SubscriptionDescription) bool) itx.SubscriptionDescription {
	t.Helper()
	s := stream(t, e.p, path)
	var last itx.SubscriptionDescription
	require.Eventually(t, func() bool {
		last = e.describe(t, s, name)
		if done(last) {
			return true
		}
		if now := e.clock.Now().UnixMilli(); last.NextAttemptAt > now {
			e.clock.Advance(time.Duration(last.NextAttemptAt-now) * time.Millisecond)
		}
		return false
	}, 20*time.Second, time.Millisecond, "driving the ladder of %s", name)
	return last
}

// Seed: a subscription is "born, reconfigured, rewound, and killed by appended events"; "a name
// is a reusable binding", "an epoch fences which occupant of the name a record belongs to". A
// name removed and configured again is a new occupant: a new birth epoch, a fresh cursor row at
// its start position (beginning: the whole log again), none of the old retry state, and the
// old receiver hears nothing more.
func TestSeedSub_RemovedNameConfiguredAgainStartsAfresh(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	const path = "/seedsub/recreate"
	s := stream(t, e.p, path)
	old := newHook(t, func(int, itx.WebhookBody) int { return 503 })
	mustAppend(t, s, ev("job", `{"n":1}`), ev("job", `{"n":2}`)) // 1, 2
	name, birth := e.configure(t, s, client.SubscriptionConfig{Name: "w",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: old.url()}})
	require.Equal(t, int64(3), birth)
	waitUntil(t, "the first failure", func() bool { return e.describe(t, s, name).Attempt == 1 })
	e.clock.Advance(time.Second)
	waitUntil(t, "the second failure", func() bool { return e.describe(t, s, name).Attempt == 2 })

	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	removed, err := client.RemoveSubscription(e.ctx, subs, name)
	require.NoError(t, err)
	got := readAt(t, e, path, removed)
	require.Equal(t, itx.TypeSubscriptionRemoved, got.Type)
	var rp itx.RemovedPayload
	require.NoError(t, json.Unmarshal(got.Payload, &rp))
	require.Equal(t, itx.RemovedPayload{Name: "w", Reason: "requested"}, rp)

	sub := client.Subscription(e.ctx, s, name)
	_, err = client.DescribeSubscription(e.ctx, sub)
	requireCode(t, err, itx.ENotFound)
	_, err = client.WaitUntilProcessed(e.ctx, sub, 1, time.Second)
	requireCode(t, err, itx.ENotFound)
	sub.Release()
	require.Empty(t, e.list(t, s))
	_, err = client.SetSubscriptionCursor(e.ctx, s, name, 0)
	requireCode(t, err, itx.ENotFound)
	_, err = client.ResumeSubscription(e.ctx, s, name)
	requireCode(t, err, itx.ENotFound)
	_, err = client.RemoveSubscription(e.ctx, subs, name)
	requireCode(t, err, itx.ENotFound)

	// The removed subscription's retry comes due: nothing goes to its receiver any more.
	tries := old.count()
	e.clock.Advance(time.Hour)
	e.settle(t, path)
	require.Equal(t, tries, old.count(), "a removed subscription delivers nothing")

	fresh := newHook(t, nil)
	again, reborn := e.configure(t, s, client.SubscriptionConfig{Name: "w",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: fresh.url()}})
	require.Equal(t, "w", again)
	require.Greater(t, reborn, removed)
	e.waitProcessed(t, s, name, reborn)
	d := e.describe(t, s, name)
	require.Equal(t, reborn, d.ConfiguredAtOffset, "a new birth epoch")
	require.Equal(t, reborn, d.CursorChangedAtOffset, "a new seek epoch")
	require.Equal(t, itx.StatusActive, d.Status)
	require.Zero(t, d.Attempt)
	require.Zero(t, d.NextAttemptAt)
	require.Empty(t, d.LastError)
	want := []int64{}
	for o := int64(1); o <= reborn; o++ {
		want = append(want, o)
	}
	require.Equal(t, want, fresh.received(), "start beginning: the whole log again, once, in order")
	require.Equal(t, tries, old.count())
}

// Seed: "Every late-ack guard ... and replace-vs-resume decision in the system is an epoch
// comparison -- never a name comparison." A receiver that answers after its subscription was
// removed and configured again under the same name, or replaced by a changed config, answers
// for the old occupant: its acknowledgement must not move the new occupant's cursor.
func TestSeedSub_LateAckOfAFormerOccupantIsFenced(t *testing.T) {
	for _, tc := range []struct {
		name   string
		remove bool
	}{{"removed and configured again", true}, {"replaced by a changed config", false}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newSubEnv(t, server.Config{})
			path := "/seedsub/late-" + map[bool]string{true: "recreate", false: "replace"}[tc.remove]
			s := stream(t, e.p, path)
			release := make(chan struct{})
			slow := newHook(t, func(n int, _ itx.WebhookBody) int {
				if n == 0 {
					<-release // the old occupant's delivery hangs until the name has a new one
				}
				return 200
			})
			var mu sync.Mutex
			down := true
			next := newHook(t, func(int, itx.WebhookBody) int {
				mu.Lock()
				defer mu.Unlock()
				if down {
					return 503
				}
				return 200
			})
			name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "w", Start: "now", FilterTypes: []string{"job"},
				Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: slow.url()}}) // 1
			job := mustAppend(t, s, ev("job", `{}`)).HeadOffset // 2
			waitUntil(t, "the old occupant's delivery in flight", func() bool { return slow.count() == 1 })

			late := testutil.ToFloat64(e.ts.srv.Metrics().LateAcks)
			if tc.remove {
				subs := client.Subscriptions(e.ctx, s)
				_, err := client.RemoveSubscription(e.ctx, subs, name)
				subs.Release()
				require.NoError(t, err)
			}
			_, born := e.configure(t, s, client.SubscriptionConfig{Name: "w", Start: "now", FilterTypes: []string{"job"},
				Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: next.url()}})
			if !tc.remove {
				// A changed config keeps the cursor (README): the job is owed to the new receiver.
				waitUntil(t, "the new receiver refused the job", func() bool { return e.describe(t, s, name).Attempt == 1 })
			}
			// The old occupant's try ends (cancelled with its occupant, or answered 200 once
			// released): either way its outcome is refused by the epoch fence.
			close(release)
			waitUntil(t, "the old occupant's outcome refused", func() bool {
				return testutil.ToFloat64(e.ts.srv.Metrics().LateAcks) > late
			})
			e.settle(t, path)
			d := e.describe(t, s, name)
			if tc.remove {
				require.Equal(t, born, d.ConfirmedOffset, "start now: the new occupant owes nothing before its birth, and the old ack moved nothing")
			} else {
				require.Less(t, d.ConfirmedOffset, job, "the former occupant's 200 does not confirm the job for the new receiver")
				mu.Lock()
				down = false
				mu.Unlock()
				e.clock.Advance(time.Second)
				e.waitProcessed(t, s, name, born)
				require.Equal(t, job, next.distinct()[0], "the job reaches the new receiver")
			}
		})
	}
}

// Seed (cursor row): setSubscriptionCursor is a repair verb; the cursor-set event is the new
// seek epoch (cursor_changed_at_offset) and the retry block starts over (the TypeScript store's
// setCursor clears attempt, next_attempt_at, last_error and the failing-event block). Its
// payload is {name, afterOffset}.
func TestSeedSub_CursorSetStartsTheRetryBlockOver(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	const path = "/seedsub/seek-retry"
	s := stream(t, e.p, path)
	h := newHook(t, func(_ int, b itx.WebhookBody) int {
		if strings.Contains(string(b.Event.Payload), "bad") {
			return 422
		}
		return 200
	})
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "w", FilterTypes: []string{"job"},
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}}) // 1
	bad := mustAppend(t, s, ev("job", `{"bad":true}`)).HeadOffset // 2
	waitUntil(t, "the bad job refused once", func() bool { return e.describe(t, s, name).FailingEventAttempt == 1 })
	e.clock.Advance(time.Second)
	waitUntil(t, "the bad job refused twice", func() bool { return e.describe(t, s, name).FailingEventAttempt == 2 })
	d := e.describe(t, s, name)
	require.Equal(t, bad, d.FailingEventOffset)
	require.Equal(t, 2, d.Attempt)
	require.NotZero(t, d.NextAttemptAt)
	require.Contains(t, d.LastError, "422")

	seek, err := client.SetSubscriptionCursor(e.ctx, s, name, bad)
	require.NoError(t, err)
	got := readAt(t, e, path, seek)
	require.Equal(t, itx.TypeSubscriptionCursorSet, got.Type)
	var cp itx.CursorSetPayload
	require.NoError(t, json.Unmarshal(got.Payload, &cp))
	require.Equal(t, itx.CursorSetPayload{Name: "w", AfterOffset: bad}, cp)

	d = e.describe(t, s, name)
	require.Equal(t, seek, d.CursorChangedAtOffset, "the cursor-set event is the seek epoch")
	require.Equal(t, int64(1), d.ConfiguredAtOffset, "the birth epoch stays")
	require.GreaterOrEqual(t, d.ConfirmedOffset, bad)
	require.Equal(t, itx.StatusActive, d.Status)
	require.Zero(t, d.Attempt, "attempt starts over")
	require.Zero(t, d.NextAttemptAt, "no retry is due")
	require.Empty(t, d.LastError)
	require.Zero(t, d.FailingEventOffset)
	require.Zero(t, d.FailingEventAttempt)

	ok := mustAppend(t, s, ev("job", `{"ok":true}`)).HeadOffset
	e.waitProcessed(t, s, name, ok)
	require.Equal(t, []int64{bad, bad, ok}, h.received(), "past the seek, the bad job is never sent again")
}

// Seed: "halt = the terminal outcome of the retry ladder; subscription-delivery-resumed
// un-halts". A cursor-set is no resume: a halted subscription whose cursor is moved stays
// halted (the TypeScript reducer clears deliveryHalted only on resume or a new configure), and
// resuming it delivers from the new cursor.
func TestSeedSub_CursorSetOnAHaltedSubscriptionKeepsItHalted(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	const path = "/seedsub/seek-halted"
	var broken sync.Map
	broken.Store("on", true)
	h := haltWebhook(t, e, path, "fragile", &broken)
	s := stream(t, e.p, path)
	head := mustDescribe(t, s).HeadOffset // the job and the halt record

	seek, err := client.SetSubscriptionCursor(e.ctx, s, "fragile", head)
	require.NoError(t, err)
	d := e.describe(t, s, "fragile")
	require.Equal(t, itx.StatusHalted, d.Status, "a cursor-set does not un-halt")
	require.Equal(t, head, d.ConfirmedOffset)
	require.Equal(t, seek, d.CursorChangedAtOffset)
	require.Zero(t, d.NextAttemptAt, "nothing is scheduled while halted")

	broken.Store("on", false)
	tries := h.count()
	job := mustAppend(t, s, ev("job", `{"n":2}`)).HeadOffset
	e.clock.Advance(time.Hour)
	e.settle(t, path)
	require.Equal(t, tries, h.count(), "halted means halted, cursor moved or not")
	require.Equal(t, itx.StatusHalted, e.list(t, s)[0].Status)

	resumed, err := client.ResumeSubscription(e.ctx, s, "fragile")
	require.NoError(t, err)
	got := readAt(t, e, path, resumed)
	require.Equal(t, itx.TypeSubscriptionResumed, got.Type)
	var np itx.NamePayload
	require.NoError(t, json.Unmarshal(got.Payload, &np))
	require.Equal(t, "fragile", np.Name)
	e.waitProcessed(t, s, "fragile", resumed)
	require.Equal(t, []int64{job}, h.received()[tries:], "resumed from the new cursor: the job it halted on is not sent again")
}

// Seed (retry block): failing_event_skips_since_last_success, "durable because eviction must
// not reset the mass-skip fuse". Under onFailingEvent skip, a confirmed failing event is skipped
// with a stream/error-occurred record; once skips run consecutive (the third without a success
// between them) the receiver is taken to be down, and the subscription halts instead of
// skipping its backlog.
func TestSeedSub_ConsecutiveSkipsHalt(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	const path = "/seedsub/skip-fuse"
	s := stream(t, e.p, path)
	h := newHook(t, func(_ int, b itx.WebhookBody) int {
		if strings.Contains(string(b.Event.Payload), "poison") {
			return 422
		}
		return 200
	})
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "lenient", Start: "now", OnFailingEvent: "skip", FilterTypes: []string{"m"},
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}}) // 1
	mustAppend(t, s, ev("m", `{"poison":1}`), ev("m", `{"poison":2}`), ev("m", `{"poison":3}`), ev("m", `{"ok":1}`)) // 2..5

	d := driveLadder(t, e, path, name, func(d itx.SubscriptionDescription) bool { return d.Status == itx.StatusHalted })
	require.Equal(t, int64(3), d.ConfirmedOffset, "the first two poison events were skipped, the third was not")
	require.Equal(t, 2, d.FailingEventSkips)

	skips := e.events(t, s, itx.TypeErrorOccurred)
	require.Len(t, skips, 2)
	require.Contains(t, string(skips[0].Payload), "offset 2")
	require.Contains(t, string(skips[1].Payload), "offset 3")
	halts := e.events(t, s, itx.TypeSubscriptionHalted)
	require.Len(t, halts, 1)
	var hp itx.HaltedPayload
	require.NoError(t, json.Unmarshal(halts[0].Payload, &hp))
	require.Equal(t, name, hp.Name)
	require.Equal(t, int64(3), hp.AfterOffset)
	require.Contains(t, hp.Error, "422")
	for _, o := range h.received() {
		require.NotEqual(t, int64(5), o, "nothing past the halt is delivered")
	}
}

// Seed: "auto-generated names are subscription:<offset> (birth-offset-derived, stable,
// doctrine-pure)"; "generated names are first-class". The generated name addresses the
// subscription everywhere a chosen one does (describe, reconfigure, cursor-set, remove), and
// only the omitted-name fallback may mint one. Names are trimmed, also in the stored event.
func TestSeedSub_GeneratedNamesAreFirstClass(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	const path = "/seedsub/generated"
	s := stream(t, e.p, path)
	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	a, b := newHook(t, nil), newHook(t, nil)
	mustAppend(t, s, ev("x", `{}`))
	name, birth, err := client.ConfigureSubscription(e.ctx, subs, client.SubscriptionConfig{IdempotencyKey: "gen-1", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: a.url()}})
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("subscription:%d", birth), name)
	list := e.list(t, s)
	require.Len(t, list, 1)
	require.Equal(t, name, list[0].Name)
	require.Equal(t, itx.KindWebhookPost, list[0].Kind)
	require.Equal(t, birth, e.describe(t, s, name).ConfiguredAtOffset)

	// Reconfigured by its generated name: the same subscription, not a second one.
	again, off, err := client.ConfigureSubscription(e.ctx, subs, client.SubscriptionConfig{Name: name, Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: b.url()}})
	require.NoError(t, err)
	require.Equal(t, name, again)
	require.Greater(t, off, birth)
	require.Len(t, e.list(t, s), 1)
	x := mustAppend(t, s, ev("x", `{}`)).HeadOffset
	e.waitProcessed(t, s, name, x)
	require.Contains(t, b.received(), x)

	seek, err := client.SetSubscriptionCursor(e.ctx, s, name, x)
	require.NoError(t, err)
	require.Equal(t, seek, e.describe(t, s, name).CursorChangedAtOffset)
	_, err = client.RemoveSubscription(e.ctx, subs, name)
	require.NoError(t, err)

	// Gone, the generated name cannot be chosen: only the fallback mints one.
	_, _, err = client.ConfigureSubscription(e.ctx, subs, client.SubscriptionConfig{Name: name,
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: a.url()}})
	requireCode(t, err, itx.EInvalid)

	padded, off, err := client.ConfigureSubscription(e.ctx, subs, client.SubscriptionConfig{Name: "  padded\t",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: a.url()}})
	require.NoError(t, err)
	require.Equal(t, "padded", padded)
	got := readAt(t, e, path, off)
	require.Equal(t, itx.TypeSubscriptionConfigured, got.Type)
	var cfg map[string]any
	require.NoError(t, json.Unmarshal(got.Payload, &cfg))
	require.Equal(t, "padded", cfg["name"], "the configured event stores the trimmed name")
	require.Equal(t, itx.KindWebhookPost, cfg["receiver"].(map[string]any)["action"])

	// "1-500 chars, trimmed": a name given blank is 0 characters, refused, not taken for a name
	// left out (which the wire spells as the empty text), also with an idempotency key and in a
	// raw append of the configured event.
	for _, bad := range []string{"   ", "\t", strings.Repeat("n", itx.MaxSubscriptionNameLength+1)} {
		_, _, err := client.ConfigureSubscription(e.ctx, subs, client.SubscriptionConfig{Name: bad, IdempotencyKey: "k-" + bad,
			Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: a.url()}})
		requireCode(t, err, itx.EInvalid)
	}
	_, err = client.Append(e.ctx, s, []itx.EventInput{ev(itx.TypeSubscriptionConfigured,
		`{"name":"  ","receiver":{"action":"webhook-post","url":"`+a.url()+`"}}`)}, itx.AppendOptions{})
	requireCode(t, err, itx.EInvalid)
	before := len(e.list(t, s))
	_, _, err = client.ConfigureSubscription(e.ctx, subs, client.SubscriptionConfig{IdempotencyKey: "k-none",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: a.url()}})
	require.NoError(t, err, "a name left out is generated")
	require.Len(t, e.list(t, s), before+1)
	_, _, err = client.ConfigureSubscription(e.ctx, subs, client.SubscriptionConfig{Name: strings.Repeat("n", itx.MaxSubscriptionNameLength),
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: a.url()}})
	require.NoError(t, err, "500 characters is a name")
}

// README (a documented choice over the TypeScript store, whose every new configured event moves
// the cursor to the new config's start): a changed config keeps the cursor, and only a new
// start position or receiver kind moves it to that start.
func TestSeedSub_ChangedStartMovesTheCursor(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	const path = "/seedsub/restart"
	s := stream(t, e.p, path)
	h := newHook(t, nil)
	mustAppend(t, s, ev("x", `{}`), ev("x", `{}`)) // 1, 2
	name, birth := e.configure(t, s, client.SubscriptionConfig{Name: "w", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}}) // 3
	d := e.describe(t, s, name)
	require.Equal(t, birth, d.ConfirmedOffset, "start now: the cursor is the birth event")
	require.Zero(t, e.list(t, s)[0].Lag)
	require.Equal(t, birth, e.waitProcessed(t, s, name, birth))
	require.Empty(t, h.received())

	_, off := e.configure(t, s, client.SubscriptionConfig{Name: "w", Start: "beginning",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}}) // 4
	e.waitProcessed(t, s, name, off)
	require.Equal(t, []int64{1, 2, 3, 4}, h.received(), "start beginning: from offset 1")
	d = e.describe(t, s, name)
	require.Equal(t, off, d.ConfiguredAtOffset)
	require.Equal(t, off, d.CursorChangedAtOffset)

	_, off = e.configure(t, s, client.SubscriptionConfig{Name: "w", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}}) // 5
	require.Equal(t, off, e.describe(t, s, name).ConfirmedOffset, "back to now: after the new birth event")
	require.Equal(t, []int64{1, 2, 3, 4}, h.received())
}

// Seed (receiver kinds, processor-wake): "The announced consumes still composes with the
// configured filter." A processor sees only the events its contract consumes AND its
// subscription's filter passes, wherever it is placed: in-process, or on a remote host that
// pages the stream itself. The filter is a watermark there too: the cursor passes what it drops.
func TestSeedSub_ProcessorFilterComposesWithConsumes(t *testing.T) {
	for _, placement := range []string{"in-process", "remote"} {
		t.Run(placement, func(t *testing.T) {
			cfg := server.Config{}
			if placement == "in-process" {
				cfg.Processors = referenceHost(t, "guestbook")
			}
			ts := startServer(t, cfg)
			ctx := ctxT(t)
			p := ts.project(t)
			s := stream(t, p, "/seedsub/proc-filter")
			subs := client.Subscriptions(ctx, s)
			_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "guestbook",
				FilterCondition: `payload.name != "mallory"`,
				Receiver:        client.Receiver{Kind: client.ReceiverProcessorWake, Placement: placement}})
			subs.Release()
			require.NoError(t, err)
			if placement == "remote" {
				awaitMount(t, runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "worker-1", referenceHost(t, "guestbook")))
			}
			var head int64
			for _, who := range []string{"ada", "mallory", "bob", "mallory"} {
				head = mustAppend(t, s, examples.GuestbookSigned.Input(examples.Signed{Name: who, Message: "hi"}, "")).HeadOffset
			}
			head = mustAppend(t, s, ev("note", `{"name":"carol"}`)).HeadOffset // passes the filter, not consumed

			sub, proc := processorOf(t, s, "guestbook")
			processed, err := client.WaitUntilProcessed(ctx, sub, head, 0)
			require.NoError(t, err)
			require.GreaterOrEqual(t, processed, head, "the filter is a watermark: the cursor passes what it drops")
			snap, err := client.Snapshot(ctx, proc)
			require.NoError(t, err)
			var st examples.GuestbookState
			require.NoError(t, json.Unmarshal([]byte(snap.State), &st))
			var names []string
			for _, r := range st.Recent {
				names = append(names, r.Name)
			}
			require.Equal(t, []string{"ada", "bob"}, names, "only what the contract consumes and the filter passes")
			require.Equal(t, 2, st.Count)

			// The operator's rewind re-reduces through the cursor it sets (Reduce only) and
			// processes from there: through the same filter.
			seek, err := client.SetSubscriptionCursor(ctx, s, "guestbook", 4) // after ada (2), mallory (3), bob (4)
			require.NoError(t, err)
			_, err = client.WaitUntilProcessed(ctx, sub, seek, 0)
			require.NoError(t, err)
			snap, err = client.Snapshot(ctx, proc)
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal([]byte(snap.State), &st))
			names = nil
			for _, r := range st.Recent {
				names = append(names, r.Name)
			}
			require.Equal(t, []string{"ada", "bob"}, names, "rewound: the re-reduction passes the filter too")
			require.Equal(t, 2, st.Count)
		})
	}
}

// A read as a subscription is delivered (EventQuery.subscription, what a remote processor host
// pages its frames with): the subscription's filter on top of the query's types, no ephemeral
// event, and nextAfter past what the filter drops, as the subscription's watermark.
func TestSeedSub_ReadAsASubscription(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	const path = "/seedsub/read-as"
	s := stream(t, e.p, path)
	e.configure(t, s, client.SubscriptionConfig{Name: "big", FilterTypes: []string{"order", "refund"}, FilterCondition: "payload.total > 10",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "nobody"}}) // 1
	eph := ev("order", `{"total":50}`)
	eph.Ephemeral = true
	mustAppend(t, s, ev("order", `{"total":5}`), ev("order", `{"total":20}`), ev("note", `{"total":99}`), ev("refund", `{"total":30}`)) // 2..5
	mustAppend(t, s, eph)                                                                                                               // 6
	mustAppend(t, s, ev("order", `{"total":1}`))                                                                                        // 7
	offsets := func(q itx.Query) ([]int64, int64) {
		t.Helper()
		page, err := client.GetEventPage(e.ctx, s, q)
		require.NoError(t, err)
		var out []int64
		for _, ev := range page.Events {
			out = append(out, ev.Offset)
		}
		return out, page.NextAfter
	}
	got, next := offsets(itx.Query{Subscription: "big", IncludeEphemeral: true})
	require.Equal(t, []int64{3, 5}, got)
	require.Equal(t, int64(7), next, "nextAfter passes what the filter drops")
	got, next = offsets(itx.Query{Subscription: " big ", Types: []string{"refund", "note"}})
	require.Equal(t, []int64{5}, got, "the query's types and the subscription's both apply")
	require.Equal(t, int64(7), next)
	got, next = offsets(itx.Query{Subscription: "big", Types: []string{"note"}})
	require.Empty(t, got, "no type passes both")
	require.Equal(t, int64(7), next)
	got, next = offsets(itx.Query{Subscription: "big", After: 3, Limit: 1})
	require.Equal(t, []int64{5}, got)
	require.Equal(t, int64(5), next)
	_, err := client.GetEventPage(e.ctx, s, itx.Query{Subscription: "nobody"})
	requireCode(t, err, itx.ENotFound)

	e.configure(t, s, client.SubscriptionConfig{Name: "all-big", FilterTypes: []string{"*"}, FilterCondition: "payload.total > 10",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "nobody"}}) // 8
	got, next = offsets(itx.Query{Subscription: "all-big"})
	require.Equal(t, []int64{3, 4, 5}, got, `"*" passes every type`)
	require.Equal(t, int64(8), next)
}

// Seed: late-ack protection is an epoch comparison, for a failure as for a success: a delivery
// that fails after the operator moved the cursor reports for the old seek epoch, and neither
// climbs the new epoch's ladder nor schedules its retry.
func TestSeedSub_LateFailureAfterASeekIsFenced(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	const path = "/seedsub/late-failure"
	s := stream(t, e.p, path)
	release := make(chan struct{})
	h := newHook(t, func(n int, _ itx.WebhookBody) int {
		if n == 0 {
			<-release
			return 500 // the old epoch's try fails, late
		}
		return 200
	})
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "w", Start: "now", FilterTypes: []string{"job"},
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}}) // 1
	mustAppend(t, s, ev("job", `{"n":1}`)) // 2
	waitUntil(t, "the first try in flight", func() bool { return h.count() == 1 })
	late := testutil.ToFloat64(e.ts.srv.Metrics().LateAcks)
	seek, err := client.SetSubscriptionCursor(e.ctx, s, name, 2) // past the job: a new seek epoch
	require.NoError(t, err)
	close(release)
	waitUntil(t, "the late failure refused", func() bool { return testutil.ToFloat64(e.ts.srv.Metrics().LateAcks) > late })
	e.settle(t, path)
	d := e.describe(t, s, name)
	require.Equal(t, seek, d.CursorChangedAtOffset)
	require.Zero(t, d.Attempt, "the old epoch's failure is not the new epoch's")
	require.Zero(t, d.NextAttemptAt)
	require.Empty(t, d.LastError)
	job := mustAppend(t, s, ev("job", `{"n":2}`)).HeadOffset
	e.waitProcessed(t, s, name, job)
	require.Equal(t, []int64{2, job}, h.received())
}

// Seed: waitUntilProcessed(name, {offset}) is the consumer-side barrier against a subscription;
// one pending when its subscription is removed answers at once that it is gone, rather than
// waiting out its timeout.
func TestSeedSub_BarrierEndsWhenItsSubscriptionIsRemoved(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	const path = "/seedsub/barrier-removed"
	s := stream(t, e.p, path)
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "app", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "nobody-mounted"}}) // 1
	job := mustAppend(t, s, ev("job", `{}`)).HeadOffset
	waitUntil(t, "parked", func() bool { return e.describe(t, s, name).Status == itx.StatusParked })

	sub := client.Subscription(e.ctx, s, name)
	defer sub.Release()
	timers := e.clock.Pending()
	errc := make(chan error, 1)
	go func() {
		_, err := client.WaitUntilProcessed(e.ctx, sub, job, 15*time.Second)
		errc <- err
	}()
	waitUntil(t, "barrier armed", func() bool { return e.clock.Pending() > timers })
	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	_, err := client.RemoveSubscription(e.ctx, subs, name)
	require.NoError(t, err)
	select {
	case err := <-errc:
		requireCode(t, err, itx.ENotFound)
	case <-time.After(10 * time.Second): // real time; the barrier's own 15 s are on the virtual clock
		t.Fatal("the barrier outlived its subscription")
	}
}

// Seed (cursor row, the in-flight block): in_flight_deadline_at and
// in_flight_connection_generation say a delivery is out and until when it may take (the 20 s
// delivery timeout); its answer clears them. The generation fences a late answer: a new
// occupant of the name delivers under another.
func TestSeedSub_InFlightBlock(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	const path = "/seedsub/in-flight"
	s := stream(t, e.p, path)
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	defer open() // a failing test must not leave the handler blocked (the hook's Close waits for it)
	h := newHook(t, func(n int, _ itx.WebhookBody) int {
		if n == 0 {
			<-release
		}
		return 200
	})
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "w", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	sent := e.clock.Now()
	job := mustAppend(t, s, ev("job", `{}`)).HeadOffset
	waitUntil(t, "the delivery in flight", func() bool { return h.count() == 1 })
	var d itx.SubscriptionDescription
	waitUntil(t, "the in-flight block shown", func() bool { d = e.describe(t, s, name); return d.InFlightDeadlineAt != 0 })
	require.Equal(t, sent.Add(itx.DeliveryTimeout).UnixMilli(), d.InFlightDeadlineAt)
	require.NotZero(t, d.InFlightConnectionGeneration)
	first := d.InFlightConnectionGeneration
	open()
	e.waitProcessed(t, s, name, job)
	e.settle(t, path)
	d = e.describe(t, s, name)
	require.Zero(t, d.InFlightDeadlineAt, "answered: nothing in flight")
	require.Zero(t, d.InFlightConnectionGeneration)

	// A new occupant of the name delivers under another generation.
	blocked := make(chan struct{})
	h2 := newHook(t, func(int, itx.WebhookBody) int { <-blocked; return 200 })
	defer close(blocked)
	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	_, err := client.RemoveSubscription(e.ctx, subs, name)
	require.NoError(t, err)
	e.configure(t, s, client.SubscriptionConfig{Name: "w", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h2.url()}})
	waitUntil(t, "the new occupant's delivery in flight", func() bool { d = e.describe(t, s, name); return d.InFlightDeadlineAt != 0 })
	require.NotEqual(t, first, d.InFlightConnectionGeneration)
}

// Seed: "has a cursor row <=> named <=> the stream owes it delivery across evictions." A
// removal survives kill -9 (the name stays free, its row gone), a cursor-set's seek epoch and
// cleared retry block survive it, and a name configured again after the restart is a fresh
// occupant.
func TestSeedSub_RemovalAndSeekSurviveKill9(t *testing.T) {
	dir := t.TempDir()
	const path = "/seedsub/kill9"
	down := newHook(t, func(int, itx.WebhookBody) int { return 503 })
	proc := startItxd(t, dir)
	ctx := ctxT(t)
	s := stream(t, loginItxd(t, proc), path)
	subs := client.Subscriptions(ctx, s)
	for _, name := range []string{"gone", "kept"} {
		_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: name, FilterTypes: []string{"job"},
			Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: down.url()}})
		require.NoError(t, err)
	}
	job := mustAppend(t, s, ev("job", `{}`)).HeadOffset // 3
	waitUntil(t, "both refused once", func() bool {
		return describeSubIn(ctx, t, s, "gone").Attempt >= 1 && describeSubIn(ctx, t, s, "kept").Attempt >= 1
	})
	_, err := client.RemoveSubscription(ctx, subs, "gone")
	require.NoError(t, err)
	seek, err := client.SetSubscriptionCursor(ctx, s, "kept", job)
	require.NoError(t, err)
	subs.Release()
	proc.kill9(t)

	proc = startItxd(t, dir)
	s = stream(t, loginItxd(t, proc), path)
	subs = client.Subscriptions(ctx, s)
	defer subs.Release()
	list, err := client.ListSubscriptions(ctx, subs)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "kept", list[0].Name)
	d := describeSubIn(ctx, t, s, "kept")
	require.Equal(t, seek, d.CursorChangedAtOffset)
	require.GreaterOrEqual(t, d.ConfirmedOffset, job)
	require.Zero(t, d.Attempt)
	require.Empty(t, d.LastError)
	gone := client.Subscription(ctx, s, "gone")
	_, err = client.DescribeSubscription(ctx, gone)
	gone.Release()
	requireCode(t, err, itx.ENotFound)

	up := newHook(t, nil)
	_, born, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "gone",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: up.url()}})
	require.NoError(t, err)
	sub := client.Subscription(ctx, s, "gone")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, born, 15*time.Second)
	require.NoError(t, err)
	d = describeSubIn(ctx, t, s, "gone")
	require.Equal(t, born, d.ConfiguredAtOffset)
	require.Zero(t, d.Attempt)
	require.Equal(t, int64(1), up.received()[0], "a fresh occupant starts at the beginning")
}

// Two instances of one contract, each under its own subscription filter: each runner reads
// through its own (the filter is the instance's, keyed by its subscription's name), through a
// rewind too.
func TestSeedSub_InstancesReadThroughTheirOwnFilters(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "guestbook")})
	ctx := ctxT(t)
	p := ts.project(t)
	s := stream(t, p, "/seedsub/instances-filter")
	subs := client.Subscriptions(ctx, s)
	for _, c := range []client.SubscriptionConfig{
		{Name: "guestbook", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}},
		{Name: "no-mallory", FilterCondition: `payload.name != "mallory"`,
			Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Processor: "guestbook"}},
	} {
		_, _, err := client.ConfigureSubscription(ctx, subs, c)
		require.NoError(t, err)
	}
	subs.Release()
	var head int64
	for _, who := range []string{"ada", "mallory", "bob"} {
		head = mustAppend(t, s, examples.GuestbookSigned.Input(examples.Signed{Name: who, Message: "hi"}, "")).HeadOffset
	}
	count := func(name string) int {
		t.Helper()
		sub, proc := processorOf(t, s, name)
		_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
		require.NoError(t, err)
		snap, err := client.Snapshot(ctx, proc)
		require.NoError(t, err)
		var st examples.GuestbookState
		require.NoError(t, json.Unmarshal([]byte(snap.State), &st))
		return st.Count
	}
	require.Equal(t, 3, count("guestbook"))
	require.Equal(t, 2, count("no-mallory"))
	for _, name := range []string{"guestbook", "no-mallory"} {
		_, err := client.SetSubscriptionCursor(ctx, s, name, head-1) // re-reduce through mallory's signature
		require.NoError(t, err)
	}
	head = mustDescribe(t, s).HeadOffset
	require.Equal(t, 3, count("guestbook"))
	require.Equal(t, 2, count("no-mallory"))
}

// Seed (receiver kinds): processor-wake "gains a placement field: facet (no expression needed --
// the subscription name is the facet name...)". Here facet placement is in-process (DESIGN), so
// the seed's "facet" is taken as "in-process": the same subscription, run next to its stream.
func TestSeedSub_FacetPlacementIsInProcess(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "guestbook")})
	ctx := ctxT(t)
	p := ts.project(t)
	s := stream(t, p, "/seedsub/facet")
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, birth, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "guestbook",
		Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Placement: "facet"}})
	require.NoError(t, err)
	head := mustAppend(t, s, examples.GuestbookSigned.Input(examples.Signed{Name: "ada", Message: "hi"}, "")).HeadOffset
	sub, proc := processorOf(t, s, "guestbook")
	_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	snap, err := client.Snapshot(ctx, proc)
	require.NoError(t, err)
	require.Equal(t, head, snap.ProcessedOffset)
	d, err := client.DescribeSubscription(ctx, sub)
	require.NoError(t, err)
	require.Equal(t, "in-process", d.Config.Receiver.Placement)
	// The same subscription said the seed's way or this server's: configure stays idempotent.
	_, again, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "guestbook",
		Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Placement: "in-process"}})
	require.NoError(t, err)
	require.Equal(t, birth, again)
}
