package test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

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

// Appends whose contexts end right after they are sent, while itxd does not answer (a proxy
// holds every byte): the calls stay in flight there, so they keep their slots and the bound
// holds; a third Append waits for a slot until its own deadline and is not sent. Before, a
// cancelled call gave its slot back at once, and a producer cancelling its calls had as many
// appends in flight as it liked. Once the connection is lost, each future says so.
func TestAppender_CancelledCallsKeepTheirSlots(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	px := newProxy(t, ts.addr)
	p := dial(t, px.addr()).Login(ctx, ts.creds.ProjectToken)
	t.Cleanup(p.Release)
	s := stream(t, p, "/appender/bound")
	mustAppend(t, s, ev("first", `{}`))
	px.freeze()

	a := client.NewAppender(s, 2)
	var futures []*client.AppendFuture
	for range 2 {
		cctx, cancel := context.WithCancel(ctx)
		f, err := a.Append(cctx, []itx.EventInput{ev("e", `{}`)}, itx.AppendOptions{})
		cancel()
		require.NoError(t, err)
		futures = append(futures, f)
	}
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := a.Append(dctx, []itx.EventInput{ev("e", `{}`)}, itx.AppendOptions{})
	cancel()
	requireCode(t, err, itx.ECancelled)
	require.Contains(t, err.Error(), "append not sent")
	for i, f := range futures {
		select {
		case <-f.Done():
			t.Fatalf("call %d answered while itxd was silent", i)
		default:
		}
	}

	px.cut()
	for _, f := range futures {
		_, err := f.Wait(ctx)
		requireCode(t, err, itx.EDisconnected)
	}
	requireCode(t, a.Flush(ctx), itx.EDisconnected)
}

// An append whose context ends right after it is sent still commits (itxd queued it), and its
// future says so, with its offset, instead of cancelled.
func TestAppender_CancelledCallSaysWhatBecameOfIt(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/appender/cancelled")
	a := client.NewAppender(s, 4)
	cctx, cancel := context.WithCancel(ctx)
	f, err := a.Append(cctx, []itx.EventInput{ev("e", `{}`)}, itx.AppendOptions{})
	cancel()
	require.NoError(t, err)
	res, err := f.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, []int64{1}, res.Offsets)
	require.NoError(t, a.Flush(ctx))
	events, err := client.ReadAll(ctx, s, itx.Query{})
	require.NoError(t, err)
	require.Len(t, events, 1)
}
