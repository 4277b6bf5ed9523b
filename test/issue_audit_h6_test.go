package test

import (
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
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
