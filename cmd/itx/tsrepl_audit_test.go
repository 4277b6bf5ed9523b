package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/cmd/itx/internal/repl"
	"github.com/stretchr/testify/require"
)

// A method that takes one name (Streams.get, Subscriptions.get, resumeSubscription, remove,
// cancelScheduled, Readers.remove, ...) refuses a second argument, as getEvents refuses a third
// and list() refuses one: resumeSubscription("m", 1) or get("/a", {includeEphemeral: true})
// must not run as if the extra value were not there.
func TestEval_OneNameMethodsRefuseMoreArguments(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var st = project.streams.get("/more"); st.append({type: "a"})`)
	s.mustEval(t, `st.subscriptions.configure("mirror", {type: "copy-to-stream", path: "/more-copy"})`)
	for _, src := range []string{
		`project.streams.get("/more", "/other").describe()`,
		`st.subscriptions.get("mirror", "other").describe()`,
		`st.resumeSubscription("mirror", 1)`,
		`st.subscriptions.remove("mirror", "other")`,
		`st.cancelScheduled("k", 1)`,
		`st.readers.remove("r", 1)`,
		`project.capabilities.unmount("c", 1)`,
	} {
		f := s.failure(t, src)
		require.Equal(t, "invalidArgument", f.Code, src)
		require.Contains(t, f.Message, "too many arguments", src)
	}
	// An options object may follow the name, as after any method's values, but it has nothing
	// left to say.
	for src, want := range map[string]string{
		`project.streams.get("/more", {includeEphemeral: true}).describe()`: `Streams.get: unknown option "includeEphemeral" (known: path)`,
		`st.resumeSubscription("mirror", {name: "other"})`:                  `resumeSubscription: name is given twice, as an argument and as an option`,
	} {
		f := s.failure(t, src)
		require.Equal(t, "invalidArgument", f.Code, src)
		require.Equal(t, want, f.Message, src)
	}
	require.Equal(t, "/more", obj(t, s.mustEval(t, `project.streams.get("/more", {}).describe()`))["path"])
	// The subscription is still there: remove("mirror", "other") did not remove it.
	require.Equal(t, "mirror", obj(t, s.mustEval(t, `st.subscriptions.get("mirror").describe()`))["config"].(map[string]any)["name"])
	// An absent trailing value is no argument, as for methods that take none.
	require.Equal(t, "/more", obj(t, s.mustEval(t, `project.streams.get("/more", undefined).describe()`))["path"])
}

// A member a capability does not have is a TypeError that names the interface and the member
// when it is read, not undefined: a typo such as a.subscription.get("x") said "Cannot read
// property 'get' of undefined or null", a.nope() "Object has no member 'nope'", and a.subscription
// alone printed nothing and succeeded.
func TestEval_UnknownMemberOfACapabilityNamesIt(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var a = project.streams.get("/typo")`)
	for src, want := range map[string]string{
		`a.subscription`:                     "Stream has no member 'subscription'",
		`a.subscription.get("x")`:            "Stream has no member 'subscription'",
		`a.nope()`:                           "Stream has no member 'nope'",
		`project.stream.get("/a")`:           "Project has no member 'stream'",
		`a.subscriptions.get("m").descibe()`: "Subscription has no member 'descibe'",
	} {
		f := s.failure(t, src)
		require.Equal(t, "TypeError", f.Code, src)
		require.Contains(t, f.Message, want, src)
		require.Contains(t, f.Message, ".help", src)
	}
	// What every object has, what was set on it, and what a promise resolution asks for still
	// answer as JavaScript does.
	require.Equal(t, "[Stream /typo]", s.mustEval(t, `a.toString()`))
	require.Equal(t, "/typo", s.mustEval(t, `a.path`))
	require.Equal(t, true, s.mustEval(t, `a.hasOwnProperty("path")`))
	require.Equal(t, "undefined", s.mustEval(t, `typeof a.then`))
	require.Equal(t, 7.0, s.mustEval(t, `a.note = 7; a.note`))
	require.Equal(t, `"[Stream /typo]"`, s.mustEval(t, `JSON.stringify(a)`))
	require.Equal(t, "[Stream /typo]", s.mustEval(t, "`${a}`"))
	require.Equal(t, "/typo", obj(t, s.mustEval(t, `a.describe()`))["path"])
}

// A method read without calling it (a.describe, forgetting the parentheses) prints as the
// method it is, [Function describe], as a function the script defines does; it printed the Go
// closure behind it, [Function github.com/itx-dev/itx/cmd/itx/internal/repl.(*Session).proxy.func4].
func TestEval_AMethodPrintsByItsName(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var a = project.streams.get("/named"); a.append({type: "x"})`)
	for src, want := range map[string]string{
		`a.describe`: "[Function describe]",
		`a.subscriptions.get("m").processor.snapshot`: "[Function snapshot]",
		`project.streams.get`:                         "[Function get]",
		`a.openConnection(0).take`:                    "[Function take]",
		`a.liveState().patches`:                       "[Function patches]",
		`function mine() {}; mine`:                    "[Function mine]",
	} {
		require.Equal(t, want, s.mustEval(t, src), src)
	}
	require.Equal(t, "describe", s.mustEval(t, `a.describe.name`))
}

// An offset, limit or timeout of the wrong type says what it got: the string "10" printed as
// 10 ("limit: expected a non-negative integer, got 10", as if 10 were refused), [3] as 3 and
// {} as [object Object].
func TestEval_AWrongIntegerSaysWhatItGot(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var a = project.streams.get("/ints"); a.append({type: "x"})`)
	for src, want := range map[string]string{
		`a.getEvents({limit: "10"})`:                             `getEvents: limit: expected a non-negative integer, got "10" (a string)`,
		`a.getEvents({after: [3]})`:                              `getEvents: after: expected a non-negative integer, got an array`,
		`a.getEvents({after: {}})`:                               `getEvents: after: expected a non-negative integer, got an object`,
		`a.getEvents({after: true})`:                             `getEvents: after: expected a non-negative integer, got a boolean`,
		`a.getEvents({after: -1})`:                               `getEvents: after: expected a non-negative integer, got -1`,
		`a.getEvents({after: 1.5})`:                              `getEvents: after: expected a non-negative integer, got 1.5`,
		`a.setSubscriptionCursor({name: "m", afterOffset: "1"})`: `setSubscriptionCursor: afterOffset: expected a non-negative integer, got "1" (a string)`,
	} {
		f := s.failure(t, src)
		require.Equal(t, "invalidArgument", f.Code, src)
		require.Equal(t, want, f.Message, src)
	}
}

// configure's receiver errors name what the caller wrote: a receiver given as a string said
// 'receiver.type must be ..., got ""', and a copy-to-stream receiver's missing or bad path was
// reported under the wire's name, receiver.receivingStreamPath, which the prompt never asks for.
func TestEval_ConfigureReceiverErrorsNameWhatWasWritten(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var a = project.streams.get("/recv"); a.append({type: "x"})`)
	for src, want := range map[string]string{
		`a.subscriptions.configure({name: "x", receiver: "copy-to-stream"})`:    `configure: receiver: expected an object {type: "webhook-post" | "copy-to-stream" | "itx-call" | "processor-wake", ...}, got a string`,
		`a.subscriptions.configure("x", {type: "copy-to-stream"})`:              `configure: receiver: path: stream path must not be empty`,
		`a.subscriptions.configure("x", {type: "copy-to-stream", path: "bad"})`: `configure: receiver: path: stream path "bad" must start with /`,
	} {
		f := s.failure(t, src)
		require.Equal(t, "invalidArgument", f.Code, src)
		require.Equal(t, want, f.Message, src)
	}
	require.Empty(t, arr(t, s.mustEval(t, `a.subscriptions.list()`)), "nothing was configured")
	require.Equal(t, "x", obj(t, s.mustEval(t, `a.subscriptions.configure("x", {type: "copy-to-stream", path: " /recv-copy "})`))["name"], "a path with spaces around it is trimmed, as itxd trims it")
}

// A chain is pipelined: project.streams.get(path).subscriptions.configure(...) reaches itxd
// whole while none of its answers has come back. With every answer held in a proxy, the
// subscription's configured event lands all the same (a client waiting on the answer of
// streams() before sending get() would never send configure).
func TestEval_ChainsArePipelined(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/piped", itx.EventInput{Type: "x", Payload: json.RawMessage(`{}`)})
	proxy := newGatedProxy(t, ts.addr)
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	out, errs := newSyncBuffer(), newSyncBuffer()
	rs, err := repl.Connect(cctx, repl.Config{Addr: proxy.addr, Token: ts.token, Out: out, Err: errs, Format: repl.FormatJSON})
	require.NoError(t, err)
	t.Cleanup(func() { rs.Close() })

	proxy.hold()
	defer proxy.release() // before the session's cleanup, which waits for the evaluation
	result := make(chan error, 1)
	go func() {
		_, err := rs.Eval(context.Background(), "<test>",
			`project.streams.get("/piped").subscriptions.configure({name: "m", receiver: {type: "copy-to-stream", path: "/piped-copy"}})`)
		result <- err
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	st := ts.streamDirect(t, ctx, "/piped")
	e, err := client.WaitForEvent(ctx, st, itx.Predicate{Types: []string{"stream/subscription-configured"}}, 0, 10*time.Second)
	require.NoError(t, err, "the configure reached itxd while every answer was held")
	require.Equal(t, int64(2), e.Offset)
	proxy.release()
	require.NoError(t, <-result)
}

// .help Connection shows the connection object openConnection returns at the prompt, take()
// first: it showed the schema's Connection (close, ping, key), without the one way the prompt
// reads a connection's events. An interface name is found whatever its case (.help stream).
func TestHelp_ConnectionShowsTheObjectThePromptMakes(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	help := func(iface string) map[string]string {
		s.out.Reset()
		require.NoError(t, s.RunCommand(context.Background(), "help "+iface))
		var h struct {
			Interface string
			Methods   []struct{ Name, Usage string }
		} // the session prints JSON
		require.NoError(t, json.Unmarshal([]byte(s.out.String()), &h), s.out.String())
		out := map[string]string{"": h.Interface}
		for _, m := range h.Methods {
			out[m.Name] = m.Usage
		}
		return out
	}
	conn := help("Connection")
	require.Contains(t, conn, "take", "%v", conn)
	require.Contains(t, conn["take"], "events")
	for _, m := range []string{"ping", "key", "close"} {
		require.Contains(t, conn, m)
	}
	s.mustEval(t, `var c = project.streams.get("/h").openConnection(); c.close()`)
	keys := arr(t, s.mustEval(t, `Object.keys(c).filter(k => k != "toString" && k != "toJSON").sort()`))
	require.Len(t, conn, len(keys)+1, "one line for each method of the object: %v", keys)

	require.Equal(t, "Stream", help("stream")[""])
	require.Contains(t, help("stream"), "getEvents")
}

// A capability thrown (or a promise rejected with one) prints as an uncaught value: describing
// it read its "value", "name" and "message" members, which a capability does not have, and
// since 74a699e the TypeError that says so escaped the runtime and crashed itx.
func TestEval_AThrownCapabilityIsDescribed(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	for src, want := range map[string]string{
		`throw project`:                                    "[Project]",
		`throw project.streams.get("/thrown")`:             "[Stream /thrown]",
		`Promise.reject(project.streams.get("/rejected"))`: "[Stream /rejected]",
	} {
		f := s.failure(t, src)
		require.Equal(t, repl.Failure{Code: "Uncaught", Message: want}, f, src)
	}
	require.Equal(t, "TypeError", s.failure(t, `project.nope`).Code, "inside an evaluation a missing member still throws")
}

// TypeScript's stream.append(e1, e2) appends both; here several events go as an array, and the
// second argument is append's options. Events given the TypeScript way are refused with that
// said (it read 'append options: unknown option "type"'), and an argument past the options is
// refused instead of dropped.
func TestEval_AppendSaysHowToAppendSeveral(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var a = project.streams.get("/several")`)
	f := s.failure(t, `a.append({type: "a"}, {type: "b"})`)
	require.Equal(t, "invalidArgument", f.Code)
	require.Contains(t, f.Message, `append([{type: "a"}, {type: "b"}])`)
	f = s.failure(t, `a.append({type: "a"}, {}, {type: "c"})`)
	require.Equal(t, "invalidArgument", f.Code)
	require.Contains(t, f.Message, "too many arguments")
	require.Equal(t, 0.0, obj(t, s.mustEval(t, `a.describe()`))["headOffset"], "nothing was appended")
	require.Equal(t, []any{1.0, 2.0}, obj(t, s.mustEval(t, `a.append([{type: "a"}, {type: "b"}], {})`))["offsets"])
}

// schedule(event, dueAt) refuses a third argument, as every other method refuses one past what
// it takes: it was dropped and the timer set as if it were not there.
func TestEval_ScheduleRefusesMoreArguments(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `project.streams.get("/sched").append({type: "born"})`)
	f := s.failure(t, `project.streams.get("/sched").schedule({type: "x", idempotencyKey: "k"}, "10m", "20m")`)
	require.Equal(t, "invalidArgument", f.Code)
	require.Contains(t, f.Message, "schedule: too many arguments")
	require.Empty(t, arr(t, s.mustEval(t, `project.streams.get("/sched").listScheduled()`)), "nothing was scheduled")
}

// configure refuses what it would drop: a fourth argument, anything after its options object,
// and a name or receiver given twice (configure("x", r, {name: "y"}) configured "x").
func TestEval_ConfigureRefusesWhatItWouldDrop(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var subs = project.streams.get("/conf").subscriptions; project.streams.get("/conf").append({type: "x"})`)
	r := `{type: "copy-to-stream", path: "/conf-copy"}`
	for src, want := range map[string]string{
		`subs.configure("x", ` + r + `, {}, 4)`:                                "configure: too many arguments",
		`subs.configure({name: "x", receiver: ` + r + `}, {start: "now"})`:     "configure: too many arguments",
		`subs.configure("x", ` + r + `, {name: "y"})`:                          "configure: name is given twice",
		`subs.configure("x", ` + r + `, {receiver: {type: "processor-wake"}})`: "configure: receiver is given twice",
	} {
		f := s.failure(t, src)
		require.Equal(t, "invalidArgument", f.Code, src)
		require.Contains(t, f.Message, want, src)
	}
	require.Empty(t, arr(t, s.mustEval(t, `subs.list()`)), "nothing was configured")
}

// The prompt's connection and live-view objects refuse arguments their methods do not take, as
// the capabilities' methods do: c.close(42) closed with no reason. (take and patches take
// (min, timeoutMs) and refuse anything else.)
func TestEval_ConnectionAndLiveViewMethodsRefuseArguments(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/objs", itx.EventInput{Type: "note"})
	s := newSession(t, ts)
	s.mustEval(t, `var c = project.streams.get("/objs").openConnection(); var v = project.streams.get("/objs").liveState()`)
	for src, want := range map[string]string{
		`c.take("10")`:       `Connection.take: min: expected a non-negative integer, got "10" (a string)`,
		`c.ping({})`:         `Connection.ping: takes no arguments, got an object`,
		`c.key("k")`:         `Connection.key: takes no arguments, got a string`,
		`c.close(42)`:        `Connection.close: reason: expected a string, got a number`,
		`c.close("done", 1)`: `Connection.close: takes a reason, got a number after it`,
		`v.snapshot(1)`:      `LiveView.snapshot: takes no arguments, got a number`,
		`v.patches(true)`:    `LiveView.patches: min: expected a non-negative integer, got a boolean`,
		`v.cancel("now")`:    `LiveView.cancel: takes no arguments, got a string`,
	} {
		f := s.failure(t, src)
		require.Equal(t, "invalidArgument", f.Code, "%s: %s", src, f.Message)
		require.Equal(t, want, f.Message, src)
	}
	require.Equal(t, "connection:1", s.mustEval(t, `c.key(undefined)`), "undefined is no argument")
	s.mustEval(t, `c.close("done"); v.cancel()`)
}
