package storage

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDirectory_RefreshSummaries(t *testing.T) {
	ctx := context.Background()
	d := mustListDirectory(t, []string{"/a", "/b", "/c"})
	uses := func(streamID string) []string {
		rows, err := d.db.Query(`select ref from secret_uses where stream_id = ? order by ref`, streamID)
		require.NoError(t, err)
		defer rows.Close()
		var refs []string
		for rows.Next() {
			var ref string
			require.NoError(t, rows.Scan(&ref))
			refs = append(refs, ref)
		}
		return refs
	}
	require.NoError(t, d.AddSecretUses(ctx, "p", "p/a", []string{"old", "kept"}))
	for _, id := range []string{"p/a", "p/b", "p/c"} {
		require.NoError(t, d.MarkSummaryStale(ctx, id))
	}

	t.Run("every stream's uses and summary in one commit", func(t *testing.T) {
		before := d.Commits()
		require.NoError(t, d.RefreshSummaries(ctx, []SummaryRefresh{
			{ProjectID: "p", StreamID: "p/a", SecretRefs: []string{"kept", "new"}, Summary: StreamSummary{HeadOffset: 7, Subscriptions: 2}},
			{ProjectID: "p", StreamID: "p/b", Summary: StreamSummary{HeadOffset: 3, Readers: 1}},
		}))
		if got := d.Commits() - before; got != 1 {
			t.Errorf("got %d commits, want 1", got)
		}
		require.Equal(t, []string{"kept", "new"}, uses("p/a"))
		stale, err := d.StaleStreams(ctx)
		require.NoError(t, err)
		var paths []string
		for _, e := range stale {
			if e.ProjectID == "p" {
				paths = append(paths, e.Path)
			}
		}
		require.Equal(t, []string{"/c"}, paths, "the streams of p left stale")
		a, err := d.Stream(ctx, "p", "/a")
		require.NoError(t, err)
		require.Equal(t, int64(7), a.HeadOffset)
		require.Equal(t, 2, a.SubscriptionCount)
		require.True(t, a.Born)
	})

	t.Run("a failure writes nothing", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		require.Error(t, d.RefreshSummaries(cctx, []SummaryRefresh{{ProjectID: "p", StreamID: "p/c", Summary: StreamSummary{HeadOffset: 9}}}))
		c, err := d.Stream(ctx, "p", "/c")
		require.NoError(t, err)
		require.True(t, c.SummaryStale)
		require.Equal(t, int64(0), c.HeadOffset)
	})
}
