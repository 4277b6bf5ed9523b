package capnppatch

import (
	"encoding/binary"
	"runtime/debug"
	"testing"

	"capnproto.org/go/capnp/v3"
	"github.com/stretchr/testify/require"
)

// A list of pointers whose one element is the list pointer itself (offset -1), as a peer may
// send in any message: copying it into another message (go-capnp echoes a message of an
// unknown type, or a Call it does not serve, in an Unimplemented) recursed past the depth limit
// without end, since a list read at depth 0 gave its elements the largest uint as their limit,
// and ended itxd with "fatal error: stack overflow" (test/rpc_wire_fuzz_test.go, seed 1000000
// case 3460). The copy now fails at the depth limit.
func TestCopy_ListHoldingItselfStopsAtTheDepthLimit(t *testing.T) {
	defer debug.SetMaxStack(debug.SetMaxStack(64 << 20)) // unpatched, the overflow comes fast
	b := make([]byte, 8+3*8)
	binary.LittleEndian.PutUint32(b[4:], 3)                         // one segment of three words
	binary.LittleEndian.PutUint64(b[8:], 1<<48)                     // root: a struct of one pointer
	binary.LittleEndian.PutUint64(b[16:], 0xfffffffc|1|6<<32|1<<35) // that pointer: a list of 1 pointer at offset -1, itself
	msg, err := capnp.Unmarshal(b)
	require.NoError(t, err)
	root, err := msg.Root()
	require.NoError(t, err)
	_, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	require.NoError(t, err)
	dst, err := capnp.NewRootStruct(seg, capnp.ObjectSize{PointerCount: 1})
	require.NoError(t, err)
	err = dst.SetPtr(0, root)
	require.ErrorContains(t, err, "depth limit reached")
}
