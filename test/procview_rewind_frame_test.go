package test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

type heldCount struct{ N int }

// The operator's rewind is taken even when a frame begun before the cursor-set holds the runner
// and the snapshot that asked for the rewind gives up waiting for it: that frame's commit (it
// lands after the cursor-set) must not pass for the rewind's, or the committed record would say
// the rewind is honored and no wake would ever take it. The frame is held in ProcessEvent, so
// the snapshot's rewind waits behind it until its caller leaves; the frame goes on after.
func TestProcessorView_RewindTakenDespiteAFrameBegunBeforeTheCursorSet(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	h := processors.NewHost("test")
	require.NoError(t, processors.Add(h, func() processors.Contract[heldCount] {
		return processors.Contract[heldCount]{
			Name: "counter", ConsumedTypes: []string{"n", "hold"}, ReducerVersion: "1",
			InitialState: func() heldCount { return heldCount{} },
			Reduce:       func(s heldCount, e itx.Event) heldCount { return heldCount{N: s.N + 1} },
			ProcessEvent: func(ctx context.Context, a *processors.Args[heldCount]) error {
				if a.Event != nil && a.Event.Type == "hold" {
					once.Do(func() { close(entered); <-release })
				}
				return nil
			},
		}
	}))
	ts := startServer(t, server.Config{Processors: h})
	ctx := ctxT(t)
	const path = "/procview/rewind-behind-frame"
	ref := server.StreamRef{ProjectID: "default", Path: path}
	s := stream(t, ts.project(t), path)
	configureProcessor(t, s, "counter")
	head := mustAppend(t, s, ev("n", `{}`), ev("n", `{}`), ev("n", `{}`)).HeadOffset
	sub, proc := processorOf(t, s, "counter")
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)

	mustAppend(t, s, ev("hold", `{}`))
	<-entered // a frame begun before the cursor-set holds the runner
	_, err = client.SetSubscriptionCursor(ctx, s, "counter", 2)
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, _, _, err = ts.srv.ProcessorSnapshot(short, ref, "counter")
	cancel()
	t.Logf("snapshot whose caller left: %v", err)
	close(release)

	last := mustAppend(t, s, ev("n", `{}`)).HeadOffset
	_, err = client.WaitUntilProcessed(ctx, sub, last, 0)
	require.NoError(t, err)
	r := runtimeOf(t, proc)
	t.Logf("after the wake: cursorRevision=%d processed=%d", r.CursorRevision, r.ProcessedThrough)
	require.Equal(t, int64(1), r.CursorRevision, "the operator's rewind was never taken")
}
