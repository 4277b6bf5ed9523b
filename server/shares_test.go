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
	require.Equal(t, int32(1), s.shares.anyFull.Load())
}
