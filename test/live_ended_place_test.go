package test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// releasedView is a liveView that learns when the server let go of it.
type releasedView struct {
	*liveView
	once     sync.Once
	released chan struct{}
}

func (v *releasedView) Shutdown() { v.once.Do(func() { close(v.released) }) }

// A live view the server ended (its stream deleted) gives back its place under the login's bound
// (--max-live-per-login) and the subscriber's reference at once, while the client still holds
// its handle: both were held until the client released the handle, so a client that kept the
// handles of views that had ended was refused new views and connections with none open.
func TestLiveState_EndedViewGivesBackItsPlace(t *testing.T) {
	ts := startServer(t, server.Config{MaxLivePerSession: 2})
	p := ts.project(t)
	a, b := stream(t, p, "/ended-place-a"), stream(t, p, "/ended-place-b")
	mustAppend(t, a, ev("e", `{}`))
	mustAppend(t, b, ev("e", `{}`))
	v := &releasedView{liveView: &liveView{}, released: make(chan struct{})}
	fut, release := a.LiveState(ctxT(t), func(p schema.Stream_liveState_Params) error {
		return p.SetSubscriber(schema.LiveSubscriber_ServerToClient(v))
	})
	res, err := fut.Struct()
	require.NoError(t, err)
	h := res.Handle().AddRef() // kept: the client does not cancel
	release()
	defer h.Release()
	subscribeLive(t, b, &liveView{}) // the login's second place

	_, err = client.DeleteStream(ctxT(t), p, "/ended-place-a", true)
	require.NoError(t, err)
	select {
	case <-v.released:
	case <-time.After(20 * time.Second):
		t.Fatal("the server kept the subscriber of a view it ended")
	}
	why, ended := v.endedWith()
	require.True(t, ended)
	require.Equal(t, schema.CloseReason_streamRemoved, why, "told why before it was let go")

	_, err = openConn(t, b, connOpts{noState: true}, newTestSink())
	require.NoError(t, err, "the ended view's place is free")
	_, err = openConn(t, b, connOpts{noState: true}, newTestSink())
	requireCode(t, err, itx.ELimitExceeded) // the bound itself still holds

	// Cancelling the ended view's handle later changes nothing.
	cf, rel := h.Cancel(context.Background(), nil)
	_, err = cf.Struct()
	rel()
	require.NoError(t, err)
	_, err = openConn(t, b, connOpts{noState: true}, newTestSink())
	requireCode(t, err, itx.ELimitExceeded)
}
