package server

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// A deleted project leaves nothing in the shares: its webhook semaphore, its crossing and its
// itx_project_share_full_total series go with it, while another project's stay.
func TestShares_ForgottenWithTheirProject(t *testing.T) {
	ctx := context.Background()
	s, kept := mustOpen(t, Config{DataDir: t.TempDir()})
	info, _, _, err := s.CreateProject(ctx, Admin{}, "doomed")
	require.NoError(t, err)
	for _, p := range []string{kept, info.ID} {
		s.webhookSlots(p)
		s.shareFull(p, flagWebhookShare, 1)
	}
	require.Equal(t, 2, testutil.CollectAndCount(s.metrics.ShareHits))

	require.NoError(t, s.DeleteProject(ctx, Admin{}, info.ID, true))
	s.shares.mu.Lock()
	_, webhooks := s.shares.webhooks[info.ID]
	_, full := s.shares.full[shareKey{info.ID, flagWebhookShare}]
	_, keptFull := s.shares.full[shareKey{kept, flagWebhookShare}]
	left := len(s.shares.webhooks)
	s.shares.mu.Unlock()
	require.False(t, webhooks, "the deleted project's webhook semaphore")
	require.False(t, full, "the deleted project's crossing")
	require.True(t, keptFull, "the other project's crossing")
	require.Equal(t, 1, left)
	require.Equal(t, 1, testutil.CollectAndCount(s.metrics.ShareHits), "the deleted project's series")
	require.Equal(t, 1, testutil.CollectAndCount(s.metrics.AtShare), "the deleted project's at-share series")
	require.Equal(t, int32(1), s.shares.anyFull.Load())
}

// itx_project_at_share says who stands at a share now: 1 from the refusal at the share until the
// project holds half its share or less (the crossing the logs report), gone then; another
// project is not marked.
func TestShares_AtShareWhileThere(t *testing.T) {
	s, project := mustOpen(t, Config{DataDir: t.TempDir(), MaxLive: 8, MaxLivePerProject: 4})
	at := func() float64 {
		return testutil.ToFloat64(s.metrics.AtShare.WithLabelValues(project, flagLiveShare))
	}
	series := func() int { return testutil.CollectAndCount(s.metrics.AtShare) }
	for range 4 {
		require.NoError(t, s.takeLiveShare(project))
	}
	require.Equal(t, 0, series(), "at its share, not past it: nothing refused yet")
	require.Error(t, s.takeLiveShare(project))
	require.Equal(t, 1, series())
	require.Equal(t, 1.0, at())
	s.releaseLiveShare(project) // 3 of 4: still at it, as the logs say
	require.Equal(t, 1.0, at())
	s.releaseLiveShare(project) // 2 of 4: under it again
	require.Equal(t, 0, series())
}
