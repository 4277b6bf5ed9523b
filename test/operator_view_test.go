package test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/processors/remote"
	"github.com/itx-dev/itx/server"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// logLines returns the JSON log records whose message starts with prefix.
func logLines(logs *syncBuffer, prefix string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(logs.String(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil {
			if msg, _ := rec["message"].(string); strings.HasPrefix(msg, prefix) {
				out = append(out, rec)
			}
		}
	}
	return out
}

// A subscription parked because its receiver's mount went away is a park like one a delivery
// finds: the operator sees it in itx_subscription_parks_total and in the log, not only in the
// gauge of parked subscriptions. (The unmount parked a caught-up subscription at once, but
// neither counted nor logged it, so the gauge rose with no park on record.)
func TestOperatorView_UnmountParkIsCountedAndLogged(t *testing.T) {
	var logs syncBuffer
	ts := startServer(t, server.Config{Log: zerolog.New(&logs)})
	ctx := ctxT(t)
	p := ts.project(t)
	s := stream(t, p, "/calls")
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "call", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}})
	require.NoError(t, err)
	h, err := client.MountReceiver(ctx, p, "inbox", client.ServeReceiver(func(context.Context, itx.DeliveryBatch) (int64, error) { return 0, nil }))
	require.NoError(t, err)
	head := mustAppend(t, s, ev("a", `{}`)).HeadOffset
	sub := client.Subscription(ctx, s, "call")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	parks := func() float64 { return testutil.ToFloat64(ts.srv.Metrics().SubscriptionParks) }
	require.Zero(t, parks(), "delivered to its mount: no park yet")

	h.Release() // unmounts: the caught-up subscription parks with nothing appended
	waitUntil(t, "parked", func() bool { return describeSubIn(ctx, t, s, "call").Status == itx.StatusParked })
	waitUntil(t, "the park counted", func() bool { return parks() == 1 })
	var lines []map[string]any
	waitUntil(t, "the park logged", func() bool {
		lines = logLines(&logs, "subscription parked")
		return len(lines) > 0
	})
	require.Len(t, lines, 1, "one park, one line")
	require.Equal(t, "/calls", lines[0]["path"])
	require.Equal(t, "call", lines[0]["subscription"])
	require.Contains(t, lines[0]["error"], "it was unmounted")
	require.EqualValues(t, head, lines[0]["confirmedOffset"])
}

// A subscription under onFailingEvent: skip halts on the failing event that would be its third
// skip without a success between them: that event is not skipped (the cursor stays before it,
// no dead letter is written for it). Every place the halt is shown says so, in the same words:
// the offset it halted on and the two events skipped before it, as the dead letters and the
// stream's skip records count them. (It said "3 events skipped", so an operator looked for a
// third dead letter that was never written and read the halted event as passed.)
func TestOperatorView_SkipHaltSaysWhatWasSkipped(t *testing.T) {
	var logs syncBuffer
	e := newSubEnv(t, server.Config{Log: zerolog.New(&logs)})
	h := newHook(t, func(int, itx.WebhookBody) int { return 400 })
	s := stream(t, e.p, "/orders")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "mailer", Start: "now", OnFailingEvent: "skip",
		DeadLetterPath: "/orders/dead", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	res := mustAppend(t, s, ev("order", `{"n":1}`), ev("order", `{"n":2}`), ev("order", `{"n":3}`))
	first, third := res.Offsets[0], res.Offsets[2]
	e.refuseUntilSkipped(t, "/orders", name, first)
	e.refuseUntilSkipped(t, "/orders", name, first+1)
	for attempt := 1; attempt < itx.FailingEventConfirmAttempts; attempt++ {
		waitUntil(t, "refused", func() bool { return e.describe(t, s, name).FailingEventAttempt == attempt })
		e.clock.Advance(itx.Backoff(attempt, 0.5))
	}
	waitUntil(t, "halted", func() bool { return e.describe(t, s, name).Status == itx.StatusHalted })

	// The truth: two events skipped (two letters, two skip records), the third halted on.
	require.Len(t, e.deadLetters(t, "/orders/dead"), 2)
	require.Len(t, e.events(t, s, itx.TypeErrorOccurred), 2)
	d := e.describe(t, s, name)
	require.Equal(t, third-1, d.ConfirmedOffset, "the cursor stays before the event it halted on")
	require.Equal(t, third, d.FailingEventOffset)
	require.Equal(t, 2, d.FailingEventSkips)

	want := fmt.Sprintf("offset %d failed 3 times and 2 events were skipped before it without a success between them: webhook responded 400 Bad Request", third)
	require.Equal(t, want, d.LastError, "describe")
	for _, row := range e.list(t, s) {
		if row.Name == name {
			require.Equal(t, want, row.LastError, "subscriptions.list")
		}
	}
	halts := e.events(t, s, itx.TypeSubscriptionHalted)
	require.Len(t, halts, 1)
	var halt struct{ Error string }
	require.NoError(t, json.Unmarshal(halts[0].Payload, &halt))
	require.Equal(t, want, halt.Error, "the halted event")
	view, err := client.WatchStream(e.ctx, s)
	require.NoError(t, err)
	live, err := view.StreamState(e.ctx, func(itx.LiveStreamState) bool { return true })
	require.NoError(t, err)
	require.Equal(t, want, live.Subscriptions[name].LastError, "live state")
	require.NoError(t, view.Cancel(e.ctx))
	lines := logLines(&logs, "subscription halted")
	require.Len(t, lines, 1)
	require.Equal(t, want, lines[0]["error"], "the log")
}

// The live state shows where a retrying subscription stands on the ladder as list() and
// describe() do: its attempt beside its next retry, and neither once a delivery succeeds. (It
// showed nextAttemptAt alone, so a dashboard could not tell a first retry from the fourteenth,
// one step from a halt.)
func TestOperatorView_LiveStateShowsTheAttempt(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	var healthy atomic.Bool
	h := newHook(t, func(int, itx.WebhookBody) int {
		if healthy.Load() {
			return 200
		}
		return 503
	})
	s := stream(t, e.p, "/orders")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "hook", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	head := mustAppend(t, s, ev("order", `{}`)).HeadOffset
	view, err := client.WatchStream(e.ctx, s)
	require.NoError(t, err)
	defer view.Cancel(e.ctx)
	for attempt := 1; attempt <= 3; attempt++ {
		waitUntil(t, "attempt", func() bool { return e.describe(t, s, name).Attempt == attempt })
		d := e.describe(t, s, name)
		live, err := view.StreamState(e.ctx, func(st itx.LiveStreamState) bool { return st.Subscriptions[name].Attempt == attempt })
		require.NoError(t, err, "attempt %d", attempt)
		row := live.Subscriptions[name]
		require.Equal(t, d.NextAttemptAt, row.NextAttemptAt, "attempt %d", attempt)
		require.Equal(t, d.LastError, row.LastError)
		for _, l := range e.list(t, s) {
			if l.Name == name {
				require.Equal(t, attempt, l.Attempt, "list")
			}
		}
		if attempt == 3 {
			healthy.Store(true) // the next retry, attempt 4, succeeds
		}
		e.clock.Advance(itx.Backoff(attempt, 0.5))
	}
	e.waitProcessed(t, s, name, head)
	live, err := view.StreamState(e.ctx, func(st itx.LiveStreamState) bool { return st.Subscriptions[name].Confirmed == head })
	require.NoError(t, err)
	require.Equal(t, itx.LiveSubscriptionRow{Kind: itx.KindWebhookPost, Status: itx.StatusActive, Confirmed: head}, live.Subscriptions[name],
		"caught up: no attempt, retry or error left")
}

// A barrier on a registered reader that times out says what it waited on: the reader's
// checkpoint. (It said `subscription "mirror" confirmed 1 < 3 ... (status: reader)`, naming a
// subscription that does not exist and a status no consumer has.)
func TestOperatorView_ReaderBarrierTimeoutNamesTheReader(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/mirrored")
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))
	fut, release := s.Readers(ctx, nil)
	defer release()
	require.NoError(t, client.RegisterReader(ctx, fut.Readers(), "mirror", 1))
	sub := client.Subscription(ctx, s, "mirror")
	defer sub.Release()
	_, err := client.WaitUntilProcessed(ctx, sub, 3, 100*time.Millisecond)
	requireCode(t, err, itx.EDeadlineExceeded)
	require.Contains(t, itx.ErrorMessage(err), `registered reader "mirror" checkpoint 1 < 3 after 100ms`)
	require.NotContains(t, itx.ErrorMessage(err), "status")
}

// A remote processor host's mount and its end are both in the log with the project, and the
// park of the processor it served follows: an operator reading why a remote processor parked
// finds which host of which project went, and when. (The mount was logged without the project,
// two projects may each run a "worker-1", and the unmount and the park not at all.)
func TestOperatorView_RemoteHostComingAndGoingIsLogged(t *testing.T) {
	var logs syncBuffer
	ts := startServer(t, server.Config{Log: zerolog.New(&logs)})
	ctx := ctxT(t)
	p := ts.project(t)
	s := stream(t, p, "/remote/gone")
	configureRemote(t, s, "guestbook")
	stop := mountedRemoteHost(t, remote.Config{Addr: ts.addr, Token: ts.creds.ProjectToken, Name: "worker-1", Host: referenceHost(t, "guestbook")})
	head := mustAppend(t, s, examples.GuestbookSigned.Input(examples.Signed{Name: "ada", Message: "hi"}, "")).HeadOffset
	sub, _ := processorOf(t, s, "guestbook")
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	before := len(logLines(&logs, "subscription parked")) // configured before the host came: parked then
	up := logLines(&logs, "processor host mounted")
	require.Len(t, up, 1)
	require.Equal(t, "worker-1", up[0]["host"])
	require.Equal(t, ts.creds.ProjectID, up[0]["project"])

	stop() // the host's connection ends
	var down, parked []map[string]any
	waitUntil(t, "the unmount and the park logged", func() bool {
		down, parked = logLines(&logs, "processor host unmounted"), logLines(&logs, "subscription parked")[before:]
		return len(down) > 0 && len(parked) > 0
	})
	require.Len(t, down, 1)
	require.Equal(t, "worker-1", down[0]["host"])
	require.Equal(t, ts.creds.ProjectID, down[0]["project"])
	require.Contains(t, down[0]["contracts"], "guestbook")
	require.Len(t, parked, 1)
	require.Equal(t, "guestbook", parked[0]["subscription"])
	require.Equal(t, "/remote/gone", parked[0]["path"])
	require.Contains(t, parked[0]["error"], `no processor host announcing "guestbook" is mounted (it was unmounted)`)
	require.EqualValues(t, head, parked[0]["confirmedOffset"])
	require.Equal(t, itx.StatusParked, describeSubIn(ctx, t, s, "guestbook").Status)
}

// A barrier that times out on a subscription that is not delivering says why, in the words
// describe has for it: status, the ladder's rung and the last error (it gave the status alone,
// so the caller needed a second call to learn what stops it).
func TestOperatorView_BarrierTimeoutSaysWhyTheSubscriptionWaits(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/waiting")
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "call", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "nobody-home"}})
	require.NoError(t, err)
	head := mustAppend(t, s, ev("a", `{}`)).HeadOffset
	waitUntil(t, "parked", func() bool { return describeSubIn(ctx, t, s, "call").Status == itx.StatusParked })
	d := describeSubIn(ctx, t, s, "call")
	require.NotEmpty(t, d.LastError)

	sub := client.Subscription(ctx, s, "call")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, head, 100*time.Millisecond)
	requireCode(t, err, itx.EDeadlineExceeded)
	msg := itx.ErrorMessage(err)
	require.Contains(t, msg, "status: parked")
	require.Contains(t, msg, "last error: "+d.LastError)
}
