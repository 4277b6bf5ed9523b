package main

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/stretchr/testify/require"
)

// itx tail --reader keeps a registered reader's checkpoint at the last event it printed (each
// second and when it stops), and started again under the name without --from resumes after
// that checkpoint: across the two runs every event prints once, in order. A name a
// subscription holds is refused before anything prints.
func TestMain_TailReaderResumes(t *testing.T) {
	ts := startServer(t)
	appendTypes(t, ts.addr, ts.token, "/r", "a", "b", "c")
	ctx := t.Context()
	s := ts.streamDirect(t, ctx, "/r")
	readers := client.Readers(ctx, s)
	defer readers.Release()
	checkpoint := func() int64 {
		t.Helper()
		list, err := client.ListReaders(ctx, readers)
		require.NoError(t, err)
		for _, r := range list {
			if r.Name == "ship" {
				return r.Checkpoint
			}
		}
		return -1
	}

	first := startItxCommand(t, ts.addr, ts.token, "tail", "/r", "--from", "1", "--reader", "ship", "--json")
	first.wait(t, first.out, `"type":"c"`)
	require.Eventually(t, func() bool { return checkpoint() == 3 }, 10*time.Second, 20*time.Millisecond,
		"the checkpoint follows the last event printed")
	appendTypes(t, ts.addr, ts.token, "/r", "d")
	first.wait(t, first.out, `"type":"d"`)
	first.interrupt(t) // reports 4 on the way out, if the second's tick has not
	require.Equal(t, int64(4), checkpoint(), "where it stopped")

	appendTypes(t, ts.addr, ts.token, "/r", "e")
	_, err := client.Append(ctx, s, []itx.EventInput{{Type: "blip", Ephemeral: true}}, itx.AppendOptions{})
	require.NoError(t, err)
	appendTypes(t, ts.addr, ts.token, "/r", "f")
	second := startItxCommand(t, ts.addr, ts.token, "tail", "/r", "--reader=ship", "--json")
	second.wait(t, second.errs, "reader ship resumes after offset 4")
	second.wait(t, second.out, `"type":"f"`)
	second.interrupt(t)
	require.Equal(t, int64(7), checkpoint())

	var types []string
	for _, e := range tailedEvents(t, first.out.String()+second.out.String(), true) {
		types = append(types, e.Type)
	}
	require.Equal(t, []string{"b", "c", "d", "e", "blip", "f"}, types,
		"each event once, in order, across the two runs; resumed without --from, the ephemeral one after the checkpoint too")

	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "held", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/copy"}})
	require.NoError(t, err)
	refused := startItxCommand(t, ts.addr, ts.token, "tail", "/r", "--reader", "held")
	<-refused.exited
	var exit *exec.ExitError
	require.True(t, errors.As(refused.exitErr, &exit), "exits with an error: %v", refused.exitErr)
	require.Equal(t, 1, exit.ExitCode(), "stderr %q", refused.errs.String())
	require.Contains(t, refused.errs.String(), "held")
	require.Equal(t, 1, strings.Count(refused.errs.String(), "names a subscription"),
		"the refusal is said once, as the error, not also as a checkpoint that did not move: %q", refused.errs.String())
	require.NotContains(t, refused.errs.String(), "checkpoint not moved")
	require.Empty(t, refused.out.String())
}
