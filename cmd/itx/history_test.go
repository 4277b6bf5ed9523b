package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestTerminal_HistoryRecallsWhatWasTyped: a line recalled from history (Up, Enter) runs as it
// was typed, in this session and the next. History collapsed every run of whitespace, so an
// event recalled from it was appended with another payload ("two    spaces" became "two
// spaces"), and a multi-line input ending a line in a // comment came back as one line whose
// comment swallowed the rest.
func TestTerminal_HistoryRecallsWhatWasTyped(t *testing.T) {
	ts := startServer(t)
	history := filepath.Join(t.TempDir(), "history")
	term, exited := bbTerminal(t, ts, 120, 40, "ITX_HISTORY="+history)
	term.line(`let s = project.streams.get("/h"); s.append({type: "t", payload: {text: "two    spaces"}}).headOffset`, "1")
	term.send("\x1b[A") // Up
	term.expect("two    spaces")
	term.line("", "2")
	term.line(`s.getEvents().map(e => e.payload.text)`, `["two    spaces", "two    spaces"]`)
	// Two lines, the first ending in a comment: recalled line by line, the same sum.
	term.send("1 + // one\r")
	term.expect("...  ")
	term.line("2", "3")
	term.send("\x04")
	select {
	case err := <-exited:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("itx did not exit on Ctrl-D")
	}
	b, err := os.ReadFile(history)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	require.Equal(t, []string{"1 + // one", "2"}, lines[len(lines)-2:], "%q", lines)

	// The next session recalls them as they were typed.
	term, _ = bbTerminal(t, ts, 120, 40, "ITX_HISTORY="+history)
	term.line(`let s = project.streams.get("/h")`)
	term.send("\x1b[A\x1b[A\x1b[A\x1b[A\x1b[A") // Up to the append
	term.expect("two    spaces")
	term.line("", "3")
	term.line(`s.getEvents()[2].payload.text`, `"two    spaces"`)
}
