package test

import (
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// maxLagOf is the largest lag subscriptions.list shows for a stream: its subscriptions' and its
// registered readers'. Streams.list and describe must agree with it.
func maxLagOf(t *testing.T, s schema.Stream) int64 {
	t.Helper()
	ctx := ctxT(t)
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	list, err := client.ListSubscriptions(ctx, subs)
	require.NoError(t, err)
	var most int64
	for _, sum := range list {
		most = max(most, sum.Lag)
	}
	return most
}

func listedStream(t *testing.T, p schema.Project, path string) itx.StreamInfo {
	t.Helper()
	list, err := client.ListStreams(ctxT(t), p, path)
	require.NoError(t, err)
	require.Len(t, list, 1)
	return list[0]
}

func registerReader(t *testing.T, s schema.Stream, name string, checkpoint int64) {
	t.Helper()
	ctx := ctxT(t)
	rf, release := s.Readers(ctx, nil)
	defer release()
	require.NoError(t, client.RegisterReader(ctx, rf.Readers(), name, checkpoint))
}

// Streams.list and describe say where a stream's consumers stand: how many subscriptions the
// ladder halted and the largest lag of a subscription or registered reader, the same figure
// subscriptions.list shows. A stream that unloads keeps both in its directory summary, so the
// list shows them without loading it.
func TestStreams_ListShowsWhereConsumersStand(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/standing")
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))
	// Halts at its first wake: no processor is registered under this name.
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "no-such-contract", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}})
	waitUntil(t, "halted", func() bool { return e.describe(t, s, name).Status == "halted" })
	registerReader(t, s, "mirror", 1)
	// Parked at its first delivery: no capability is mounted under this name.
	parked, _ := e.configure(t, s, client.SubscriptionConfig{Name: "absent", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "nobody-mounted"}})
	mustAppend(t, s, ev("a", `{}`))
	waitUntil(t, "parked", func() bool { return e.describe(t, s, parked).Status == itx.StatusParked })

	want := maxLagOf(t, s)
	head, err := client.Describe(e.ctx, s)
	require.NoError(t, err)
	require.GreaterOrEqual(t, want, head.HeadOffset-1, "at least the reader at 1 lags")
	require.Equal(t, 2, head.SubscriptionCount)
	require.Equal(t, 1, head.HaltedSubscriptions)
	require.Equal(t, 1, head.ParkedSubscriptions)
	require.Equal(t, want, head.MaxLag)
	require.Equal(t, 1, head.Readers)

	got := listedStream(t, e.p, "/standing")
	require.True(t, got.Loaded)
	require.Equal(t, 1, got.HaltedSubscriptions)
	require.Equal(t, 1, got.ParkedSubscriptions)
	require.Equal(t, want, got.MaxLag)
	require.Equal(t, 1, got.Readers)

	s.Release()
	e.unloadAll(t)
	got = listedStream(t, e.p, "/standing")
	require.False(t, got.Loaded, "listed from the directory's summary")
	require.Equal(t, head.HeadOffset, got.HeadOffset)
	require.Equal(t, 1, got.HaltedSubscriptions)
	require.Equal(t, 1, got.ParkedSubscriptions, "parked subscriptions counted in the summary")
	require.Equal(t, want, got.MaxLag)
	require.Equal(t, 1, got.Readers, "readers counted in the summary")

	quiet := stream(t, e.p, "/standing-quiet")
	mustAppend(t, quiet, ev("a", `{}`))
	got = listedStream(t, e.p, "/standing-quiet")
	require.Zero(t, got.HaltedSubscriptions)
	require.Zero(t, got.ParkedSubscriptions)
	require.Zero(t, got.MaxLag, "no consumers: nothing lags")
	require.Zero(t, got.Readers)

	// A reader at the head lags by nothing, and is still counted: it is a consumer.
	registerReader(t, quiet, "caught-up", 1)
	require.Equal(t, 1, listedStream(t, e.p, "/standing-quiet").Readers)
	quiet.Release()
	e.unloadAll(t)
	got = listedStream(t, e.p, "/standing-quiet")
	require.False(t, got.Loaded)
	require.Zero(t, got.MaxLag)
	require.Equal(t, 1, got.Readers)
}

// After a kill -9 the summary of a stream that was loaded and written is stale; the restarted
// itxd refreshes it from the stream's own database, consumers' standing included.
func TestStreams_StandingSurvivesAKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	ctx := ctxT(t)
	proc := startItxd(t, dataDir)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	s := client.Stream(ctx, p, "/standing/crash")
	for range 5 {
		_, err := client.Append(ctx, s, []itx.EventInput{ev("a", `{}`)}, itx.AppendOptions{})
		require.NoError(t, err)
	}
	registerReader(t, s, "laggard", 2)
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.Equal(t, int64(3), info.MaxLag)
	s.Release()
	p.Release()

	proc.kill9(t)
	proc = startItxd(t, dataDir)
	p = dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	defer p.Release()
	got := listedStream(t, p, "/standing/crash")
	require.False(t, got.Loaded)
	require.Equal(t, int64(5), got.HeadOffset)
	require.Equal(t, int64(3), got.MaxLag, "refreshed from the stream's database after the crash")
	require.Equal(t, 1, got.Readers)
	require.Zero(t, got.HaltedSubscriptions)

	// A commit without events (the reader moving) marks the summary stale too: after another
	// crash the list shows where the reader stands now, not where it stood at the last refresh.
	s = client.Stream(ctx, p, "/standing/crash")
	registerReader(t, s, "laggard", 4)
	s.Release()
	proc.kill9(t)
	proc = startItxd(t, dataDir)
	p2 := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	defer p2.Release()
	got = listedStream(t, p2, "/standing/crash")
	require.False(t, got.Loaded)
	require.Equal(t, int64(1), got.MaxLag, "the reader's move reached the summary")
}
