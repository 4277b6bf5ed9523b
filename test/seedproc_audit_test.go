package test

import (
	"encoding/json"
	"testing"

	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Seed 002: "Consumes-filtered wake frames get a trailing unfiltered self-pull so an omitted or
// unconsumed raw tail cannot strand state-derived work." The agent's hesitation window ends with
// agent/hesitation-elapsed, an event it does not consume: its request is started only by the
// pass at the head that follows that event. With the subscription filtered to exactly the
// agent's consumed types, the event never reaches a wake frame, and the agent must still request
// and settle the message, over real RPC against itxd.
func TestSeedProc_FilteredTailDoesNotStrandStateDerivedWork(t *testing.T) {
	for _, remote := range []bool{false, true} {
		for _, filtered := range []bool{false, true} {
			name := "in-process"
			if remote {
				name = "remote"
			}
			if filtered {
				name += " filtered to the consumed types"
			}
			t.Run(name, func(t *testing.T) {
				cfg := examples.DefaultAgentConfig
				cfg.HesitationMs = 50
				h := processors.NewHost("test")
				require.NoError(t, examples.AddTo(h, []string{"agent"}, examples.HostOptions{Agent: cfg}))
				sc := client.SubscriptionConfig{Name: "agent", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}}
				var ts *testServer
				if remote {
					ts = startServer(t, server.Config{})
					sc.Receiver.Placement = "remote"
				} else {
					ts = startServer(t, server.Config{Processors: h})
				}
				ctx := ctxT(t)
				s := stream(t, ts.project(t), "/seedproc/agent")
				if filtered {
					sc.FilterTypes = []string{
						string(examples.MessageAdded), string(examples.MessageRetracted),
						string(examples.LLMRequested), string(examples.LLMStarted), string(examples.LLMSettled),
					}
				}
				subs := client.Subscriptions(ctx, s)
				defer subs.Release()
				_, _, err := client.ConfigureSubscription(ctx, subs, sc)
				require.NoError(t, err)
				if remote {
					awaitMount(t, runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "worker-1", h))
				}
				mustAppend(t, s, examples.MessageAdded.Input(examples.Message{Text: "hello"}, ""))

				// Not settled within the wait: the request was stranded behind the unconsumed tail.
				e := waitForType(t, s, string(examples.LLMSettled))
				var settled examples.LLMSettlement
				require.NoError(t, json.Unmarshal(e.Payload, &settled))
				require.Equal(t, examples.ResultSuccess, settled.Result.Kind)
				require.Equal(t, 1, countType(t, s, string(examples.LLMSettled)))
			})
		}
	}
}

// Seed 002: processors never see ephemeral events, live or on a replay. A guestbook hosted in
// itxd reduces only the durable signatures, and a rewind (an operator's reprocessFrom through
// the cursor-set) re-reduces to the same state.
func TestSeedProc_EphemeralEventsNeverReachAProcessor(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "guestbook")})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/seedproc/guestbook")
	configureProcessor(t, s, "guestbook")
	durable := examples.GuestbookSigned.Input(examples.Signed{Name: "ada", Message: "durable"}, "")
	transient := examples.GuestbookSigned.Input(examples.Signed{Name: "bob", Message: "ephemeral"}, "")
	transient.Ephemeral = true
	mustAppend(t, s, durable)
	mustAppend(t, s, transient)
	head := mustAppend(t, s, examples.GuestbookSigned.Input(examples.Signed{Name: "cy", Message: "durable"}, "")).HeadOffset
	sub, proc := processorOf(t, s, "guestbook")
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	snap, err := client.Snapshot(ctx, proc)
	require.NoError(t, err)
	require.NotContains(t, snap.State, "bob", "the ephemeral signature was reduced")
	require.JSONEq(t, guestbookFold(t, s), snap.State)

	// A rewind to the start re-reduces the stream: still no ephemeral event.
	_, err = client.SetSubscriptionCursor(ctx, s, "guestbook", 0)
	require.NoError(t, err)
	head = mustAppend(t, s, ev("unrelated/noise", `{}`)).HeadOffset
	_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	snap, err = client.Snapshot(ctx, proc)
	require.NoError(t, err)
	require.NotContains(t, snap.State, "bob", "the ephemeral signature was reduced on the replay")
	require.JSONEq(t, guestbookFold(t, s), snap.State)
}

// Seed 000 on a processor-wake row under a filter: the cursor is a watermark, so
// waitUntilProcessed resolves for an offset the processor never saw (a non-matching tail).
func TestSeedProc_WaitUntilProcessedPassesAFilteredTail(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "guestbook")})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/seedproc/filtered-guestbook")
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{
		Name: "guestbook", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake},
		FilterTypes: []string{string(examples.GuestbookSigned)},
	})
	require.NoError(t, err)
	mustAppend(t, s, examples.GuestbookSigned.Input(examples.Signed{Name: "ada", Message: "hi"}, ""))
	head := mustAppend(t, s, ev("unrelated/noise", `{}`), ev("unrelated/noise", `{}`)).HeadOffset
	sub, proc := processorOf(t, s, "guestbook")
	processed, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	require.GreaterOrEqual(t, processed, head)
	snap, err := client.Snapshot(ctx, proc)
	require.NoError(t, err)
	require.JSONEq(t, guestbookFold(t, s), snap.State)
	d, err := client.DescribeSubscription(ctx, sub)
	require.NoError(t, err)
	require.Equal(t, head, d.ConfirmedOffset, "the watermark passes the filtered tail")
}
