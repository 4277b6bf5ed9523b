package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRun_ExpressionUsageNamesTheDotCommand: a dot-command itx does not run from the shell,
// misused through itx -e, names itself as it was given. Its usage read "usage: itx output
// [auto|...]", a command that does not exist ("itx output" is neither a command nor a script
// file); a shell command keeps its shell form.
func TestRun_ExpressionUsageNamesTheDotCommand(t *testing.T) {
	ts := startServer(t)
	c := newCLI(t)
	conn := []string{"--addr", ts.addr, "--token", ts.token}
	for expr, want := range map[string]string{
		".output bogus":  "itx -e .output: unknown output format \"bogus\" (auto, pretty, json, table; wide or fit for a table's width)\nusage: itx -e '.output [auto|pretty|json|table|wide|fit]'\n",
		".reconnect now": "itx -e .reconnect: too many arguments\nusage: itx -e '.reconnect'\n",
		".tail":          "usage: itx tail <path> [--from N | N] [--reader <name>]\n",
	} {
		code, _, errs := c.run("", append(conn, "-e", expr)...)
		require.Equal(t, exitUsage, code, expr)
		require.Equal(t, want, errs, expr)
	}
}
