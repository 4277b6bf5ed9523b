package test

// Black-box probes of issues 2 (the stream log) and 7 (the stream core and delivery), written from
// the issues, the seeds and the public surface only, over real RPC against a real itxd.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

func TestBBCore_AppendBatch(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	ctx := ctxT(t)

	t.Run("bad event in a batch writes nothing", func(t *testing.T) {
		s := stream(t, p, "/bb/atomic")
		mustAppend(t, s, ev("a", `{}`))
		cases := []struct {
			name string
			in   itx.EventInput
			code itx.Code
		}{
			{"empty type", ev("", `{}`), itx.EInvalid},
			{"payload not JSON", ev("x", `{`), itx.EInvalid},
			{"payload an array", ev("x", `[1]`), itx.EInvalid},
			{"payload a string", ev("x", `"s"`), itx.EInvalid},
			{"metadata not an object", itx.EventInput{Type: "x", Payload: json.RawMessage(`{}`), Metadata: json.RawMessage(`3`)}, itx.EInvalid},
			{"ephemeral with a key", itx.EventInput{Type: "x", Ephemeral: true, IdempotencyKey: "k"}, itx.EInvalid},
			{"ephemeral control event", itx.EventInput{Type: itx.TypeErrorOccurred, Payload: json.RawMessage(`{"message":"m"}`), Ephemeral: true}, itx.EInvalid},
			{"unknown control type", ev("stream/nope", `{}`), itx.EInvalid},
			{"oversize event", ev("x", `{"s":"`+strings.Repeat("a", 1<<20)+`"}`), itx.ETooLarge},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				_, err := client.Append(ctx, s, []itx.EventInput{ev("good", `{}`), tc.in}, itx.AppendOptions{})
				requireCode(t, err, tc.code)
				info, err := client.Describe(ctx, s)
				require.NoError(t, err)
				require.Equal(t, int64(1), info.HeadOffset, "nothing written")
			})
		}
		t.Run("too many events", func(t *testing.T) {
			in := make([]itx.EventInput, 1001)
			for i := range in {
				in[i] = ev("x", `{}`)
			}
			_, err := client.Append(ctx, s, in, itx.AppendOptions{})
			require.Error(t, err)
			info, err := client.Describe(ctx, s)
			require.NoError(t, err)
			require.Equal(t, int64(1), info.HeadOffset, "nothing written")
		})
	})

	t.Run("idempotency", func(t *testing.T) {
		s := stream(t, p, "/bb/idem")
		r1 := mustAppend(t, s, keyed("a", `{"n":1}`, "k1"), ev("b", `{}`))
		require.Equal(t, []int64{1, 2}, r1.Offsets)
		// Same body, keys compared as JSON values: key order and spacing do not matter.
		r2, err := client.Append(ctx, s, []itx.EventInput{keyed("a", `{ "n" : 1 }`, "k1"), keyed("c", `{}`, "k2")}, itx.AppendOptions{})
		require.NoError(t, err)
		require.Equal(t, []int64{1, 3}, r2.Offsets)
		require.Equal(t, []bool{true, false}, r2.Duplicate)
		// A different body, even beside a new event: conflict, nothing written.
		_, err = client.Append(ctx, s, []itx.EventInput{ev("d", `{}`), keyed("a", `{"n":2}`, "k1")}, itx.AppendOptions{})
		requireCode(t, err, itx.EIdempotencyConflict)
		_, err = client.Append(ctx, s, []itx.EventInput{keyed("b", `{"n":1}`, "k1")}, itx.AppendOptions{})
		requireCode(t, err, itx.EIdempotencyConflict)
		_, err = client.Append(ctx, s, []itx.EventInput{{Type: "a", Payload: json.RawMessage(`{"n":1}`), IdempotencyKey: "k1", Metadata: json.RawMessage(`{"m":1}`)}}, itx.AppendOptions{})
		requireCode(t, err, itx.EIdempotencyConflict)
		info, err := client.Describe(ctx, s)
		require.NoError(t, err)
		require.Equal(t, int64(3), info.HeadOffset)

		// The same key twice in one batch with two bodies is a conflict.
		_, err = client.Append(ctx, s, []itx.EventInput{keyed("x", `{"n":1}`, "k9"), keyed("x", `{"n":2}`, "k9")}, itx.AppendOptions{})
		require.Error(t, err)
		info, err = client.Describe(ctx, s)
		require.NoError(t, err)
		require.Equal(t, int64(3), info.HeadOffset)
		// Twice with one body: one event.
		r3, err := client.Append(ctx, s, []itx.EventInput{keyed("x", `{"n":1}`, "k8"), keyed("x", `{"n":1}`, "k8")}, itx.AppendOptions{})
		if err == nil {
			t.Logf("same key twice in one batch: %+v", r3)
			evs, err := client.GetEvents(ctx, s, itx.Query{After: 3})
			require.NoError(t, err)
			require.Len(t, evs, 1, "one event for one key")
		} else {
			t.Logf("same key twice in one batch refused: %v", err)
		}
	})

	t.Run("idempotency survives a restart", func(t *testing.T) {
		dir := t.TempDir()
		srv := startServer(t, server.Config{DataDir: dir})
		s := stream(t, srv.project(t), "/bb/idem-restart")
		r := mustAppend(t, s, keyed("a", `{}`, "k"))
		srv.srv.Close(ctx)
		srv2 := startServer(t, server.Config{DataDir: dir})
		s2 := stream(t, srv2.project(t), "/bb/idem-restart")
		r2, err := client.Append(ctx, s2, []itx.EventInput{keyed("a", `{}`, "k")}, itx.AppendOptions{})
		require.NoError(t, err)
		require.Equal(t, r.Offsets, r2.Offsets)
		require.Equal(t, []bool{true}, r2.Duplicate)
		require.Equal(t, r.StreamID, r2.StreamID)
	})

	t.Run("conditional", func(t *testing.T) {
		s := stream(t, p, "/bb/cond")
		_, err := client.Append(ctx, s, []itx.EventInput{ev("a", `{}`)}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 0})
		require.NoError(t, err)
		_, err = client.Append(ctx, s, []itx.EventInput{ev("a", `{}`)}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 0})
		requireCode(t, err, itx.EOffsetConflict)
		_, err = client.Append(ctx, s, []itx.EventInput{ev("a", `{}`)}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 5})
		requireCode(t, err, itx.EOffsetConflict)
		r, err := client.Append(ctx, s, []itx.EventInput{keyed("a", `{}`, "c")}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 1})
		require.NoError(t, err)
		require.Equal(t, []int64{2}, r.Offsets)
		// Ephemeral events move the head too.
		mustAppend(t, s, itx.EventInput{Type: "e", Ephemeral: true})
		_, err = client.Append(ctx, s, []itx.EventInput{ev("a", `{}`)}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 2})
		requireCode(t, err, itx.EOffsetConflict)
		// A retry that is all duplicates is answered from the log whatever the head.
		r2, err := client.Append(ctx, s, []itx.EventInput{keyed("a", `{}`, "c")}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 1})
		require.NoError(t, err)
		require.Equal(t, []int64{2}, r2.Offsets)
		info, err := client.Describe(ctx, s)
		require.NoError(t, err)
		require.Equal(t, int64(3), info.HeadOffset)
	})

	t.Run("ephemeral", func(t *testing.T) {
		s := stream(t, p, "/bb/eph")
		r := mustAppend(t, s, ev("a", `{}`), itx.EventInput{Type: "e", Payload: json.RawMessage(`{"x":1}`), Ephemeral: true}, ev("b", `{}`))
		require.Equal(t, []int64{1, 2, 3}, r.Offsets)
		evs, err := client.GetEvents(ctx, s, itx.Query{})
		require.NoError(t, err)
		require.Equal(t, []int64{1, 3}, bbOffsets(evs))
		evs, err = client.GetEvents(ctx, s, itx.Query{IncludeEphemeral: true})
		require.NoError(t, err)
		require.Equal(t, []int64{1, 2, 3}, bbOffsets(evs))
		require.True(t, evs[1].Ephemeral)
		pg, err := client.GetEventPage(ctx, s, itx.Query{After: 2})
		require.NoError(t, err)
		require.Equal(t, int64(3), pg.StreamMaxOffset)
		// A page that holds only an ephemeral event, not asked for.
		pg, err = client.GetEventPage(ctx, s, itx.Query{After: 1, Limit: 1})
		require.NoError(t, err)
		t.Logf("page after 1 limit 1: %v next %d", bbOffsets(pg.Events), pg.NextAfter)
		require.Equal(t, []int64{3}, bbOffsets(pg.Events), "limit counts returned events, not skipped ephemeral rows")
	})
}

func bbOffsets(evs []itx.Event) []int64 {
	out := make([]int64, 0, len(evs))
	for _, e := range evs {
		out = append(out, e.Offset)
	}
	return out
}

func TestBBCore_Reads(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	ctx := ctxT(t)
	s := stream(t, p, "/bb/reads")
	in := make([]itx.EventInput, 0, 700)
	for i := 0; i < 700; i++ {
		typ := "even"
		if i%2 == 1 {
			typ = "odd"
		}
		in = append(in, ev(typ, fmt.Sprintf(`{"i":%d}`, i+1)))
	}
	mustAppend(t, s, in[:600]...)
	mustAppend(t, s, in[600:]...)

	t.Run("limit default and cap", func(t *testing.T) {
		evs, err := client.GetEvents(ctx, s, itx.Query{})
		require.NoError(t, err)
		require.Len(t, evs, 500)
		evs, err = client.GetEvents(ctx, s, itx.Query{Limit: 10000})
		require.NoError(t, err)
		require.Len(t, evs, 500)
		evs, err = client.GetEvents(ctx, s, itx.Query{After: 695, Limit: 10})
		require.NoError(t, err)
		require.Equal(t, []int64{696, 697, 698, 699, 700}, bbOffsets(evs))
	})
	t.Run("page envelope", func(t *testing.T) {
		pg, err := client.GetEventPage(ctx, s, itx.Query{After: 10, Limit: 3, Types: []string{"odd"}})
		require.NoError(t, err)
		require.Equal(t, []int64{12, 14, 16}, bbOffsets(pg.Events))
		require.Equal(t, int64(700), pg.StreamMaxOffset)
		require.NotEmpty(t, pg.StreamID)
		require.Equal(t, int64(16), pg.NextAfter)
		pg, err = client.GetEventPage(ctx, s, itx.Query{After: 700})
		require.NoError(t, err)
		require.Empty(t, pg.Events)
		require.Equal(t, int64(700), pg.NextAfter)
		pg, err = client.GetEventPage(ctx, s, itx.Query{After: 5000})
		require.NoError(t, err)
		require.Empty(t, pg.Events)
		pg, err = client.GetEventPage(ctx, s, itx.Query{After: 3, Before: 6})
		require.NoError(t, err)
		require.Equal(t, []int64{4, 5}, bbOffsets(pg.Events))
		pg, err = client.GetEventPage(ctx, s, itx.Query{Types: []string{"nope"}})
		require.NoError(t, err)
		require.Empty(t, pg.Events)
		t.Logf("no match: nextAfter %d", pg.NextAfter)
	})
	t.Run("unknown stream reads empty", func(t *testing.T) {
		u := stream(t, p, "/bb/never")
		pg, err := client.GetEventPage(ctx, u, itx.Query{})
		require.NoError(t, err)
		require.Empty(t, pg.Events)
		require.Empty(t, pg.StreamID)
		require.Zero(t, pg.StreamMaxOffset)
		info, err := client.Describe(ctx, u)
		require.NoError(t, err)
		require.Zero(t, info.HeadOffset)
		all, err := client.ListStreams(ctx, p, "/bb/never")
		require.NoError(t, err)
		require.Empty(t, all)
	})
	t.Run("describe", func(t *testing.T) {
		info, err := client.Describe(ctx, s)
		require.NoError(t, err)
		require.Equal(t, "/bb/reads", info.Path)
		require.Equal(t, int64(700), info.HeadOffset)
		require.NotZero(t, info.CreatedAt)
		require.GreaterOrEqual(t, info.LastAppendAt, info.CreatedAt)
	})
}

func TestBBCore_WaitForEvent(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	ctx := ctxT(t)
	s := stream(t, p, "/bb/wait")
	mustAppend(t, s, ev("a", `{"n":1,"tags":["x","y"]}`), ev("b", `{"n":2}`))

	t.Run("already there", func(t *testing.T) {
		e, err := client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"b"}}, 0, time.Second)
		require.NoError(t, err)
		require.Equal(t, int64(2), e.Offset)
		e, err = client.WaitForEvent(ctx, s, itx.Predicate{PayloadContains: json.RawMessage(`{"tags":["y"]}`)}, 0, time.Second)
		require.NoError(t, err)
		require.Equal(t, int64(1), e.Offset)
		e, err = client.WaitForEvent(ctx, s, itx.Predicate{Where: "payload.n = 2"}, 0, time.Second)
		require.NoError(t, err)
		require.Equal(t, int64(2), e.Offset)
	})
	t.Run("after is exclusive", func(t *testing.T) {
		_, err := client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"a"}}, 1, 200*time.Millisecond)
		requireCode(t, err, itx.EDeadlineExceeded)
	})
	t.Run("after beyond the head", func(t *testing.T) {
		_, err := client.WaitForEvent(ctx, s, itx.Predicate{}, 99, 200*time.Millisecond)
		requireCode(t, err, itx.EInvalid)
	})
	t.Run("future event, ephemeral too", func(t *testing.T) {
		type res struct {
			e   itx.Event
			err error
		}
		done := make(chan res, 2)
		go func() {
			e, err := client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"later"}}, 2, 10*time.Second)
			done <- res{e, err}
		}()
		go func() {
			e, err := client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"eph"}}, 2, 10*time.Second)
			done <- res{e, err}
		}()
		// The waiters must be registered before the appends: wait for them by appending
		// until both answered (each append is a later event than the last).
		for i := 0; i < 2; {
			mustAppend(t, s, ev("later", `{}`), itx.EventInput{Type: "eph", Ephemeral: true})
			select {
			case r := <-done:
				require.NoError(t, r.err)
				i++
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	t.Run("bad where", func(t *testing.T) {
		_, err := client.WaitForEvent(ctx, s, itx.Predicate{Where: "payload.("}, 0, time.Second)
		requireCode(t, err, itx.EInvalid)
	})
}

func TestBBCore_Streams(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	ctx := ctxT(t)
	for _, bad := range []string{"", "a", "/a/", "//", "/a//b", "/a b", "/a/../b", "/a/./b"} {
		t.Run("bad path "+bad, func(t *testing.T) {
			s := client.Stream(ctx, p, bad)
			defer s.Release()
			_, err := client.Append(ctx, s, []itx.EventInput{ev("a", `{}`)}, itx.AppendOptions{})
			requireCode(t, err, itx.EInvalid)
		})
	}
	all, err := client.ListStreams(ctx, p, "")
	require.NoError(t, err)
	require.Empty(t, all, "nothing written by bad paths")

	for _, path := range []string{"/", "/a", "/a/b", "/ab", "/b"} {
		mustAppend(t, stream(t, p, path), ev("x", `{}`))
	}
	paths := func(infos []itx.StreamInfo) []string {
		var out []string
		for _, i := range infos {
			out = append(out, i.Path)
		}
		return out
	}
	all, err = client.ListStreams(ctx, p, "")
	require.NoError(t, err)
	require.Equal(t, []string{"/", "/a", "/a/b", "/ab", "/b"}, paths(all))
	all, err = client.ListStreams(ctx, p, "/a/")
	require.NoError(t, err)
	require.Equal(t, []string{"/a/b"}, paths(all))
}

// Issue 7.

func TestBBCore_Configure(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	ctx := ctxT(t)
	s := stream(t, p, "/bb/cfg")
	mustAppend(t, s, ev("a", `{}`))
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()

	var mu sync.Mutex
	var got []int64
	rcv := client.ServeReceiver(func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range b.Events {
			got = append(got, e.Offset)
		}
		return 0, nil
	})
	h, err := client.MountReceiver(ctx, p, "rcv", rcv)
	require.NoError(t, err)
	defer h.Release()

	cfg := client.SubscriptionConfig{Name: "c", Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "rcv"}}
	name, off, err := client.ConfigureSubscription(ctx, subs, cfg)
	require.NoError(t, err)
	require.Equal(t, "c", name)
	sub := client.Subscription(ctx, s, "c")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, off, 10*time.Second)
	require.NoError(t, err)

	name2, off2, err := client.ConfigureSubscription(ctx, subs, cfg)
	require.NoError(t, err)
	require.Equal(t, name, name2)
	require.Equal(t, off, off2)
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.Equal(t, off, info.HeadOffset, "identical configure appends nothing")

	cfg.Description = "changed"
	_, off3, err := client.ConfigureSubscription(ctx, subs, cfg)
	require.NoError(t, err)
	require.Greater(t, off3, off)
	_, err = client.WaitUntilProcessed(ctx, sub, off3, 10*time.Second)
	require.NoError(t, err)
	mu.Lock()
	require.Equal(t, []int64{1, 2, 3}, got, "no redelivery")
	mu.Unlock()

	t.Run("nameless", func(t *testing.T) {
		c := client.SubscriptionConfig{Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "rcv"}, Start: "now"}
		_, _, err := client.ConfigureSubscription(ctx, subs, c)
		requireCode(t, err, itx.EInvalid)
		c.IdempotencyKey = "nk"
		n1, o1, err := client.ConfigureSubscription(ctx, subs, c)
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("subscription:%d", o1), n1)
		n2, o2, err := client.ConfigureSubscription(ctx, subs, c)
		require.NoError(t, err)
		require.Equal(t, n1, n2)
		require.Equal(t, o1, o2)
	})
}

// bbWaitSub polls a subscription's description until ok holds (the probes have no other signal
// for a ladder's state than describe), failing after d.
func bbWaitSub(t *testing.T, ctx context.Context, sub interface {
	Release()
}, describe func() (itx.SubscriptionDescription, error), d time.Duration, ok func(itx.SubscriptionDescription) bool) itx.SubscriptionDescription {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		desc, err := describe()
		require.NoError(t, err)
		if ok(desc) {
			return desc
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not reached: %+v", desc)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestBBCore_Delivery(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	ctx := ctxT(t)

	t.Run("parked until mounted", func(t *testing.T) {
		s := stream(t, p, "/bb/park")
		mustAppend(t, s, ev("a", `{}`))
		subs := client.Subscriptions(ctx, s)
		defer subs.Release()
		_, off, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "p", OnFailingEvent: "skip",
			Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "later"}})
		require.NoError(t, err)
		sub := client.Subscription(ctx, s, "p")
		defer sub.Release()
		desc := func() (itx.SubscriptionDescription, error) { return client.DescribeSubscription(ctx, sub) }
		d := bbWaitSub(t, ctx, sub, desc, 10*time.Second, func(d itx.SubscriptionDescription) bool { return d.Status == itx.StatusParked })
		require.Zero(t, d.Attempt)
		list, err := client.ListSubscriptions(ctx, subs)
		require.NoError(t, err)
		require.Equal(t, itx.StatusParked, list[0].Status)
		got := make(chan int64, 10)
		h, err := client.MountReceiver(ctx, p, "later", client.ServeReceiver(func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
			for _, e := range b.Events {
				got <- e.Offset
			}
			return 0, nil
		}))
		require.NoError(t, err)
		defer h.Release()
		c, err := client.WaitUntilProcessed(ctx, sub, off, 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, off, c)
		require.Equal(t, int64(1), <-got)
		d, err = client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		require.Equal(t, itx.StatusActive, d.Status)
	})

	t.Run("isolation under halt", func(t *testing.T) {
		s := stream(t, p, "/bb/iso")
		mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("bad", `{}`), ev("a", `{}`))
		var mu sync.Mutex
		var batches [][]int64
		h, err := client.MountReceiver(ctx, p, "iso", client.ServeReceiver(func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
			mu.Lock()
			batches = append(batches, bbOffsets(b.Events))
			mu.Unlock()
			for _, e := range b.Events {
				if e.Type == "bad" {
					return 0, fmt.Errorf("refused %d", e.Offset)
				}
			}
			return 0, nil
		}))
		require.NoError(t, err)
		defer h.Release()
		subs := client.Subscriptions(ctx, s)
		defer subs.Release()
		_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "i",
			Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "iso"}})
		require.NoError(t, err)
		sub := client.Subscription(ctx, s, "i")
		defer sub.Release()
		desc := func() (itx.SubscriptionDescription, error) { return client.DescribeSubscription(ctx, sub) }
		d := bbWaitSub(t, ctx, sub, desc, 15*time.Second, func(d itx.SubscriptionDescription) bool {
			return d.ConfirmedOffset == 2 && d.FailingEventOffset == 3 && d.Attempt >= 2
		})
		mu.Lock()
		t.Logf("batches %v; desc %+v", batches, d.CursorState)
		mu.Unlock()
		require.Contains(t, d.LastError, "refused 3")
		require.Equal(t, itx.StatusActive, d.Status)
	})

	t.Run("terminal halts at once", func(t *testing.T) {
		s := stream(t, p, "/bb/term")
		mustAppend(t, s, ev("a", `{}`))
		subs := client.Subscriptions(ctx, s)
		defer subs.Release()
		cfg := client.SubscriptionConfig{Name: "no-such-processor", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}}
		_, off, err := client.ConfigureSubscription(ctx, subs, cfg)
		require.NoError(t, err)
		sub := client.Subscription(ctx, s, "no-such-processor")
		defer sub.Release()
		desc := func() (itx.SubscriptionDescription, error) { return client.DescribeSubscription(ctx, sub) }
		d := bbWaitSub(t, ctx, sub, desc, 10*time.Second, func(d itx.SubscriptionDescription) bool { return d.Status == itx.StatusHalted })
		t.Logf("terminal: %+v", d.CursorState)
		require.Equal(t, 1, d.Attempt)
		require.NotEmpty(t, d.LastError)
		halted, err := client.GetEvents(ctx, s, itx.Query{Types: []string{itx.TypeSubscriptionHalted}})
		require.NoError(t, err)
		require.Len(t, halted, 1)
		t.Logf("halted event: %s", halted[0].Payload)
		// An identical configure keeps the halt and appends nothing.
		info, err := client.Describe(ctx, s)
		require.NoError(t, err)
		_, off2, err := client.ConfigureSubscription(ctx, subs, cfg)
		require.NoError(t, err)
		require.Equal(t, off, off2)
		info2, err := client.Describe(ctx, s)
		require.NoError(t, err)
		require.Equal(t, info.HeadOffset, info2.HeadOffset)
		d, err = desc()
		require.NoError(t, err)
		require.Equal(t, itx.StatusHalted, d.Status)
	})

	t.Run("filter failure recorded once per event", func(t *testing.T) {
		s := stream(t, p, "/bb/filt")
		mustAppend(t, s, ev("a", `{"n":1}`), ev("a", `{"n":"str"}`), ev("a", `{"n":2}`))
		var mu sync.Mutex
		var seen []int64
		h, err := client.MountReceiver(ctx, p, "filt", client.ServeReceiver(func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
			mu.Lock()
			seen = append(seen, bbOffsets(b.Events)...)
			mu.Unlock()
			return 0, nil
		}))
		require.NoError(t, err)
		defer h.Release()
		subs := client.Subscriptions(ctx, s)
		defer subs.Release()
		_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "f", FilterTypes: []string{"a"},
			FilterCondition: `payload.n + 1 > 0`, Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "filt"}})
		require.NoError(t, err)
		sub := client.Subscription(ctx, s, "f")
		defer sub.Release()
		desc := func() (itx.SubscriptionDescription, error) { return client.DescribeSubscription(ctx, sub) }
		d := bbWaitSub(t, ctx, sub, desc, 15*time.Second, func(d itx.SubscriptionDescription) bool {
			return d.FailingEventOffset == 2 && (d.Attempt >= 3 || d.Status == itx.StatusHalted)
		})
		t.Logf("filter: %+v", d.CursorState)
		errs, err := client.GetEvents(ctx, s, itx.Query{Types: []string{itx.TypeErrorOccurred}})
		require.NoError(t, err)
		require.Len(t, errs, 1, "one stream/error-occurred per failing event")
		mu.Lock()
		require.Equal(t, []int64{1}, seen)
		mu.Unlock()
		require.Equal(t, int64(1), d.ConfirmedOffset)
	})

	t.Run("no progress backs off", func(t *testing.T) {
		s := stream(t, p, "/bb/noprog")
		mustAppend(t, s, ev("a", `{}`), ev("a", `{}`))
		var mu sync.Mutex
		calls := 0
		h, err := client.MountReceiver(ctx, p, "noprog", client.ServeReceiver(func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
			mu.Lock()
			calls++
			mu.Unlock()
			if b.Events[0].Offset == 1 {
				return 0, nil // the first batch: all of it
			}
			return 1, nil // at or below the cursor: no progress
		}))
		require.NoError(t, err)
		defer h.Release()
		subs := client.Subscriptions(ctx, s)
		defer subs.Release()
		_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "np",
			Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "noprog"}})
		require.NoError(t, err)
		sub := client.Subscription(ctx, s, "np")
		defer sub.Release()
		_, err = client.WaitUntilProcessed(ctx, sub, 3, 5*time.Second)
		require.NoError(t, err)
		mustAppend(t, s, ev("a", `{}`))
		desc := func() (itx.SubscriptionDescription, error) { return client.DescribeSubscription(ctx, sub) }
		d := bbWaitSub(t, ctx, sub, desc, 10*time.Second, func(d itx.SubscriptionDescription) bool { return d.Attempt >= 2 })
		t.Logf("no progress: %+v", d.CursorState)
		require.NotEmpty(t, d.LastError)
		require.NotZero(t, d.NextAttemptAt)
		mu.Lock()
		require.Less(t, calls, 10)
		mu.Unlock()
	})

	t.Run("copies at the size limit", func(t *testing.T) {
		s := stream(t, p, "/bb/big")
		big := `{"s":"` + strings.Repeat("a", itx.MaxEventBytes-20) + `"}`
		in := itx.EventInput{Type: "b", Payload: json.RawMessage(big)}
		for in.Size() > itx.MaxEventBytes {
			big = big[:len(big)-3] + `"}`
			in.Payload = json.RawMessage(big)
		}
		t.Logf("event size %d of %d", in.Size(), itx.MaxEventBytes)
		mustAppend(t, s, in)
		subs := client.Subscriptions(ctx, s)
		defer subs.Release()
		name := strings.Repeat("n", 500)
		_, off, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: name,
			Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/bb/big-copy"}})
		require.NoError(t, err)
		sub := client.Subscription(ctx, s, name)
		defer sub.Release()
		_, err = client.WaitUntilProcessed(ctx, sub, off, 15*time.Second)
		require.NoError(t, err)
		evs, err := client.GetEvents(ctx, stream(t, p, "/bb/big-copy"), itx.Query{})
		require.NoError(t, err)
		require.Len(t, evs, 2)
		require.JSONEq(t, big, string(evs[0].Payload))
	})
}

func TestBBCore_BreakerSparesControl(t *testing.T) {
	ts := startServer(t, server.Config{BreakerBurst: 5, BreakerRefillPerMinute: 1})
	p := ts.project(t)
	ctx := ctxT(t)
	s := stream(t, p, "/bb/breaker")
	var err error
	for i := 0; i < 10 && err == nil; i++ {
		_, err = client.Append(ctx, s, []itx.EventInput{ev("a", `{}`)}, itx.AppendOptions{})
	}
	requireCode(t, err, itx.ERateLimited)
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	head := info.HeadOffset
	_, err = client.Append(ctx, s, []itx.EventInput{ev("a", `{}`), ev("a", `{}`)}, itx.AppendOptions{})
	requireCode(t, err, itx.ERateLimited)
	info, err = client.Describe(ctx, s)
	require.NoError(t, err)
	require.Equal(t, head, info.HeadOffset, "nothing written")
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "c", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/bb/breaker-copy"}})
	require.NoError(t, err)
	_, err = client.SetSubscriptionCursor(ctx, s, "c", 0)
	require.NoError(t, err)
	_, err = client.RemoveSubscription(ctx, subs, "c")
	require.NoError(t, err)
}

func TestBBCore_LogEdges(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	ctx := ctxT(t)

	t.Run("empty batch", func(t *testing.T) {
		s := stream(t, p, "/bb/empty")
		r, err := client.Append(ctx, s, nil, itx.AppendOptions{})
		t.Logf("empty batch: %+v %v", r, err)
		all, err := client.ListStreams(ctx, p, "/bb/empty")
		require.NoError(t, err)
		t.Logf("listed after empty batch: %d", len(all))
	})
	t.Run("round trip", func(t *testing.T) {
		s := stream(t, p, "/bb/rt")
		mustAppend(t, s, itx.EventInput{Type: "t"}, itx.EventInput{Type: "t", Payload: json.RawMessage(`{"a":[1,2.5,"x",null,true]}`),
			Metadata: json.RawMessage(`{"m":"v"}`), IdempotencyKey: "key-1"})
		evs, err := client.GetEvents(ctx, s, itx.Query{})
		require.NoError(t, err)
		require.Len(t, evs, 2)
		require.JSONEq(t, `{}`, string(evs[0].Payload))
		require.JSONEq(t, `{"a":[1,2.5,"x",null,true]}`, string(evs[1].Payload))
		require.JSONEq(t, `{"m":"v"}`, string(evs[1].Metadata))
		require.Equal(t, "key-1", evs[1].IdempotencyKey)
		require.NotZero(t, evs[0].CreatedAt)
		require.LessOrEqual(t, evs[0].CreatedAt, evs[1].CreatedAt)
		_, err = client.Append(ctx, s, []itx.EventInput{keyed("t", `{}`, strings.Repeat("k", 513))}, itx.AppendOptions{})
		requireCode(t, err, itx.EInvalid)
		r, err := client.Append(ctx, s, []itx.EventInput{keyed("t", `{}`, strings.Repeat("k", 512))}, itx.AppendOptions{})
		require.NoError(t, err)
		require.Equal(t, []int64{3}, r.Offsets)
	})
	t.Run("waitForEvent on a stream not yet created", func(t *testing.T) {
		s := stream(t, p, "/bb/unborn-wait")
		done := make(chan error, 1)
		go func() {
			_, err := client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"x"}}, 0, 10*time.Second)
			done <- err
		}()
		s2 := stream(t, p, "/bb/unborn-wait")
		for i := 0; ; i++ {
			mustAppend(t, s2, ev("x", `{}`))
			select {
			case err := <-done:
				require.NoError(t, err)
				return
			case <-time.After(100 * time.Millisecond):
			}
			require.Less(t, i, 50)
		}
	})
	t.Run("waitForEvent includeEphemeral", func(t *testing.T) {
		s := stream(t, p, "/bb/eph-wait")
		mustAppend(t, s, itx.EventInput{Type: "e", Ephemeral: true}, ev("d", `{}`))
		_, err := client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"e"}}, 0, 200*time.Millisecond)
		requireCode(t, err, itx.EDeadlineExceeded)
		e, err := client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"e"}, IncludeEphemeral: true}, 0, time.Second)
		require.NoError(t, err)
		require.Equal(t, int64(1), e.Offset)
		e, err = client.WaitForEvent(ctx, s, itx.Predicate{Where: `type = "d"`}, 0, time.Second)
		require.NoError(t, err)
		require.Equal(t, int64(2), e.Offset)
	})
	t.Run("list pages", func(t *testing.T) {
		for i := 0; i < 5; i++ {
			mustAppend(t, stream(t, p, fmt.Sprintf("/bb/list/%d", i)), ev("x", `{}`))
		}
		streams := client.Streams(ctx, p)
		defer streams.Release()
		page, next, err := client.ListStreamsPage(ctx, streams, "/bb/list/", "", 2)
		require.NoError(t, err)
		require.Len(t, page, 2)
		require.Equal(t, "/bb/list/1", next)
		page, next, err = client.ListStreamsPage(ctx, streams, "/bb/list/", next, 2)
		require.NoError(t, err)
		require.Equal(t, "/bb/list/2", page[0].Path)
		page, next, err = client.ListStreamsPage(ctx, streams, "/bb/list/", next, 2)
		require.NoError(t, err)
		require.Len(t, page, 1)
		require.Empty(t, next)
		_, _, err = client.ListStreamsPage(ctx, streams, "/bb/list/", "", 10001)
		requireCode(t, err, itx.EInvalid)
		page, _, err = client.ListStreamsPage(ctx, streams, "/bb/list/", "", 0)
		require.NoError(t, err)
		require.Len(t, page, 5)
		require.Equal(t, int64(1), page[0].HeadOffset)
		require.NotEmpty(t, page[0].StreamID)
	})
}

func TestBBCore_Outages(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	ctx := ctxT(t)

	t.Run("unavailable receiver never skips", func(t *testing.T) {
		s := stream(t, p, "/bb/outage")
		mustAppend(t, s, ev("a", `{}`))
		var mu sync.Mutex
		calls := 0
		h, err := client.MountReceiver(ctx, p, "down", client.ServeReceiver(func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
			mu.Lock()
			calls++
			mu.Unlock()
			return 0, itx.Errorf(itx.EUnavailable, "down for maintenance")
		}))
		require.NoError(t, err)
		defer h.Release()
		subs := client.Subscriptions(ctx, s)
		defer subs.Release()
		_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "o", OnFailingEvent: "skip",
			Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "down"}})
		require.NoError(t, err)
		sub := client.Subscription(ctx, s, "o")
		defer sub.Release()
		desc := func() (itx.SubscriptionDescription, error) { return client.DescribeSubscription(ctx, sub) }
		d := bbWaitSub(t, ctx, sub, desc, 15*time.Second, func(d itx.SubscriptionDescription) bool { return d.Attempt >= 4 })
		t.Logf("outage: %+v", d.CursorState)
		require.Zero(t, d.ConfirmedOffset)
		require.Zero(t, d.FailingEventSkips)
		require.Equal(t, itx.StatusActive, d.Status)
		errs, err := client.GetEvents(ctx, s, itx.Query{Types: []string{itx.TypeErrorOccurred}})
		require.NoError(t, err)
		require.Empty(t, errs, "nothing skipped")
	})

	t.Run("new start is a new birth", func(t *testing.T) {
		s := stream(t, p, "/bb/restart")
		mustAppend(t, s, ev("a", `{}`))
		h, err := client.MountReceiver(ctx, p, "ok", client.ServeReceiver(func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
			return 0, nil
		}))
		require.NoError(t, err)
		defer h.Release()
		subs := client.Subscriptions(ctx, s)
		defer subs.Release()
		cfg := client.SubscriptionConfig{Name: "r", Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "ok"}}
		_, off, err := client.ConfigureSubscription(ctx, subs, cfg)
		require.NoError(t, err)
		sub := client.Subscription(ctx, s, "r")
		defer sub.Release()
		_, err = client.WaitUntilProcessed(ctx, sub, off, 5*time.Second)
		require.NoError(t, err)
		_, err = client.ResumeSubscription(ctx, s, "r")
		requireCode(t, err, itx.EFailedPrecondition)
		cfg.Start = "now"
		_, off2, err := client.ConfigureSubscription(ctx, subs, cfg)
		require.NoError(t, err)
		d, err := client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		require.Equal(t, off2, d.ConfiguredAtOffset)
		require.Equal(t, off2, d.ConfirmedOffset)
		// remove, then the same name again: a new subscription.
		_, err = client.RemoveSubscription(ctx, subs, "r")
		require.NoError(t, err)
		d2, err := client.DescribeSubscription(ctx, sub)
		requireCode(t, err, itx.ENotFound)
		_ = d2
		_, off3, err := client.ConfigureSubscription(ctx, subs, cfg)
		require.NoError(t, err)
		require.Greater(t, off3, off2)
	})
}

func TestBBCore_Concurrent(t *testing.T) {
	ts := startServer(t, server.Config{IdleTimeout: 200 * time.Millisecond})
	ctx := ctxT(t)
	const n = 16
	projects := make([]interface{}, 0)
	_ = projects
	ss := make([]func() (itx.AppendResult, error), 0)
	_ = ss

	t.Run("conditional appends racing for one head", func(t *testing.T) {
		for round := 0; round < 5; round++ {
			path := fmt.Sprintf("/bb/cc/%d", round)
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
					if err == nil {
						ok++
					} else if itx.ErrorCode(err) == itx.EOffsetConflict {
						conflicts++
					} else {
						t.Errorf("append %d: %v", i, err)
					}
				}(i)
			}
			wg.Wait()
			require.Equal(t, 1, ok, "one winner")
			require.Equal(t, n-1, conflicts)
			info, err := client.Describe(ctx, stream(t, ts.project(t), path))
			require.NoError(t, err)
			require.Equal(t, int64(1), info.HeadOffset)
		}
	})
	t.Run("one key racing", func(t *testing.T) {
		for round := 0; round < 5; round++ {
			path := fmt.Sprintf("/bb/ck/%d", round)
			var wg sync.WaitGroup
			var mu sync.Mutex
			offs := map[int64]int{}
			conflicts := 0
			for i := 0; i < n; i++ {
				s := stream(t, ts.project(t), path)
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					body := `{"same":true}`
					if i%4 == 3 {
						body = `{"other":true}`
					}
					r, err := client.Append(ctx, s, []itx.EventInput{keyed("k", body, "the-key")}, itx.AppendOptions{})
					mu.Lock()
					defer mu.Unlock()
					if err == nil {
						offs[r.Offsets[0]]++
					} else if itx.ErrorCode(err) == itx.EIdempotencyConflict {
						conflicts++
					} else {
						t.Errorf("append %d: %v", i, err)
					}
				}(i)
			}
			wg.Wait()
			require.Len(t, offs, 1, "every success answers the one offset: %v", offs)
			info, err := client.Describe(ctx, stream(t, ts.project(t), path))
			require.NoError(t, err)
			require.Equal(t, int64(1), info.HeadOffset)
			t.Logf("round %d: %v, %d conflicts", round, offs, conflicts)
		}
	})
	t.Run("many appenders dense", func(t *testing.T) {
		path := "/bb/dense"
		var wg sync.WaitGroup
		var mu sync.Mutex
		byOff := map[int64]string{}
		for i := 0; i < n; i++ {
			s := stream(t, ts.project(t), path)
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				for j := 0; j < 20; j++ {
					body := fmt.Sprintf(`{"w":%d,"j":%d}`, i, j)
					in := []itx.EventInput{ev("d", body)}
					if j%3 == 0 {
						in = append(in, itx.EventInput{Type: "e", Ephemeral: true})
					}
					r, err := client.Append(ctx, s, in, itx.AppendOptions{})
					if err != nil {
						t.Errorf("append: %v", err)
						return
					}
					mu.Lock()
					byOff[r.Offsets[0]] = body
					mu.Unlock()
				}
			}(i)
		}
		wg.Wait()
		s := stream(t, ts.project(t), path)
		evs, err := client.ReadAll(ctx, s, itx.Query{IncludeEphemeral: true})
		require.NoError(t, err)
		for i, e := range evs {
			require.Equal(t, int64(i+1), e.Offset, "dense")
			if e.Type == "d" {
				require.JSONEq(t, byOff[e.Offset], string(e.Payload))
			}
		}
		// Unloaded after idling: the listing keeps the head.
		deadline := time.Now().Add(10 * time.Second)
		for {
			all, err := client.ListStreams(ctx, ts.project(t), path)
			require.NoError(t, err)
			require.Len(t, all, 1)
			require.Equal(t, int64(len(evs)), all[0].HeadOffset)
			if !all[0].Loaded {
				break
			}
			require.True(t, time.Now().Before(deadline), "unloaded")
			time.Sleep(50 * time.Millisecond)
		}
		info, err := client.Describe(ctx, s)
		require.NoError(t, err)
		require.Equal(t, int64(len(evs)), info.HeadOffset)
		r := mustAppend(t, s, ev("after", `{}`))
		require.Equal(t, []int64{int64(len(evs)) + 1}, r.Offsets)
	})
}

func TestBBCore_MoreReads(t *testing.T) {
	ts := startServer(t, server.Config{EphemeralBufferBytes: 1000})
	p := ts.project(t)
	ctx := ctxT(t)
	s := stream(t, p, "/bb/more")
	mustAppend(t, s, ev("a", `{"n":1}`), ev("b", `{"n":2}`), ev("a", `{"n":3}`))
	evs, err := client.GetEvents(ctx, s, itx.Query{Types: []string{"*", "a"}})
	require.NoError(t, err)
	require.Len(t, evs, 3)
	evs, err = client.GetEvents(ctx, s, itx.Query{Types: []string{"a", "b"}})
	require.NoError(t, err)
	require.Len(t, evs, 3)
	evs, err = client.GetEvents(ctx, s, itx.Query{Before: 1})
	require.NoError(t, err)
	require.Empty(t, evs)
	evs, err = client.GetEvents(ctx, s, itx.Query{Before: 100})
	require.NoError(t, err)
	require.Len(t, evs, 3)
	_, err = client.WaitForEvent(ctx, s, itx.Predicate{PayloadContains: json.RawMessage(`{`)}, 0, time.Second)
	requireCode(t, err, itx.EInvalid)
	e, err := client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"a"}, PayloadContains: json.RawMessage(`{"n":3}`)}, 0, time.Second)
	require.NoError(t, err)
	require.Equal(t, int64(3), e.Offset)

	// The ephemeral buffer: the oldest go first; offsets are never reissued.
	for i := 0; i < 20; i++ {
		mustAppend(t, s, itx.EventInput{Type: "eph", Payload: json.RawMessage(fmt.Sprintf(`{"pad":"%s","i":%d}`, strings.Repeat("x", 80), i)), Ephemeral: true})
	}
	r := mustAppend(t, s, ev("a", `{}`))
	require.Equal(t, []int64{24}, r.Offsets)
	evs, err = client.GetEvents(ctx, s, itx.Query{IncludeEphemeral: true})
	require.NoError(t, err)
	t.Logf("after eviction: %v", bbOffsets(evs))
	require.Equal(t, []int64{1, 2, 3}, bbOffsets(evs[:3]), "durable events stay")
	require.Equal(t, int64(24), evs[len(evs)-1].Offset)
	require.Less(t, len(evs), 24)
	require.Equal(t, int64(23), evs[len(evs)-2].Offset, "the newest ephemeral stays")
}

func TestBBCore_SurfaceClaims(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	ctx := ctxT(t)
	s := stream(t, p, "/bb/claims")
	mustAppend(t, s, keyed("a", `{}`, "k"), ev("b", `{}`), ev("c", `{}`))
	r, err := client.Append(ctx, s, []itx.EventInput{keyed("a", `{}`, "k")}, itx.AppendOptions{})
	require.NoError(t, err)
	require.Equal(t, int64(3), r.HeadOffset, "a duplicate's answer carries the head")

	streams := client.Streams(ctx, p)
	defer streams.Release()
	for i := 0; i < 3; i++ {
		mustAppend(t, stream(t, p, fmt.Sprintf("/bb/exact/%d", i)), ev("x", `{}`))
	}
	page, next, err := client.ListStreamsPage(ctx, streams, "/bb/exact/", "", 3)
	require.NoError(t, err)
	require.Len(t, page, 3)
	require.Empty(t, next, "no more follow")
	page, next, err = client.ListStreamsPage(ctx, streams, "/bb/exact/", "/bb/exact/1", 1)
	require.NoError(t, err)
	require.Len(t, page, 1)
	require.Empty(t, next, "no more follow")

	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, err = client.RemoveSubscription(ctx, subs, "nope")
	requireCode(t, err, itx.ENotFound)
	_, err = client.SetSubscriptionCursor(ctx, s, "nope", 0)
	requireCode(t, err, itx.ENotFound)

	var mu sync.Mutex
	var got []int64
	recv := func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, bbOffsets(b.Events)...)
		return 0, nil
	}
	h1, err := client.MountReceiver(ctx, p, "one", client.ServeReceiver(recv))
	require.NoError(t, err)
	defer h1.Release()
	h2, err := client.MountReceiver(ctx, p, "two", client.ServeReceiver(recv))
	require.NoError(t, err)
	defer h2.Release()
	cfg := client.SubscriptionConfig{Name: "k", Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "one"}}
	_, off, err := client.ConfigureSubscription(ctx, subs, cfg)
	require.NoError(t, err)
	sub := client.Subscription(ctx, s, "k")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, off, 5*time.Second)
	require.NoError(t, err)
	_, err = client.SetSubscriptionCursor(ctx, s, "k", 99)
	t.Logf("cursor-set beyond the head: %v", err)
	require.Error(t, err)

	cfg.Receiver.Capability = "two"
	_, off2, err := client.ConfigureSubscription(ctx, subs, cfg)
	require.NoError(t, err)
	_, err = client.WaitUntilProcessed(ctx, sub, off2, 5*time.Second)
	require.NoError(t, err)
	mu.Lock()
	require.Equal(t, []int64{1, 2, 3, 4, 5}, got, "same kind, another capability: the cursor stays")
	got = nil
	mu.Unlock()

	cfg.Receiver = client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/bb/claims-copy"}
	_, off3, err := client.ConfigureSubscription(ctx, subs, cfg)
	require.NoError(t, err)
	c, err := client.WaitUntilProcessed(ctx, sub, off3, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, off3, c)
	copied, err := client.GetEvents(ctx, stream(t, p, "/bb/claims-copy"), itx.Query{})
	require.NoError(t, err)
	require.Len(t, copied, int(off3), "another kind is a new birth from the beginning")
	_, err = client.WaitUntilProcessed(ctx, sub, off3+1, 200*time.Millisecond)
	requireCode(t, err, itx.EDeadlineExceeded)
}

func TestBBCore_Pipelined(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	ctx := ctxT(t)

	t.Run("conditional chain", func(t *testing.T) {
		s := stream(t, p, "/bb/pipe-cond")
		a := client.NewAppender(s, 64)
		var futs []*client.AppendFuture
		for i := 0; i < 50; i++ {
			f, err := a.Append(ctx, []itx.EventInput{ev("c", `{}`)}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: int64(i)})
			require.NoError(t, err)
			futs = append(futs, f)
		}
		// one stale expectation in the middle of the flow
		bad, err := a.Append(ctx, []itx.EventInput{ev("c", `{}`)}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 10})
		require.NoError(t, err)
		last, err := a.Append(ctx, []itx.EventInput{ev("c", `{}`)}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 50})
		require.NoError(t, err)
		for i, f := range futs {
			r, err := f.Wait(ctx)
			require.NoError(t, err, "append %d", i)
			require.Equal(t, []int64{int64(i + 1)}, r.Offsets)
		}
		_, err = bad.Wait(ctx)
		requireCode(t, err, itx.EOffsetConflict)
		r, err := last.Wait(ctx)
		require.NoError(t, err)
		require.Equal(t, []int64{51}, r.Offsets)
	})
	t.Run("one key pipelined", func(t *testing.T) {
		s := stream(t, p, "/bb/pipe-key")
		a := client.NewAppender(s, 64)
		var futs []*client.AppendFuture
		for i := 0; i < 20; i++ {
			body := `{"v":1}`
			if i == 7 {
				body = `{"v":2}`
			}
			f, err := a.Append(ctx, []itx.EventInput{keyed("k", body, "pk"), ev("n", fmt.Sprintf(`{"i":%d}`, i))}, itx.AppendOptions{})
			require.NoError(t, err)
			futs = append(futs, f)
		}
		for i, f := range futs {
			r, err := f.Wait(ctx)
			if i == 7 {
				requireCode(t, err, itx.EIdempotencyConflict)
				continue
			}
			require.NoError(t, err, "append %d", i)
			require.Equal(t, int64(1), r.Offsets[0], "append %d", i)
			require.Equal(t, i > 0, r.Duplicate[0])
		}
		evs, err := client.ReadAll(ctx, s, itx.Query{})
		require.NoError(t, err)
		require.Len(t, evs, 20)
		for i, e := range evs {
			require.Equal(t, int64(i+1), e.Offset)
		}
	})
	t.Run("where must be exactly true", func(t *testing.T) {
		s := stream(t, p, "/bb/pipe-where")
		mustAppend(t, s, ev("a", `{"n":1}`), ev("a", `{"n":0}`))
		_, err := client.WaitForEvent(ctx, s, itx.Predicate{Where: "payload.n"}, 0, 300*time.Millisecond)
		requireCode(t, err, itx.EDeadlineExceeded)
		e, err := client.WaitForEvent(ctx, s, itx.Predicate{Where: "offset > 1"}, 0, time.Second)
		require.NoError(t, err)
		require.Equal(t, int64(2), e.Offset)
	})
}

func TestBBCore_SparseType(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	ctx := ctxT(t)
	s := stream(t, p, "/bb/sparse")
	for b := 0; b < 5; b++ {
		in := make([]itx.EventInput, 1000)
		for i := range in {
			in[i] = ev("common", `{"pad":"`+strings.Repeat("p", 2000)+`"}`)
		}
		if b == 4 {
			in[900] = ev("rare", `{}`)
		}
		mustAppend(t, s, in...)
	}
	evs, err := client.GetEvents(ctx, s, itx.Query{Types: []string{"rare"}})
	require.NoError(t, err)
	require.Equal(t, []int64{4901}, bbOffsets(evs))
	pg, err := client.GetEventPage(ctx, s, itx.Query{Types: []string{"rare"}})
	require.NoError(t, err)
	require.Equal(t, []int64{4901}, bbOffsets(pg.Events))
	e, err := client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"rare"}}, 0, 2*time.Second)
	require.NoError(t, err)
	require.Equal(t, int64(4901), e.Offset)
	e, err = client.WaitForEvent(ctx, s, itx.Predicate{Where: `type = "rare"`}, 0, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, int64(4901), e.Offset)
}

func TestBBCore_CopyChainAtTheLimit(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	ctx := ctxT(t)
	src := stream(t, p, "/bb/chain/a")
	in := itx.EventInput{Type: "big", IdempotencyKey: strings.Repeat("k", itx.MaxIdempotencyKeyLength), Metadata: json.RawMessage(`{"m":"` + strings.Repeat("m", 1000) + `"}`)}
	pad := itx.MaxEventBytes
	for {
		in.Payload = json.RawMessage(`{"s":"` + strings.Repeat("a", pad) + `"}`)
		if in.Size() <= itx.MaxEventBytes {
			break
		}
		pad -= in.Size() - itx.MaxEventBytes
	}
	t.Logf("size %d", in.Size())
	mustAppend(t, src, in, ev("small", `{}`))
	hop := func(from schema.Stream, name, to string) {
		subs := client.Subscriptions(ctx, from)
		defer subs.Release()
		_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: name, FilterTypes: []string{"big", "small"},
			Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: to}})
		require.NoError(t, err)
	}
	hop(src, strings.Repeat("x", 500), "/bb/chain/b")
	hop(stream(t, p, "/bb/chain/b"), strings.Repeat("y", 500), "/bb/chain/c")
	c := stream(t, p, "/bb/chain/c")
	e, err := client.WaitForEvent(ctx, c, itx.Predicate{Types: []string{"small"}}, 0, 15*time.Second)
	require.NoError(t, err)
	evs, err := client.GetEvents(ctx, c, itx.Query{Types: []string{"big"}})
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Less(t, evs[0].Offset, e.Offset)
	require.Len(t, evs[0].Provenance, 2)
	require.JSONEq(t, string(in.Payload), string(evs[0].Payload))
}

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
			// Defaults spelled out are the same config.
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
			// What describe shows configures again as it is.
			sub := client.Subscription(ctx, s, cfg.Name)
			defer sub.Release()
			d, err := client.DescribeSubscription(ctx, sub)
			require.NoError(t, err)
			again := client.ConfigOf(d.Config)
			_, off3, err := client.ConfigureSubscription(ctx, subs, again)
			require.NoError(t, err)
			require.Equal(t, off, off3, "read back: %+v", again)
			require.Equal(t, head, mustDescribe(t, s).HeadOffset, "nothing appended")
		})
	}
}
