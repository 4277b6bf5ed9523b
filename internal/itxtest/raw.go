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
	return &RawClient{t: t, tr: tr}
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
	r.Send(func(m rpccp.Message) error {
		c, err := m.NewCall()
		if err != nil {
			return err
		}
		c.SetQuestionId(q)
		c.SetInterfaceId(iface)
		c.SetMethodId(method)
		tgt, err := c.NewTarget()
		if err != nil {
			return err
		}
		pa, err := tgt.NewPromisedAnswer()
		if err != nil {
			return err
		}
		pa.SetQuestionId(on)
		params, err := c.NewParams()
		if err != nil {
			return err
		}
		s, err := capnp.NewStruct(params.Segment(), capnp.ObjectSize{PointerCount: ptrs})
		if err != nil {
			return err
		}
		if set != nil {
			if err := set(s); err != nil {
				return err
			}
		}
		return params.SetContent(s.ToPtr())
	})
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

// Next reads the next message's kind, the answer id of a Return, and the reason of an Abort.
func (r *RawClient) Next() (which rpccp.Message_Which, answer uint32, reason string, err error) {
	in, err := r.tr.RecvMessage()
	if err != nil {
		return 0, 0, "", err
	}
	defer in.Release()
	m := in.Message()
	switch m.Which() {
	case rpccp.Message_Which_return:
		ret, _ := m.Return()
		answer = ret.AnswerId()
	case rpccp.Message_Which_abort:
		a, _ := m.Abort()
		reason, _ = a.Reason()
	}
	return m.Which(), answer, reason, nil
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
