package client

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/stretchr/testify/require"
)

// registrations plays the server's side of liveState for a LiveView: it keeps each subscriber
// it is given and hands back a Handle that records its cancel and its release. (The view's
// normal path runs against a real itxd in test/client_live_test.go; a server never skips a
// revision, so the view's answer to a missed frame is driven from here.)
type registrations struct {
	mu     sync.Mutex
	subs   []schema.LiveSubscriber
	ended  []bool // per registration: its handle was cancelled or released
	signal chan struct{}
}

type fakeHandle struct {
	r *registrations
	i int
}

func (h *fakeHandle) Cancel(context.Context, schema.Handle_cancel) error { h.end(); return nil }
func (h *fakeHandle) Shutdown()                                          { h.end() }
func (h *fakeHandle) end() {
	h.r.mu.Lock()
	h.r.ended[h.i] = true
	h.r.mu.Unlock()
}

func (r *registrations) register(_ context.Context, sub schema.LiveSubscriber) (schema.Handle, error) {
	r.mu.Lock()
	r.subs = append(r.subs, sub)
	r.ended = append(r.ended, false)
	h := schema.Handle_ServerToClient(&fakeHandle{r, len(r.subs) - 1})
	r.mu.Unlock()
	r.signal <- struct{}{}
	return h, nil
}

// sub waits for registration i and returns its subscriber.
func (r *registrations) sub(t *testing.T, i int) schema.LiveSubscriber {
	t.Helper()
	for {
		r.mu.Lock()
		n := len(r.subs)
		r.mu.Unlock()
		if n > i {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.subs[i]
		}
		select {
		case <-r.signal:
		case <-time.After(10 * time.Second):
			t.Fatalf("no registration %d", i)
		}
	}
}

func (r *registrations) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.subs)
}

func (r *registrations) endedAt(i int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ended[i]
}

func snapshot(t *testing.T, s schema.LiveSubscriber, rev uint64, state string) {
	t.Helper()
	fut, release := s.Snapshot(context.Background(), func(p schema.LiveSubscriber_snapshot_Params) error {
		p.SetRevision(rev)
		return p.SetState(state)
	})
	defer release()
	_, err := fut.Struct()
	require.NoError(t, err)
}

func patch(t *testing.T, s schema.LiveSubscriber, rev uint64, ops string) {
	t.Helper()
	fut, release := s.Patch(context.Background(), func(p schema.LiveSubscriber_patch_Params) error {
		p.SetRevision(rev)
		return p.SetOps(ops)
	})
	defer release()
	_, err := fut.Struct()
	require.NoError(t, err)
}

func requireState(t *testing.T, v *LiveView, rev uint64, doc string) {
	t.Helper()
	cur := v.Current()
	require.Equal(t, rev, cur.Revision)
	require.JSONEq(t, doc, string(cur.State))
}

// A LiveView applies a snapshot and the patches after it; a patch that skips a revision, or
// does not apply, makes it register again (the old registration released, its late frames
// ignored) and start over from the new registration's snapshot. The server ending the view
// ends it with the reason.
func TestLiveView_ResubscribesOnAGap(t *testing.T) {
	r := &registrations{signal: make(chan struct{}, 16)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type watched struct {
		v   *LiveView
		err error
	}
	got := make(chan watched, 1)
	go func() {
		v, err := watch(ctx, r.register)
		got <- watched{v, err}
	}()
	first := r.sub(t, 0)
	snapshot(t, first, 5, `{"a": 1, "b": [1]}`)
	w := <-got
	require.NoError(t, w.err)
	v := w.v
	requireState(t, v, 5, `{"a": 1, "b": [1]}`)
	patch(t, first, 6, `[{"op": "replace", "path": "/a", "value": 2}, {"op": "add", "path": "/b/-", "value": 2}]`)
	requireState(t, v, 6, `{"a": 2, "b": [1, 2]}`)

	// Revision 7 missed: register again.
	patch(t, first, 8, `[{"op": "replace", "path": "/a", "value": 9}]`)
	second := r.sub(t, 1)
	require.Eventually(t, func() bool { return r.endedAt(0) }, 10*time.Second, time.Millisecond, "the old registration released")
	patch(t, first, 7, `[{"op": "replace", "path": "/a", "value": 7}]`) // late, from the old one
	requireState(t, v, 6, `{"a": 2, "b": [1, 2]}`)
	snapshot(t, second, 9, `{"a": 3}`)
	requireState(t, v, 9, `{"a": 3}`)
	require.Equal(t, 1, v.Resubscribes())

	// A patch that does not apply to the document is a missed frame too.
	patch(t, second, 10, `[{"op": "remove", "path": "/nothing"}]`)
	third := r.sub(t, 2)
	snapshot(t, third, 12, `{"a": 4}`)
	st, err := v.Wait(ctx, func(state json.RawMessage) bool { return string(state) == `{"a": 4}` })
	require.NoError(t, err)
	require.Equal(t, uint64(12), st.Revision)
	require.Equal(t, 2, v.Resubscribes())
	require.Equal(t, 3, r.count())

	// The server ends the view.
	fut, release := third.Closed(ctx, func(p schema.LiveSubscriber_closed_Params) error {
		e, err := p.NewReason()
		if err != nil {
			return err
		}
		e.SetCode(schema.ErrorCode_unavailable)
		p.SetWhy(schema.CloseReason_serverShuttingDown)
		return e.SetMessage_("shutting down")
	})
	_, err = fut.Struct()
	release()
	require.NoError(t, err)
	<-v.Done()
	var cc *ConnectionClosed
	require.ErrorAs(t, v.Err(), &cc)
	require.Equal(t, schema.CloseReason_serverShuttingDown, cc.Why)
	require.Equal(t, "shutting down", cc.Reason.Message)
	_, err = v.Wait(ctx, func(json.RawMessage) bool { return false })
	require.ErrorAs(t, err, &cc, "Wait on an ended view")
	require.NoError(t, v.Cancel(ctx))
	require.True(t, r.endedAt(2))
}

// hungHandle is a registration's handle whose server never answers cancel (a hung itxd); its
// release is recorded.
type hungHandle struct{ released chan struct{} }

func (h *hungHandle) Cancel(ctx context.Context, _ schema.Handle_cancel) error {
	<-ctx.Done()
	return ctx.Err()
}
func (h *hungHandle) Shutdown() { close(h.released) }

// A view whose first snapshot does not come before the caller's context ends returns at once,
// code cancelled with the context's error, and lets its registration go: it waited up to 10 s
// more for the server's answer to a cancel, and returned the bare context error, which
// itx.ErrorCode reads as internal. Wait on a live view whose context ends says cancelled too.
func TestLiveView_ContextEndsTheWaits(t *testing.T) {
	h := &hungHandle{released: make(chan struct{})}
	register := func(context.Context, schema.LiveSubscriber) (schema.Handle, error) {
		return schema.Handle_ServerToClient(h), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		_, err := watch(ctx, register)
		got <- err
	}()
	select {
	case err := <-got:
		require.Equal(t, itx.ECancelled, itx.ErrorCode(err), "%v", err)
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(5 * time.Second):
		t.Fatal("watch still waits 5 s after its context ended")
	}
	select {
	case <-h.released:
	case <-time.After(5 * time.Second):
		t.Fatal("the registration was not let go")
	}

	r := &registrations{signal: make(chan struct{}, 16)}
	bg, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	views := make(chan *LiveView, 1)
	go func() {
		v, err := watch(bg, r.register)
		require.NoError(t, err)
		views <- v
	}()
	snapshot(t, r.sub(t, 0), 1, `{}`)
	v := <-views
	wctx, wcancel := context.WithCancel(bg)
	wcancel()
	_, err := v.Wait(wctx, func(json.RawMessage) bool { return false })
	require.Equal(t, itx.ECancelled, itx.ErrorCode(err), "%v", err)
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, v.Cancel(bg))
}
