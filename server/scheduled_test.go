package server

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
)

// A schedule call for a key that lands in the same step (it came due as the call arrived: a
// processor moving its timer at its time) finds the key in the log, as it would a step later:
// nothing is scheduled again and the reply names the offset. Kept, the moved row would land
// later as a refused duplicate (a stream/error-occurred record), and the caller was told of a
// time that never comes. Driven on the step: over RPC the two cannot be made to meet in one step.
func TestStep_ScheduleOfAKeyLandingInTheSameStep(t *testing.T) {
	s := newStepScript(t)
	env := s.env()
	stored := map[string][]byte{}
	env.loadScheduled = func(keys []string) (map[string][]byte, error) {
		out := map[string][]byte{}
		for _, k := range keys {
			out[k] = stored[k]
		}
		return out, nil
	}
	op := func(payload string, dueAt time.Time) scheduleOp {
		o, err := newScheduleOp(itx.EventInput{Type: "reminder", Payload: json.RawMessage(payload), IdempotencyKey: "k"}, dueAt.UnixMilli())
		require.NoError(t, err)
		return o
	}
	due := s.now.Add(time.Minute)
	eff, err := step(s.st, stepInput{schedules: []scheduleOp{op(`{"n":1}`, due)}}, s.now, env)
	require.NoError(t, err)
	require.Len(t, eff.commit.ScheduledUpserts, 1)
	stored["k"] = eff.commit.ScheduledUpserts[0].Event

	// At its time, before the timer's step: the move arrives in the step that lands it.
	eff, err = step(s.st, stepInput{schedules: []scheduleOp{op(`{"n":2}`, due.Add(time.Hour))}}, due, env)
	require.NoError(t, err)
	require.Len(t, eff.commit.Events, 1, "landed")
	landed := eff.commit.Events[0]
	require.Equal(t, "k", landed.IdempotencyKey)
	require.Len(t, eff.scheduleAnswers, 1)
	got := eff.scheduleAnswers[0].reply
	require.NoError(t, got.err)
	require.Equal(t, landed.Offset, got.appended, "the key is in the log: nothing scheduled")
	require.Zero(t, got.dueAt)
	require.Empty(t, eff.commit.ScheduledUpserts, "no row to land later")
	require.NotContains(t, s.st.scheduled, "k")
}
