package server

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/stretchr/testify/require"
)

// tickingClock moves on a millisecond at every reading, as a real clock does between two.
type tickingClock struct {
	*clocktest.Clock
	ticks atomic.Int64
}

func (c *tickingClock) Now() time.Time {
	return c.Clock.Now().Add(time.Duration(c.ticks.Add(1)) * time.Millisecond)
}

// A stream is created at its first commit's time, the time its first events carry: describe
// never shows its last append before its creation (the directory entry took a later reading).
func TestStream_CreatedAtItsFirstCommit(t *testing.T) {
	ctx := context.Background()
	clock := &tickingClock{Clock: clocktest.New(time.Unix(1_800_000_000, 0))}
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir(), Clock: clock})
	ref := StreamRef{ProjectID: projectID, Path: "/born"}
	_, err := s.Append(ctx, ref, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
	require.NoError(t, err)
	info, err := s.Describe(ctx, ref)
	require.NoError(t, err)
	page, err := s.ReadEvents(ctx, ref, itx.Query{})
	require.NoError(t, err)
	require.Equal(t, page.Events[0].CreatedAt, info.CreatedAt, "created when its first event was")
	require.LessOrEqual(t, info.CreatedAt, info.LastAppendAt)
}
