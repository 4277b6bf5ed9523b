package main

import (
	"encoding/json"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A scheduled append due at 0, the epoch (a time past: at once), shows that time, not null:
// null is what itx prints for "no time" (a subscription's nextAttemptAt when none is planned).
// The circuit breaker (one event a minute here, spent by the first append) holds it back, so
// it is still listed.
func TestRun_ScheduledAtTheEpochShowsItsTime(t *testing.T) {
	s := itxtest.Start(t, server.Config{BreakerBurst: 1, BreakerRefillPerMinute: 1})
	ts := &testServer{addr: s.Addr, token: s.Creds.ProjectToken, dir: s.Dir}
	ts.appendDirect(t, "/due", itx.EventInput{Type: "first", IdempotencyKey: "first"})
	c := newCLI(t)
	c.env["ITX_ADDR"], c.env["ITX_TOKEN"] = ts.addr, ts.token

	const epoch = "1970-01-01T00:00:00.000Z"
	code, out, errs := c.run("", "--json", "-e", `project.streams.get("/due").schedule({type: "r", idempotencyKey: "r-0"}, 0)`)
	require.Equal(t, exitOK, code, errs)
	require.JSONEq(t, `{"dueAt": "`+epoch+`"}`, out)

	code, out, errs = c.run(`project.streams.get("/due").listScheduled()`+"\n", "--json")
	require.Equal(t, exitOK, code, errs)
	var list []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &list), out)
	require.Len(t, list, 1, "held back by the breaker: %s", out)
	require.Equal(t, epoch, list[0]["dueAt"])

	code, out, errs = c.run("", "--json", "-e", `project.streams.get("/due").listScheduled()[0].dueAt`)
	require.Equal(t, exitOK, code, errs)
	require.Equal(t, `"`+epoch+`"`+"\n", out, "the value JavaScript sees too")

	// A key already in the log schedules nothing: no time, the key's offset.
	code, out, errs = c.run("", "--json", "-e", `project.streams.get("/due").schedule({type: "first", idempotencyKey: "first"}, 0)`)
	require.Equal(t, exitOK, code, errs)
	require.JSONEq(t, `{"dueAt": null, "appendedOffset": 1}`, out)
}

// A usage error in piped input (a command given arguments it does not take, or no command of
// that name) exits 2, as the same mistake does from the shell (itx tail without a path); the
// inputs after it still run, as after any error, and it outranks a failed evaluation (1).
func TestRun_PipedUsageErrorsExit2(t *testing.T) {
	ts := startServer(t)
	c := newCLI(t)
	c.env["ITX_ADDR"], c.env["ITX_TOKEN"] = ts.addr, ts.token
	for _, tc := range []struct{ input, errs string }{
		{".tail\n", "invalidArgument: usage: .tail <path> [--from N | N]\n"},
		{".tail /t --from x\n", "invalidArgument: tail: after must be an offset, got \"x\"; usage: .tail <path> [--from N | N]\n"},
		{".watch /a /b\n", "invalidArgument: watch: too many arguments; usage: .watch <path>\n"},
		{".export\n", "invalidArgument: usage: .export <path> [after] [--with-control]\n"},
		{".import /a --with-contrl\n", "invalidArgument: import: unknown flag \"--with-contrl\"; usage: .import <path> [file.ndjson | -] [--with-control]\n"},
		{".nope\n", "invalidArgument: unknown command .nope (try .help)\n"},
		{".time bogus\n", "invalidArgument: usage: .time [iso|relative]\n"},
		{".output yaml\n", "invalidArgument: output: unknown output format \"yaml\" (auto, pretty, json, table); usage: .output [auto|pretty|json|table|wide|fit]\n"},
		{".help Nope\n", "invalidArgument: help: no interface \"Nope\""},
		{"nope\n.tail\n", "ReferenceError: nope is not defined\ninvalidArgument: usage: .tail <path> [--from N | N]\n"},
	} {
		code, out, errs := c.run(tc.input + "1 + 1\n")
		require.Equal(t, exitUsage, code, "%q: %s", tc.input, errs)
		require.Equal(t, "2\n", out, "%q: the inputs after a usage error still run", tc.input)
		require.Contains(t, errs, tc.errs, "%q", tc.input)
	}
	code, _, errs := c.run("nope\n1\n")
	require.Equal(t, exitError, code, "an evaluation error alone exits 1: %s", errs)
}
