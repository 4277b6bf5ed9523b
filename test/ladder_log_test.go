package test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// The warning a halt logs names the project as well as the stream's path: two projects may
// each have a stream at /orders, and the operator alerted by the line must know whose halted.
func TestLadderLog_HaltNamesTheProject(t *testing.T) {
	var logs syncBuffer
	e := newSubEnv(t, server.Config{Log: zerolog.New(&logs)})
	s := stream(t, e.p, "/orders")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "no-such-contract", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}})
	waitUntil(t, "halted", func() bool { return e.describe(t, s, name).Status == "halted" })
	var halt map[string]any
	waitUntil(t, "the halt logged", func() bool {
		for _, line := range strings.Split(logs.String(), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && strings.HasPrefix(rec["message"].(string), "subscription halted") {
				halt = rec
				return true
			}
		}
		return false
	})
	require.Equal(t, "/orders", halt["path"])
	require.Equal(t, name, halt["subscription"])
	require.NotEmpty(t, halt["project"], "the halt's log line: %v", halt)
}
