package test

import (
	"database/sql"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Black-box tests of seed 000's subscription sections (the cursor row, barriers, statuses,
// receiver kinds) over real RPC against a real itxd, kept only where no other test covers the
// behaviour.

// waitUntilProcessed answers with the confirmed cursor, the column the seed says the far side
// durably claims through: once answered, it is on disk. Delivery progress alone is written
// lazily (CursorFlushDelay), so the barrier used to answer with a cursor only memory held, and a
// kill -9 right after it brought back an older one (seen: the barrier said 3, the restarted
// itxd 1). Read here from the stream's SQLite file while itxd holds the progress in memory for
// an hour: for a delivered event, and for a filter's watermark over events it passes.
func TestBlackboxSubscriptions_BarrierAnswersAWrittenCursor(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, server.Config{DataDir: dir, CursorFlushDelay: time.Hour})
	ctx := ctxT(t)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(hook.Close)
	s := stream(t, ts.project(t), "/barrier/written")
	subs := client.Subscriptions(ctx, s)
	t.Cleanup(subs.Release)
	for _, cfg := range []client.SubscriptionConfig{
		{Name: "hook", Start: "now", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: hook.URL}},
		{Name: "none", Start: "now", FilterTypes: []string{"never"}, Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: hook.URL}},
	} {
		_, _, err := client.ConfigureSubscription(ctx, subs, cfg)
		require.NoError(t, err)
	}
	res := mustAppend(t, s, ev("job", `{}`), ev("job", `{}`))
	files := itxtest.StreamDatabases(t, dir)
	require.Len(t, files, 1)
	for _, name := range []string{"hook", "none"} {
		sub := client.Subscription(ctx, s, name)
		confirmed, err := client.WaitUntilProcessed(ctx, sub, res.HeadOffset, 10*time.Second)
		sub.Release()
		require.NoError(t, err, name)
		require.GreaterOrEqual(t, confirmed, res.HeadOffset, name)
		db, err := sql.Open("sqlite3", "file:"+filepath.Join(dir, "streams", files[0])+"?mode=ro&_busy_timeout=10000")
		require.NoError(t, err)
		var written int64
		err = db.QueryRow(`select confirmed_offset from subscription_cursors where name = ?`, name).Scan(&written)
		db.Close()
		require.NoError(t, err, name)
		require.GreaterOrEqual(t, written, confirmed, "%s: the barrier answered a cursor that is not on disk", name)
	}
}
