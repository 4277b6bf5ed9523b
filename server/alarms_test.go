package server

import (
	"context"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/stretchr/testify/require"
)

// A stream with work due that cannot be loaded because every loaded stream is in use
// (--max-held-streams) is tried again a second later, not left until the next alarm.
func TestWakeDue_RetriesStreamsItCouldNotLoad(t *testing.T) {
	ctx := context.Background()
	clk := clocktest.New(time.Unix(1_800_000_000, 0))
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir(), Clock: clk, MaxHeldStreams: 2})
	due := StreamRef{ProjectID: projectID, Path: "/due"}
	_, err := s.Append(ctx, due, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
	require.NoError(t, err)
	entry, err := s.dir.Stream(ctx, projectID, "/due")
	require.NoError(t, err)
	clk.Advance(s.cfg.IdleTimeout) // unloads /due
	require.Eventually(t, func() bool { return s.LoadedStreams() == 0 }, 10*time.Second, time.Millisecond)

	var held []*actor
	for _, p := range []string{"/a", "/b"} {
		a, err := s.acquire(ctx, StreamRef{ProjectID: projectID, Path: p})
		require.NoError(t, err)
		held = append(held, a)
	}
	now := itx.UnixMilli(clk.Now())
	require.NoError(t, s.dir.SetAlarm(ctx, entry.StreamID, now))
	s.wakeDue()
	require.Equal(t, 2, s.LoadedStreams(), "/due could not load")
	s.alarmMu.Lock()
	next := s.alarmNext
	s.alarmMu.Unlock()
	require.Equal(t, now+alarmRetryMs, next, "a retry a second later")

	s.release(held[0])
	clk.Advance(time.Duration(alarmRetryMs) * time.Millisecond)
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.actors[due] != nil
	}, 10*time.Second, time.Millisecond, "the retry loads /due")
	s.release(held[1])
}
