// Package capnppatch holds the regression tests of itx's patches to go-capnp
// (third_party/go-capnp, see its PATCHES.md): the module's own tests are not part of `make test`.
package capnppatch

import (
	"bytes"
	"context"
	"errors"
	"net"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/rpc"
	"capnproto.org/go/capnp/v3/rpc/transport"
	"capnproto.org/go/capnp/v3/server"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/itx-dev/itx/schema"
	"github.com/stretchr/testify/require"
)

// handle counts cancel calls.
type handle struct{ calls chan struct{} }

func (h handle) Cancel(context.Context, schema.Handle_cancel) error {
	h.calls <- struct{}{}
	return nil
}

// result builds a one-pointer result struct holding c, in a message of its own (as a server's
// Return message holds its results), and returns it with its message.
func result(t *testing.T, c capnp.Client) (capnp.Struct, *capnp.Message) {
	t.Helper()
	msg, seg := capnp.NewSingleSegmentMessage(nil)
	st, err := capnp.NewRootStruct(seg, capnp.ObjectSize{PointerCount: 1})
	require.NoError(t, err)
	id := msg.CapTable().Add(c)
	require.NoError(t, st.SetPtr(0, capnp.NewInterface(seg, id).ToPtr()))
	return st, msg
}

// lateCall pipelines Handle.cancel on field 0 of aq's answer, as a call chained through this
// answer in another answer's queue reaches it once that queue drains.
func lateCall(ctx context.Context, aq *capnp.AnswerQueue) error {
	p := capnp.NewPromise(capnp.Method{}, aq, nil)
	target := schema.Handle(p.Answer().Field(0, nil).Client())
	fut, release := target.Cancel(ctx, nil)
	defer release()
	_, err := fut.Struct()
	return err
}

// A call that reaches an answer queue after the result it was fulfilled with was released (the
// RPC layer releases a Return message once the caller sends Finish) is delivered to the
// capability the result named. Unpatched, Transform read the freed message and the server
// panicked (seen in CI: the C++ and JavaScript examples pipeline login -> streams -> get).
func TestAnswerQueue_CallAfterResultReleased(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := handle{calls: make(chan struct{}, 1)}
	c := capnp.Client(schema.Handle_ServerToClient(h))
	defer c.Release()

	st, msg := result(t, c.AddRef())
	aq := capnp.NewAnswerQueue(capnp.Method{})
	aq.Fulfill(st.ToPtr())
	msg.Release()

	require.NoError(t, lateCall(ctx, aq))
	require.Len(t, h.calls, 1, "the late call reached the capability")
}

// Once every holder released the capability, a late call fails as disconnected instead of
// reaching it: the answer queue keeps nothing alive.
func TestAnswerQueue_CallAfterCapabilityReleased(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := handle{calls: make(chan struct{}, 1)}
	c := capnp.Client(schema.Handle_ServerToClient(h))

	st, msg := result(t, c)
	aq := capnp.NewAnswerQueue(capnp.Method{})
	aq.Fulfill(st.ToPtr())
	msg.Release() // the last reference

	err := lateCall(ctx, aq)
	require.Error(t, err)
	require.True(t, capnp.IsDisconnected(err), "%v", err)
	require.Len(t, h.calls, 0)
}

// A call pipelined on a result without capabilities fails as a call on a null capability, as
// before the patch, without reading the released message.
func TestAnswerQueue_CallOnResultWithoutCapabilities(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msg, seg := capnp.NewSingleSegmentMessage(nil)
	st, err := capnp.NewRootStruct(seg, capnp.ObjectSize{PointerCount: 1})
	require.NoError(t, err)
	aq := capnp.NewAnswerQueue(capnp.Method{})
	aq.Fulfill(st.ToPtr())
	msg.Release()

	err = lateCall(ctx, aq)
	require.ErrorContains(t, err, "null client")
}

// A queued call that is rejected on delivery (here: on a null capability) leaves calls chained on
// it rejected, not a nil pipeline caller that panicked the draining goroutine (upstream #617).
func TestAnswerQueue_ChainedOnRejectedCall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msg, seg := capnp.NewSingleSegmentMessage(nil)
	st, err := capnp.NewRootStruct(seg, capnp.ObjectSize{PointerCount: 1})
	require.NoError(t, err)
	defer msg.Release()

	aq := capnp.NewAnswerQueue(capnp.Method{})
	p := capnp.NewPromise(capnp.Method{}, aq, nil)
	first := schema.Handle(p.Answer().Field(0, nil).Client())
	// A Handle.cancel result has no capability; chain a second call on "its" field 0 anyway.
	fut, release := first.Cancel(ctx, nil)
	defer release()
	second := schema.Handle(fut.Field(0, nil).Client())
	fut2, release2 := second.Cancel(ctx, nil)
	defer release2()

	aq.Fulfill(st.ToPtr())
	_, err = fut.Struct()
	require.ErrorContains(t, err, "null client")
	_, err = fut2.Struct()
	require.Error(t, err)
}

// shutHandle is a handle that reports its shutdown (the release of its last reference).
type shutHandle struct {
	handle
	shut chan struct{}
}

func (h shutHandle) Shutdown() { close(h.shut) }

// pausedHook is a capability whose delivery waits until told to go on, then hands the call's
// pipeline to next: it stands for a drain that is preempted between two deliveries while the
// call it delivered runs, returns and is finished.
type pausedHook struct {
	delivered chan struct{}
	proceed   chan struct{}
	next      capnp.PipelineCaller
}

func (h *pausedHook) Send(_ context.Context, s capnp.Send) (*capnp.Answer, capnp.ReleaseFunc) {
	return capnp.ErrorAnswer(s.Method, errors.New("pausedHook: send")), func() {}
}

func (h *pausedHook) Recv(_ context.Context, r capnp.Recv) capnp.PipelineCaller {
	close(h.delivered)
	<-h.proceed
	r.Reject(errors.New("pausedHook: its results are next's"))
	return h.next
}

func (h *pausedHook) Brand() capnp.Brand { return capnp.Brand{} }
func (h *pausedHook) Shutdown()          {}
func (h *pausedHook) String() string     { return "pausedHook" }

// The race CI hit after the first patch (the C++ example failed with "pipeline call has no
// pipeline caller"): login's queue delivers streams() and then get(), chained on streams(); in
// between, streams() runs, returns, and its caller finishes it, releasing the result and the
// only reference to the Streams capability. get() must still reach that capability: the drain
// delivering it was running when streams() was fulfilled, so the result's capabilities are held
// until that drain ends, and let go then.
func TestAnswerQueue_ChainedCallDeliveredAfterTargetFinished(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// streams(): its queue, fulfilled with the only reference to the capability get() targets.
	h := shutHandle{handle: handle{calls: make(chan struct{}, 1)}, shut: make(chan struct{})}
	streams := capnp.NewAnswerQueue(capnp.Method{})

	// login(): its queue holds streams() (on the paused capability) and get() chained on it.
	paused := &pausedHook{delivered: make(chan struct{}), proceed: make(chan struct{}), next: streams}
	pausedClient := capnp.NewClient(paused)
	defer pausedClient.Release()
	loginResult, loginMsg := result(t, pausedClient.AddRef())
	defer loginMsg.Release()
	login := capnp.NewAnswerQueue(capnp.Method{})
	p := capnp.NewPromise(capnp.Method{}, login, nil)
	first := schema.Handle(p.Answer().Field(0, nil).Client())
	fut, release := first.Cancel(ctx, nil)
	defer release()
	chained := schema.Handle(fut.Field(0, nil).Client())
	fut2, release2 := chained.Cancel(ctx, nil)
	defer release2()

	drained := make(chan struct{})
	go func() {
		defer close(drained)
		login.Fulfill(loginResult.ToPtr())
	}()
	<-paused.delivered // the drain delivered streams() and is paused before get()

	st, msg := result(t, capnp.Client(schema.Handle_ServerToClient(h)))
	streams.Fulfill(st.ToPtr())
	msg.Release() // streams() returned and was finished: the result held the last reference
	select {
	case <-h.shut:
		t.Fatal("the capability was shut down while a drain that can reach it was running")
	default:
	}

	close(paused.proceed)
	<-drained
	_, err := fut2.Struct()
	require.NoError(t, err, "get() reached the capability streams() returned")
	require.Len(t, h.calls, 1)
	select {
	case <-h.shut: // the hold ended with the drain
	case <-ctx.Done():
		t.Fatal("the result's capabilities were never let go")
	}
}

// A call's return leaves no goroutine behind while its Finish waits out go-capnp's 250 ms delay
// (a timer instead of a sleeping goroutine per call). Unpatched, the calls below left one
// goroutine each alive for 250 ms.
func TestRPC_ReturnLeavesNoGoroutineForTheFinishDelay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	h := handle{calls: make(chan struct{}, 1000)}
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		conn := rpc.NewConn(rpc.NewStreamTransport(c), &rpc.Options{BootstrapClient: capnp.Client(schema.Handle_ServerToClient(h))})
		<-conn.Done()
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	conn := rpc.NewConn(rpc.NewStreamTransport(nc), nil)
	defer conn.Close()
	target := schema.Handle(conn.Bootstrap(ctx))
	defer target.Release()
	call := func() {
		fut, release := target.Cancel(ctx, nil)
		defer release()
		_, err := fut.Struct()
		require.NoError(t, err)
	}

	call()
	before := runtime.NumGoroutine()
	const calls = 100
	for i := 0; i < calls; i++ {
		call()
	}
	after := runtime.NumGoroutine()
	require.Less(t, after-before, calls/4, "goroutines left behind by %d calls", calls)
}

// streamsServer answers Streams.get with a new capability each call (a Handle standing in for a
// Stream: the export table does not look at the interface).
type streamsServer struct{ schema.Streams_Server }

func (streamsServer) Get(_ context.Context, call schema.Streams_get) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	h := schema.Handle_ServerToClient(handle{calls: make(chan struct{}, 1)})
	return res.SetStream(schema.Stream(capnp.Client(h)))
}

// Conn.ExportCount (a patch) counts the capabilities the peer holds: one per returned
// capability it keeps, none once it releases them.
func TestRPC_ExportCount(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	served := make(chan *rpc.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		conn := rpc.NewConn(rpc.NewStreamTransport(c), &rpc.Options{BootstrapClient: capnp.Client(schema.Streams_ServerToClient(streamsServer{}))})
		served <- conn
		<-conn.Done()
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	conn := rpc.NewConn(rpc.NewStreamTransport(nc), nil)
	defer conn.Close()
	streams := schema.Streams(conn.Bootstrap(ctx))
	defer streams.Release()
	require.NoError(t, streams.Resolve(ctx))
	server := <-served
	require.Equal(t, 1, server.ExportCount(), "the bootstrap capability")

	var held []schema.Stream
	for range 5 {
		fut, release := streams.Get(ctx, nil)
		s := fut.Stream().AddRef()
		require.NoError(t, s.Resolve(ctx))
		release()
		held = append(held, s)
	}
	require.Equal(t, 6, server.ExportCount())
	for _, s := range held {
		s.Release()
	}
	require.Eventually(t, func() bool { return server.ExportCount() == 1 }, 10*time.Second, time.Millisecond,
		"the released capabilities leave the table (count %d)", server.ExportCount())
}

// Asking an unresolved answer's pipelined field for its client twice, then resolving it, then
// calling through it: unpatched, the second Client() returned holding the promise's lock, and
// the resolution (and every call) hung.
func TestFuture_ClientTwiceBeforeResolution(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := handle{calls: make(chan struct{}, 1)}
	c := capnp.Client(schema.Handle_ServerToClient(h))
	defer c.Release()
	aq := capnp.NewAnswerQueue(capnp.Method{})
	p := capnp.NewPromise(capnp.Method{}, aq, nil)
	first := p.Answer().Field(0, nil).Client()
	second := p.Answer().Field(0, nil).Client()
	require.True(t, first.IsSame(second), "one client per pipelined path")

	st, msg := result(t, c.AddRef())
	defer msg.Release()
	resolved := make(chan struct{})
	go func() {
		aq.Fulfill(st.ToPtr())
		p.Fulfill(st.ToPtr())
		close(resolved)
	}()
	select {
	case <-resolved:
	case <-ctx.Done():
		t.Fatal("resolving the promise hung: the promise's lock was left held")
	}
	fut, release := schema.Handle(second).Cancel(ctx, nil)
	defer release()
	_, err := fut.Struct()
	require.NoError(t, err)
	<-h.calls
}

// rawCall sends a call of Handle.cancel as question q, on the bootstrap's answer (question 0)
// or, with onAnswer, pipelined on field 0 of question onAnswer's results.
func rawCall(t *testing.T, tr transport.Transport, q uint32, onAnswer *uint32) {
	t.Helper()
	m, err := tr.NewMessage()
	require.NoError(t, err)
	defer m.Release()
	c, err := m.Message().NewCall()
	require.NoError(t, err)
	c.SetQuestionId(q)
	c.SetInterfaceId(schema.Handle_TypeID)
	c.SetMethodId(0)
	tgt, err := c.NewTarget()
	require.NoError(t, err)
	pa, err := tgt.NewPromisedAnswer()
	require.NoError(t, err)
	if onAnswer == nil {
		pa.SetQuestionId(0)
	} else {
		pa.SetQuestionId(*onAnswer)
		ops, err := pa.NewTransform(1)
		require.NoError(t, err)
		ops.At(0).SetGetPointerField(0)
	}
	params, err := c.NewParams()
	require.NoError(t, err)
	st, err := capnp.NewStruct(params.Segment(), capnp.ObjectSize{})
	require.NoError(t, err)
	require.NoError(t, params.SetContent(st.ToPtr()))
	require.NoError(t, m.Send())
}

// rawReturn reads messages until the Return for question q and reports whether it said
// noFinishNeeded and whether it was an exception; an Abort fails the test.
func rawReturn(t *testing.T, tr transport.Transport, q uint32) (noFinish, exception bool) {
	t.Helper()
	for {
		in, err := tr.RecvMessage()
		require.NoError(t, err, "waiting for the return of %d", q)
		m := in.Message()
		if m.Which() == rpccp.Message_Which_abort {
			a, _ := m.Abort()
			reason, _ := a.Reason()
			in.Release()
			t.Fatalf("waiting for the return of %d: aborted: %s", q, reason)
		}
		if m.Which() == rpccp.Message_Which_return {
			ret, _ := m.Return()
			if ret.AnswerId() == q {
				noFinish, exception = ret.NoFinishNeeded(), ret.Which() == rpccp.Return_Which_exception
				in.Release()
				return noFinish, exception
			}
		}
		in.Release()
	}
}

// serveHandle serves a Handle as the bootstrap capability of every connection to a loopback
// listener, and returns its address.
func serveHandle(t *testing.T, h schema.Handle_Server) string {
	return serve(t, func() capnp.Client { return capnp.Client(schema.Handle_ServerToClient(h)) })
}

// serve serves bootstrap() as the bootstrap capability of every connection to a loopback
// listener, and returns its address.
func serve(t *testing.T, bootstrap func() capnp.Client) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conn := rpc.NewConn(rpc.NewStreamTransport(c), &rpc.Options{BootstrapClient: bootstrap()})
			t.Cleanup(func() { conn.Close() })
		}
	}()
	return ln.Addr().String()
}

// A Return whose results hold no capability says noFinishNeeded and the answer is forgotten as
// it is sent: a Finish for it is ignored, and a call pipelined on it that arrives after it fails
// alone. Unpatched, the Return asked for a Finish, and the late pipelined call aborted the
// whole connection ("use of unknown or finished answer ID").
func TestRPC_ResultsWithoutCapabilitiesNeedNoFinish(t *testing.T) {
	h := handle{calls: make(chan struct{}, 10)}
	nc, err := net.Dial("tcp", serveHandle(t, h))
	require.NoError(t, err)
	tr := transport.NewStream(nc)
	defer tr.Close()

	m, err := tr.NewMessage()
	require.NoError(t, err)
	b, err := m.Message().NewBootstrap()
	require.NoError(t, err)
	b.SetQuestionId(0)
	require.NoError(t, m.Send())
	m.Release()
	noFinish, _ := rawReturn(t, tr, 0)
	require.False(t, noFinish, "the bootstrap's results hold a capability: its Finish is needed")

	rawCall(t, tr, 1, nil)
	noFinish, exception := rawReturn(t, tr, 1)
	require.False(t, exception)
	require.True(t, noFinish, "results without capabilities need no Finish")

	one := uint32(1)
	rawCall(t, tr, 2, &one) // pipelined on answer 1, after its Return
	_, exception = rawReturn(t, tr, 2)
	require.True(t, exception, "a call on results without capabilities fails")

	fm, err := tr.NewMessage()
	require.NoError(t, err)
	fin, err := fm.Message().NewFinish()
	require.NoError(t, err)
	fin.SetQuestionId(1) // not needed, sent anyway: ignored
	require.NoError(t, fm.Send())
	fm.Release()

	rawCall(t, tr, 3, nil)
	_, exception = rawReturn(t, tr, 3)
	require.False(t, exception, "the connection still serves calls")
	require.Len(t, h.calls, 2)
}

// A go-capnp caller sends no Finish for a Return that says noFinishNeeded. The raw server below
// answers call A with the flag, then 20 more, then call B without it, and reads until B's
// Finish (sent 250 ms after B's Return, from a timer due after A's); then the client makes one
// more call, C, and every Finish sent by then has come. Only B's may be among them (and the
// bootstrap's). Unpatched, every call's came.
func TestRPC_CallerSendsNoFinishWhenNoneIsNeeded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	nc, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	conn := rpc.NewConn(rpc.NewStreamTransport(nc), nil)
	defer conn.Close()
	sc, err := ln.Accept()
	require.NoError(t, err)
	tr := transport.NewStream(sc)
	defer tr.Close()

	target := schema.Handle(conn.Bootstrap(ctx))
	defer target.Release()
	const calls = 22 // A, 20 more, B
	proceed := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		call := func() error {
			fut, release := target.Cancel(ctx, nil)
			defer release()
			_, err := fut.Struct()
			return err
		}
		for i := 0; i < calls; i++ {
			if err := call(); err != nil {
				done <- err
				return
			}
		}
		<-proceed
		done <- call() // C
	}()

	send := func(build func(rpccp.Message) error) {
		m, err := tr.NewMessage()
		require.NoError(t, err)
		defer m.Release()
		require.NoError(t, build(m.Message()))
		require.NoError(t, m.Send())
	}
	finishes := map[uint32]bool{}
	var bQ, bootstrapQ uint32
	answered := 0
	for answered <= calls {
		in, err := tr.RecvMessage()
		require.NoError(t, err)
		msg := in.Message()
		switch msg.Which() {
		case rpccp.Message_Which_bootstrap:
			bs, _ := msg.Bootstrap()
			q := bs.QuestionId()
			bootstrapQ = q
			send(func(m rpccp.Message) error {
				ret, err := m.NewReturn()
				if err != nil {
					return err
				}
				ret.SetAnswerId(q)
				p, err := ret.NewResults()
				if err != nil {
					return err
				}
				ct, err := p.NewCapTable(1)
				if err != nil {
					return err
				}
				ct.At(0).SetSenderHosted(0)
				return p.SetContent(capnp.NewInterface(p.Segment(), 0).ToPtr())
			})
		case rpccp.Message_Which_call:
			call, _ := msg.Call()
			q := call.QuestionId()
			answered++
			if answered == calls {
				bQ = q
			}
			send(func(m rpccp.Message) error {
				ret, err := m.NewReturn()
				if err != nil {
					return err
				}
				ret.SetAnswerId(q)
				ret.SetNoFinishNeeded(q != bQ)
				p, err := ret.NewResults()
				if err != nil {
					return err
				}
				st, err := capnp.NewStruct(p.Segment(), capnp.ObjectSize{})
				if err != nil {
					return err
				}
				return p.SetContent(st.ToPtr())
			})
		case rpccp.Message_Which_finish:
			f, _ := msg.Finish()
			finishes[f.QuestionId()] = true
			if answered == calls && f.QuestionId() == bQ {
				close(proceed)
			}
		}
		in.Release()
	}
	require.NoError(t, <-done)
	require.True(t, finishes[bQ], "B's Return asked for a Finish")
	delete(finishes, bQ)
	delete(finishes, bootstrapQ) // its results hold the capability
	require.Empty(t, finishes, "Finish sent for calls whose Return said noFinishNeeded")
}

// ctxHandle hands each call's context to the test.
type ctxHandle struct{ ctxs chan context.Context }

func (h ctxHandle) Cancel(ctx context.Context, _ schema.Handle_cancel) error {
	h.ctxs <- ctx
	return nil
}

// The context of a call answered with noFinishNeeded ends once its Return is sent, as a Finish
// would end it: no Finish comes to do so. With the noFinishNeeded patch alone it was never
// cancelled, so each such call left its context among the connection's until the connection
// ended: a long session's every append, read and acknowledgement grew the server by one.
func TestRPC_NoFinishNeededEndsTheCallsContext(t *testing.T) {
	h := ctxHandle{ctxs: make(chan context.Context, 1)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, err := net.Dial("tcp", serveHandle(t, h))
	require.NoError(t, err)
	conn := rpc.NewConn(rpc.NewStreamTransport(nc), nil)
	defer conn.Close()
	target := schema.Handle(conn.Bootstrap(ctx))
	defer target.Release()
	fut, release := target.Cancel(ctx, nil)
	_, err = fut.Struct()
	release()
	require.NoError(t, err)
	callCtx := <-h.ctxs
	select {
	case <-callCtx.Done():
	case <-time.After(10 * time.Second): // it ends at once; generous on a loaded machine
		t.Fatal("the call's context is still live after its Return said noFinishNeeded")
	}
}

// A call queued on an answer that never comes (an embargo whose Disembargo the peer never sends
// back while its connection stays up) is rejected when its context ends, and a call chained on it
// is rejected when the queue drains; the queue's later fulfillment does not deliver it.
// Unpatched, the caller waited forever whatever its context said (itxd's delivery to a Receiver
// so queued wedged its subscription: test/ TestItxd_HostileCalleeEmbargoHeld).
func TestAnswerQueue_QueuedCallEndsWithItsContext(t *testing.T) {
	aq := capnp.NewAnswerQueue(capnp.Method{})
	p := capnp.NewPromise(capnp.Method{}, aq, nil)
	target := schema.Handle(p.Answer().Field(0, nil).Client())
	ctx, cancel := context.WithCancel(context.Background())
	fut, release := target.Cancel(ctx, nil)
	defer release()
	chained := schema.Handle(fut.Field(0, nil).Client())
	fut2, release2 := chained.Cancel(context.Background(), nil)
	defer release2()
	kept, release3 := target.Cancel(context.Background(), nil)
	defer release3()
	cancel()
	done := make(chan error, 1)
	go func() { _, err := fut.Struct(); done <- err }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(5 * time.Second):
		t.Fatal("the queued call did not end with its context")
	}
	h := handle{calls: make(chan struct{}, 4)}
	st, msg := result(t, capnp.Client(schema.Handle_ServerToClient(h)))
	defer msg.Release()
	aq.Fulfill(st.ToPtr())
	_, err := kept.Struct()
	require.NoError(t, err, "the call whose context lives is delivered")
	_, err = fut2.Struct()
	require.Error(t, err, "the call chained on the cancelled one")
	require.Len(t, h.calls, 1, "the cancelled call was not delivered")
}

// answeredHook is a capability that answers a call before its delivery returns and gives no
// pipeline caller, as rpc's importClient.Recv and question.PipelineRecv do when the peer's
// answer is already back: its results hold target at field 0.
type answeredHook struct{ target capnp.Client }

func (h answeredHook) Send(_ context.Context, s capnp.Send) (*capnp.Answer, capnp.ReleaseFunc) {
	return capnp.ErrorAnswer(s.Method, errors.New("answeredHook: send")), func() {}
}

func (h answeredHook) Recv(_ context.Context, r capnp.Recv) capnp.PipelineCaller {
	r.ReleaseArgs()
	defer r.Returner.ReleaseResults()
	res, err := r.Returner.AllocResults(capnp.ObjectSize{PointerCount: 1})
	if err == nil {
		id := res.Message().CapTable().Add(h.target.AddRef())
		err = res.SetPtr(0, capnp.NewInterface(res.Segment(), id).ToPtr())
	}
	r.Returner.PrepareReturn(err)
	r.Returner.Return()
	return nil
}

func (h answeredHook) Brand() capnp.Brand { return capnp.Brand{} }
func (h answeredHook) Shutdown()          {}
func (h answeredHook) String() string     { return "answeredHook" }

// A call chained on a queued call that succeeded during its delivery (a capability of another
// connection whose answer was back at once) reaches the capability that call returned. The
// backport of upstream PR #617 rejected it with "pipeline call has no pipeline caller" (an
// internal error to itx's clients): seen under -race when a test's local project handed out
// itxd's streams and a chain went through them.
func TestAnswerQueue_ChainedOnCallAnsweredDuringDelivery(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := shutHandle{handle: handle{calls: make(chan struct{}, 1)}, shut: make(chan struct{})}
	target := capnp.Client(schema.Handle_ServerToClient(h))
	answered := capnp.NewClient(answeredHook{target: target})
	loginResult, loginMsg := result(t, answered)

	login := capnp.NewAnswerQueue(capnp.Method{})
	p := capnp.NewPromise(capnp.Method{}, login, nil)
	first := schema.Handle(p.Answer().Field(0, nil).Client())
	fut, release := first.Cancel(ctx, nil)
	chained := schema.Handle(fut.Field(0, nil).Client())
	fut2, release2 := chained.Cancel(ctx, nil)

	login.Fulfill(loginResult.ToPtr())
	_, err := fut.Struct()
	require.NoError(t, err)
	_, err = fut2.Struct()
	require.NoError(t, err, "the chained call reached the capability the first call returned")
	require.Len(t, h.calls, 1)

	// Nothing is kept alive: once the callers and the result let go, the capability shuts down.
	release2()
	release()
	chained.Release()
	first.Release()
	loginMsg.Release()
	target.Release()
	select {
	case <-h.shut:
	case <-ctx.Done():
		t.Fatal("the chained call's copy of the results kept the capability alive")
	}
}

// recordReturner records how a call returned.
type recordReturner struct {
	capnp.StructReturner
	err  error
	done chan struct{}
}

func newRecordReturner() *recordReturner { return &recordReturner{done: make(chan struct{})} }

func (r *recordReturner) PrepareReturn(e error) {
	r.err = e
	r.StructReturner.PrepareReturn(e)
}

func (r *recordReturner) Return() {
	r.StructReturner.Return()
	close(r.done)
}

// pipeliningReturner is the Returner of an RPC answer in miniature: its Return first lets the
// peer pipeline a call on the answer (pipeline, as the connection's receive loop would deliver
// one that arrived meanwhile) and then waits for every such call to be delivered, as rpc's
// ansReturner.Return does.
type pipeliningReturner struct {
	*recordReturner
	pipeline func(wg *sync.WaitGroup)
	wg       sync.WaitGroup
}

func (r *pipeliningReturner) Return() {
	r.pipeline(&r.wg)
	r.wg.Wait()
	r.recordReturner.Return()
}

// A queued call rejected on delivery, while the peer pipelines another call on it, answers
// both: the rejected call's Return waits for the pipelined call's delivery, which waits for
// the draining queue. Unpatched, the drain (inside that Return) and the pipelined call (waiting
// for the drain to end) waited on each other for good, and with them the connection's receive
// loop: TestRPC_RefusalReachesTheEndOfAChain hung under -race about 1 run in 10.
func TestAnswerQueue_CallPipelinedOnACallRejectedDuringTheDrain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msg, seg := capnp.NewSingleSegmentMessage(nil)
	st, err := capnp.NewRootStruct(seg, capnp.ObjectSize{PointerCount: 1}) // field 0: no capability
	require.NoError(t, err)
	defer msg.Release()

	aq := capnp.NewAnswerQueue(capnp.Method{})
	var onRejected capnp.PipelineCaller // the pipeline of the call that will be rejected
	pipelined := newRecordReturner()
	rejected := &pipeliningReturner{recordReturner: newRecordReturner(), pipeline: func(wg *sync.WaitGroup) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			onRejected.PipelineRecv(ctx, nil, capnp.Recv{ReleaseArgs: func() {}, Returner: pipelined})
		}()
	}}
	// Queued on field 0 of the queue's result, a null capability: rejected on delivery.
	onRejected = aq.PipelineRecv(ctx, []capnp.PipelineOp{{Field: 0}}, capnp.Recv{ReleaseArgs: func() {}, Returner: rejected})

	drained := make(chan struct{})
	go func() {
		defer close(drained)
		aq.Fulfill(st.ToPtr())
	}()
	for _, done := range []chan struct{}{drained, rejected.done, pipelined.done} {
		select {
		case <-done:
		case <-ctx.Done():
			t.Fatal("the drain never ended: it waits for a call pipelined on the call it rejected, which waits for the drain")
		}
	}
	require.ErrorContains(t, rejected.err, "null client")
	require.ErrorContains(t, pipelined.err, "null client", "the call pipelined on the rejected call is rejected with its error")
}

// makerMethod is a method that returns a Handle in field 0 of its results.
var makerMethod = capnp.Method{InterfaceID: 0xa0b1c2d3e4f50617, MethodID: 0, InterfaceName: "maker", MethodName: "make"}

// emptyArgs returns an empty arguments struct in a message of its own.
func emptyArgs(t *testing.T) capnp.Struct {
	t.Helper()
	_, seg := capnp.NewSingleSegmentMessage(nil)
	st, err := capnp.NewRootStruct(seg, capnp.ObjectSize{})
	require.NoError(t, err)
	return st
}

// A call forwarded to another connection (a capability imported from it, delivered a call
// through capnp.Recv, as an answer queue's drain or a local server forwarding does) gives a
// pipeline for the calls chained on it that works after its answer came back and was
// released. Unpatched, the pipeline was the answer itself, released once returned: a chained
// call then read its capability out of the freed results and panicked ('slice bounds out of
// range' in Transform; a data race under -race in TestAccAudit_MintedCapabilitiesEveryStreamMethod).
func TestRPC_ForwardedCallsPipelineOutlivesItsAnswer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := handle{calls: make(chan struct{}, 1)}
	maker := capnp.NewClient(server.New([]server.Method{{Method: makerMethod, Impl: func(ctx context.Context, call *server.Call) error {
		res, err := call.AllocResults(capnp.ObjectSize{PointerCount: 1})
		if err != nil {
			return err
		}
		id := res.Message().CapTable().Add(capnp.Client(schema.Handle_ServerToClient(h)))
		return res.SetPtr(0, capnp.NewInterface(res.Segment(), id).ToPtr())
	}}}, nil, nil))
	defer maker.Release()
	nc, err := net.Dial("tcp", serve(t, maker.AddRef))
	require.NoError(t, err)
	conn := rpc.NewConn(rpc.NewStreamTransport(nc), nil)
	defer conn.Close()
	remote := conn.Bootstrap(ctx)
	defer remote.Release()
	require.NoError(t, remote.Resolve(ctx))

	made := newRecordReturner()
	pipeline := remote.RecvCall(ctx, capnp.Recv{Method: makerMethod, Args: emptyArgs(t), ReleaseArgs: func() {}, Returner: made})
	<-made.done
	require.NoError(t, made.err)
	if pipeline == nil {
		t.Skip("the answer was back before the delivery returned: the answer queue's copy covers that (TestAnswerQueue_ChainedOnCallAnsweredDuringDelivery)")
	}
	// Wait for the forwarding goroutine to release the answer (it ends right after).
	for stillForwarding(t) {
		select {
		case <-ctx.Done():
			t.Fatal("the forwarded call's goroutine never ended")
		default:
			runtime.Gosched()
		}
	}

	cancelled := newRecordReturner()
	cancelMethod := capnp.Method{InterfaceID: schema.Handle_TypeID, MethodID: 0, InterfaceName: "Handle", MethodName: "cancel"}
	pipeline.PipelineRecv(ctx, []capnp.PipelineOp{{Field: 0}}, capnp.Recv{Method: cancelMethod, Args: emptyArgs(t), ReleaseArgs: func() {}, Returner: cancelled})
	select {
	case <-cancelled.done:
	case <-ctx.Done():
		t.Fatal("the chained call was never answered")
	}
	require.NoError(t, cancelled.err, "the chained call reached the capability the forwarded call returned")
	require.Len(t, h.calls, 1)
}

// stillForwarding reports whether a goroutine is still in rpc's returnAnswer.
func stillForwarding(t *testing.T) bool {
	var buf bytes.Buffer
	require.NoError(t, pprof.Lookup("goroutine").WriteTo(&buf, 1))
	return strings.Contains(buf.String(), "rpc.returnAnswer")
}
