package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/itx-dev/itx/processors/examples"
	"github.com/stretchr/testify/require"
)

// agent(path).processor is the seed's sugar for
// project.streams.get(path).subscriptions.get("agent").processor: the same processor's snapshot
// either way; agent(path).subscription is the subscription; a bad path is refused.
func TestRun_AgentSugar(t *testing.T) {
	srv := startProcessorServer(t, "agent-sugar", examples.Names...)
	c := newCLI(t)
	conn := []string{"--addr", srv.addr, "--token", srv.token, "--json"}
	code, out, errs := c.run("", append(conn, "-e", `
		let subs = project.streams.get("/bot").subscriptions
		let at = subs.configure({name: "agent", receiver: {type: "processor-wake"}}).offset
		agent("/bot").subscription.waitUntilProcessed(at)
		let a = agent("/bot").processor.snapshot()
		let b = project.streams.get("/bot").subscriptions.get("agent").processor.snapshot()
		JSON.stringify([a.processedOffset, b.processedOffset, agent("/bot").path, at])
	`)...)
	require.Equal(t, exitOK, code, errs)
	var got []any
	var raw string
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &raw), out)
	require.NoError(t, json.Unmarshal([]byte(raw), &got), raw)
	require.Equal(t, got[3], got[0], "processed through the configure: %s", raw)
	require.Equal(t, got[0], got[1], "the same processor either way: %s", raw)
	require.Equal(t, "/bot", got[2])

	code, _, errs = c.run("", append(conn, "-e", `agent("bot")`)...)
	require.Equal(t, exitError, code)
	require.Contains(t, errs, "invalidArgument")
}
