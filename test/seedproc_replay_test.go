package test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/processors/remote"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Seed 002's replay test, over real RPC against itxd, for the reference processor that touches a
// vendor (the agent, its vendor a real HTTP receiver): run the live flow, move the clock past
// every freshness horizon, then deliver the whole stream again from offset 1 to a fresh
// processor of the same name: an operator's rewind (setSubscriptionCursor to 0, the seed's
// reprocessFrom) or the subscription removed and configured again (a new subscriber). The vendor,
// now failing every call it gets, is dialed zero times, the stream gains no event of the agent's,
// and the replayed state equals the live one.
func TestSeedProc_AgentReplayDialsNoVendor(t *testing.T) {
	for _, placement := range []string{"in-process", "remote"} {
		for _, door := range []string{"rewind", "reconfigure"} {
			t.Run(placement+" "+door, func(t *testing.T) {
				var calls, replayCalls atomic.Int64
				var replaying atomic.Bool
				vendor := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if replaying.Load() {
						replayCalls.Add(1)
						http.Error(w, "a replay must never reach the vendor", http.StatusInternalServerError)
						return
					}
					calls.Add(1)
					var req struct{ RequestID, Prompt string }
					_ = json.NewDecoder(r.Body).Decode(&req)
					_ = json.NewEncoder(w).Encode(map[string]string{"text": "re: " + req.Prompt})
				}))
				t.Cleanup(vendor.Close)

				clock := clocktest.New(time.Unix(1_700_000_000, 0))
				agentCfg := examples.DefaultAgentConfig
				agentCfg.HesitationMs = 0
				host := processors.NewHost("test")
				require.NoError(t, examples.AddTo(host, []string{"agent"}, examples.HostOptions{
					Clock: clock, Vendor: examples.HTTPVendor{URL: vendor.URL}, Agent: agentCfg}))
				cfg := server.Config{Clock: clock}
				if placement == "in-process" {
					cfg.Processors = host
				}
				ts := startServer(t, cfg)
				ctx := ctxT(t)
				s := stream(t, ts.project(t), "/seedproc/agent-replay")
				configureInstance(t, s, "agent", "", placement)
				if placement == "remote" {
					mounted := make(chan struct{}, 16)
					hctx, cancel := context.WithCancel(context.Background())
					done := make(chan struct{})
					go func() {
						defer close(done)
						_ = remote.Run(hctx, remote.Config{Addr: ts.addr, Token: ts.creds.ProjectToken, Name: "worker", Host: host,
							Clock: clock, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
							Logf: t.Logf, Mounted: func() { mounted <- struct{}{} }})
					}()
					t.Cleanup(func() { cancel(); <-done })
					awaitMount(t, mounted)
				}
				sub, proc := processorOf(t, s, "agent")

				for _, text := range []string{"one", "two"} {
					mustAppend(t, s, examples.MessageAdded.Input(examples.Message{Text: text}, ""))
				}
				waitUntil(t, "both messages settled", func() bool { return countType(t, s, string(examples.LLMSettled)) == 2 })
				head := mustAppend(t, s, ev("agent/marker", `{}`)).HeadOffset
				_, err := client.WaitUntilProcessed(ctx, sub, head, 20*time.Second)
				require.NoError(t, err)
				require.Equal(t, int64(2), calls.Load(), "the live flow dialed the vendor once per message")
				live, err := client.Snapshot(ctx, proc)
				require.NoError(t, err)
				agentTypes := []string{string(examples.LLMRequested), string(examples.LLMStarted), string(examples.LLMSettled)}
				counts := func() []int {
					var out []int
					for _, typ := range agentTypes {
						out = append(out, countType(t, s, typ))
					}
					return out
				}
				before := counts()

				clock.Advance(24 * time.Hour) // past every freshness horizon and expiry
				replaying.Store(true)
				switch door {
				case "rewind":
					_, err := client.SetSubscriptionCursor(ctx, s, "agent", 0)
					require.NoError(t, err)
				case "reconfigure":
					removeSubscription(t, s, "agent")
					configureInstance(t, s, "agent", "", placement)
				}
				// A marker behind the replay: processed, the replay has reached the head. The
				// jump fired every timer due within the day at once, a wake's bound among them
				// if one was still winding down, whose retry then waits on a clock that no longer
				// moves: each poll moves it a millisecond, about as fast as a real one.
				head = mustAppend(t, s, ev("agent/marker", `{}`)).HeadOffset
				waitUntil(t, "the replay reached the head", func() bool {
					clock.Advance(time.Millisecond)
					d, err := client.DescribeSubscription(ctx, sub)
					require.NoError(t, err)
					return d.ConfirmedOffset >= head
				})
				if door == "rewind" {
					raw, err := client.RuntimeState(ctx, proc)
					require.NoError(t, err)
					var rs itx.ProcessorRuntimeState
					require.NoError(t, json.Unmarshal([]byte(raw), &rs))
					require.Equal(t, int64(1), rs.CursorRevision, "the rewind was taken: %s", raw)
					require.GreaterOrEqual(t, rs.ProcessedThrough, head, "the runtime state's cursor is where describe showed it: %s", raw)
				}

				require.Zero(t, replayCalls.Load(), "the replay dialed the vendor")
				require.Equal(t, before, counts(), "the replay appended events of the agent's (%v)", agentTypes)
				got, err := client.Snapshot(ctx, proc)
				require.NoError(t, err)
				require.JSONEq(t, live.State, got.State, "the replayed state is the live one")
				errs, err := client.ReadAll(ctx, s, itx.Query{Types: []string{itx.TypeErrorOccurred}})
				require.NoError(t, err)
				require.Empty(t, errs, "the replay recorded errors")
			})
		}
	}
}
