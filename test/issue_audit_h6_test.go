package test

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Requirements of resolved issues that had no test over RPC able to fail (docs/issue-audit-h6.md).

// Issue 3: a filter's JSONata condition must evaluate to exactly true; a truthy value (1, a
// string, an object) or an undefined result does not match, and the cursor passes those events
// as a watermark, with no error recorded.
func TestIssue3_FilterConditionMustBeExactlyTrue(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := newHook(t, nil)
	s := stream(t, e.p, "/exactly-true")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "strict", Start: "now", FilterCondition: `payload.v`,
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	res := mustAppend(t, s,
		ev("m", `{"v":true}`),    // 2
		ev("m", `{"v":1}`),       // 3
		ev("m", `{"v":"true"}`),  // 4
		ev("m", `{"v":{"a":1}}`), // 5
		ev("m", `{"v":false}`),   // 6
		ev("m", `{}`),            // 7
		ev("m", `{"v":true}`),    // 8
	)
	e.waitProcessed(t, s, name, res.HeadOffset)
	require.Equal(t, []int64{2, 8}, h.distinct(), "only the events whose condition is exactly true")
	d := e.describe(t, s, name)
	require.Equal(t, "active", d.Status)
	require.Empty(t, d.LastError)
	require.Empty(t, e.events(t, s, itx.TypeErrorOccurred))
}

// Issue 7 (j): subscription control is never refused by a tripped circuit breaker. Configure,
// cursor-set and remove are checked by TestCore_ControlEventsPassTheBreaker; this is the resume
// of a halted subscription.
func TestIssue7_ResumePassesTheBreaker(t *testing.T) {
	e := newSubEnv(t, server.Config{BreakerBurst: 3, BreakerRefillPerMinute: 1})
	s := stream(t, e.p, "/runaway-halted")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "no-such-contract", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}})
	waitUntil(t, "halted", func() bool { return e.describe(t, s, name).Status == "halted" })
	for {
		_, err := client.Append(e.ctx, s, []itx.EventInput{ev("a", `{}`)}, itx.AppendOptions{})
		if err != nil {
			requireCode(t, err, itx.ERateLimited)
			break
		}
	}
	before := mustDescribe(t, s).HeadOffset
	off, err := client.ResumeSubscription(e.ctx, s, name)
	require.NoError(t, err, "a resume passes the open breaker")
	require.Greater(t, off, before)
	resumed := e.events(t, s, itx.TypeSubscriptionResumed)
	require.Len(t, resumed, 1)
	require.Equal(t, off, resumed[0].Offset)
}

// Issue 7 (g): a push to a Receiver whose connection stopped reading (TCP open, a relay frozen
// once the first event got through) times out like one never answered: after the delivery
// timeout the try is a failure with backoff and lastError, not a stall with no error. (The
// events are large, but a push is at most 1 MiB, which loopback's socket buffers may still take:
// the push may be written and unread rather than blocked writing; either way it must time out.)
func TestIssue7_UnwritablePushTimesOut(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	px := newProxy(t, e.ts.addr)
	conn, err := client.DialWith(e.ctx, px.addr(), client.Options{PingEvery: -1})
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	p := conn.Login(e.ctx, e.ts.creds.ProjectToken)
	defer p.Release()
	r := &scriptedReceiver{answer: func([]int64, []itx.Event) (uint64, error) { return 0, nil }}
	handle, err := client.MountReceiver(e.ctx, p, "walled", client.ServeReceiver(r.receive))
	require.NoError(t, err)
	defer handle.Release()

	s := stream(t, e.p, "/unwritable")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "app", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "walled"}})
	first := mustAppend(t, s, ev("m", `{}`))
	e.waitProcessed(t, s, name, first.HeadOffset)

	px.freeze()
	big := `{"f":"` + strings.Repeat("x", itx.MaxEventBytes/2) + `"}`
	var batch []itx.EventInput
	for i := 0; i < 16; i++ { // 8 MiB: more than a batch, more than loopback's buffers take at once
		batch = append(batch, ev("big", big))
	}
	mustAppend(t, s, batch[:8]...)
	mustAppend(t, s, batch[8:]...)
	// The push is out (blocked writing, or written and unanswered) once its in-flight block is
	// committed; its timer is armed as it starts, so the clock is moved on until the try fails.
	waitUntil(t, "the push in flight", func() bool { return e.describe(t, s, name).InFlightDeadlineAt != 0 })
	require.Zero(t, e.describe(t, s, name).Attempt)
	failed := func() bool { return e.describe(t, s, name).Attempt >= 1 }
	for i := 0; !failed(); i++ {
		require.Less(t, i, 10, "the push to a frozen connection never timed out")
		e.clock.Advance(itx.DeliveryTimeout)
		deadline := time.Now().Add(time.Second)
		for !failed() && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // polling a condition, not standing in for one
		}
	}
	d := e.describe(t, s, name)
	require.Equal(t, first.HeadOffset, d.ConfirmedOffset)
	require.Regexp(t, "timed out|still blocked", d.LastError)
	require.Equal(t, "active", d.Status)
	require.NotZero(t, d.NextAttemptAt, "a backoff, not a stall")
}

// Issue 8 (3): unsigned fields are reported as unsigned: an offset above 2^63-1 sent over the
// wire is refused invalidArgument quoting the number sent, never a negative one, and nothing is
// written.
func TestIssue8_UnsignedOffsetsReportedAsSent(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/unsigned-wire")
	h := newHook(t, nil)
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "u", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	head := mustDescribe(t, s).HeadOffset
	const sent = uint64(math.MaxUint64)
	check := func(what string, err error) {
		t.Helper()
		requireCode(t, err, itx.EInvalid)
		msg := itx.ErrorMessage(err)
		require.Contains(t, msg, "18446744073709551615", what)
		require.NotContains(t, msg, "-1", what)
	}

	cf, rel := s.SetSubscriptionCursor(e.ctx, func(p schema.Stream_setSubscriptionCursor_Params) error {
		p.SetAfterOffset(sent)
		return p.SetName(name)
	})
	_, err := cf.Struct()
	rel()
	check("setSubscriptionCursor afterOffset", err)

	pf, rel := s.GetEventPage(e.ctx, func(p schema.Stream_getEventPage_Params) error {
		q, err := p.NewQuery()
		if err != nil {
			return err
		}
		q.SetAfter(sent)
		return nil
	})
	_, err = pf.Struct()
	rel()
	check("getEventPage after", err)

	wf, rel := s.WaitForEvent(e.ctx, func(p schema.Stream_waitForEvent_Params) error {
		p.SetAfter(sent)
		p.SetTimeoutMs(1)
		_, err := p.NewPredicate()
		return err
	})
	_, err = wf.Struct()
	rel()
	check("waitForEvent after", err)

	sub := client.Subscription(e.ctx, s, name)
	defer sub.Release()
	bf, rel := sub.WaitUntilProcessed(e.ctx, func(p schema.Subscription_waitUntilProcessed_Params) error {
		p.SetOffset(sent)
		p.SetTimeoutMs(1)
		return nil
	})
	_, err = bf.Struct()
	rel()
	check("waitUntilProcessed offset", err)

	require.Equal(t, head, mustDescribe(t, s).HeadOffset, "nothing written")
	require.Equal(t, head, e.describe(t, s, name).ConfirmedOffset, "the cursor did not move")
}

// Issue 7: "a webhook that is down backs off along the ladder and halts at 15, never skips",
// under onFailingEvent skip too: 15 tries of the same event, then the halt, no skip record.
// (TestCore_OutageNeverSkips stops at attempt 7; TestSubscription_LadderHaltsThenResumes runs
// the ladder to 15 under the default policy, halt.)
func TestIssue7_DownWebhookUnderSkipHaltsAt15(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := newHook(t, func(int, itx.WebhookBody) int { return 503 })
	s := stream(t, e.p, "/down-to-15")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "lenient", Start: "now", OnFailingEvent: "skip",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	res := mustAppend(t, s, ev("m", `{}`), ev("m", `{}`))
	for attempt := 1; attempt < itx.MaxDeliveryAttempts; attempt++ {
		waitUntil(t, fmt.Sprintf("attempt %d", attempt), func() bool { return e.describe(t, s, name).Attempt == attempt })
		e.clock.Advance(itx.Backoff(attempt, 0.5))
	}
	waitUntil(t, "halted", func() bool { return e.describe(t, s, name).Status == "halted" })
	d := e.describe(t, s, name)
	require.Equal(t, itx.MaxDeliveryAttempts, d.Attempt)
	require.Equal(t, res.HeadOffset-2, d.ConfirmedOffset, "nothing skipped")
	require.Zero(t, d.FailingEventSkips)
	require.Equal(t, []int64{res.HeadOffset - 1}, h.distinct(), "only the first event was tried")
	require.Equal(t, itx.MaxDeliveryAttempts, h.count())
	require.Empty(t, e.events(t, s, itx.TypeErrorOccurred))
	require.Len(t, e.events(t, s, itx.TypeSubscriptionHalted), 1)
}
