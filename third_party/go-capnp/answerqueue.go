package capnp

import (
	"context"
	"errors"
	"sync"

	"capnproto.org/go/capnp/v3/exc"
)

// AnswerQueue is a queue of method calls to make after an earlier
// method call finishes.  The queue is unbounded; it is the caller's
// responsibility to manage/impose backpressure.
//
// An AnswerQueue can be in one of three states:
//
//  1. Queueing.  Incoming method calls will be added to the queue.
//  2. Draining, entered by calling Fulfill or Reject.  Queued method
//     calls will be delivered in sequence, and new incoming method calls
//     will block until the AnswerQueue enters the Drained state.
//  3. Drained, entered once all queued methods have been delivered.
//     Incoming methods are passthrough.
type AnswerQueue struct {
	method   Method
	draining chan struct{} // closed while exiting queueing state

	mu sync.Mutex
	// The entries of the queue. The queue refers to method calls
	// after an earlier call finishes. But not all entries need to refer
	// to the same call. Entries can refer to *earlier* entries in
	// the queue as their "basis". The basis for the initial fulfilled
	// value is always 0. Take for instance the call chain:
	//
	// A() -> a
	// a.B() -> b
	// b.C() -> c
	// a.D() -> d
	//
	// Call A is pipelined to B which is pipelined to C. This would
	// produce a chain of 2 qents with the bases 0 and 1, where 0 is
	// the fulfilled result of A, and 1 is the result of B. If we add
	// in a qent to the end for call D pipelined from A, it would have
	// a basis 0 like with call B.
	//
	// This field is set to nil when draining starts.
	q []qent
	// Message targets derived from applying a qent. Its length always
	// at least 1, since the 0 index is used for the initial fulfilled result.
	// This is set when draining starts.
	bases []base
}

// qent is a single entry in an AnswerQueue.
type qent struct {
	ctx   context.Context
	basis int // index in bases
	path  []PipelineOp
	Recv
	// itx patch: for a call sent here (see queueCaller.PipelineSend), stop unregisters the
	// watch on ctx, and cancelled is set (under the queue's mu, while queueing) once the call
	// was rejected with cancelErr for its context's end; the drain skips it.
	stop      func() bool
	cancelled bool
	cancelErr error
}

// base is a message target derived from applying a qent.
type base struct {
	ready chan struct{} // closed after recv is assigned
	recv  func(context.Context, []PipelineOp, Recv) PipelineCaller
}

// NewAnswerQueue creates a new answer queue.
func NewAnswerQueue(m Method) *AnswerQueue {
	return &AnswerQueue{
		method: m,
		// N.B. since q == nil denotes the draining state,
		// we do have to allocate something here, even though
		// the queue is an empty slice.
		q:        make([]qent, 0),
		draining: make(chan struct{}),
	}
}

// Fulfill empties the queue, delivering the method calls on the given
// pointer.  After fulfill returns, pipeline calls will be immediately
// delivered instead of being queued.
func (aq *AnswerQueue) Fulfill(ptr Ptr) {
	// Enter draining state.
	aq.mu.Lock()
	q := aq.q
	aq.q = nil
	aq.bases = make([]base, len(q)+1)
	ready := make(chan struct{}) // TODO(soon): use more fine-grained signals
	// itx patch: Returns of the delivered calls that came during their delivery run
	// once ready is closed (see returnCapture.Return). Deferred first, so it runs last.
	var delivered []*returnCapture
	defer func() {
		for _, rc := range delivered {
			rc.flush()
		}
	}()
	defer close(ready)
	for i := range aq.bases {
		aq.bases[i].ready = ready
	}
	aq.bases[0].recv = ImmediateAnswer(aq.method, ptr).PipelineRecv
	// itx patch: the message behind ptr belongs to the caller (the RPC
	// return message, or the local caller's results) and is released once
	// the call returns and the caller finishes it. A call queued in another
	// answer's queue can still reach this queue after that, chained through
	// a call delivered here (login().project.streams().get(): the third call
	// is delivered to the second call's queue by the first call's drain),
	// and Transform then read freed memory: the server panicked. Those late
	// calls resolve through a copy taken now, while ptr is alive, and the
	// copy holds the result's capabilities until every drain running now
	// has finished (only such a drain can still deliver a call chained
	// through this result; see drainTracker).
	late, release := detachedRecv(aq.method, ptr)
	close(aq.draining)
	aq.mu.Unlock()
	if release != nil {
		drains.hold(release)
	}
	if len(q) > 0 {
		// Deferred after close(ready), so it runs first: the drains waiting on
		// ready are running drains of their own.
		defer drains.end(drains.start())
	}

	// Drain queue.
	for i := range q {
		ent := &q[i]
		// itx patch: a sent call whose context ended while it was queued was rejected then.
		if ent.stop != nil {
			ent.stop()
		}
		if ent.cancelled {
			aq.bases[i+1].recv = rejectPipelineCallWith(ent.cancelErr)
			continue
		}
		recv := aq.bases[ent.basis].recv
		// itx patch: how a call delivered here returned, when it returned before
		// its delivery did, is kept for the calls chained on it.
		rc := &returnCapture{Returner: ent.Recv.Returner, method: ent.Method, delivering: true}
		delivered = append(delivered, rc)
		r := ent.Recv
		r.Returner = rc
		pcall := recv(ent.ctx, ent.path, r)
		// The basis for our result will always be our index in the queue + 1
		// since 0 is used for the initial fulfilled result.
		if pcall == nil {
			// itx patch (upstream PR #617, widened): a call that has no pipeline
			// caller returned during its delivery. Calls chained on it are
			// rejected with its error if it failed (a refusal reaches the end of
			// a chain as itself), and delivered through its results if it
			// succeeded: a capability held by another connection answers a call
			// at once when the answer is back before its Recv looks (rpc's
			// importClient.Recv, question.PipelineRecv).
			aq.bases[i+1].recv = rc.chained()
		} else {
			rc.delivered()
			aq.bases[i+1].recv = pcall.PipelineRecv
		}
	}
	// itx patch: written before ready is closed; every later reader waits on ready.
	aq.bases[0].recv = late
}

// drains tracks the answer queue drains running in this process (itx patch).
//
// A call chained through a result can reach that result's queue after the
// caller released the result: the queue of an earlier call delivers the
// chained call's target call and then the chained call itself, and the
// target call can run, return and be finished in between. Only a drain
// that was running when the target's queue was fulfilled can do that, since
// the drain delivering the target call started before the call ran. So a
// fulfilled queue holds its result's capabilities until every drain running
// at that moment has finished, and then lets them go (a later call reaches
// them only through a holder that still has them, see detachedRecv).
// Drains only deliver calls (they enqueue them or send them), so the wait
// is short.
var drains drainTracker

type drainTracker struct {
	mu     sync.Mutex
	last   uint64              // the id of the newest drain started
	active map[uint64]struct{} // the drains running
	holds  []drainHold         // in order of after
}

// drainHold is a release to run once no drain with an id up to after is running.
type drainHold struct {
	after   uint64
	release func()
}

// start records a drain that begins now and returns its id.
func (t *drainTracker) start() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.active == nil {
		t.active = make(map[uint64]struct{})
	}
	t.last++
	t.active[t.last] = struct{}{}
	return t.last
}

// end records that the drain id finished, and runs the holds it was the last to keep.
func (t *drainTracker) end(id uint64) {
	t.mu.Lock()
	delete(t.active, id)
	oldest := t.last + 1
	for a := range t.active {
		if a < oldest {
			oldest = a
		}
	}
	n := 0
	for n < len(t.holds) && t.holds[n].after < oldest {
		n++
	}
	if n == 0 {
		t.mu.Unlock()
		return
	}
	due := make([]drainHold, n)
	copy(due, t.holds[:n])
	t.holds = append(t.holds[:0], t.holds[n:]...)
	t.mu.Unlock()
	for _, h := range due {
		h.release()
	}
}

// hold runs release once every drain running now has finished: at once when none is running.
func (t *drainTracker) hold(release func()) {
	t.mu.Lock()
	if len(t.active) == 0 {
		t.mu.Unlock()
		release()
		return
	}
	t.holds = append(t.holds, drainHold{after: t.last, release: release})
	t.mu.Unlock()
}

// rejectPipelineCallWith answers a call pipelined on a call that was rejected on delivery with
// err, with err (itx patch, upstream PR #617, which rejected with the message below for any err).
func rejectPipelineCallWith(err error) func(context.Context, []PipelineOp, Recv) PipelineCaller {
	if err == nil {
		err = errors.New("capnp: pipeline call has no pipeline caller")
	}
	return func(_ context.Context, _ []PipelineOp, r Recv) PipelineCaller {
		r.Reject(err)
		return nil
	}
}

// returnCapture passes a Returner through (itx patch). While the call is being delivered, it
// keeps how the call returned: the error it was prepared with, or a detached copy of its results
// (see detachedRecv), taken before the Returner may release them.
//
// And a Return that comes during the delivery waits until the drain has closed its queue's ready
// channel (Fulfill calls flush then). An RPC answer's Return waits for the calls the peer
// pipelined on it to be delivered, and such a call, reaching this draining queue, waits for ready:
// a call rejected on delivery (a refusal early in a pipelined chain) while the peer pipelined
// another call on it left the drain and the connection's receive loop waiting on each other for
// good (TestRPC_RefusalReachesTheEndOfAChain hung under -race, 1 run in about 10).
type returnCapture struct {
	Returner
	method Method

	mu         sync.Mutex
	delivering bool   // the drain's recv has not returned yet
	results    Struct // from AllocResults
	prepared   bool
	err        error
	recv       func(context.Context, []PipelineOp, Recv) PipelineCaller // the results' copy
	release    func()                                                   // its strong references
	returnDue  bool                                                     // Return came during the delivery, and has not finished
	releaseDue bool                                                     // ReleaseResults came while returnDue
}

func (c *returnCapture) Return() {
	c.mu.Lock()
	if c.delivering {
		c.returnDue = true
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.Returner.Return()
}

func (c *returnCapture) ReleaseResults() {
	c.mu.Lock()
	if c.returnDue {
		c.releaseDue = true
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.Returner.ReleaseResults()
}

// flush runs a Return that came during the delivery, and the ReleaseResults that followed it.
func (c *returnCapture) flush() {
	c.mu.Lock()
	due := c.returnDue
	c.mu.Unlock()
	if !due {
		return
	}
	c.Returner.Return()
	c.mu.Lock()
	c.returnDue = false
	release := c.releaseDue
	c.mu.Unlock()
	if release {
		c.Returner.ReleaseResults()
	}
}

func (c *returnCapture) AllocResults(sz ObjectSize) (Struct, error) {
	s, err := c.Returner.AllocResults(sz)
	if err == nil {
		c.mu.Lock()
		c.results = s
		c.mu.Unlock()
	}
	return s, err
}

func (c *returnCapture) PrepareReturn(e error) {
	c.mu.Lock()
	c.prepared, c.err = true, e
	if e == nil && c.delivering {
		c.recv, c.release = detachedRecv(c.method, c.results.ToPtr())
	}
	c.mu.Unlock()
	c.Returner.PrepareReturn(e)
}

// chained returns the receiver for calls chained on a call whose delivery returned no pipeline
// caller: the call returned during it. A copy of its results holds their capabilities until the
// drains running now have finished, as Fulfill's own copy does.
func (c *returnCapture) chained() func(context.Context, []PipelineOp, Recv) PipelineCaller {
	c.mu.Lock()
	c.delivering = false
	prepared, err, recv, release := c.prepared, c.err, c.recv, c.release
	c.mu.Unlock()
	switch {
	case !prepared || err != nil:
		return rejectPipelineCallWith(err)
	case release != nil:
		drains.hold(release)
	}
	return recv
}

// delivered ends the delivery of a call that gave a pipeline caller: chained calls go there, and a
// copy of results that came back meanwhile is not needed.
func (c *returnCapture) delivered() {
	c.mu.Lock()
	c.delivering = false
	release := c.release
	c.recv, c.release = nil, nil
	c.mu.Unlock()
	if release != nil {
		release()
	}
}

// nullPipelineCall answers a call pipelined on a result without capabilities, as a call on a null
// client (itx patch).
func nullPipelineCall(ctx context.Context, _ []PipelineOp, r Recv) PipelineCaller {
	return Client{}.RecvCall(ctx, r)
}

// DetachedPipeline returns a PipelineCaller for the result ptr that stays valid after ptr's
// message is released (itx patch; see detachedRecv): its capabilities are held until the answer
// queue drains running now have finished, and weakly after that. rpc forwards a call to another
// connection and gives the calls chained on it this copy once the answer is back, since it
// releases the answer then.
func DetachedPipeline(m Method, ptr Ptr) PipelineCaller {
	recv, release := detachedRecv(m, ptr)
	if release != nil {
		drains.hold(release)
	}
	return detachedPipeline(recv)
}

type detachedPipeline func(context.Context, []PipelineOp, Recv) PipelineCaller

func (d detachedPipeline) PipelineRecv(ctx context.Context, transform []PipelineOp, r Recv) PipelineCaller {
	return d(ctx, transform, r)
}

func (d detachedPipeline) PipelineSend(ctx context.Context, transform []PipelineOp, s Send) (*Answer, ReleaseFunc) {
	return sendThroughRecv(ctx, transform, s, d)
}

// detachedRecv returns a pipeline receiver for the result ptr that stays valid after ptr's
// message is released, and a release for the strong references it took, if any (itx patch). A
// result without capabilities needs nothing from the message: any pipelined call on it is a call
// on a null client. Otherwise the result is copied into a message of its own; the copy holds its
// capabilities strongly until release (Fulfill hands it to drains) and weakly after that, so it
// keeps nothing alive that the caller has let go: a call whose target every holder has released
// fails as disconnected instead of reaching a shut-down capability.
func detachedRecv(m Method, ptr Ptr) (func(context.Context, []PipelineOp, Recv) PipelineCaller, func()) {
	msg := ptr.Message()
	if msg == nil || msg.CapTable().Len() == 0 {
		return nullPipelineCall, nil // no allocation on the common path (results without capabilities)
	}
	copied, _, err := NewMessage(SingleSegment(nil))
	if err == nil {
		err = copied.SetRoot(ptr)
	}
	var root Ptr
	if err == nil {
		root, err = copied.Root()
	}
	if err != nil {
		copied.Release()
		err = exc.WrapError("detach pipelined result", err)
		return func(ctx context.Context, _ []PipelineOp, r Recv) PipelineCaller {
			r.Reject(err)
			return nil
		}, nil
	}
	table := copied.CapTable()
	weak := make([]WeakClient, table.Len())
	var strong []Client
	for i := range weak {
		if c := table.At(i); c.IsValid() {
			weak[i] = c.WeakRef()
			strong = append(strong, c.AddRef())
		}
	}
	table.Reset() // the copy's own references go; strong is released by the caller
	var release func()
	if len(strong) > 0 {
		release = func() {
			for _, c := range strong {
				c.Release()
			}
		}
	}
	return func(ctx context.Context, transform []PipelineOp, r Recv) PipelineCaller {
		p, err := Transform(root, transform)
		if err != nil {
			r.Reject(exc.Annotate("", m.String(), err))
			return nil
		}
		iface := p.Interface()
		if !iface.IsValid() || int(iface.Capability()) >= len(weak) {
			return Client{}.RecvCall(ctx, r)
		}
		c, ok := weak[iface.Capability()].AddRef()
		if !ok {
			r.Reject(exc.New(exc.Disconnected, "", m.String()+": pipelined call on a capability that was released"))
			return nil
		}
		defer c.Release()
		return c.RecvCall(ctx, r)
	}, release
}

// Reject empties the queue, returning errors on all the method calls.
func (aq *AnswerQueue) Reject(e error) {
	if e == nil {
		panic("AnswerQueue.reject(nil)")
	}

	// Enter draining state.
	aq.mu.Lock()
	q := aq.q
	aq.q = nil
	aq.bases = make([]base, len(q)+1)
	ready := make(chan struct{})
	close(ready)
	for i := range aq.bases {
		b := &aq.bases[i]
		b.ready = ready
		b.recv = func(_ context.Context, _ []PipelineOp, r Recv) PipelineCaller {
			r.Reject(e) // TODO(soon): attach pipelined method info
			return nil
		}
	}
	close(aq.draining)
	aq.mu.Unlock()

	// Drain queue by rejecting.
	for i := range q {
		if q[i].stop != nil { // itx patch: see cancelQueued
			q[i].stop()
		}
		if q[i].cancelled {
			continue
		}
		q[i].Reject(e) // TODO(soon): attach pipelined method info
	}
}

// cancelQueued rejects the queued call at index i, whose context ended, if the queue is still
// queueing (itx patch). A call queued on an answer that never comes (an embargo whose
// Disembargo the peer never sends back, while the connection stays up) otherwise waited
// forever whatever its context said, and so did its caller.
func (aq *AnswerQueue) cancelQueued(i int) {
	aq.mu.Lock()
	if aq.q == nil || i >= len(aq.q) || aq.q[i].cancelled {
		aq.mu.Unlock() // draining: the drain delivers it, to a callee that sees its context
		return
	}
	ent := &aq.q[i]
	err := ent.ctx.Err()
	ent.cancelled, ent.cancelErr = true, err
	r := ent.Recv
	ent.Recv = Recv{}
	aq.mu.Unlock()
	r.Reject(err)
}

func (aq *AnswerQueue) PipelineRecv(ctx context.Context, transform []PipelineOp, r Recv) PipelineCaller {
	return queueCaller{aq, 0}.PipelineRecv(ctx, transform, r)
}

func (aq *AnswerQueue) PipelineSend(ctx context.Context, transform []PipelineOp, r Send) (*Answer, ReleaseFunc) {
	return queueCaller{aq, 0}.PipelineSend(ctx, transform, r)
}

// queueCaller is a client that enqueues calls to an AnswerQueue.
type queueCaller struct {
	aq    *AnswerQueue
	basis int
}

func (qc queueCaller) PipelineRecv(ctx context.Context, transform []PipelineOp, r Recv) PipelineCaller {
	return qc.recv(ctx, transform, r, false)
}

// recv delivers or queues a call; watch (itx patch) rejects a queued call once its context ends.
func (qc queueCaller) recv(ctx context.Context, transform []PipelineOp, r Recv, watch bool) PipelineCaller {
	qc.aq.mu.Lock()
	if len(qc.aq.bases) > 0 {
		// Draining/drained.
		qc.aq.mu.Unlock()
		b := &qc.aq.bases[qc.basis]
		select {
		case <-b.ready:
		case <-ctx.Done():
			r.Reject(ctx.Err())
			return nil
		}
		return b.recv(ctx, transform, r)
	}
	// Enqueue.
	qc.aq.q = append(qc.aq.q, qent{
		ctx:   ctx,
		basis: qc.basis,
		path:  transform,
		Recv:  r,
	})
	// The basis for our result will always be our index in the queue + 1
	// since 0 is used for the initial fulfilled result.
	basis := len(qc.aq.q)
	if watch && ctx.Done() != nil {
		aq, i := qc.aq, basis-1
		qc.aq.q[i].stop = context.AfterFunc(ctx, func() { aq.cancelQueued(i) })
	}
	qc.aq.mu.Unlock()
	return queueCaller{aq: qc.aq, basis: basis}
}

// PipelineSend queues or delivers a call made in this process (itx patch: rejected if its
// context ends while it is queued). A call received from a peer (PipelineRecv) is not: the
// peer's Finish ends its context, and a peer may finish a call it pipelined others on (the C++
// example's login -> streams -> get -> append failed so when every queued call was watched).
func (qc queueCaller) PipelineSend(ctx context.Context, transform []PipelineOp, s Send) (*Answer, ReleaseFunc) {
	return sendThroughRecv(ctx, transform, s, func(ctx context.Context, transform []PipelineOp, r Recv) PipelineCaller {
		return qc.recv(ctx, transform, r, true)
	})
}

// sendThroughRecv makes a call sent on a pipeline out of its receiving side.
func sendThroughRecv(ctx context.Context, transform []PipelineOp, s Send, recv func(context.Context, []PipelineOp, Recv) PipelineCaller) (*Answer, ReleaseFunc) {
	ret := new(StructReturner)
	r := Recv{
		Method:      s.Method,
		Returner:    ret,
		ReleaseArgs: func() {},
	}
	if s.PlaceArgs != nil {
		var err error
		_, seg := NewMultiSegmentMessage(nil)
		r.Args, err = NewRootStruct(seg, s.ArgsSize)
		if err != nil {
			return ErrorAnswer(s.Method, err), func() {}
		}
		if err = s.PlaceArgs(r.Args); err != nil {
			return ErrorAnswer(s.Method, err), func() {}
		}
		r.ReleaseArgs = r.Args.Message().Release
	}

	pcall := recv(ctx, transform, r)
	return ret.Answer(s.Method, pcall)
}

// A StructReturner implements Returner by allocating an in-memory
// message.  It is safe to use from multiple goroutines.  The zero value
// is a Returner in its initial state.
type StructReturner struct {
	mu       sync.Mutex // guards all fields
	p        *Promise   // assigned at most once
	alloced  bool
	released bool
	msg      *Message // assigned at most once

	returned bool   // indicates whether the below fields are filled in
	result   Struct // assigned at most once
	err      error  // assigned at most once

}

func (sr *StructReturner) AllocResults(sz ObjectSize) (Struct, error) {
	defer sr.mu.Unlock()
	sr.mu.Lock()
	if sr.alloced {
		return Struct{}, errors.New("StructReturner: multiple calls to AllocResults")
	}
	sr.alloced = true
	_, seg := NewMultiSegmentMessage(nil)
	s, err := NewRootStruct(seg, sz)
	if err != nil {
		return Struct{}, exc.WrapError("alloc results", err)
	}
	sr.result = s
	sr.msg = s.Message()
	return s, nil
}
func (sr *StructReturner) PrepareReturn(e error) {
	sr.mu.Lock()
	defer sr.mu.Unlock()
	sr.err = e
}

func (sr *StructReturner) Return() {
	sr.mu.Lock()
	if sr.returned {
		sr.mu.Unlock()
		panic("StructReturner.Return called twice")
	}
	sr.returned = true
	e := sr.err
	if e == nil {
		sr.mu.Unlock()
		if sr.p != nil {
			sr.p.Fulfill(sr.result.ToPtr())
		}
	} else {
		sr.result = Struct{}
		sr.mu.Unlock()
		if sr.p != nil {
			sr.p.Reject(e)
		}
	}
}

func (sr *StructReturner) ReleaseResults() {
	sr.mu.Lock()
	alloced := sr.alloced
	returned := sr.returned
	released := sr.released
	err := sr.err
	msg := sr.msg
	sr.msg = nil
	sr.released = true
	sr.mu.Unlock()

	if !returned {
		panic("ReleaseResults() called before Return()")
	}
	if released {
		panic("ReleaseResults() called twice")
	}
	if !alloced {
		return
	}
	if err != nil && msg != nil {
		msg.Release()
	}
}

// Answer returns an Answer that will be resolved when Return is called.
// answer must only be called once per StructReturner.
func (sr *StructReturner) Answer(m Method, pcall PipelineCaller) (*Answer, ReleaseFunc) {
	defer sr.mu.Unlock()
	sr.mu.Lock()
	if sr.p != nil {
		panic("StructReturner.Answer called multiple times")
	}
	if sr.returned {
		if sr.err != nil {
			return ErrorAnswer(m, sr.err), func() {}
		}
		return ImmediateAnswer(m, sr.result.ToPtr()), func() {
			sr.mu.Lock()
			msg := sr.result.Message()
			sr.result = Struct{}
			sr.mu.Unlock()
			if msg != nil {
				msg.Release()
			}
		}
	}
	sr.p = NewPromise(m, pcall, nil)
	ans := sr.p.Answer()
	return ans, func() {
		<-ans.Done()
		sr.mu.Lock()
		msg := sr.result.Message()
		sr.result = Struct{}
		sr.mu.Unlock()
		sr.p.ReleaseClients()
		if msg != nil {
			msg.Release()
		}
	}
}
