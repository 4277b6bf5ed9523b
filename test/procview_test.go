package test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

func signGuestbook(t *testing.T, s schema.Stream, n int) int64 {
	t.Helper()
	var head int64
	for i := range n {
		head = mustAppend(t, s, examples.GuestbookSigned.Input(examples.Signed{Name: fmt.Sprintf("guest-%d", i), Message: "hi"}, "")).HeadOffset
	}
	return head
}

func runtimeOf(t *testing.T, proc schema.Processor) itx.ProcessorRuntimeState {
	t.Helper()
	rs, err := client.RuntimeState(ctxT(t), proc)
	require.NoError(t, err)
	var r itx.ProcessorRuntimeState
	require.NoError(t, json.Unmarshal([]byte(rs), &r))
	return r
}

func watchProcessor(t *testing.T, proc schema.Processor) *liveView {
	t.Helper()
	view := &liveView{}
	fut, release := proc.LiveState(ctxT(t), func(p schema.Processor_liveState_Params) error {
		return p.SetSubscriber(schema.LiveSubscriber_ServerToClient(view))
	})
	res, err := fut.Struct()
	require.NoError(t, err)
	h := res.Handle().AddRef()
	release()
	t.Cleanup(h.Release)
	waitUntil(t, "the processor's first snapshot", func() bool { rev, _ := view.state(); return rev > 0 })
	return view
}

// A processor's live view watches one processor: when its subscription is removed it hears
// closed(subscriptionRemoved), also when the same commit configures a subscription anew under the
// name (a raw append of subscriptionRemoved and subscriptionConfigured): that is a new processor,
// starting over from its own records, not the one the view was watching. A view asked for once
// the append answered watches the new one.
func TestProcessorView_RemovedAndConfiguredInOneCommitEndsTheView(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "guestbook")})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/procview/one-commit")
	configureProcessor(t, s, "guestbook")
	head := signGuestbook(t, s, 3)
	sub, proc := processorOf(t, s, "guestbook")
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	old := watchProcessor(t, proc)
	waitUntil(t, "the view shows the processor caught up", func() bool {
		_, doc := old.state()
		return doc["processedOffset"] == float64(head)
	})

	res := mustAppend(t, s,
		itx.EventInput{Type: itx.TypeSubscriptionRemoved, Payload: []byte(`{"name":"guestbook","reason":"requested"}`)},
		itx.EventInput{Type: itx.TypeSubscriptionConfigured, Payload: []byte(`{"name":"guestbook","receiver":{"action":"processor-wake"}}`)})
	// The new processor starts from offset 0 and processes through the new head.
	sub2, proc2 := processorOf(t, s, "guestbook")
	_, err = client.WaitUntilProcessed(ctx, sub2, res.HeadOffset, 0)
	require.NoError(t, err)
	fresh := watchProcessor(t, proc2)
	waitUntil(t, "the old view ended, or went on to show the new processor caught up", func() bool {
		_, ended := old.endedWith()
		_, doc := old.state()
		return ended || doc["processedOffset"] == float64(res.HeadOffset)
	})
	why, ended := old.endedWith()
	require.True(t, ended, "the view of the removed processor was not told it ended: it went on showing the new one (%s)", old.doc)
	require.Equal(t, schema.CloseReason_subscriptionRemoved, why)

	waitUntil(t, "the new view shows the new processor caught up", func() bool {
		_, doc := fresh.state()
		return doc["processedOffset"] == float64(res.HeadOffset)
	})
	_, ended = fresh.endedWith()
	require.False(t, ended, "a view asked for after the append answered watches the new processor")
}
