package server

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
	"github.com/stretchr/testify/require"
)

// A catalog rebuilt from the log (no checkpoint) meets a cursor row an older binary wrote for a
// subscription whose config changed later without a new start: that row kept the birth epoch.
// The load keeps its cursor and moves it to the reconfigure's epoch, instead of taking it for a
// stranger and restarting it from the beginning (a redelivery of everything).
func TestLoadState_RowOfAReconfiguredSubscriptionKeepsItsCursor(t *testing.T) {
	ctx := context.Background()
	store, err := storage.CreateStream(ctx, filepath.Join(t.TempDir(), "s.db"), storage.StreamMeta{StreamID: "sid", ProjectID: "p", Path: "/a", CreatedAt: 1})
	require.NoError(t, err)
	defer store.Close()
	configured := func(offset int64, url string) itx.Event {
		b, err := json.Marshal(map[string]any{"name": "w", "receiver": map[string]any{"action": itx.KindWebhookPost, "url": url}})
		require.NoError(t, err)
		return itx.Event{Offset: offset, Type: itx.TypeSubscriptionConfigured, Payload: b, CreatedAt: 1}
	}
	note := func(offset int64) itx.Event {
		return itx.Event{Offset: offset, Type: "note", Payload: json.RawMessage(`{}`), CreatedAt: 1}
	}
	require.NoError(t, store.Commit(ctx, storage.Commit{
		Events:     []itx.Event{configured(1, "https://a.example/hook"), note(2), note(3), configured(4, "https://b.example/hook")},
		HeadOffset: 4, LastAppendAt: 1,
		CursorUpserts: []storage.CursorRow{{Name: "w", ConfiguredAtOffset: 1, CursorChangedAtOffset: 1, ConfirmedOffset: 3, Status: storage.StatusActive}},
	}))
	rc := reduceContext{path: "/a", maxSubs: itx.MaxSubscriptionsPerStream,
		compile: func(src string) error { _, err := CompileJSONata(src); return err }}
	st, err := loadState(ctx, store, rc, time.Unix(1_700_000_000, 0), nopWarn)
	require.NoError(t, err)
	require.Equal(t, int64(4), st.core.Subscriptions["w"].ConfiguredAtOffset, "the rebuilt catalog: a new epoch at the change")
	r := st.rows["w"]
	require.NotNil(t, r)
	require.Equal(t, int64(3), r.ConfirmedOffset, "the cursor is kept")
	require.Equal(t, int64(4), r.ConfiguredAtOffset)
	require.Equal(t, int64(4), r.CursorChangedAtOffset)
	rows, err := store.CursorRows(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(4), rows[0].ConfiguredAtOffset, "and written back")
}
