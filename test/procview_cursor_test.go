package test

import (
	"encoding/json"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// setSubscriptionCursor on a processor is read-your-writes for its processor: once it answered,
// snapshot and getRuntimeState show the rewind taken (processed and reduced through the cursor
// set, the state folded through it), not the progress from before it, even when no wake comes
// to take it (the subscription is halted: a seek does not resume it).
func TestProcessorView_SnapshotAfterSetCursorShowsTheRewind(t *testing.T) {
	host := newGatedHost(referenceHost(t, "guestbook"))
	ts := startServer(t, server.Config{Processors: host})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/procview/set-cursor")
	configureProcessor(t, s, "guestbook")
	head := signGuestbook(t, s, 3)
	sub, proc := processorOf(t, s, "guestbook")
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)

	// Halt the subscription: its next wake finds no contract (a deploy without it).
	host.setRefuse(true)
	signGuestbook(t, s, 1)
	waitUntil(t, "halted", func() bool {
		d, err := client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		return d.Status == itx.StatusHalted
	})
	host.setRefuse(false)

	// Rewind to after the first signature.
	first := head - 2
	_, err = client.SetSubscriptionCursor(ctx, s, "guestbook", first)
	require.NoError(t, err)
	d, err := client.DescribeSubscription(ctx, sub)
	require.NoError(t, err)
	require.Equal(t, first, d.ConfirmedOffset)
	require.Equal(t, itx.StatusHalted, d.Status, "a seek does not resume")

	snap, err := client.Snapshot(ctx, proc)
	require.NoError(t, err)
	require.Equal(t, first, snap.ProcessedOffset, "snapshot after setSubscriptionCursor answered")
	require.Equal(t, first, snap.ReducedOffset)
	var st examples.GuestbookState
	require.NoError(t, json.Unmarshal([]byte(snap.State), &st))
	require.Equal(t, 1, st.Count, "the state folded through the cursor set")
	rs := runtimeOf(t, proc)
	require.Equal(t, first, rs.ProcessedThrough)
	require.Equal(t, int64(1), rs.CursorRevision, "one rewind taken")

	// Resumed, it reprocesses from there once (no second rewind), through the head.
	at, err := client.ResumeSubscription(ctx, s, "guestbook")
	require.NoError(t, err)
	_, err = client.WaitUntilProcessed(ctx, sub, at, 0)
	require.NoError(t, err)
	waitUntil(t, "reprocessed through the resume", func() bool { return runtimeOf(t, proc).ProcessedThrough >= at })
	require.Equal(t, int64(1), runtimeOf(t, proc).CursorRevision, "the wake did not rewind again")
	snap, err = client.Snapshot(ctx, proc)
	require.NoError(t, err)
	require.JSONEq(t, guestbookFold(t, s), snap.State)
}
