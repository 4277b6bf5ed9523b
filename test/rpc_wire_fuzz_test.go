package test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/server"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/schema"
	"github.com/stretchr/testify/require"
)

// Malformed bytes on the wire. itxd serves Cap'n Proto RPC to anyone who connects, and login
// comes after the bootstrap: whatever bytes a peer sends, itxd must not panic (one panic ends
// every stream of every project), hang, or keep growing once the peer is gone. The hostile tests
// send well-formed messages in hostile orders; these send a corpus of valid messages (a whole
// pipelined session: bootstrap, login, streams().get(path), append, getEventPage,
// subscriptions().configure with a webhook, openConnection with a sink, a mount) mutated at the
// byte, framing, pointer and schema levels, on raw TCP connections to one real itxd process.
//
// ITX_WIRE_FUZZ_CASES=N runs N cases (default 10000; a long run: 500000), ITX_WIRE_FUZZ_SEED
// picks the seed (default 1), ITX_WIRE_FUZZ_CASE=i runs case i alone (a failure names it).

// wireSyncQ is the question id of the Bootstrap sent after a case's frames: its Return (or the
// connection's end) says itxd read and handled everything before it.
const wireSyncQ = 0x7ffffff0

// wireMsg marshals one RPC message (stream framing: segment table, then the segments).
func wireMsg(t testing.TB, build func(rpccp.Message) error) []byte {
	t.Helper()
	msg, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	require.NoError(t, err)
	m, err := rpccp.NewRootMessage(seg)
	require.NoError(t, err)
	require.NoError(t, build(m))
	b, err := msg.Marshal()
	require.NoError(t, err)
	return b
}

func wireCall(t testing.TB, rc itxtest.RawCall) []byte {
	t.Helper()
	return wireMsg(t, func(m rpccp.Message) error { return itxtest.BuildCall(m, rc) })
}

func wireFinish(t testing.TB, q uint32) []byte {
	return wireMsg(t, func(m rpccp.Message) error {
		f, err := m.NewFinish()
		f.SetQuestionId(q)
		f.SetReleaseResultCaps(true)
		return err
	})
}

func wireBootstrap(t testing.TB, q uint32) []byte {
	return wireMsg(t, func(m rpccp.Message) error {
		b, err := m.NewBootstrap()
		b.SetQuestionId(q)
		return err
	})
}

func setTexts(l capnp.TextList, vs ...string) error {
	for i, v := range vs {
		if err := l.Set(i, v); err != nil {
			return err
		}
	}
	return nil
}

// wireCorpus is one valid session, every call pipelined on the answers before it, as a client
// in any language may send it at once. Its append's first event carries an idempotency key (a
// mutated body under it is a conflict: nothing written), its second none (each replay that
// reaches the append writes one: whatever a mutation left of it must be refused or whole).
func wireCorpus(t testing.TB, token, path, hookURL string) [][]byte {
	sink := func(id uint32) []func(rpccp.CapDescriptor) error {
		return []func(rpccp.CapDescriptor) error{func(d rpccp.CapDescriptor) error { d.SetSenderHosted(id); return nil }}
	}
	frames := [][]byte{
		wireBootstrap(t, 0),
		wireCall(t, itxtest.RawCall{Q: 1, Target: itxtest.OnAnswer(0), Iface: schema.Gateway_TypeID, Method: 0,
			Size: capnp.ObjectSize{PointerCount: 1}, Set: func(s capnp.Struct) error { return s.SetNewText(0, token) }}),
		wireCall(t, itxtest.RawCall{Q: 2, Target: itxtest.OnAnswer(1, 0), Iface: schema.Project_TypeID, Method: 0}),
		wireCall(t, itxtest.RawCall{Q: 3, Target: itxtest.OnAnswer(2, 0), Iface: schema.Streams_TypeID, Method: 0,
			Size: capnp.ObjectSize{PointerCount: 1}, Set: func(s capnp.Struct) error { return s.SetNewText(0, path) }}),
		wireCall(t, itxtest.RawCall{Q: 4, Target: itxtest.OnAnswer(3, 0), Iface: schema.Stream_TypeID, Method: 0,
			Size: capnp.ObjectSize{PointerCount: 2}, Set: func(s capnp.Struct) error {
				p := schema.Stream_append_Params(s)
				evs, err := p.NewEvents(2)
				if err != nil {
					return err
				}
				e := evs.At(0)
				if err := e.SetType("fuzz/a"); err != nil {
					return err
				}
				if err := e.SetPayload(`{"n":1,"s":"wire","l":[1,2,3],"o":{"k":null}}`); err != nil {
					return err
				}
				if err := e.SetIdempotencyKey("wire-k1"); err != nil {
					return err
				}
				if err := e.SetMetadata(`{"m":true}`); err != nil {
					return err
				}
				e = evs.At(1)
				if err := e.SetType("fuzz/b"); err != nil {
					return err
				}
				if err := e.SetPayload(`{"n":2,"t":"wire"}`); err != nil { // no key: every replay appends it
					return err
				}
				_, err = p.NewOptions()
				return err
			}}),
		wireCall(t, itxtest.RawCall{Q: 5, Target: itxtest.OnAnswer(3, 0), Iface: schema.Stream_TypeID, Method: 2,
			Size: capnp.ObjectSize{PointerCount: 1}, Set: func(s capnp.Struct) error {
				q, err := schema.Stream_getEventPage_Params(s).NewQuery()
				if err != nil {
					return err
				}
				q.SetLimit(10)
				types, err := q.NewTypes(2)
				if err != nil {
					return err
				}
				return setTexts(types, "fuzz/a", "fuzz/b")
			}}),
		wireCall(t, itxtest.RawCall{Q: 6, Target: itxtest.OnAnswer(3, 0), Iface: schema.Stream_TypeID, Method: 5}),
		wireCall(t, itxtest.RawCall{Q: 7, Target: itxtest.OnAnswer(6, 0), Iface: schema.Subscriptions_TypeID, Method: 2,
			Size: capnp.ObjectSize{PointerCount: 2}, Set: func(s capnp.Struct) error {
				cfg, err := schema.Subscriptions_configure_Params(s).NewConfig()
				if err != nil {
					return err
				}
				if err := cfg.SetName("wire-hook"); err != nil {
					return err
				}
				cfg.Receiver().SetWebhookPost()
				wh := cfg.Receiver().WebhookPost()
				if err := wh.SetUrl(hookURL); err != nil {
					return err
				}
				hs, err := wh.NewHeaders(1)
				if err != nil {
					return err
				}
				if err := hs.At(0).SetName("x-wire"); err != nil {
					return err
				}
				if err := hs.At(0).SetValue("fuzz"); err != nil {
					return err
				}
				ft, err := cfg.NewFilterTypes(1)
				if err != nil {
					return err
				}
				return setTexts(ft, "fuzz/hook")
			}}),
		wireCall(t, itxtest.RawCall{Q: 8, Target: itxtest.OnAnswer(3, 0), Iface: schema.Stream_TypeID, Method: 8,
			Size: capnp.ObjectSize{PointerCount: 2}, Caps: sink(1), Set: func(s capnp.Struct) error {
				o, err := schema.Stream_openConnection_Params(s).NewOptions()
				if err != nil {
					return err
				}
				o.SetMaxDeliveryEvents(10)
				if err := o.SetOpenedBy("wire fuzz"); err != nil {
					return err
				}
				types, err := o.NewTypes(1)
				if err != nil {
					return err
				}
				if err := setTexts(types, "fuzz/a"); err != nil {
					return err
				}
				return itxtest.CapPtr(s, 1, 0)
			}}),
		wireCall(t, itxtest.RawCall{Q: 9, Target: itxtest.OnAnswer(8, 0), Iface: schema.Connection_TypeID, Method: 1}),
		wireCall(t, itxtest.RawCall{Q: 10, Target: itxtest.OnAnswer(1, 0), Iface: schema.Project_TypeID, Method: 1}),
		wireCall(t, itxtest.RawCall{Q: 11, Target: itxtest.OnAnswer(10, 0), Iface: schema.Capabilities_TypeID, Method: 0,
			Size: capnp.ObjectSize{PointerCount: 2}, Caps: sink(2), Set: func(s capnp.Struct) error {
				if err := s.SetNewText(0, "wire-recv"); err != nil {
					return err
				}
				return itxtest.CapPtr(s, 1, 0)
			}}),
		wireCall(t, itxtest.RawCall{Q: 12, Target: itxtest.OnAnswer(3, 0), Iface: schema.Stream_TypeID, Method: 4}),
	}
	// Not the append's: a Finish before its answer cancels it, and the appends are what a
	// mutation must leave whole or refused.
	for _, q := range []uint32{5, 7, 9, 12, 8, 11} {
		frames = append(frames, wireFinish(t, q))
	}
	return frames
}

// wireMethods are every (interface, method) pair itxd serves: a Call moved to another of them
// carries params of the wrong structure for it.
func wireMethods() [][2]uint64 {
	var ms []server.Method
	ms = schema.Gateway_Methods(ms, nil)
	ms = schema.Project_Methods(ms, nil)
	ms = schema.Streams_Methods(ms, nil)
	ms = schema.Stream_Methods(ms, nil)
	ms = schema.Subscriptions_Methods(ms, nil)
	ms = schema.Subscription_Methods(ms, nil)
	ms = schema.Connection_Methods(ms, nil)
	ms = schema.Capabilities_Methods(ms, nil)
	ms = schema.Readers_Methods(ms, nil)
	ms = schema.Handle_Methods(ms, nil)
	ms = schema.Processor_Methods(ms, nil)
	ms = schema.ProcessorHosts_Methods(ms, nil)
	ms = schema.Admin_Methods(ms, nil)
	out := make([][2]uint64, len(ms))
	for i, m := range ms {
		out[i] = [2]uint64{m.InterfaceID, uint64(m.MethodID)}
	}
	return out
}

// Pointer words (the Cap'n Proto encoding, little-endian).
func structPtr(off int32, data, ptrs uint16) uint64 {
	return uint64(uint32(off)<<2) | uint64(data)<<32 | uint64(ptrs)<<48
}
func listPtr(off int32, elem uint8, n uint32) uint64 {
	return 1 | uint64(uint32(off)<<2) | uint64(elem&7)<<32 | uint64(n&(1<<29-1))<<35
}
func farPtr(double bool, off uint32, seg uint32) uint64 {
	w := 2 | uint64(off&(1<<29-1))<<3 | uint64(seg)<<32
	if double {
		w |= 4
	}
	return w
}
func capPtr(idx uint32) uint64 { return 3 | uint64(idx)<<32 }

// wireHeader is a frame's segment table: its length in bytes and the segments' sizes in words
// (nil when the frame is too short to hold it).
func wireHeader(f []byte) (hdr int, sizes []uint32) {
	if len(f) < 4 {
		return 0, nil
	}
	n := int(binary.LittleEndian.Uint32(f)) + 1
	if n <= 0 || n > 512 {
		return 0, nil
	}
	hdr = 4 + 4*n
	hdr += hdr % 8
	if len(f) < hdr {
		return 0, nil
	}
	for i := range n {
		sizes = append(sizes, binary.LittleEndian.Uint32(f[4+4*i:]))
	}
	return hdr, sizes
}

// wireFramed reports whether f is exactly as long as its segment table declares: then itxd,
// having read it, waits for the next message at the right place.
func wireFramed(f []byte) bool {
	hdr, sizes := wireHeader(f)
	if sizes == nil {
		return false
	}
	total := uint64(hdr)
	for _, s := range sizes {
		total += 8 * uint64(s)
	}
	return total == uint64(len(f))
}

// wireMutator changes one frame; the name goes in a failure's report.
type wireMutator struct {
	name string
	f    func(rng *rand.Rand, f []byte, methods [][2]uint64) []byte
}

// body is the words after a well-formed frame's segment table (nil if it has none).
func body(f []byte) (int, []byte) {
	hdr, sizes := wireHeader(f)
	if sizes == nil || len(f) <= hdr+8 {
		return 0, nil
	}
	return hdr, f[hdr:]
}

// putWord overwrites a random word of the body (not the root pointer unless root) with w.
func putWord(rng *rand.Rand, f []byte, w uint64, root bool) []byte {
	hdr, b := body(f)
	if b == nil {
		return f
	}
	i := rng.Intn(len(b) / 8)
	if root {
		i = 0
	}
	binary.LittleEndian.PutUint64(f[hdr+8*i:], w)
	return f
}

// pointerWords finds the body's words that read as in-bounds pointers of kind (0 struct,
// 1 list), by offset in f.
func pointerWords(f []byte, kind uint64) []int {
	hdr, b := body(f)
	var out []int
	for i := 0; i+8 <= len(b); i += 8 {
		w := binary.LittleEndian.Uint64(b[i:])
		if w == 0 || w&3 != kind {
			continue
		}
		off := int64(int32(uint32(w)) >> 2)
		target := int64(i/8) + 1 + off
		if target >= 0 && target < int64(len(b)/8) {
			out = append(out, hdr+i)
		}
	}
	return out
}

// wireDecode reads a well-formed frame as an RPC message, to change it through the schema.
func wireDecode(f []byte) (*capnp.Message, rpccp.Message, bool) {
	msg, err := capnp.Unmarshal(append([]byte(nil), f...))
	if err != nil {
		return nil, rpccp.Message{}, false
	}
	m, err := rpccp.ReadRootMessage(msg)
	if err != nil {
		return nil, rpccp.Message{}, false
	}
	return msg, m, true
}

func wireReencode(f []byte, msg *capnp.Message) []byte {
	b, err := msg.Marshal()
	if err != nil {
		return f
	}
	return b
}

// onCall changes a frame's Call through the schema (frames that are not Calls stay as they are).
func onCall(f []byte, change func(c rpccp.Call) error) (out []byte) {
	// A frame an earlier mutation broke can make go-capnp's setters panic here, in the test:
	// it is then sent as it was.
	defer func() {
		if recover() != nil {
			out = f
		}
	}()
	msg, m, ok := wireDecode(f)
	if !ok || m.Which() != rpccp.Message_Which_call {
		return f
	}
	c, err := m.Call()
	if err != nil || change(c) != nil {
		return f
	}
	return wireReencode(f, msg)
}

// nested is a chain of depth structs, each the first pointer of the one before: deeper than
// any reader's nesting limit.
func nested(seg *capnp.Segment, depth int) (capnp.Struct, error) {
	top, err := capnp.NewStruct(seg, capnp.ObjectSize{PointerCount: 1})
	if err != nil {
		return top, err
	}
	cur := top
	for range depth {
		next, err := capnp.NewStruct(seg, capnp.ObjectSize{PointerCount: 1})
		if err != nil {
			return top, err
		}
		if err := cur.SetPtr(0, next.ToPtr()); err != nil {
			return top, err
		}
		cur = next
	}
	return top, nil
}

func wireMutators() []wireMutator {
	rnd := func(rng *rand.Rand, choices ...uint32) uint32 { return choices[rng.Intn(len(choices))] }
	return []wireMutator{
		{"bit flips", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			for range 1 + rng.Intn(8) {
				i := rng.Intn(len(f))
				f[i] ^= 1 << rng.Intn(8)
			}
			return f
		}},
		{"bit flips in the body", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			hdr, b := body(f)
			if b == nil {
				return f
			}
			for range 1 + rng.Intn(4) {
				f[hdr+rng.Intn(len(b))] ^= 1 << rng.Intn(8)
			}
			return f
		}},
		{"random byte in the body", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			hdr, b := body(f)
			if b == nil {
				return f
			}
			f[hdr+rng.Intn(len(b))] = byte(rng.Intn(256))
			return f
		}},
		{"bytes inserted", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			i, n := rng.Intn(len(f)+1), 1+rng.Intn(16)
			ins := make([]byte, n)
			rng.Read(ins)
			return append(f[:i:i], append(ins, f[i:]...)...)
		}},
		{"bytes deleted", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			i := rng.Intn(len(f))
			n := min(len(f)-i, 1+rng.Intn(16))
			return append(f[:i:i], f[i+n:]...)
		}},
		{"truncated", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte { return f[:rng.Intn(len(f))] }},
		{"segment count", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			// 0 (one segment), a few more than sent, the most a peek reads, beyond it, huge.
			binary.LittleEndian.PutUint32(f, rnd(rng, 0, 1, 2, 7, 63, 64, 65, 511, 1<<16, 1<<29, 1<<31-1, 1<<32-1))
			return f
		}},
		{"more segments than sent, sizes consistent", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			// A table of n segments whose sizes add up to what follows, the first one short:
			// pointers into segment 0 past its end, and empty segments.
			hdr, sizes := wireHeader(f)
			if len(sizes) != 1 {
				return f
			}
			words := sizes[0]
			n := 2 + rng.Intn(6)
			tbl := make([]byte, 4+4*n+(4+4*n)%8)
			binary.LittleEndian.PutUint32(tbl, uint32(n-1))
			first := uint32(rng.Intn(int(words) + 1))
			binary.LittleEndian.PutUint32(tbl[4:], first)
			binary.LittleEndian.PutUint32(tbl[8:], words-first)
			return append(tbl, f[hdr:]...)
		}},
		{"segment size", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			_, sizes := wireHeader(f)
			if sizes == nil {
				return f
			}
			i := rng.Intn(len(sizes))
			s := sizes[i]
			binary.LittleEndian.PutUint32(f[4+4*i:], rnd(rng, 0, 1, s-1, s+1, s*2, 1<<13, 1<<20, 1<<28, 1<<32-1))
			return f
		}},
		{"segment size smaller, frame cut to match", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			hdr, sizes := wireHeader(f)
			if len(sizes) != 1 || sizes[0] == 0 {
				return f
			}
			s := uint32(rng.Intn(int(sizes[0])))
			binary.LittleEndian.PutUint32(f[4:], s)
			return f[:min(len(f), hdr+8*int(s))]
		}},
		{"struct pointer anywhere", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			off := int32(rng.Intn(64)) - 32
			if rng.Intn(4) == 0 {
				off = int32(rng.Uint32()) >> 2
			}
			return putWord(rng, f, structPtr(off, uint16(rnd(rng, 0, 1, 2, 0xffff)), uint16(rnd(rng, 0, 1, 4, 0xffff))), false)
		}},
		{"root pointer", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			ws := []uint64{0, structPtr(-1, 1, 1), structPtr(0, 0xffff, 0xffff), listPtr(0, uint8(rng.Intn(8)), rng.Uint32()),
				farPtr(false, rng.Uint32(), 0), farPtr(true, rng.Uint32(), 1), capPtr(rng.Uint32()), rng.Uint64()}
			return putWord(rng, f, ws[rng.Intn(len(ws))], true)
		}},
		{"list pointer, huge or negative count", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			off := int32(rng.Intn(64)) - 32
			return putWord(rng, f, listPtr(off, uint8(rng.Intn(8)), rnd(rng, 0, 1, 1<<16, 1<<28, 1<<29-1, rng.Uint32())), false)
		}},
		{"composite list with a lying tag", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			// A list-of-structs pointer to a tag word that claims a huge element count or size.
			hdr, b := body(f)
			if len(b) < 32 {
				return f
			}
			words := len(b) / 8
			at := 1 + rng.Intn(words-2) // the pointer's word
			tag := at + 1 + rng.Intn(words-at-1)
			binary.LittleEndian.PutUint64(f[hdr+8*at:], listPtr(int32(tag-at-1), 7, uint32(rng.Intn(words))))
			count := rnd(rng, 1<<29-1, 1<<20, 2, uint32(rng.Intn(1<<30)))
			binary.LittleEndian.PutUint64(f[hdr+8*tag:], uint64(count<<2)|uint64(rnd(rng, 0, 1, 0xffff))<<32|uint64(rnd(rng, 0, 1, 0xffff))<<48)
			return f
		}},
		{"far pointer", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			_, b := body(f)
			words := max(1, len(b)/8)
			w := farPtr(rng.Intn(2) == 0, rnd(rng, 0, uint32(rng.Intn(words)), uint32(words), rng.Uint32()), rnd(rng, 0, 1, 2, rng.Uint32()))
			return putWord(rng, f, w, rng.Intn(4) == 0)
		}},
		{"capability pointer", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			return putWord(rng, f, capPtr(rnd(rng, 0, 1, 2, 255, 1<<16, 1<<31, 1<<32-1)), false)
		}},
		{"pointer to itself", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			ws := []uint64{structPtr(-1, 0, 1), structPtr(-1, 1, 1), listPtr(-1, 6, 1), listPtr(-1, 7, 1)}
			return putWord(rng, f, ws[rng.Intn(len(ws))], false)
		}},
		{"unknown message type holding a list of itself", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			// go-capnp echoes a message it does not know in an Unimplemented, copying it whole:
			// a pointer slot of it becomes a list of one pointer, that slot itself.
			hdr, b := body(f)
			if b == nil {
				return f
			}
			w := binary.LittleEndian.Uint64(b)
			data := hdr + 8 + 8*int(int32(uint32(w))>>2)
			ps := append(pointerWords(f, 0), pointerWords(f, 1)...)
			if w&3 != 0 || data < hdr || data+2 > len(f) || len(ps) < 2 {
				return f
			}
			binary.LittleEndian.PutUint16(f[data:], uint16(rnd(rng, 11, 12, 13, 14, 0xffff)))
			p := ps[1+rng.Intn(len(ps)-1)] // not the root
			binary.LittleEndian.PutUint64(f[p:], listPtr(-1, 6, 1))
			return f
		}},
		{"pointer moved", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			// An in-bounds pointer's offset nudged: overlapping objects, a struct read as a list.
			for _, kind := range []uint64{uint64(rng.Intn(2))} {
				ps := pointerWords(f, kind)
				if len(ps) == 0 {
					return f
				}
				p := ps[rng.Intn(len(ps))]
				w := binary.LittleEndian.Uint64(f[p:])
				off := int32(uint32(w))>>2 + int32(rng.Intn(9)) - 4
				w = w&^0xfffffffc | uint64(uint32(off)<<2)
				if rng.Intn(3) == 0 {
					w ^= 1 // struct <-> list
				}
				binary.LittleEndian.PutUint64(f[p:], w)
			}
			return f
		}},
		{"text without its NUL", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			hdr, b := body(f)
			var texts []int // byte offset of each in-bounds byte list's last byte
			for _, p := range pointerWords(f, 1) {
				w := binary.LittleEndian.Uint64(f[p:])
				if (w>>32)&7 != 2 || w>>35 == 0 {
					continue
				}
				start := (p-hdr)/8 + 1 + int(int32(uint32(w))>>2)
				last := 8*start + int(w>>35) - 1
				if last < len(b) {
					texts = append(texts, hdr+last)
				}
			}
			if len(texts) == 0 {
				return f
			}
			f[texts[rng.Intn(len(texts))]] = byte("x\xff\x00\n"[rng.Intn(4)])
			return f
		}},
		{"a byte inside a text", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			// JSON and names broken where the schema cannot see it: itxd must refuse them.
			hdr, b := body(f)
			var at []int
			for _, p := range pointerWords(f, 1) {
				w := binary.LittleEndian.Uint64(f[p:])
				if (w>>32)&7 != 2 || w>>35 < 2 {
					continue
				}
				start := (p-hdr)/8 + 1 + int(int32(uint32(w))>>2)
				if end := 8*start + int(w>>35) - 1; end <= len(b) {
					at = append(at, hdr+8*start+rng.Intn(int(w>>35)-1))
				}
			}
			if len(at) == 0 {
				return f
			}
			f[at[rng.Intn(len(at))]] = "{}[],:\"\x00\xff \n"[rng.Intn(11)]
			return f
		}},
		{"message union", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			// The Message's discriminant (the root struct's first data word), valid or not:
			// the same body read as another message type.
			hdr, b := body(f)
			if b == nil {
				return f
			}
			w := binary.LittleEndian.Uint64(b)
			if w&3 != 0 {
				return f
			}
			data := hdr + 8 + 8*int(int32(uint32(w))>>2)
			if data < hdr || data+2 > len(f) || (w>>32)&0xffff == 0 {
				return f
			}
			binary.LittleEndian.PutUint16(f[data:], uint16(rnd(rng, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0xffff)))
			return f
		}},
		{"call: interface or method unknown", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			return onCall(f, func(c rpccp.Call) error {
				if rng.Intn(2) == 0 {
					c.SetInterfaceId(rng.Uint64())
				}
				c.SetMethodId(uint16(rnd(rng, uint32(rng.Intn(32)), 0xffff, uint32(rng.Intn(1<<16)))))
				return nil
			})
		}},
		{"call: another method's name for these params", func(rng *rand.Rand, f []byte, ms [][2]uint64) []byte {
			m := ms[rng.Intn(len(ms))]
			return onCall(f, func(c rpccp.Call) error {
				c.SetInterfaceId(m[0])
				c.SetMethodId(uint16(m[1]))
				return nil
			})
		}},
		{"call: question id", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			return onCall(f, func(c rpccp.Call) error {
				c.SetQuestionId(rnd(rng, 0, 1, 2, 3, uint32(rng.Intn(16)), rng.Uint32()))
				return nil
			})
		}},
		{"call: target", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			return onCall(f, func(c rpccp.Call) error {
				tgt, err := c.NewTarget()
				if err != nil {
					return err
				}
				if rng.Intn(3) == 0 {
					tgt.SetImportedCap(rnd(rng, 0, 1, uint32(rng.Intn(16)), rng.Uint32()))
					return nil
				}
				pa, err := tgt.NewPromisedAnswer()
				if err != nil {
					return err
				}
				pa.SetQuestionId(rnd(rng, 0, 1, 2, 3, uint32(rng.Intn(16)), rng.Uint32()))
				n := rng.Intn(4)
				if rng.Intn(8) == 0 {
					n = 1 + rng.Intn(2000) // a long transform
				}
				ops, err := pa.NewTransform(int32(n))
				if err != nil {
					return err
				}
				for i := range n {
					if rng.Intn(4) == 0 {
						ops.At(i).SetNoop()
					} else {
						ops.At(i).SetGetPointerField(uint16(rnd(rng, 0, 1, 2, 0xffff)))
					}
				}
				return nil
			})
		}},
		{"call: capability table", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			return onCall(f, func(c rpccp.Call) error {
				p, err := c.Params()
				if err != nil {
					return err
				}
				n := rng.Intn(5)
				table, err := p.NewCapTable(int32(n))
				if err != nil {
					return err
				}
				for i := range n {
					d := table.At(i)
					switch rng.Intn(6) {
					case 0:
						d.SetSenderHosted(rnd(rng, 1, 2, rng.Uint32()))
					case 1:
						d.SetSenderPromise(rnd(rng, 1, 2, rng.Uint32()))
					case 2:
						d.SetReceiverHosted(rnd(rng, 0, 1, rng.Uint32()))
					case 3:
						pa, err := d.NewReceiverAnswer()
						if err != nil {
							return err
						}
						pa.SetQuestionId(rnd(rng, 0, 1, 3, rng.Uint32()))
					case 4:
						tp, err := d.NewThirdPartyHosted()
						if err != nil {
							return err
						}
						tp.SetVineId(rng.Uint32())
					default:
						d.SetNone()
					}
				}
				return nil
			})
		}},
		{"call: params content", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			return onCall(f, func(c rpccp.Call) error {
				p, err := c.Params()
				if err != nil {
					return err
				}
				seg := p.Segment()
				switch rng.Intn(5) {
				case 0: // a capability beyond the table
					return p.SetContent(capnp.NewInterface(seg, capnp.CapabilityID(rnd(rng, 1, 7, rng.Uint32()))).ToPtr())
				case 1: // a list where a struct goes
					l, err := capnp.NewTextList(seg, int32(rng.Intn(4)))
					if err != nil {
						return err
					}
					return p.SetContent(l.ToPtr())
				case 2: // deep nesting
					s, err := nested(seg, 70+rng.Intn(200))
					if err != nil {
						return err
					}
					return p.SetContent(s.ToPtr())
				case 3: // a struct far bigger than any params
					s, err := capnp.NewStruct(seg, capnp.ObjectSize{DataSize: capnp.Size(8 * rng.Intn(64)), PointerCount: uint16(rng.Intn(64))})
					if err != nil {
						return err
					}
					return p.SetContent(s.ToPtr())
				default: // none
					return p.SetContent(capnp.Ptr{})
				}
			})
		}},
		{"call: sendResultsTo", func(rng *rand.Rand, f []byte, _ [][2]uint64) []byte {
			return onCall(f, func(c rpccp.Call) error {
				switch rng.Intn(3) {
				case 0:
					c.SendResultsTo().SetYourself()
				case 1:
					c.SendResultsTo().SetThirdParty(capnp.Ptr{})
				default:
					return nil
				}
				c.SetAllowThirdPartyTailCall(rng.Intn(2) == 0)
				return nil
			})
		}},
	}
}

// mutate applies m to f; a frame an earlier mutation left too odd for m (an index past its
// end) is kept as it is.
func mutate(m wireMutator, rng *rand.Rand, f []byte, methods [][2]uint64) (out []byte) {
	keep := append([]byte(nil), f...)
	defer func() {
		if recover() != nil {
			out = keep
		}
	}()
	return m.f(rng, f, methods)
}

// wireCase is one connection's bytes: the corpus up to a point, some frames mutated.
type wireCase struct {
	frames [][]byte
	ops    []string
	sync   bool // every frame is as long as it declares: itxd must answer a Bootstrap after them
	split  bool // written a few bytes at a time
}

func makeWireCase(rng *rand.Rand, corpus [][]byte, muts []wireMutator, methods [][2]uint64) wireCase {
	n := len(corpus)
	if rng.Intn(3) == 0 {
		n = 1 + rng.Intn(len(corpus))
	}
	c := wireCase{sync: true, split: rng.Intn(8) == 0}
	for i := range n {
		c.frames = append(c.frames, append([]byte(nil), corpus[i]...))
	}
	for range 1 + rng.Intn(3) {
		i, m := rng.Intn(n), muts[rng.Intn(len(muts))]
		c.frames[i] = mutate(m, rng, c.frames[i], methods)
		c.ops = append(c.ops, fmt.Sprintf("%s @%d", m.name, i))
	}
	if rng.Intn(10) == 0 { // a frame repeated: ids reused, things done twice
		i := rng.Intn(n)
		c.frames = append(c.frames, c.frames[i])
		c.ops = append(c.ops, fmt.Sprintf("repeat @%d", i))
	}
	for _, f := range c.frames {
		c.sync = c.sync && len(f) > 0 && wireFramed(f)
	}
	return c
}

// runWireCase sends c on a connection of its own and, if c.sync, waits for itxd to answer the
// Bootstrap after it or end the connection. A connection that stays up without an answer is a
// hang.
func runWireCase(addr string, c wireCase, syncFrame []byte, wait time.Duration) error {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	ended := make(chan string, 1)
	go func() { ended <- readUntilSync(conn) }()
	conn.SetWriteDeadline(time.Now().Add(wait))
	all := bytes.Join(c.frames, nil)
	if c.sync {
		all = append(all, syncFrame...)
	}
	for len(all) > 0 {
		n := len(all)
		if c.split {
			n = min(n, 7)
		}
		if _, err := conn.Write(all[:n]); err != nil {
			break // itxd ended the connection: a fine answer to bad bytes
		}
		all = all[n:]
	}
	if !c.sync {
		conn.Close()
		<-ended
		return nil
	}
	select {
	case <-ended:
		return nil
	case <-time.After(wait):
		return fmt.Errorf("itxd neither answered a Bootstrap sent after the case nor ended the connection within %v", wait)
	}
}

// readUntilSync reads itxd's messages until the Return of wireSyncQ, an Abort, or the end.
func readUntilSync(conn net.Conn) string {
	dec := capnp.NewDecoder(conn)
	for {
		msg, err := dec.Decode()
		if err != nil {
			return "closed"
		}
		m, err := rpccp.ReadRootMessage(msg)
		if err != nil {
			return "unreadable"
		}
		switch m.Which() {
		case rpccp.Message_Which_abort:
			return "aborted"
		case rpccp.Message_Which_return:
			if r, err := m.Return(); err == nil && r.AnswerId() == wireSyncQ {
				return "answered"
			}
		}
	}
}

// wireFuzzServer is the itxd process under test with what the checks between batches use.
type wireFuzzServer struct {
	*benchItxd
	hooks atomic.Int64 // webhook POSTs received
}

// requireHealthy checks, after a batch, that itxd is alive and sane: the process runs, it never
// logged a panic nor answered a handler's panic, /healthz answers, and a normal client logs in,
// appends and reads back.
func (s *wireFuzzServer) requireHealthy(t *testing.T, when string, n int) {
	t.Helper()
	select {
	case err := <-s.exited:
		t.Fatalf("%s: itxd exited: %v\n%s", when, err, tail(s.logs.String()))
	default:
	}
	logs := s.logs.String()
	for _, bad := range []string{"panic", "fatal error", "a capability handler panicked"} {
		if strings.Contains(logs, bad) {
			t.Fatalf("%s: itxd logged %q:\n%s", when, bad, tail(logs))
		}
	}
	require.Zero(t, s.scrape(t, "itx_rpc_handler_panics_total"), "%s: a handler panicked", when)
	resp, err := http.Get("http://" + s.metrics + "/healthz")
	require.NoError(t, err, when)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: /healthz", when)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, s.addr)
	require.NoError(t, err, when)
	defer c.Close()
	p := c.Login(ctx, s.creds.ProjectToken)
	defer p.Release()
	st := client.Stream(ctx, p, "/wire/alive")
	defer st.Release()
	key := fmt.Sprintf("alive-%d", n)
	res, err := client.Append(ctx, st, []itx.EventInput{keyed("wire/alive", `{"n":1}`, key)}, itx.AppendOptions{})
	require.NoError(t, err, "%s: a normal client's append", when)
	evs, err := client.GetEvents(ctx, st, itx.Query{After: res.Offsets[0] - 1, Limit: 1})
	require.NoError(t, err, when)
	require.Len(t, evs, 1, when)
	require.Equal(t, key, evs[0].IdempotencyKey, when)
}

func tail(s string) string {
	if len(s) > 8000 {
		return "..." + s[len(s)-8000:]
	}
	return s
}

// requireLetGo waits for itxd to hold nothing of the fuzz connections once they are closed:
// no RPC connection but the checks' own, no session, stream connection, live subscriber, call
// in flight or reply held, and the goroutines of connections and calls back to the baseline.
func (s *wireFuzzServer) requireLetGo(t *testing.T, when string, baseG int) {
	t.Helper()
	// 10 s: less than itxd's login deadline (30 s), which ends whatever connection a client left
	// unauthenticated, stuck or not. ITX_WIRE_FUZZ_LETGO_SECONDS changes it (a long run looking
	// past a known stuck connection).
	wait := time.Duration(envInt("ITX_WIRE_FUZZ_LETGO_SECONDS", 10)) * time.Second
	deadline := time.Now().Add(wait)
	for {
		var held []string
		for _, g := range []string{"itx_rpc_connections", "itx_sessions", "itx_open_connections", "itx_live_subscribers",
			"itx_rpc_calls_in_flight", "itx_rpc_unfinished_replies", "itx_rpc_unreturned_calls"} {
			if v := s.scrape(t, g); v != 0 {
				held = append(held, fmt.Sprintf("%s %v", g, v))
			}
		}
		g := connGoroutinesOf(t, s.benchItxd)
		if g > baseG+2 {
			held = append(held, fmt.Sprintf("%d goroutines of connections and calls (baseline %d)", g, baseG))
		}
		if len(held) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v after every fuzz connection closed, itxd holds %s\n%s", when, wait, strings.Join(held, ", "), goroutineProfile(t, s.benchItxd))
		}
		time.Sleep(50 * time.Millisecond) // polling metrics of another process: no signal to wait on
	}
}

// requireStreamsSound reads every stream of the project whole: each event the fuzz wrote is a
// whole valid event (a valid type, a JSON payload, JSON metadata or none), offsets increase,
// and each stream still answers a page.
func requireStreamsSound(t *testing.T, s *wireFuzzServer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, s.addr)
	require.NoError(t, err)
	defer c.Close()
	p := c.Login(ctx, s.creds.ProjectToken)
	defer p.Release()
	infos, err := client.ListStreams(ctx, p, "")
	require.NoError(t, err)
	total := 0
	for _, info := range infos {
		require.NoError(t, itx.ValidatePath(info.Path), "a stream the fuzz made")
		st := client.Stream(ctx, p, info.Path)
		evs, err := client.ReadAll(ctx, st, itx.Query{IncludeEphemeral: true})
		st.Release()
		require.NoError(t, err, "reading %s", info.Path)
		var last int64
		for _, e := range evs {
			require.Greater(t, e.Offset, last, "%s: offsets increase", info.Path)
			last = e.Offset
			require.NoError(t, itx.ValidateType(e.Type), "%s @%d", info.Path, e.Offset)
			require.True(t, json.Valid(e.Payload), "%s @%d: payload %q", info.Path, e.Offset, e.Payload)
			require.True(t, len(e.Metadata) == 0 || json.Valid(e.Metadata), "%s @%d: metadata %q", info.Path, e.Offset, e.Metadata)
		}
		total += len(evs)
	}
	t.Logf("%d streams, %d events, all whole", len(infos), total)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// TestItxd_WireFuzz sends mutated RPC messages on raw TCP connections to one real itxd, in
// batches; after each, itxd must be alive, have logged no panic, answer /healthz and serve a
// normal client, and hold nothing of the closed connections. At the end every stream the fuzz
// touched reads back whole.
func TestItxd_WireFuzz(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real itxd process")
	}
	cases := envInt("ITX_WIRE_FUZZ_CASES", 10000)
	seed := int64(envInt("ITX_WIRE_FUZZ_SEED", 1))
	only := envInt("ITX_WIRE_FUZZ_CASE", -1)
	const batch, workers = 500, 6
	const wait = 20 * time.Second

	s := &wireFuzzServer{benchItxd: startBenchItxd(t, "--pprof")}
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		s.hooks.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(hook.Close)
	const path = "/wire/fuzz"
	corpus := wireCorpus(t, s.creds.ProjectToken, path, hook.URL+"/hook")
	syncFrame := wireBootstrap(t, wireSyncQ)
	muts, methods := wireMutators(), wireMethods()

	// The corpus itself, unmutated, is a valid session: itxd answers it in full.
	require.NoError(t, runWireCase(s.addr, wireCase{frames: corpus, sync: true}, syncFrame, wait))
	s.requireHealthy(t, "after the unmutated corpus", 0)
	s.requireLetGo(t, "after the unmutated corpus", 1<<30)
	baseG := connGoroutinesOf(t, s.benchItxd)

	first, last := 0, cases
	if only >= 0 {
		first, last = only, only+1
	}
	start := time.Now()
	var warmHeap float64
	for from := first; from < last; from += batch {
		to := min(last, from+batch)
		var mu sync.Mutex
		var failures []string
		next := atomic.Int64{}
		next.Store(int64(from))
		var wg sync.WaitGroup
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1) - 1)
					if i >= to {
						return
					}
					c := makeWireCase(rand.New(rand.NewSource(seed+int64(i))), corpus, muts, methods)
					err := runWireCase(s.addr, c, syncFrame, wait)
					if err != nil {
						mu.Lock()
						failures = append(failures, fmt.Sprintf("case %d (seed %d; %s): %v", i, seed, strings.Join(c.ops, ", "), err))
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		when := fmt.Sprintf("after cases %d-%d (seed %d)", from, to-1, seed)
		s.requireHealthy(t, when, to) // first: a crashed itxd fails every case after it
		if len(failures) > 0 {
			t.Fatalf("%s: %d cases failed, the first: %s", when, len(failures), strings.Join(failures[:min(5, len(failures))], "; "))
		}
		s.requireLetGo(t, when, baseG)
		heap, _ := itxdMemory(t, s.benchItxd)
		loaded := s.scrape(t, "itx_loaded_streams")
		if warmHeap == 0 {
			warmHeap = heap
		}
		t.Logf("%s in %v: live heap %.1f MiB, %v streams loaded, %v webhook posts, %v connections aborted",
			when, time.Since(start).Round(time.Millisecond), heap/(1<<20), loaded, s.hooks.Load(), s.scrape(t, "itx_rpc_connections_aborted_total"))
		// Each loaded stream (a path the fuzz made valid) holds its actor and caches; beyond
		// them the connections must have left nothing: 8 MiB is above what a run holds (about
		// 1-2 MiB after 130,000 cases) and below what 10,000 cases leaking 1.5 KiB each make.
		require.Less(t, heap, warmHeap+8<<20+loaded*(256<<10), "%s: itxd's live heap keeps growing", when)
	}
	requireStreamsSound(t, s)
}
