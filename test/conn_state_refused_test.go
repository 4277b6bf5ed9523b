package test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// stateRefusingSink refuses the first live-state frame it is sent.
type stateRefusingSink struct {
	*testSink
	states atomic.Int32
}

func (k *stateRefusingSink) State(ctx context.Context, call schema.EventSink_state) error {
	if k.states.Add(1) == 1 {
		return errors.New("this client cannot take state frames")
	}
	return k.testSink.State(ctx, call)
}

// A sink that refuses a live-state frame closes its connection as deliveryFailed, as a refused
// batch does, and is told so. It stayed open, delivering events with no state frame ever again
// and no word to its client, which went on showing a stream state that no longer moved.
func TestConnection_RefusedStateFrameClosesIt(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/state-refused")
	mustAppend(t, s, ev("a", `{}`))
	k := &stateRefusingSink{testSink: newTestSink()}
	_, err := openConn(t, s, connOpts{}, k)
	require.NoError(t, err)
	deadline := time.After(20 * time.Second)
	for k.closeReason() == nil {
		select {
		case <-k.changed:
		case <-deadline:
			t.Fatalf("the connection stayed open after its sink refused a state frame (frames %d, events %v)", k.states.Load(), k.offsets())
		}
	}
	require.Equal(t, schema.CloseReason_deliveryFailed, *k.closeReason())
	k.mu.Lock()
	msg := k.closeMs
	k.mu.Unlock()
	require.Contains(t, msg, "live-state frame")
	require.Contains(t, msg, "this client cannot take state frames")
	require.EqualValues(t, 1, k.states.Load(), "no frame after the refused one")

	// A connection without state frames is not concerned.
	k2 := &stateRefusingSink{testSink: newTestSink()}
	c2, err := openConn(t, s, connOpts{key: "quiet", noState: true}, k2)
	require.NoError(t, err)
	mustAppend(t, s, ev("b", `{}`))
	for len(k2.offsets()) < 2 {
		select {
		case <-k2.changed:
		case <-time.After(20 * time.Second):
			t.Fatal("the noState connection got no events")
		}
	}
	ping, release := c2.Ping(context.Background(), nil)
	defer release()
	_, err = ping.Struct()
	require.NoError(t, err, "the noState connection is open")
	require.Nil(t, k2.closeReason())
}

// patchRefusingView is a LiveSubscriber that takes snapshots and refuses every patch.
type patchRefusingView struct {
	snapshots chan uint64
	closed    chan string // why and the message, once
}

func (v *patchRefusingView) Snapshot(ctx context.Context, call schema.LiveSubscriber_snapshot) error {
	v.snapshots <- call.Args().Revision()
	return nil
}

func (v *patchRefusingView) Patch(ctx context.Context, call schema.LiveSubscriber_patch) error {
	return errors.New("this view cannot apply patches")
}

func (v *patchRefusingView) Closed(ctx context.Context, call schema.LiveSubscriber_closed) error {
	r, _ := call.Args().Reason()
	msg, _ := r.Message_()
	v.closed <- call.Args().Why().String() + " " + msg
	return nil
}

// A live view whose subscriber refuses a frame ends, and the subscriber hears why
// (deliveryFailed), as it does when the server ends the view for another reason: it ended
// without a word, and a client kept showing a state that no longer moved.
func TestLiveState_RefusedFrameEndsTheViewWithWhy(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/patch-refused")
	mustAppend(t, s, ev("a", `{}`))
	v := &patchRefusingView{snapshots: make(chan uint64, 16), closed: make(chan string, 4)}
	fut, release := s.LiveState(ctxT(t), func(p schema.Stream_liveState_Params) error {
		return p.SetSubscriber(schema.LiveSubscriber_ServerToClient(v))
	})
	defer release()
	res, err := fut.Struct()
	require.NoError(t, err)
	h := res.Handle().AddRef()
	defer h.Release()
	select {
	case <-v.snapshots:
	case <-time.After(20 * time.Second):
		t.Fatal("no first snapshot")
	}
	mustAppend(t, s, ev("a", `{}`))
	select {
	case why := <-v.closed:
		require.Contains(t, why, "deliveryFailed")
		require.Contains(t, why, "this view cannot apply patches")
	case <-time.After(20 * time.Second):
		t.Fatal("the view whose subscriber refused a patch was not told it ended")
	}
}
