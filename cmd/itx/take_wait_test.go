package main

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
)

// take(min, timeoutMs) waits for what a script needs instead of answering with whatever the
// sink held at that instant: a script that opened a connection at offset 0 and took at once
// got no events (the catch-up had not arrived yet) and had to poll.
func TestEval_TakeWaitsForEvents(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/waits", itx.EventInput{Type: "a"}, itx.EventInput{Type: "b"}, itx.EventInput{Type: "c"})
	s := newSession(t, ts)
	s.mustEval(t, `var st = project.streams.get("/waits"); var c = st.openConnection(0)`)

	// The catch-up: three events, however the server split them into batches.
	var got []any
	for i := 0; i < 3 && len(got) < 3; i++ { // each take returns at least one event
		got = append(got, arr(t, obj(t, s.mustEval(t, `c.take(`+strconv.Itoa(3-len(got))+`)`))["events"])...)
	}
	require.Len(t, got, 3)
	for i, e := range got {
		require.Equal(t, float64(i+1), obj(t, e)["offset"])
	}

	// Nothing more comes: deadlineExceeded after timeoutMs, saying how many arrived.
	f := s.failure(t, `c.take({timeoutMs: 50})`)
	require.Equal(t, "deadlineExceeded", f.Code, f.Message)
	require.Contains(t, f.Message, "0 of 1 events arrived within 50ms")

	// A take waiting while an event is appended returns it.
	done := make(chan string, 1)
	go func() {
		out, err := s.eval(t, `c.take(1, 20000).events.map(e => e.type).join(",")`)
		if err != nil {
			out = err.Error()
		}
		done <- out
	}()
	ts.appendDirect(t, "/waits", itx.EventInput{Type: "d"})
	select {
	case out := <-done:
		require.Equal(t, `"d"`, out)
	case <-time.After(20 * time.Second):
		t.Fatal("take(1) did not return after an append")
	}

	// Events that arrive after a take timed out stay for the next one.
	require.Equal(t, "deadlineExceeded", s.failure(t, `c.take(2, 50)`).Code)
	ts.appendDirect(t, "/waits", itx.EventInput{Type: "e"})
	require.Equal(t, "e", obj(t, arr(t, obj(t, s.mustEval(t, `c.take(1)`))["events"])[0])["type"])

	// Bad arguments are refused before any wait.
	require.Equal(t, "invalidArgument", s.failure(t, `c.take(10001)`).Code)
	require.Equal(t, "invalidArgument", s.failure(t, `c.take(-1)`).Code)
	require.Equal(t, "invalidArgument", s.failure(t, `c.take(1, 10, 3)`).Code)

	// A connection the server closed answers at once, with why.
	s.mustEval(t, `var k = st.openConnection({after: 5, key: "k"})`)
	s.mustEval(t, `var k2 = st.openConnection({after: 5, key: "k"})`)
	closed := obj(t, s.mustEval(t, `k.take({min: 1, timeoutMs: 20000})`))
	require.NotNil(t, closed["closed"], "the replaced connection's take: %v", closed)
	// One the script closed answers at once too.
	s.mustEval(t, `k2.close("done")`)
	start := time.Now()
	s.mustEval(t, `k2.take(1, 20000)`)
	require.Less(t, time.Since(start), 15*time.Second, "take on a closed connection waited for its timeout")

	// Ctrl-C (the evaluation's context ending) ends a wait.
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan error, 1)
	go func() {
		_, err := s.Eval(ctx, "<test>", `c.take(1, 600000)`)
		ended <- err
	}()
	cancel()
	select {
	case err := <-ended:
		require.Error(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("a take waiting for 10 minutes did not end with its context")
	}
}

// patches(min, timeoutMs) waits for the next patch (or a fresh snapshot) of a live view.
func TestEval_PatchesWaitForChanges(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/patched", itx.EventInput{Type: "a"})
	s := newSession(t, ts)
	s.mustEval(t, `var live = project.streams.get("/patched").liveState()`)
	require.Equal(t, float64(1), obj(t, obj(t, s.mustEval(t, `live.snapshot()`))["state"])["head"])

	f := s.failure(t, `live.patches({timeoutMs: 50})`)
	require.Equal(t, "deadlineExceeded", f.Code, f.Message)
	require.Contains(t, f.Message, "0 of 1 patches")

	ts.appendDirect(t, "/patched", itx.EventInput{Type: "b"})
	patches := arr(t, s.mustEval(t, `live.patches(1)`))
	if len(patches) == 0 { // a fresh snapshot replaced them
		require.Equal(t, float64(2), obj(t, obj(t, s.mustEval(t, `live.snapshot()`))["state"])["head"])
	} else {
		raw, err := json.Marshal(patches)
		require.NoError(t, err)
		require.Contains(t, string(raw), `"/head"`)
	}
	require.Equal(t, "invalidArgument", s.failure(t, `live.patches(5001)`).Code)
}

// project.capabilities.mount(name) serves a Receiver from the prompt, so an itx-call
// subscription can be tried without writing a program: its batches are confirmed as they
// arrive and held for take(), unmount() ends the mount and parks the subscription, and the
// next mount under the name resumes it. (mount refused, naming the Go SDK.)
func TestEval_MountServesAReceiver(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/jobs", itx.EventInput{Type: "job", Payload: json.RawMessage(`{"n":1}`)})
	s := newSession(t, ts)
	s.mustEval(t, `var inbox = project.capabilities.mount("worker")`)
	require.Equal(t, []any{"worker"}, arr(t, s.mustEval(t, `project.capabilities.list().map(m => m.name)`)))
	// .help's {name, mountedAt, scope}: a whole-project mount's scope is "", not left out.
	require.Equal(t, "", s.mustEval(t, `project.capabilities.list()[0].scope`))
	s.mustEval(t, `var jobs = project.streams.get("/jobs"); jobs.subscriptions.configure({name: "run", receiver: {type: "itx-call", capability: "worker"}, filterTypes: ["job"]})`)
	require.Equal(t, 2.0, obj(t, s.mustEval(t, `jobs.subscriptions.get("run").waitUntilProcessed(2)`))["confirmedOffset"], "confirmed as it arrived")

	got := obj(t, s.mustEval(t, `inbox.take(1, 20000)`))
	batches := arr(t, got["batches"])
	require.Len(t, batches, 1)
	b := obj(t, batches[0])
	require.Equal(t, "/jobs", b["path"])
	require.Equal(t, "run", b["subscription"])
	events := arr(t, b["events"])
	require.Len(t, events, 1)
	require.Equal(t, map[string]any{"n": 1.0}, obj(t, events[0])["payload"])

	s.mustEval(t, `inbox.unmount()`)
	require.Equal(t, "cancelled", obj(t, obj(t, s.mustEval(t, `inbox.take()`))["closed"])["code"], "take() says the mount ended")
	require.Empty(t, arr(t, s.mustEval(t, `project.capabilities.list()`)))
	s.mustEval(t, `jobs.append({type: "job", payload: {n: 2}})`)
	f := s.failure(t, `jobs.subscriptions.get("run").waitUntilProcessed({offset: 3, timeoutMs: 200})`)
	require.Equal(t, "deadlineExceeded", f.Code)
	require.Contains(t, f.Message, "parked")

	s.mustEval(t, `var again = project.capabilities.mount({name: "worker"})`)
	got = obj(t, s.mustEval(t, `again.take(1, 20000)`))
	b = obj(t, arr(t, got["batches"])[0])
	require.Equal(t, 3.0, obj(t, arr(t, b["events"])[0])["offset"], "the next mount resumes it")

	// An offset-acking subscription's batch is delivered, not confirmed: confirm() confirms it.
	s.mustEval(t, `var acks = project.streams.get("/acks"); acks.append({type: "job"}); acks.subscriptions.configure({name: "ack", receiver: {type: "itx-call", capability: "worker"}, confirmWindow: 10, filterTypes: ["job"]})`)
	b = obj(t, arr(t, obj(t, s.mustEval(t, `again.take(1, 20000)`))["batches"])[0])
	require.Equal(t, "/acks", b["path"])
	// take() has the batch once the Receiver holds it; itxd records it delivered on its answer.
	waitFor(t, "the batch recorded delivered", func() bool {
		return s.mustEval(t, `acks.subscriptions.list()[0].deliveredOffset >= 1`) == true
	})
	require.Equal(t, 0.0, s.mustEval(t, `acks.subscriptions.list()[0].confirmedOffset`), "not confirmed by the answer")
	require.GreaterOrEqual(t, obj(t, s.mustEval(t, `acks.subscriptions.get("ack").confirm(1)`))["confirmedOffset"], 1.0)
}

// A mount itxd stops delivering to ends at once at the prompt: unmounted by name
// (project.capabilities.unmount) or replaced by a new mount of the name, its take() says so
// instead of waiting out its timeout (deadlineExceeded), as after its own unmount(); the
// replacing mount goes on, and the replaced one's unmount() leaves it mounted.
func TestEval_MountEndedByNameSaysSo(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var keep = project.capabilities.mount("keep")`) // another name: left as it is
	s.mustEval(t, `var a = project.capabilities.mount("w1")`)
	s.mustEval(t, `project.capabilities.unmount("w1")`)
	got := obj(t, s.mustEval(t, `a.take(1, 20000)`))
	require.Equal(t, map[string]any{"code": "cancelled", "message": "unmounted"}, got["closed"])

	s.mustEval(t, `var b1 = project.capabilities.mount("w2"); var b2 = project.capabilities.mount("w2")`)
	got = obj(t, s.mustEval(t, `b1.take(1, 20000)`))
	require.Equal(t, "cancelled", obj(t, got["closed"])["code"])
	require.Contains(t, obj(t, got["closed"])["message"], "replaced")
	s.mustEval(t, `b1.unmount()`)
	require.Equal(t, []any{"keep", "w2"}, arr(t, s.mustEval(t, `project.capabilities.list().map(m => m.name)`)))
	require.Nil(t, obj(t, s.mustEval(t, `keep.take()`))["closed"])
	s.mustEval(t, `var st = project.streams.get("/w2"); st.subscriptions.configure({name: "c", receiver: {type: "itx-call", capability: "w2"}, start: "now"}); st.append({type: "job"})`)
	got = obj(t, s.mustEval(t, `b2.take(1, 20000)`))
	require.Len(t, arr(t, got["batches"]), 1, "the replacing mount is delivered to")
	require.Nil(t, got["closed"])
}
