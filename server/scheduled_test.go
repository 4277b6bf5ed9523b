package server

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
)

// A schedule call for a key that lands in the same step (it came due as the call arrived: a
// processor moving its timer at its time) finds the key in the log, as it would a step later:
// nothing is scheduled again, and the reply names the offset when the call's body is the one
// that landed, or is an idempotencyConflict naming it when the call moves the body (the log
// holds the old one). Kept, the moved row would land later as a refused duplicate (a
// stream/error-occurred record), and the caller was told of a time that never comes. Driven on
// the step: over RPC the two cannot be made to meet in one step.
func TestStep_ScheduleOfAKeyLandingInTheSameStep(t *testing.T) {
	for _, tc := range []struct {
		name, moved string
		conflict    bool
	}{
		{"the same body", `{"n":1}`, false},
		{"another body", `{"n":2}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStepScript(t)
			env, stored := scheduledEnv(s)
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
			eff, err = step(s.st, stepInput{schedules: []scheduleOp{op(tc.moved, due.Add(time.Hour))}}, due, env)
			require.NoError(t, err)
			require.Len(t, eff.commit.Events, 1, "landed")
			landed := eff.commit.Events[0]
			require.Equal(t, "k", landed.IdempotencyKey)
			require.JSONEq(t, `{"n":1}`, string(landed.Payload))
			require.Len(t, eff.scheduleAnswers, 1)
			got := eff.scheduleAnswers[0].reply
			if tc.conflict {
				require.Equal(t, itx.EIdempotencyConflict, itx.ErrorCode(got.err), "error: %v", got.err)
				require.Contains(t, itx.ErrorMessage(got.err), fmt.Sprintf("offset %d", landed.Offset))
				require.Zero(t, got.appended)
			} else {
				require.NoError(t, got.err)
				require.Equal(t, landed.Offset, got.appended, "the key is in the log: nothing scheduled")
			}
			require.Zero(t, got.dueAt)
			require.Empty(t, eff.commit.ScheduledUpserts, "no row to land later")
			require.NotContains(t, s.st.scheduled, "k")
		})
	}
}

// A scheduled event is refused for what makes it unschedulable, named as such: an ephemeral
// one (which must carry the key that names its schedule) is "cannot be ephemeral", not the
// append's "ephemeral events cannot carry an idempotency key".
func TestNewScheduleOp_Refusals(t *testing.T) {
	for _, tc := range []struct {
		in   itx.EventInput
		want string
	}{
		{itx.EventInput{Type: "r"}, "a scheduled event needs an idempotencyKey: it names the schedule, and makes its append exactly once"},
		{itx.EventInput{Type: "r", IdempotencyKey: "k", Ephemeral: true}, "a scheduled event cannot be ephemeral"},
		{itx.EventInput{Type: "r", Ephemeral: true}, "a scheduled event cannot be ephemeral"},
		{itx.EventInput{Type: "stream/subscription-removed", IdempotencyKey: "k"}, "a scheduled event cannot be a stream/* record"},
		{itx.EventInput{Type: "bad type", IdempotencyKey: "k"}, `type "bad type" contains whitespace or a control character`},
	} {
		_, err := newScheduleOp(tc.in, 1)
		require.Equal(t, itx.EInvalid, itx.ErrorCode(err), "%+v: %v", tc.in, err)
		require.Equal(t, tc.want, itx.ErrorMessage(err), "%+v", tc.in)
	}
}

// A scheduled event lands, and is listed, with the bytes an append of it stores: its payload and
// metadata compacted, never rewritten. Encoded with json.Marshal, '<', '>', '&', U+2028 and
// U+2029 in them came back escaped ({"s":"\u003c"}): the same JSON value, other bytes than sent.
func TestStep_ScheduledEventLandsAsSent(t *testing.T) {
	s := newStepScript(t)
	env, stored := scheduledEnv(s)
	payload, metadata := "{\"s\": \"<a&b>\u2028\u2029\"}", `{"m":"&"}`
	op, err := newScheduleOp(itx.EventInput{Type: "reminder", Payload: json.RawMessage(payload),
		Metadata: json.RawMessage(metadata), IdempotencyKey: "k"}, s.now.Add(time.Minute).UnixMilli())
	require.NoError(t, err)
	eff, err := step(s.st, stepInput{schedules: []scheduleOp{op}}, s.now, env)
	require.NoError(t, err)
	require.Len(t, eff.commit.ScheduledUpserts, 1)
	stored["k"] = eff.commit.ScheduledUpserts[0].Event
	listed, err := unmarshalScheduled(stored["k"])
	require.NoError(t, err)
	require.Equal(t, "{\"s\":\"<a&b>\u2028\u2029\"}", string(listed.Payload), "as listScheduled reads it")

	eff, err = step(s.st, stepInput{}, s.now.Add(time.Minute), env)
	require.NoError(t, err)
	require.Len(t, eff.commit.Events, 1, "landed")
	require.Equal(t, "{\"s\":\"<a&b>\u2028\u2029\"}", string(eff.commit.Events[0].Payload))
	require.Equal(t, metadata, string(eff.commit.Events[0].Metadata))
}

// Rows written before scheduledRow held the payload and metadata as JSON values: they decode as
// they did, beside the rows that hold them as strings.
func TestUnmarshalScheduled_RowsOfBothForms(t *testing.T) {
	old, err := unmarshalScheduled([]byte(`{"type":"r","payload":{"n":1},"idempotencyKey":"k","metadata":{"m":2}}`))
	require.NoError(t, err)
	require.Equal(t, itx.EventInput{Type: "r", Payload: json.RawMessage(`{"n":1}`), IdempotencyKey: "k", Metadata: json.RawMessage(`{"m":2}`)}, old)
	in := itx.EventInput{Type: "r", Payload: json.RawMessage(`{"s":"<&>"}`), IdempotencyKey: "k"}
	got, err := unmarshalScheduled(marshalScheduled(&in))
	require.NoError(t, err)
	require.Equal(t, in, got)
}

// scheduledEnv is s's step environment whose scheduled rows are read from stored, a map the
// test writes each scheduled row into by its key.
func scheduledEnv(s *stepScript) (stepEnv, map[string][]byte) {
	env := s.env()
	stored := map[string][]byte{}
	env.loadScheduled = func(keys []string) (map[string][]byte, error) {
		out := map[string][]byte{}
		for _, k := range keys {
			out[k] = stored[k]
		}
		return out, nil
	}
	return env, stored
}
