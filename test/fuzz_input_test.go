package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"math/rand"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/wire"
)

// TestFuzzInput_PublicSurface throws generated input at itxd's public surface over real RPC: event
// types, payloads, metadata, idempotency keys, the ephemeral flag, conditional appends' expected
// heads, stream paths and listing prefixes, queries, waitForEvent predicates, subscription
// configs and verbs, reader names and checkpoints, connection options, mount names, scheduled
// appends and trims, each around its edges (empty, at and past its bound, invalid UTF-8, NUL and
// control characters, unicode that normalizes differently, JSON with duplicate keys, deep
// nesting, integers past 2^53, -0, 1e400, NaN, trailing garbage, a BOM, paths with "..", "//",
// "%", "#", "?" and spaces). Every call ends one of two ways: refused with a typed error (the
// first "itx.<code>: " of its reason, a code a bad input may get) and the stream it named
// unchanged (its head and log, subscriptions, readers, scheduled appends), or accepted and read
// back as sent (an event's payload and metadata as their compact JSON, byte for byte; names as
// trimmed). Never a panic, a hung call, an untyped error or a dropped connection.
//
// ITX_FUZZ_INPUT_CASES (default 4000) and ITX_FUZZ_INPUT_SEED (default 1) set the run; the
// default stops after 12 s whatever the count, so the run stays short on a loaded machine.
// A longer run: ITX_FUZZ_INPUT_CASES=200000 ITX_FUZZ_INPUT_SECONDS=600.
func TestFuzzInput_PublicSurface(t *testing.T) {
	cases, seed, budget := 4000, int64(1), 12*time.Second
	if v, err := strconv.Atoi(os.Getenv("ITX_FUZZ_INPUT_CASES")); err == nil && v > 0 {
		cases = v
	}
	if v, err := strconv.ParseInt(os.Getenv("ITX_FUZZ_INPUT_SEED"), 10, 64); err == nil {
		seed = v
	}
	if v, err := strconv.Atoi(os.Getenv("ITX_FUZZ_INPUT_SECONDS")); err == nil && v > 0 {
		budget = time.Duration(v) * time.Second
	}
	ts := startServer(t, server.Config{})
	f := newInputFuzzer(t, ts, seed)
	root := dial(t, ts.addr).Login(context.Background(), ts.creds.DeploymentToken)
	t.Cleanup(root.Release)
	f.root = client.Admin(f.ctx, root)
	t.Cleanup(f.root.Release)
	f.padmin = client.Admin(f.ctx, f.p)
	t.Cleanup(f.padmin.Release)
	ops := []struct {
		name   string
		weight int
		run    func(*inputFuzzer)
	}{
		{"append", 30, (*inputFuzzer).append},
		{"retry", 6, (*inputFuzzer).retry},
		{"query", 8, (*inputFuzzer).query},
		{"waitForEvent", 5, (*inputFuzzer).waitForEvent},
		{"configure", 14, (*inputFuzzer).configure},
		{"verbs", 5, (*inputFuzzer).subscriptionVerbs},
		{"readers", 6, (*inputFuzzer).readers},
		{"paths", 8, (*inputFuzzer).paths},
		{"connection", 5, (*inputFuzzer).connection},
		{"schedule", 6, (*inputFuzzer).schedule},
		{"mount", 3, (*inputFuzzer).mount},
		{"trim", 2, (*inputFuzzer).trim},
		{"retention", 2, (*inputFuzzer).retention},
		{"admin", 4, (*inputFuzzer).admin},
	}
	total := 0
	for _, op := range ops {
		total += op.weight
	}
	start := time.Now()
	ran := map[string]int{}
	n := 0
	for ; n < cases && time.Since(start) < budget; n++ {
		w := f.r.Intn(total)
		for _, op := range ops {
			if w < op.weight {
				f.op = fmt.Sprintf("case %d (%s, seed %d)", n, op.name, seed)
				f.edgeRate = []float64{0.1, 0.3, 1}[f.r.Intn(3)]
				op.run(f)
				ran[op.name]++
				break
			}
			w -= op.weight
		}
		if t.Failed() {
			t.Fatalf("stopped at %s", f.op)
		}
	}
	t.Logf("%d cases in %v (seed %d): %v; accepted %d, refused %d", n, time.Since(start).Round(time.Millisecond), seed, ran, f.accepted, f.refused)
}

// inputFuzzer holds the server, the streams the cases check and what was accepted so far.
type inputFuzzer struct {
	t   *testing.T
	r   *rand.Rand
	ctx context.Context
	op  string

	p       schema.Project
	root    schema.Admin // the deployment root's: projects
	padmin  schema.Admin // the project's own: its tokens
	streams schema.Streams
	log     schema.Stream // appends, queries, barriers, connections: nothing else writes it
	subs    schema.Stream // subscription configs and verbs
	rdrs    schema.Stream // readers
	sched   schema.Stream // scheduled appends
	trimmed schema.Stream // trims

	// keys: the bodies the log holds under each idempotency key, as stored.
	keys map[string]itx.Event
	// sent: events accepted into the log, as sent, for retries.
	sent []itx.EventInput

	// projects made by the cases, to rename
	projects []string

	accepted, refused int
	// edgeRate is how often a field takes an edge rather than a plain valid value, chosen per
	// case: with one field at an edge among valid ones, what the server says is about that field.
	edgeRate float64
}

func newInputFuzzer(t *testing.T, ts *testServer, seed int64) *inputFuzzer {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	p := ts.project(t)
	f := &inputFuzzer{t: t, r: rand.New(rand.NewSource(seed)), ctx: ctx, p: p, keys: map[string]itx.Event{}}
	f.streams = client.Streams(ctx, p)
	t.Cleanup(f.streams.Release)
	for _, s := range []struct {
		dst  *schema.Stream
		path string
	}{{&f.log, "/fz/log"}, {&f.subs, "/fz/subs"}, {&f.rdrs, "/fz/readers"}, {&f.sched, "/fz/sched"}, {&f.trimmed, "/fz/trim"}} {
		*s.dst = stream(t, p, s.path)
		mustAppend(t, *s.dst, ev("fz.seed", `{"n":1}`), ev("fz.seed", `{"n":2}`))
	}
	return f
}

// callCtx bounds one call: a hung call fails the case instead of the whole test's timeout.
func (f *inputFuzzer) callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(f.ctx, 20*time.Second)
}

func (f *inputFuzzer) fatalf(format string, args ...any) {
	f.t.Helper()
	f.t.Fatalf("%s: %s", f.op, fmt.Sprintf(format, args...))
}

var fuzzCodeRE = regexp.MustCompile(`itx\.([A-Za-z]+): `)

// refusedWith checks err is a typed refusal a client's input may get (never internal, unknown or
// a lost connection) and returns its code.
func (f *inputFuzzer) refusedWith(what string, err error, allowed ...itx.Code) itx.Code {
	f.t.Helper()
	m := fuzzCodeRE.FindStringSubmatch(err.Error())
	if m == nil {
		f.fatalf("%s: untyped error (no itx.<code>): %v", what, err)
	}
	code := itx.Code(m[1])
	if !slices.Contains(itx.Codes, code) {
		f.fatalf("%s: unknown code %q: %v", what, code, err)
	}
	if len(allowed) == 0 {
		allowed = []itx.Code{itx.EInvalid, itx.ENotFound, itx.ETooLarge, itx.ELimitExceeded, itx.EFailedPrecondition, itx.EIdempotencyConflict}
	}
	if !slices.Contains(allowed, code) {
		f.fatalf("%s: code %s, want one of %v: %v", what, code, allowed, err)
	}
	f.refused++
	return code
}

// must fails the case on an error of a call made to check another (a describe, a list).
func (f *inputFuzzer) must(what string, err error) {
	f.t.Helper()
	if err != nil {
		f.fatalf("%s: %v", what, err)
	}
}

// --- generators ---------------------------------------------------------------------------

// fuzzAtoms are the pieces generated strings are made of: valid text, whitespace, control
// characters, invalid UTF-8, characters that normalize to others, separators and punctuation
// that paths and URLs treat specially.
var fuzzAtoms = []string{
	"a", "Z", "0", "x-y", "_", "~", ":", "@", "+", "=", "*", "stream/",
	" ", "\t", "\n", "\r", "\r\n", "\v", "\f", "\u00a0", "\u3000", "\u0085",
	"\x00", "\x01", "\x1b", "\x7f",
	"\xff", "\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc0\xaf", "\xe2\x82",
	"é", "e\u0301", "\u212b", "\u00c5", "\ufb01", "\u2126", "ß", "İ", "ﬀ",
	"\u2028", "\u2029", "\u200b", "\u200d", "\u202e", "\ufeff", "\ufffd", "\U0001F600", "\U0001F1FA\U0001F1F8",
	"/", "//", ".", "..", "%", "%2e", "%2F", "%00", "#", "?", "&", "\\", "\"", "'", "{", "}", "[", "<", ">",
}

// fuzzString makes a string of atoms, or one at a length edge.
func (f *inputFuzzer) fuzzString() string {
	switch f.r.Intn(10) {
	case 0:
		return ""
	case 1:
		n := []int{1, 255, 256, 257, 499, 500, 501, 511, 512, 513, 1023, 1024, 1025, 4096}[f.r.Intn(14)]
		unit := []string{"a", "é", "\U0001F600", " "}[f.r.Intn(4)]
		if unit != "a" && f.r.Intn(2) == 0 {
			return strings.Repeat(unit, n)
		}
		return strings.Repeat("a", n)
	}
	var b strings.Builder
	if f.r.Intn(2) == 0 {
		b.WriteString("ok")
	}
	for range f.r.Intn(6) {
		b.WriteString(fuzzAtoms[f.r.Intn(len(fuzzAtoms))])
	}
	return b.String()
}

// pick is valid, or an edge from gen at the case's edge rate.
func (f *inputFuzzer) pick(valid string, gen func() string) string {
	if f.r.Float64() < f.edgeRate {
		return gen()
	}
	return valid
}

// fuzzName is a caller-chosen name: mostly plausible, often at an edge.
func (f *inputFuzzer) fuzzName() string {
	if f.r.Intn(3) == 0 {
		return fmt.Sprintf("n%d", f.r.Intn(20))
	}
	return f.fuzzString()
}

// fuzzType is an event type: usually valid, often not.
func (f *inputFuzzer) fuzzType() string {
	if f.r.Intn(3) == 0 {
		return []string{"fz.a", "fz.b", "fz.c", "*", "x/y", "fz.é"}[f.r.Intn(6)]
	}
	return f.fuzzString()
}

var fuzzJSONEdges = []string{
	"", " ", "\n", "{}", " { } ", "null", "[]", "1", `"s"`, "true", "{", "}", "{}x", "{} {}", "{}}", "{}]",
	"\ufeff{}", "{}\ufeff", "{\"a\":1,}", "{'a':1}", "/*c*/{}", "{\"a\":1}//c",
	`{"a":1,"a":2}`, `{"a":{"b":1,"b":{"c":2}}}`, `{"":""}`,
	`{"n":9007199254740993}`, `{"n":-9007199254740993}`, `{"n":18446744073709551616}`, `{"n":123456789012345678901234567890}`,
	`{"n":-0}`, `{"n":-0.0}`, `{"n":0e0}`, `{"n":1e400}`, `{"n":-1e400}`, `{"n":1e-400}`, `{"n":1E+2}`, `{"n":1.0}`,
	`{"n":NaN}`, `{"n":Infinity}`, `{"n":-Infinity}`, `{"n":01}`, `{"n":.5}`, `{"n":1.}`, `{"n":+1}`, `{"n":0x10}`,
	`{"s":"\u0000"}`, `{"s":"\ud800"}`, `{"s":"\udc00\ud800"}`, `{"s":"\uDFFF"}`, "{\"s\":\"a\x00b\"}", "{\"s\":\"\x01\"}",
	"{\"s\":\"\xff\"}", "{\"\xc3\":1}", "{\"s\":\"\u2028\"}", `{"s":"\/"}`, `{"s":"\q"}`, `{"s":"é"}`, `{"s":"e\u0301"}`,
	"{\"s\":\"\ufeff\"}", `{"a":[1,2,[3,[4]]],"b":{"c":null}}`, `{"a":true,"b":false}`,
	"{\t\"a\"\r\n:\n1\t}", "\x00{}", "{}\x00",
}

// fuzzJSON is a payload or metadata text: an edge, a generated object, a deep one or a big one.
func (f *inputFuzzer) fuzzJSON() string {
	switch f.r.Intn(12) {
	case 0, 1, 2, 3, 4:
		return fuzzJSONEdges[f.r.Intn(len(fuzzJSONEdges))]
	case 5:
		// itxd takes MaxJSONDepth levels, Go's decoder refuses past 10,000: around both.
		depth := []int{100, itx.MaxJSONDepth - 1, itx.MaxJSONDepth, itx.MaxJSONDepth + 1, 9_999, 10_000, 10_001}[f.r.Intn(7)]
		if f.r.Intn(2) == 0 {
			return `{"a":` + strings.Repeat("[", depth-1) + strings.Repeat("]", depth-1) + "}"
		}
		return strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth)
	case 6:
		if f.r.Intn(4) == 0 {
			// Just under and over one event's MiB, with the type's few bytes besides.
			n := itx.MaxEventBytes - 64 + f.r.Intn(128)
			return `{"s":"` + strings.Repeat("x", n-8) + `"}`
		}
		return `{"s":"` + strings.Repeat("y", f.r.Intn(70_000)) + `"}`
	}
	m := map[string]any{}
	var b strings.Builder
	b.WriteString("{")
	for i := range f.r.Intn(4) {
		if i > 0 {
			b.WriteString(",")
		}
		k := f.fuzzString()
		v := []any{f.fuzzString(), 1, -0.0, 1e300, int64(1) << 62, nil, true, []any{}, map[string]any{}}[f.r.Intn(9)]
		m[k] = v
		kb, _ := json.Marshal(k)
		vb, _ := json.Marshal(v)
		if f.r.Intn(3) == 0 {
			// Raw, unescaped: control characters and invalid UTF-8 as they came.
			kb = []byte(`"` + k + `"`)
		}
		b.Write(kb)
		b.WriteString(":")
		b.Write(vb)
	}
	b.WriteString("}")
	return b.String()
}

// fuzzEvent is an event to append.
func (f *inputFuzzer) fuzzEvent() itx.EventInput {
	in := itx.EventInput{Type: f.pick("fz.a", f.fuzzType), Payload: json.RawMessage(f.pick(`{"n":1}`, f.fuzzJSON))}
	if f.r.Intn(3) == 0 {
		in.Metadata = json.RawMessage(f.pick(`{"m":"x"}`, f.fuzzJSON))
	}
	switch f.r.Intn(6) {
	case 0:
		in.IdempotencyKey = f.pick(fmt.Sprintf("k%d", f.r.Intn(40)), f.fuzzString)
	case 1, 2:
		in.IdempotencyKey = fmt.Sprintf("k%d", f.r.Intn(40))
		if f.r.Intn(4) == 0 {
			in.IdempotencyKey = " " + in.IdempotencyKey + "\t"
		}
	}
	in.Ephemeral = f.r.Intn(8) == 0
	if f.r.Intn(40) == 0 {
		in.Type = "stream/" + []string{"subscription-configured", "subscription-removed", "error-occurred", "woken", "subscription-delivery-halted", "x"}[f.r.Intn(6)]
	}
	return in
}

// fuzzOffset is an offset around the stream's head and the wire's edges.
func (f *inputFuzzer) fuzzOffset(head int64) uint64 {
	switch f.r.Intn(8) {
	case 0:
		return 0
	case 1:
		return uint64(max(head-1, 0))
	case 2:
		return uint64(head)
	case 3:
		return uint64(head + 1)
	case 4:
		return math.MaxInt64
	case 5:
		return math.MaxInt64 + 1
	case 6:
		return math.MaxUint64
	}
	return uint64(f.r.Int63n(head + 3))
}

// fuzzTypes is a type filter.
func (f *inputFuzzer) fuzzTypes() []string {
	switch f.r.Intn(6) {
	case 0:
		return nil
	case 1:
		out := make([]string, itx.MaxTypeFilter+f.r.Intn(2))
		for i := range out {
			out[i] = "fz.a"
		}
		return out
	}
	out := make([]string, 1+f.r.Intn(3))
	for i := range out {
		out[i] = f.fuzzType()
	}
	return out
}

var fuzzJSONata = []string{
	"", " ", "true", "false", "1", "type = 'fz.a'", "payload.n > 0", "$exists(payload)", "(", ")", "payload.",
	"$count([1..100000000])", "$x := function(){$x()}; $x()", "\x00", "\xff", "'\u2028'", `"é" = "e\u0301"`,
	"{\"type\": type, \"payload\": payload}", "{\"type\": 1}", "{\"payload\": []}", "$string(payload)",
	"payload.s = 'a'", "$$", "**", "undefinedFunction()", "/re/", "1 / 0",
}

func (f *inputFuzzer) fuzzJSONataText() string {
	switch f.r.Intn(5) {
	case 0:
		return f.fuzzString()
	case 1:
		if f.r.Intn(3) == 0 {
			return strings.Repeat(" ", itx.MaxJSONataLength-3+f.r.Intn(6)) + "true"
		}
	}
	return fuzzJSONata[f.r.Intn(len(fuzzJSONata))]
}

// fuzzPath is a stream path under /fz/p (the streams the cases check are elsewhere), or an edge.
func (f *inputFuzzer) fuzzPath(base string) string {
	switch f.r.Intn(8) {
	case 0:
		return []string{"", "/", "fz", "//", "/.", "/..", "/fz/../fz/log", "./fz", "/fz/log/", "/ fz", "/fz\x00", "/\xff"}[f.r.Intn(12)]
	case 1:
		return base + "/" + strings.Repeat("a", itx.MaxPathLength-len(base)-2+f.r.Intn(4))
	case 2:
		return base + strings.Repeat("/s", itx.MaxPathSegments-2+f.r.Intn(4))
	}
	var b strings.Builder
	b.WriteString(base)
	for range 1 + f.r.Intn(3) {
		if f.r.Intn(4) > 0 {
			b.WriteString("/")
		}
		b.WriteString(f.fuzzString())
	}
	return b.String()
}

// --- expectations -------------------------------------------------------------------------

// jsonNesting is how deep valid JSON nests (objects and arrays), read token by token.
func jsonNesting(raw []byte) int {
	dec := json.NewDecoder(bytes.NewReader(raw))
	depth, deepest := 0, 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return deepest
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
			deepest = max(deepest, depth)
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
}

// eventValid says whether README's rules accept in, and how it is stored when they do: the
// model the server's answers are held to (it does not call the server's validators).
func eventValid(in itx.EventInput) (stored itx.EventInput, ok bool) {
	typ := in.Type
	if !typeValid(typ) {
		return stored, false
	}
	obj := func(raw json.RawMessage, nullIsNone bool) (json.RawMessage, bool) {
		t := bytes.TrimSpace(raw)
		if len(t) == 0 || (nullIsNone && string(t) == "null") {
			return nil, true
		}
		if !utf8.Valid(raw) || !json.Valid(raw) || t[0] != '{' || jsonNesting(raw) > itx.MaxJSONDepth {
			return nil, false
		}
		var b bytes.Buffer
		if json.Compact(&b, raw) != nil {
			return nil, false
		}
		return b.Bytes(), true
	}
	p, ok := obj(in.Payload, false)
	if !ok {
		return stored, false
	}
	if p == nil {
		p = json.RawMessage("{}")
	}
	m, ok := obj(in.Metadata, true)
	if !ok {
		return stored, false
	}
	key := in.IdempotencyKey
	if key != "" {
		key = strings.TrimSpace(key)
		if key == "" || in.Ephemeral || len(key) > itx.MaxIdempotencyKeyLength || !utf8.ValidString(key) {
			return stored, false
		}
	}
	if in.Ephemeral && strings.HasPrefix(typ, "stream/") {
		return stored, false
	}
	stored = itx.EventInput{Type: typ, Payload: p, Metadata: m, IdempotencyKey: key, Ephemeral: in.Ephemeral}
	if stored.Size() > itx.MaxEventBytes {
		return stored, false
	}
	return stored, true
}

// typeValid is README's event type: 1-256 printable bytes, no spaces (valid UTF-8).
func typeValid(typ string) bool {
	if typ == "" || len(typ) > 256 || !utf8.ValidString(typ) {
		return false
	}
	for _, r := range typ {
		if unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// typesValid is README's type filter: at most 1,000, each "*" or a valid type.
func typesValid(types []string) bool {
	if len(types) > 1000 {
		return false
	}
	for _, t := range types {
		if t != "*" && !typeValid(t) {
			return false
		}
	}
	return true
}

// nameValid is README's name (subscription, mount, reader, connection key, openedBy), as it is
// kept (after trimming where it is trimmed): 1-500 characters of valid UTF-8, no control
// characters or line separators, no surrounding whitespace.
func nameValid(name string) bool {
	if name == "" || !utf8.ValidString(name) || strings.TrimSpace(name) != name || utf8.RuneCountInString(name) > 500 {
		return false
	}
	for _, r := range name {
		if unicode.IsControl(r) || r == '\u2028' || r == '\u2029' {
			return false
		}
	}
	return true
}

// pathValid is a stream path as README and the path rules take it: "/" or "/" and segments of
// letters, digits and "-_.~:@+=", none empty, "." or "..", at most 1,024 bytes and 32 segments.
func pathValid(path string) bool {
	if path == "/" {
		return true
	}
	if path == "" || path[0] != '/' || len(path) > 1024 {
		return false
	}
	segments := strings.Split(path[1:], "/")
	if len(segments) > 32 {
		return false
	}
	for _, seg := range segments {
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
		for _, c := range []byte(seg) {
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_.~:@+=", c) >= 0) {
				return false
			}
		}
	}
	return true
}

// headerValid is README's webhook header: a name that is an HTTP token and not one itxd sets,
// a value of valid UTF-8 without CR, LF or other control characters (a tab is allowed).
func headerValid(name, value string) bool {
	if name == "" {
		return false
	}
	for _, c := range []byte(name) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	switch strings.ToLower(name) {
	case "webhook-id", "webhook-timestamp", "webhook-signature", "content-type", "content-length", "host", "user-agent":
		return false
	}
	if !utf8.ValidString(value) {
		return false
	}
	for _, r := range value {
		if r != '\t' && (r < 0x20 || r == 0x7f) {
			return false
		}
	}
	return true
}

// streamState is what a refused call must leave as it was.
type streamState struct {
	head      int64
	last      []itx.Event
	subs      []string
	readers   []itx.ReaderInfo
	scheduled []itx.ScheduledEvent
}

func (f *inputFuzzer) state(s schema.Stream) streamState {
	f.t.Helper()
	ctx, cancel := f.callCtx()
	defer cancel()
	info, err := client.Describe(ctx, s)
	f.must("describe", err)
	st := streamState{head: info.HeadOffset}
	page, err := client.GetEventPage(ctx, s, itx.Query{After: max(info.HeadOffset-3, 0), IncludeEphemeral: true})
	f.must("read the last events", err)
	st.last = page.Events
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	list, err := client.ListSubscriptions(ctx, subs)
	f.must("list subscriptions", err)
	for _, sub := range list {
		// Not the cursor: a subscription an earlier case kept delivers meanwhile.
		st.subs = append(st.subs, fmt.Sprintf("%s %s %d", sub.Name, sub.Kind, sub.ConfiguredAtOffset))
	}
	rd := client.Readers(ctx, s)
	defer rd.Release()
	st.readers, err = client.ListReaders(ctx, rd)
	f.must("list readers", err)
	st.scheduled, err = client.ListScheduled(ctx, s)
	f.must("list scheduled", err)
	return st
}

// unchanged fails the case unless s is as before. Server records (a halt, an error record) a
// subscription's delivery may append meanwhile are not the call's.
func (f *inputFuzzer) unchanged(what string, s schema.Stream, before streamState) {
	f.t.Helper()
	after := f.state(s)
	if after.head != before.head {
		ctx, cancel := f.callCtx()
		defer cancel()
		page, err := client.GetEventPage(ctx, s, itx.Query{After: before.head, IncludeEphemeral: true})
		f.must("read what was written", err)
		for _, e := range page.Events {
			switch e.Type {
			case itx.TypeSubscriptionHalted, itx.TypeErrorOccurred:
			default:
				f.fatalf("%s was refused, yet the head moved %d -> %d: %s at %d %s", what, before.head, after.head, e.Type, e.Offset, e.Payload)
			}
		}
		after.head, after.last = before.head, before.last
	}
	if fmt.Sprint(after.last) != fmt.Sprint(before.last) {
		f.fatalf("%s was refused, yet the last events changed:\n%v\n%v", what, before.last, after.last)
	}
	if !slices.Equal(after.subs, before.subs) {
		f.fatalf("%s was refused, yet the subscriptions changed:\n%q\n%q", what, before.subs, after.subs)
	}
	if fmt.Sprint(after.readers) != fmt.Sprint(before.readers) {
		f.fatalf("%s was refused, yet the readers changed:\n%v\n%v", what, before.readers, after.readers)
	}
	if fmt.Sprint(after.scheduled) != fmt.Sprint(before.scheduled) {
		f.fatalf("%s was refused, yet the scheduled appends changed:\n%v\n%v", what, before.scheduled, after.scheduled)
	}
}

// readAt reads the event at off (ephemeral ones too).
func (f *inputFuzzer) readAt(s schema.Stream, off int64) (itx.Event, bool) {
	f.t.Helper()
	ctx, cancel := f.callCtx()
	defer cancel()
	page, err := client.GetEventPage(ctx, s, itx.Query{After: off - 1, Limit: 1, IncludeEphemeral: true})
	f.must("read back", err)
	if len(page.Events) == 0 || page.Events[0].Offset != off {
		return itx.Event{}, false
	}
	return page.Events[0], true
}

// sameAsStored compares an event read back with the stored form of what was sent.
func sameAsStored(e itx.Event, want itx.EventInput) string {
	var diffs []string
	if e.Type != want.Type {
		diffs = append(diffs, fmt.Sprintf("type %q, sent %q", e.Type, want.Type))
	}
	if !bytes.Equal(e.Payload, want.Payload) {
		diffs = append(diffs, fmt.Sprintf("payload %.200q, sent (compacted) %.200q", e.Payload, want.Payload))
	}
	if !bytes.Equal(e.Metadata, want.Metadata) {
		diffs = append(diffs, fmt.Sprintf("metadata %.200q, sent (compacted) %.200q", e.Metadata, want.Metadata))
	}
	if e.IdempotencyKey != want.IdempotencyKey {
		diffs = append(diffs, fmt.Sprintf("key %q, sent (trimmed) %q", e.IdempotencyKey, want.IdempotencyKey))
	}
	if e.Ephemeral != want.Ephemeral {
		diffs = append(diffs, fmt.Sprintf("ephemeral %v, sent %v", e.Ephemeral, want.Ephemeral))
	}
	return strings.Join(diffs, "; ")
}

// --- operations ---------------------------------------------------------------------------

// rawAppend sends events as given (the Go client checks nothing of them but sizes and offsets).
func (f *inputFuzzer) rawAppend(s schema.Stream, events []itx.EventInput, conditional bool, expected uint64) (itx.AppendResult, error) {
	ctx, cancel := f.callCtx()
	defer cancel()
	fut, release := s.Append(ctx, func(p schema.Stream_append_Params) error {
		if err := wire.SetEventInputs(p.NewEvents, events); err != nil {
			return err
		}
		o, err := p.NewOptions()
		o.SetConditional(conditional)
		o.SetExpectedHeadOffset(expected)
		return err
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return itx.AppendResult{}, err
	}
	r, err := res.Result()
	if err != nil {
		return itx.AppendResult{}, err
	}
	return wire.AppendResultFromSchema(r)
}

func (f *inputFuzzer) append() {
	events := make([]itx.EventInput, 1+f.r.Intn(3))
	for i := range events {
		events[i] = f.fuzzEvent()
	}
	before := f.state(f.log)
	conditional := f.r.Intn(4) == 0
	var expected uint64
	if conditional {
		expected = f.fuzzOffset(before.head)
	}
	f.appendAndCheck(events, conditional, expected, before)
}

// retry sends an accepted event again: the same body is a duplicate at its first offset, another
// body under its key a conflict.
func (f *inputFuzzer) retry() {
	var keyed []itx.EventInput
	for _, in := range f.sent {
		if in.IdempotencyKey != "" {
			keyed = append(keyed, in)
		}
	}
	if len(keyed) == 0 {
		f.append()
		return
	}
	in := keyed[f.r.Intn(len(keyed))]
	switch f.r.Intn(4) {
	case 0: // another payload
		in.Payload = json.RawMessage(`{"other":` + strconv.Itoa(f.r.Int()) + `}`)
	case 1: // the same value spelled otherwise: reordered keys, spaces
		var v any
		if len(in.Payload) < 64<<10 && json.Unmarshal(in.Payload, &v) == nil {
			// Indented, a deep payload grows by its depth squared: kept within an event, since
			// a call past --rpc-max-message-bytes ends the connection (README), as it should.
			if b, _ := json.MarshalIndent(v, " ", "\t"); len(b) < 512<<10 {
				in.Payload = b
			}
		}
	case 2: // metadata {} where none was sent, or the other way round
		if len(bytes.TrimSpace(in.Metadata)) == 0 {
			in.Metadata = json.RawMessage("{}")
		}
	}
	before := f.state(f.log)
	f.appendAndCheck([]itx.EventInput{in}, false, 0, before)
}

func (f *inputFuzzer) appendAndCheck(events []itx.EventInput, conditional bool, expected uint64, before streamState) {
	f.t.Helper()
	// The model: each event valid, the batch within its bounds, keys not taken by another body.
	valid, sure := true, true
	stored := make([]itx.EventInput, len(events))
	total, batchKeys := 0, map[string]bool{}
	for i, in := range events {
		st, ok := eventValid(in)
		if !ok {
			valid = false
			continue
		}
		if strings.HasPrefix(st.Type, "stream/") {
			sure = false // a control event's shape is the core reducer's to judge
		}
		stored[i] = st
		total += st.Size()
		if st.IdempotencyKey != "" {
			if batchKeys[st.IdempotencyKey] {
				sure = false // a key twice in one call: the second a duplicate or a conflict
			}
			batchKeys[st.IdempotencyKey] = true
			if prev, ok := f.keys[st.IdempotencyKey]; ok && !sameStoredBody(prev, st) {
				valid = false
			}
		}
	}
	if total > itx.MaxAppendBytes {
		valid = false
	}
	if conditional && expected != uint64(before.head) {
		sure = false // offsetConflict, unless every event is a duplicate
		if expected > math.MaxInt64 {
			valid = false
		}
	}
	res, err := f.rawAppend(f.log, events, conditional, expected)
	if err != nil {
		code := f.refusedWith("append", err, itx.EInvalid, itx.ETooLarge, itx.EIdempotencyConflict, itx.EOffsetConflict)
		f.unchanged("append", f.log, before)
		if valid && sure && code != itx.EOffsetConflict {
			f.fatalf("append refused (%v) though every event is valid: %s", err, describeEvents(events))
		}
		return
	}
	f.accepted++
	if !valid {
		f.fatalf("append accepted though the model refuses it: %s -> %+v", describeEvents(events), res)
	}
	if len(res.Offsets) != len(events) || len(res.Duplicate) != len(events) {
		f.fatalf("append answered %d offsets and %d duplicate flags for %d events", len(res.Offsets), len(res.Duplicate), len(events))
	}
	for i, off := range res.Offsets {
		want := stored[i]
		e, ok := f.readAt(f.log, off)
		if !ok {
			f.fatalf("event %d accepted at %d is not read back", i, off)
		}
		if res.Duplicate[i] {
			prev, ok := f.keys[want.IdempotencyKey]
			if !ok && !batchKeys[want.IdempotencyKey] {
				f.fatalf("event %d answered duplicate of %d with no earlier event under key %q", i, off, want.IdempotencyKey)
			}
			if ok && prev.Offset != off {
				f.fatalf("duplicate answered offset %d, the key's event is at %d", off, prev.Offset)
			}
			continue
		}
		if d := sameAsStored(e, want); d != "" {
			f.fatalf("event %d read back at %d differs from what was sent: %s", i, off, d)
		}
		if want.IdempotencyKey != "" {
			f.keys[want.IdempotencyKey] = e
		}
		f.sent = append(f.sent, events[i])
	}
}

// sameStoredBody is README's idempotency comparison, in the model's terms: type, and payload and
// metadata as JSON values (no metadata and {} the same).
func sameStoredBody(e itx.Event, in itx.EventInput) bool {
	eq := func(a, b json.RawMessage) bool {
		var x, y any
		da, db := json.NewDecoder(bytes.NewReader(a)), json.NewDecoder(bytes.NewReader(b))
		da.UseNumber()
		db.UseNumber()
		if da.Decode(&x) != nil || db.Decode(&y) != nil {
			return false
		}
		return fmt.Sprint(exactNumbers(x)) == fmt.Sprint(exactNumbers(y))
	}
	meta := func(m json.RawMessage) json.RawMessage {
		if len(m) == 0 {
			return json.RawMessage("{}")
		}
		return m
	}
	return e.Type == in.Type && eq(e.Payload, in.Payload) && eq(meta(e.Metadata), meta(in.Metadata))
}

// exactNumbers replaces each number in v by its exact decimal value: 1, 1.0 and 1e0 are one
// number, 9007199254740993 and 9007199254740992 two (README: numbers compare by value).
func exactNumbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		r, ok := new(big.Rat).SetString(string(x))
		if !ok {
			return string(x)
		}
		return r.RatString()
	case map[string]any:
		for k, e := range x {
			x[k] = exactNumbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = exactNumbers(e)
		}
	}
	return v
}

func describeEvents(events []itx.EventInput) string {
	var b strings.Builder
	for i, e := range events {
		fmt.Fprintf(&b, "[%d type=%.80q payload=%.120q metadata=%.80q key=%.80q ephemeral=%v] ", i, e.Type, e.Payload, e.Metadata, e.IdempotencyKey, e.Ephemeral)
	}
	return b.String()
}

func (f *inputFuzzer) query() {
	before := f.state(f.log)
	q := schemaQuery{after: f.fuzzOffset(before.head), before: 0, limit: uint32(f.r.Intn(600)), types: f.fuzzTypes(), ephemeral: f.r.Intn(2) == 0}
	if f.r.Intn(3) == 0 {
		q.before = f.fuzzOffset(before.head)
	}
	switch f.r.Intn(8) {
	case 0:
		q.limit = math.MaxUint32
	case 1:
		q.subscription = f.fuzzName()
	}
	ctx, cancel := f.callCtx()
	defer cancel()
	fut, release := f.log.GetEventPage(ctx, func(p schema.Stream_getEventPage_Params) error {
		dst, err := p.NewQuery()
		if err != nil {
			return err
		}
		dst.SetAfter(q.after)
		dst.SetBefore(q.before)
		dst.SetLimit(q.limit)
		dst.SetIncludeEphemeral(q.ephemeral)
		if err := dst.SetSubscription(q.subscription); err != nil {
			return err
		}
		return wire.SetTextList(q.types, dst.NewTypes)
	})
	defer release()
	res, err := fut.Struct()
	var page itx.Page
	if err == nil {
		var pg schema.EventPage
		if pg, err = res.Page(); err == nil {
			page, err = wire.PageFromSchema(pg)
		}
	}
	if err != nil {
		f.refusedWith("getEventPage", err, itx.EInvalid, itx.ENotFound)
		if q.after <= math.MaxInt64 && q.before <= math.MaxInt64 && q.subscription == "" && len(q.types) <= itx.MaxTypeFilter && typesValid(q.types) {
			f.fatalf("getEventPage refused a valid query %+v: %v", q, err)
		}
		return
	}
	f.accepted++
	if q.after > math.MaxInt64 || q.before > math.MaxInt64 {
		f.fatalf("getEventPage took an offset past 2^63-1: %+v", q)
	}
	limit := min(int(q.limit), itx.MaxPageLimit)
	if q.limit == 0 {
		limit = itx.DefaultPageLimit
	}
	if len(page.Events) > limit {
		f.fatalf("page of %d events for limit %d", len(page.Events), q.limit)
	}
	all := len(q.types) == 0 || slices.Contains(q.types, "*")
	last := int64(q.after)
	for _, e := range page.Events {
		if e.Offset <= last || (q.before > 0 && uint64(e.Offset) >= q.before) {
			f.fatalf("page event %d out of order or range for %+v", e.Offset, q)
		}
		if !all && !slices.Contains(q.types, e.Type) {
			f.fatalf("page holds type %q outside %q", e.Type, q.types)
		}
		if e.Ephemeral && !q.ephemeral {
			f.fatalf("page holds ephemeral %d without includeEphemeral", e.Offset)
		}
		last = e.Offset
	}
	if page.StreamMaxOffset != before.head {
		f.fatalf("page says head %d, the stream's is %d", page.StreamMaxOffset, before.head)
	}
}

type schemaQuery struct {
	after, before uint64
	limit         uint32
	types         []string
	ephemeral     bool
	subscription  string
}

func (f *inputFuzzer) waitForEvent() {
	before := f.state(f.log)
	types := f.fuzzTypes()
	contains := ""
	if f.r.Intn(2) == 0 {
		contains = f.fuzzJSON()
	}
	where := ""
	if f.r.Intn(2) == 0 {
		where = f.fuzzJSONataText()
	}
	after := f.fuzzOffset(before.head)
	ctx, cancel := f.callCtx()
	defer cancel()
	fut, release := f.log.WaitForEvent(ctx, func(p schema.Stream_waitForEvent_Params) error {
		pr, err := p.NewPredicate()
		if err != nil {
			return err
		}
		if err := pr.SetPayloadContains(contains); err != nil {
			return err
		}
		if err := pr.SetWhere(where); err != nil {
			return err
		}
		pr.SetIncludeEphemeral(f.r.Intn(2) == 0)
		p.SetAfter(after)
		p.SetTimeoutMs(uint32(1 + f.r.Intn(30)))
		return wire.SetTextList(types, pr.NewTypes)
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		f.refusedWith("waitForEvent", err, itx.EInvalid, itx.EDeadlineExceeded, itx.ELimitExceeded, itx.ETooLarge)
		f.unchanged("waitForEvent", f.log, before)
		return
	}
	f.accepted++
	e, err := res.Event()
	f.must("decode the event", err)
	got, err := wire.EventFromSchema(e)
	f.must("decode the event", err)
	if uint64(got.Offset) <= after || after > math.MaxInt64 {
		f.fatalf("waitForEvent after %d answered %d", after, got.Offset)
	}
	if len(types) > 0 && !slices.Contains(types, "*") && !slices.Contains(types, got.Type) {
		f.fatalf("waitForEvent for %q answered type %q", types, got.Type)
	}
	if c := strings.TrimSpace(contains); c != "" && (!utf8.ValidString(contains) || !json.Valid([]byte(contains))) {
		f.fatalf("waitForEvent took payloadContains %.100q, not valid JSON", contains)
	}
}

func (f *inputFuzzer) fuzzConfig() client.SubscriptionConfig {
	c := client.SubscriptionConfig{Name: f.pick(fmt.Sprintf("n%d", f.r.Intn(20)), f.fuzzName), Description: ""}
	if f.r.Intn(3) == 0 {
		c.Description = f.pick("about", f.fuzzString)
	}
	switch f.r.Intn(5) {
	case 0, 1:
		u := f.pick("http://127.0.0.1:1/h", func() string {
			if f.r.Intn(3) == 0 {
				return "http://127.0.0.1:1/" + f.fuzzString()
			}
			return []string{"http://127.0.0.1:1/h", "https://127.0.0.1:1/x?y=1#z", "http://127.0.0.1:1/%zz", "ftp://127.0.0.1/", "http:///x", "/rel", "", "http://[::1]:1/", "http://127.0.0.1:1/a b", "http://user:pw@127.0.0.1:1/"}[f.r.Intn(10)]
		})
		c.Receiver = client.Receiver{Kind: client.ReceiverWebhookPost, URL: u}
		if f.r.Intn(2) == 0 {
			for range 1 + f.r.Intn(2) {
				name := f.pick(fmt.Sprintf("X-H%d", f.r.Intn(3)), func() string {
					if f.r.Intn(3) == 0 {
						return f.fuzzString()
					}
					return []string{"X-A", "x-a", "X A", "", "Content-Type", "webhook-signature", "X-é"}[f.r.Intn(7)]
				})
				c.Receiver.Headers = append(c.Receiver.Headers, client.Header{Name: name, Value: f.pick("v", f.fuzzString)})
			}
		}
		if f.r.Intn(3) == 0 {
			c.Receiver.Secret = []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_", "whsec_AAAA", "whsec_!!!!", "secret", "whsec_" + strings.Repeat("QUFB", 30), f.fuzzString()}[f.r.Intn(7)]
		}
	case 2:
		c.Receiver = client.Receiver{Kind: client.ReceiverCopyToStream, Path: f.pick("/fz/copy/a", func() string { return f.fuzzPath("/fz/copy") })}
	case 3:
		c.Receiver = client.Receiver{Kind: client.ReceiverItxCall, Capability: f.pick("cap", f.fuzzName)}
	case 4:
		c.Receiver = client.Receiver{Kind: client.ReceiverProcessorWake, Placement: []string{"", "in-process", "facet", "remote", " remote ", "elsewhere"}[f.r.Intn(6)]}
		if f.r.Intn(2) == 0 {
			c.Receiver.Processor = f.fuzzName()
		}
	}
	if f.r.Intn(3) == 0 {
		c.FilterTypes = []string{"fz.a"}
		if f.r.Float64() < f.edgeRate {
			c.FilterTypes = f.fuzzTypes()
		}
	}
	if f.r.Intn(3) == 0 {
		c.FilterCondition = f.pick("type = 'fz.a'", f.fuzzJSONataText)
	}
	if f.r.Intn(4) == 0 {
		c.Transform = f.pick(`{"type": type}`, f.fuzzJSONataText)
	}
	if c.Receiver.Kind != client.ReceiverProcessorWake || f.r.Intn(4) == 0 {
		c.Start = []string{"", "beginning", "now"}[f.r.Intn(3)]
		c.OnFailingEvent = []string{"", "halt", "skip"}[f.r.Intn(3)]
		if f.r.Intn(4) == 0 {
			c.DeadLetterPath = f.fuzzPath("/fz/dl")
		}
	}
	if f.r.Intn(4) == 0 {
		c.MaxDeliveryEvents = []int{1, 1000, 1001, math.MaxInt32, math.MaxUint32}[f.r.Intn(5)]
		c.MaxDeliveryBytes = []int{1, 1 << 20, 1<<20 + 1, math.MaxUint32}[f.r.Intn(4)]
	}
	if f.r.Intn(4) == 0 {
		c.ConfirmWindow = []int{1, 10_000, 10_001, math.MaxUint32}[f.r.Intn(4)]
	}
	if c.Name == "" || f.r.Intn(4) == 0 {
		c.IdempotencyKey = f.fuzzName()
	}
	return c
}

// rawConfigure sends a config through the schema as given (the Go client refuses some before
// sending: an unknown start, for one).
func (f *inputFuzzer) rawConfigure(subs schema.Subscriptions, c client.SubscriptionConfig) (string, int64, error) {
	ctx, cancel := f.callCtx()
	defer cancel()
	fut, release := subs.Configure(ctx, func(p schema.Subscriptions_configure_Params) error {
		dst, err := p.NewConfig()
		if err != nil {
			return err
		}
		if err := p.SetIdempotencyKey(c.IdempotencyKey); err != nil {
			return err
		}
		if err := dst.SetName(c.Name); err != nil {
			return err
		}
		if err := dst.SetDescription(c.Description); err != nil {
			return err
		}
		if err := wire.SetTextList(c.FilterTypes, dst.NewFilterTypes); err != nil {
			return err
		}
		if err := dst.SetFilterCondition(c.FilterCondition); err != nil {
			return err
		}
		if err := dst.SetTransform(c.Transform); err != nil {
			return err
		}
		if c.Start == "now" {
			dst.SetStart(schema.StartPosition_now)
		}
		if c.OnFailingEvent == "skip" {
			dst.SetOnFailingEvent(schema.FailingEventPolicy_skip)
		}
		if err := dst.SetDeadLetterPath(c.DeadLetterPath); err != nil {
			return err
		}
		dst.SetMaxDeliveryEvents(uint32(c.MaxDeliveryEvents))
		dst.SetMaxDeliveryBytes(uint32(c.MaxDeliveryBytes))
		dst.SetConfirmWindow(uint32(c.ConfirmWindow))
		r := dst.Receiver()
		switch c.Receiver.Kind {
		case client.ReceiverWebhookPost:
			r.SetWebhookPost()
			w := r.WebhookPost()
			if err := w.SetUrl(c.Receiver.URL); err != nil {
				return err
			}
			if err := w.SetSecret(c.Receiver.Secret); err != nil {
				return err
			}
			hl, err := w.NewHeaders(int32(len(c.Receiver.Headers)))
			if err != nil {
				return err
			}
			for i, h := range c.Receiver.Headers {
				_ = hl.At(i).SetName(h.Name)
				_ = hl.At(i).SetValue(h.Value)
			}
		case client.ReceiverCopyToStream:
			r.SetCopyToStream()
			return r.CopyToStream().SetPath(c.Receiver.Path)
		case client.ReceiverItxCall:
			r.SetItxCall()
			return r.ItxCall().SetCapability(c.Receiver.Capability)
		case client.ReceiverProcessorWake:
			r.SetProcessorWake()
			if err := r.ProcessorWake().SetPlacement(c.Receiver.Placement); err != nil {
				return err
			}
			return r.ProcessorWake().SetProcessor(c.Receiver.Processor)
		}
		return nil
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return "", 0, err
	}
	name, err := res.Name()
	return name, int64(res.Offset()), err
}

func (f *inputFuzzer) configure() {
	c := f.fuzzConfig()
	before := f.state(f.subs)
	ctx, cancel := f.callCtx()
	defer cancel()
	subs := client.Subscriptions(ctx, f.subs)
	defer subs.Release()
	name, off, err := f.rawConfigure(subs, c)
	if err != nil {
		f.refusedWith("configure", err, itx.EInvalid, itx.ETooLarge, itx.EIdempotencyConflict, itx.ELimitExceeded, itx.EFailedPrecondition, itx.ENotFound)
		f.unchanged("configure", f.subs, before)
		return
	}
	f.accepted++
	// Read back: the configured event and describe hold the config as sent (strings trimmed).
	trim := strings.TrimSpace
	want := c
	want.Name = trim(c.Name)
	if want.Name == "" {
		want.Name = fmt.Sprintf("subscription:%d", off)
	}
	if name != want.Name {
		f.fatalf("configure of name %q answered %q", c.Name, name)
	}
	if !utf8.ValidString(c.Name + c.Description + c.FilterCondition + c.Transform + c.Receiver.URL + c.Receiver.Path + c.Receiver.Capability + c.DeadLetterPath) {
		f.fatalf("configure took invalid UTF-8: %+v", c)
	}
	if !nameValid(name) {
		f.fatalf("configure took a name README refuses: %q", name)
	}
	d, err := client.DescribeSubscription(ctx, client.Subscription(ctx, f.subs, name))
	f.must("describe the subscription", err)
	got := d.Config
	var diffs []string
	check := func(field, got, want string) {
		if got != want {
			diffs = append(diffs, fmt.Sprintf("%s %.100q, sent %.100q", field, got, want))
		}
	}
	check("name", got.Name, want.Name)
	check("description", got.Description, trim(c.Description))
	cond := ""
	if got.Filter != nil {
		cond = got.Filter.JSONataCondition
	}
	check("condition", cond, trim(c.FilterCondition))
	check("transform", got.Receiver.JSONataTransform, trim(c.Transform))
	var types []string
	if got.Filter != nil {
		types = got.Filter.EventTypes
	}
	var wantTypes []string
	for _, t := range c.FilterTypes {
		wantTypes = append(wantTypes, trim(t))
	}
	check("filterTypes", fmt.Sprintf("%q", types), fmt.Sprintf("%q", wantTypes))
	switch c.Receiver.Kind {
	case client.ReceiverWebhookPost:
		check("url", got.Receiver.URL, c.Receiver.URL)
		var sent map[string]string
		for _, h := range c.Receiver.Headers {
			if sent == nil {
				sent = map[string]string{}
			}
			if !headerValid(h.Name, h.Value) {
				diffs = append(diffs, fmt.Sprintf("header %q: %q accepted, README refuses it", h.Name, h.Value))
			}
			if _, twice := sent[h.Name]; twice {
				diffs = append(diffs, fmt.Sprintf("header %q sent twice and accepted", h.Name))
			}
			sent[h.Name] = h.Value
		}
		check("headers", fmt.Sprintf("%q", got.Receiver.Headers), fmt.Sprintf("%q", sent))
		if d.SecretSet != (c.Receiver.Secret != "") {
			diffs = append(diffs, fmt.Sprintf("secretSet %v for secret %q", d.SecretSet, c.Receiver.Secret))
		}
	case client.ReceiverCopyToStream:
		check("path", got.Receiver.ReceivingStreamPath, trim(c.Receiver.Path))
	case client.ReceiverItxCall:
		check("capability", got.Receiver.Capability, trim(c.Receiver.Capability))
	}
	if got.Receiver.Delivery != nil {
		check("deadLetterPath", got.Receiver.Delivery.DeadLetterPath, trim(c.DeadLetterPath))
	}
	if got.MaxDeliveryEvents != c.MaxDeliveryEvents || got.MaxDeliveryBytes != c.MaxDeliveryBytes || got.ConfirmWindow != c.ConfirmWindow {
		diffs = append(diffs, fmt.Sprintf("controls %d/%d/%d, sent %d/%d/%d", got.MaxDeliveryEvents, got.MaxDeliveryBytes, got.ConfirmWindow, c.MaxDeliveryEvents, c.MaxDeliveryBytes, c.ConfirmWindow))
	}
	if len(diffs) > 0 {
		f.fatalf("configure read back differs from what was sent: %s", strings.Join(diffs, "; "))
	}
	// Removed at once: its deliveries would write the stream the next cases check.
	if f.r.Intn(4) > 0 {
		_, err = client.RemoveSubscription(ctx, subs, name)
		f.must("remove "+name, err)
	}
}

// subscriptionVerbs sends cursor-sets, resumes, removes and describes with generated names and
// offsets.
func (f *inputFuzzer) subscriptionVerbs() {
	before := f.state(f.subs)
	name := f.fuzzName()
	ctx, cancel := f.callCtx()
	defer cancel()
	var err error
	verb := []string{"setSubscriptionCursor", "resumeSubscription", "remove", "waitUntilProcessed", "confirm"}[f.r.Intn(5)]
	switch verb {
	case "setSubscriptionCursor":
		after := f.fuzzOffset(before.head)
		fut, release := f.subs.SetSubscriptionCursor(ctx, func(p schema.Stream_setSubscriptionCursor_Params) error {
			p.SetAfterOffset(after)
			return p.SetName(name)
		})
		_, err = fut.Struct()
		release()
		if err == nil && after > uint64(before.head) {
			f.fatalf("setSubscriptionCursor(%q, %d) past the head %d accepted", name, after, before.head)
		}
	case "resumeSubscription":
		fut, release := f.subs.ResumeSubscription(ctx, func(p schema.Stream_resumeSubscription_Params) error { return p.SetName(name) })
		_, err = fut.Struct()
		release()
	case "remove":
		subs := client.Subscriptions(ctx, f.subs)
		fut, release := subs.Remove(ctx, func(p schema.Subscriptions_remove_Params) error { return p.SetName(name) })
		_, err = fut.Struct()
		release()
		subs.Release()
	case "waitUntilProcessed", "confirm":
		sub := client.Subscription(ctx, f.subs, name)
		off := f.fuzzOffset(before.head)
		if verb == "confirm" {
			fut, release := sub.Confirm(ctx, func(p schema.Subscription_confirm_Params) error { p.SetOffset(off); return nil })
			_, err = fut.Struct()
			release()
		} else {
			fut, release := sub.WaitUntilProcessed(ctx, func(p schema.Subscription_waitUntilProcessed_Params) error {
				p.SetOffset(off)
				p.SetTimeoutMs(uint32(1 + f.r.Intn(20)))
				return nil
			})
			_, err = fut.Struct()
			release()
		}
		sub.Release()
	}
	if err != nil {
		f.refusedWith(verb, err, itx.EInvalid, itx.ENotFound, itx.EFailedPrecondition, itx.EDeadlineExceeded)
		f.unchanged(verb, f.subs, before)
		return
	}
	f.accepted++
}

func (f *inputFuzzer) readers() {
	before := f.state(f.rdrs)
	name := f.fuzzName()
	ctx, cancel := f.callCtx()
	defer cancel()
	rd := client.Readers(ctx, f.rdrs)
	defer rd.Release()
	if f.r.Intn(4) == 0 {
		fut, release := rd.Remove(ctx, func(p schema.Readers_remove_Params) error { return p.SetName(name) })
		_, err := fut.Struct()
		release()
		if err != nil {
			f.refusedWith("readers.remove", err, itx.EInvalid, itx.ENotFound)
			f.unchanged("readers.remove", f.rdrs, before)
			return
		}
		f.accepted++
		after := f.state(f.rdrs)
		for _, r := range after.readers {
			if r.Name == strings.TrimSpace(name) {
				f.fatalf("reader %q still listed after its removal", name)
			}
		}
		return
	}
	checkpoint := f.fuzzOffset(before.head)
	fut, release := rd.Register(ctx, func(p schema.Readers_register_Params) error {
		p.SetCheckpoint(checkpoint)
		return p.SetName(name)
	})
	_, err := fut.Struct()
	release()
	if err != nil {
		f.refusedWith("readers.register", err, itx.EInvalid, itx.ELimitExceeded, itx.EFailedPrecondition)
		f.unchanged("readers.register", f.rdrs, before)
		if nameValid(strings.TrimSpace(name)) && checkpoint <= uint64(before.head) {
			f.fatalf("readers.register(%q, %d) refused though valid: %v", name, checkpoint, err)
		}
		return
	}
	f.accepted++
	want := strings.TrimSpace(name)
	if !nameValid(want) || checkpoint > uint64(before.head) {
		f.fatalf("readers.register(%q, %d) accepted at head %d", name, checkpoint, before.head)
	}
	after := f.state(f.rdrs)
	for _, r := range after.readers {
		if r.Name == want {
			if r.Checkpoint != int64(checkpoint) {
				f.fatalf("reader %q reads back checkpoint %d, sent %d", want, r.Checkpoint, checkpoint)
			}
			return
		}
	}
	f.fatalf("reader %q registered, not listed: %v", want, after.readers)
}

// paths appends to, describes, reads and lists generated paths and prefixes.
func (f *inputFuzzer) paths() {
	path := f.fuzzPath("/fz/p")
	ctx, cancel := f.callCtx()
	defer cancel()
	s := client.Stream(ctx, f.p, path)
	defer s.Release()
	validPath := pathValid(path)
	switch f.r.Intn(5) {
	case 0:
		_, err := client.Describe(ctx, s)
		if err != nil {
			f.refusedWith("describe "+path, err, itx.EInvalid)
			if validPath {
				f.fatalf("describe of valid path %q refused: %v", path, err)
			}
			return
		}
		f.accepted++
		if !validPath {
			f.fatalf("describe of invalid path %q accepted", path)
		}
	case 1:
		res, err := f.rawAppend(s, []itx.EventInput{ev("fz.path", `{}`)}, false, 0)
		if err != nil {
			f.refusedWith("append to "+path, err, itx.EInvalid)
			if validPath {
				f.fatalf("append to valid path %q refused: %v", path, err)
			}
			list, err := client.ListStreams(ctx, f.p, "/")
			f.must("list", err)
			for _, info := range list {
				if info.Path == path {
					f.fatalf("refused path %q listed", path)
				}
			}
			return
		}
		f.accepted++
		if !validPath {
			f.fatalf("append to invalid path %q accepted", path)
		}
		list, err := client.ListStreams(ctx, f.p, path)
		f.must("list "+path, err)
		for _, info := range list {
			if info.Path == path && info.StreamID == res.StreamID {
				return
			}
		}
		f.fatalf("stream %q appended to is not listed under its own path: %v", path, list)
	case 2:
		prefix := path
		if f.r.Intn(3) == 0 {
			prefix += "/"
		}
		after := ""
		if f.r.Intn(3) == 0 {
			after = f.fuzzPath("/fz")
		}
		limit := []uint32{0, 1, 10_000, 10_001, math.MaxUint32}[f.r.Intn(5)]
		fut, release := f.streams.List(ctx, func(p schema.Streams_list_Params) error {
			p.SetLimit(limit)
			if err := p.SetAfter(after); err != nil {
				return err
			}
			return p.SetPrefix(prefix)
		})
		defer release()
		res, err := fut.Struct()
		if err != nil {
			f.refusedWith("list "+prefix, err, itx.EInvalid)
			if (prefix == "/" || pathValid(strings.TrimSuffix(prefix, "/"))) && limit <= 10_000 && (after == "" || pathValid(after)) {
				f.fatalf("list(%q, %q, %d) refused: %v", prefix, after, limit, err)
			}
			return
		}
		f.accepted++
		list, err := res.Streams()
		f.must("decode list", err)
		for i := 0; i < list.Len(); i++ {
			p, _ := list.At(i).Path()
			if !strings.HasPrefix(p, prefix) || (after != "" && p <= after) {
				f.fatalf("list(%q, after %q) holds %q", prefix, after, p)
			}
		}
	case 3:
		// Deleted, forced or not: the streams under /fz/p hold nothing that refuses it but an
		// open connection, which no case leaves there.
		before, err := client.Describe(ctx, s)
		if err != nil {
			f.refusedWith("describe "+path, err, itx.EInvalid)
			before = itx.StreamInfo{}
		}
		res, err := client.DeleteStreamIn(ctx, f.streams, path, f.r.Intn(2) == 0)
		if err != nil {
			f.refusedWith("remove "+path, err, itx.EInvalid, itx.ENotFound)
			if validPath && before.StreamID != "" {
				f.fatalf("remove of %q (stream %s) refused: %v", path, before.StreamID, err)
			}
			if validPath {
				after, err := client.Describe(ctx, s)
				f.must("describe "+path, err)
				if after.StreamID != before.StreamID || after.HeadOffset != before.HeadOffset {
					f.fatalf("remove of %q refused (%v), yet the stream changed: %+v -> %+v", path, err, before, after)
				}
			}
			return
		}
		f.accepted++
		if !validPath || res.StreamID != before.StreamID || res.HeadOffset != before.HeadOffset {
			f.fatalf("remove of %q answered %+v, the stream was %+v", path, res, before)
		}
		after, err := client.Describe(ctx, s)
		f.must("describe "+path, err)
		if after.StreamID != "" || after.HeadOffset != 0 {
			f.fatalf("removed %q still describes as %+v", path, after)
		}
	case 4:
		prefix := path
		if f.r.Intn(3) == 0 {
			prefix += "/"
		}
		limit := []uint32{0, 1, 10_000, 10_001, math.MaxUint32}[f.r.Intn(5)]
		fut, release := f.streams.DiskUsage(ctx, func(p schema.Streams_diskUsage_Params) error {
			p.SetLimit(limit)
			return p.SetPrefix(prefix)
		})
		defer release()
		res, err := fut.Struct()
		if err != nil {
			f.refusedWith("diskUsage "+prefix, err, itx.EInvalid)
			if (prefix == "/" || pathValid(strings.TrimSuffix(prefix, "/"))) && limit <= 10_000 {
				f.fatalf("diskUsage(%q, %d) refused: %v", prefix, limit, err)
			}
			return
		}
		f.accepted++
		list, err := res.Streams()
		f.must("decode diskUsage", err)
		for i := 0; i < list.Len(); i++ {
			if p, _ := list.At(i).Path(); !strings.HasPrefix(p, prefix) {
				f.fatalf("diskUsage(%q) holds %q", prefix, p)
			}
		}
	}
}

func (f *inputFuzzer) connection() {
	before := f.state(f.log)
	o := client.ConnectionOptions{
		After:            int64(min(f.fuzzOffset(before.head), math.MaxInt64)),
		Types:            f.fuzzTypes(),
		OpenedBy:         f.fuzzString(),
		Key:              f.fuzzName(),
		IncludeEphemeral: f.r.Intn(2) == 0,
	}
	if f.r.Intn(3) == 0 {
		o.MaxDeliveryEvents = []int{1, 10_000, 10_001, math.MaxUint32}[f.r.Intn(4)]
		o.MaxDeliveryBytes = []int{1, 8 << 20, 8<<20 + 1, math.MaxUint32}[f.r.Intn(4)]
	}
	if f.r.Intn(4) == 0 {
		o.ExpectedStreamID = f.fuzzString()
	}
	ctx, cancel := f.callCtx()
	defer cancel()
	c, err := client.OpenConnection(ctx, f.log, o, client.ConnectionHandler{Deliver: func(context.Context, itx.DeliveryBatch) error { return nil }})
	if err != nil {
		f.refusedWith("openConnection", err, itx.EInvalid, itx.ENotFound, itx.EFailedPrecondition, itx.EPermissionDenied)
		f.unchanged("openConnection", f.log, before)
		return
	}
	f.accepted++
	defer c.Close(ctx)
	want := strings.TrimSpace(o.Key)
	if want != "" && c.Key() != want {
		f.fatalf("connection opened under key %q answers key %q", o.Key, c.Key())
	}
	if !nameValid(c.Key()) {
		f.fatalf("connection opened under key %q README refuses", c.Key())
	}
	if by := strings.TrimSpace(o.OpenedBy); by != "" { // blank: none given
		if !nameValid(by) {
			f.fatalf("connection opened by %q README refuses", o.OpenedBy)
		}
	}
	if o.After > before.head {
		f.fatalf("connection opened after %d past the head %d", o.After, before.head)
	}
	if _, _, err := c.Ping(ctx); err != nil {
		f.fatalf("ping of an open connection: %v", err)
	}
}

func (f *inputFuzzer) schedule() {
	before := f.state(f.sched)
	ctx, cancel := f.callCtx()
	defer cancel()
	if f.r.Intn(4) == 0 {
		key := f.fuzzName()
		if len(before.scheduled) > 0 && f.r.Intn(2) == 0 {
			key = before.scheduled[f.r.Intn(len(before.scheduled))].Event.IdempotencyKey
		}
		fut, release := f.sched.CancelScheduled(ctx, func(p schema.Stream_cancelScheduled_Params) error { return p.SetKey(key) })
		res, err := fut.Struct()
		if err != nil {
			release()
			f.refusedWith("cancelScheduled", err, itx.EInvalid, itx.ENotFound)
			f.unchanged("cancelScheduled", f.sched, before)
			return
		}
		cancelled := res.Cancelled()
		release()
		f.accepted++
		if !cancelled {
			f.unchanged("cancelScheduled (nothing under the key)", f.sched, before)
		}
		return
	}
	in := f.fuzzEvent()
	in.Ephemeral = in.Ephemeral && f.r.Intn(2) == 0
	if f.r.Intn(4) > 0 {
		in.IdempotencyKey = fmt.Sprintf("s%d", f.r.Intn(30))
	}
	far := time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	dueAt := []int64{far, far + int64(f.r.Intn(1000)), math.MaxInt64, math.MinInt64, -1, 0, 1}[f.r.Intn(7)]
	fut, release := f.sched.Schedule(ctx, func(p schema.Stream_schedule_Params) error {
		dst, err := p.NewEvent()
		if err != nil {
			return err
		}
		p.SetDueAt(dueAt)
		return wire.SetEventInput(dst, &in)
	})
	defer release()
	res, err := fut.Struct()
	stored, valid := eventValid(in)
	if err != nil {
		f.refusedWith("schedule", err, itx.EInvalid, itx.ETooLarge, itx.EIdempotencyConflict, itx.ELimitExceeded)
		f.unchanged("schedule", f.sched, before)
		if valid && stored.IdempotencyKey != "" && !stored.Ephemeral && !strings.HasPrefix(stored.Type, "stream/") && dueAt == far {
			if _, inLog := f.findKey(f.sched, stored.IdempotencyKey); !inLog {
				f.fatalf("schedule of a valid event refused: %v (%s)", err, describeEvents([]itx.EventInput{in}))
			}
		}
		return
	}
	f.accepted++
	if !valid || stored.IdempotencyKey == "" || stored.Ephemeral || strings.HasPrefix(stored.Type, "stream/") {
		f.fatalf("schedule accepted what README refuses: %s", describeEvents([]itx.EventInput{in}))
	}
	if appended := int64(res.AppendedOffset()); appended > 0 {
		e, ok := f.readAt(f.sched, appended)
		if !ok || e.IdempotencyKey != stored.IdempotencyKey || !sameStoredBody(e, stored) {
			f.fatalf("schedule answered appended %d, which holds %+v, not %s", appended, e, describeEvents([]itx.EventInput{stored}))
		}
		return
	}
	if res.DueAt() != dueAt && dueAt > 0 {
		f.fatalf("schedule at %d answered due %d", dueAt, res.DueAt())
	}
	if dueAt <= time.Now().UnixMilli() {
		// Due at once: appended by the stream, with the key.
		wctx, wcancel := f.callCtx()
		defer wcancel()
		for {
			if e, ok := f.findKey(f.sched, stored.IdempotencyKey); ok {
				if d := sameAsStored(e, stored); d != "" {
					f.fatalf("scheduled event appended differs from what was sent: %s", d)
				}
				return
			}
			if _, err := client.WaitForEvent(wctx, f.sched, itx.Predicate{}, f.state(f.sched).head, time.Second); err != nil && itx.ErrorCode(err) != itx.EDeadlineExceeded {
				f.fatalf("wait for the scheduled event: %v", err)
			}
		}
	}
	list, err := client.ListScheduled(ctx, f.sched)
	f.must("list scheduled", err)
	for _, se := range list {
		if se.Event.IdempotencyKey == stored.IdempotencyKey {
			if se.DueAt != dueAt {
				f.fatalf("scheduled %q due %d, sent %d", stored.IdempotencyKey, se.DueAt, dueAt)
			}
			got := itx.Event{Type: se.Event.Type, Payload: se.Event.Payload, Metadata: se.Event.Metadata, IdempotencyKey: se.Event.IdempotencyKey}
			if d := sameAsStored(got, stored); d != "" {
				f.fatalf("scheduled event reads back otherwise: %s", d)
			}
			return
		}
	}
	f.fatalf("scheduled %q not listed", stored.IdempotencyKey)
}

// findKey finds the event under key in s's log.
func (f *inputFuzzer) findKey(s schema.Stream, key string) (itx.Event, bool) {
	ctx, cancel := f.callCtx()
	defer cancel()
	all, err := client.ReadAll(ctx, s, itx.Query{})
	f.must("read the log", err)
	for _, e := range all {
		if e.IdempotencyKey == key {
			return e, true
		}
	}
	return itx.Event{}, false
}

func (f *inputFuzzer) mount() {
	name := f.fuzzName()
	ctx, cancel := f.callCtx()
	defer cancel()
	r := client.ServeReceiver(func(context.Context, itx.DeliveryBatch) (int64, error) { return 0, nil })
	h, err := client.MountReceiver(ctx, f.p, name, r)
	if err != nil {
		f.refusedWith("mount", err, itx.EInvalid, itx.ELimitExceeded)
		if nameValid(name) {
			f.fatalf("mount under valid name %q refused: %v", name, err)
		}
		return
	}
	f.accepted++
	defer h.Release()
	if !nameValid(name) {
		f.fatalf("mount under %q accepted: README refuses it", name)
	}
	caps, release := f.p.Capabilities(ctx, nil)
	defer release()
	mounts, err := client.ListMounts(ctx, caps.Capabilities())
	f.must("list mounts", err)
	for _, m := range mounts {
		if m.Name == name {
			_ = client.Unmount(ctx, caps.Capabilities(), name)
			return
		}
	}
	f.fatalf("mounted %q not listed", name)
}

func (f *inputFuzzer) trim() {
	// Refill what earlier trims took, so a trim has something to delete.
	mustAppend(f.t, f.trimmed, ev("fz.t", `{}`), ev("fz.t", `{}`))
	before := f.state(f.trimmed)
	through := f.fuzzOffset(before.head)
	createdBefore := []int64{0, -1, math.MinInt64, math.MaxInt64, time.Now().UnixMilli()}[f.r.Intn(5)]
	ctx, cancel := f.callCtx()
	defer cancel()
	fut, release := f.trimmed.Trim(ctx, func(p schema.Stream_trim_Params) error {
		p.SetThroughOffset(through)
		p.SetCreatedBefore(createdBefore)
		return nil
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		f.refusedWith("trim", err, itx.EInvalid)
		f.unchanged("trim", f.trimmed, before)
		return
	}
	f.accepted++
	if through > math.MaxInt64 {
		f.fatalf("trim through %d (past 2^63-1) accepted", through)
	}
	info, err := client.Describe(ctx, f.trimmed)
	f.must("describe", err)
	if info.HeadOffset != before.head {
		f.fatalf("trim moved the head %d -> %d", before.head, info.HeadOffset)
	}
	if int64(res.TrimmedThrough()) > before.head || info.TrimmedThrough != int64(res.TrimmedThrough()) {
		f.fatalf("trim answered trimmedThrough %d, describe %d, head %d", res.TrimmedThrough(), info.TrimmedThrough, before.head)
	}
}

func (f *inputFuzzer) retention() {
	before := f.state(f.trimmed)
	beforeInfo, err := client.Describe(f.ctx, f.trimmed)
	f.must("describe", err)
	maxAge := []int64{0, -1, 1, 59_999, 60_000, 100 * 365 * 24 * 3600 * 1000, 101 * 366 * 24 * 3600 * 1000, math.MaxInt64, math.MinInt64}[f.r.Intn(9)]
	maxEvents := []uint64{0, 1, 1000, math.MaxInt64, math.MaxInt64 + 1, math.MaxUint64}[f.r.Intn(6)]
	maxBytes := []uint64{0, 1, 1 << 30, math.MaxInt64, math.MaxInt64 + 1, math.MaxUint64}[f.r.Intn(6)]
	ctx, cancel := f.callCtx()
	defer cancel()
	fut, release := f.trimmed.SetRetention(ctx, func(p schema.Stream_setRetention_Params) error {
		p.SetMaxAgeMs(maxAge)
		p.SetMaxEvents(maxEvents)
		p.SetMaxBytes(maxBytes)
		return nil
	})
	defer release()
	_, err = fut.Struct()
	valid := maxAge >= 0 && (maxAge == 0 || maxAge >= 60_000) && maxAge <= 100*365*24*3600*1000+25*24*3600*1000 &&
		maxEvents <= math.MaxInt64 && maxBytes <= math.MaxInt64
	if err != nil {
		f.refusedWith("setRetention", err, itx.EInvalid)
		f.unchanged("setRetention", f.trimmed, before)
		info, err2 := client.Describe(ctx, f.trimmed)
		f.must("describe", err2)
		if info.RetentionMaxAgeMs != beforeInfo.RetentionMaxAgeMs || info.RetentionMaxEvents != beforeInfo.RetentionMaxEvents || info.RetentionMaxBytes != beforeInfo.RetentionMaxBytes {
			f.fatalf("setRetention refused (%v), yet the policy changed", err)
		}
		if valid && maxAge <= 100*365*24*3600*1000 {
			f.fatalf("setRetention(%d, %d, %d) refused: %v", maxAge, maxEvents, maxBytes, err)
		}
		return
	}
	f.accepted++
	if !valid {
		f.fatalf("setRetention(%d, %d, %d) accepted", maxAge, maxEvents, maxBytes)
	}
	info, err := client.Describe(ctx, f.trimmed)
	f.must("describe", err)
	if info.RetentionMaxAgeMs != maxAge || uint64(info.RetentionMaxEvents) != maxEvents || uint64(info.RetentionMaxBytes) != maxBytes {
		f.fatalf("setRetention(%d, %d, %d) reads back (%d, %d, %d)", maxAge, maxEvents, maxBytes, info.RetentionMaxAgeMs, info.RetentionMaxEvents, info.RetentionMaxBytes)
	}
	// Left as it was: a policy keeping one event would leave the trim cases nothing to trim.
	f.must("clear the retention", client.SetRetention(ctx, f.trimmed, client.Retention{}))
}

// admin creates and renames projects and creates tokens with generated names, labels, scopes
// and expiries.
func (f *inputFuzzer) admin() {
	ctx, cancel := f.callCtx()
	defer cancel()
	switch f.r.Intn(3) {
	case 0, 1:
		if len(f.projects) > 0 && f.r.Intn(2) == 0 {
			f.renameProject(ctx)
			return
		}
		name := f.pick(fmt.Sprintf("p%d", f.r.Intn(1000)), f.fuzzString)
		before, err := client.ListProjects(ctx, f.root)
		f.must("list projects", err)
		fut, release := f.root.CreateProject(ctx, func(p schema.Admin_createProject_Params) error { return p.SetName(name) })
		defer release()
		res, err := fut.Struct()
		if err != nil {
			f.refusedWith("createProject", err, itx.EInvalid, itx.ELimitExceeded)
			after, err2 := client.ListProjects(ctx, f.root)
			f.must("list projects", err2)
			if len(after) != len(before) {
				f.fatalf("createProject(%q) refused (%v), yet %d projects became %d", name, err, len(before), len(after))
			}
			if nameValid(name) && !projectNamed(before, name) {
				f.fatalf("createProject(%q) refused: %v", name, err)
			}
			return
		}
		f.accepted++
		info, err := res.Info()
		f.must("decode", err)
		id, _ := info.Id()
		got, _ := info.Name()
		if !nameValid(name) || got != name || projectNamed(before, name) {
			f.fatalf("createProject(%q) accepted as %q (names taken: %v)", name, got, before)
		}
		f.projects = append(f.projects, id)
		f.requireProjectName(ctx, id, name)
	case 2:
		f.createToken(ctx)
	}
}

func projectNamed(list []itx.ProjectSummary, name string) bool {
	for _, p := range list {
		if p.Info.Name == name {
			return true
		}
	}
	return false
}

func (f *inputFuzzer) requireProjectName(ctx context.Context, id, name string) {
	f.t.Helper()
	list, err := client.ListProjects(ctx, f.root)
	f.must("list projects", err)
	for _, p := range list {
		if p.Info.ID == id {
			if p.Info.Name != name {
				f.fatalf("project %s lists as %q, named %q", id, p.Info.Name, name)
			}
			return
		}
	}
	f.fatalf("project %s (%q) not listed", id, name)
}

func (f *inputFuzzer) renameProject(ctx context.Context) {
	id := f.projects[f.r.Intn(len(f.projects))]
	list, err := client.ListProjects(ctx, f.root)
	f.must("list projects", err)
	var old string
	for _, p := range list {
		if p.Info.ID == id {
			old = p.Info.Name
		}
	}
	name := f.pick(fmt.Sprintf("r%d", f.r.Intn(1000)), f.fuzzString)
	err = client.RenameProject(ctx, f.root, id, name)
	if err != nil {
		f.refusedWith("renameProject", err, itx.EInvalid)
		f.requireProjectName(ctx, id, old)
		if nameValid(name) && !projectNamed(list, name) {
			f.fatalf("renameProject(%q) refused: %v", name, err)
		}
		return
	}
	f.accepted++
	if !nameValid(name) {
		f.fatalf("renameProject(%q) accepted", name)
	}
	f.requireProjectName(ctx, id, name)
}

func (f *inputFuzzer) createToken(ctx context.Context) {
	label := f.pick(fmt.Sprintf("t%d", f.r.Intn(1000)), f.fuzzString)
	prefix := ""
	if f.r.Intn(2) == 0 {
		prefix = f.pick("/fz/tok", func() string { return f.fuzzPath("/fz/tok") })
	}
	rights := []schema.Right{}
	for range f.r.Intn(3) {
		rights = append(rights, schema.Right(f.r.Intn(6))) // 4 and 5 are no right
	}
	now := time.Now().UnixMilli()
	expires := []int64{0, 0, now + 3_600_000, now - 1, -1, math.MinInt64, math.MaxInt64}[f.r.Intn(7)]
	before, err := client.ListTokens(ctx, f.padmin, "")
	f.must("list tokens", err)
	fut, release := f.padmin.CreateToken(ctx, func(p schema.Admin_createToken_Params) error {
		p.SetExpiresAt(expires)
		if err := p.SetLabel(label); err != nil {
			return err
		}
		sc, err := p.NewScope()
		if err != nil {
			return err
		}
		if err := sc.SetPrefix(prefix); err != nil {
			return err
		}
		rl, err := sc.NewRights(int32(len(rights)))
		for i, r := range rights {
			rl.Set(i, r)
		}
		return err
	})
	defer release()
	res, err := fut.Struct()
	rightsValid := true
	for _, r := range rights {
		rightsValid = rightsValid && r <= schema.Right_admin
	}
	valid := nameValid(label) && (prefix == "" || pathValid(prefix)) && rightsValid && (expires == 0 || expires > now)
	if err != nil {
		f.refusedWith("createToken", err, itx.EInvalid, itx.ELimitExceeded)
		after, err2 := client.ListTokens(ctx, f.padmin, "")
		f.must("list tokens", err2)
		if len(after) != len(before) {
			f.fatalf("createToken(%q) refused (%v), yet %d tokens became %d", label, err, len(before), len(after))
		}
		if valid {
			f.fatalf("createToken(%q, %q, %v, %d) refused: %v", label, prefix, rights, expires, err)
		}
		return
	}
	f.accepted++
	ti, err := res.Info()
	f.must("decode", err)
	info, err := wire.TokenInfoFromSchema(ti)
	f.must("decode", err)
	if !valid {
		f.fatalf("createToken(%q, %q, %v, %d) accepted: %+v", label, prefix, rights, expires, info)
	}
	if info.Label != label || info.Scope.Prefix != prefix || info.ExpiresAt != expires || len(info.Scope.Rights) != len(rights) {
		f.fatalf("createToken(%q, %q, %v, %d) reads back %+v", label, prefix, rights, expires, info)
	}
	// Revoked at once: a project holds at most 10,000 tokens.
	f.must("revoke", client.RevokeToken(ctx, f.padmin, "", info.ID))
}

// TestFuzzInput_ProcessorPorts sends generated input through the ports a remote processor host
// is handed with a wake: KV keys and values around their bounds (empty, 1 KiB, 64 KiB, invalid
// UTF-8, NUL), forwards to other streams (appendTo) and scheduled appends with the events and
// paths the public surface fuzzer makes. A refusal is typed and changes nothing (the key's value,
// the target's head); an acceptance reads back as sent. ITX_FUZZ_INPUT_CASES, _SEED and _SECONDS
// as for TestFuzzInput_PublicSurface (a tenth of the cases, 5 s by default).
func TestFuzzInput_ProcessorPorts(t *testing.T) {
	cases, seed, budget := 400, int64(1), 5*time.Second
	if v, err := strconv.Atoi(os.Getenv("ITX_FUZZ_INPUT_CASES")); err == nil && v > 0 {
		cases = max(v/10, 1)
	}
	if v, err := strconv.ParseInt(os.Getenv("ITX_FUZZ_INPUT_SEED"), 10, 64); err == nil {
		seed = v
	}
	if v, err := strconv.Atoi(os.Getenv("ITX_FUZZ_INPUT_SECONDS")); err == nil && v > 0 {
		budget = time.Duration(v) * time.Second
	}
	ts := startServer(t, server.Config{})
	f := newInputFuzzer(t, ts, seed)
	ctx := ctxT(t)
	host := &portsKeeper{bigStateHost: bigStateHost{stateBytes: 1}}
	h, err := mountHostServing(ctx, f.p, "fuzz-host", host, []itx.ProcessorInfo{{Name: "c", ReducerVersion: "1", ConsumedTypes: []string{"*"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	home := stream(t, f.p, "/fz/proc")
	mustAppend(t, home, ev("a", `{}`))
	configureInstance(t, home, "fz", "c", "remote")
	sub := client.Subscription(ctx, home, "fz")
	defer sub.Release()
	if _, err := client.WaitUntilProcessed(ctx, sub, f.state(home).head, 0); err != nil {
		t.Fatal(err)
	}
	ports := host.last()
	out := stream(t, f.p, "/fz/out")
	mustAppend(t, out, ev("a", `{}`))

	start := time.Now()
	n := 0
	for ; n < cases && time.Since(start) < budget; n++ {
		f.edgeRate = []float64{0.1, 0.3, 1}[f.r.Intn(3)]
		switch op := f.r.Intn(3); op {
		case 0:
			f.op = fmt.Sprintf("case %d (kv, seed %d)", n, seed)
			f.portsKV(ports)
		case 1:
			f.op = fmt.Sprintf("case %d (appendTo, seed %d)", n, seed)
			f.portsAppendTo(ports, out)
		case 2:
			f.op = fmt.Sprintf("case %d (ports.schedule, seed %d)", n, seed)
			f.portsSchedule(ports, home)
		}
		if t.Failed() {
			t.Fatalf("stopped at %s", f.op)
		}
	}
	t.Logf("%d cases in %v (seed %d); accepted %d, refused %d", n, time.Since(start).Round(time.Millisecond), seed, f.accepted, f.refused)
}

func (f *inputFuzzer) kvGet(ports schema.ProcessorPorts, key string) ([]byte, bool) {
	f.t.Helper()
	ctx, cancel := f.callCtx()
	defer cancel()
	fut, release := ports.KvGet(ctx, func(p schema.ProcessorPorts_kvGet_Params) error { return p.SetKey(key) })
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return nil, false
	}
	v, err := res.Value()
	f.must("kvGet value", err)
	return bytes.Clone(v), res.Found()
}

func (f *inputFuzzer) portsKV(ports schema.ProcessorPorts) {
	key := f.pick(fmt.Sprintf("key%d", f.r.Intn(20)), func() string {
		if f.r.Intn(4) == 0 {
			return strings.Repeat("k", 1023+f.r.Intn(3))
		}
		return f.fuzzString()
	})
	value := []byte(f.pick("value", func() string {
		if f.r.Intn(3) == 0 {
			return strings.Repeat("v", 64<<10-1+f.r.Intn(3))
		}
		return f.fuzzString()
	}))
	old, had := f.kvGet(ports, key)
	ctx, cancel := f.callCtx()
	defer cancel()
	var err error
	if f.r.Intn(4) == 0 {
		fut, release := ports.KvDelete(ctx, func(p schema.ProcessorPorts_kvDelete_Params) error { return p.SetKey(key) })
		_, err = fut.Struct()
		release()
		if err != nil {
			f.refusedWith("kvDelete", err, itx.EInvalid)
			if got, found := f.kvGet(ports, key); found != had || !bytes.Equal(got, old) {
				f.fatalf("kvDelete(%q) refused (%v), yet the key changed", key, err)
			}
			return
		}
		f.accepted++
		if _, found := f.kvGet(ports, key); found {
			f.fatalf("kvDelete(%q) accepted, the key still found", key)
		}
		return
	}
	fut, release := ports.KvPut(ctx, func(p schema.ProcessorPorts_kvPut_Params) error {
		if err := p.SetKey(key); err != nil {
			return err
		}
		return p.SetValue(value)
	})
	_, err = fut.Struct()
	release()
	valid := key != "" && len(key) <= 1024 && len(value) <= 64<<10
	if err != nil {
		f.refusedWith("kvPut", err, itx.EInvalid, itx.ELimitExceeded)
		if got, found := f.kvGet(ports, key); found != had || !bytes.Equal(got, old) {
			f.fatalf("kvPut(%q) refused (%v), yet the key changed", key, err)
		}
		if valid {
			f.fatalf("kvPut(%.80q, %d bytes) refused: %v", key, len(value), err)
		}
		return
	}
	f.accepted++
	if !valid {
		f.fatalf("kvPut(%.80q, %d bytes) accepted", key, len(value))
	}
	if got, found := f.kvGet(ports, key); !found || !bytes.Equal(got, value) {
		f.fatalf("kvPut(%.80q) reads back %.80q (found %v), put %.80q", key, got, found, value)
	}
}

func (f *inputFuzzer) portsAppendTo(ports schema.ProcessorPorts, out schema.Stream) {
	path := f.pick("/fz/out", func() string { return f.fuzzPath("/fz/out") })
	events := make([]itx.EventInput, 1+f.r.Intn(2))
	for i := range events {
		events[i] = f.fuzzEvent()
	}
	before := f.state(out)
	ctx, cancel := f.callCtx()
	defer cancel()
	fut, release := ports.AppendTo(ctx, func(p schema.ProcessorPorts_appendTo_Params) error {
		if err := p.SetPath(path); err != nil {
			return err
		}
		return wire.SetEventInputs(p.NewEvents, events)
	})
	defer release()
	res, err := fut.Struct()
	valid := pathValid(path)
	for _, in := range events {
		_, ok := eventValid(in)
		valid = valid && ok
	}
	if err != nil {
		f.refusedWith("appendTo", err, itx.EInvalid, itx.ETooLarge, itx.EIdempotencyConflict, itx.EPermissionDenied)
		if path == "/fz/out" {
			f.unchanged("appendTo", out, before)
		}
		return
	}
	f.accepted++
	r, err := res.Result()
	f.must("decode", err)
	result, err := wire.AppendResultFromSchema(r)
	f.must("decode", err)
	if !valid {
		f.fatalf("appendTo(%q) accepted what README refuses: %s", path, describeEvents(events))
	}
	if path != "/fz/out" {
		return
	}
	for i, off := range result.Offsets {
		if result.Duplicate[i] {
			continue
		}
		stored, _ := eventValid(events[i])
		e, ok := f.readAt(out, off)
		if !ok {
			f.fatalf("appendTo's event %d at %d not read back", i, off)
		}
		// A forward's key is its own (derived when none is given): compare the rest.
		stored.IdempotencyKey = e.IdempotencyKey
		if d := sameAsStored(e, stored); d != "" {
			f.fatalf("appendTo's event %d read back at %d differs: %s", i, off, d)
		}
	}
}

func (f *inputFuzzer) portsSchedule(ports schema.ProcessorPorts, home schema.Stream) {
	in := f.fuzzEvent()
	in.IdempotencyKey = f.pick(fmt.Sprintf("ps%d", f.r.Intn(20)), f.fuzzString)
	far := time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	before := f.state(home)
	ctx, cancel := f.callCtx()
	defer cancel()
	fut, release := ports.Schedule(ctx, func(p schema.ProcessorPorts_schedule_Params) error {
		dst, err := p.NewEvent()
		if err != nil {
			return err
		}
		p.SetDueAt(far)
		return wire.SetEventInput(dst, &in)
	})
	defer release()
	_, err := fut.Struct()
	stored, valid := eventValid(in)
	valid = valid && stored.IdempotencyKey != "" && !stored.Ephemeral && !strings.HasPrefix(stored.Type, "stream/")
	if err != nil {
		f.refusedWith("ports.schedule", err, itx.EInvalid, itx.ETooLarge, itx.EIdempotencyConflict, itx.ELimitExceeded)
		f.unchanged("ports.schedule", home, before)
		return
	}
	f.accepted++
	if !valid {
		f.fatalf("ports.schedule accepted what README refuses: %s", describeEvents([]itx.EventInput{in}))
	}
	list, err := client.ListScheduled(ctx, home)
	f.must("list scheduled", err)
	for _, se := range list {
		if se.Event.IdempotencyKey == stored.IdempotencyKey {
			got := itx.Event{Type: se.Event.Type, Payload: se.Event.Payload, Metadata: se.Event.Metadata, IdempotencyKey: se.Event.IdempotencyKey}
			if d := sameAsStored(got, stored); d != "" {
				f.fatalf("ports.schedule's event reads back otherwise: %s", d)
			}
			return
		}
	}
	f.fatalf("ports.schedule's %q not listed", stored.IdempotencyKey)
}
