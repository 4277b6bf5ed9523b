package test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A Follow with a type filter and a reader moves the reader's checkpoint past the events its
// filter passes over, as a subscription's filter makes its cursor a watermark: a follower of a
// rare type stayed at its last match, its lag grew with every other append, and its checkpoint
// held back every trim and retention policy of the stream. Follow goes on (and returns) from
// there too.
func TestClientFollow_ReaderPassesWhatItsFilterDrops(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/follow-filter")
	mustAppend(t, s, ev("a", `{}`))
	view, err := client.WatchStream(ctx, s)
	require.NoError(t, err)
	defer view.Cancel(context.Background())

	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := &followed{}
	type result struct {
		last int64
		err  error
	}
	ended := make(chan result, 1)
	cfg := client.FollowConfig{Addr: ts.addr, Token: ts.creds.ProjectToken, Path: "/follow-filter",
		Reader: "rare", ReaderInterval: 10 * time.Millisecond, Connection: client.ConnectionOptions{Types: []string{"a"}}}
	go func() {
		last, err := client.Follow(fctx, cfg, got.deliver)
		ended <- result{last, err}
	}()
	_, err = view.StreamState(ctx, func(st itx.LiveStreamState) bool { return st.Readers["rare"].Checkpoint == 1 })
	require.NoError(t, err, "the first match")

	var head int64
	for range 20 {
		head = mustAppend(t, s, ev("b", `{}`)).HeadOffset
	}
	st, err := view.StreamState(ctx, func(st itx.LiveStreamState) bool { return st.Readers["rare"].Checkpoint == head })
	require.NoError(t, err, "the reader passes the events its filter drops")
	require.Zero(t, st.Readers["rare"].Lag)
	trimmed, err := client.Trim(ctx, s, head)
	require.NoError(t, err)
	require.Equal(t, head, trimmed.TrimmedThrough, "nothing the follower still needs holds the trim back")

	cancel()
	r := <-ended
	require.True(t, errors.Is(r.err, context.Canceled), "%v", r.err)
	require.Equal(t, head, r.last, "Follow returns where it stands, past what its filter dropped")
	require.Equal(t, []int64{1}, got.got())

	// Resumed from its reader, it starts after the watermark: the next match is the next event.
	next := mustAppend(t, s, ev("a", `{}`)).HeadOffset
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	cfg.Resume = true
	again := &followed{}
	_, err = client.Follow(rctx, cfg, func(ctx context.Context, b itx.DeliveryBatch) error {
		rcancel()
		return again.deliver(ctx, b)
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, []int64{next}, again.got())
}
