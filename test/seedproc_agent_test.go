package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// recordingVendor is a real HTTP vendor: it records each request id it is asked to complete and
// answers "re: <prompt>", once hold (when set) is closed.
type recordingVendor struct {
	mu     sync.Mutex
	ids    []string
	hold   chan struct{}
	called chan string
}

func (v *recordingVendor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct{ RequestID, Prompt string }
	_ = json.NewDecoder(r.Body).Decode(&req)
	v.mu.Lock()
	v.ids = append(v.ids, req.RequestID)
	hold := v.hold
	v.mu.Unlock()
	select {
	case v.called <- req.RequestID:
	default:
	}
	if hold != nil {
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
	}
	_ = json.NewEncoder(w).Encode(map[string]string{"text": "re: " + req.Prompt})
}

func (v *recordingVendor) calls() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.ids...)
}

// onlySettlement waits for a settlement on s and checks it is the only one, of request id.
func onlySettlement(t *testing.T, s schema.Stream, id string) examples.Result {
	t.Helper()
	e := waitForType(t, s, string(examples.LLMSettled))
	var got examples.LLMSettlement
	require.NoError(t, json.Unmarshal(e.Payload, &got))
	require.Equal(t, id, got.RequestID)
	require.Equal(t, 1, countType(t, s, string(examples.LLMSettled)))
	return got.Result
}

// Seed 002's required scenarios for an obligation-carrying processor, over real RPC against
// itxd hosting the reference agent with a real HTTP vendor. An obligation is opened by appending
// its requested fact directly (a requester's append: no attempt of the agent ran for it):
//   - past its expiresAt: settled as an expired failure, the vendor never dialed;
//   - within it: provably never ran, so it starts late: started once, dialed once, settled;
//   - a message retracted while its request's attempt waits on the vendor: the request settles
//     as a cancellation, once, and the vendor's late answer changes nothing.
func TestSeedProc_AgentObligationsOverRPC(t *testing.T) {
	vendor := &recordingVendor{called: make(chan string, 8)}
	srv := httptest.NewServer(vendor)
	t.Cleanup(srv.Close)
	agentCfg := examples.DefaultAgentConfig
	agentCfg.HesitationMs = 0
	host := processors.NewHost("test")
	require.NoError(t, examples.AddTo(host, []string{"agent"}, examples.HostOptions{
		Vendor: examples.HTTPVendor{URL: srv.URL}, Agent: agentCfg}))
	ts := startServer(t, server.Config{Processors: host})
	ctx := ctxT(t)
	request := func(id string, expiresAt time.Time) itx.EventInput {
		return examples.LLMRequested.Input(examples.LLMRequest{RequestID: id, Prompt: "late", ExpiresAt: expiresAt.UnixMilli()},
			"agent/llm-request-requested@"+id)
	}

	t.Run("an expired obligation is settled without dialing", func(t *testing.T) {
		s := stream(t, ts.project(t), "/seedproc/agent-expired")
		configureProcessor(t, s, "agent")
		mustAppend(t, s, request("old-1", time.Now().Add(-time.Minute)))
		res := onlySettlement(t, s, "old-1")
		require.Equal(t, examples.ResultFailure, res.Kind)
		require.Equal(t, examples.ReasonExpired, res.Reason)
		require.Zero(t, countType(t, s, string(examples.LLMStarted)))
		require.NotContains(t, vendor.calls(), "old-1")
	})
	t.Run("an obligation no attempt ran starts late", func(t *testing.T) {
		s := stream(t, ts.project(t), "/seedproc/agent-late")
		configureProcessor(t, s, "agent")
		mustAppend(t, s, request("late-1", time.Now().Add(time.Hour)))
		res := onlySettlement(t, s, "late-1")
		require.Equal(t, examples.ResultSuccess, res.Kind, "%+v", res)
		require.Equal(t, "re: late", res.Text)
		require.Equal(t, 1, countType(t, s, string(examples.LLMStarted)))
		n := 0
		for _, id := range vendor.calls() {
			if id == "late-1" {
				n++
			}
		}
		require.Equal(t, 1, n, "vendor calls for late-1")
	})
	t.Run("a retraction cancels the request in flight", func(t *testing.T) {
		hold := make(chan struct{})
		vendor.mu.Lock()
		vendor.hold = hold
		vendor.mu.Unlock()
		defer func() {
			vendor.mu.Lock()
			vendor.hold = nil
			vendor.mu.Unlock()
		}()
		s := stream(t, ts.project(t), "/seedproc/agent-retracted")
		configureProcessor(t, s, "agent")
		for len(vendor.called) > 0 {
			<-vendor.called
		}
		added := mustAppend(t, s, examples.MessageAdded.Input(examples.Message{Text: "never mind"}, "")).Offsets[0]
		select {
		case <-vendor.called:
		case <-ctx.Done():
			t.Fatal("the agent never dialed the vendor")
		}
		mustAppend(t, s, examples.MessageRetracted.Input(examples.MessageRef{MessageOffset: added}, ""))
		res := onlySettlement(t, s, fmt.Sprintf("msg-%d", added))
		require.Equal(t, examples.ResultCancellation, res.Kind, "%+v", res)
		close(hold) // the vendor answers now: too late
		head := mustAppend(t, s, ev("agent/marker", `{}`)).HeadOffset
		sub := client.Subscription(ctx, s, "agent")
		defer sub.Release()
		_, err := client.WaitUntilProcessed(ctx, sub, head, 20*time.Second)
		require.NoError(t, err)
		require.Equal(t, 1, countType(t, s, string(examples.LLMSettled)))
		_, proc := processorOf(t, s, "agent")
		snap, err := client.Snapshot(ctx, proc)
		require.NoError(t, err)
		var st examples.AgentState
		require.NoError(t, json.Unmarshal([]byte(snap.State), &st))
		require.Len(t, st.Requests, 1)
		require.Equal(t, examples.ResultCancellation, st.Requests[0].Result.Kind)
	})
}
