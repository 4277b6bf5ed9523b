package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRun_PipedLongStatementRunsOnce: a statement spanning thousands of piped lines runs once,
// when it ends, between the inputs around it. Whether an input had ended was a parse of every
// line gathered, at every line: a 5,000-line array literal took seconds to pipe, 50,000
// lines the better part of an hour (TestInputAssembler_ParsesALongStatementAFewTimes counts
// the parses).
func TestRun_PipedLongStatementRunsOnce(t *testing.T) {
	ts := startServer(t)
	var b strings.Builder
	b.WriteString("1 + 1\nlet arr = [\n")
	for i := range 3000 {
		fmt.Fprintf(&b, "  {n: %d, s: \"(%d\", t: `${'}'}`},\n", i, i)
	}
	b.WriteString("]\n.output json\narr.length\narr[2999].s + arr[0].t\n")
	c := newCLI(t)
	code, out, errs := c.run(b.String(), "--addr", ts.addr, "--token", ts.token)
	require.Equal(t, exitOK, code, errs)
	require.Equal(t, "2\n3000\n\"(2999}\"\n", out)
}
