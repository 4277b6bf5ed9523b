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
