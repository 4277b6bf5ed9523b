package test

import (
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Scheduling a key already in the log answers as an append of that key would: the same body
// names its offset, another body is an idempotencyConflict naming the offset, and nothing is
// scheduled either way.
func TestScheduled_KeyInTheLogWithAnotherBodyIsAConflict(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	ts := startServer(t, server.Config{Clock: clock})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/timers-conflict")
	first := mustAppend(t, s, keyed("reminder", `{"n":1}`, "remind-1"))

	_, appended, err := client.Schedule(ctx, s, keyed("reminder", `{"n":1}`, "remind-1"), clock.Now().Add(time.Minute))
	require.NoError(t, err)
	require.Equal(t, first.Offsets[0], appended, "the same body: its offset")

	_, _, err = client.Schedule(ctx, s, keyed("reminder", `{"n":2}`, "remind-1"), clock.Now().Add(time.Minute))
	requireCode(t, err, itx.EIdempotencyConflict)
	require.Contains(t, itx.ErrorMessage(err), "offset 1")
	_, _, err = client.Schedule(ctx, s, keyed("other", `{"n":1}`, "remind-1"), clock.Now().Add(time.Minute))
	requireCode(t, err, itx.EIdempotencyConflict)

	list, err := client.ListScheduled(ctx, s)
	require.NoError(t, err)
	require.Empty(t, list, "nothing scheduled")
}
