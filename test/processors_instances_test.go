package test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// configureInstance configures a processor-wake subscription name running contract.
func configureInstance(t testing.TB, s schema.Stream, name, contract, placement string) {
	t.Helper()
	ctx := ctxT(t)
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{
		Name: name, Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Processor: contract, Placement: placement},
	})
	require.NoError(t, err)
}

// twoGuestbooks runs the guestbook contract under two names on one stream, placed where
// placement says, and checks each instance is a processor of its own: each folds the whole
// stream, and rewinding one leaves the other's cursor and generation alone.
func twoGuestbooks(t *testing.T, ts *testServer, s schema.Stream, placement string) {
	ctx := ctxT(t)
	configureProcessorAt := func(name, contract string) { configureInstance(t, s, name, contract, placement) }
	configureProcessorAt("guestbook", "")
	configureProcessorAt("guestbook-replica", "guestbook")
	var head int64
	for i := range 20 {
		head = mustAppend(t, s, examples.GuestbookSigned.Input(examples.Signed{Name: fmt.Sprintf("g-%d", i), Message: "hi"}, "")).HeadOffset
	}
	want := guestbookFold(t, s)
	for _, name := range []string{"guestbook", "guestbook-replica"} {
		sub, proc := processorOf(t, s, name)
		_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
		require.NoError(t, err, name)
		snap, err := client.Snapshot(ctx, proc)
		require.NoError(t, err, name)
		require.JSONEq(t, want, snap.State, name)
		require.Equal(t, head, snap.ProcessedOffset, name)
		rs, err := client.RuntimeState(ctx, proc)
		require.NoError(t, err, name)
		var runtime struct {
			Name string `json:"name"`
		}
		require.NoError(t, json.Unmarshal([]byte(rs), &runtime))
		require.Equal(t, name, runtime.Name, "the instance runs under its subscription's name")
	}
	sub, _ := processorOf(t, s, "guestbook-replica")
	d, err := client.DescribeSubscription(ctx, sub)
	require.NoError(t, err)
	require.Equal(t, "guestbook", d.Config.Receiver.Processor, "describe shows the contract")

	// Rewind the replica only: it reprocesses; the original's cursor stays where it was.
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, err = client.SetSubscriptionCursor(ctx, s, "guestbook-replica", 0)
	require.NoError(t, err)
	head = mustAppend(t, s, examples.GuestbookSigned.Input(examples.Signed{Name: "late", Message: "hi"}, "")).HeadOffset
	for _, name := range []string{"guestbook", "guestbook-replica"} {
		sub, proc := processorOf(t, s, name)
		_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
		require.NoError(t, err, name)
		snap, err := client.Snapshot(ctx, proc)
		require.NoError(t, err, name)
		require.JSONEq(t, guestbookFold(t, s), snap.State, name)
	}
	list, err := client.ListSubscriptions(ctx, subs)
	require.NoError(t, err)
	for _, row := range list {
		require.Equal(t, itx.StatusActive, row.Status, row.Name)
		require.Equal(t, head, row.ConfirmedOffset, row.Name)
	}
}

// Two instances of one contract under two names (DESIGN "Beyond the seeds"), in itxd.
func TestProcessors_TwoInstancesOfOneContract(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "guestbook")})
	twoGuestbooks(t, ts, stream(t, ts.project(t), "/processors/two"), "")
}

// The same on a remote host: one mounted contract serves both instances.
func TestRemote_TwoInstancesOfOneContract(t *testing.T) {
	ts := startServer(t, server.Config{})
	awaitMount(t, runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "worker", referenceHost(t, "guestbook")))
	twoGuestbooks(t, ts, stream(t, ts.project(t), "/remote/two"), "remote")
}

// A processor field names a registered contract: an unknown one halts at the first wake with
// the registry's error naming the contract; on another receiver kind it is refused.
func TestProcessors_InstanceOfAnUnknownContract(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "guestbook")})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/processors/unknown-contract")
	mustAppend(t, s, ev("a", `{}`))
	configureInstance(t, s, "mine", "no-such-contract", "")
	sub, _ := processorOf(t, s, "mine")
	var d itx.SubscriptionDescription
	waitUntil(t, "halted", func() bool {
		var err error
		d, err = client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		return d.Status == itx.StatusHalted
	})
	require.Equal(t, `itx.notFound: no processor is registered under the name "no-such-contract"`, d.LastError)

	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "hook",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "x", Processor: "guestbook"}})
	requireCode(t, err, itx.EInvalid)
}

// An instance reconfigured to run another contract ends the old runner's incarnation and runs the
// new contract from its processing cursor: events already processed are not processed again, the
// ones after it go to the new contract, and its appends are keyed by the instance.
func TestProcessors_InstanceSwitchesContract(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "guestbook", "forwarder")})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/processors/switch")
	configureInstance(t, s, "worker", "forwarder", "")
	sub, proc := processorOf(t, s, "worker")
	head := mustAppend(t, s, examples.InboxMessage.Input(json.RawMessage(`{"n":1}`), "")).HeadOffset
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	require.Equal(t, 1, countType(t, s, string(examples.OutboxForwarded)))

	configureInstance(t, s, "worker", "guestbook", "")
	head = mustAppend(t, s,
		examples.InboxMessage.Input(json.RawMessage(`{"n":2}`), ""),
		examples.GuestbookSigned.Input(examples.Signed{Name: "ada", Message: "hi"}, "")).HeadOffset
	_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	require.Equal(t, 1, countType(t, s, string(examples.OutboxForwarded)), "the forwarder no longer runs")
	snap, err := client.Snapshot(ctx, proc)
	require.NoError(t, err)
	require.JSONEq(t, guestbookFold(t, s), snap.State, "the guestbook contract reduced the stream")
	require.Equal(t, head, snap.ProcessedOffset)
}

// An instance switched to a contract whose ReducerVersion happens to equal the old one's ("1"
// both) still gets its state re-reduced under the new contract: the record's state is the old
// contract's (a forwarder's count), and decoding it as the new contract's state would drop the
// guestbook signatures the forwarder passed over before the switch.
func TestProcessors_InstanceSwitchesContractReReduces(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "guestbook", "forwarder")})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/processors/switch-rereduce")
	configureInstance(t, s, "worker", "forwarder", "")
	sub, proc := processorOf(t, s, "worker")
	head := mustAppend(t, s,
		examples.GuestbookSigned.Input(examples.Signed{Name: "before", Message: "hi"}, ""),
		examples.InboxMessage.Input(json.RawMessage(`{"n":1}`), "")).HeadOffset
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)

	configureInstance(t, s, "worker", "guestbook", "")
	head = mustAppend(t, s, examples.GuestbookSigned.Input(examples.Signed{Name: "after", Message: "hi"}, "")).HeadOffset
	_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	snap, err := client.Snapshot(ctx, proc)
	require.NoError(t, err)
	require.JSONEq(t, guestbookFold(t, s), snap.State, "the guestbook contract's state covers the signature before the switch")
}

// A replay check over stored history read through itxd: the guestbook's Reduce replays the
// stream without a panic or nondeterminism, appends nothing, and its state equals the live
// processor's snapshot (same reducer version, so a difference would mean Reduce changed
// without a new version).
func TestProcessors_ReplayCheckAgainstStoredHistory(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "guestbook")})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/processors/replay-check")
	configureProcessor(t, s, "guestbook")
	var head int64
	for i := range 25 {
		head = mustAppend(t, s, examples.GuestbookSigned.Input(examples.Signed{Name: fmt.Sprintf("g-%d", i), Message: "hi"}, ""),
			ev("noise", `{}`)).HeadOffset
	}
	sub, proc := processorOf(t, s, "guestbook")
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)

	rep, err := processors.ReplayCheckStream(ctx, examples.Guestbook(), s)
	require.NoError(t, err)
	require.Equal(t, 25, rep.Events)
	require.Equal(t, head, rep.ReducedThrough)
	snap, err := client.Snapshot(ctx, proc)
	require.NoError(t, err)
	require.True(t, rep.SameState(json.RawMessage(snap.State)), "replayed %s, live %s", rep.State, snap.State)
	page, err := client.GetEventPage(ctx, s, itx.Query{After: head})
	require.NoError(t, err)
	require.Empty(t, page.Events, "a replay check appends nothing")
}

// A replay check of a filtered processor reads the stream as its subscription delivers it: the
// live processor never reduced what the filter drops, so a replay of the whole stream differs
// from its snapshot although Reduce did not change, and ReplayCheckSubscription does not.
func TestProcessors_ReplayCheckReadsAsTheSubscription(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "guestbook")})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/processors/replay-check-filtered")
	subs := client.Subscriptions(ctx, s)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "guestbook",
		FilterCondition: `payload.name != "mallory"`,
		Receiver:        client.Receiver{Kind: client.ReceiverProcessorWake}})
	subs.Release()
	require.NoError(t, err)
	var head int64
	for _, who := range []string{"ada", "mallory", "bob", "mallory", "carol"} {
		head = mustAppend(t, s, examples.GuestbookSigned.Input(examples.Signed{Name: who, Message: "hi"}, "")).HeadOffset
	}
	sub, proc := processorOf(t, s, "guestbook")
	_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	snap, err := client.Snapshot(ctx, proc)
	require.NoError(t, err)

	whole, err := processors.ReplayCheckStream(ctx, examples.Guestbook(), s)
	require.NoError(t, err)
	require.Equal(t, 5, whole.Events)
	require.False(t, whole.SameState(json.RawMessage(snap.State)), "the whole stream holds what the filter dropped")

	rep, err := processors.ReplayCheckSubscription(ctx, examples.Guestbook(), s, "guestbook")
	require.NoError(t, err)
	require.Equal(t, 3, rep.Events, "ada, bob and carol pass the filter")
	require.Equal(t, head, rep.ReducedThrough)
	require.True(t, rep.SameState(json.RawMessage(snap.State)), "replayed %s, live %s", rep.State, snap.State)

	_, err = processors.ReplayCheckSubscription(ctx, examples.Guestbook(), s, "nobody")
	requireCode(t, err, itx.ENotFound)
}

// An instance moved from in-process to a remote host and back runs in-process again: the remote
// incarnation's claim fenced the in-process runner of the first placement, which must not be
// reused (every commit of it is refused), so the move back starts a fresh incarnation from the
// committed record.
func TestProcessors_InstanceMovesToARemoteHostAndBack(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "forwarder")})
	awaitMount(t, runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "worker", referenceHost(t, "forwarder")))
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/processors/move")
	sub, _ := processorOf(t, s, "forwarder")
	for i, placement := range []string{"", "remote", ""} {
		configureInstance(t, s, "forwarder", "", placement)
		head := mustAppend(t, s, examples.InboxMessage.Input(json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)), "")).HeadOffset
		_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
		require.NoError(t, err, "placement %q (step %d)", placement, i)
		require.Equal(t, i+1, countType(t, s, string(examples.OutboxForwarded)), "placement %q (step %d)", placement, i)
	}
}

// The same on remote hosts: an instance moved from a contract on one host to a contract on
// another and back is run again by the first host, whose runner of the first contract the second
// host's claim fenced meanwhile: that host starts a fresh incarnation once the fenced one's commit
// is refused, instead of retrying the fenced one for as long as its connection lasts. (The host
// learns of the fence only at that commit, so the fenced runner's one frame may repeat effects
// of events the other contract processed: stable-keyed appends of its own, not asserted here.)
func TestRemote_InstanceMovesToAnotherHostAndBack(t *testing.T) {
	ts := startServer(t, server.Config{})
	awaitMount(t, runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "host-a", referenceHost(t, "forwarder")))
	awaitMount(t, runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "host-b", referenceHost(t, "guestbook")))
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/remote/move")
	sub, _ := processorOf(t, s, "worker")
	for i, contract := range []string{"forwarder", "guestbook", "forwarder"} {
		configureInstance(t, s, "worker", contract, "remote")
		head := mustAppend(t, s, examples.InboxMessage.Input(json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)), "")).HeadOffset
		_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
		require.NoError(t, err, "contract %q (step %d)", contract, i)
	}
}
