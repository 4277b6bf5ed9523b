package capnppatch

import (
	"encoding/binary"
	"errors"
	"net"
	"testing"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/rpc"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/schema"
	"github.com/stretchr/testify/require"
)

// go-capnp answers a Call whose results go elsewhere than to the caller with an Unimplemented
// echoing the Call. One whose params cannot be copied (here a pointer list holding itself, past
// the depth limit) got no answer at all: its question stayed open for the peer, and itxd's
// transport counted it in flight for the connection's life (found by test/rpc_wire_fuzz_test.go).
// The echo now names the call without its params.
func TestUnimplemented_EchoOfAnUncopyableCall(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		conn := rpc.NewConn(rpc.NewStreamTransport(c), &rpc.Options{BootstrapClient: capnp.ErrorClient(errors.New("a test bootstrap"))})
		t.Cleanup(func() { conn.Close() })
	}()
	r := itxtest.DialRaw(t, ln.Addr().String())

	msg, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	require.NoError(t, err)
	m, err := rpccp.NewRootMessage(seg)
	require.NoError(t, err)
	require.NoError(t, itxtest.BuildCall(m, itxtest.RawCall{Q: 7, Target: itxtest.OnAnswer(0), Iface: schema.Gateway_TypeID, Method: 1,
		Size: capnp.ObjectSize{PointerCount: 1}, Set: func(s capnp.Struct) error { return s.SetNewText(0, "1234567") },
		Build: func(c rpccp.Call) error { c.SendResultsTo().SetYourself(); return nil }}))
	b, err := msg.Marshal()
	require.NoError(t, err)
	patched := false
	for i := 8; i+8 <= len(b); i += 8 { // the text's pointer becomes a list of one pointer: itself
		if w := binary.LittleEndian.Uint64(b[i:]); w&3 == 1 && (w>>32)&7 == 2 && w>>35 == 8 {
			binary.LittleEndian.PutUint64(b[i:], 1|0xfffffffc|6<<32|1<<35)
			patched = true
		}
	}
	require.True(t, patched)

	r.Bootstrap(0)
	r.UntilReturn(0)
	require.NoError(t, r.WriteRaw(b))
	r.Bootstrap(8) // its Return comes after whatever answers question 7
	var echoed []uint32
	for {
		got, err := r.RecvMsgWith(func(m rpccp.Message) {
			if m.Which() != rpccp.Message_Which_unimplemented {
				return
			}
			if u, err := m.Unimplemented(); err == nil && u.Which() == rpccp.Message_Which_call {
				c, _ := u.Call()
				echoed = append(echoed, c.QuestionId())
			}
		})
		require.NoError(t, err)
		if got.Which == rpccp.Message_Which_return && got.Answer == 8 {
			break
		}
	}
	require.Equal(t, []uint32{7}, echoed, "the call answered by an Unimplemented echoing it")
}
