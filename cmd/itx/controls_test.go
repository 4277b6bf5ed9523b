package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
	"golang.org/x/text/width"
)

// hostile holds the control characters an appender could aim at a reader's terminal: ESC
// sequences (clear the screen, retitle the window), BEL, CR (overwrite the line), DEL, and
// U+009B (C1 CSI: ESC [ to a terminal that honors C1).
const hostile = "\x1b[2J\x1b]0;pwned\x07\r\x7f\u009b2J"

// rawControls are the bytes of hostile that must never reach the terminal as they are.
var rawControls = []string{"\x1b[2J", "\x1b]0;", "\x07", "\x7f", "\xc2\x9b"}

// TestTerminal_EventControlCharactersAreEscaped: what anyone who can append writes into an
// event (its payload's strings, its idempotency key, its metadata) is shown escaped, never as
// raw control characters, wherever itx shows it: an events table, a pretty result, .tail, an
// error quoting it, --json and export. The table printed the key raw (ESC [2J cleared the
// screen), and every other path printed DEL and C1 raw.
func TestTerminal_EventControlCharactersAreEscaped(t *testing.T) {
	ts := startServer(t)
	payload, err := json.Marshal(map[string]string{"s": hostile})
	require.NoError(t, err)
	ts.appendDirect(t, "/ctl", itx.EventInput{Type: "note", Payload: payload, IdempotencyKey: "k" + hostile,
		Metadata: payload})

	noRaw := func(where, out string) {
		t.Helper()
		for _, c := range rawControls {
			require.NotContains(t, out, c, "%s: %q", where, out)
		}
	}

	term, _ := bbTerminal(t, ts, 250, 50)
	mark := term.mark
	term.line(`let s = project.streams.get("/ctl"); s.getEvents()`, "(1 row)")
	require.Contains(t, term.dump()[mark:term.mark], `k\u001b[2J\u001b]0;pwned\u0007\u000d\u007f\u009b2J`, "the key cell")
	term.line(`s.getEvents()[0].idempotencyKey`, `"k\u001b[2J\u001b]0;pwned\u0007\r\u007f\u009b2J"`)
	term.line(`s.getEvents()[0].payload`, `"s": "\u001b[2J\u001b]0;pwned\u0007\r\u007f\u009b2J"`)
	term.line(`[{a: s.getEvents()[0].payload.s}]`, `\u001b[2J\u001b]0;pwned\u0007\u000d\u007f\u009b2J`)
	term.line(`throw new Error(s.getEvents()[0].payload.s)`, `Error: \u001b[2J\u001b]0;pwned\u0007\u000d\u007f\u009b2J`)
	term.send(".tail /ctl --from 0\r")
	term.expect(`1  `)
	term.expect(`note  {"s":"\u001b[2J\u001b]0;pwned\u0007\r\u007f\u009b2J"}`)
	term.send("\x03")
	term.expect("itx> ")
	noRaw("terminal", term.dump())
	// print() shows a string as it is: a script prints what it means to.
	term.line(`print("a\x07b")`, "a\x07b")

	c := newCLI(t)
	conn := []string{"--addr", ts.addr, "--token", ts.token}
	for _, args := range [][]string{
		{"--json", "-e", `project.streams.get("/ctl").getEvents()`},
		{"-e", `project.streams.get("/ctl").getEvents()`},
		{"export", "/ctl"},
		{"--json", "-e", `throw new Error(project.streams.get("/ctl").getEvents()[0].payload.s)`},
	} {
		_, out, errs := c.run("", append(conn, args...)...)
		noRaw(strings.Join(args, " "), out+errs)
		require.Contains(t, out+errs, `\u007f\u009b2J`, "%v", args)
	}
	// Escaped, the JSON still reads back as what was appended.
	code, out, errs := c.run("", append(conn, "--json", "-e", `project.streams.get("/ctl").getEvents()[0].payload`)...)
	require.Equal(t, exitOK, code, errs)
	var got map[string]string
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.Equal(t, hostile, got["s"])
}

// TestTerminal_WideCharactersFitTheTable: a table is fitted to the terminal by the columns
// its characters take, CJK and emoji two each. Counted as one each, a row of emoji ran to twice
// the terminal's width (wrapped onto the next line), and the columns after a wide cell were
// pushed out of line.
func TestTerminal_WideCharactersFitTheTable(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/wide",
		itx.EventInput{Type: "emoji", Payload: json.RawMessage(`{"text":"` + strings.Repeat("🎉", 80) + `"}`)},
		itx.EventInput{Type: "cjk", Payload: json.RawMessage(`{"text":"` + strings.Repeat("漢字", 40) + `"}`)},
		itx.EventInput{Type: "ascii", Payload: json.RawMessage(`{"text":"` + strings.Repeat("abcdefghij", 16) + `"}`)})
	const cols = 100
	term, _ := bbTerminal(t, ts, cols, 50)

	// lines are the table's lines printed since mark, as the terminal shows them.
	ansi := regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]`)
	lines := func(mark int) []string {
		var out []string
		for _, l := range strings.Split(ansi.ReplaceAllString(term.dump()[mark:term.mark], ""), "\n") {
			l = strings.TrimRight(l, "\r")
			if i := strings.LastIndex(l, "\r"); i >= 0 {
				l = l[i+1:] // what follows a carriage return is what the line shows
			}
			if strings.Contains(l, "itx> ") || l == "" {
				continue
			}
			out = append(out, l)
		}
		return out
	}
	mark := term.mark
	term.line(`project.streams.get("/wide").getEvents()`, "(3 rows)")
	table := lines(mark)
	require.Len(t, table, 5, "a header, three rows, the count: %q", table)
	for _, l := range table {
		require.LessOrEqual(t, columnsOf(l), cols, "%q", l)
	}
	require.Contains(t, table[1], "🎉…")
	require.Contains(t, table[2], "漢字…")

	mark = term.mark
	term.line(`[{name: "🎉🎉🎉", n: 1}, {name: "漢字", n: 22}, {name: "abc", n: 333}]`, "(3 rows)")
	table = lines(mark)
	require.Len(t, table, 5, "%q", table)
	// The n column starts at the same terminal column on every row.
	at := func(l, cell string) int { return columnsOf(l[:strings.LastIndex(l, cell)]) }
	require.Equal(t, []int{8, 8, 8, 8}, []int{at(table[0], "n"), at(table[1], "1"), at(table[2], "22"), at(table[3], "333")}, "%q", table)
}

// columnsOf counts the terminal columns s takes: wide (CJK, emoji) characters two each.
func columnsOf(s string) int {
	n := 0
	for _, r := range s {
		switch width.LookupRune(r).Kind() {
		case width.EastAsianWide, width.EastAsianFullwidth:
			n += 2
		default:
			n++
		}
	}
	return n
}
