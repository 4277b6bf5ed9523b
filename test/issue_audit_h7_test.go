package test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Issue 12 (point 2): start: beginning is the default, and it delivers the whole log from offset 1,
// the stream's own stream/* records included, the subscription's own configured event among them.
// A configure that leaves start out gets the note appended before it, then its own birth, then
// what follows.
func TestIssue12_DefaultStartDeliversTheStreamsOwnRecords(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := newHook(t, nil)
	s := stream(t, e.p, "/audit-h7/default-start")
	first := mustAppend(t, s, ev("note", `{"n":1}`)).HeadOffset
	name, birth := e.configure(t, s, client.SubscriptionConfig{Name: "hook",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	last := mustAppend(t, s, ev("note", `{"n":2}`)).HeadOffset
	e.waitProcessed(t, s, name, last)
	require.Equal(t, []int64{first, birth, last}, h.distinct(), "the whole log from offset 1")
	h.mu.Lock()
	defer h.mu.Unlock()
	var types []string
	seen := map[int64]bool{}
	for _, b := range h.bodies {
		if !seen[b.Event.Offset] {
			seen[b.Event.Offset] = true
			types = append(types, b.Event.Type)
		}
	}
	require.Equal(t, []string{"note", itx.TypeSubscriptionConfigured, "note"}, types,
		"the subscription's own configured event is delivered to it")
}

// Issue 10 (point 3): each restart of itxd that loads a stream with processors records one
// stream/woken carrying that incarnation's id: two restarts, two records, two distinct ids.
func TestIssue10_EachRestartRecordsWokenWithItsIncarnation(t *testing.T) {
	dir := t.TempDir()
	host := referenceHost(t, "guestbook")
	cfg := server.Config{DataDir: dir, Processors: host}
	ts := startServer(t, cfg)
	ctx := ctxT(t)
	const path = "/audit-h7/woken"
	configureProcessor(t, stream(t, ts.project(t), path), "guestbook")
	for range 2 {
		closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		require.NoError(t, ts.srv.Close(closeCtx))
		cancel()
		ts = startServer(t, cfg)
		s := stream(t, ts.project(t), path)
		head := mustAppend(t, s, examples.GuestbookSigned.Input(examples.Signed{Name: "a"}, "")).HeadOffset
		sub, _ := processorOf(t, s, "guestbook")
		_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
		require.NoError(t, err)
	}
	events, err := client.ReadAll(ctx, stream(t, ts.project(t), path), itx.Query{Types: []string{itx.TypeWoken}})
	require.NoError(t, err)
	require.Len(t, events, 2, "one stream/woken for each of the two restarts")
	ids := map[string]bool{}
	for _, e := range events {
		var p struct {
			IncarnationID string `json:"incarnationId"`
		}
		require.NoError(t, json.Unmarshal(e.Payload, &p))
		require.NotEmpty(t, p.IncarnationID, "stream/woken names its incarnation: %s", e.Payload)
		ids[p.IncarnationID] = true
	}
	require.Len(t, ids, 2, "each restart is its own incarnation")
}
