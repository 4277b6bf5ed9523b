package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
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
