package test

// Black-box probes of issues 2 (the stream log) and 7 (the stream core and delivery), written
// from the issues, the seeds and the public surface only, over real RPC against a real itxd. Only
// the probes that found a defect or cover what no other test does are kept.

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A configure that spells out a default is the same config as one that leaves it out, and what
// describe shows configures again as it is: neither appends (issue 7: an identical configure
// appends nothing, so a halt, the retry state and the birth epoch stay).
func TestBBCore_ConfigureReadBack(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	ctx := ctxT(t)
	s := stream(t, p, "/bb/readback")
	mustAppend(t, s, ev("a", `{}`))
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	cases := []client.SubscriptionConfig{
		{Name: "itx", Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "nobody"}, FilterTypes: []string{"a", "b"},
			FilterCondition: `payload.x = 1`, Transform: `{"y": payload.x}`, OnFailingEvent: "skip", Description: "d", MaxDeliveryEvents: 10},
		{Name: "itx-defaults", Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "nobody"}},
		{Name: "copy", Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/bb/readback-copy"}, Start: "now"},
		{Name: "hook", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: "http://127.0.0.1:1/x",
			Headers: []client.Header{{Name: "X-A", Value: "1"}}, Secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}},
	}
	for _, cfg := range cases {
		t.Run(cfg.Name, func(t *testing.T) {
			_, off, err := client.ConfigureSubscription(ctx, subs, cfg)
			require.NoError(t, err)
			head := mustDescribe(t, s).HeadOffset
			explicit := cfg
			if explicit.Start == "" {
				explicit.Start = "beginning"
			}
			if explicit.OnFailingEvent == "" {
				explicit.OnFailingEvent = "halt"
			}
			if explicit.MaxDeliveryEvents == 0 {
				explicit.MaxDeliveryEvents = itx.DeliveryBatchEvents
				if explicit.Receiver.Kind == client.ReceiverWebhookPost {
					explicit.MaxDeliveryEvents = 1
				}
			}
			if explicit.MaxDeliveryBytes == 0 {
				explicit.MaxDeliveryBytes = itx.DeliveryBatchBytes
			}
			_, off2, err := client.ConfigureSubscription(ctx, subs, explicit)
			require.NoError(t, err)
			require.Equal(t, off, off2, "defaults spelled out")
			sub := client.Subscription(ctx, s, cfg.Name)
			defer sub.Release()
			d, err := client.DescribeSubscription(ctx, sub)
			require.NoError(t, err)
			_, off3, err := client.ConfigureSubscription(ctx, subs, client.ConfigOf(d.Config))
			require.NoError(t, err)
			require.Equal(t, off, off3, "read back from describe")
			require.Equal(t, head, mustDescribe(t, s).HeadOffset, "nothing appended")
		})
	}
}

// A changed config keeps the cursor unless it changes the receiver kind or the start (issue 7):
// another capability of the same kind takes the events still owed, another kind starts over.
func TestBBCore_ConfigureNewKindStartsOver(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	ctx := ctxT(t)
	s := stream(t, p, "/bb/kind")
	mustAppend(t, s, ev("a", `{}`), ev("b", `{}`), ev("c", `{}`))
	var mu sync.Mutex
	var got []int64
	recv := client.ServeReceiver(func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, bbOffsets(b.Events)...)
		return 0, nil
	})
	for _, name := range []string{"one", "two"} {
		h, err := client.MountReceiver(ctx, p, name, recv.AddRef())
		require.NoError(t, err)
		defer h.Release()
	}
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	cfg := client.SubscriptionConfig{Name: "k", Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "one"}}
	_, off, err := client.ConfigureSubscription(ctx, subs, cfg)
	require.NoError(t, err)
	sub := client.Subscription(ctx, s, "k")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, off, 10*time.Second)
	require.NoError(t, err)

	cfg.Receiver.Capability = "two"
	_, off2, err := client.ConfigureSubscription(ctx, subs, cfg)
	require.NoError(t, err)
	_, err = client.WaitUntilProcessed(ctx, sub, off2, 10*time.Second)
	require.NoError(t, err)
	mu.Lock()
	require.Equal(t, []int64{1, 2, 3, 4, 5}, got, "the same kind: the cursor stays, nothing again")
	mu.Unlock()

	cfg.Receiver = client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/bb/kind-copy"}
	_, off3, err := client.ConfigureSubscription(ctx, subs, cfg)
	require.NoError(t, err)
	_, err = client.WaitUntilProcessed(ctx, sub, off3, 10*time.Second)
	require.NoError(t, err)
	copied, err := client.GetEvents(ctx, stream(t, p, "/bb/kind-copy"), itx.Query{})
	require.NoError(t, err)
	require.Equal(t, int(off3), len(copied), "another kind: a new birth, from the beginning")
}

// Conditional appends that meet in one group commit: of racing appenders expecting one head,
// exactly one commits; a pipelined chain whose every call expects the head the one before it
// leaves all commit, and a stale expectation among them is refused alone (issue 2).
func TestBBCore_ConditionalAppendsInOneGroupCommit(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)

	t.Run("racing for one head", func(t *testing.T) {
		const n = 16
		for round := 0; round < 5; round++ {
			path := fmt.Sprintf("/bb/cond-race/%d", round)
			var wg sync.WaitGroup
			var mu sync.Mutex
			ok, conflicts := 0, 0
			for i := 0; i < n; i++ {
				s := stream(t, ts.project(t), path)
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					_, err := client.Append(ctx, s, []itx.EventInput{ev("c", fmt.Sprintf(`{"i":%d}`, i))}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 0})
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						ok++
					case itx.ErrorCode(err) == itx.EOffsetConflict:
						conflicts++
					default:
						t.Errorf("append %d: %v", i, err)
					}
				}(i)
			}
			wg.Wait()
			require.Equal(t, 1, ok, "one winner")
			require.Equal(t, n-1, conflicts)
			require.Equal(t, int64(1), mustDescribe(t, stream(t, p, path)).HeadOffset)
		}
	})
	t.Run("pipelined chain", func(t *testing.T) {
		s := stream(t, p, "/bb/cond-chain")
		a := client.NewAppender(s, 64)
		var futs []*client.AppendFuture
		for i := 0; i < 50; i++ {
			f, err := a.Append(ctx, []itx.EventInput{ev("c", `{}`)}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: int64(i)})
			require.NoError(t, err)
			futs = append(futs, f)
		}
		stale, err := a.Append(ctx, []itx.EventInput{ev("c", `{}`)}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 10})
		require.NoError(t, err)
		last, err := a.Append(ctx, []itx.EventInput{ev("c", `{}`)}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 50})
		require.NoError(t, err)
		for i, f := range futs {
			r, err := f.Wait(ctx)
			require.NoError(t, err, "append %d", i)
			require.Equal(t, []int64{int64(i + 1)}, r.Offsets)
		}
		_, err = stale.Wait(ctx)
		requireCode(t, err, itx.EOffsetConflict)
		r, err := last.Wait(ctx)
		require.NoError(t, err)
		require.Equal(t, []int64{51}, r.Offsets)
	})
}

// waitForEvent on a path with no stream yet (after 0, the head of an empty stream) waits for the
// append that creates it, as it would on an existing stream.
func TestBBCore_WaitForEventOnAStreamNotYetCreated(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	ctx := ctxT(t)
	s := stream(t, p, "/bb/unborn-wait")
	done := make(chan error, 1)
	go func() {
		_, err := client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"x"}}, 0, 10*time.Second)
		done <- err
	}()
	// The waiter may not be registered yet when an append lands; each append is a later event,
	// so append until it answers.
	s2 := stream(t, p, "/bb/unborn-wait")
	for i := 0; ; i++ {
		mustAppend(t, s2, ev("x", `{}`))
		select {
		case err := <-done:
			require.NoError(t, err)
			return
		case <-time.After(100 * time.Millisecond):
		}
		require.Less(t, i, 50, "waitForEvent never answered")
	}
}

// A page's limit counts the events it returns: ephemeral rows it skips (includeEphemeral unset)
// do not use it up.
func TestBBCore_PageLimitCountsReturnedEvents(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/bb/eph-limit")
	mustAppend(t, s, ev("a", `{}`), itx.EventInput{Type: "e", Ephemeral: true}, itx.EventInput{Type: "e", Ephemeral: true}, ev("b", `{}`))
	pg, err := client.GetEventPage(ctx, s, itx.Query{After: 1, Limit: 1})
	require.NoError(t, err)
	require.Equal(t, []int64{4}, bbOffsets(pg.Events))
	require.Equal(t, int64(4), pg.NextAfter)
	evs, err := client.GetEvents(ctx, s, itx.Query{Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []int64{1, 4}, bbOffsets(evs))
}

// A Receiver that never answers is given up on after the delivery timeout and the batch is tried
// again (issue 7: a push that is never answered times out), through client.ServeReceiver, whose
// handler sees its context end.
func TestBBCore_UnansweredPushTimesOut(t *testing.T) {
	ts := startServer(t, server.Config{DeliveryTimeout: 500 * time.Millisecond})
	p := ts.project(t)
	ctx := ctxT(t)
	s := stream(t, p, "/bb/timeout")
	mustAppend(t, s, ev("a", `{}`))
	var mu sync.Mutex
	calls := 0
	h, err := client.MountReceiver(ctx, p, "slow", client.ServeReceiver(func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
		mu.Lock()
		calls++
		first := calls == 1
		mu.Unlock()
		if first {
			<-ctx.Done()
			return 0, ctx.Err()
		}
		return 0, nil
	}))
	require.NoError(t, err)
	defer h.Release()
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, off, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "t",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "slow"}})
	require.NoError(t, err)
	sub := client.Subscription(ctx, s, "t")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, off, 10*time.Second)
	require.NoError(t, err)
	mu.Lock()
	require.Equal(t, 2, calls)
	mu.Unlock()
}

// The Go client refuses a negative page limit and a negative expected head before sending, as it
// refuses negative offsets: the limit went out as 0 (the default page, without a word) and the
// head as 18446744073709551615, the number itxd's refusal then named.
func TestBBCore_NegativeArgumentsRefusedByTheClient(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/bb/negative")
	mustAppend(t, s, ev("a", `{}`))
	_, err := client.GetEvents(ctx, s, itx.Query{Limit: -1})
	requireCode(t, err, itx.EInvalid)
	require.Contains(t, itx.ErrorMessage(err), "Query.Limit must not be negative")
	_, err = client.GetEventPage(ctx, s, itx.Query{Limit: -1})
	requireCode(t, err, itx.EInvalid)
	cond := itx.AppendOptions{Conditional: true, ExpectedHeadOffset: -1}
	_, err = client.Append(ctx, s, []itx.EventInput{ev("a", `{}`)}, cond)
	requireCode(t, err, itx.EInvalid)
	require.Contains(t, itx.ErrorMessage(err), "AppendOptions.ExpectedHeadOffset must not be negative (got -1)")
	_, err = client.NewAppender(s, 4).Append(ctx, []itx.EventInput{ev("a", `{}`)}, cond)
	requireCode(t, err, itx.EInvalid)
	require.Contains(t, itx.ErrorMessage(err), "AppendOptions.ExpectedHeadOffset must not be negative (got -1)")
	require.Equal(t, int64(1), mustDescribe(t, s).HeadOffset)
}

func bbOffsets(evs []itx.Event) []int64 {
	out := make([]int64, 0, len(evs))
	for _, e := range evs {
		out = append(out, e.Offset)
	}
	return out
}
