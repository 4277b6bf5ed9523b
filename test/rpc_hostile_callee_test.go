package test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// itxd as the caller: a raw client hands itxd a capability (an EventSink to openConnection, a
// Receiver mounted under a name, a ProcessorHost mounted with a contract) and answers itxd's
// calls on it by hand, in ways a go-capnp server never does: results of the wrong shape,
// capability tables naming what does not exist, Return variants go-capnp does not implement,
// Returns for questions never asked or asked twice, huge exceptions, no Return at all, a late
// one, the connection cut mid-call. After each, itxd must be up, serve a new client, deliver on
// other streams, not have moved a durable cursor on anything but a valid Return, and (at the
// end) hold what it held before.

// The raw client's capability ids (senderHosted), as it names them in params.
const (
	rawSink     = 5
	rawReceiver = 6
	rawHost     = 7
)

// calleeEnv is a churn env with a well-behaved receiver mounted under "good" and an itx-call
// subscription delivering /callee/good to it: the other subscription that must keep delivering.
type calleeEnv struct {
	*churnEnv
	token string
	good  *receiverServer
	goodS schema.Stream
}

func newCalleeEnv(t *testing.T) *calleeEnv {
	e := &calleeEnv{churnEnv: newChurnEnv(t, server.Config{})}
	e.token = e.ts.creds.ProjectToken
	e.good = newReceiverServer()
	t.Cleanup(mountReceiver(t, e.ts.addr, e.token, "good", e.good))
	e.goodS = stream(t, e.watcher, "/callee/good")
	configureCall(t, e.goodS, "good", "good")
	return e
}

// requireHealthy: a new client appends and reads back, a connection on another stream delivers
// a new event, and the other subscription delivers one.
func (e *calleeEnv) requireHealthy(t *testing.T, what string) {
	t.Helper()
	requireServes(t, e.ts.addr, e.token, 0, []string{what})
	ctx := ctxT(t)
	other := stream(t, e.watcher, "/callee/other")
	sink := &orderedSink{}
	conn, err := churnOpenConn(ctx, other, sink)
	require.NoError(t, err, what)
	head := mustAppend(t, other, ev("other", `{}`)).HeadOffset
	waitUntil(t, what+": the other stream's connection delivers", func() bool {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		return len(sink.events) > 0 && sink.events[len(sink.events)-1] == head
	})
	conn.Release()
	other.Release()
	head = mustAppend(t, e.goodS, ev("good", `{}`)).HeadOffset
	waitUntil(t, what+": the other subscription delivers", func() bool {
		e.clock.Advance(time.Second) // past any backoff (nothing should be backing off)
		return describeSubIn(ctx, t, e.goodS, "good").ConfirmedOffset >= head
	})
}

// callee is a raw logged-in client answering itxd's calls on the capabilities it passed.
type callee struct {
	*loggedIn
	t *testing.T
	// reflectTo: the export of itxd's a promise was resolved to (a Disembargo's target).
	reflectTo uint32
}

func dialCallee(t *testing.T, e *calleeEnv, path string) *callee {
	return &callee{loggedIn: rawLogin(t, e.ts.addr, e.token, 0, path), t: t}
}

// nextCall reads until itxd calls method of iface on one of this client's capabilities,
// answering its other calls with empty results (look sees each call's message). ok is false if
// the connection ended (or was aborted) first.
func (c *callee) nextCall(iface uint64, method uint16, look func(rpccp.Message)) (call itxtest.Received, ok bool) {
	c.t.Helper()
	type got struct {
		m   itxtest.Received
		err error
	}
	for {
		ch := make(chan got, 1)
		go func() {
			m, err := c.r.RecvMsgWith(look)
			ch <- got{m, err}
		}()
		var g got
		select {
		case g = <-ch:
		case <-time.After(10 * time.Second):
			c.t.Fatalf("no call %x.%d from itxd in 10s", iface, method)
		}
		if g.err != nil || g.m.Which == rpccp.Message_Which_abort {
			return g.m, false
		}
		if os.Getenv("ITX_HOSTILE_TRACE") == "messages" {
			c.t.Logf("callee got %+v", g.m)
		}
		if g.m.Which != rpccp.Message_Which_call {
			continue
		}
		if g.m.Iface == iface && g.m.Method == method {
			return g.m, true
		}
		c.r.Return(g.m.Question, nil)
	}
}

// drain reads (answering itxd's calls with empty results) until the connection ends or for d,
// then closes it (no read is left running).
func (c *callee) drain(d time.Duration) { c.serveFor(d, nil, nil) }

// openConnection opens a connection on the stream (no state frames) with the client's sink.
func (c *callee) openConnection() uint32 {
	q := c.newQ()
	c.r.CallMsg(itxtest.RawCall{Q: q, Target: itxtest.OnAnswer(qStream, 0), Iface: schema.Stream_TypeID, Method: 8,
		Size: capnp.ObjectSize{PointerCount: 2},
		Caps: []func(rpccp.CapDescriptor) error{func(d rpccp.CapDescriptor) error { d.SetSenderHosted(rawSink); return nil }},
		Set: func(s capnp.Struct) error {
			o, err := schema.Stream_openConnection_Params(s).NewOptions()
			if err != nil {
				return err
			}
			o.SetNoState(true)
			return itxtest.CapPtr(s, 1, 0)
		}})
	return q
}

// mountReceiver mounts the client's Receiver under name.
func (c *callee) mountReceiver(name string) {
	caps, q := c.newQ(), c.newQ()
	c.r.CallMsg(itxtest.RawCall{Q: caps, Target: itxtest.OnAnswer(qLogin, 0), Iface: schema.Project_TypeID, Method: 1})
	c.r.CallMsg(itxtest.RawCall{Q: q, Target: itxtest.OnAnswer(caps, 0), Iface: schema.Capabilities_TypeID, Method: 0,
		Size: capnp.ObjectSize{PointerCount: 2},
		Caps: []func(rpccp.CapDescriptor) error{func(d rpccp.CapDescriptor) error { d.SetSenderHosted(rawReceiver); return nil }},
		Set: func(s capnp.Struct) error {
			if err := s.SetNewText(0, name); err != nil {
				return err
			}
			return itxtest.CapPtr(s, 1, 0)
		}})
}

// mountHost mounts the client's ProcessorHost under name, announcing contract.
func (c *callee) mountHost(name, contract string) {
	procs, q := c.newQ(), c.newQ()
	c.r.CallMsg(itxtest.RawCall{Q: procs, Target: itxtest.OnAnswer(qLogin, 0), Iface: schema.Project_TypeID, Method: 2})
	c.r.CallMsg(itxtest.RawCall{Q: q, Target: itxtest.OnAnswer(procs, 0), Iface: schema.ProcessorHosts_TypeID, Method: 0,
		Size: capnp.ObjectSize{PointerCount: 3},
		Caps: []func(rpccp.CapDescriptor) error{func(d rpccp.CapDescriptor) error { d.SetSenderHosted(rawHost); return nil }},
		Set: func(s capnp.Struct) error {
			p := schema.ProcessorHosts_mount_Params(s)
			if err := p.SetName(name); err != nil {
				return err
			}
			list, err := p.NewContracts(1)
			if err != nil {
				return err
			}
			if err := list.At(0).SetName(contract); err != nil {
				return err
			}
			if err := list.At(0).SetReducerVersion("1"); err != nil {
				return err
			}
			types, err := list.At(0).NewConsumedTypes(1)
			if err != nil {
				return err
			}
			if err := types.Set(0, "proc"); err != nil {
				return err
			}
			return itxtest.CapPtr(s, 1, 0)
		}})
}

// hostileAnswer answers itxd's question q in a way a go-capnp server never does. valid: the
// answer is a well-formed Return with results (itxd may take it as an acknowledgement).
type hostileAnswer struct {
	name  string
	valid bool
	send  func(c *callee, q uint32)
}

func hostileAnswers() []hostileAnswer {
	return []hostileAnswer{
		{"results: a text where a struct belongs", false, func(c *callee, q uint32) {
			c.r.Return(q, func(ret rpccp.Return) error {
				res, err := ret.NewResults()
				if err != nil {
					return err
				}
				return res.SetContent(must(capnp.NewText(res.Segment(), "not a struct")).ToPtr())
			})
		}},
		{"results: a list where a struct belongs", false, func(c *callee, q uint32) {
			c.r.Return(q, func(ret rpccp.Return) error {
				res, err := ret.NewResults()
				if err != nil {
					return err
				}
				l, err := capnp.NewUInt64List(res.Segment(), 4)
				if err != nil {
					return err
				}
				l.Set(0, 1<<40)
				return res.SetContent(l.ToPtr())
			})
		}},
		{"results: a capability where a struct belongs", false, func(c *callee, q uint32) {
			c.r.Return(q, func(ret rpccp.Return) error {
				res, err := ret.NewResults()
				if err != nil {
					return err
				}
				table, err := res.NewCapTable(1)
				if err != nil {
					return err
				}
				table.At(0).SetSenderHosted(40)
				return res.SetContent(capnp.NewInterface(res.Segment(), 0).ToPtr())
			})
		}},
		{"results: no content", true, func(c *callee, q uint32) { c.r.Return(q, nil) }},
		{"results: an oversized struct", true, func(c *callee, q uint32) {
			c.r.ReturnResults(q, capnp.ObjectSize{DataSize: 4096, PointerCount: 64}, func(s capnp.Struct) error {
				return s.SetNewText(63, strings.Repeat("x", 1<<12))
			})
		}},
		{"results: a table of bogus capabilities", true, func(c *callee, q uint32) {
			c.r.ReturnResults(q, capnp.ObjectSize{DataSize: 8}, nil,
				func(d rpccp.CapDescriptor) error { d.SetSenderHosted(^uint32(0)); return nil },
				func(d rpccp.CapDescriptor) error { d.SetSenderPromise(1 << 30); return nil },
				func(d rpccp.CapDescriptor) error { d.SetNone(); return nil })
		}},
		{"results: a table naming itxd's bogus exports", false, func(c *callee, q uint32) {
			c.r.ReturnResults(q, capnp.ObjectSize{DataSize: 8}, nil,
				func(d rpccp.CapDescriptor) error { d.SetReceiverHosted(1 << 20); return nil })
		}},
		{"results: a table naming a bogus answer", false, func(c *callee, q uint32) {
			c.r.ReturnResults(q, capnp.ObjectSize{DataSize: 8}, nil,
				func(d rpccp.CapDescriptor) error {
					pa, err := d.NewReceiverAnswer()
					pa.SetQuestionId(1 << 20)
					return err
				})
		}},
		// Unreferenced by the (empty, well-formed) results: go-capnp ignores the entry.
		{"results: a third-party capability", true, func(c *callee, q uint32) {
			c.r.ReturnResults(q, capnp.ObjectSize{DataSize: 8}, nil,
				func(d rpccp.CapDescriptor) error { _, err := d.NewThirdPartyHosted(); return err })
		}},
		{"canceled", false, func(c *callee, q uint32) {
			c.r.Return(q, func(ret rpccp.Return) error { ret.SetCanceled(); return nil })
		}},
		{"resultsSentElsewhere", false, func(c *callee, q uint32) {
			c.r.Return(q, func(ret rpccp.Return) error { ret.SetResultsSentElsewhere(); return nil })
		}},
		{"takeFromOtherQuestion never asked", false, func(c *callee, q uint32) {
			c.r.Return(q, func(ret rpccp.Return) error { ret.SetTakeFromOtherQuestion(1 << 20); return nil })
		}},
		{"takeFromOtherQuestion its own login", false, func(c *callee, q uint32) {
			c.r.Return(q, func(ret rpccp.Return) error { ret.SetTakeFromOtherQuestion(qLogin); return nil })
		}},
		{"awaitFromThirdParty (acceptFromThirdParty)", false, func(c *callee, q uint32) {
			c.r.Return(q, func(ret rpccp.Return) error { return ret.SetAwaitFromThirdParty(capnp.Ptr{}) })
		}},
		// The union's default is results, and a null results pointer is the empty payload: on
		// the wire, the same as "no content".
		{"unset union", true, func(c *callee, q uint32) {
			c.r.Send(func(m rpccp.Message) error {
				ret, err := m.NewReturn()
				ret.SetAnswerId(q)
				return err
			})
		}},
		{"a huge exception", false, func(c *callee, q uint32) {
			c.r.Return(q, func(ret rpccp.Return) error {
				e, err := ret.NewException()
				if err != nil {
					return err
				}
				return e.SetReason("itx.invalid: " + strings.Repeat("x", 1<<20))
			})
		}},
		{"a Return for a question never asked, first", false, func(c *callee, q uint32) {
			c.r.Return(q+1000, nil)
		}},
		{"two Returns", true, func(c *callee, q uint32) {
			c.r.Return(q, nil)
			c.r.Return(q, nil)
		}},
		{"a Return, then one for the question the call was pipelined on", true, func(c *callee, q uint32) {
			c.r.Return(q, nil)
			c.r.Return(qStream, nil)
		}},
	}
}

// calleeRounds is how many times the answer tables run (ITX_HOSTILE_ROUNDS for longer runs:
// timing differs from round to round, the tables do not).
func calleeRounds() int {
	if v, err := strconv.Atoi(os.Getenv("ITX_HOSTILE_ROUNDS")); err == nil && v > 0 {
		return v
	}
	return 1
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// The EventSink of a connection answers its first deliver in a hostile way; the raw client
// then answers the rest well until the connection ends or a moment passes.
func TestItxd_HostileCalleeSink(t *testing.T) {
	e := newCalleeEnv(t)
	s := stream(t, e.watcher, "/callee/conn")
	mustAppend(t, s, ev("seed", `{}`))
	e.requireHealthy(t, "setup")
	base := e.baseline(t)
	for round := range calleeRounds() {
		for _, h := range hostileAnswers() {
			t.Run(fmt.Sprintf("%s/%d", h.name, round), func(t *testing.T) {
				c := dialCallee(t, e, "/callee/conn")
				c.openConnection()
				call, ok := c.nextCall(schema.EventSink_TypeID, 0, nil)
				require.True(t, ok, "no deliver")
				h.send(c, call.Question)
				mustAppend(t, s, ev("more", `{}`))
				c.drain(80 * time.Millisecond)
				c.r.Close()
				e.requireHealthy(t, h.name)
			})
		}
	}
	e.requireBack(t, base, calleeRounds()*len(hostileAnswers()))
}

// A mounted Receiver answers an itx-call subscription's delivery in a hostile way. Only a valid
// Return may move the subscription's cursor; after it, a well-behaved receiver mounted under the
// same name gets what was not acknowledged.
func TestItxd_HostileCalleeReceiver(t *testing.T) {
	e := newCalleeEnv(t)
	s := stream(t, e.watcher, "/callee/recv")
	configureCall(t, s, "evil", "evil")
	e.requireHealthy(t, "setup")
	base := e.baseline(t)
	ctx := ctxT(t)
	for round := range calleeRounds() {
		for _, h := range hostileAnswers() {
			t.Run(fmt.Sprintf("%s/%d", h.name, round), func(t *testing.T) {
				before := describeSubIn(ctx, t, s, "evil").ConfirmedOffset
				head := mustAppend(t, s, ev("evil", `{}`)).HeadOffset
				c := dialCallee(t, e, "/callee/recv")
				c.mountReceiver("evil")
				call, ok := c.nextCall(schema.Receiver_TypeID, 0, nil)
				require.True(t, ok, "no receive")
				h.send(c, call.Question)
				c.drain(80 * time.Millisecond)
				d := describeSubIn(ctx, t, s, "evil")
				if !h.valid {
					require.Equal(t, before, d.ConfirmedOffset, "the cursor moved on an answer that is no acknowledgement (%+v)", d)
				}
				require.LessOrEqual(t, len(d.LastError), itx.MaxCursorErrorLength+64, "the receiver's error is kept bounded")
				c.r.Close()
				// The same name mounted again by a well-behaved receiver gets what was not taken.
				r := newReceiverServer()
				disconnect := mountReceiver(t, e.ts.addr, e.token, "evil", r)
				waitUntil(t, "delivered to the receiver mounted again", func() bool {
					e.clock.Advance(2 * time.Second)
					return describeSubIn(ctx, t, s, "evil").ConfirmedOffset >= head
				})
				disconnect()
				waitUntil(t, "unmounted", func() bool { return len(e.ts.srv.Mounts("default")) == 1 })
				e.requireHealthy(t, h.name)
			})
		}
	}
	e.requireBack(t, base, calleeRounds()*len(hostileAnswers()))
}

// waitSub polls the subscription's state (moving the test clock by step each time) until ok.
func (e *calleeEnv) waitSub(t *testing.T, s schema.Stream, name, what string, step time.Duration, ok func(d itx.SubscriptionDescription) bool) itx.SubscriptionDescription {
	t.Helper()
	ctx := ctxT(t)
	var d itx.SubscriptionDescription
	waitUntil(t, what, func() bool {
		e.clock.Advance(step)
		d = describeSubIn(ctx, t, s, name)
		return ok(d)
	})
	return d
}

// Timing and a vanishing peer: a Receiver that never answers (itxd times out and retries with
// backoff, and the Return that comes after it gave up acknowledges nothing), one that answers
// two deliveries out of order, one whose connection ends mid-call (closed, or after half a
// frame), each followed by a well-behaved receiver mounted under the same name.
func TestItxd_HostileCalleeReceiverTiming(t *testing.T) {
	e := newCalleeEnv(t)
	s := stream(t, e.watcher, "/callee/late")
	configureCall(t, s, "late", "late")
	e.requireHealthy(t, "setup")
	base := e.baseline(t)
	ctx := ctxT(t)
	remount := func(t *testing.T, head int64) {
		r := newReceiverServer()
		disconnect := mountReceiver(t, e.ts.addr, e.token, "late", r)
		e.waitSub(t, s, "late", "delivered to the receiver mounted again", 2*time.Second, func(d itx.SubscriptionDescription) bool {
			return d.ConfirmedOffset >= head
		})
		disconnect()
		waitUntil(t, "unmounted", func() bool { return len(e.ts.srv.Mounts("default")) == 1 })
	}
	cases := []struct {
		name string
		run  func(t *testing.T, c *callee, q uint32, before int64)
	}{
		{"never, then late", func(t *testing.T, c *callee, q uint32, before int64) {
			d := e.waitSub(t, s, "late", "the delivery timed out", time.Second, func(d itx.SubscriptionDescription) bool { return d.Attempt > 0 })
			require.Equal(t, before, d.ConfirmedOffset)
			require.Contains(t, d.LastError, "timed out")
			c.r.Return(q, nil) // after itxd gave up (and finished the question)
			// The retry comes to the same receiver (left unanswered); the late Return moved
			// nothing.
			stop := make(chan struct{})
			go func() { // past the retry's backoff
				for {
					select {
					case <-stop:
						return
					case <-time.After(5 * time.Millisecond):
						e.clock.Advance(time.Second)
					}
				}
			}()
			retry, ok := c.nextCall(schema.Receiver_TypeID, 0, nil)
			close(stop)
			require.True(t, ok, "no retry: %+v", retry)
			require.Equal(t, before, describeSubIn(ctx, t, s, "late").ConfirmedOffset, "a late Return acknowledged")
		}},
		{"closed mid-call", func(t *testing.T, c *callee, q uint32, before int64) {
			c.r.Close()
			e.waitSub(t, s, "late", "the delivery failed", 0, func(d itx.SubscriptionDescription) bool { return d.LastError != "" })
			require.Equal(t, before, describeSubIn(ctx, t, s, "late").ConfirmedOffset)
		}},
		{"half a frame, then closed", func(t *testing.T, c *callee, q uint32, before int64) {
			// A frame header for one segment of 64 words, and 16 bytes of it.
			require.NoError(t, c.r.WriteRaw([]byte{0, 0, 0, 0, 64, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}))
			time.Sleep(20 * time.Millisecond)
			c.r.Close()
			e.waitSub(t, s, "late", "the delivery failed", 0, func(d itx.SubscriptionDescription) bool { return d.LastError != "" })
			require.Equal(t, before, describeSubIn(ctx, t, s, "late").ConfirmedOffset)
		}},
		{"half a frame, held open", func(t *testing.T, c *callee, q uint32, before int64) {
			require.NoError(t, c.r.WriteRaw([]byte{0, 0, 0, 0, 64, 0, 0, 0, 1, 2, 3, 4}))
			d := e.waitSub(t, s, "late", "the delivery timed out", time.Second, func(d itx.SubscriptionDescription) bool { return d.Attempt > 0 })
			require.Equal(t, before, d.ConfirmedOffset)
		}},
		{"a Return for another connection's question", func(t *testing.T, c *callee, q uint32, before int64) {
			// Another raw client (which itxd never called) returns this question id.
			o := dialCallee(t, e, "/callee/late")
			o.r.Return(q, nil)
			o.drain(100 * time.Millisecond)
			o.r.Close()
			require.Equal(t, before, describeSubIn(ctx, t, s, "late").ConfirmedOffset)
			c.r.Return(q, func(ret rpccp.Return) error {
				e, err := ret.NewException()
				if err != nil {
					return err
				}
				return e.SetReason("itx.unavailable: not now")
			})
			e.waitSub(t, s, "late", "the delivery failed", 0, func(d itx.SubscriptionDescription) bool { return d.LastError != "" })
			require.Equal(t, before, describeSubIn(ctx, t, s, "late").ConfirmedOffset)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := describeSubIn(ctx, t, s, "late").ConfirmedOffset
			head := mustAppend(t, s, ev("late", `{}`)).HeadOffset
			c := dialCallee(t, e, "/callee/late")
			c.mountReceiver("late")
			call, ok := c.nextCall(schema.Receiver_TypeID, 0, nil)
			require.True(t, ok, "no receive")
			tc.run(t, c, call.Question, before)
			c.r.Close()
			remount(t, head)
			e.requireHealthy(t, tc.name)
		})
	}
	e.requireBack(t, base, len(cases))
}

// An EventSink that never accepts a batch: itxd closes the connection (slowConsumer) after its
// delivery timeout; one that answers two batches in the reverse order; one whose connection
// ends with half a frame. The stream keeps serving, and nothing stays behind.
func TestItxd_HostileCalleeSinkTiming(t *testing.T) {
	e := newCalleeEnv(t)
	s := stream(t, e.watcher, "/callee/slow")
	mustAppend(t, s, ev("seed", `{}`))
	e.requireHealthy(t, "setup")
	base := e.baseline(t)
	m := e.ts.srv.Metrics()
	cases := []struct {
		name string
		run  func(t *testing.T, c *callee, q uint32)
	}{
		{"never", func(t *testing.T, c *callee, q uint32) {
			var why []string
			var mu sync.Mutex
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					m, err := c.r.RecvMsgWith(func(msg rpccp.Message) {
						if msg.Which() != rpccp.Message_Which_call {
							return
						}
						call, _ := msg.Call()
						if call.InterfaceId() == schema.EventSink_TypeID && call.MethodId() == 1 {
							p, _ := call.Params()
							content, _ := p.Content()
							mu.Lock()
							why = append(why, schema.EventSink_closed_Params(content.Struct()).Why().String())
							mu.Unlock()
						}
					})
					if err != nil || m.Which == rpccp.Message_Which_abort {
						return
					}
				}
			}()
			waitUntil(t, "closed slowConsumer", func() bool {
				e.clock.Advance(time.Second)
				mu.Lock()
				defer mu.Unlock()
				return len(why) > 0
			})
			require.Equal(t, []string{"slowConsumer"}, why)
			c.r.Return(q, nil) // late
			c.r.Close()
			<-done
		}},
		{"out of order", func(t *testing.T, c *callee, q uint32) {
			mustAppend(t, s, ev("more", `{}`))
			second, ok := c.nextCall(schema.EventSink_TypeID, 0, nil)
			require.True(t, ok)
			c.r.Return(second.Question, nil)
			c.r.Return(q, nil)
			mustAppend(t, s, ev("more", `{}`))
			third, ok := c.nextCall(schema.EventSink_TypeID, 0, nil)
			require.True(t, ok, "the connection delivers on")
			c.r.Return(third.Question, nil)
		}},
		{"half a frame, then closed", func(t *testing.T, c *callee, q uint32) {
			require.NoError(t, c.r.WriteRaw([]byte{0, 0, 0, 0, 64, 0, 0, 0, 1, 2, 3}))
			c.r.Close()
		}},
		{"half a frame, held open", func(t *testing.T, c *callee, q uint32) {
			require.NoError(t, c.r.WriteRaw([]byte{0, 0, 0, 0, 64, 0, 0, 0, 1, 2, 3}))
			conns := testutil.ToFloat64(m.OpenConnections)
			waitUntil(t, "the connection closed", func() bool {
				e.clock.Advance(time.Second)
				return testutil.ToFloat64(m.OpenConnections) < conns
			})
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dialCallee(t, e, "/callee/slow")
			c.openConnection()
			call, ok := c.nextCall(schema.EventSink_TypeID, 0, nil)
			require.True(t, ok, "no deliver")
			tc.run(t, c, call.Question)
			c.r.Close()
			e.requireHealthy(t, tc.name)
		})
	}
	e.requireBack(t, base, len(cases))
}

// wakeCall is a wake itxd sent the raw host: its question, the request's head, and the ids
// itxd exported for the request's stream and ports.
type wakeCall struct {
	q             uint32
	head          uint64
	stream, ports uint32
}

func (c *callee) nextWake() (wakeCall, bool) {
	c.t.Helper()
	var w wakeCall
	var streamIdx, portsIdx int = -1, -1
	call, ok := c.nextCall(schema.ProcessorHost_TypeID, 0, func(m rpccp.Message) {
		if m.Which() != rpccp.Message_Which_call {
			return
		}
		call, _ := m.Call()
		if call.InterfaceId() != schema.ProcessorHost_TypeID || call.MethodId() != 0 {
			return
		}
		p, _ := call.Params()
		content, _ := p.Content()
		req, _ := schema.ProcessorHost_wake_Params(content.Struct()).Request()
		w.head = req.HeadOffset()
		sp, _ := capnp.Struct(req).Ptr(6)
		pp, _ := capnp.Struct(req).Ptr(7)
		streamIdx, portsIdx = int(sp.Interface().Capability()), int(pp.Interface().Capability())
	})
	if !ok {
		return w, false
	}
	require.Greater(c.t, len(call.Exports), max(streamIdx, portsIdx), "the wake's capabilities")
	w.q, w.stream, w.ports = call.Question, call.Exports[streamIdx], call.Exports[portsIdx]
	return w, true
}

// report answers a wake with a report of processed and reduced offsets.
func (c *callee) report(q uint32, processed, reduced uint64) {
	c.r.ReturnResults(q, capnp.ObjectSize{PointerCount: 1}, func(s capnp.Struct) error {
		r, err := schema.ProcessorHost_wake_Results(s).NewReport()
		r.SetProcessedOffset(processed)
		r.SetReducedOffset(reduced)
		return err
	})
}

// A raw ProcessorHost answers wakes with bogus reports, a huge or invalid runtime state, and
// misuses the ProcessorPorts itxd passed it after the wake returned: commits with a bogus
// generation, releases it twice, passes it back to itxd as an EventSink. The subscription's
// cursor never passes the head, the processor's progress record is only what a valid commit
// wrote (nothing here), and a well-behaved host mounted after it runs the processor.
func TestItxd_HostileCalleeProcessorHost(t *testing.T) {
	e := newCalleeEnv(t)
	s := stream(t, e.watcher, "/callee/proc")
	configureInstance(t, s, "rawproc", "", "remote")
	e.requireHealthy(t, "setup")
	base := e.baseline(t)
	ctx := ctxT(t)
	const huge = ^uint64(0)
	cases := []struct {
		name string
		run  func(t *testing.T, c *callee, w wakeCall)
	}{
		{"processed beyond the head", func(t *testing.T, c *callee, w wakeCall) {
			c.report(w.q, w.head+1000, w.head+1000)
		}},
		{"processed 2^64-1", func(t *testing.T, c *callee, w wakeCall) { c.report(w.q, huge, huge) }},
		{"processed 2^63", func(t *testing.T, c *callee, w wakeCall) { c.report(w.q, 1<<63, 1<<63) }},
		{"processed 0", func(t *testing.T, c *callee, w wakeCall) { c.report(w.q, 0, 0) }},
		{"a text for the report", func(t *testing.T, c *callee, w wakeCall) {
			c.r.ReturnResults(w.q, capnp.ObjectSize{PointerCount: 1}, func(s capnp.Struct) error { return s.SetNewText(0, "done") })
		}},
		{"a huge exception", func(t *testing.T, c *callee, w wakeCall) {
			hostileAnswers()[len(hostileAnswers())-4].send(c, w.q)
		}},
		{"ports used after the wake, released twice, passed back", func(t *testing.T, c *callee, w wakeCall) {
			c.report(w.q, w.head, w.head)
			// commit with a generation never claimed, a claim, kvPut, setAlarm far off
			q1, q2, q3, q4 := c.newQ(), c.newQ(), c.newQ(), c.newQ()
			c.r.CallMsg(itxtest.RawCall{Q: q1, Target: itxtest.OnImport(w.ports), Iface: schema.ProcessorPorts_TypeID, Method: 1,
				Size: capnp.ObjectSize{DataSize: 8, PointerCount: 2}, Set: func(s capnp.Struct) error {
					p := schema.ProcessorPorts_commit_Params(s)
					p.SetGeneration(1 << 62)
					if err := p.SetName("rawproc"); err != nil {
						return err
					}
					return p.SetProgress(`{"processedOffset":99999}`)
				}})
			c.r.CallMsg(itxtest.RawCall{Q: q2, Target: itxtest.OnImport(w.ports), Iface: schema.ProcessorPorts_TypeID, Method: 4,
				Size: capnp.ObjectSize{DataSize: 8}, Set: func(s capnp.Struct) error {
					schema.ProcessorPorts_setAlarm_Params(s).SetAt(-1)
					return nil
				}})
			// Passed back as the sink of a connection: itxd calls deliver on its own ports.
			c.r.CallMsg(itxtest.RawCall{Q: q3, Target: itxtest.OnImport(w.stream), Iface: schema.Stream_TypeID, Method: 8,
				Size: capnp.ObjectSize{PointerCount: 2},
				Caps: []func(rpccp.CapDescriptor) error{func(d rpccp.CapDescriptor) error { d.SetReceiverHosted(w.ports); return nil }},
				Set:  func(s capnp.Struct) error { return itxtest.CapPtr(s, 1, 0) }})
			// And as a LiveSubscriber.
			c.r.CallMsg(itxtest.RawCall{Q: q4, Target: itxtest.OnImport(w.stream), Iface: schema.Stream_TypeID, Method: 10,
				Size: capnp.ObjectSize{PointerCount: 1},
				Caps: []func(rpccp.CapDescriptor) error{func(d rpccp.CapDescriptor) error { d.SetReceiverHosted(w.ports); return nil }},
				Set:  func(s capnp.Struct) error { return itxtest.CapPtr(s, 0, 0) }})
			mustAppend(t, s, ev("more", `{}`))
			c.drain(80 * time.Millisecond)
			for range 2 {
				c.r.Send(func(m rpccp.Message) error {
					rel, err := m.NewRelease()
					rel.SetId(w.ports)
					rel.SetReferenceCount(1)
					return err
				})
			}
			c.r.CallMsg(itxtest.RawCall{Q: c.newQ(), Target: itxtest.OnImport(w.ports), Iface: schema.ProcessorPorts_TypeID, Method: 2,
				Size: capnp.ObjectSize{PointerCount: 1}, Set: func(s capnp.Struct) error { return s.SetNewText(0, "k") }})
		}},
		{"runtime state huge and not JSON", func(t *testing.T, c *callee, w wakeCall) {
			_, p := processorOf(t, s, "rawproc")
			errc := make(chan error, 1)
			go func() { _, err := client.RuntimeState(ctx, p); errc <- err }()
			call, ok := c.nextCall(schema.ProcessorHost_TypeID, 1, nil)
			require.True(t, ok)
			c.r.ReturnResults(call.Question, capnp.ObjectSize{PointerCount: 1}, func(s capnp.Struct) error {
				return s.SetNewText(0, "{"+strings.Repeat("x", 4<<20))
			})
			select {
			case err := <-errc:
				require.Error(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("getRuntimeState did not end")
			}
			c.report(w.q, w.head, w.head)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			head := mustAppend(t, s, ev("proc", `{}`)).HeadOffset
			c := dialCallee(t, e, "/callee/proc")
			c.mountHost("rawhost", "rawproc")
			w, ok := c.nextWake()
			require.True(t, ok, "no wake")
			tc.run(t, c, w)
			c.drain(80 * time.Millisecond)
			d := describeSubIn(ctx, t, s, "rawproc")
			require.LessOrEqual(t, d.ConfirmedOffset, d.HeadOffset, "the cursor passed the head: %+v", d)
			_, p := processorOf(t, s, "rawproc")
			snap, err := client.Snapshot(ctx, p)
			require.NoError(t, err)
			require.Zero(t, snap.ProcessedOffset, "progress recorded without a valid commit")
			c.r.Close()
			waitUntil(t, "unmounted", func() bool { return len(e.ts.srv.ProcessorHostMounts("default")) == 0 })
			e.requireHealthy(t, tc.name)
			_ = head
		})
	}
	e.requireBack(t, base, len(cases))
}

// serveFor reads for d (or until the connection ends), handing each message to look and each
// call of itxd's to onCall (nil: answered with empty results).
func (c *callee) serveFor(d time.Duration, look func(rpccp.Message), onCall func(itxtest.Received)) {
	done := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			m, err := c.r.RecvMsgWith(look)
			if err != nil || m.Which == rpccp.Message_Which_abort {
				return
			}
			if m.Which == rpccp.Message_Which_call {
				if onCall != nil {
					onCall(m)
				} else {
					c.r.Return(m.Question, nil)
				}
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(d):
		close(stop)
		c.r.Close() // ends the read
		<-done
	}
}

// disembargoOf returns the senderLoopback embargo ids itxd sends, through look.
func disembargoOf(mu *sync.Mutex, ids *[]uint32) func(rpccp.Message) {
	return func(m rpccp.Message) {
		if m.Which() != rpccp.Message_Which_disembargo {
			return
		}
		d, _ := m.Disembargo()
		if d.Context().Which() == rpccp.Disembargo_context_Which_senderLoopback {
			mu.Lock()
			*ids = append(*ids, d.Context().SenderLoopback())
			mu.Unlock()
		}
	}
}

// The capability passed is a promise the raw client resolves while itxd's call on it is in
// flight: to another promise and then to a capability of its own, to an exception, or to one
// of itxd's own capabilities (the embargo path), with itxd's Disembargo reflected never, twice,
// with a wrong id, or properly. The in-flight call is answered after the resolution; a valid
// Return for it may acknowledge, nothing else may.
func TestItxd_HostileCalleePromise(t *testing.T) {
	e := newCalleeEnv(t)
	s := stream(t, e.watcher, "/callee/promise")
	configureCall(t, s, "prom", "prom")
	mustAppend(t, s, ev("seed", `{}`))
	e.requireHealthy(t, "setup")
	base := e.baseline(t)
	ctx := ctxT(t)
	const p1, p2 = 100, 101
	type reflect int
	const (
		never reflect = iota
		twice
		wrongID
		properly
	)
	// toItxds resolves p1 to the capability itxd exported in its answer to question q, and
	// remembers it as the target a Disembargo is reflected to.
	toItxds := func(q uint32) func(c *callee) {
		return func(c *callee) {
			c.resolve(p1, func(d rpccp.CapDescriptor) error {
				c.reflectTo = c.exports[q][0]
				d.SetReceiverHosted(c.reflectTo)
				return nil
			})
		}
	}
	cases := []struct {
		name    string
		sink    bool // an EventSink to openConnection, else a Receiver mounted as "prom"
		resolve func(c *callee)
		reflect reflect
	}{
		{"receiver: to another promise, then its own", false, func(c *callee) {
			c.resolve(p1, func(d rpccp.CapDescriptor) error { d.SetSenderPromise(p2); return nil })
			c.resolve(p2, func(d rpccp.CapDescriptor) error { d.SetSenderHosted(rawReceiver); return nil })
		}, properly},
		{"receiver: to an exception", false, func(c *callee) { c.resolve(p1, nil) }, properly},
		{"receiver: to itxd's stream, never reflected", false, toItxds(qStream), never},
		{"receiver: to itxd's stream, reflected twice", false, toItxds(qStream), twice},
		{"receiver: to itxd's project, wrong id", false, toItxds(qLogin), wrongID},
		{"receiver: to the promise of itxd's answer", false, func(c *callee) {
			c.resolve(p1, func(d rpccp.CapDescriptor) error {
				pa, err := d.NewReceiverAnswer()
				pa.SetQuestionId(qStreams)
				return err
			})
		}, properly},
		{"sink: to another promise, then its own", true, func(c *callee) {
			c.resolve(p1, func(d rpccp.CapDescriptor) error { d.SetSenderPromise(p2); return nil })
			c.resolve(p2, func(d rpccp.CapDescriptor) error { d.SetSenderHosted(rawSink); return nil })
		}, properly},
		{"sink: to its own connection", true, toItxds(qStream + 100), properly},
		{"sink: to itxd's stream, never reflected", true, toItxds(qStream), never},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := describeSubIn(ctx, t, s, "prom").ConfirmedOffset
			head := mustAppend(t, s, ev("prom", `{}`)).HeadOffset
			c := dialCallee(t, e, "/callee/promise")
			more := func() { // a second delivery, to what the promise resolved to
				_, _ = client.Append(ctx, s, []itx.EventInput{ev("prom", `{}`)}, itx.AppendOptions{})
			}
			promise := []func(rpccp.CapDescriptor) error{func(d rpccp.CapDescriptor) error { d.SetSenderPromise(p1); return nil }}
			iface := uint64(schema.Receiver_TypeID)
			if tc.sink {
				iface = schema.EventSink_TypeID
				q := c.newQ()
				c.r.CallMsg(itxtest.RawCall{Q: q, Target: itxtest.OnAnswer(qStream, 0), Iface: schema.Stream_TypeID, Method: 8,
					Size: capnp.ObjectSize{PointerCount: 2}, Caps: promise,
					Set: func(s capnp.Struct) error {
						o, err := schema.Stream_openConnection_Params(s).NewOptions()
						if err != nil {
							return err
						}
						o.SetNoState(true)
						return itxtest.CapPtr(s, 1, 0)
					}})
				// The connection's export, from its Return (read below, before the deliver).
				var conn []uint32
				call, ok := c.nextCall(iface, 0, func(m rpccp.Message) {
					if m.Which() == rpccp.Message_Which_return {
						ret, _ := m.Return()
						if ret.AnswerId() == q {
							res, _ := ret.Results()
							table, _ := res.CapTable()
							if table.Len() > 0 {
								conn = append(conn, table.At(0).SenderHosted())
							}
						}
					}
				})
				require.True(t, ok, "no deliver")
				for len(conn) == 0 { // the Return came after the deliver: its export is read here
					m, err := c.r.RecvMsg()
					require.NoError(t, err)
					require.NotEqual(t, rpccp.Message_Which_abort, m.Which, "aborted: %s", m.Reason)
					if m.Which == rpccp.Message_Which_return && m.Answer == q {
						require.NotEmpty(t, m.Exports, "openConnection returned no connection: %s", m.Reason)
						conn = m.Exports[:1]
					}
				}
				c.exports[qStream+100] = conn
				c.runPromise(t, call, tc.resolve, int(tc.reflect), more)
			} else {
				caps, q := c.newQ(), c.newQ()
				c.r.CallMsg(itxtest.RawCall{Q: caps, Target: itxtest.OnAnswer(qLogin, 0), Iface: schema.Project_TypeID, Method: 1})
				c.r.CallMsg(itxtest.RawCall{Q: q, Target: itxtest.OnAnswer(caps, 0), Iface: schema.Capabilities_TypeID, Method: 0,
					Size: capnp.ObjectSize{PointerCount: 2}, Caps: promise,
					Set: func(s capnp.Struct) error {
						if err := s.SetNewText(0, "prom"); err != nil {
							return err
						}
						return itxtest.CapPtr(s, 1, 0)
					}})
				call, ok := c.nextCall(iface, 0, nil)
				require.True(t, ok, "no receive")
				c.runPromise(t, call, tc.resolve, int(tc.reflect), more)
			}
			if !tc.sink {
				d := describeSubIn(ctx, t, s, "prom")
				require.True(t, d.ConfirmedOffset == before || d.ConfirmedOffset == head || d.ConfirmedOffset == head+1,
					"the cursor at %d (before %d, head %d)", d.ConfirmedOffset, before, head)
				head++
				r := newReceiverServer()
				disconnect := mountReceiver(t, e.ts.addr, e.token, "prom", r)
				e.waitSub(t, s, "prom", "delivered to the receiver mounted again", 2*time.Second, func(d itx.SubscriptionDescription) bool {
					return d.ConfirmedOffset >= head || d.FailingEventOffset != 0
				})
				disconnect()
				waitUntil(t, "unmounted", func() bool { return len(e.ts.srv.Mounts("default")) == 1 })
			}
			e.requireHealthy(t, tc.name)
		})
	}
	e.requireBack(t, base, len(cases))
}

// runPromise resolves the promise itxd's call went to, reflects itxd's Disembargo as asked (0
// never, 1 twice, 2 with a wrong id, 3 properly), answers the call, then serves a moment while
// another event is appended by itxd's delivery, and closes.
func (c *callee) runPromise(t *testing.T, call itxtest.Received, resolve func(*callee), how int, more func()) {
	var mu sync.Mutex
	var ids []uint32
	look := disembargoOf(&mu, &ids)
	resolve(c)
	reflectNow := func() {
		mu.Lock()
		got := append([]uint32(nil), ids...)
		ids = nil
		mu.Unlock()
		for _, id := range got {
			switch how {
			case 1:
				c.disembargo(itxtest.OnImport(c.reflectTo), func(d rpccp.Disembargo_context) { d.SetReceiverLoopback(id) })
				c.disembargo(itxtest.OnImport(c.reflectTo), func(d rpccp.Disembargo_context) { d.SetReceiverLoopback(id) })
			case 2:
				c.disembargo(itxtest.OnImport(c.reflectTo), func(d rpccp.Disembargo_context) { d.SetReceiverLoopback(id + 7) })
			case 3:
				c.disembargo(itxtest.OnImport(c.reflectTo), func(d rpccp.Disembargo_context) { d.SetReceiverLoopback(id) })
			}
		}
	}
	answered := false
	trace := os.Getenv("ITX_HOSTILE_TRACE") == "messages"
	c.serveFor(150*time.Millisecond, func(m rpccp.Message) {
		if trace {
			t.Logf("callee got %v", m.Which())
		}
		look(m)
		if !answered {
			answered = true
			c.r.Return(call.Question, nil)
			go more()
		}
		reflectNow()
	}, nil)
}

// A Receiver passed as a promise and resolved to itxd's own stream capability while a delivery
// is in flight; the raw client never reflects itxd's Disembargo and keeps its connection open,
// so the next delivery waits in the embargo for good. The delivery times out, the stream and the
// other subscriptions serve meanwhile, and a well-behaved receiver mounted under the same name
// (replacing the hostile one, still connected) gets the events.
func TestItxd_HostileCalleeEmbargoHeld(t *testing.T) {
	e := newCalleeEnv(t)
	s := stream(t, e.watcher, "/callee/held")
	configureCall(t, s, "held", "held")
	mustAppend(t, s, ev("seed", `{}`))
	e.requireHealthy(t, "setup")
	base := e.baseline(t)
	head := mustAppend(t, s, ev("held", `{}`)).HeadOffset
	c := dialCallee(t, e, "/callee/held")
	caps, q := c.newQ(), c.newQ()
	c.r.CallMsg(itxtest.RawCall{Q: caps, Target: itxtest.OnAnswer(qLogin, 0), Iface: schema.Project_TypeID, Method: 1})
	c.r.CallMsg(itxtest.RawCall{Q: q, Target: itxtest.OnAnswer(caps, 0), Iface: schema.Capabilities_TypeID, Method: 0,
		Size: capnp.ObjectSize{PointerCount: 2},
		Caps: []func(rpccp.CapDescriptor) error{func(d rpccp.CapDescriptor) error { d.SetSenderPromise(100); return nil }},
		Set: func(s capnp.Struct) error {
			if err := s.SetNewText(0, "held"); err != nil {
				return err
			}
			return itxtest.CapPtr(s, 1, 0)
		}})
	call, ok := c.nextCall(schema.Receiver_TypeID, 0, nil)
	require.True(t, ok, "no receive")
	c.resolve(100, func(d rpccp.CapDescriptor) error { d.SetReceiverHosted(c.exports[qStream][0]); return nil })
	c.r.ReturnResults(call.Question, capnp.ObjectSize{DataSize: 8}, func(s capnp.Struct) error {
		schema.Receiver_receive_Results(s).SetConfirmedOffset(uint64(head - 1)) // nothing of the batch
		return nil
	})
	// Read (and drop) what itxd sends, without reflecting anything, until the test ends.
	go func() {
		for {
			if m, err := c.r.RecvMsg(); err != nil || m.Which == rpccp.Message_Which_abort {
				return
			}
		}
	}()
	d := e.waitSub(t, s, "held", "the delivery into the embargo timed out", time.Second, func(d itx.SubscriptionDescription) bool {
		return d.LastError != ""
	})
	require.Less(t, d.ConfirmedOffset, head, "%+v", d)
	e.requireHealthy(t, "embargo held open")
	r := newReceiverServer()
	disconnect := mountReceiver(t, e.ts.addr, e.token, "held", r)
	e.waitSub(t, s, "held", "delivered to the receiver mounted in its place", 2*time.Second, func(d itx.SubscriptionDescription) bool {
		return d.ConfirmedOffset >= head
	})
	disconnect()
	c.r.Close()
	waitUntil(t, "unmounted", func() bool { return len(e.ts.srv.Mounts("default")) == 1 })
	e.requireHealthy(t, "after")
	e.requireBack(t, base, 1)
}

// A LiveSubscriber (Stream.liveState) answers its frames in a hostile way, or never (itxd ends
// the view after its delivery timeout). Nothing stays behind: the live-subscriber gauge and the
// footprint come back.
func TestItxd_HostileCalleeLive(t *testing.T) {
	e := newCalleeEnv(t)
	s := stream(t, e.watcher, "/callee/live")
	mustAppend(t, s, ev("seed", `{}`))
	e.requireHealthy(t, "setup")
	base := e.baseline(t)
	m := e.ts.srv.Metrics()
	var answers []hostileAnswer
	for i, h := range hostileAnswers() {
		if i%3 == 0 || strings.Contains(h.name, "huge") {
			answers = append(answers, h)
		}
	}
	answers = append(answers, hostileAnswer{"never", false, func(c *callee, q uint32) {
		live := testutil.ToFloat64(m.LiveSubscribers)
		go c.drainQuietly()
		waitUntil(t, "the view ended", func() bool {
			e.clock.Advance(time.Second)
			return testutil.ToFloat64(m.LiveSubscribers) < live
		})
	}})
	for _, h := range answers {
		t.Run(h.name, func(t *testing.T) {
			c := dialCallee(t, e, "/callee/live")
			c.r.CallMsg(itxtest.RawCall{Q: c.newQ(), Target: itxtest.OnAnswer(qStream, 0), Iface: schema.Stream_TypeID, Method: 10,
				Size: capnp.ObjectSize{PointerCount: 1},
				Caps: []func(rpccp.CapDescriptor) error{func(d rpccp.CapDescriptor) error { d.SetSenderHosted(8); return nil }},
				Set:  func(s capnp.Struct) error { return itxtest.CapPtr(s, 0, 0) }})
			call, ok := c.nextCall(schema.LiveSubscriber_TypeID, 0, nil)
			require.True(t, ok, "no snapshot")
			h.send(c, call.Question)
			if h.name != "never" {
				mustAppend(t, s, ev("more", `{}`))
				c.drain(100 * time.Millisecond)
			}
			c.r.Close()
			e.requireHealthy(t, h.name)
		})
	}
	e.requireBack(t, base, len(answers))
}

// drainQuietly reads (answering nothing) until the connection ends.
func (c *callee) drainQuietly() {
	for {
		if m, err := c.r.RecvMsg(); err != nil || m.Which == rpccp.Message_Which_abort {
			return
		}
	}
}
