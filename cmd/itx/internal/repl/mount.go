package repl

import (
	"context"
	"sync"
	"sync/atomic"

	"capnproto.org/go/capnp/v3"
	"github.com/dop251/goja"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/wire"
)

// receiverInbox is the Receiver itx serves for project.capabilities.mount(name): it holds the
// batches itx-call subscriptions deliver to the name for take(), and answers each at once,
// confirming it whole (see Receive), so delivery goes on while nobody reads. Like a connection's sink it
// keeps at most maxBuffered events and maxBufferedBytes unread, dropping the oldest batches
// (and counting their events) past that: a forgotten mount cannot grow without bound.
type receiverInbox struct {
	mu      sync.Mutex
	batches []itx.DeliveryBatch
	events  int // the events of batches
	bytes   int // their Size
	dropped int // events dropped unread
	closed  *itx.Error
	// released: closed is Shutdown's reason, which says less than this session's own unmount
	// or replacement; theirs takes its place (itxd lets the Receiver go as it answers them, so
	// Shutdown may come first).
	released bool
	wake     chan struct{}
}

func (r *receiverInbox) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *receiverInbox) Receive(ctx context.Context, call schema.Receiver_receive) error {
	b, err := call.Args().Batch()
	if err != nil {
		return err
	}
	batch, err := wire.DeliveryBatchFromSchema(b)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.batches = append(r.batches, batch)
	r.events += len(batch.Events)
	for i := range batch.Events {
		r.bytes += batch.Events[i].Size()
	}
	for len(r.batches) > 1 && (r.events > maxBuffered || r.bytes > maxBufferedBytes) {
		old := r.batches[0]
		r.batches = r.batches[1:]
		r.events -= len(old.Events)
		r.dropped += len(old.Events)
		for i := range old.Events {
			r.bytes -= old.Events[i].Size()
		}
	}
	r.mu.Unlock()
	r.signal()
	// No confirmedOffset: the whole batch is confirmed; for an offset-acking subscription
	// (confirmWindow) that is nothing yet, the batch delivered, so that the user confirms it
	// with subscription.confirm(offset), as a receiver that makes events durable later does.
	return nil
}

// Shutdown runs once itxd dropped the Receiver: unmounted or replaced under its name (from
// another session too), or the RPC session ended. This session's own unmount and replacement
// said so first (end keeps the first reason).
func (r *receiverInbox) Shutdown() {
	r.mu.Lock()
	if r.closed == nil {
		r.closed = &itx.Error{Code: itx.EUnavailable, Message: "ended: itxd let the Receiver go (unmounted or replaced under its name, or the connection to itxd ended)"}
		r.released = true
	}
	r.mu.Unlock()
	r.signal()
}

// end records why the mount ended, unless it is known already (other than by Shutdown).
func (r *receiverInbox) end(why *itx.Error) {
	r.mu.Lock()
	if r.closed == nil || r.released {
		r.closed, r.released = why, false
	}
	r.mu.Unlock()
	r.signal()
}

func (r *receiverInbox) held() (n int, closed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.batches), r.closed != nil
}

func (r *receiverInbox) take() (batches []itx.DeliveryBatch, dropped int, closed *itx.Error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	batches, dropped, closed = r.batches, r.dropped, r.closed
	r.batches, r.events, r.bytes, r.dropped = nil, 0, 0, 0
	return
}

// liveMount is a Receiver mounted from itx: releasing its handle unmounts it.
type liveMount struct {
	name     string
	handle   schema.Handle
	inbox    *receiverInbox
	once     sync.Once
	released atomic.Bool
}

func (m *liveMount) release() {
	m.once.Do(func() {
		m.released.Store(true)
		m.handle.Release()
		m.inbox.end(&itx.Error{Code: itx.EUnavailable, Message: "connectionLost: the mount was let go (unmounted, or the session reconnected or ended)"})
	})
}

// batchJS is a delivered batch as take() returns it (a Receiver is not told the project: it
// mounted the name in it).
type batchJS struct {
	StreamID              string    `json:"streamId"`
	Path                  string    `json:"path"`
	Subscription          string    `json:"subscription"`
	ConfiguredAtOffset    int64     `json:"configuredAtOffset"`
	CursorChangedAtOffset int64     `json:"cursorChangedAtOffset"`
	DeliveryID            string    `json:"deliveryId"`
	Attempt               int       `json:"attempt"`
	HeadOffset            int64     `json:"headOffset"`
	Events                []eventJS `json:"events"`
}

// capabilitiesMount mounts a Receiver served by this session under a name, for itx-call
// subscriptions (receiver {type: "itx-call", capability: name}) to deliver to: take() returns
// what they delivered, and unmount() (or leaving) ends the mount, which parks them.
func capabilitiesMount(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	name, err := s.stringArg("Capabilities.mount", args, 0, "name")
	if err != nil {
		return nil, err
	}
	inbox := &receiverInbox{wake: make(chan struct{}, 1)}
	fut, release := schema.Capabilities(c).Mount(ctx, func(p schema.Capabilities_mount_Params) error {
		if err := p.SetName(name); err != nil {
			return err
		}
		return p.SetReceiver(schema.Receiver_ServerToClient(inbox))
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return nil, err
	}
	// The name's earlier mount from this session is replaced (itxd keeps one per name).
	s.endMounts(name, &itx.Error{Code: itx.ECancelled, Message: "replaced: mounted again under the name"})
	m := &liveMount{name: name, handle: res.Handle().AddRef(), inbox: inbox}
	s.remember(m)

	vm := s.vm
	obj := vm.NewObject()
	label := "[Receiver " + name + "]"
	s.setLabel(obj, label)
	obj.Set("take", s.method("take", func(call goja.FunctionCall) goja.Value {
		s.waitHeld("Receiver.take", "batches", call.Arguments, maxBuffered, inbox.wake, func() (int, bool) {
			n, closed := inbox.held()
			return n, closed || m.released.Load()
		})
		batches, dropped, closed := inbox.take()
		out := struct {
			Batches []batchJS `json:"batches"`
			Dropped int       `json:"dropped,omitempty"`
			Closed  *Failure  `json:"closed,omitempty"`
		}{Batches: make([]batchJS, len(batches)), Dropped: dropped}
		for i, b := range batches {
			out.Batches[i] = batchJS{StreamID: b.StreamID, Path: b.Path, Subscription: b.Subscription,
				ConfiguredAtOffset: b.ConfiguredAtOffset, CursorChangedAtOffset: b.CursorChangedAtOffset,
				DeliveryID: b.DeliveryID, Attempt: b.Attempt, HeadOffset: b.HeadOffset, Events: eventsJS(b.Events)}
		}
		if closed != nil {
			out.Closed = &Failure{Code: string(closed.Code), Message: closed.Message}
		}
		return s.toJS(out)
	}))
	obj.Set("unmount", s.method("unmount", s.noArgs("Receiver.unmount", func(goja.FunctionCall) goja.Value {
		if !m.released.Load() {
			// Said first: itxd lets the Receiver go as it unmounts it, which may reach
			// Shutdown before the answer reaches here. Releasing the handle (forget) unmounts
			// it too, should the cancel fail.
			inbox.end(&itx.Error{Code: itx.ECancelled, Message: "unmounted"})
			fut, release := m.handle.Cancel(s.ctx(), nil)
			_, err := fut.Struct()
			release()
			s.forget(m)
			if err != nil {
				panic(s.throw(err))
			}
		}
		return goja.Undefined()
	})))
	return obj, nil
}

// endMounts ends this session's mounts under name, which itxd no longer delivers to (unmounted
// by name, or replaced by a new mount): their take() says why at once rather than waiting out
// its timeout with a reason of their own (itxd lets the Receiver go too, which Shutdown reads
// only as ended), and their handles are let go.
func (s *Session) endMounts(name string, why *itx.Error) {
	var ended []*liveMount
	s.liveMu.Lock()
	for h := range s.live {
		if m, ok := h.(*liveMount); ok && m.name == name && !m.released.Load() {
			ended = append(ended, m)
		}
	}
	s.liveMu.Unlock()
	for _, m := range ended {
		m.inbox.end(why)
		s.forget(m)
	}
}
