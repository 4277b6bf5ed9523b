package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTerminal_CtrlCInThePagerShowsNothingMore: a result taller than the screen goes through
// the pager; Ctrl-C there (which reaches the pager too) ends the pager and the session goes
// on, without the result printed again. itx printed the whole result to the terminal once any
// pager ended with an error, so Ctrl-C pressed to stop a long output poured it all out. A
// pager that cannot be started still leaves the result printed as it is.
func TestTerminal_CtrlCInThePagerShowsNothingMore(t *testing.T) {
	ts := startServer(t)
	// The pager says it started, then waits (reading nothing) until Ctrl-C ends it.
	pager := "echo pager' 'up; exec sleep 60"
	term, _ := bbTerminal(t, ts, 120, 20, "ITX_PAGER="+pager)
	term.send(`Array.from({length: 100}, (_, i) => "row-" + (i * 7 + 1000))` + "\r")
	term.expect("pager up")
	term.send("\x03")
	term.expect("itx> ")
	term.line(`"still" + " here"`, `"still here"`)
	require.NotContains(t, term.dump(), "row-1693", "the result was printed after the pager was interrupted")

	// No such pager: the result is printed as it is.
	term, _ = bbTerminal(t, ts, 120, 20, "ITX_PAGER=/nonexistent/pager")
	term.line(`Array.from({length: 100}, (_, i) => "row-" + (i * 7 + 1000))`, `"row-1693"`)
	require.True(t, strings.Contains(term.dump(), `"row-1000"`))
}
