package processors_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
	proctest "github.com/itx-dev/itx/processors/testing"
)

type replayState struct {
	N    int            `json:"n"`
	Seen map[string]any `json:"seen,omitempty"`
}

func checkedContract(reduce func(replayState, itx.Event) replayState) processors.Contract[replayState] {
	return processors.Contract[replayState]{
		Name: "counter", ConsumedTypes: []string{"tick"}, ReducerVersion: "2",
		InitialState: func() replayState { return replayState{} },
		Reduce:       reduce,
	}
}

func historyOf(t *testing.T, n int) *proctest.MemoryStream {
	t.Helper()
	s := proctest.NewMemoryStream("/replay", itx.SystemClock{})
	for i := range n {
		typ := "tick"
		if i%3 == 2 {
			typ = "other"
		}
		if _, err := s.Append(context.Background(), []itx.EventInput{{Type: typ, Payload: json.RawMessage(`{"i":` + strings.Repeat("1", 1+i%3) + `}`)}}); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// A sound reducer replays: the report counts the consumed events and holds the state the fold
// gives, and SameState compares it with a live snapshot as JSON values.
func TestReplayCheck_Sound(t *testing.T) {
	s := historyOf(t, 30)
	rep, err := processors.ReplayCheck(context.Background(), checkedContract(func(c replayState, e itx.Event) replayState {
		c.N++
		return c
	}), s)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Events != 20 || rep.ReducedThrough != 30 {
		t.Fatalf("report %+v, want 20 events through 30", rep)
	}
	if !rep.SameState(json.RawMessage(`{ "n" : 20 }`)) || rep.SameState(json.RawMessage(`{"n":19}`)) {
		t.Errorf("SameState compares values: state %s", rep.State)
	}
}

// What must fail the check: a panic (named by offset), a Reduce that is not deterministic, and a
// state that does not survive its progress record.
func TestReplayCheck_Refuses(t *testing.T) {
	s := historyOf(t, 10)
	calls := 0
	for _, tc := range []struct {
		name, want string
		reduce     func(replayState, itx.Event) replayState
	}{
		{"panic", "Reduce panicked on offset 5 (tick)", func(c replayState, e itx.Event) replayState {
			if e.Offset == 5 {
				var m map[string]int
				m["x"] = 1
			}
			return c
		}},
		{"clock", "Reduce is not deterministic", func(c replayState, e itx.Event) replayState {
			calls++
			c.N = calls
			return c
		}},
		{"big numbers", "does not survive its progress record", func(c replayState, e itx.Event) replayState {
			c.Seen = map[string]any{"big": int64(1<<60 + 1)}
			return c
		}},
		// The runner may commit after any event (batches are transport), so a state mid-history
		// must survive its record too, even when the final state does.
		{"big numbers mid-history", "the state after offset 4 does not survive its progress record", func(c replayState, e itx.Event) replayState {
			c.Seen = nil
			if e.Offset == 4 {
				c.Seen = map[string]any{"big": int64(1<<60 + 1)}
			}
			return c
		}},
	} {
		_, err := processors.ReplayCheck(context.Background(), checkedContract(tc.reduce), s)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	// A Validate that panics is named by offset too (the runner takes it for a rejection).
	c := checkedContract(func(c replayState, e itx.Event) replayState { return c })
	c.Validate = func(e itx.Event) error {
		if e.Offset == 7 {
			panic("poisoned validate")
		}
		return nil
	}
	if _, err := processors.ReplayCheck(context.Background(), c, s); err == nil || !strings.Contains(err.Error(), "Validate panicked on offset 7 (tick)") {
		t.Errorf("validate panic: %v", err)
	}
}
