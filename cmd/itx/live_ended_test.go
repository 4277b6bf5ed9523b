package main

import (
	"context"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/cmd/itx/internal/repl"
	"github.com/stretchr/testify/require"
)

// A script's live view says why it ended, as a connection's take() does: patches() waiting on a
// view itxd ended (its stream deleted) throws the end, with the code the server gave, instead
// of answering [] at once to every call (a loop over patches() spun, never learning the view
// was over), and snapshot() carries it as closed. A view the script cancelled says so too, and
// .watch ends with the server's code (notFound for streamRemoved), not unavailable.
func TestEval_LiveViewSaysWhyItEnded(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	ts.appendDirect(t, "/ended", itx.EventInput{Type: "a"})
	s.mustEval(t, `var st = project.streams.get("/ended"); var live = st.liveState()`)
	require.Nil(t, obj(t, s.mustEval(t, `live.snapshot()`))["closed"], "a view that runs is not closed")
	s.mustEval(t, `project.streams.remove("/ended", true)`)

	// What came before the end is returned first; then the end itself, at once.
	var f struct{ Code, Message string }
	for i := 0; ; i++ {
		require.Less(t, i, 10, "patches() never said the view ended")
		start := time.Now()
		out, err := s.eval(t, `live.patches(1, 20000)`)
		require.Less(t, time.Since(start), 15*time.Second, "patches() on an ended view waited for its timeout")
		if err != nil {
			d := repl.Describe(err)
			f.Code, f.Message = d.Code, d.Message
			break
		}
		require.NotEqual(t, "[]", out, "patches() answered nothing, without saying the view ended")
	}
	require.Equal(t, "notFound", f.Code, f.Message)
	require.Contains(t, f.Message, "streamRemoved")
	closed := obj(t, obj(t, s.mustEval(t, `live.snapshot()`))["closed"])
	require.Equal(t, "notFound", closed["code"])
	require.Contains(t, closed["message"], "streamRemoved")

	// Cancelled by the script: failedPrecondition, at once.
	ts.appendDirect(t, "/ended2", itx.EventInput{Type: "a"})
	s.mustEval(t, `var live2 = project.streams.get("/ended2").liveState(); live2.cancel()`)
	start := time.Now()
	g := s.failure(t, `live2.patches(1, 20000)`)
	require.Less(t, time.Since(start), 15*time.Second)
	require.Equal(t, "failedPrecondition", g.Code, g.Message)
	require.Equal(t, "failedPrecondition", obj(t, obj(t, s.mustEval(t, `live2.snapshot()`))["closed"])["code"])

	// .watch ends with the server's code.
	ts.appendDirect(t, "/ended3", itx.EventInput{Type: "a"})
	w := newSession(t, ts)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	result := make(chan error, 1)
	go func() { result <- w.RunCommand(ctx, "watch /ended3") }()
	require.True(t, w.out.waitFor(`"head":1`), "the snapshot: %q", w.out.String())
	s.mustEval(t, `project.streams.remove("/ended3", true)`)
	select {
	case err := <-result:
		require.Error(t, err)
		require.Equal(t, itx.ENotFound, itx.ErrorCode(err), "%v", err)
		require.Contains(t, err.Error(), "streamRemoved")
	case <-time.After(20 * time.Second):
		t.Fatal(".watch went on after its stream was removed")
	}
}
