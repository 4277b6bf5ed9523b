package examples_test

import (
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/examples"
	proctest "github.com/itx-dev/itx/processors/testing"
)

var routerConfig = proctest.Config[examples.RouterState]{
	Path: "/support",
	New:  func(proctest.Env) processors.Contract[examples.RouterState] { return examples.Router() },
}

func routed(thread, text string) itx.EventInput {
	return examples.RouterMessage.Input(examples.Routed{Thread: thread, Text: text}, "")
}

// threadForwards lists the source offsets forwarded to a thread's stream, in order.
func threadForwards(t *testing.T, h *proctest.Harness[examples.RouterState], thread string) []int64 {
	t.Helper()
	var out []int64
	for _, e := range h.StreamAt("/support/threads/" + thread).Events(string(examples.ThreadMessage)) {
		f, err := examples.ThreadMessage.Decode(e)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, f.SourceOffset)
	}
	return out
}

// Every message lands once on its thread's stream; one naming no usable thread is counted, not
// forwarded.
func TestRouter_EveryMessageOnItsThreadOnce(t *testing.T) {
	proctest.Run(t, routerConfig, func(t *testing.T, h *proctest.Harness[examples.RouterState]) {
		h.Append(routed("t1", "hello"), routed("t2", "hi"), routed("a/b", "nested"), routed("t1", "again"))
		if got := threadForwards(t, h, "t1"); len(got) != 2 || got[0] != 1 || got[1] != 4 {
			t.Errorf("t1 got %v, want [1 4]", got)
		}
		if got := threadForwards(t, h, "t2"); len(got) != 1 || got[0] != 2 {
			t.Errorf("t2 got %v, want [2]", got)
		}
		if st := h.State(); st.Routed != 3 || st.Unroutable != 1 {
			t.Errorf("state %+v, want 3 routed and 1 unroutable", st)
		}
	})
}

// Evicted after a forward committed and before the frame's progress did: the successor routes the
// event again and the thread's stream keeps one copy (the key).
func TestRouter_EvictionMidRoute(t *testing.T) {
	proctest.Run(t, routerConfig, func(t *testing.T, h *proctest.Harness[examples.RouterState]) {
		thread := h.StreamAt("/support/threads/t1")
		thread.LoseAcks(func(itx.EventInput) bool { return true }) // committed, the answer lost
		h.Append(routed("t1", "hello"))
		h.Crash()
		thread.LoseAcks(nil)
		h.Append(routed("t2", "wake")) // the production-real wake of the successor
		if got := threadForwards(t, h, "t1"); len(got) != 1 || got[0] != 1 {
			t.Errorf("t1 got %v, want one forward of 1", got)
		}
		if got := threadForwards(t, h, "t2"); len(got) != 1 {
			t.Errorf("t2 got %v, want one forward", got)
		}
	})
}
