package itxtest

import (
	"net"
	"testing"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/rpc/transport"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/itx-dev/itx/schema"
)

// RawClient speaks the RPC protocol message by message, so a test can send what a misbehaving
// client would (calls it never finishes) and see exactly what the server sends back.
type RawClient struct {
	t  testing.TB
	tr transport.Transport
	c  net.Conn
	// sendMayFail: a failed send is not a test failure (the server may abort a hostile peer
	// in the middle of a sequence).
	sendMayFail bool
}

// SendMayFail makes later failed sends return quietly: for a peer the server may abort.
func (r *RawClient) SendMayFail() { r.sendMayFail = true }

func DialRaw(t testing.TB, addr string) *RawClient {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return NewRawClient(t, c)
}

// NewRawClient speaks the RPC protocol by hand over conn (a TLS connection, say), closed when
// the test ends.
func NewRawClient(t testing.TB, conn net.Conn) *RawClient {
	tr := transport.NewStream(conn)
	t.Cleanup(func() { tr.Close() })
	return &RawClient{t: t, tr: tr, c: conn}
}

// Send builds and sends one message.
func (r *RawClient) Send(build func(rpccp.Message) error) {
	r.t.Helper()
	m, err := r.tr.NewMessage()
	if err != nil {
		r.t.Fatal(err)
	}
	defer m.Release()
	if err := build(m.Message()); err != nil {
		r.t.Fatal(err)
	}
	if err := m.Send(); err != nil && !r.sendMayFail {
		r.t.Fatal(err)
	}
}

// Bootstrap asks for the bootstrap capability as question q.
func (r *RawClient) Bootstrap(q uint32) {
	r.Send(func(m rpccp.Message) error {
		b, err := m.NewBootstrap()
		b.SetQuestionId(q)
		return err
	})
}

// Version calls Gateway.version as question q on the answer to question on (the bootstrap).
func (r *RawClient) Version(q, on uint32) { r.callGateway(q, on, 1) }

// Login calls Gateway.login, with no token, as question q on the answer to question on.
func (r *RawClient) Login(q, on uint32) { r.callGateway(q, on, 0) }

func (r *RawClient) callGateway(q, on uint32, method uint16) {
	r.Call(q, on, schema.Gateway_TypeID, method, 1, nil)
}

// Call sends question q: method of iface on the answer to question on, with params a struct of
// ptrs pointers that set fills (nil: left empty).
func (r *RawClient) Call(q, on uint32, iface uint64, method uint16, ptrs uint16, set func(capnp.Struct) error) {
	r.CallMsg(RawCall{Q: q, Target: OnAnswer(on), Iface: iface, Method: method,
		Size: capnp.ObjectSize{PointerCount: ptrs}, Set: set})
}

// RawCall is a Call message in full, for a test that builds odd ones.
type RawCall struct {
	Q      uint32
	Target func(rpccp.MessageTarget) error // OnAnswer, OnImport, or anything else
	Iface  uint64
	Method uint16
	Size   capnp.ObjectSize         // of the params struct
	Set    func(capnp.Struct) error // fills the params (nil: left empty)
	// Caps fill the params' capability table, one descriptor each (an interface pointer
	// in the params names its index: CapPtr).
	Caps []func(rpccp.CapDescriptor) error
	// Build changes the Call last (say its sendResultsTo).
	Build func(rpccp.Call) error
}

// OnAnswer targets the answer to question q, through the pointer fields of transform.
func OnAnswer(q uint32, transform ...uint16) func(rpccp.MessageTarget) error {
	return func(tgt rpccp.MessageTarget) error {
		pa, err := tgt.NewPromisedAnswer()
		if err != nil {
			return err
		}
		pa.SetQuestionId(q)
		if len(transform) == 0 {
			return nil
		}
		ops, err := pa.NewTransform(int32(len(transform)))
		if err != nil {
			return err
		}
		for i, f := range transform {
			ops.At(i).SetGetPointerField(f)
		}
		return nil
	}
}

// OnImport targets the capability the server exported as id.
func OnImport(id uint32) func(rpccp.MessageTarget) error {
	return func(tgt rpccp.MessageTarget) error {
		tgt.SetImportedCap(id)
		return nil
	}
}

// CapPtr sets pointer field i of s to capability index idx of the message's table.
func CapPtr(s capnp.Struct, i uint16, idx capnp.CapabilityID) error {
	return s.SetPtr(i, capnp.NewInterface(s.Segment(), idx).ToPtr())
}

// CallMsg sends c.
func (r *RawClient) CallMsg(rc RawCall) {
	r.Send(func(m rpccp.Message) error { return BuildCall(m, rc) })
}

// BuildCall makes m the Call rc describes (for a test that sends its bytes itself).
func BuildCall(m rpccp.Message, rc RawCall) error {
	c, err := m.NewCall()
	if err != nil {
		return err
	}
	c.SetQuestionId(rc.Q)
	c.SetInterfaceId(rc.Iface)
	c.SetMethodId(rc.Method)
	tgt, err := c.NewTarget()
	if err != nil {
		return err
	}
	if err := rc.Target(tgt); err != nil {
		return err
	}
	params, err := c.NewParams()
	if err != nil {
		return err
	}
	s, err := capnp.NewStruct(params.Segment(), rc.Size)
	if err != nil {
		return err
	}
	if rc.Set != nil {
		if err := rc.Set(s); err != nil {
			return err
		}
	}
	if err := params.SetContent(s.ToPtr()); err != nil {
		return err
	}
	if len(rc.Caps) > 0 {
		table, err := params.NewCapTable(int32(len(rc.Caps)))
		if err != nil {
			return err
		}
		for i, set := range rc.Caps {
			if err := set(table.At(i)); err != nil {
				return err
			}
		}
	}
	if rc.Build != nil {
		return rc.Build(c)
	}
	return nil
}

// Finish finishes question q (keeping any capabilities in its results).
func (r *RawClient) Finish(q uint32) {
	r.Send(func(m rpccp.Message) error {
		f, err := m.NewFinish()
		f.SetQuestionId(q)
		f.SetReleaseResultCaps(false)
		return err
	})
}

// FinishReleasing finishes question q, releasing the capabilities in its results.
func (r *RawClient) FinishReleasing(q uint32) {
	r.Send(func(m rpccp.Message) error {
		f, err := m.NewFinish()
		f.SetQuestionId(q)
		f.SetReleaseResultCaps(true)
		return err
	})
}

// LoginWith calls Gateway.login with token as question q on the answer to question on.
func (r *RawClient) LoginWith(q, on uint32, token string) {
	r.Call(q, on, schema.Gateway_TypeID, 0, 1, func(s capnp.Struct) error { return s.SetNewText(0, token) })
}

// WriteRaw writes b to the socket as it is (half a frame, say), past the transport.
func (r *RawClient) WriteRaw(b []byte) error {
	_, err := r.c.Write(b)
	return err
}

// Close ends the connection now (it is closed when the test ends otherwise).
func (r *RawClient) Close() { r.tr.Close() }

// Received is one message from the server, as RecvMsg reads it.
type Received struct {
	Which  rpccp.Message_Which
	Answer uint32 // a Return's answer id
	// Exports are the ids the server exported in a Return's capability table (senderHosted
	// or senderPromise), in order.
	Exports []uint32
	Failed  bool   // a Return with an exception
	Reason  string // an Abort's reason, or a Return's exception
	// A Call the server makes on a capability this client passed it: its question id, the
	// import it targets (OnImport: true) and its method. Exports are then the ids the server
	// exported in the params' capability table.
	Question uint32
	Import   uint32
	OnImport bool
	Iface    uint64
	Method   uint16
}

// RecvMsg reads the next message.
func (r *RawClient) RecvMsg() (Received, error) { return r.RecvMsgWith(nil) }

// RecvMsgWith reads the next message and hands it to look (if not nil) before releasing it: a
// test that answers the server's calls reads their params there.
func (r *RawClient) RecvMsgWith(look func(rpccp.Message)) (Received, error) {
	in, err := r.tr.RecvMessage()
	if err != nil {
		return Received{}, err
	}
	defer in.Release()
	m := in.Message()
	if look != nil {
		look(m)
	}
	out := Received{Which: m.Which()}
	switch m.Which() {
	case rpccp.Message_Which_call:
		c, _ := m.Call()
		out.Question, out.Iface, out.Method = c.QuestionId(), c.InterfaceId(), c.MethodId()
		if tgt, err := c.Target(); err == nil && tgt.Which() == rpccp.MessageTarget_Which_importedCap {
			out.Import, out.OnImport = tgt.ImportedCap(), true
		}
		params, _ := c.Params()
		out.Exports = exportedIDs(out.Exports, params)
	case rpccp.Message_Which_return:
		ret, _ := m.Return()
		out.Answer = ret.AnswerId()
		switch ret.Which() {
		case rpccp.Return_Which_results:
			res, _ := ret.Results()
			out.Exports = exportedIDs(out.Exports, res)
		case rpccp.Return_Which_exception:
			out.Failed = true
			e, _ := ret.Exception()
			out.Reason, _ = e.Reason()
		}
	case rpccp.Message_Which_abort:
		a, _ := m.Abort()
		out.Reason, _ = a.Reason()
	}
	return out, nil
}

// Return answers the server's question q, as build makes the Return (results, an exception,
// or anything else a misbehaving callee sends).
func (r *RawClient) Return(q uint32, build func(rpccp.Return) error) {
	r.Send(func(m rpccp.Message) error {
		ret, err := m.NewReturn()
		if err != nil {
			return err
		}
		ret.SetAnswerId(q)
		if build == nil {
			_, err = ret.NewResults()
			return err
		}
		return build(ret)
	})
}

// ReturnResults answers question q with results: a struct of size that set fills (nil: left
// empty), and a capability table of caps.
func (r *RawClient) ReturnResults(q uint32, size capnp.ObjectSize, set func(capnp.Struct) error, caps ...func(rpccp.CapDescriptor) error) {
	r.Return(q, func(ret rpccp.Return) error {
		res, err := ret.NewResults()
		if err != nil {
			return err
		}
		s, err := capnp.NewStruct(res.Segment(), size)
		if err != nil {
			return err
		}
		if set != nil {
			if err := set(s); err != nil {
				return err
			}
		}
		if err := res.SetContent(s.ToPtr()); err != nil {
			return err
		}
		if len(caps) > 0 {
			table, err := res.NewCapTable(int32(len(caps)))
			if err != nil {
				return err
			}
			for i, set := range caps {
				if err := set(table.At(i)); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// Next reads the next message's kind, the answer id of a Return, and the reason of an Abort.
func (r *RawClient) Next() (which rpccp.Message_Which, answer uint32, reason string, err error) {
	m, err := r.RecvMsg()
	if m.Which == rpccp.Message_Which_abort {
		reason = m.Reason
	}
	return m.Which, m.Answer, reason, err
}

// UntilAbort reads until the server's Abort and returns how many Returns came before it and
// the Abort's reason; the connection must end after it.
func (r *RawClient) UntilAbort() (returns int, reason string) {
	r.t.Helper()
	for {
		which, _, reason, err := r.Next()
		if err != nil {
			r.t.Fatalf("after %d returns, no abort but %v", returns, err)
		}
		switch which {
		case rpccp.Message_Which_return:
			returns++
		case rpccp.Message_Which_abort:
			if _, _, _, err := r.Next(); err == nil {
				r.t.Fatalf("a message after the abort")
			}
			return returns, reason
		}
	}
}

// UntilReturn reads until the Return for question q.
func (r *RawClient) UntilReturn(q uint32) {
	r.t.Helper()
	for {
		which, answer, reason, err := r.Next()
		if err != nil {
			r.t.Fatalf("waiting for the return of %d: %v", q, err)
		}
		if which == rpccp.Message_Which_abort {
			r.t.Fatalf("waiting for the return of %d: aborted: %s", q, reason)
		}
		if which == rpccp.Message_Which_return && answer == q {
			return
		}
	}
}

// exportedIDs appends the ids of the capabilities a payload's table says its sender exports
// (hosted or promised) to ids.
func exportedIDs(ids []uint32, p rpccp.Payload) []uint32 {
	table, _ := p.CapTable()
	for i := 0; i < table.Len(); i++ {
		d := table.At(i)
		switch d.Which() {
		case rpccp.CapDescriptor_Which_senderHosted:
			ids = append(ids, d.SenderHosted())
		case rpccp.CapDescriptor_Which_senderPromise:
			ids = append(ids, d.SenderPromise())
		}
	}
	return ids
}
