package test

import (
	"encoding/json"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A transform's result replaces the type, payload and metadata it names; what it leaves out stays
// as the event had it (README): a transform building only type and payload passes the event's
// metadata on, and "metadata": {} is how one keeps it back. Offset, createdAt and key are the
// event's.
func TestWebhookTransform_KeysLeftOutStay(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := newHook(t, nil)
	s := stream(t, e.p, "/transform")
	kept, _ := e.configure(t, s, client.SubscriptionConfig{Name: "kept", Start: "now", FilterTypes: []string{"t"},
		Transform: `{"type": "shaped", "payload": {"n2": payload.n * 2}}`,
		Receiver:  client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	h2 := newHook(t, nil)
	dropped, _ := e.configure(t, s, client.SubscriptionConfig{Name: "dropped", Start: "now", FilterTypes: []string{"t"},
		Transform: `{"type": "shaped", "payload": {"n2": payload.n * 2}, "metadata": {}}`,
		Receiver:  client.Receiver{Kind: client.ReceiverWebhookPost, URL: h2.url()}})
	in := keyed("t", `{"n":5}`, "k")
	in.Metadata = json.RawMessage(`{"tenant":"acme"}`)
	res := mustAppend(t, s, in)
	e.waitProcessed(t, s, kept, res.HeadOffset)
	e.waitProcessed(t, s, dropped, res.HeadOffset)

	want := itx.Event{Offset: res.HeadOffset, Type: "shaped", Payload: json.RawMessage(`{"n2":10}`),
		CreatedAt: e.clock.Now().UnixMilli(), IdempotencyKey: "k", Metadata: json.RawMessage(`{"tenant":"acme"}`)}
	h.mu.Lock()
	require.Len(t, h.bodies, 1)
	require.Equal(t, want, h.bodies[0].Event)
	h.mu.Unlock()
	want.Metadata = json.RawMessage(`{}`)
	h2.mu.Lock()
	require.Len(t, h2.bodies, 1)
	require.Equal(t, want, h2.bodies[0].Event)
	h2.mu.Unlock()
}
