package server

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/storage"
	"github.com/stretchr/testify/require"
)

// saturateJSONata takes every evaluation slot and fills the waiting room, as a server overloaded
// with evaluations is, until the test ends: every evaluation is then refused as busy.
func saturateJSONata(t *testing.T) {
	slots := jsonataSlots
	for range slots.size {
		require.NoError(t, slots.acquire("saturating"))
	}
	jsonataWaiting.Add(maxJSONataWaiting)
	t.Cleanup(func() {
		jsonataWaiting.Add(-maxJSONataWaiting)
		for range slots.size {
			slots.release()
		}
	})
}

// A filter or transform the server cannot evaluate now because too many evaluations wait for a
// core is the server's overload, not a verdict on the event: the try is an outage (retried with
// backoff), never the event's failure, so a skip policy cannot skip (and dead-letter) a healthy
// event because the server was busy. It was an expression failure of that event.
func TestDeliverer_JSONataBusyIsAnOutage(t *testing.T) {
	for _, tc := range []struct {
		name   string
		filter *itx.SubscriptionFilter
		shape  string
	}{
		{name: "condition", filter: &itx.SubscriptionFilter{JSONataCondition: "payload.n > 0"}},
		{name: "transform", shape: `{"type": "y", "payload": payload}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			store, err := storage.CreateStream(ctx, filepath.Join(t.TempDir(), "s.db"), storage.StreamMeta{StreamID: "s", ProjectID: "p", Path: "/s", CreatedAt: 1})
			require.NoError(t, err)
			defer store.Close()
			var events []itx.Event
			for i := int64(1); i <= 3; i++ {
				events = append(events, itx.Event{Offset: i, Type: "x", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)), CreatedAt: 1})
			}
			require.NoError(t, store.Commit(ctx, storage.Commit{Events: events, HeadOffset: 3, LastAppendAt: 1}))

			srv := &Server{cfg: Config{DeliveryTimeout: time.Second}, clock: clocktest.New(time.Unix(0, 0)), recv: receivers{mounts: map[mountKey]*mount{}}}
			entry := &catalogEntry{Config: itx.SubscriptionConfig{Name: "w", Filter: tc.filter,
				Receiver: itx.Receiver{Action: itx.KindITXCall, Capability: "x", JSONataTransform: tc.shape}}, ConfiguredAtOffset: 1}
			d := newDeliverer(ctx, srv, StreamRef{ProjectID: "p", Path: "/s"}, entry)
			require.NoError(t, d.buildErr)
			saturateJSONata(t)
			out := d.push(pushJob{name: "w", gen: 1, row: storage.CursorRow{ConfiguredAtOffset: 1, CursorChangedAtOffset: 1}, head: 3, limit: 10, maxBytes: itx.DeliveryBatchBytes}, store, "s")
			require.NotNil(t, out.failure)
			require.Equal(t, classOutage, out.failure.class, "%+v", out.failure)
			require.False(t, out.failure.expression, "no event's evidence: %+v", out.failure)
			require.Zero(t, out.failure.eventOffset, "%+v", out.failure)
			require.Zero(t, out.through, "the cursor stays")
		})
	}
}
