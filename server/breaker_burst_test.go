package server

import (
	"context"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
)

// An append of more events than --breaker-burst can never pass the stream's circuit breaker: it
// is refused saying so, naming the flag, not told to "retry later"; one within the burst passes.
func TestBreaker_AnAppendAboveTheBurstSaysItNeverPasses(t *testing.T) {
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir(), BreakerBurst: 3, BreakerRefillPerMinute: 60})
	ctx := context.Background()
	ref := StreamRef{ProjectID: projectID, Path: "/a"}
	events := func(n int) []itx.EventInput {
		out := make([]itx.EventInput, n)
		for i := range out {
			out[i] = itx.EventInput{Type: "e", Payload: []byte(`{}`)}
		}
		return out
	}
	_, err := s.Append(ctx, ref, events(4), itx.AppendOptions{})
	require.Equal(t, itx.ERateLimited, itx.ErrorCode(err))
	require.Contains(t, itx.ErrorMessage(err), "the append's 4 events are more than the stream's circuit breaker ever admits at once (--breaker-burst 3): it never passes")
	_, err = s.Append(ctx, ref, events(3), itx.AppendOptions{})
	require.NoError(t, err)
	_, err = s.Append(ctx, ref, events(3), itx.AppendOptions{})
	require.Equal(t, itx.ERateLimited, itx.ErrorCode(err))
	require.Contains(t, itx.ErrorMessage(err), "retry later")
	require.Contains(t, itx.ErrorMessage(err), "--breaker-burst")
}
