package test

// Black-box probes of issues 8 (hardening: strict input) and 14 (access: tokens, revocation,
// attenuation), written from the issues, the schema and the README, over real RPC against a real
// itxd. Only the probes that found a defect or cover what no other test does are kept.

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// waitForEvent's payloadContains with invalid UTF-8 could never match (events refuse invalid
// UTF-8): it is refused at once with invalidArgument, not waited out to deadlineExceeded.
func TestBlackboxAccess_PayloadContainsInvalidUTF8IsRefused(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/contains")
	mustAppend(t, s, ev("a", `{"x":"y"}`))
	_, err := client.WaitForEvent(ctx, s, itx.Predicate{PayloadContains: json.RawMessage("{\"x\":\"\xff\"}")}, 0, 5*time.Second)
	requireCode(t, err, itx.EInvalid)
	require.Contains(t, itx.ErrorMessage(err), "UTF-8")
	// Valid text still matches.
	e, err := client.WaitForEvent(ctx, s, itx.Predicate{PayloadContains: json.RawMessage(`{"x":"y"}`)}, 0, 5*time.Second)
	require.NoError(t, err)
	require.EqualValues(t, 1, e.Offset)
}
