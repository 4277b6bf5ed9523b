package test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// stateGate is an in-process ConnectionSink whose first state frame stays in its hands until
// its context ends (honorCtx, as an RPC send's does) or the sink is told closed. It logs what a
// client would receive, in order: a frame when State returns, the notice when Closed is called
// with a live context (one whose context is done sends nothing).
type stateGate struct {
	honorCtx  bool
	entered   chan struct{} // closed at the first State
	told      chan struct{} // closed at Closed
	enterOnce sync.Once
	toldOnce  sync.Once

	mu  sync.Mutex
	log []string
}

func newStateGate(honorCtx bool) *stateGate {
	return &stateGate{honorCtx: honorCtx, entered: make(chan struct{}), told: make(chan struct{})}
}

func (g *stateGate) record(what string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.log = append(g.log, what)
}

func (g *stateGate) received() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.log...)
}

func (g *stateGate) Deliver(ctx context.Context, b *itx.DeliveryBatch) func() error {
	return func() error { return nil }
}

func (g *stateGate) TryDeliver(ctx context.Context, b *itx.DeliveryBatch) (func() error, bool) {
	return g.Deliver(ctx, b), true
}

func (g *stateGate) State(ctx context.Context, f server.LiveFrame) error {
	g.enterOnce.Do(func() { close(g.entered) })
	done := ctx.Done()
	if !g.honorCtx {
		done = nil
	}
	select {
	case <-done:
	case <-g.told:
	}
	g.record("state")
	return nil
}

func (g *stateGate) Closed(ctx context.Context, reason server.CloseReason, message string) {
	if ctx.Err() == nil {
		g.record("closed: " + string(reason))
	}
	g.toldOnce.Do(func() { close(g.told) })
}

// A closed connection receives nothing more: a state frame in its sink's hands when it closes
// goes out before the closed() notice, never after it. (The notice waited for the batch sender
// only: a frame that passed the closed check just before the close went out after the notice.)
// A sink that answers the frame's cancellation hears the notice after it; one whose frame is
// still stuck at the delivery timeout is sent no notice, which would overtake the frame.
func TestConnections_NoStateFrameAfterClosed(t *testing.T) {
	for _, tc := range []struct {
		name     string
		honorCtx bool
		want     []string
	}{
		{"frame ends with its context", true, []string{"state", "closed: " + string(server.CloseByClient)}},
		{"frame stuck past the delivery timeout", false, []string{"state"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := clocktest.New(time.Unix(1_700_000_000, 0))
			ts := startServer(t, server.Config{Clock: clock, Random: func() float64 { return 0.5 }})
			ctx := ctxT(t)
			mustAppend(t, stream(t, ts.project(t), "/conn-state-closed"), ev("a", `{}`))
			g := newStateGate(tc.honorCtx)
			t.Cleanup(func() { g.toldOnce.Do(func() { close(g.told) }) })
			c, err := ts.srv.OpenConnection(ctx, server.StreamRef{ProjectID: "default", Path: "/conn-state-closed"},
				server.ConnectionOptions{After: 1}, g)
			require.NoError(t, err)
			select {
			case <-g.entered:
			case <-ctx.Done():
				t.Fatal("no state frame")
			}
			c.Close(server.CloseByClient, "the test closed it")
			<-c.Done()
			if !tc.honorCtx {
				waitUntil(t, "the notice ends", func() bool {
					clock.Advance(itx.DeliveryTimeout)
					select {
					case <-g.told:
						return true
					default:
						return false
					}
				})
			}
			waitUntil(t, "the frame and the notice", func() bool { return len(g.received()) >= len(tc.want) })
			<-g.told
			require.Equal(t, tc.want, g.received())
		})
	}
}
