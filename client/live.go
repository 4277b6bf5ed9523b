package client

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
)

// liveDoc is a live-state document kept from a snapshot and the RFC 6902 patches after it, one
// revision each. A patch that does not follow the last revision (or does not apply) leaves the
// document unknown until the next snapshot.
type liveDoc struct {
	mu    sync.Mutex
	rev   uint64
	doc   json.RawMessage
	valid bool // a snapshot arrived, and no gap since
}

// apply takes one frame and returns the document after it, or false when the document is
// unknown (a gap: the caller resubscribes, or waits for a snapshot).
func (d *liveDoc) apply(rev uint64, snapshot bool, frame []byte) (json.RawMessage, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if snapshot {
		d.rev, d.doc, d.valid = rev, append(json.RawMessage(nil), frame...), true
		return d.doc, true
	}
	if !d.valid || rev != d.rev+1 {
		d.valid = false
		return nil, false
	}
	patch, err := jsonpatch.DecodePatch(frame)
	if err == nil {
		var doc []byte
		if doc, err = patch.Apply(d.doc); err == nil {
			d.rev, d.doc = rev, doc
			return d.doc, true
		}
	}
	d.valid = false
	return nil, false
}

// LiveState is one revision of a live-state document.
type LiveState struct {
	Revision uint64
	State    json.RawMessage
}

// LiveView keeps a live-state document current: the server sends a snapshot, then a patch per
// revision (or a fresh snapshot when the view fell behind), and the view applies them. Should
// a patch not follow the last revision, the view registers again and starts from the new
// snapshot, as the protocol asks of a subscriber that missed a frame.
type LiveView struct {
	register func(context.Context, schema.LiveSubscriber) (schema.Handle, error)

	mu      sync.Mutex
	cur     LiveState
	changed chan struct{} // closed and replaced on every change, for Wait
	handle  schema.Handle
	sub     *liveSubscriber // the registration frames are taken from (an older one's are ignored)
	closed  *ConnectionClosed
	done    chan struct{}
	resubs  int
	first   chan struct{}
	gotOne  bool
	cancel  bool
}

// WatchStream subscribes to s's live state (head, subscriptions with their lag and status,
// registered readers, open connections) and returns once the first snapshot has arrived.
// Cancel the view when done.
func WatchStream(ctx context.Context, s schema.Stream) (*LiveView, error) {
	if err := NotSent(ctx, "WatchStream"); err != nil {
		return nil, err
	}
	return watch(ctx, func(ctx context.Context, sub schema.LiveSubscriber) (schema.Handle, error) {
		fut, release := s.LiveState(ctx, func(p schema.Stream_liveState_Params) error { return p.SetSubscriber(sub) })
		defer ReleaseAfter(ctx, release)
		res, err := Await(ctx, fut)
		if err != nil {
			return schema.Handle{}, err
		}
		return res.Handle().AddRef(), nil
	})
}

// WatchProcessor subscribes to a processor's live state (its reduced state and runtime), as
// WatchStream does to a stream's.
func WatchProcessor(ctx context.Context, p schema.Processor) (*LiveView, error) {
	if err := NotSent(ctx, "WatchProcessor"); err != nil {
		return nil, err
	}
	return watch(ctx, func(ctx context.Context, sub schema.LiveSubscriber) (schema.Handle, error) {
		fut, release := p.LiveState(ctx, func(p schema.Processor_liveState_Params) error { return p.SetSubscriber(sub) })
		defer ReleaseAfter(ctx, release)
		res, err := Await(ctx, fut)
		if err != nil {
			return schema.Handle{}, err
		}
		return res.Handle().AddRef(), nil
	})
}

func watch(ctx context.Context, register func(context.Context, schema.LiveSubscriber) (schema.Handle, error)) (*LiveView, error) {
	v := &LiveView{register: register, changed: make(chan struct{}), done: make(chan struct{}), first: make(chan struct{})}
	if err := v.subscribe(ctx); err != nil {
		return nil, err
	}
	select {
	case <-v.first:
		if err := v.Err(); err != nil {
			return nil, err
		}
		return v, nil
	case <-ctx.Done():
		// Let go without waiting for the server's answer to a cancel: a hung itxd would hold
		// the caller for Cancel's 10 s after its own context ended.
		v.letGo()
		return nil, cancelled(ctx, "no first snapshot came (the registration was let go)")
	}
}

// letGo ends the view at once: its handle is released, which ends the registration on the
// server, and nothing waits for an answer.
func (v *LiveView) letGo() {
	v.mu.Lock()
	if v.cancel {
		v.mu.Unlock()
		return
	}
	v.cancel = true
	h := v.handle
	v.handle = schema.Handle{}
	v.mu.Unlock()
	h.Release()
	v.end(&ConnectionClosed{Why: schema.CloseReason_closedByClient})
}

// subscribe registers a fresh subscriber; frames of the one before are ignored from now on.
func (v *LiveView) subscribe(ctx context.Context) error {
	sub := &liveSubscriber{v: v}
	v.mu.Lock()
	old := v.handle
	v.sub, v.handle = sub, schema.Handle{}
	v.mu.Unlock()
	if old.IsValid() {
		old.Release() // ends the old registration on the server
	}
	h, err := v.register(ctx, schema.LiveSubscriber_ServerToClient(sub))
	if err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cancel || v.sub != sub {
		h.Release()
		return nil
	}
	v.handle = h
	return nil
}

// Current is the latest revision of the document.
func (v *LiveView) Current() LiveState {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.cur
}

// Wait returns the first revision, from the current one on, whose document cond holds for. It
// fails when ctx ends (code cancelled, errors.Is finds ctx's error) or the view does (with the
// view's *ConnectionClosed).
func (v *LiveView) Wait(ctx context.Context, cond func(state json.RawMessage) bool) (LiveState, error) {
	for {
		v.mu.Lock()
		cur, changed, closed := v.cur, v.changed, v.closed
		v.mu.Unlock()
		if cond(cur.State) {
			return cur, nil
		}
		if closed != nil {
			return cur, closed
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return cur, cancelled(ctx, "LiveView.Wait")
		}
	}
}

// Resubscribes is how many times the view registered again after missing a frame.
func (v *LiveView) Resubscribes() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.resubs
}

// Done is closed when the server ended the view (Err says why), its RPC connection ended (lost,
// closed, or gone silent: Options.PingEvery), or it was cancelled.
func (v *LiveView) Done() <-chan struct{} { return v.done }

// Err is why the view ended (a *ConnectionClosed: serverShuttingDown, streamRemoved,
// accessEnded, subscriptionRemoved from the server; connectionLost, code disconnected, when its
// RPC connection ended), nil while it runs or once cancelled.
func (v *LiveView) Err() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed == nil || v.closed.Why == schema.CloseReason_closedByClient {
		return nil
	}
	return v.closed
}

// Cancel ends the registration on the server and releases it; cancelling again does nothing.
// It waits for the server's answer until ctx's deadline (10 s without one), as Connection.Close
// does: a server that stopped answering does not hold it forever, and a cancelled ctx alone does
// not cut the wait short (the registration ends all the same: its handle is released).
func (v *LiveView) Cancel(ctx context.Context) error {
	v.mu.Lock()
	if v.cancel {
		v.mu.Unlock()
		return nil
	}
	v.cancel = true
	h := v.handle
	v.handle = schema.Handle{}
	v.mu.Unlock()
	var err error
	if h.IsValid() {
		deadline, ok := ctx.Deadline()
		if !ok {
			deadline = time.Now().Add(10 * time.Second)
		}
		ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
		defer cancel()
		fut, release := h.Cancel(ctx, nil)
		_, err = Await(ctx, fut)
		ReleaseAfter(ctx, release)
		h.Release()
	}
	v.end(&ConnectionClosed{Why: schema.CloseReason_closedByClient})
	return err
}

// frame applies one frame of sub's registration.
func (v *LiveView) frame(sub *liveSubscriber, rev uint64, snapshot bool, js []byte) {
	v.mu.Lock()
	if v.sub != sub || v.cancel {
		v.mu.Unlock()
		return
	}
	v.mu.Unlock()
	doc, ok := sub.doc.apply(rev, snapshot, js)
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.sub != sub || v.cancel {
		return
	}
	if !ok {
		// A missed frame: register again (not on this RPC goroutine, which must return).
		v.resubs++
		v.sub = nil
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := v.subscribe(ctx); err != nil {
				v.end(&ConnectionClosed{Why: schema.CloseReason_connectionLost, Reason: itx.AsError(err)})
			}
		}()
		return
	}
	v.cur = LiveState{Revision: rev, State: doc}
	v.notify()
	if !v.gotOne {
		v.gotOne = true
		close(v.first)
	}
}

// notify wakes Wait. Called with v.mu held.
func (v *LiveView) notify() {
	close(v.changed)
	v.changed = make(chan struct{})
}

// end records the first reason the view ended.
func (v *LiveView) end(c *ConnectionClosed) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed != nil {
		return
	}
	v.closed = c
	close(v.done)
	v.notify()
	if !v.gotOne {
		v.gotOne = true
		close(v.first)
	}
}

// liveSubscriber is one registration of a LiveView.
type liveSubscriber struct {
	v   *LiveView
	doc liveDoc
}

func (s *liveSubscriber) Snapshot(ctx context.Context, call schema.LiveSubscriber_snapshot) error {
	state, err := call.Args().State()
	if err != nil {
		return err
	}
	s.v.frame(s, call.Args().Revision(), true, []byte(state))
	return nil
}

func (s *liveSubscriber) Patch(ctx context.Context, call schema.LiveSubscriber_patch) error {
	ops, err := call.Args().Ops()
	if err != nil {
		return err
	}
	s.v.frame(s, call.Args().Revision(), false, []byte(ops))
	return nil
}

func (s *liveSubscriber) Closed(ctx context.Context, call schema.LiveSubscriber_closed) error {
	reason, err := call.Args().Reason()
	c := closedWith(call.Args().Why(), reason, err)
	s.v.mu.Lock()
	current := s.v.sub == s
	s.v.mu.Unlock()
	if current {
		s.v.end(c)
	}
	return nil
}

// Shutdown runs once the server dropped this registration: after closed, after the view
// registered again or was cancelled, or when the RPC session ended (connectionLost).
func (s *liveSubscriber) Shutdown() {
	s.v.mu.Lock()
	current := s.v.sub == s && !s.v.cancel
	s.v.mu.Unlock()
	if current {
		s.v.end(&ConnectionClosed{Why: schema.CloseReason_connectionLost})
	}
}

// Stream decodes a stream's live-state document (WatchStream's, or a connection's State).
func (s LiveState) Stream() (itx.LiveStreamState, error) {
	var st itx.LiveStreamState
	err := json.Unmarshal(s.State, &st)
	return st, err
}

// StreamState is Wait over a stream's decoded live state: the first revision, from the current
// one on, for which cond holds.
func (v *LiveView) StreamState(ctx context.Context, cond func(itx.LiveStreamState) bool) (itx.LiveStreamState, error) {
	var st itx.LiveStreamState
	_, err := v.Wait(ctx, func(state json.RawMessage) bool {
		var s itx.LiveStreamState
		if json.Unmarshal(state, &s) != nil {
			return false
		}
		st = s
		return cond(s)
	})
	return st, err
}
