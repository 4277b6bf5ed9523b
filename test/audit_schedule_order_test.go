package test

import (
	"fmt"
	"runtime"
	"testing"

	"capnproto.org/go/capnp/v3"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/wire"
	"github.com/stretchr/testify/require"
)

// Scheduling a key again moves it (schema: Stream.schedule): schedules and cancels sent on one
// Stream capability without waiting apply in the order sent, so the time sent last stands, and a
// cancel sent after a schedule finds it.
func TestAudit_PipelinedSchedulesApplyInOrder(t *testing.T) {
	// More Ps than this machine's cores make the server run a released call queue's next call
	// beside the one before it, as it does on a larger machine (the server is in this process).
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/audit/schedule-order")
	mustAppend(t, s, ev("a", `{}`))
	base := e.clock.Now().Add(24 * 3600e9).UnixMilli() // never due in this test
	const n = 40
	for round := range 10 {
		key, gone := fmt.Sprintf("moved-%d", round), fmt.Sprintf("cancelled-%d", round)
		var futs []schema.Stream_schedule_Results_Future
		var rels []capnp.ReleaseFunc
		schedule := func(key string, due int64) {
			in := keyed("reminder", `{}`, key)
			fut, rel := s.Schedule(e.ctx, func(p schema.Stream_schedule_Params) error {
				ev, err := p.NewEvent()
				if err != nil {
					return err
				}
				p.SetDueAt(due)
				return wire.SetEventInput(ev, &in)
			})
			futs, rels = append(futs, fut), append(rels, rel)
		}
		for i := 1; i <= n; i++ {
			schedule(key, base+int64(i))
		}
		schedule(gone, base)
		cf, cr := s.CancelScheduled(e.ctx, func(p schema.Stream_cancelScheduled_Params) error { return p.SetKey(gone) })
		for _, f := range futs {
			_, err := f.Struct()
			require.NoError(t, err)
		}
		res, err := cf.Struct()
		require.NoError(t, err)
		require.True(t, res.Cancelled(), "round %d: the cancel sent after the schedule finds it", round)
		cr()
		for _, r := range rels {
			r()
		}
		list, err := client.ListScheduled(e.ctx, s)
		require.NoError(t, err)
		due := map[string]int64{}
		for _, sc := range list {
			due[sc.Event.IdempotencyKey] = sc.DueAt
		}
		require.NotContains(t, due, gone, "round %d", round)
		require.Equal(t, base+n, due[key], "round %d: the time sent last stands", round)
	}
}
