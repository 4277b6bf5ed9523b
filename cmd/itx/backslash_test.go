package main

import (
	"testing"
)

// TestTerminal_ALineEndingInABackslashInAStringKeepsTheSession: a line that ends inside a
// string with a backslash (`let s = "a\`, as a shell continues a line) is a syntax error and
// the session goes on, at the prompt and piped. Deciding whether the input went on, itx read
// past the end of the line and crashed (a Go panic: the session and its variables gone).
func TestTerminal_ALineEndingInABackslashInAStringKeepsTheSession(t *testing.T) {
	ts := startServer(t)
	term, _ := bbTerminal(t, ts, 120, 40)
	term.line(`let keep = 41`)
	term.line(`let s = "a\`, "SyntaxError")
	term.line(`keep + 1`, "42")

	c := newCLI(t)
	code, out, errs := c.run("let s = \"a\\\n\"after\"\n", "--addr", ts.addr, "--token", ts.token)
	if code != exitError || out != "\"after\"\n" {
		t.Fatalf("piped: status %d, out %q, errors %q", code, out, errs)
	}
}
