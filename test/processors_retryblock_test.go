package test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// An in-process processor whose frame failed and then succeeded: the progress clears the
// subscription's retry block (attempt, nextAttemptAt, lastError), as a push subscription's is
// cleared by the progress that follows a failure. Left standing, describe went on reporting the
// cured failure, and the next failure counted on from the stale attempt (a processor that had
// recovered after 14 failures halted at its next one).
func TestProcessors_RecoveryClearsTheRetryBlock(t *testing.T) {
	var fails atomic.Int32
	fails.Store(1)
	h := processors.NewHost("v1")
	require.NoError(t, processors.Add(h, func() processors.Contract[int] {
		return processors.Contract[int]{
			Name: "flaky", ConsumedTypes: []string{"x"}, ReducerVersion: "1",
			InitialState: func() int { return 0 },
			Reduce:       func(n int, e itx.Event) int { return n + 1 },
			ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
				if a.Event != nil && fails.Add(-1) >= 0 {
					return errors.New("transient")
				}
				return nil
			},
		}
	}))
	ts := startServer(t, server.Config{Processors: h})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/flaky")
	configureProcessor(t, s, "flaky")
	head := mustAppend(t, s, itx.EventInput{Type: "x"}).HeadOffset
	sub, _ := processorOf(t, s, "flaky")
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		d, err := client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		t.Logf("confirmed %d attempt %d lastError %q next %v", d.ConfirmedOffset, d.Attempt, d.LastError, d.NextAttemptAt)
		return d.Attempt == 0 && d.LastError == ""
	}, 5*time.Second, 500*time.Millisecond)
}

// A processor whose hook fails on an event (ProcessEvent's error, a blocker's, a panic in
// Reduce) names it: describe's failingEventOffset is that event's offset and failingEventAttempt
// counts the tries on it, as a push subscription's do. It said 0 (the failure was an outage with
// no event), so an operator could not tell which event to look at, or whether to set the cursor
// past it.
func TestProcessors_FailingEventOffsetNamesTheEvent(t *testing.T) {
	for _, how := range []string{"error", "blocker", "reduce panic"} {
		t.Run(how, func(t *testing.T) {
			h := processors.NewHost("v1")
			require.NoError(t, processors.Add(h, func() processors.Contract[int] {
				return processors.Contract[int]{
					Name: "picky", ConsumedTypes: []string{"x", "bad"}, ReducerVersion: "1",
					InitialState: func() int { return 0 },
					Reduce: func(n int, e itx.Event) int {
						if how == "reduce panic" && e.Type == "bad" {
							panic("cannot fold it")
						}
						return n + 1
					},
					ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
						if a.Event == nil || a.Event.Type != "bad" {
							return nil
						}
						if how == "blocker" {
							a.BlockProcessorWhile("refuse", func(ctx context.Context) error { return errors.New("the blocker refuses it") })
							return nil
						}
						return errors.New("refuses it")
					},
				}
			}))
			ts := startServer(t, server.Config{Processors: h})
			ctx := ctxT(t)
			s := stream(t, ts.project(t), "/picky")
			configureProcessor(t, s, "picky")
			mustAppend(t, s, itx.EventInput{Type: "x"}, itx.EventInput{Type: "x"})
			bad := mustAppend(t, s, itx.EventInput{Type: "bad"}).HeadOffset
			mustAppend(t, s, itx.EventInput{Type: "x"})
			sub, _ := processorOf(t, s, "picky")
			var d itx.SubscriptionDescription
			waitUntil(t, "a second try on the failing event", func() bool {
				var err error
				d, err = client.DescribeSubscription(ctx, sub)
				require.NoError(t, err)
				return d.FailingEventAttempt >= 2
			})
			require.Equal(t, bad, d.FailingEventOffset, "lastError %q", d.LastError)
			require.Less(t, d.ConfirmedOffset, bad, "never skipped")
			require.NotEmpty(t, d.LastError)
		})
	}
}

// The same for a processor placed remote: the host reports the event its hook failed on with
// the wake's failure, and describe names it (an exception could carry only text).
func TestProcessors_FailingEventOffsetNamesTheEventRemote(t *testing.T) {
	h := processors.NewHost("v1")
	require.NoError(t, processors.Add(h, func() processors.Contract[int] {
		return processors.Contract[int]{
			Name: "picky", ConsumedTypes: []string{"x", "bad"}, ReducerVersion: "1",
			InitialState: func() int { return 0 },
			Reduce:       func(n int, e itx.Event) int { return n + 1 },
			ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
				if a.Event != nil && a.Event.Type == "bad" {
					return errors.New("refuses it")
				}
				return nil
			},
		}
	}))
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	s := stream(t, p, "/picky-remote")
	configureRemote(t, s, "picky")
	mustAppend(t, s, itx.EventInput{Type: "x"}, itx.EventInput{Type: "x"})
	bad := mustAppend(t, s, itx.EventInput{Type: "bad"}).HeadOffset
	mustAppend(t, s, itx.EventInput{Type: "x"})
	awaitMount(t, runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "host", h))
	sub := client.Subscription(ctx, s, "picky")
	defer sub.Release()
	var d itx.SubscriptionDescription
	waitUntil(t, "a second try on the failing event", func() bool {
		var err error
		d, err = client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		return d.FailingEventAttempt >= 2
	})
	require.Equal(t, bad, d.FailingEventOffset, "lastError %q", d.LastError)
	require.Less(t, d.ConfirmedOffset, bad, "never skipped")
	require.Contains(t, d.LastError, "refuses it")
}
