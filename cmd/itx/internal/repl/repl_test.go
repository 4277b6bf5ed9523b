package repl

import (
	"bytes"
	"encoding/json"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/dop251/goja"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/stretchr/testify/require"
)

// Every method of every interface reachable from `project` must be bound: either a terminal
// binding or a navigation step. A method added to the schema fails this test until it is.
func TestBindings_CoverTheSchema(t *testing.T) {
	ifcs, err := Interfaces()
	require.NoError(t, err)
	for _, name := range []string{"Project", "Streams", "Stream", "Subscriptions", "Subscription"} {
		require.Contains(t, bindings, name, "the issue's interfaces are all bound")
	}
	reachable := map[string]bool{"Project": true}
	queue := []string{"Project"}
	for len(queue) > 0 {
		ifc := ifcs[queue[0]]
		queue = queue[1:]
		require.NotNil(t, ifc)
		for _, m := range ifc.Methods {
			_, terminal := bindings[ifc.Name][m.Name]
			_, nav := navigators[ifc.Name+"."+m.Name]
			require.True(t, terminal != nav, "%s.%s: want exactly one of a binding or a navigator (binding %v, navigator %v)", ifc.Name, m.Name, terminal, nav)
			if nav {
				require.NotEmpty(t, m.Returns, "%s.%s navigates but returns no capability", ifc.Name, m.Name)
				require.LessOrEqual(t, len(m.Params), 1, "%s.%s: a navigation step takes at most one (string) argument", ifc.Name, m.Name)
				if !reachable[m.Returns] {
					reachable[m.Returns] = true
					queue = append(queue, m.Returns)
				}
			}
		}
	}
	var bound []string
	for name := range bindings {
		bound = append(bound, name)
	}
	var got []string
	for name := range reachable {
		got = append(got, name)
	}
	sort.Strings(bound)
	sort.Strings(got)
	require.Equal(t, got, bound, "bindings cover exactly the interfaces reachable from project")
}

func TestInterfaces_PropertiesFollowTheTypeScriptSurface(t *testing.T) {
	ifcs, err := Interfaces()
	require.NoError(t, err)
	for _, tc := range []struct {
		iface, method, returns string
		property               bool
	}{
		{"Project", "streams", "Streams", true},
		{"Streams", "get", "Stream", false},
		{"Stream", "subscriptions", "Subscriptions", true},
		{"Subscriptions", "get", "Subscription", false},
		{"Subscription", "processor", "Processor", true},
		{"Stream", "append", "", false},
	} {
		m, ok := ifcs[tc.iface].Method(tc.method)
		require.True(t, ok, "%s.%s", tc.iface, tc.method)
		require.Equal(t, tc.returns, m.Returns, "%s.%s returns", tc.iface, tc.method)
		require.Equal(t, tc.property, m.Property, "%s.%s is a property", tc.iface, tc.method)
	}
}

func TestStripAwait(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`await s.describe()`, `s.describe()`},
		{`const e = await s.getEvents({after: 0})`, `const e = s.getEvents({after: 0})`},
		{`print("await me", 'await', ` + "`await`" + `) // await`, `print("await me", 'await', ` + "`await`" + `) // await`},
		{`x.await(1); awaited`, `x.await(1); awaited`},
		{"/* await */ await(f())", "/* await */ (f())"},
	} {
		got, _ := stripAwait(tc.in)
		require.Equal(t, tc.want, got, "stripAwait(%q)", tc.in)
	}
}

func TestRedeclarable(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`let a = project.streams.get("/a")`, `var a = project.streams.get("/a")`},
		{`const a = 1, b = 2; a + b`, `var   a = 1, b = 2; a + b`},
		{`x(); let {p, q} = o`, `x(); var {p, q} = o`},
		{`const e = await s.getEvents({after: 0})`, `var   e = s.getEvents({after: 0})`},
		{`for (let i = 0; i < 2; i++) { let j = i }`, `for (let i = 0; i < 2; i++) { let j = i }`},
		{`function f() { let x = 1; return x }`, `function f() { let x = 1; return x }`},
		{`"é"; let x = "let"`, `"é"; var x = "let"`},
		{`let x = (`, `let x = (`},
	} {
		require.Equal(t, tc.want, redeclarable(tc.in), "redeclarable(%q)", tc.in)
	}
}

func TestIncomplete(t *testing.T) {
	for src, want := range map[string]bool{
		`project.streams.get("/a").append({`: true,
		`function f() {`:                     true,
		"`multi":                             true,
		`let x = await s.describe(`:          true,
		`1 +`:                                true,
		`project.streams.list()`:             false,
		`let x = await s.describe()`:         false,
		`foo bar`:                            false, // an error, not more to come
		`let s = "a\`:                        false, // a syntax error (it read past the end and panicked)
		``:                                   false,
	} {
		require.Equal(t, want, Incomplete(src), "Incomplete(%q)", src)
	}
}

func TestPrettyJSON(t *testing.T) {
	got, err := prettyJSON(`{"offsets":[1,2],"z":{"a":"<b>","n":1.50},"e":[],"o":{},"l":[{"x":1}]}`)
	require.NoError(t, err)
	want := `{
  "offsets": [1, 2],
  "z": {
    "a": "<b>",
    "n": 1.50
  },
  "e": [],
  "o": {},
  "l": [
    {
      "x": 1
    }
  ]
}`
	require.Equal(t, want, got)
}

func TestSplitChain(t *testing.T) {
	require.Equal(t, `project.streams.get("/a.b").su`, trailingChain(`x = project.streams.get("/a.b").su`))
	require.Equal(t, `project.st`, trailingChain(`print(project.st`))
	got, ok := splitChain(`project.streams.get("/a.b").subscriptions.get('x(').de`)
	require.True(t, ok)
	require.Equal(t, []string{"project", "streams", `get("/a.b")`, "subscriptions", `get('x(')`, "de"}, got)
	_, ok = splitChain(`project.streams.get("/a`)
	require.False(t, ok)
}

// offlineSession is a session without a connection: enough to read arguments and print.
func offlineSession(t *testing.T, format Format) (*Session, *bytes.Buffer) {
	t.Helper()
	ifcs, err := Interfaces()
	require.NoError(t, err)
	var out bytes.Buffer
	s := &Session{ifcs: ifcs, caps: newCapCache(8), live: map[liveHandle]struct{}{},
		cfg: Config{Out: &out, Err: &out, Format: format}}
	require.NoError(t, s.initVM())
	return s, &out
}

func (s *Session) mustRun(t *testing.T, src string) goja.Value {
	t.Helper()
	v, err := s.vm.RunString(src)
	require.NoError(t, err)
	return v
}

func TestSession_Arguments(t *testing.T) {
	s, _ := offlineSession(t, FormatPretty)

	t.Run("event", func(t *testing.T) {
		in, err := s.eventInput("append", s.mustRun(t, `({type: "note", payload: {z: 1, a: [true, null]}, metadata: {by: "me"}, idempotencyKey: "k"})`))
		require.NoError(t, err)
		require.Equal(t, itx.EventInput{Type: "note", Payload: json.RawMessage(`{"z":1,"a":[true,null]}`),
			Metadata: json.RawMessage(`{"by":"me"}`), IdempotencyKey: "k"}, in, "payload keeps its key order")
		in, err = s.eventInput("append", s.mustRun(t, `({type: "raw", payload: '{"already": "json"}', ephemeral: true})`))
		require.NoError(t, err)
		require.Equal(t, `{"already": "json"}`, string(in.Payload), "a string payload is JSON text already")
		require.True(t, in.Ephemeral)

		_, err = s.eventInput("append", s.mustRun(t, `({type: "x", paylod: {}})`))
		require.ErrorContains(t, err, `append: unknown option "paylod" (known: type, payload, idempotencyKey, metadata, ephemeral)`)
		_, err = s.eventInput("append", s.mustRun(t, `({type: 1, ephemeral: "yes"})`))
		require.ErrorContains(t, err, "type: expected a string, got a number; ephemeral: expected true or false, got a string")
		_, err = s.eventInput("append", goja.Undefined())
		require.ErrorContains(t, err, "expected an event")
	})

	t.Run("query", func(t *testing.T) {
		q, _, err := s.query("getEvents", []goja.Value{s.mustRun(t, `({after: 2, before: 10, limit: 5, types: "note", includeEphemeral: true})`)})
		require.NoError(t, err)
		require.Equal(t, itx.Query{After: 2, Before: 10, Limit: 5, Types: []string{"note"}, IncludeEphemeral: true}, q)
		q, _, err = s.query("getEventPage", []goja.Value{s.mustRun(t, `({subscription: "mirror", types: "note"})`)})
		require.NoError(t, err)
		require.Equal(t, itx.Query{Types: []string{"note"}, Subscription: "mirror"}, q)
		require.Equal(t, `{types: ["note"], subscription: "mirror"}`, queryJS(q, false))
		q, _, err = s.query("getEvents", []goja.Value{goja.Undefined()})
		require.NoError(t, err)
		require.Equal(t, itx.Query{}, q)
		q, _, err = s.query("getEvents", []goja.Value{s.vm.ToValue(2), s.vm.ToValue(5), s.mustRun(t, `({types: "note"})`)})
		require.NoError(t, err)
		require.Equal(t, itx.Query{After: 2, Limit: 5, Types: []string{"note"}}, q, "positional values, then an options object")
		_, _, err = s.query("getEvents", []goja.Value{s.mustRun(t, `({after: 1.5})`)})
		require.ErrorContains(t, err, "after: expected a non-negative integer")
		_, _, err = s.query("getEvents", []goja.Value{s.mustRun(t, `([1])`)})
		require.ErrorContains(t, err, "after: expected a non-negative integer")
		_, _, err = s.query("getEvents", []goja.Value{s.vm.ToValue(2), s.mustRun(t, `({after: 3})`)})
		require.ErrorContains(t, err, "after is given twice")
		_, _, err = s.query("getEvents", []goja.Value{s.vm.ToValue(2), s.vm.ToValue(3), s.vm.ToValue(4)})
		require.ErrorContains(t, err, "too many arguments")
	})

	t.Run("subscription config", func(t *testing.T) {
		cfg, err := s.subscriptionConfig(s.mustRun(t, `({name: "hook", receiver: {type: "webhook-post", url: "https://h.test/", headers: {"X-A": "1"}, secret: "whsec_x"},
			filterTypes: ["note"], filterCondition: "payload.n > 1", start: "now", onFailingEvent: "skip", description: "d"})`))
		require.NoError(t, err)
		require.Equal(t, client.SubscriptionConfig{Name: "hook", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost,
			URL: "https://h.test/", Headers: []client.Header{{Name: "X-A", Value: "1"}}, Secret: "whsec_x"},
			FilterTypes: []string{"note"}, FilterCondition: "payload.n > 1", Start: "now", OnFailingEvent: "skip", Description: "d"}, cfg)
		stored, err := s.subscriptionConfig(s.mustRun(t, `({name: "hook", description: "d", filter: {eventTypes: ["note"], jsonataCondition: "payload.n > 1"},
			receiver: {action: "webhook-post", url: "https://h.test/", headers: {"X-A": "1"}, secret: "whsec_x", delivery: {start: "now", onFailingEvent: "skip"}}})`))
		require.NoError(t, err, "the configured event's own shape")
		require.Equal(t, cfg, stored)

		cfg, err = s.subscriptionConfig(s.mustRun(t, `({receiver: {type: "itx-call", capability: "in"}, maxDeliveryEvents: 10, maxDeliveryBytes: 4096})`))
		require.NoError(t, err)
		require.Equal(t, 10, cfg.MaxDeliveryEvents)
		require.Equal(t, 4096, cfg.MaxDeliveryBytes)
		require.Equal(t, 10, configJS(cfg).MaxDeliveryEvents, "describe shows the controls")
		_, err = s.subscriptionConfig(s.mustRun(t, `({receiver: {type: "itx-call", capability: "in"}, maxDeliveryEvents: -1})`))
		require.ErrorContains(t, err, "maxDeliveryEvents: expected a non-negative integer")

		cfg, err = s.subscriptionConfig(s.mustRun(t, `({receiver: {type: "copy-to-stream", path: "/b"}})`))
		require.NoError(t, err)
		require.Equal(t, client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/b"}, cfg.Receiver)

		cfg, err = s.subscriptionConfig(s.mustRun(t, `({receiver: {action: "itx-call", capability: "inbox"}})`))
		require.NoError(t, err, "the configured event's own spelling of the kind")
		require.Equal(t, client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}, cfg.Receiver)

		_, err = s.subscriptionConfig(s.mustRun(t, `({receiver: {type: "copy-to-stream", url: "x"}})`))
		require.ErrorContains(t, err, `unknown option "url" (known: type, action, jsonataTransform, delivery, path, receivingStreamPath)`)
		_, err = s.subscriptionConfig(s.mustRun(t, `({receiver: {type: "email"}})`))
		require.ErrorContains(t, err, `receiver.type must be`)
		_, err = s.subscriptionConfig(s.mustRun(t, `({name: "x"})`))
		require.ErrorContains(t, err, "receiver is required")
	})
}

func TestSession_Format(t *testing.T) {
	rows := `[{path: "/a", headOffset: 3, loaded: true, streamId: ""}, {path: "/b/c", headOffset: 12, loaded: false, extra: null}]`

	s, _ := offlineSession(t, FormatTable)
	require.Equal(t, "path  headOffset  loaded  streamId  extra\n/a    3           true    -         -\n/b/c  12          false   -         -\n(2 rows)",
		s.format(s.mustRun(t, rows), true))
	require.Equal(t, "{\n  \"a\": [1, 2]\n}", s.format(s.mustRun(t, `({a: [1, 2]})`), true), "not flat records: JSON")
	require.Equal(t, "a\n{\"b\":1}\n(1 row)", s.format(s.mustRun(t, `[{a: {b: 1}}]`), true), "a nested value is one line of JSON in its cell")
	require.Equal(t, "[Stream /a]", s.format(s.proxy(capPath{iface: "Stream", steps: []step{{method: "streams"}, {method: "get", arg: "/a"}}}), true))
	require.Equal(t, `"str"`, s.format(s.mustRun(t, `"str"`), true))
	require.Equal(t, `str`, s.format(s.mustRun(t, `"str"`), false))

	s, _ = offlineSession(t, FormatAuto)
	require.True(t, strings.HasPrefix(s.format(s.mustRun(t, rows), true), "[\n  {\n"), "auto off a terminal: JSON")
	s.cfg.TTY = true
	require.True(t, strings.HasPrefix(s.format(s.mustRun(t, rows), true), "path  "), "auto on a terminal: a table")

	s, out := offlineSession(t, FormatJSON)
	require.Equal(t, `[{"path":"/a","headOffset":3,"loaded":true,"streamId":""},{"path":"/b/c","headOffset":12,"loaded":false,"extra":null}]`,
		s.format(s.mustRun(t, rows), true))
	s.mustRun(t, `print("a", {b: 1}); console.log([1])`)
	require.Equal(t, "\"a\"\n{\"b\":1}\n[1]\n", out.String(), "in JSON, every printed value is a document")
}

// schedule's dueAt: a Date, ISO-8601 with or without a zone (UTC then, as itx shows times) or a
// date alone, epoch ms, or a duration from now; anything else is refused.
func TestSession_TimeArg(t *testing.T) {
	s, _ := offlineSession(t, FormatTable)
	want := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, src := range []string{`"2030-01-02T03:04:05Z"`, `"2030-01-02T04:04:05+01:00"`, `"2030-01-02T03:04:05"`, `new Date("2030-01-02T03:04:05Z")`, `1893553445000`} {
		at, err := s.timeArg("dueAt", s.mustRun(t, src))
		require.NoError(t, err, src)
		require.True(t, want.Equal(at), "%s: %v", src, at)
	}
	at, err := s.timeArg("dueAt", s.mustRun(t, `"2030-01-02"`))
	require.NoError(t, err)
	require.True(t, time.Date(2030, 1, 2, 0, 0, 0, 0, time.UTC).Equal(at))
	at, err = s.timeArg("dueAt", s.mustRun(t, `"10m"`))
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(10*time.Minute), at, time.Minute)
	for _, src := range []string{`"tomorrow"`, `NaN`, `1e300`, `({})`} {
		_, err := s.timeArg("dueAt", s.mustRun(t, src))
		require.ErrorContains(t, err, "dueAt: expected", src)
	}
}

func TestSplitWords(t *testing.T) {
	for line, want := range map[string][]string{
		`import /a b.ndjson`:           {"import", "/a", "b.ndjson"},
		`  tail   /a  `:                {"tail", "/a"},
		`import /a "my file.ndjson"`:   {"import", "/a", "my file.ndjson"},
		`import /a 'it"s here'`:        {"import", "/a", `it"s here`},
		`import /a "say \"hi\" \\ \n"`: {"import", "/a", `say "hi" \ \n`},
		`import /a ""`:                 {"import", "/a", ""},
		`import /a x"y z"w`:            {"import", "/a", "xy zw"},
		``:                             nil,
	} {
		got, err := splitWords(line)
		require.NoError(t, err, line)
		require.Equal(t, want, got, line)
	}
	for _, line := range []string{`import "/a`, `import '/a`} {
		_, err := splitWords(line)
		var usage *UsageError
		require.ErrorAs(t, err, &usage, line)
	}
}

// .help of an interface the prompt does not bind shows the schema's methods; one whose result is
// no capability read "ping() -> ", an arrow to nothing.
func TestUsage_UnboundMethods(t *testing.T) {
	for _, tc := range []struct {
		m    Method
		want string
	}{
		{Method{Name: "ping"}, "ping()"},
		{Method{Name: "close", Params: []string{"reason"}}, "close(reason)"},
		{Method{Name: "login", Params: []string{"token"}, Returns: "Project"}, "login(token) -> Project"},
		{Method{Name: "streams", Returns: "Streams", Property: true}, ".streams -> Streams"},
	} {
		if got := usage("Connection", tc.m); got != tc.want {
			t.Errorf("usage(%+v) = %q, want %q", tc.m, got, tc.want)
		}
	}
}
