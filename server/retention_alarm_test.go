package server

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/stretchr/testify/require"
)

// An unloaded stream with an age limit is owed a load when its oldest event passes the limit:
// its alarm says when, and says nothing while a consumer holds that
// event back (the consumer moving loads the stream) or once the policy is cleared.
func TestRetention_AlarmWhenTheOldestEventAges(t *testing.T) {
	ctx := context.Background()
	clk := clocktest.New(time.Unix(1_800_000_000, 0))
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir(), Clock: clk, IdleTimeout: time.Minute})
	ref := StreamRef{ProjectID: projectID, Path: "/aging"}
	t0 := itx.UnixMilli(clk.Now())
	_, err := s.Append(ctx, ref, []itx.EventInput{{Type: "a"}, {Type: "b"}}, itx.AppendOptions{})
	require.NoError(t, err)
	entry, err := s.dir.Stream(ctx, projectID, "/aging")
	require.NoError(t, err)
	alarm := func() int64 {
		t.Helper()
		due, err := s.dir.DueAlarms(ctx, math.MaxInt64)
		require.NoError(t, err)
		for _, d := range due {
			if d.StreamID == entry.StreamID {
				return d.DueAt
			}
		}
		return 0
	}
	unload := func() {
		t.Helper()
		require.Eventually(t, func() bool {
			clk.Advance(2 * time.Minute)
			s.Sweep()
			return s.LoadedStreams() == 0
		}, 10*time.Second, time.Millisecond)
	}
	require.NoError(t, s.SetRetention(ctx, Admin{}, ref, time.Hour.Milliseconds(), 0, 0))
	require.Equal(t, itx.UnixMilli(clk.Now()), alarm(), "due now while loaded: a crash leaves a load owed")
	unload()
	require.Equal(t, t0+time.Hour.Milliseconds()+1, alarm(), "when the oldest event is an hour old")

	// A registered reader at 0 holds every event: nothing to load the stream for.
	require.NoError(t, s.RegisterReader(ctx, ref, "slow", 0))
	unload()
	require.Zero(t, alarm(), "a consumer holds the oldest event")

	// Past the hour, the reader gone: both go, and a new event sets the next alarm. The load's
	// pass may run before the removal (the reader still holding them): then the policy's next
	// pass, a retentionEvery later on the stream's clock, trims them.
	clk.Advance(time.Hour)
	require.NoError(t, s.RemoveReader(ctx, ref, "slow"))
	require.Eventually(t, func() bool {
		info, err := s.Describe(ctx, ref)
		require.NoError(t, err)
		if info.TrimmedThrough == 2 {
			return true
		}
		clk.Advance(retentionEvery)
		return false
	}, 10*time.Second, time.Millisecond)
	t1 := itx.UnixMilli(clk.Now())
	_, err = s.Append(ctx, ref, []itx.EventInput{{Type: "c"}}, itx.AppendOptions{})
	require.NoError(t, err)
	unload()
	require.Equal(t, t1+time.Hour.Milliseconds()+1, alarm(), "when the new oldest event is an hour old")

	require.NoError(t, s.SetRetention(ctx, Admin{}, ref, 0, 0, 0))
	unload()
	require.Zero(t, alarm(), "no policy, nothing owed")
}
