package main

import (
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
)

// Issue 9 from the prompt: a connection (take, ping, key, close), the readers and the stream's
// live state are callable from itx, with the server's semantics: batches by the caps, ping's
// head and delivered offsets, a closed connection answering failedPrecondition and take()
// saying why it closed; readers register, move, list with lag, and remove (notFound for an
// unknown one); the live state's snapshot shows the readers and connections and patches follow.
func TestEval_ConnectionReadersAndLiveStateAtThePrompt(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var st = project.streams.get("/prompt"); st.append([{type: "a"}, {type: "b"}, {type: "a"}])`)
	s.mustEval(t, `var c = st.openConnection({after: 1, types: ["a"], key: "tab", openedBy: "me"})`)
	var got []any
	waitFor(t, "the event after 1 of type a", func() bool {
		got = append(got, arr(t, obj(t, s.mustEval(t, `c.take()`))["events"])...)
		return len(got) > 0
	})
	require.Len(t, got, 1)
	require.Equal(t, float64(3), obj(t, got[0])["offset"])
	waitFor(t, "delivered through the head", func() bool {
		p := obj(t, s.mustEval(t, `c.ping()`))
		return p["headOffset"] == float64(3) && p["deliveredOffset"] == float64(3)
	})

	s.mustEval(t, `st.readers.register("mirror", 1)`)
	rows := arr(t, s.mustEval(t, `st.readers.list()`))
	require.Len(t, rows, 1)
	require.Equal(t, []any{"mirror", float64(1), float64(2)}, []any{obj(t, rows[0])["name"], obj(t, rows[0])["checkpoint"], obj(t, rows[0])["lag"]})
	require.Equal(t, "notFound", s.failure(t, `st.readers.remove("nobody")`).Code)
	require.Equal(t, "invalidArgument", s.failure(t, `st.readers.register("mirror", 4)`).Code)

	s.mustEval(t, `var live = st.liveState()`)
	state := obj(t, obj(t, s.mustEval(t, `live.snapshot()`))["state"])
	require.Equal(t, float64(3), state["head"])
	require.Equal(t, map[string]any{"checkpoint": float64(1), "lag": float64(2)}, obj(t, state["readers"])["mirror"])
	require.Equal(t, "me", obj(t, obj(t, state["connections"])["tab"])["openedBy"])
	ts.appendDirect(t, "/prompt", itx.EventInput{Type: "b"})
	// A patch, or a fresh snapshot when the view fell more than one revision behind (the head
	// and the connection's delivered offset change one after the other).
	waitFor(t, "a patch or a snapshot with the new head", func() bool {
		out, err := s.eval(t, `JSON.stringify(live.patches())`)
		if err == nil && strings.Contains(out, `/head`) {
			return true
		}
		return obj(t, obj(t, s.mustEval(t, `live.snapshot()`))["state"])["head"] == float64(4)
	})

	s.mustEval(t, `c.close("done")`)
	f := s.failure(t, `c.ping()`)
	require.Equal(t, "failedPrecondition", f.Code, f.Message)
	s.mustEval(t, `st.readers.remove("mirror")`)
	require.Empty(t, arr(t, s.mustEval(t, `st.readers.list()`)))
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 10*time.Second, 5*time.Millisecond, what)
}
