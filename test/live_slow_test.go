package test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// orderedSink records every callback (deliver, state, closed) in the order it arrived.
type orderedSink struct {
	mu         sync.Mutex
	log        []string
	events     []int64
	closed     *schema.CloseReason
	blockState chan struct{} // when set, state() blocks until closed
	stateCalls int
}

func (k *orderedSink) Deliver(ctx context.Context, call schema.EventSink_deliver) error {
	b, _ := call.Args().Batch()
	list, _ := b.Events()
	k.mu.Lock()
	defer k.mu.Unlock()
	var offs []int64
	for i := 0; i < list.Len(); i++ {
		offs = append(offs, int64(list.At(i).Offset()))
	}
	k.events = append(k.events, offs...)
	k.log = append(k.log, fmt.Sprintf("deliver %v", offs))
	return nil
}

func (k *orderedSink) Closed(ctx context.Context, call schema.EventSink_closed) error {
	why := call.Args().Why()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.closed = &why
	k.log = append(k.log, "closed "+why.String())
	return nil
}

func (k *orderedSink) State(ctx context.Context, call schema.EventSink_state) error {
	k.mu.Lock()
	b := k.blockState
	k.stateCalls++
	k.mu.Unlock()
	if b != nil {
		<-b
	}
	j, _ := call.Args().Json()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.log = append(k.log, fmt.Sprintf("state@%d snapshot=%v %s", call.Args().Revision(), call.Args().Snapshot(), j))
	return nil
}

func (k *orderedSink) snapshot() (log []string, closed *schema.CloseReason) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.log...), k.closed
}

// slowLive is a LiveSubscriber whose first frame is answered late (after the delivery timeout).
type slowLive struct {
	liveView
	mu2    sync.Mutex
	hold   chan struct{}
	calls  int
	frames []uint64
}

func (l *slowLive) wait() {
	l.mu2.Lock()
	l.calls++
	h := l.hold
	l.mu2.Unlock()
	if h != nil {
		<-h
	}
}

func (l *slowLive) Snapshot(ctx context.Context, call schema.LiveSubscriber_snapshot) error {
	l.wait()
	l.mu2.Lock()
	l.frames = append(l.frames, call.Args().Revision())
	l.mu2.Unlock()
	return l.liveView.Snapshot(ctx, call)
}

func (l *slowLive) Closed(context.Context, schema.LiveSubscriber_closed) error { return nil }

func (l *slowLive) Patch(ctx context.Context, call schema.LiveSubscriber_patch) error {
	l.wait()
	l.mu2.Lock()
	l.frames = append(l.frames, call.Args().Revision())
	l.mu2.Unlock()
	return l.liveView.Patch(ctx, call)
}

// A LiveSubscriber that answers a frame only after the delivery timeout is not dropped: it is
// waited for (one frame in flight), then gets what changed meanwhile, coalesced.
func TestLiveState_SlowSubscriberGetsCoalescedFrames(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/slow-live")
	mustAppend(t, s, ev("a", `{}`))
	l := &slowLive{hold: make(chan struct{})}
	fut, release := s.LiveState(context.Background(), func(p schema.Stream_liveState_Params) error {
		return p.SetSubscriber(schema.LiveSubscriber_ServerToClient(l))
	})
	res, err := fut.Struct()
	require.NoError(t, err)
	h := res.Handle().AddRef()
	release()
	defer h.Release()
	waitUntil(t, "the snapshot awaits its answer", func() bool {
		l.mu2.Lock()
		defer l.mu2.Unlock()
		return l.calls > 0
	})
	e.clock.Advance(itx.DeliveryTimeout + time.Second)
	l.mu2.Lock()
	close(l.hold)
	l.hold = nil
	l.mu2.Unlock()
	for i := 0; i < 3; i++ {
		mustAppend(t, s, ev("b", `{}`))
	}
	waitUntil(t, "the subscriber hears of head 4", func() bool {
		_, doc := l.state()
		return doc != nil && doc["head"] == float64(4)
	})
	l.mu2.Lock()
	defer l.mu2.Unlock()
	require.Less(t, len(l.frames), 5, "frames are coalesced: fewer than one per change (%v)", l.frames)
}

// A connection whose sink does not accept a live-state frame within the delivery timeout is
// closed as a slow consumer, as for a batch: its state never silently stops.
func TestConnection_SlowStateFrameClosesAsSlowConsumer(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/slow-state")
	mustAppend(t, s, ev("a", `{}`))
	sink := &orderedSink{blockState: make(chan struct{})}
	var unblock sync.Once
	release := func() { unblock.Do(func() { close(sink.blockState) }) }
	t.Cleanup(release) // a failure must not leave the State call held, and closing the client waiting for it
	c, err := openConn(t, s, connOpts{key: "tab"}, sink)
	require.NoError(t, err)
	waitUntil(t, "a state frame awaits its answer", func() bool {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		return sink.stateCalls > 0
	})
	e.clock.Advance(itx.DeliveryTimeout + time.Second)
	// The sink's calls are answered in order, so its closed() waits behind the stuck frame:
	// the server's side is seen first (ping refuses), then the frame is let go.
	waitUntil(t, "the server closed the connection", func() bool { _, _, err := ping(t, c); return err != nil })
	release()
	waitUntil(t, "closed", func() bool { _, why := sink.snapshot(); return why != nil })
	_, why := sink.snapshot()
	require.Equal(t, schema.CloseReason_slowConsumer, *why)
}
