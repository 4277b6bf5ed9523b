package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/cmd/itx/internal/repl"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// TestMain lets the PTY and exit-status tests run this test binary as the itx command.
func TestMain(m *testing.M) {
	if os.Getenv("ITX_TEST_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// testServer is an in-process itxd on a real loopback TCP port (the pattern of
// test/helpers_test.go).
type testServer struct {
	addr  string
	token string
	dir   string
}

func startServer(t testing.TB) *testServer {
	t.Helper()
	s := itxtest.Start(t, server.Config{})
	return &testServer{addr: s.Addr, token: s.Creds.ProjectToken, dir: s.Dir}
}

// startProcessorServer starts an in-process itxd hosting the named reference processors (host
// is the host's name).
func startProcessorServer(t testing.TB, host string, contracts ...string) *testServer {
	t.Helper()
	h := processors.NewHost(host)
	require.NoError(t, examples.AddTo(h, contracts, examples.HostOptions{}))
	s := itxtest.Start(t, server.Config{Processors: h})
	return &testServer{addr: s.Addr, token: s.Creds.ProjectToken, dir: s.Dir}
}

// appendDirect appends through the Go client, not through itx.
func (ts *testServer) appendDirect(t testing.TB, path string, events ...itx.EventInput) itx.AppendResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := client.Append(ctx, ts.streamDirect(t, ctx, path), events, itx.AppendOptions{})
	require.NoError(t, err)
	return res
}

// streamDirect is the stream at path through the Go client on a connection of its own, not
// through itx; the connection closes when the test ends.
func (ts *testServer) streamDirect(t testing.TB, ctx context.Context, path string) schema.Stream {
	t.Helper()
	c, err := client.Dial(ctx, ts.addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	p := c.Login(ctx, ts.token)
	t.Cleanup(p.Release)
	s := client.Stream(ctx, p, path)
	t.Cleanup(s.Release)
	return s
}

// syncBuffer is an output a test can wait on while an evaluation runs.
type syncBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{} // closed and replaced on every write
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{changed: make(chan struct{})} }

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.changed)
	b.changed = make(chan struct{})
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *syncBuffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Reset()
}

// waitFor blocks until the output contains s; it reports false after 20 s. It may run on any
// goroutine.
func (b *syncBuffer) waitFor(s string) bool {
	deadline := time.After(20 * time.Second)
	for {
		b.mu.Lock()
		ok, changed := strings.Contains(b.buf.String(), s), b.changed
		b.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-changed:
		case <-deadline:
			return false
		}
	}
}

// session is an itx session whose output the test reads: results as JSON documents.
type session struct {
	*repl.Session
	out, errs *syncBuffer
}

func newSession(t testing.TB, ts *testServer) *session {
	t.Helper()
	out, errs := newSyncBuffer(), newSyncBuffer()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := repl.Connect(ctx, repl.Config{Addr: ts.addr, Token: ts.token, Out: out, Err: errs, Format: repl.FormatJSON})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return &session{Session: s, out: out, errs: errs}
}

// eval evaluates src as the REPL does and returns what it printed.
func (s *session) eval(t testing.TB, src string) (string, error) {
	t.Helper()
	s.out.Reset()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := s.Eval(ctx, "<test>", src)
	if err == nil {
		s.Print(v)
	}
	return strings.TrimSpace(s.out.String()), err
}

// mustEval evaluates src and decodes its printed JSON result into a generic value.
func (s *session) mustEval(t testing.TB, src string) any {
	t.Helper()
	out, err := s.eval(t, src)
	require.NoError(t, err, "eval %s", src)
	if out == "" {
		return nil
	}
	var v any
	require.NoError(t, json.Unmarshal([]byte(out), &v), "output of %s: %s", src, out)
	return v
}

// failure evaluates src, which must fail, and returns how itx shows the error.
func (s *session) failure(t testing.TB, src string) repl.Failure {
	t.Helper()
	_, err := s.eval(t, src)
	require.Error(t, err, "eval %s", src)
	return repl.Describe(err)
}

func obj(t testing.TB, v any) map[string]any {
	t.Helper()
	m, ok := v.(map[string]any)
	require.True(t, ok, "want an object, got %#v", v)
	return m
}

func arr(t testing.TB, v any) []any {
	t.Helper()
	a, ok := v.([]any)
	require.True(t, ok, "want an array, got %#v", v)
	return a
}

func writeFile(t testing.TB, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
	return path
}

// The eval path for each surface of the issue, against a real server.
func TestEval_Surfaces(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)

	t.Run("append", func(t *testing.T) {
		res := obj(t, s.mustEval(t, `project.streams.get("/a").append({type: "note", payload: {text: "hi"}})`))
		require.Equal(t, []any{1.0}, res["offsets"])
		require.Equal(t, []any{false}, res["duplicate"])
		require.Equal(t, 1.0, res["headOffset"])
		require.NotEmpty(t, res["streamId"])

		res = obj(t, s.mustEval(t, `project.streams.get("/a").append([{type: "note", payload: {text: "two"}, metadata: {by: "test"}}, {type: "other"}], {expectedHeadOffset: 1})`))
		require.Equal(t, []any{2.0, 3.0}, res["offsets"])
		f := s.failure(t, `project.streams.get("/a").append({type: "late"}, {expectedHeadOffset: 1})`)
		require.Equal(t, "offsetConflict", f.Code, "a conditional append on a moved head")
	})

	t.Run("getEvents", func(t *testing.T) {
		events := arr(t, s.mustEval(t, `project.streams.get("/a").getEvents({after: 0})`))
		require.Len(t, events, 3)
		first := obj(t, events[0])
		require.Equal(t, 1.0, first["offset"])
		require.Equal(t, "note", first["type"])
		require.Equal(t, map[string]any{"text": "hi"}, first["payload"], "payload shows as a parsed object")
		require.NotZero(t, first["createdAt"])
		require.Equal(t, map[string]any{"by": "test"}, obj(t, events[1])["metadata"])

		events = arr(t, s.mustEval(t, `project.streams.get("/a").getEvents({after: 1, types: ["note"], limit: 5})`))
		require.Len(t, events, 1)
		require.Equal(t, 2.0, obj(t, events[0])["offset"])
	})

	t.Run("getEventPage", func(t *testing.T) {
		page := obj(t, s.mustEval(t, `project.streams.get("/a").getEventPage({after: 0, limit: 2})`))
		require.Len(t, arr(t, page["events"]), 2)
		require.Equal(t, 3.0, page["streamMaxOffset"])
		require.Equal(t, 2.0, page["nextAfter"])
		require.NotEmpty(t, page["streamId"])
	})

	t.Run("describe", func(t *testing.T) {
		info := obj(t, s.mustEval(t, `project.streams.get("/a").describe()`))
		require.Equal(t, "/a", info["path"])
		require.Equal(t, 3.0, info["headOffset"])
		p := obj(t, s.mustEval(t, `project.describe()`))
		require.Equal(t, "default", p["name"])
		require.Equal(t, false, p["deployment"])
	})

	t.Run("streams.list", func(t *testing.T) {
		s.mustEval(t, `project.streams.get("/b/c").append({type: "x"})`)
		rows := arr(t, s.mustEval(t, `project.streams.list()`))
		var paths []string
		for _, r := range rows {
			paths = append(paths, obj(t, r)["path"].(string))
		}
		require.Equal(t, []string{"/a", "/b/c"}, paths)
		rows = arr(t, s.mustEval(t, `project.streams.list("/b/")`))
		require.Len(t, rows, 1)
	})

	t.Run("waitForEvent", func(t *testing.T) {
		// Already there: the first match after `after`.
		e := obj(t, s.mustEval(t, `project.streams.get("/a").waitForEvent({types: ["note"], payloadContains: {text: "two"}})`))
		require.Equal(t, 2.0, e["offset"])
		// Not there yet: appended by another client while itx waits. The barrier matches the
		// first event after `after` whenever it lands, so no ordering is needed.
		done := make(chan struct{})
		go func() {
			defer close(done)
			ts.appendDirect(t, "/a", itx.EventInput{Type: "ready", Payload: json.RawMessage(`{"n": 7}`)})
		}()
		e = obj(t, s.mustEval(t, `project.streams.get("/a").waitForEvent({types: "ready", where: "payload.n = 7", after: 3, timeoutMs: 20000})`))
		<-done
		require.Equal(t, 4.0, e["offset"])
		require.Equal(t, map[string]any{"n": 7.0}, e["payload"])

		f := s.failure(t, `project.streams.get("/a").waitForEvent({types: ["never"], after: 4, timeoutMs: 50})`)
		require.Equal(t, "deadlineExceeded", f.Code)
	})

	t.Run("subscriptions", func(t *testing.T) {
		s.mustEval(t, `var subs = project.streams.get("/subs"); subs.append([{type: "note", payload: {n: 1}}, {type: "other"}, {type: "note", payload: {n: 2}}])`)
		born := obj(t, s.mustEval(t, `subs.subscriptions.configure({name: "mirror", receiver: {type: "copy-to-stream", path: "/mirror"}, filterTypes: ["note"]})`))
		require.Equal(t, map[string]any{"name": "mirror", "offset": 4.0}, born)

		rows := arr(t, s.mustEval(t, `subs.subscriptions.list()`))
		require.Len(t, rows, 1)
		row := obj(t, rows[0])
		require.Equal(t, "mirror", row["name"])
		require.Equal(t, "copy-to-stream", row["kind"])
		require.Equal(t, "active", row["status"])

		done := obj(t, s.mustEval(t, `subs.subscriptions.get("mirror").waitUntilProcessed({offset: 4, timeoutMs: 20000})`))
		require.GreaterOrEqual(t, done["confirmedOffset"], 4.0)
		d := obj(t, s.mustEval(t, `subs.subscriptions.get("mirror").describe()`))
		require.Equal(t, map[string]any{"type": "copy-to-stream", "path": "/mirror"}, obj(t, d["config"])["receiver"])
		require.Equal(t, []any{"note"}, obj(t, d["config"])["filterTypes"])
		require.Equal(t, 4.0, d["configuredAtOffset"])
		copies := arr(t, s.mustEval(t, `project.streams.get("/mirror").getEvents().map(e => e.payload.n)`))
		require.Equal(t, []any{1.0, 2.0}, copies)

		require.Equal(t, "failedPrecondition", s.failure(t, `subs.resumeSubscription({name: "mirror"})`).Code, "resume of an active subscription")
		require.Equal(t, 5.0, obj(t, s.mustEval(t, `subs.setSubscriptionCursor({name: "mirror", afterOffset: 0})`))["offset"])
		require.Equal(t, "notFound", s.failure(t, `subs.subscriptions.get("nobody").describe()`).Code)
		require.Equal(t, 6.0, obj(t, s.mustEval(t, `subs.subscriptions.remove("mirror")`))["offset"])
		require.Empty(t, arr(t, s.mustEval(t, `subs.subscriptions.list()`)))
	})

	t.Run("methods not served yet", func(t *testing.T) {
		// Whatever the server does not serve answers "unimplemented", cleanly; what it serves
		// is covered above.
		for src, method := range map[string]string{
			`project.streams.get("/a").openConnection({after: 0}).close("test")`: "Stream.openConnection",
			`project.streams.get("/a").liveState().cancel()`:                     "Stream.liveState",
			`project.streams.get("/a").readers.list()`:                           "Stream.readers",
			`project.processors.list()`:                                          "Project.processors",
		} {
			if _, err := s.eval(t, src); err != nil {
				require.Equal(t, repl.Failure{Code: "unimplemented", Message: method + " is not implemented by this server"}, repl.Describe(err), src)
			}
		}
		require.Empty(t, arr(t, s.mustEval(t, `project.capabilities.list()`)), "served: nothing mounted")
		f := s.failure(t, `project.processors.mount("host", null)`)
		require.Equal(t, "failedPrecondition", f.Code, "mount needs a program serving a ProcessorHost")
	})
}

func TestEval_Session(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)

	t.Run("variables across lines", func(t *testing.T) {
		s.mustEval(t, `let a = project.streams.get("/v")`)
		s.mustEval(t, `const note = {type: "note", payload: {text: "kept"}}`)
		s.mustEval(t, `a.append(note); a.append([note, note])`)
		require.Equal(t, 3.0, s.mustEval(t, `a.describe().headOffset`))
		require.Equal(t, "kept", s.mustEval(t, `a.getEvents().map(e => e.payload.text)[2]`))
		require.Equal(t, "/v", s.mustEval(t, `a.path`))
		out, err := s.eval(t, `a`)
		require.NoError(t, err)
		require.Equal(t, `"[Stream /v]"`, out, "a capability prints as what it is")
	})

	t.Run("a typed error does not end the session", func(t *testing.T) {
		f := s.failure(t, `project.streams.get("/v").append({type: "", payload: {}})`)
		require.Equal(t, repl.Failure{Code: "invalidArgument", Message: "event 0: type must not be empty"}, f)
		f = s.failure(t, `project.streams.get("no-slash").describe()`)
		require.Equal(t, "invalidArgument", f.Code)
		require.Contains(t, f.Message, `must start with /`)
		require.Equal(t, 3.0, s.mustEval(t, `a.describe().headOffset`), "the session goes on")
	})

	t.Run("scripts catch typed errors by code", func(t *testing.T) {
		got := s.mustEval(t, `try { a.append({type: "x", payload: "not json"}); "no error" } catch (e) { e.code + " / " + String(e).split(":")[0] }`)
		require.Equal(t, "invalidArgument / invalidArgument", got)
	})

	t.Run("bad arguments are refused before sending", func(t *testing.T) {
		f := s.failure(t, `a.getEvents({aftr: 2})`)
		require.Equal(t, "invalidArgument", f.Code)
		require.Contains(t, f.Message, `unknown option "aftr"`)
		f = s.failure(t, `a.getEvents({after: -1})`)
		require.Contains(t, f.Message, "after: expected a non-negative integer")
		f = s.failure(t, `project.streams.get(42)`)
		require.Equal(t, "invalidArgument", f.Code)
	})

	t.Run("JavaScript errors show by name", func(t *testing.T) {
		require.Equal(t, repl.Failure{Code: "ReferenceError", Message: "nope is not defined"}, s.failure(t, `nope.x`))
		require.Equal(t, "SyntaxError", s.failure(t, `a.describe(`).Code)
		require.Equal(t, repl.Failure{Code: "Error", Message: "mine"}, s.failure(t, `throw new Error("mine")`))
	})

	t.Run("await is accepted", func(t *testing.T) {
		require.Equal(t, 3.0, s.mustEval(t, `const d = await a.describe(); d.headOffset`))
		require.Equal(t, 3.0, s.mustEval(t, `(async () => (await a.describe()).headOffset)()`))
		f := s.failure(t, `(async () => { await a.append({type: ""}) })()`)
		require.Equal(t, "invalidArgument", f.Code, "a rejected promise shows its error")
	})

	t.Run("commands", func(t *testing.T) {
		require.NoError(t, s.RunCommand(context.Background(), "help Stream"))
		require.Contains(t, s.out.String(), "append(event | [events], {expectedHeadOffset, conditional}?)")
		require.Contains(t, s.out.String(), ".subscriptions -> Subscriptions")
		require.Equal(t, "invalidArgument", repl.Describe(s.RunCommand(context.Background(), "nope")).Code)
		require.Equal(t, "invalidArgument", repl.Describe(s.RunCommand(context.Background(), "tail")).Code)
		require.ErrorIs(t, s.RunCommand(context.Background(), "exit"), repl.ErrExit)

		require.NoError(t, s.RunCommand(context.Background(), "output table"))
		require.Equal(t, repl.FormatTable, s.Format())
		require.NoError(t, s.RunCommand(context.Background(), "output json"))
	})

	t.Run("tail", func(t *testing.T) {
		// tail runs until Ctrl-C. Against a server without connections it fails at once.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		s.out.Reset()
		s.errs.Reset()
		result := make(chan error, 1)
		go func() { result <- s.RunCommand(ctx, "tail /v") }()
		started := make(chan bool, 1)
		go func() { started <- s.errs.waitFor("tailing /v") }()
		select {
		case err := <-result:
			require.Equal(t, repl.Failure{Code: "unimplemented", Message: "Stream.openConnection is not implemented by this server"}, repl.Describe(err))
			return
		case ok := <-started:
			require.True(t, ok)
		}
		ts.appendDirect(t, "/v", itx.EventInput{Type: "tailed", Payload: json.RawMessage(`{"live":true}`)})
		require.True(t, s.out.waitFor(`"type":"tailed"`), "the appended event is printed: %q", s.out.String())
		cancel()
		require.NoError(t, <-result, "Ctrl-C ends tail")
	})

	t.Run("a cancelled call stops waiting", func(t *testing.T) {
		head := s.mustEval(t, `a.describe().headOffset`)
		ctx, cancel := context.WithCancel(context.Background())
		s.out.Reset()
		go func() {
			// Ctrl-C while the barrier waits: without cancellation it would wait a minute and
			// fail with deadlineExceeded.
			if !s.out.waitFor("waiting") {
				t.Error("the script never printed")
			}
			cancel()
		}()
		_, err := s.Eval(ctx, "<test>", `print("waiting"); a.waitForEvent({types: ["never"], after: 3, timeoutMs: 60000})`)
		require.Error(t, err)
		require.Equal(t, "cancelled", repl.Describe(err).Code)
		require.Equal(t, head, s.mustEval(t, `a.describe().headOffset`), "the session goes on")
	})

	t.Run("a loop is interrupted", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := s.Eval(ctx, "<test>", `for (;;) {}`)
		require.Equal(t, "cancelled", repl.Describe(err).Code)
		require.Equal(t, 2.0, s.mustEval(t, `1 + 1`), "the runtime is usable again")
	})

	t.Run("completion follows the schema", func(t *testing.T) {
		got, partial := s.Complete(`project.streams.get("/a").subscriptions.g`)
		require.Equal(t, "g", partial)
		require.Equal(t, []string{"get("}, got)
		got, _ = s.Complete(`project.str`)
		require.Equal(t, []string{"streams"}, got)
		got, _ = s.Complete(`a.getEv`)
		require.Equal(t, []string{"getEventPage(", "getEvents("}, got, "a variable holding a stream")
		got, _ = s.Complete(`x = a.subscriptions.get("agent").`)
		require.Contains(t, got, "waitUntilProcessed(")
		require.Contains(t, got, "processor")
		got, _ = s.Complete(`.ta`)
		require.Equal(t, []string{"tail "}, got)
		got, partial = s.Complete(`.help Sub`)
		require.Equal(t, "Sub", partial)
		require.Equal(t, []string{"Subscription", "Subscriptions"}, got, ".help completes the interfaces it shows")
		got, _ = s.Complete(`help Str`)
		require.Equal(t, []string{"Stream", "Streams"}, got)
		got, _ = s.Complete(`no`)
		require.Equal(t, []string{"note"}, got, "top-level declarations complete")
		got, _ = s.Complete(`ag`)
		require.Equal(t, []string{"agent("}, got, "agent(path), the README's sugar, completes")
		got, _ = s.Complete(`agent("/a").`)
		require.Equal(t, []string{"path", "processor", "subscription", "liveState"}, got)
		got, _ = s.Complete(`agent("/a").processor.sn`)
		require.Equal(t, []string{"snapshot("}, got)
		got, _ = s.Complete(`agent("/a").subscription.wait`)
		require.Equal(t, []string{"waitUntilProcessed("}, got)
	})
}

func TestEval_CapabilitiesAreReleased(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	// A script that visits many streams keeps a bounded number of capabilities alive.
	out, err := s.eval(t, `for (let i = 0; i < 600; i++) project.streams.get("/s" + i).describe(); project.streams.list().length`)
	require.NoError(t, err)
	require.Equal(t, "0", out, "describe creates no stream")
	require.LessOrEqual(t, s.CachedCapabilities(), 256)
}

// .tail prints one line per event (offset, time, type, compact payload), marks ephemeral events
// with "~" after the offset, and --from N starts after offset N.
func TestTail_Lines(t *testing.T) {
	ts := startServer(t)
	out, errs := newSyncBuffer(), newSyncBuffer()
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	rs, err := repl.Connect(cctx, repl.Config{Addr: ts.addr, Token: ts.token, Out: out, Err: errs, Format: repl.FormatTable})
	require.NoError(t, err)
	t.Cleanup(func() { rs.Close() })
	s := &session{Session: rs, out: out, errs: errs}
	ts.appendDirect(t, "/tailed", itx.EventInput{Type: "first", Payload: json.RawMessage(`{"n":1}`)},
		itx.EventInput{Type: "second", Payload: json.RawMessage(`{"n":2}`)})
	ctx, cancel := context.WithCancel(context.Background())
	result := make(chan error, 1)
	go func() { result <- s.RunCommand(ctx, "tail /tailed --from 1") }()
	require.True(t, s.out.waitFor("second"), "catch-up after offset 1: %q", s.out.String())
	ts.appendDirect(t, "/tailed", itx.EventInput{Type: "typing", Payload: json.RawMessage(`{}`), Ephemeral: true})
	require.True(t, s.out.waitFor("typing"), "the live ephemeral event: %q", s.out.String())
	cancel()
	require.NoError(t, <-result)
	lines := strings.Split(strings.TrimSpace(s.out.String()), "\n")
	require.Len(t, lines, 2, "offset 1 is not printed")
	require.Regexp(t, `^2  \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z  second  \{"n":2\}$`, lines[0])
	require.Regexp(t, `^3~  \S+  typing  \{\}$`, lines[1])
}

// A nameless configure needs an idempotency key, which the REPL passes through; a retry with it
// returns the original event and generated name.
func TestConfigure_NamelessWithKey(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	f := s.failure(t, `project.streams.get("/nameless").subscriptions.configure({receiver: {type: "copy-to-stream", path: "/copy"}})`)
	require.Equal(t, "invalidArgument", f.Code)
	require.Contains(t, f.Message, "idempotency key")
	first := s.mustEval(t, `JSON.stringify(project.streams.get("/nameless").subscriptions.configure({receiver: {type: "copy-to-stream", path: "/copy"}, idempotencyKey: "setup-1"}))`)
	again := s.mustEval(t, `JSON.stringify(project.streams.get("/nameless").subscriptions.configure({receiver: {type: "copy-to-stream", path: "/copy"}, idempotencyKey: "setup-1"}))`)
	require.Equal(t, first, again)
	require.Contains(t, first, `"name":"subscription:1"`)
}

// .watch under --json prints one JSON document a frame, as .tail prints one an event: the
// snapshot as {revision, state}, each patch as {revision, ops} (the shapes of a live view's
// snapshot() and patches()). When the server ends the view (here its project is deleted), it
// stops and says why.
func TestWatch_JSONFramesAndServerEnd(t *testing.T) {
	srv := itxtest.Start(t, server.Config{})
	ctx := context.Background()
	info, token, _, err := srv.Srv.CreateProject(ctx, server.Admin{}, "watched")
	require.NoError(t, err)
	ts := &testServer{addr: srv.Addr, token: token, dir: srv.Dir}
	ts.appendDirect(t, "/w", itx.EventInput{Type: "first"})
	s := newSession(t, ts) // --json

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	result := make(chan error, 1)
	go func() { result <- s.RunCommand(wctx, "watch /w") }()
	require.True(t, s.out.waitFor(`"head":1`), "the snapshot: %q", s.out.String())
	ts.appendDirect(t, "/w", itx.EventInput{Type: "second"})
	require.True(t, s.out.waitFor(`"ops":`), "a patch: %q", s.out.String())

	require.NoError(t, srv.Srv.DeleteProject(ctx, server.Admin{}, info.ID, true))
	select {
	case err := <-result:
		require.Error(t, err, "the view ended by the server ends .watch")
		require.Contains(t, err.Error(), "streamRemoved")
	case <-time.After(20 * time.Second):
		t.Fatal(".watch went on after the server ended its view")
	}
	lines := strings.Split(strings.TrimSpace(s.out.String()), "\n")
	var snapshot struct {
		Revision uint64         `json:"revision"`
		State    map[string]any `json:"state"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &snapshot), "line 1 %q is not a JSON document", lines[0])
	require.Equal(t, "/w", snapshot.State["path"])
	for _, l := range lines[1:] {
		var patch struct {
			Revision uint64            `json:"revision"`
			Ops      []json.RawMessage `json:"ops"`
		}
		require.NoError(t, json.Unmarshal([]byte(l), &patch), "line %q is not a JSON document", l)
		require.Greater(t, patch.Revision, snapshot.Revision)
		require.NotEmpty(t, patch.Ops)
	}
}

// .tail without --from starts after the head it reads when it starts, and prints every event
// appended after that, ephemeral ones too: an ephemeral event appended between that read and
// the connection's open is printed as well. (Before, the connection opened after that head
// without asking for buffered ephemeral events, so one appended in that window, which the
// stream already held when the connection opened, was never printed, while a durable event
// in the same window was.) A proxy holds the server's answer to the head's read (the stream's
// describe()) until the ephemeral event is in.
func TestTail_EphemeralAppendedAsItStartsIsPrinted(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/tail-window", itx.EventInput{Type: "before", Payload: json.RawMessage(`{}`)})
	proxy := newGatedProxy(t, ts.addr)
	out, errs := newSyncBuffer(), newSyncBuffer()
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	rs, err := repl.Connect(cctx, repl.Config{Addr: proxy.addr, Token: ts.token, Out: out, Err: errs, Format: repl.FormatTable})
	require.NoError(t, err)
	t.Cleanup(func() { rs.Close() })
	s := &session{Session: rs, out: out, errs: errs}

	answered := proxy.holdAt("/tail-window") // the answer of the stream's describe() names its path
	ctx, cancel := context.WithCancel(context.Background())
	result := make(chan error, 1)
	go func() { result <- s.RunCommand(ctx, "tail /tail-window") }()
	select {
	case <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("the tail never read the stream's head")
	}
	ts.appendDirect(t, "/tail-window", itx.EventInput{Type: "typing", Payload: json.RawMessage(`{}`), Ephemeral: true})
	proxy.release()
	require.True(t, s.errs.waitFor("tailing /tail-window after offset 1"), "stderr: %q", s.errs.String())
	ts.appendDirect(t, "/tail-window", itx.EventInput{Type: "after", Payload: json.RawMessage(`{}`)})
	require.True(t, s.out.waitFor("after"), "the durable event: %q", s.out.String())
	cancel()
	require.NoError(t, <-result)
	lines := strings.Split(strings.TrimSpace(s.out.String()), "\n")
	require.Len(t, lines, 2, "the ephemeral event appended as the tail started, then the durable one: %q", lines)
	require.Regexp(t, `^2~  \S+  typing  \{\}$`, lines[0])
	require.Regexp(t, `^3  \S+  after  \{\}$`, lines[1])
}

// Navigation reads as the schema writes it, as a property or called: project.streams() and
// stream.readOnly() are the capability itself, printed and used as such.
func TestEval_NavigationCalledOrNot(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `project.streams().get("/called").append({type: "note"})`)
	require.EqualValues(t, 1, s.mustEval(t, `project.streams.get("/called").getEvents().length`))
	f := s.failure(t, `project.streams.get("/called").readOnly().append({type: "note"})`)
	require.Equal(t, "permissionDenied", f.Code, f.Message)
	f = s.failure(t, `project.streams.get("/called").readOnly.append({type: "note"})`)
	require.Equal(t, "permissionDenied", f.Code, f.Message)
	require.EqualValues(t, 1, s.mustEval(t, `project.streams.get("/called").readOnly().getEvents().length`))
	require.Equal(t, s.mustEval(t, `String(project.streams.get("/called"))`), s.mustEval(t, `String(project.streams().get("/called"))`))
	require.Equal(t, s.mustEval(t, `JSON.stringify(project.streams.get("/called").subscriptions)`), s.mustEval(t, `JSON.stringify(project.streams.get("/called").subscriptions())`))
	s.mustEval(t, `project.streams.get("/called").subscriptions().list()`)
}

// A read refused through an append-only stream names the method called: getEvents reads its
// page through Stream.getEventPage, and said so ("Stream.getEventPage needs the read right").
func TestEval_AppendOnlyRefusalNamesTheMethodCalled(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `project.streams.get("/ao").append({type: "note"})`)
	for _, tc := range []struct{ call, method string }{
		{`getEvents()`, "getEvents"},
		{`getEvents({all: true})`, "getEvents"},
		{`getEventPage()`, "getEventPage"},
		{`describe()`, "describe"},
	} {
		f := s.failure(t, `project.streams.get("/ao").appendOnly().`+tc.call)
		require.Equal(t, "permissionDenied", f.Code, f.Message)
		require.Contains(t, f.Message, "Stream."+tc.method+" needs the read right", tc.call)
		if tc.method != "getEventPage" {
			require.NotContains(t, f.Message, "getEventPage", tc.call)
		}
	}
}

// .watch --processor prints the live state of the processor a processor-wake subscription runs:
// its snapshot, then a patch as it processes what is appended.
func TestWatch_Processor(t *testing.T) {
	ts := startProcessorServer(t, "watch-processor", "guestbook")
	s := newSession(t, ts) // --json
	s.mustEval(t, `project.streams.get("/book").subscriptions.configure({name: "guestbook", receiver: {type: "processor-wake"}})`)

	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	result := make(chan error, 1)
	go func() { result <- s.RunCommand(wctx, "watch /book --processor guestbook") }()
	require.True(t, s.out.waitFor(`"state":{"name":"guestbook"`), "the snapshot: %q", s.out.String())
	ts.appendDirect(t, "/book", examples.GuestbookSigned.Input(examples.Signed{Name: "ada", Message: "hi"}, ""))
	require.True(t, s.out.waitFor(`{"value":2,"op":"replace","path":"/processedOffset"}`), "a patch for offset 2: %q", s.out.String())
	cancel()
	require.NoError(t, <-result)
	var frames int
	for _, l := range strings.Split(strings.TrimSpace(s.out.String()), "\n")[1:] { // after configure's answer
		var frame struct {
			Revision uint64          `json:"revision"`
			State    json.RawMessage `json:"state"`
			Ops      json.RawMessage `json:"ops"`
		}
		require.NoError(t, json.Unmarshal([]byte(l), &frame), "line %q", l)
		require.NotZero(t, frame.Revision)
		require.True(t, (frame.State != nil) != (frame.Ops != nil), "a snapshot or a patch: %q", l)
		frames++
	}
	require.GreaterOrEqual(t, frames, 2)

	require.Error(t, s.RunCommand(context.Background(), "watch /book --processor"), "a name is needed")
}
