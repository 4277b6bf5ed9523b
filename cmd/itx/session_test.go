package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/cmd/itx/internal/repl"
	"github.com/stretchr/testify/require"
)

// A method that takes a name or path, called without it (or with undefined or null), answers
// invalidArgument naming the parameter, before anything is sent; the session goes on.
func TestEval_MissingStringArgumentIsInvalid(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/a", itx.EventInput{Type: "note"})
	s := newSession(t, ts)
	for src, param := range map[string]string{
		`project.streams.get()`:                                "Streams.get: path is required",
		`project.streams.get(undefined)`:                       "Streams.get: path is required",
		`project.streams.get(null)`:                            "Streams.get: path is required",
		`project.streams.get({})`:                              "Streams.get: path is required",
		`project.streams.get("/a").subscriptions.get()`:        "Subscriptions.get: name is required",
		`project.streams.get("/a").resumeSubscription()`:       "resumeSubscription: name is required",
		`project.streams.get("/a").subscriptions.remove()`:     "Subscriptions.remove: name is required",
		`project.streams.get("/a").readers.remove(null)`:       "Readers.remove: name is required",
		`project.capabilities.unmount()`:                       "Capabilities.unmount: name is required",
		`project.admin.createProject()`:                        "Admin.createProject: name is required",
		`project.streams.get("/a").subscriptions.get(42)`:      "Subscriptions.get: expected name as a string, got a number",
		`project.streams.get("/a").resumeSubscription({})`:     "resumeSubscription: name is required",
		`project.streams.get("/a").readers.remove({nme: "x"})`: `Readers.remove: unknown option "nme"`,
	} {
		f := s.failure(t, src)
		require.Equal(t, "invalidArgument", f.Code, "%s: %s", src, f.Message)
		require.Contains(t, f.Message, param, src)
	}
	require.Equal(t, 1.0, s.mustEval(t, `project.streams.get("/a").describe().headOffset`), "the session goes on")
}

// liveState() returns once the first snapshot has arrived: snapshot() right after it shows the
// state, never an empty revision 0 (the snapshot frame races the liveState answer, so each
// view is opened several times).
func TestEval_LiveStateHasItsFirstSnapshot(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/a", itx.EventInput{Type: "note"})
	s := newSession(t, ts)
	s.mustEval(t, `project.streams.get("/a").subscriptions.configure({name: "proc", receiver: {type: "processor-wake", placement: "remote"}})`)
	for i := range 20 {
		v := obj(t, s.mustEval(t, `var lv = project.streams.get("/a").liveState(); lv.snapshot()`))
		require.NotZero(t, v["revision"], "try %d: %v", i, v)
		require.Equal(t, "/a", obj(t, v["state"])["path"], "try %d: %v", i, v)
		s.mustEval(t, `lv.cancel()`)

		v = obj(t, s.mustEval(t, `var pv = project.streams.get("/a").subscriptions.get("proc").processor.liveState(); pv.snapshot()`))
		require.NotZero(t, v["revision"], "processor, try %d: %v", i, v)
		require.NotNil(t, v["state"], "processor, try %d: %v", i, v)
		s.mustEval(t, `pv.cancel()`)
	}
}

// A connection closed from itx (or dropped with the connection to itxd it lived on) answers
// failedPrecondition, not an internal error from a released client; closing it again and
// cancelling a live view again do nothing.
func TestEval_CallsAfterCloseAreFailedPrecondition(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/a", itx.EventInput{Type: "note"})
	s := newSession(t, ts)
	closed := repl.Failure{Code: "failedPrecondition", Message: "the connection is closed"}

	s.mustEval(t, `var c = project.streams.get("/a").openConnection(0); c.ping()`)
	s.mustEval(t, `c.close("done")`)
	require.Equal(t, closed, s.failure(t, `c.ping()`))
	s.mustEval(t, `c.close("again")`)
	require.Equal(t, "failedPrecondition", s.mustEval(t, `try { c.ping(); "no error" } catch (e) { e.code }`), "scripts can branch on it")
	s.mustEval(t, `c.take()`)

	s.mustEval(t, `var lv = project.streams.get("/a").liveState(); lv.cancel()`)
	s.mustEval(t, `lv.cancel()`)
	require.Equal(t, "/a", obj(t, obj(t, s.mustEval(t, `lv.snapshot()`))["state"])["path"], "the last snapshot stays readable")

	// A reconnect replaces the connection to itxd: what lived on the old one is closed.
	s.mustEval(t, `var c2 = project.streams.get("/a").openConnection(0); var lv2 = project.streams.get("/a").liveState()`)
	require.NoError(t, s.RunCommand(context.Background(), "reconnect"))
	require.Equal(t, closed, s.failure(t, `c2.ping()`))
	s.mustEval(t, `c2.close(); lv2.cancel()`)
	require.Equal(t, 1.0, s.mustEval(t, `project.streams.get("/a").describe().headOffset`), "the session goes on")
}

// A subscription's describe() says whether a webhook secret is set, as the server reports it;
// the secret itself never comes back.
func TestEval_DescribeSaysSecretSet(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/a", itx.EventInput{Type: "note"})
	s := newSession(t, ts)
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	s.mustEval(t, `var subs = project.streams.get("/a").subscriptions`)
	s.mustEval(t, `subs.configure({name: "wh", receiver: {type: "webhook-post", url: "http://127.0.0.1:1/x", secret: "`+secret+`"}})`)
	s.mustEval(t, `subs.configure({name: "plain", receiver: {type: "webhook-post", url: "http://127.0.0.1:1/x"}})`)

	out, err := s.eval(t, `subs.get("wh").describe()`)
	require.NoError(t, err)
	require.NotContains(t, out, secret)
	d := obj(t, s.mustEval(t, `subs.get("wh").describe()`))
	require.Equal(t, true, d["secretSet"])
	d = obj(t, s.mustEval(t, `subs.get("plain").describe()`))
	require.Equal(t, false, d["secretSet"])
}

// getEvents' "more follow" hint repeats the query's options with the next after, so following
// it goes on reading what the first call read (here only notes); it counts in words that agree.
func TestEval_GetEventsHintKeepsTheQuery(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/a", itx.EventInput{Type: "note"}, itx.EventInput{Type: "other"}, itx.EventInput{Type: "note"},
		itx.EventInput{Type: "other"}, itx.EventInput{Type: "note"})
	s := newSession(t, ts)
	s.errs.Reset()
	require.Equal(t, []any{1.0}, s.mustEval(t, `project.streams.get("/a").getEvents({after: 0, limit: 1, types: ["note"]}).map(e => e.offset)`))
	require.Equal(t, `(1 event shown, more follow: getEvents({after: 1, limit: 1, types: ["note"]}) for the next page, `+
		`or getEvents({types: ["note"], all: true}) for every one)`+"\n", s.errs.String())

	s.errs.Reset()
	require.Equal(t, []any{3.0}, s.mustEval(t, `project.streams.get("/a").getEvents({after: 1, limit: 1, types: ["note"]}).map(e => e.offset)`),
		"the hint's next page is the next note")
	require.Contains(t, s.errs.String(), `getEvents({after: 3, limit: 1, types: ["note"]})`)
	require.Equal(t, []any{1.0, 3.0, 5.0}, s.mustEval(t, `project.streams.get("/a").getEvents({types: ["note"], all: true}).map(e => e.offset)`),
		"the hint's every-one call")

	s.errs.Reset()
	s.mustEval(t, `project.streams.get("/a").getEvents(0, 2, {includeEphemeral: true, before: 5})`)
	require.Equal(t, `(2 events shown, more follow: getEvents({after: 2, before: 5, limit: 2, includeEphemeral: true}) for the next page, `+
		`or getEvents({before: 5, includeEphemeral: true, all: true}) for every one)`+"\n", s.errs.String())
}

// A stream's live state shows its times as itx shows every time, ISO-8601 strings in UTC: in
// the snapshot and in the patches that follow (applied to the snapshot, they still reproduce
// the state). Offsets and lags stay numbers.
func TestEval_LiveStateTimesAreISO(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/a", itx.EventInput{Type: "note"})
	s := newSession(t, ts)
	rev := openTimesView(t, s)

	// A webhook that cannot connect retries: its nextAttemptAt and the append's lastAppendAt
	// arrive as patches.
	s.mustEval(t, `project.streams.get("/a").subscriptions.configure({name: "hook", start: "now", receiver: {type: "webhook-post", url: "http://127.0.0.1:1/x"}})`)
	s.mustEval(t, `project.streams.get("/a").append({type: "note"})`)
	waitForTimePatches(t, s, rev)
}

// The same when the view fell behind meanwhile: the server then sends a fresh snapshot instead
// of the patches it missed (nothing queues for a slow subscriber), so the append's lastAppendAt
// arrives in that snapshot, not as a patch; a later append's does. Here the view is held behind
// by a proxy that keeps the server's frames from it while another session configures the
// webhook and appends twice (each change its own revision).
func TestEval_LiveStateTimesAreISOAfterTheViewFellBehind(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/a", itx.EventInput{Type: "note"})
	proxy := newGatedProxy(t, ts.addr)
	s := newSession(t, &testServer{addr: proxy.addr, token: ts.token, dir: ts.dir})
	rev := openTimesView(t, s)
	other := newSession(t, ts)
	other.mustEval(t, `var st = project.streams.get("/a")`)
	// engineState is the live state the server computes now: a new view's first snapshot.
	engineState := func() map[string]any {
		return obj(t, other.mustEval(t, `(function() { var l = st.liveState(); var state = l.snapshot().state; l.cancel(); return state })()`))
	}
	// engineAtHead waits until the server's live state shows head (and the webhook).
	engineAtHead := func(head float64) {
		t.Helper()
		waitFor(t, fmt.Sprintf("head %v and the webhook in the live state", head), func() bool {
			state := engineState()
			return state["head"] == head && obj(t, state["subscriptions"])["hook"] != nil
		})
	}

	proxy.hold()
	other.mustEval(t, `st.subscriptions.configure({name: "hook", start: "now", receiver: {type: "webhook-post", url: "http://127.0.0.1:1/x"}})`)
	head := obj(t, other.mustEval(t, `st.describe()`))["headOffset"].(float64) // the configured fact is an event too
	engineAtHead(head)
	other.mustEval(t, `st.append({type: "note"})`)
	engineAtHead(head + 1)
	other.mustEval(t, `st.append({type: "note"})`)
	engineAtHead(head + 2)
	proxy.release()

	waitForTimePatches(t, s, rev)
}

// openTimesView opens the stream /a's live state as lv and checks its first snapshot's times;
// it returns the snapshot's revision.
func openTimesView(t *testing.T, s *session) float64 {
	t.Helper()
	s.mustEval(t, `var lv = project.streams.get("/a").liveState()`)
	snap := obj(t, s.mustEval(t, `lv.snapshot()`))
	state := obj(t, snap["state"])
	at, ok := state["lastAppendAt"].(string)
	require.True(t, ok, "lastAppendAt %v (%T) is not a time string", state["lastAppendAt"], state["lastAppendAt"])
	_, err := time.Parse(time.RFC3339Nano, at)
	require.NoError(t, err)
	require.Equal(t, 1.0, state["head"])
	return snap["revision"].(float64)
}

// waitForTimePatches waits until lv's patches have carried a webhook's nextAttemptAt and an
// append's lastAppendAt, requiring every time in them to be an ISO string. A change the view
// received in a fresh snapshot (it fell behind) is not in a patch: each time a new snapshot
// has come while no lastAppendAt patch has, it appends again, so one arrives as a patch.
func waitForTimePatches(t *testing.T, s *session, snapshotRevision float64) {
	t.Helper()
	var times []string
	seen := func(suffix string) bool {
		return slices.ContainsFunc(times, func(p string) bool { return strings.HasSuffix(p, suffix) })
	}
	require.Eventually(t, func() bool {
		patches, _ := s.mustEval(t, `lv.patches()`).([]any)
		for _, p := range patches {
			for _, op := range obj(t, p)["ops"].([]any) {
				o := obj(t, op)
				path, _ := o["path"].(string)
				if strings.HasSuffix(path, "At") {
					v, ok := o["value"].(string)
					require.True(t, ok, "%s patched to %v (%T), not a time string", path, o["value"], o["value"])
					times = append(times, path)
					_, err := time.Parse(time.RFC3339Nano, v)
					require.NoError(t, err)
				}
				if sub, ok := o["value"].(map[string]any); ok && sub["nextAttemptAt"] != nil {
					_, isText := sub["nextAttemptAt"].(string)
					require.True(t, isText, "nextAttemptAt %v", sub["nextAttemptAt"])
					times = append(times, path+"/nextAttemptAt")
				}
			}
		}
		if !slices.Contains(times, "/lastAppendAt") {
			if rev := obj(t, s.mustEval(t, `lv.snapshot()`))["revision"].(float64); rev != snapshotRevision {
				snapshotRevision = rev // a fresh snapshot took the change: append again
				s.mustEval(t, `project.streams.get("/a").append({type: "note"})`)
			}
		}
		return seen("nextAttemptAt") && slices.Contains(times, "/lastAppendAt")
	}, 20*time.Second, 10*time.Millisecond)
}

// .help shows every option a method takes: the options a call names as known when given an
// unknown one are all in the method's line of .help (the delivery controls maxDeliveryEvents
// and maxDeliveryBytes of configure among them, and each receiver kind's fields: the help showed
// only a webhook's url, so nothing at the prompt said that an itx-call receiver names its
// mounted Receiver as capability). createProject's line names the fields its
// answer has.
func TestHelp_NamesEveryOption(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/a", itx.EventInput{Type: "note"})
	s := newSession(t, ts)
	help := func(iface string) string {
		s.out.Reset()
		require.NoError(t, s.RunCommand(context.Background(), "help "+iface))
		return s.out.String()
	}
	line := func(iface, method string) string {
		var h struct {
			Methods []struct{ Name, Usage string }
		} // the session prints JSON
		require.NoError(t, json.Unmarshal([]byte(help(iface)), &h))
		for _, m := range h.Methods {
			if m.Name == method {
				return m.Usage
			}
		}
		t.Fatalf(".help %s has no line for %s", iface, method)
		return ""
	}
	for _, c := range []struct{ iface, method, call string }{
		{"Subscriptions", "configure", `project.streams.get("/a").subscriptions.configure({bogus: 1})`},
		{"Subscriptions", "configure", `project.streams.get("/a").subscriptions.configure({receiver: {type: "webhook-post", bogus: 1}})`},
		{"Subscriptions", "configure", `project.streams.get("/a").subscriptions.configure({receiver: {type: "copy-to-stream", bogus: 1}})`},
		{"Subscriptions", "configure", `project.streams.get("/a").subscriptions.configure({receiver: {type: "itx-call", bogus: 1}})`},
		{"Subscriptions", "configure", `project.streams.get("/a").subscriptions.configure({receiver: {type: "processor-wake", bogus: 1}})`},
		{"Stream", "openConnection", `project.streams.get("/a").openConnection({bogus: 1})`},
		{"Stream", "append", `project.streams.get("/a").append({type: "x"}, {bogus: 1})`},
		{"Stream", "getEvents", `project.streams.get("/a").getEvents({bogus: 1})`},
		{"Stream", "waitForEvent", `project.streams.get("/a").waitForEvent({bogus: 1})`},
		{"Stream", "schedule", `project.streams.get("/a").schedule({event: {}, bogus: 1})`},
		{"Admin", "createToken", `project.admin.createToken({bogus: 1})`},
	} {
		f := s.failure(t, c.call)
		require.Equal(t, "invalidArgument", f.Code, c.call)
		_, known, ok := strings.Cut(f.Message, "(known: ")
		require.True(t, ok, "%s: %s", c.call, f.Message)
		usage := line(c.iface, c.method)
		for _, k := range strings.Split(strings.TrimSuffix(known, ")"), ", ") {
			require.Contains(t, usage, k, ".help %s: %s takes %s, which its help does not show", c.iface, c.method, k)
		}
	}
	require.Contains(t, line("Admin", "createProject"), "{id, name, token, tokenInfo}", "the fields createProject answers")
}

// createToken's expiresInMs is counted in milliseconds from now however far it reaches: 2e13 ms
// (about 634 years) once overflowed a time.Duration and made a token expiring in 2076, and 1e13
// one refused as "expiresAt -6650552864872 is not in the future".
func TestEval_CreateTokenFarExpiry(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	for _, ms := range []int64{10_000_000_000_000, 20_000_000_000_000} {
		before := time.Now()
		v := s.mustEval(t, fmt.Sprintf(`project.admin.createToken({label: "far", expiresInMs: %d}).info.expiresAt`, ms))
		at, err := time.Parse(time.RFC3339Nano, v.(string))
		require.NoError(t, err, "%v", v)
		want := time.UnixMilli(before.UnixMilli() + ms)
		require.WithinDuration(t, want, at, time.Minute, "expiresInMs %d", ms)
	}
	f := s.failure(t, `project.admin.createToken({label: "far", expiresInMs: 9223372036854775807n})`)
	require.Equal(t, "invalidArgument", f.Code, f.Message)
}

// A method that takes no arguments refuses one, as an unknown option is refused:
// subscriptions.list("mirror") listed every subscription, as if it had filtered them.
func TestEval_NoArgumentMethodsRefuseArguments(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/a", itx.EventInput{Type: "note"})
	s := newSession(t, ts)
	for src, want := range map[string]string{
		`project.streams.get("/a").subscriptions.list("mirror")`:   `Subscriptions.list: takes no arguments, got a string`,
		`project.streams.get("/a").readers.list({name: "r"})`:      `Readers.list: takes no arguments, got an object`,
		`project.streams.get("/a").describe(1)`:                    `Stream.describe: takes no arguments, got a number`,
		`project.streams.get("/a").listScheduled(undefined, true)`: `Stream.listScheduled: takes no arguments, got a boolean`,
		`project.describe("x")`:                                    `Project.describe: takes no arguments, got a string`,
	} {
		f := s.failure(t, src)
		require.Equal(t, "invalidArgument", f.Code, "%s: %s", src, f.Message)
		require.Equal(t, want, f.Message, src)
	}
	require.Equal(t, 1.0, s.mustEval(t, `project.streams.get("/a").describe(undefined).headOffset`), "undefined is no argument")
}

// A value that cannot be encoded as JSON is named once by its code: the message read
// "append: payload: itx.invalidArgument: the value is nested too deeply ...", a code inside the
// message of an error that prints its own.
func TestEval_UnencodableValueHasOneCode(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	f := s.failure(t, `var o = {}; o.o = o; project.streams.get("/a").append({type: "x", payload: o})`)
	require.Equal(t, "invalidArgument", f.Code, f.Message)
	require.Equal(t, "append: payload: the value is nested too deeply (or refers to itself) to encode as JSON", f.Message)
}

// append's options read as the Go client's AppendOptions: an expectedHeadOffset alone makes the
// append conditional, and conditional: false, said outright, makes it unconditional whatever the
// expected head (it was conditional all the same, an offsetConflict the caller had turned off).
func TestEval_AppendConditionalFalseIsUnconditional(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/a", itx.EventInput{Type: "note"})
	s := newSession(t, ts)
	f := s.failure(t, `project.streams.get("/a").append({type: "x"}, {expectedHeadOffset: 0})`)
	require.Equal(t, "offsetConflict", f.Code, f.Message)
	f = s.failure(t, `project.streams.get("/a").append({type: "x"}, {conditional: true})`)
	require.Equal(t, "offsetConflict", f.Code, "conditional alone expects an empty stream: %s", f.Message)
	require.Equal(t, 2.0, s.mustEval(t, `project.streams.get("/a").append({type: "x"}, {conditional: false, expectedHeadOffset: 0}).headOffset`))
	require.Equal(t, 3.0, s.mustEval(t, `project.streams.get("/a").append({type: "x"}, {conditional: true, expectedHeadOffset: 2}).headOffset`))
}

// A string where JSON is expected (a payload, metadata, payloadContains) is read as JSON text; one
// that is not JSON is refused saying so, before anything is sent (the stream stays empty), and
// JSON text still goes in as the value it spells.
func TestEval_AStringIsReadAsJSONText(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	_, err := s.eval(t, `project.streams.get("/j").append({type: "note", payload: "hello"})`)
	require.Equal(t, itx.EInvalid, itx.ErrorCode(err), "%v", err)
	require.Contains(t, itx.ErrorMessage(err), `a string is read as JSON text, and "hello" is not JSON: give an object, such as {text: "hello"}`)
	require.Equal(t, 0.0, s.mustEval(t, `project.streams.get("/j").describe().headOffset`), "nothing was written")
	s.mustEval(t, `project.streams.get("/j").append({type: "note", payload: '{"text": "hello"}'})`)
	require.Equal(t, "hello", s.mustEval(t, `project.streams.get("/j").getEvents()[0].payload.text`))
}

// .help shows agent(path), the README's sugar for a stream's "agent" subscription and its
// processor, which no interface's help lists.
func TestHelp_ShowsAgent(t *testing.T) {
	ts := startServer(t)
	out := newSyncBuffer()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := repl.Connect(ctx, repl.Config{Addr: ts.addr, Token: ts.token, Out: out, Err: newSyncBuffer(), Format: repl.FormatPretty})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	require.NoError(t, s.RunCommand(ctx, "help"))
	require.Contains(t, out.String(), `agent("/a").processor.snapshot()`)
}

// take() right after close() says the connection closed (closedByClient), whether or not the
// server's own closed notice, a call of its own, has arrived yet: it once answered {events: []}
// alone now and then, as if the connection were still open.
func TestEval_TakeAfterCloseSaysClosed(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/a", itx.EventInput{Type: "note"})
	s := newSession(t, ts)
	for i := 0; i < 30; i++ {
		got := obj(t, s.mustEval(t, `var c = project.streams.get("/a").openConnection(0); c.take(1, 5000); c.close("done"); c.take()`))
		require.Equal(t, map[string]any{"code": "cancelled", "message": "closedByClient: done"}, got["closed"], "run %d: %v", i, got)
	}
}

// .then on a result, as a script written for a client whose calls return promises does, fails
// saying that itx calls return their results (it was goja's bare "Object has no member 'then'").
func TestEval_ThenOnAResultSaysCallsReturnResults(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/a", itx.EventInput{Type: "note"})
	s := newSession(t, ts)
	want := repl.Failure{Code: "TypeError", Message: "Object has no member 'then': itx calls return their results, not promises (use the result as it is; await is accepted)"}
	require.Equal(t, want, s.failure(t, `project.streams.get("/a").describe().then(d => d.path)`))
	require.Equal(t, want, s.failure(t, `project.streams.get("/a").then(a => a.describe())`))
	require.Equal(t, "/a", s.mustEval(t, `(await project.streams.get("/a").describe()).path`), "await is the way")
	require.Equal(t, repl.Failure{Code: "TypeError", Message: "Object has no member 'other'"}, s.failure(t, `({}).other()`), "other members as before")
}

// A promise still pending when an evaluation ends can never settle (itx runs no event loop):
// it is an error saying so, not a result printed as {} (an async function's remaining statements
// silently never ran).
func TestEval_PendingPromiseIsAnError(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	want := repl.Failure{Code: "failedPrecondition", Message: "the promise is still pending, and nothing would settle it: itx has no timers or event loop, and its calls return their results"}
	require.Equal(t, want, s.failure(t, `new Promise(() => {})`))
	require.Equal(t, want, s.failure(t, `(async () => { await new Promise(() => {}); return 1 })()`))
	require.Equal(t, 2.0, s.mustEval(t, `(async () => { await 1; return 2 })()`), "a settled promise is its value")
}

// readers.register without a name says the name is required (it said only "checkpoint:
// required", or, given a checkpoint, the server's "subscription name must not be empty").
func TestEval_RegisterReaderNeedsAName(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/a", itx.EventInput{Type: "note"})
	s := newSession(t, ts)
	require.Equal(t, repl.Failure{Code: "invalidArgument", Message: "Readers.register: name: required; checkpoint: required"},
		s.failure(t, `project.streams.get("/a").readers.register()`))
	require.Equal(t, repl.Failure{Code: "invalidArgument", Message: "Readers.register: name: required"},
		s.failure(t, `project.streams.get("/a").readers.register({checkpoint: 1})`))
	s.mustEval(t, `project.streams.get("/a").readers.register("mirror", 1)`)
}

// setSubscriptionCursor without a name and revokeToken without a token id say which is
// required (they reached itxd with an empty one: "subscription name must not be empty",
// `project "default" has no token ""`).
func TestEval_RequiredNamesAreNamed(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/a", itx.EventInput{Type: "note"})
	s := newSession(t, ts)
	require.Equal(t, repl.Failure{Code: "invalidArgument", Message: "setSubscriptionCursor: name: required"},
		s.failure(t, `project.streams.get("/a").setSubscriptionCursor({afterOffset: 1})`))
	require.Equal(t, repl.Failure{Code: "invalidArgument", Message: "Admin.revokeToken: tokenId: required (revokeToken(projectId, tokenId); listTokens() shows the ids)"},
		s.failure(t, `project.admin.revokeToken()`))
}

// openConnection takes openedBy as a string or as the TypeScript surface's {description}, whose
// text the live state then shows; an object without a description, or with members this
// server does not keep, is refused before anything opens.
func TestEval_OpenedByTakesTheTypeScriptObject(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/a", itx.EventInput{Type: "note"})
	s := newSession(t, ts)
	s.mustEval(t, `var c = project.streams.get("/a").openConnection({replayAfterOffset: 0, openedBy: {description: "browser"}, connectionKey: "tab-1"})`)
	state := obj(t, obj(t, s.mustEval(t, `var lv = project.streams.get("/a").liveState(); lv.snapshot()`))["state"])
	s.mustEval(t, `lv.cancel()`)
	require.Equal(t, "browser", obj(t, obj(t, state["connections"])["tab-1"])["openedBy"], "connections: %v", state["connections"])
	for src, want := range map[string]string{
		`project.streams.get("/a").openConnection({openedBy: {}})`:                                    "openedBy: description: is required",
		`project.streams.get("/a").openConnection({openedBy: {description: 7}})`:                      "description: expected a string",
		`project.streams.get("/a").openConnection({openedBy: {description: "b", user: {name: "j"}}})`: `unknown option "user"`,
		`project.streams.get("/a").openConnection({openedBy: ["b"]})`:                                 "openedBy: expected a string, got an array",
	} {
		f := s.failure(t, src)
		require.Equal(t, "invalidArgument", f.Code, src)
		require.Contains(t, f.Message, want, src)
	}
	require.EqualValues(t, 1, s.mustEval(t, `project.streams.get("/a").liveState().snapshot().state.connectionsOpen`), "the refused opens opened nothing")
}

// .help lists every interface .help <name> explains, the objects the prompt makes of a
// connection and a mounted receiver among them, and shows those objects' own methods (take,
// unmount), not the schema's receive(batch), which only itxd calls.
func TestHelp_ListsThePromptsObjects(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	run := func(cmd string, into any) {
		s.out.Reset()
		require.NoError(t, s.RunCommand(context.Background(), cmd), cmd)
		require.NoError(t, json.Unmarshal([]byte(s.out.String()), into), "%s: %s", cmd, s.out.String())
	}
	var all struct{ Interfaces []string }
	run("help", &all)
	require.Subset(t, all.Interfaces, []string{"Connection", "Receiver", "Stream"})
	methods := map[string][]string{}
	for _, name := range all.Interfaces {
		var h struct{ Methods []struct{ Name string } }
		run("help "+name, &h)
		require.NotEmpty(t, h.Methods, ".help %s", name)
		for _, m := range h.Methods {
			methods[name] = append(methods[name], m.Name)
		}
	}
	require.Equal(t, []string{"take", "unmount"}, methods["Receiver"])
	require.Equal(t, []string{"take", "ping", "key", "close"}, methods["Connection"])
}
