package test

import (
	"testing"

	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Removing an in-process processor and configuring it again (separate commits) leaves nothing of
// the removed one reachable once the configure answered: snapshot and getRuntimeState answer for
// the new processor, even while the removed runner's stop (which the server runs off the actor)
// has not happened yet.
func TestProcessorView_RemovedRunnerUnreachableAfterConfigure(t *testing.T) {
	host := newGatedHost(referenceHost(t, "guestbook"))
	ts := startServer(t, server.Config{Processors: host})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/procview/remove-configure")
	configureProcessor(t, s, "guestbook")
	head := signGuestbook(t, s, 3)
	sub, proc := processorOf(t, s, "guestbook")
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	require.Equal(t, int64(1), runtimeOf(t, proc).Generation)

	// The removed runner's stop is held (the server runs it off the actor, so it may land late),
	// and so is every frame (so no wake of the new subscription gets the removed runner fenced by
	// a refused commit meanwhile).
	entered, disarm, release := host.holdStops(t)
	host.holdDelivers(t)
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, err = client.RemoveSubscription(ctx, subs, "guestbook")
	require.NoError(t, err)
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("the removed runner was never stopped")
	}
	configureProcessor(t, s, "guestbook")
	disarm() // the removal's stop stays held; a stop called from here on is not

	_, proc2 := processorOf(t, s, "guestbook")
	snap, err := client.Snapshot(ctx, proc2)
	require.NoError(t, err)
	require.Equal(t, int64(0), snap.ProcessedOffset, "snapshot reached the removed processor's runner")
	require.JSONEq(t, `{"count":0,"recent":null}`, snap.State)
	rs := runtimeOf(t, proc2)
	require.Greater(t, rs.Generation, int64(2), "a fresh runner claimed the record the removal fenced (generation %d)", rs.Generation)
	release()
}
