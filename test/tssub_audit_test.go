package test

// A cross-check of durable subscriptions against the TypeScript system seeds/000 describes
// (iterate/iterate, apps/os/src/domains/streams), for the edges its own tests pin and ours did
// not: what a pending barrier does when its subscription's name changes hands.

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// barrier starts waitUntilProcessed(offset) on name in the background (its 15 s on the virtual
// clock) and returns once the server holds it, with the channel its answer arrives on.
func (e *subEnv) barrier(t *testing.T, path, name string, offset int64) <-chan error {
	t.Helper()
	s := stream(t, e.p, path)
	sub := client.Subscription(e.ctx, s, name)
	t.Cleanup(sub.Release)
	timers := e.clock.Pending()
	errc := make(chan error, 1)
	go func() {
		_, err := client.WaitUntilProcessed(e.ctx, sub, offset, 15*time.Second)
		errc <- err
	}()
	waitUntil(t, "barrier armed", func() bool { return e.clock.Pending() > timers })
	return errc
}

// answer is the barrier's answer, in real time (its own timeout is on the virtual clock).
func answer(t *testing.T, errc <-chan error) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the barrier did not answer")
		return nil
	}
}

// Seed 000: "names bind, epochs fence": a name plus its epoch is the identity, and
// waitUntilProcessed is a barrier against a subscription. One pending when its subscription is
// removed ends notFound (TS: "was removed while waiting"), even when the same commit configures a
// new subscription under the name: the newcomer's cursor says nothing of what the removed one
// processed (here it starts after the offset waited for, having processed none of it). A changed
// config is the same subscription going on from its cursor: the barrier follows it.
func TestTSSub_BarrierIsFencedByTheOccupantsEpoch(t *testing.T) {
	e := newSubEnv(t, server.Config{})

	t.Run("removed and configured again in one commit", func(t *testing.T) {
		const path = "/tssub/barrier-reoccupied"
		s := stream(t, e.p, path)
		name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "app", Start: "now",
			Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "nobody-mounted"}})
		job := mustAppend(t, s, ev("job", `{}`)).HeadOffset
		waitUntil(t, "parked", func() bool { return e.describe(t, s, name).Status == itx.StatusParked })
		errc := e.barrier(t, path, name, job)

		removed, err := json.Marshal(itx.RemovedPayload{Name: name, Reason: "requested"})
		require.NoError(t, err)
		res := mustAppend(t, s, ev(itx.TypeSubscriptionRemoved, string(removed)),
			ev(itx.TypeSubscriptionConfigured, `{"name":"app","receiver":{"action":"itx-call","capability":"nobody-mounted","delivery":{"start":"now","onFailingEvent":"halt"}}}`))
		reborn := res.Offsets[1]
		require.Equal(t, reborn, e.describe(t, s, name).ConfirmedOffset, "the newcomer starts after its birth")
		requireCode(t, answer(t, errc), itx.ENotFound)
	})

	t.Run("a changed config keeps the barrier", func(t *testing.T) {
		const path = "/tssub/barrier-reconfigured"
		s := stream(t, e.p, path)
		name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "app", Start: "now",
			Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "nobody-mounted"}})
		job := mustAppend(t, s, ev("job", `{}`)).HeadOffset
		waitUntil(t, "parked", func() bool { return e.describe(t, s, name).Status == itx.StatusParked })
		errc := e.barrier(t, path, name, job)

		h, err := client.MountReceiver(e.ctx, e.p, "tssub-taker", client.ServeReceiver(func(context.Context, itx.DeliveryBatch) (int64, error) { return 0, nil }))
		require.NoError(t, err)
		defer h.Release()
		e.configure(t, s, client.SubscriptionConfig{Name: "app", Start: "now",
			Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "tssub-taker"}})
		require.NoError(t, answer(t, errc))
	})
}

// TS (stream-event-sender: "The audit event lands on this stream and is itself scanned by the
// subscription. Exclude only this subscription's own idempotent event to terminate that
// recursion"): the records the server writes about a subscription's failing event (the
// expression failure, the skip) land on the very stream it reads. A filter condition that
// fails on those records too must not make each record a new failing event, recorded and
// skipped in turn: under "skip" that spends the subscription's consecutive-skip fuse on its
// own evidence and halts it, though the receiver took everything it was given. A subscription
// passes over its own records when its filter fails on them.
func TestTSSub_OwnFailureRecordsAreNotNewFailures(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	const path = "/tssub/own-records"
	s := stream(t, e.p, path)
	h := newHook(t, nil)
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "w", Start: "now", OnFailingEvent: "skip",
		FilterCondition: `$number(payload.message) >= 0`,
		Receiver:        client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	bad := mustAppend(t, s, ev("job", `{"message":"not a number"}`)).HeadOffset
	driveLadder(t, e, path, name, func(d itx.SubscriptionDescription) bool { return d.FailingEventSkips == 1 })
	good := mustAppend(t, s, ev("job", `{"message":"1"}`)).HeadOffset
	d := driveLadder(t, e, path, name, func(d itx.SubscriptionDescription) bool {
		return d.ConfirmedOffset >= good || d.Status == itx.StatusHalted
	})
	require.Equal(t, itx.StatusActive, d.Status, "lastError: %s", d.LastError)
	require.Equal(t, []int64{good}, h.distinct())
	var failed []string
	for _, r := range e.events(t, s, itx.TypeErrorOccurred) {
		var p itx.ErrorOccurredPayload
		require.NoError(t, json.Unmarshal(r.Payload, &p))
		failed = append(failed, p.Message)
	}
	require.Len(t, failed, 2, "one expression failure and one skip, both of offset %d: %q", bad, failed)
}

// TS (copy-appends: "A retry within one send run appends nothing; a recreated source,
// deliberate seek, or same-key replacement may append the same source offset again"): a copy's
// dedupe key carries its seek epoch, and its inbound fence is keyed (source path, name). A copy
// removed and configured again under its name is a new occupant: the receiving stream takes its
// copies (its stamp is newer, not stale) and does not mistake them for the old occupant's
// (start beginning: every source event lands again, each hop naming the new epoch). A changed
// config keeps the cursor: nothing is copied twice.
func TestTSSub_CopyConfiguredAgainUnderItsName(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	const src, dst = "/tssub/copy-src", "/tssub/copy-dst"
	s, target := stream(t, e.p, src), stream(t, e.p, dst)
	mustAppend(t, s, ev("job", `{"n":1}`), ev("job", `{"n":2}`)) // 1, 2
	copyTo := client.SubscriptionConfig{Name: "mirror", FilterTypes: []string{"job"},
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: dst}}
	_, first := e.configure(t, s, copyTo) // 3
	e.waitProcessed(t, s, "mirror", first)

	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	_, err := client.RemoveSubscription(e.ctx, subs, "mirror")
	require.NoError(t, err)
	_, again := e.configure(t, s, copyTo)
	e.waitProcessed(t, s, "mirror", again)

	copyTo.Transform = `{"type": type, "payload": payload, "metadata": {"again": true}}`
	_, changed := e.configure(t, s, copyTo)
	job := mustAppend(t, s, ev("job", `{"n":3}`)).HeadOffset
	e.waitProcessed(t, s, "mirror", job)
	require.Greater(t, job, changed)

	type hop struct{ offset, epoch int64 }
	var got []hop
	for _, c := range e.events(t, target, "job") {
		require.Len(t, c.Provenance, 1)
		h := c.Provenance[0]
		require.Equal(t, src, h.Path)
		got = append(got, hop{h.Offset, h.CursorChangedAtOffset})
	}
	require.Equal(t, []hop{{1, first}, {2, first}, {1, again}, {2, again}, {job, changed}}, got)
}

// TS (stream-event-sender: "An empty range read proves that whole suffix contains no durable
// work, so advance the durable cursor through it instead of reporting permanent phantom lag"):
// ephemeral events at the tail are watermarks like any event a subscription does not receive:
// the cursor passes them, lag is 0 and a barrier at the head resolves, for every push kind.
func TestTSSub_EphemeralTailIsPassed(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	const path = "/tssub/ephemeral-tail"
	s := stream(t, e.p, path)
	h := newHook(t, nil)
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "w", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	job := mustAppend(t, s, ev("job", `{}`)).HeadOffset
	tail := ev("chunk", `{}`)
	tail.Ephemeral = true
	head := mustAppend(t, s, tail, tail).HeadOffset
	require.Equal(t, head, e.waitProcessed(t, s, name, head))
	require.Equal(t, []int64{job}, h.distinct())
	for _, l := range e.list(t, s) {
		require.Zero(t, l.Lag, "%s", l.Name)
	}
}

// The same under "halt": a subscription halted by a failing event and moved past it with
// setSubscriptionCursor reads its own expression-failure record and its halt record next; a
// filter that fails on them passes over them rather than climbing the whole ladder again.
func TestTSSub_OwnHaltRecordIsNotANewFailure(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	const path = "/tssub/own-halt"
	s := stream(t, e.p, path)
	h := newHook(t, nil)
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "w", Start: "now",
		FilterCondition: `$number(payload.message) >= 0`,
		Receiver:        client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	bad := mustAppend(t, s, ev("job", `{"message":"not a number"}`)).HeadOffset
	driveLadder(t, e, path, name, func(d itx.SubscriptionDescription) bool { return d.Status == itx.StatusHalted })
	_, err := client.SetSubscriptionCursor(e.ctx, s, name, bad)
	require.NoError(t, err)
	_, err = client.ResumeSubscription(e.ctx, s, name)
	require.NoError(t, err)
	good := mustAppend(t, s, ev("job", `{"message":"1"}`)).HeadOffset
	d := driveLadder(t, e, path, name, func(d itx.SubscriptionDescription) bool {
		return d.ConfirmedOffset >= good || d.Status == itx.StatusHalted
	})
	require.Equal(t, itx.StatusActive, d.Status, "lastError: %s", d.LastError)
	require.Equal(t, []int64{good}, h.distinct())
}

// TS (waitUntilProcessed's cursor lane): a barrier on a halted subscription neither resolves
// nor fails early; it times out naming the confirmed offset and the status, so the caller
// learns why. A resume before the timeout lets it resolve.
func TestTSSub_BarrierOnAHaltedSubscription(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	const path = "/tssub/barrier-halted"
	s := stream(t, e.p, path)
	var mu sync.Mutex
	up := false
	h := newHook(t, func(int, itx.WebhookBody) int {
		mu.Lock()
		defer mu.Unlock()
		if up {
			return 200
		}
		return 400
	})
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "w", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	job := mustAppend(t, s, ev("job", `{}`)).HeadOffset
	d := driveLadder(t, e, path, name, func(d itx.SubscriptionDescription) bool { return d.Status == itx.StatusHalted })

	errc := e.barrier(t, path, name, job)
	e.clock.Advance(15 * time.Second)
	err := answer(t, errc)
	requireCode(t, err, itx.EDeadlineExceeded)
	require.Contains(t, err.Error(), fmt.Sprintf("confirmed %d < %d", d.ConfirmedOffset, job))
	require.Contains(t, err.Error(), "status: halted")

	errc = e.barrier(t, path, name, job)
	mu.Lock()
	up = true
	mu.Unlock()
	_, err = client.ResumeSubscription(e.ctx, s, name)
	require.NoError(t, err)
	require.NoError(t, answer(t, errc))
}
