package test

import (
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/stretchr/testify/require"
)

// The per-stream bounds whose flags came last hold on a real itxd given them: one subscription
// more than --max-subscriptions-per-stream, a processor KV put past --max-processor-kv-keys or
// --max-processor-kv-bytes (each refused limitExceeded, naming its flag, writing nothing), and
// ephemeral events past --max-ephemeral-bytes-per-stream evicting the oldest.
func TestItxd_PerStreamBoundFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	p := startItxd(t, t.TempDir(), "--max-subscriptions-per-stream", "1", "--max-processor-kv-keys", "2",
		"--max-processor-kv-bytes", "40", "--max-ephemeral-bytes-per-stream", "500")
	ctx := ctxT(t)
	project := dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
	s := stream(t, project, "/flag-bounds")

	// One subscription: a remote forwarder, whose host's ports write the KV below.
	configureRemote(t, s, "forwarder")
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "second",
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/elsewhere"}})
	requireCode(t, err, itx.ELimitExceeded)
	require.Contains(t, err.Error(), "--max-subscriptions-per-stream")
	list, err := client.ListSubscriptions(ctx, subs)
	require.NoError(t, err)
	require.Len(t, list, 1, "the refused subscription is not kept")

	spy := &spyHost{woken: make(chan struct{})}
	host := dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
	h, err := mountHostServing(ctx, host, "spy", spy, []itx.ProcessorInfo{{Name: "forwarder", ReducerVersion: "1", ConsumedTypes: []string{string(examples.InboxMessage)}}})
	require.NoError(t, err)
	t.Cleanup(h.Release)
	mustAppend(t, s, ev(string(examples.InboxMessage), `{"n":0}`))
	put := spyKVPut(t, spy)
	require.NoError(t, put("a", 10))
	err = put("b", 40) // 1+10 + 1+40 > 40
	requireCode(t, err, itx.ELimitExceeded)
	require.Contains(t, err.Error(), "--max-processor-kv-bytes")
	require.NoError(t, put("b", 10))
	err = put("c", 0)
	requireCode(t, err, itx.ELimitExceeded)
	require.Contains(t, err.Error(), "--max-processor-kv-keys")

	// Ephemeral events of 100 bytes each (type and payload): at most 5 are kept, the newest.
	chunk := ev("chunk", `{"t":"`+strings.Repeat("x", 87)+`"}`)
	chunk.Ephemeral = true
	require.Equal(t, 100, len(chunk.Type)+len(chunk.Payload))
	var last int64
	for range 12 {
		last = mustAppend(t, s, chunk).Offsets[0]
	}
	all, err := client.ReadAll(ctx, s, itx.Query{IncludeEphemeral: true, Types: []string{"chunk"}})
	require.NoError(t, err)
	require.NotEmpty(t, all)
	require.LessOrEqual(t, len(all), 5, "the buffer holds at most 500 bytes")
	require.Equal(t, last, all[len(all)-1].Offset, "the newest is kept")
}

// --jsonata-max-steps (and its siblings) set one evaluation's budget in a real itxd: a condition
// the default lets through is refused past it, naming the flag; a light one still matches.
func TestItxd_JSONataBudgetFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	p := startItxd(t, t.TempDir(), "--jsonata-max-steps", "100")
	ctx := ctxT(t)
	s := stream(t, dial(t, p.addr).Login(ctx, p.creds.ProjectToken), "/jsonata-budget")
	mustAppend(t, s, ev("a", `{"n":1}`))
	_, err := client.WaitForEvent(ctx, s, itx.Predicate{Where: `$count($map([1..2000], function($v){$v + 1})) > 0`}, 0, time.Second)
	requireCode(t, err, itx.EInvalid)
	require.Contains(t, err.Error(), "step limit of 100 (--jsonata-max-steps)")
	e, err := client.WaitForEvent(ctx, s, itx.Predicate{Where: `payload.n = 1`}, 0, time.Second)
	require.NoError(t, err)
	require.Equal(t, int64(1), e.Offset)
}

// --rpc-max-logins-per-connection bounds the distinct tokens one connection of a real itxd logs
// in with, naming the flag; --rpc-max-push-bytes below a batch's size still delivers every
// batch, each alone.
func TestItxd_ConnectionFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	p := startItxd(t, t.TempDir(), "--rpc-max-logins-per-connection", "1", "--rpc-max-push-bytes", "1024", "--max-live", "1")
	ctx := ctxT(t)
	conn := dial(t, p.addr)
	project := conn.Login(ctx, p.creds.ProjectToken)
	_, err := client.DescribeProject(ctx, project)
	require.NoError(t, err)
	_, err = client.DescribeProject(ctx, conn.Login(ctx, p.creds.DeploymentToken))
	requireCode(t, err, itx.ELimitExceeded)
	require.Contains(t, err.Error(), "--rpc-max-logins-per-connection")
	_, err = client.DescribeProject(ctx, conn.Login(ctx, p.creds.ProjectToken))
	require.NoError(t, err, "the token already logged in still logs in")
	_, err = client.DescribeProject(ctx, dial(t, p.addr).Login(ctx, p.creds.DeploymentToken))
	require.NoError(t, err, "on another connection")

	s := stream(t, project, "/push-bytes")
	big := ev("big", `{"t":"`+strings.Repeat("x", 2000)+`"}`)
	var want []int64
	for range 20 {
		want = append(want, mustAppend(t, s, big).Offsets[0])
	}
	sink := newTestSink()
	c, err := openConn(t, s, connOpts{noState: true, maxEvents: 2}, sink)
	require.NoError(t, err)
	defer c.Release()
	waitUntil(t, "every event delivered", func() bool { return len(sink.offsets()) == len(want) })
	require.Equal(t, want, sink.offsets())

	// --max-live 1: the connection above is the one itxd holds open, whichever login asks.
	other := stream(t, dial(t, p.addr).Login(ctx, p.creds.ProjectToken), "/push-bytes")
	_, err = openConn(t, other, connOpts{noState: true}, newTestSink())
	requireCode(t, err, itx.ELimitExceeded)
	require.Contains(t, err.Error(), "--max-live")
}
