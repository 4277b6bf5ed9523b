package test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

// One producer with 64 appends in flight on one capability: every event lands in the order of
// the Append calls, each future answers its own offsets, and the calls shared group commits.
func TestAppender_PipelinesInOrder(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/appender/order")
	before := commitsOf(ts)
	a := client.NewAppender(s, 64)
	const n = 1000
	futures := make([]*client.AppendFuture, n)
	for i := range n {
		f, err := a.Append(ctx, []itx.EventInput{ev("seq", fmt.Sprintf(`{"i":%d}`, i))}, itx.AppendOptions{})
		require.NoError(t, err)
		futures[i] = f
	}
	require.NoError(t, a.Flush(ctx))
	for i, f := range futures {
		res, err := f.Wait(ctx)
		require.NoError(t, err)
		require.Equal(t, []int64{int64(i + 1)}, res.Offsets, "call %d", i)
	}
	events, err := client.ReadAll(ctx, s, itx.Query{})
	require.NoError(t, err)
	require.Len(t, events, n)
	for i, e := range events {
		var p struct{ I int }
		require.NoError(t, json.Unmarshal(e.Payload, &p))
		require.Equal(t, i, p.I, "event at offset %d", e.Offset)
	}
	require.Less(t, commitsOf(ts)-before, float64(n), "pipelined calls shared group commits")
}

// A failing call does not stop the calls after it; Flush reports it once, and with idempotency
// keys sending the whole run again fills nothing twice.
func TestAppender_FailureAndResend(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/appender/failure")
	a := client.NewAppender(s, 8)
	input := func(i int) itx.EventInput {
		e := ev("seq", fmt.Sprintf(`{"i":%d}`, i))
		e.IdempotencyKey = fmt.Sprintf("seq-%d", i)
		if i == 5 {
			e.Payload = json.RawMessage(`{not json`)
		}
		return e
	}
	futures := make([]*client.AppendFuture, 10)
	for i := range futures {
		f, err := a.Append(ctx, []itx.EventInput{input(i)}, itx.AppendOptions{})
		require.NoError(t, err)
		futures[i] = f
	}
	requireCode(t, a.Flush(ctx), itx.EInvalid)
	require.NoError(t, a.Flush(ctx), "a failure is reported once")
	for i, f := range futures {
		_, err := f.Wait(ctx)
		if i == 5 {
			requireCode(t, err, itx.EInvalid)
		} else {
			require.NoError(t, err, "call %d", i)
		}
	}
	// The producer fixes the bad event and sends again from it on: the rest are duplicates.
	for i := 5; i < 10; i++ {
		e := input(i)
		if i == 5 {
			e.Payload = json.RawMessage(`{"i":5}`)
		}
		_, err := a.Append(ctx, []itx.EventInput{e}, itx.AppendOptions{})
		require.NoError(t, err)
	}
	require.NoError(t, a.Flush(ctx))
	events, err := client.ReadAll(ctx, s, itx.Query{})
	require.NoError(t, err)
	require.Len(t, events, 10, "nothing appended twice")
}

// commitsOf is how many group commits with events the server has made.
func commitsOf(ts *testServer) float64 {
	var m dto.Metric
	if err := ts.srv.Metrics().CommitLatency.Write(&m); err != nil {
		return 0
	}
	return float64(m.GetHistogram().GetSampleCount())
}
