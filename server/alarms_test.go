package server

import (
	"context"
	"os"
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

// A stream with work due whose database is missing is tried again within unreadableRetryMs:
// its alarm, due in the past, was tried only when another stream's alarm woke, so a file
// restored (or its mode mended) without a restart left the work owed until a call loaded it.
func TestWakeDue_RetriesUnreadableStreams(t *testing.T) {
	ctx := context.Background()
	clk := clocktest.New(time.Unix(1_800_000_000, 0))
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir(), Clock: clk})
	due := StreamRef{ProjectID: projectID, Path: "/due"}
	_, err := s.Append(ctx, due, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
	require.NoError(t, err)
	entry, err := s.dir.Stream(ctx, projectID, "/due")
	require.NoError(t, err)
	clk.Advance(s.cfg.IdleTimeout) // unloads /due
	require.Eventually(t, func() bool { return s.LoadedStreams() == 0 }, 10*time.Second, time.Millisecond)
	file := s.backend.Where(entry.StreamID)
	require.NoError(t, os.Rename(file, file+".away"))

	now := itx.UnixMilli(clk.Now())
	require.NoError(t, s.dir.SetAlarm(ctx, entry.StreamID, now))
	s.wakeDue()
	require.Zero(t, s.LoadedStreams(), "/due cannot load")
	s.alarmMu.Lock()
	next := s.alarmNext
	s.alarmMu.Unlock()
	require.Equal(t, now+unreadableRetryMs, next, "a retry within unreadableRetryMs")

	require.NoError(t, os.Rename(file+".away", file))
	clk.Advance(time.Duration(unreadableRetryMs) * time.Millisecond)
	require.Eventually(t, func() bool {
		s.mu.Lock()
		a := s.actors[due]
		s.mu.Unlock()
		if a == nil {
			return false
		}
		select {
		case <-a.ready:
			return a.loadErr == nil
		default:
			return false
		}
	}, 10*time.Second, time.Millisecond, "the retry loads /due")
}
