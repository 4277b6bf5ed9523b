package test

import (
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"testing"

	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// hostileStep sends one protocol message a go-capnp client never sends (or sends out of
// order). Each must leave itxd up: the worst it may do is abort the offending connection.
type hostileStep struct {
	name string
	send func(r *itxtest.RawClient, rng *rand.Rand)
}

// bogusDisembargo sends a Disembargo on a random import with a random id in the context set sets.
func bogusDisembargo(set func(c rpccp.Disembargo_context, id uint32)) func(r *itxtest.RawClient, rng *rand.Rand) {
	return func(r *itxtest.RawClient, rng *rand.Rand) {
		r.Send(func(m rpccp.Message) error {
			d, err := m.NewDisembargo()
			if err != nil {
				return err
			}
			tgt, err := d.NewTarget()
			if err != nil {
				return err
			}
			tgt.SetImportedCap(uint32(rng.Intn(8)))
			set(d.Context(), rng.Uint32())
			return nil
		})
	}
}

func hostileSteps() []hostileStep {
	importedCall := func(id uint32, method uint16) func(r *itxtest.RawClient, rng *rand.Rand) {
		return func(r *itxtest.RawClient, rng *rand.Rand) {
			r.Send(func(m rpccp.Message) error {
				c, err := m.NewCall()
				if err != nil {
					return err
				}
				c.SetQuestionId(rng.Uint32())
				c.SetInterfaceId(schema.Gateway_TypeID)
				c.SetMethodId(method)
				tgt, err := c.NewTarget()
				if err != nil {
					return err
				}
				tgt.SetImportedCap(id)
				_, err = c.NewParams()
				return err
			})
		}
	}
	return []hostileStep{
		{"bootstrap repeat id", func(r *itxtest.RawClient, rng *rand.Rand) { r.Bootstrap(uint32(rng.Intn(4))) }},
		{"bootstrap huge id", func(r *itxtest.RawClient, rng *rand.Rand) { r.Bootstrap(^uint32(0) - uint32(rng.Intn(4))) }},
		{"call on unknown question", func(r *itxtest.RawClient, rng *rand.Rand) { r.Version(rng.Uint32(), rng.Uint32()) }},
		{"call on maybe-known question", func(r *itxtest.RawClient, rng *rand.Rand) {
			r.Version(uint32(rng.Intn(8)), uint32(rng.Intn(8)))
		}},
		{"call method out of range", func(r *itxtest.RawClient, rng *rand.Rand) {
			r.Call(uint32(rng.Intn(8)), uint32(rng.Intn(8)), schema.Gateway_TypeID, uint16(rng.Intn(1<<16)), 1, nil)
		}},
		{"call wrong interface", func(r *itxtest.RawClient, rng *rand.Rand) {
			r.Call(uint32(rng.Intn(8)), uint32(rng.Intn(8)), rng.Uint64(), 0, 1, nil)
		}},
		{"call imported cap never exported", importedCall(12345, 1)},
		{"call imported cap 0", importedCall(0, 1)},
		{"finish unknown", func(r *itxtest.RawClient, rng *rand.Rand) { r.Finish(rng.Uint32()) }},
		{"finish maybe-known", func(r *itxtest.RawClient, rng *rand.Rand) { r.Finish(uint32(rng.Intn(8))) }},
		{"release unknown", func(r *itxtest.RawClient, rng *rand.Rand) {
			r.Send(func(m rpccp.Message) error {
				rel, err := m.NewRelease()
				rel.SetId(uint32(rng.Intn(8)))
				rel.SetReferenceCount(rng.Uint32())
				return err
			})
		}},
		{"return never asked", func(r *itxtest.RawClient, rng *rand.Rand) {
			r.Send(func(m rpccp.Message) error {
				ret, err := m.NewReturn()
				ret.SetAnswerId(uint32(rng.Intn(8)))
				return err
			})
		}},
		{"resolve never sent", func(r *itxtest.RawClient, rng *rand.Rand) {
			r.Send(func(m rpccp.Message) error {
				res, err := m.NewResolve()
				if err != nil {
					return err
				}
				res.SetPromiseId(uint32(rng.Intn(8)))
				_, err = res.NewException()
				return err
			})
		}},
		{"disembargo senderLoopback bogus", bogusDisembargo(func(c rpccp.Disembargo_context, id uint32) { c.SetSenderLoopback(id) })},
		{"disembargo receiverLoopback bogus", bogusDisembargo(func(c rpccp.Disembargo_context, id uint32) { c.SetReceiverLoopback(id) })},
	}
}

// TestItxd_HostileProtocolSequences sends seeded random sequences of protocol messages a
// well-behaved client never sends, before login, and checks after each that the server is
// still up and serves a well-behaved client on another connection.
func TestItxd_HostileProtocolSequences(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/hostile")
	steps := hostileSteps()
	seed, rounds := int64(1), 80 // seed 68 crashed itxd before the pcall patch
	if v, err := strconv.Atoi(os.Getenv("ITX_HOSTILE_ROUNDS")); err == nil {
		rounds = v // longer runs: ITX_HOSTILE_ROUNDS=2000
	}
	for i := 0; i < rounds; i++ {
		seed := seed + int64(i)
		rng := rand.New(rand.NewSource(seed))
		var names []string
		r := itxtest.DialRaw(t, ts.addr)
		r.SendMayFail()
		r.Bootstrap(0)
		for j := 0; j < 12; j++ {
			st := steps[rng.Intn(len(steps))]
			names = append(names, st.name)
			st.send(r, rng)
		}
		r.Bootstrap(1000)
		// Drain until the server replies or aborts; either way the peer is handled.
		for {
			which, answer, _, err := r.Next()
			if err != nil || which == rpccp.Message_Which_abort || (which == rpccp.Message_Which_return && answer == 1000) {
				break
			}
		}
		_, err := client.Append(ctxT(t), s, []itx.EventInput{ev("alive", fmt.Sprintf(`{"seed":%d}`, seed))}, itx.AppendOptions{})
		require.NoError(t, err, "after seed %d: %v", seed, names)
	}
}
