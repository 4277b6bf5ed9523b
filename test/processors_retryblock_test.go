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
