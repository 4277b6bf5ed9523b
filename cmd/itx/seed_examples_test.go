package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/cmd/itx/internal/repl"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/stretchr/testify/require"
)

// fieldOf is one field of each event in v, a list of events as the prompt returns them.
func fieldOf[T any](t testing.TB, v any, field string) []T {
	t.Helper()
	var got []T
	for _, e := range arr(t, v) {
		got = append(got, obj(t, e)[field].(T))
	}
	return got
}

// offsetsOf is the offsets of the events in v.
func offsetsOf(t testing.TB, v any) []float64 { t.Helper(); return fieldOf[float64](t, v, "offset") }

// typesOf is the types of the events in v.
func typesOf(t testing.TB, v any) []string { t.Helper(); return fieldOf[string](t, v, "type") }

// The TypeScript itx surface spells the read window afterOffset, beforeOffset and eventTypes
// (StreamEventReadInput, waitForEvent's input) and a connection's start replayAfterOffset: an
// expression copied from there ran into "unknown option" at the prompt, which spells them after,
// before and types. Each is now one option under both names; both at once is refused, naming
// them, rather than one silently winning.
func TestEval_TypeScriptSpellingsOfTheReadWindow(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/ts", itx.EventInput{Type: "note"}, itx.EventInput{Type: "other"}, itx.EventInput{Type: "note"})
	s := newSession(t, ts)
	s.mustEval(t, `var a = project.streams.get("/ts")`)

	require.Equal(t, []float64{3}, offsetsOf(t, s.mustEval(t, `a.getEvents({afterOffset: 1, eventTypes: ["note"]})`)))
	require.Equal(t, []float64{1, 2}, offsetsOf(t, s.mustEval(t, `a.getEvents({afterOffset: 0, beforeOffset: 3})`)))
	require.Equal(t, []float64{3}, offsetsOf(t, obj(t, s.mustEval(t, `a.getEventPage({afterOffset: 2, limit: 10})`))["events"]))
	got := obj(t, s.mustEval(t, `a.waitForEvent({afterOffset: 1, eventTypes: ["note"], timeoutMs: 10000})`))
	require.Equal(t, 3.0, got["offset"])
	// Each connection starts after the event before the head's (a note), then takes a note and
	// a later event out of the three appended after it opens.
	for _, open := range []string{
		`a.openConnection({replayAfterOffset: a.describe().headOffset - 1, eventTypes: ["note", "later"]})`,
		`a.openConnection({afterOffset: a.describe().headOffset - 1, eventTypes: ["note", "later"]})`,
	} {
		s.mustEval(t, `var c = `+open)
		ts.appendDirect(t, "/ts", itx.EventInput{Type: "skipped"}, itx.EventInput{Type: "later"}, itx.EventInput{Type: "note"})
		taken := obj(t, s.mustEval(t, `c.take(3, 10000)`))
		require.Equal(t, []string{"note", "later", "note"}, typesOf(t, taken["events"]), open)
		s.mustEval(t, `c.close("done")`)
	}

	for src, names := range map[string][]string{
		`a.getEvents({after: 1, afterOffset: 2})`:                     {"afterOffset", "after"},
		`a.getEvents(1, {afterOffset: 2})`:                            {"afterOffset", "after"},
		`a.getEventPage({types: ["note"], eventTypes: ["other"]})`:    {"eventTypes", "types"},
		`a.waitForEvent({afterOffset: 0, after: 0, timeoutMs: 10})`:   {"afterOffset", "after"},
		`a.openConnection({replayAfterOffset: 1, afterOffset: 1})`:    {"replayAfterOffset", "afterOffset"},
		`a.openConnection({after: 1, replayAfterOffset: 1})`:          {"replayAfterOffset", "after"},
		`a.getEvents({before: 2, beforeOffset: 2, afterOffset: 0})`:   {"beforeOffset", "before"},
		`project.streams.list({afterOffset: 1})`:                      {"afterOffset"},
		`a.getEvents({afterOffset: -1})`:                              {"afterOffset", "non-negative"},
		`a.openConnection({replayAfterOffset: "1", eventTypes: "x"})`: {"replayAfterOffset"},
	} {
		f := s.failure(t, src)
		require.Equal(t, "invalidArgument", f.Code, "%s: %s", src, f.Message)
		for _, n := range names {
			require.Contains(t, f.Message, n, src)
		}
	}
}

// The seed attaches a processor's live subscribers through the per-domain facades, "e.g.
// agent.liveState": agent(path).liveState() is agent(path).processor.liveState(), the agent
// processor's own view. It was a TypeError ("Object has no member 'liveState'").
func TestRun_AgentLiveStateIsItsProcessors(t *testing.T) {
	ts := startProcessorServer(t, "agent-live", examples.Names...)
	s := newSession(t, ts)
	at := obj(t, s.mustEval(t, `project.streams.get("/bot").subscriptions.configure({name: "agent", receiver: {type: "processor-wake"}})`))["offset"]
	s.mustEval(t, fmt.Sprintf(`agent("/bot").subscription.waitUntilProcessed(%d)`, int64(at.(float64))))

	facade := obj(t, s.mustEval(t, `var v = agent("/bot").liveState(); v.snapshot()`))
	direct := obj(t, s.mustEval(t, `var w = agent("/bot").processor.liveState(); w.snapshot()`))
	require.Equal(t, "agent", obj(t, facade["state"])["name"], "the agent processor's view")
	require.Equal(t, direct["state"], facade["state"])
	require.Equal(t, 1.0, facade["revision"])
	require.Equal(t, "[LiveState Processor /bot agent]", s.mustEval(t, `String(v)`), "one pair of brackets")
	s.mustEval(t, `v.cancel(); w.cancel()`)

	f := s.failure(t, `agent("/bot").liveState({revision: 1})`)
	require.Equal(t, "invalidArgument", f.Code, f.Message)
	f = s.failure(t, `agent("/nobody").liveState()`)
	require.Equal(t, "notFound", f.Code, f.Message)
	require.Equal(t, "function", s.mustEval(t, `typeof agent("/bot").liveState`))
}

// A connection, a live view and a mounted receiver print as what they are, [Connection /a],
// as a capability prints as its path ([Stream /a]); they printed as JSON strings,
// "[Connection /a]", as if the call had answered a string. Under --json every result is a JSON
// document, so there they stay strings.
func TestEval_ConnectionsAndViewsPrintAsLabels(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/a", itx.EventInput{Type: "note"})
	out := newSyncBuffer()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rs, err := repl.Connect(ctx, repl.Config{Addr: ts.addr, Token: ts.token, Out: out, Err: newSyncBuffer(), Format: repl.FormatPretty})
	require.NoError(t, err)
	t.Cleanup(func() { rs.Close() })
	for src, want := range map[string]string{
		`project.streams.get("/a")`:                       "[Stream /a]",
		`project.streams.get("/a").openConnection()`:      "[Connection /a]",
		`project.streams.get("/a").liveState()`:           "[LiveState /a]",
		`project.capabilities.mount("inbox")`:             "[Receiver inbox]",
		`String(project.streams.get("/a").liveState())`:   `"[LiveState /a]"`,
		`[project.streams.get("/a").openConnection()][0]`: "[Connection /a]",
	} {
		out.Reset()
		v, err := rs.Eval(ctx, "<test>", src)
		require.NoError(t, err, src)
		rs.Print(v)
		require.Equal(t, want, strings.TrimSpace(out.String()), src)
	}

	s := newSession(t, ts)
	got, err := s.eval(t, `project.streams.get("/a").openConnection()`)
	require.NoError(t, err)
	require.Equal(t, `"[Connection /a]"`, got, "a JSON document under --json")
}

// Opening a key that is open replaces that connection, closed as replaced before the open is
// answered (seed 000 and the TypeScript: the old one closes before the new one opens). take() on
// the replaced one right after the open says so, as take() right after close() says
// closedByClient; it answered {events: []} alone until itxd's own closed notice, a call of its
// own, happened to arrive. Another key, and the key on another stream, are left open.
func TestEval_TakeAfterReplaceSaysReplaced(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/r", itx.EventInput{Type: "note"})
	ts.appendDirect(t, "/r2", itx.EventInput{Type: "note"})
	s := newSession(t, ts)
	s.mustEval(t, `var r = project.streams.get("/r"), r2 = project.streams.get("/r2")
		var other = r.openConnection({key: "other", after: 1}), elsewhere = r2.openConnection({key: "tab", after: 1})`)
	for i := 0; i < 10; i++ {
		got := obj(t, s.mustEval(t, `var old = r.openConnection({key: "tab", after: 1}); r.openConnection({key: "tab", after: 1}); old.take()`))
		closed := obj(t, got["closed"])
		require.Equal(t, "failedPrecondition", closed["code"], "round %d: %v", i, got)
		require.Contains(t, closed["message"], "replaced", "round %d", i)
	}
	s.mustEval(t, `var last = r.openConnection({key: "tab", after: 1})`)
	for _, c := range []string{"last", "other", "elsewhere"} {
		require.NotContains(t, obj(t, s.mustEval(t, c+`.take()`)), "closed", c)
	}
	require.Equal(t, 1.0, obj(t, s.mustEval(t, `last.ping()`))["headOffset"])
}

// After a call fails because the connection to itxd was lost, the next call reconnects (the
// README: "a call made meanwhile waits for it") instead of going out on the dead connection:
// go-capnp fails the calls in flight a little before it closes the connection's Done, and the
// statement right after the one an itxd restart cut short failed disconnected too (4 times in 4
// at the prompt with a piped script and kill -9; here, without the wait, about one round in
// ten fails, so 20 rounds). The connection runs through a proxy that cuts the connections it
// holds once the waiting call has gone through, and forwards the next ones.
func TestEval_CallAfterALostOneReconnects(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/lost", itx.EventInput{Type: "first"})
	p := newCuttingProxy(t, ts.addr, "never-comes")
	out, errs := newSyncBuffer(), newSyncBuffer()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	rs, err := repl.Connect(ctx, repl.Config{Addr: p.addr(), Token: ts.token, Out: out, Err: errs, Format: repl.FormatJSON})
	require.NoError(t, err)
	t.Cleanup(func() { rs.Close() })
	_, err = rs.Eval(ctx, "<test>", `var a = project.streams.get("/lost")`)
	require.NoError(t, err)
	type result struct {
		v   string
		err error
	}
	for round := 0; round < 20; round++ {
		sent := p.arm()
		done := make(chan result, 1)
		go func() {
			v, err := rs.Eval(ctx, "<test>", `
				var got = []
				try { a.waitForEvent({types: ["never-comes"], after: 1, timeoutMs: 60000}) } catch (e) { got.push(e.code) }
				got.push(a.getEvents().length)
				JSON.stringify(got)`)
			if err != nil {
				done <- result{err: err}
				return
			}
			done <- result{v: v.String()}
		}()
		select {
		case <-sent:
		case r := <-done:
			t.Fatalf("round %d: the evaluation ended before its call reached itxd: %v %v", round, r.v, r.err)
		}
		p.cut()
		r := <-done
		require.NoError(t, r.err, "round %d; stderr: %s", round, errs.String())
		require.Equal(t, `["disconnected",1]`, r.v, "round %d; stderr: %s", round, errs.String())
	}
	require.Equal(t, 20, strings.Count(errs.String(), "reconnecting"), errs.String())
}

// cuttingProxy forwards TCP connections to target; cut closes those it holds, once the marker
// went through one of them after arm.
type cuttingProxy struct {
	ln     net.Listener
	target string
	marker []byte
	mu     sync.Mutex
	conns  []net.Conn
	sent   chan struct{} // closed when the marker goes through after arm
}

func newCuttingProxy(t *testing.T, target, marker string) *cuttingProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &cuttingProxy{ln: ln, target: target, marker: []byte(marker)}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go func() { io.Copy(c, s); c.Close() }()
			go func() {
				defer s.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						s.Write(buf[:n])
						if bytes.Contains(buf[:n], p.marker) {
							p.saw()
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return p
}

func (p *cuttingProxy) addr() string { return p.ln.Addr().String() }

// arm returns a channel closed once the marker next goes through.
func (p *cuttingProxy) arm() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sent = make(chan struct{})
	return p.sent
}

func (p *cuttingProxy) saw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sent != nil {
		close(p.sent)
		p.sent = nil
	}
}

// cut closes every connection the proxy holds, both sides.
func (p *cuttingProxy) cut() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// The TypeScript processor surface (StreamProcessorRpc) is getRuntimeState(), snapshot() ->
// {offset, state} and waitUntilProcessed({offset, timeoutMs}); seed 000 shows
// .processor.snapshot() and the barrier on the subscription. At the prompt a processor's
// waitUntilProcessed is its subscription's barrier (it was a TypeError), refused on a
// subscription of another kind as the processor's own methods are, and snapshot() carries the
// TypeScript name offset beside reducedOffset.
func TestRun_ProcessorBarrierAndSnapshotOffset(t *testing.T) {
	ts := startProcessorServer(t, "processor-barrier", examples.Names...)
	s := newSession(t, ts)
	s.mustEval(t, `var g = project.streams.get("/guestbook")
		g.subscriptions.configure({name: "guestbook", receiver: {type: "processor-wake"}})
		g.subscriptions.configure({name: "mirror", receiver: {type: "copy-to-stream", path: "/copy"}})
		var p = g.subscriptions.get("guestbook").processor`)
	head := obj(t, s.mustEval(t, `g.append({type: "guestbook/signed", payload: {name: "ada", message: "hi"}})`))["headOffset"].(float64)

	got := obj(t, s.mustEval(t, fmt.Sprintf(`p.waitUntilProcessed({offset: %d, timeoutMs: 20000})`, int64(head))))
	require.GreaterOrEqual(t, got["confirmedOffset"].(float64), head)
	snap := obj(t, s.mustEval(t, `p.snapshot()`))
	require.Equal(t, snap["reducedOffset"], snap["offset"], "offset is the offset the state is folded through")
	require.GreaterOrEqual(t, snap["offset"].(float64), head)
	require.Equal(t, 1.0, obj(t, snap["state"])["count"])
	require.Equal(t, got, obj(t, s.mustEval(t, fmt.Sprintf(`p.waitUntilProcessed(%d)`, int64(head)))), "values in order too")

	f := s.failure(t, `p.waitUntilProcessed({offset: 1000, timeoutMs: 100})`)
	require.Equal(t, "deadlineExceeded", f.Code, f.Message)
	f = s.failure(t, `g.subscriptions.get("mirror").processor.waitUntilProcessed(1)`)
	require.Equal(t, "failedPrecondition", f.Code, f.Message)
	require.Contains(t, f.Message, "processor-wake")
	f = s.failure(t, `g.subscriptions.get("nobody").processor.waitUntilProcessed(1)`)
	require.Equal(t, "notFound", f.Code, f.Message)
	f = s.failure(t, `p.waitUntilProcessed()`)
	require.Equal(t, "invalidArgument", f.Code, f.Message)

	require.NoError(t, s.RunCommand(context.Background(), "help Processor"))
	require.Contains(t, s.out.String(), "waitUntilProcessed(offset, timeoutMs?)")
	names, _ := s.Complete(`p.wa`)
	require.Equal(t, []string{"waitUntilProcessed("}, names)
}

// The TypeScript surface opens a connection with {connectionKey, replayAfterOffset, filter:
// {eventTypes, jsonataCondition}}: connectionKey is the key and filter.eventTypes the types; a
// jsonataCondition, which a connection here cannot evaluate, is refused rather than dropped
// (every event would arrive as if it matched). Both were "unknown option".
func TestEval_TypeScriptConnectionOptions(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/tc", itx.EventInput{Type: "note"}, itx.EventInput{Type: "other"}, itx.EventInput{Type: "note"})
	s := newSession(t, ts)
	s.mustEval(t, `var a = project.streams.get("/tc")
		var c = a.openConnection({connectionKey: "selected", replayAfterOffset: 0, filter: {eventTypes: ["note"]}})`)
	require.Equal(t, "selected", s.mustEval(t, `c.key()`))
	require.Equal(t, []float64{1, 3}, offsetsOf(t, obj(t, s.mustEval(t, `c.take(2, 10000)`))["events"]))
	// The key is the key: an open under it replaces the connection.
	got := obj(t, s.mustEval(t, `a.openConnection({key: "selected", after: 3}); c.take()`))
	require.Contains(t, obj(t, got["closed"])["message"], "replaced")

	for src, names := range map[string][]string{
		`a.openConnection({filter: {eventTypes: ["note"], jsonataCondition: "payload.x = 1"}})`: {"jsonataCondition"},
		`a.openConnection({types: ["note"], filter: {eventTypes: ["note"]}})`:                   {"filter.eventTypes", "types"},
		`a.openConnection({eventTypes: ["note"], filter: {eventTypes: ["note"]}})`:              {"filter.eventTypes", "eventTypes"},
		`a.openConnection({filter: {types: ["note"]}})`:                                         {`unknown option "types"`},
		`a.openConnection({filter: "note"})`:                                                    {"filter", "a string"},
		`a.openConnection({key: "x", connectionKey: "y"})`:                                      {"connectionKey", "key"},
		`a.openConnection({maxReplayOffsetGap: 100})`:                                           {`unknown option "maxReplayOffsetGap"`},
	} {
		f := s.failure(t, src)
		require.Equal(t, "invalidArgument", f.Code, "%s: %s", src, f.Message)
		for _, n := range names {
			require.Contains(t, f.Message, n, src)
		}
	}
	live := obj(t, s.mustEval(t, `a.liveState().snapshot().state`))
	require.Len(t, obj(t, live["connections"]), 1, "no refused open opened a connection: %v", live)
}
