package test

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
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

func TestStream_AppendAndRead(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/a")
	ctx := ctxT(t)

	res := mustAppend(t, s, ev("note", `{"text":"hi"}`), ev("note", `{"text":"there"}`))
	require.Equal(t, []int64{1, 2}, res.Offsets)
	require.Equal(t, int64(2), res.HeadOffset)
	require.NotEmpty(t, res.StreamID)

	page, err := client.GetEventPage(ctx, s, itx.Query{})
	require.NoError(t, err)
	require.Equal(t, res.StreamID, page.StreamID)
	require.Equal(t, int64(2), page.StreamMaxOffset)
	require.Len(t, page.Events, 2)
	require.Equal(t, "note", page.Events[0].Type)
	require.JSONEq(t, `{"text":"hi"}`, string(page.Events[0].Payload))
	require.JSONEq(t, `{"text":"there"}`, string(page.Events[1].Payload))
	require.Equal(t, int64(2), page.Events[1].Offset)
	require.NotZero(t, page.Events[0].CreatedAt)

	t.Run("after, limit and types", func(t *testing.T) {
		mustAppend(t, s, ev("other", `{}`), ev("note", `{"n":4}`), ev("other", `{}`))
		got, err := client.GetEvents(ctx, s, itx.Query{After: 1, Limit: 2})
		require.NoError(t, err)
		require.Equal(t, []int64{2, 3}, offsetsOf(got))
		page, err := client.GetEventPage(ctx, s, itx.Query{Types: []string{"note"}, After: 1})
		require.NoError(t, err)
		require.Equal(t, []int64{2, 4}, offsetsOf(page.Events))
		require.Equal(t, int64(5), page.NextAfter, "a short page continues from the head it read")
		got, err = client.GetEvents(ctx, s, itx.Query{Before: 3})
		require.NoError(t, err)
		require.Equal(t, []int64{1, 2}, offsetsOf(got))
		got, err = client.GetEvents(ctx, s, itx.Query{Types: []string{"*"}})
		require.NoError(t, err)
		require.Len(t, got, 5)
	})

	t.Run("a stream without appends reads as empty", func(t *testing.T) {
		page, err := client.GetEventPage(ctx, stream(t, ts.project(t), "/never"), itx.Query{})
		require.NoError(t, err)
		require.Empty(t, page.Events)
		require.Empty(t, page.StreamID)
		require.Zero(t, page.StreamMaxOffset)
		streams, err := client.ListStreams(ctx, ts.project(t), "/never")
		require.NoError(t, err)
		require.Empty(t, streams, "reading does not create a stream")
	})

	t.Run("a stream without appends describes as absent", func(t *testing.T) {
		// Nothing to hold open: not loaded, as Streams.list, which does not show it, agrees.
		info, err := client.Describe(ctx, stream(t, ts.project(t), "/never-described"))
		require.NoError(t, err)
		require.Equal(t, itx.StreamInfo{Path: "/never-described"}, info)
		streams, err := client.ListStreams(ctx, ts.project(t), "/never-described")
		require.NoError(t, err)
		require.Empty(t, streams, "describing does not create a stream")
	})
}

func offsetsOf(events []itx.Event) []int64 {
	out := []int64{}
	for _, e := range events {
		out = append(out, e.Offset)
	}
	return out
}

// A chain get(path).append(...) is sent without awaiting get: both calls travel in one flight.
func TestStream_PipelinedChain(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	ctx := ctxT(t)

	sf, releaseStreams := p.Streams(ctx, nil)
	defer releaseStreams()
	streams := sf.Streams()
	gf, releaseGet := streams.Get(ctx, func(a schema.Streams_get_Params) error { return a.SetPath("/pipelined") })
	defer releaseGet()
	s := gf.Stream() // not awaited
	res, err := client.Append(ctx, s, []itx.EventInput{ev("x", `{"a":1}`)}, itx.AppendOptions{})
	require.NoError(t, err)
	require.Equal(t, []int64{1}, res.Offsets)

	// A bad path fails the pipelined call with the typed error of get.
	bad := client.Stream(ctx, p, "no-slash")
	defer bad.Release()
	_, err = client.Append(ctx, bad, []itx.EventInput{ev("x", `{}`)}, itx.AppendOptions{})
	requireCode(t, err, itx.EInvalid)

	// A bad token fails everything pipelined on the login.
	wrong := dial(t, ts.addr).Login(ctx, "itx_wrong")
	defer wrong.Release()
	_, err = client.Append(ctx, stream(t, wrong, "/a"), []itx.EventInput{ev("x", `{}`)}, itx.AppendOptions{})
	requireCode(t, err, itx.EUnauthenticated)
}

// Appends sent on one capability without waiting commit in the order they were sent.
func TestStream_PipelinedAppendsKeepOrder(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/order")
	ctx := ctxT(t)
	const n = 200
	futs := make([]schema.Stream_append_Results_Future, n)
	for i := 0; i < n; i++ {
		fut, release := s.Append(ctx, func(p schema.Stream_append_Params) error {
			l, err := p.NewEvents(1)
			if err != nil {
				return err
			}
			l.At(0).SetType("seq")
			return l.At(0).SetPayload(fmt.Sprintf(`{"i":%d}`, i))
		})
		defer release()
		futs[i] = fut
	}
	for i, fut := range futs {
		res, err := fut.Struct()
		require.NoError(t, err)
		r, _ := res.Result()
		offs, _ := r.Offsets()
		require.Equal(t, uint64(i+1), offs.At(0), "call %d", i)
	}
	got, err := client.ReadAll(ctx, s, itx.Query{})
	require.NoError(t, err)
	for i, e := range got {
		require.JSONEq(t, fmt.Sprintf(`{"i":%d}`, i), string(e.Payload))
	}
}

func TestStream_Idempotency(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/idem")
	ctx := ctxT(t)

	first := mustAppend(t, s, keyed("order", `{"id":1,"total":5}`, "order-1"))
	require.Equal(t, []int64{1}, first.Offsets)
	mustAppend(t, s, ev("noise", `{}`))

	retry := mustAppend(t, s, keyed("order", `{"total":5,"id":1}`, "order-1"))
	require.Equal(t, []int64{1}, retry.Offsets, "same body (key order aside) returns the original offset")
	require.Equal(t, []bool{true}, retry.Duplicate)

	_, err := client.Append(ctx, s, []itx.EventInput{ev("fine", `{}`), keyed("order", `{"id":1,"total":6}`, "order-1")}, itx.AppendOptions{})
	requireCode(t, err, itx.EIdempotencyConflict)
	require.Contains(t, itx.ErrorMessage(err), "offset 1")

	all, err := client.ReadAll(ctx, s, itx.Query{})
	require.NoError(t, err)
	require.Len(t, all, 2, "neither the conflict nor its batch-mate was written")

	t.Run("inside one batch", func(t *testing.T) {
		res := mustAppend(t, s, keyed("a", `{"v":1}`, "b-1"), keyed("a", `{"v":1}`, "b-1"))
		require.Equal(t, res.Offsets[0], res.Offsets[1])
		require.Equal(t, []bool{false, true}, res.Duplicate)
		_, err := client.Append(ctx, s, []itx.EventInput{keyed("a", `{"v":1}`, "b-2"), keyed("a", `{"v":2}`, "b-2")}, itx.AppendOptions{})
		requireCode(t, err, itx.EIdempotencyConflict)
	})

	t.Run("concurrent retries of one key commit once", func(t *testing.T) {
		var wg sync.WaitGroup
		offsets := make([]int64, 16)
		for i := range offsets {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := client.Append(ctx, stream(t, ts.project(t), "/idem"), []itx.EventInput{keyed("c", `{"once":true}`, "race")}, itx.AppendOptions{})
				if err == nil {
					offsets[i] = res.Offsets[0]
				}
			}()
		}
		wg.Wait()
		for _, o := range offsets {
			require.Equal(t, offsets[0], o)
			require.NotZero(t, o)
		}
		got, err := client.ReadAll(ctx, s, itx.Query{Types: []string{"c"}})
		require.NoError(t, err)
		require.Len(t, got, 1)
	})
}

func TestStream_Ephemeral(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/eph")
	ctx := ctxT(t)

	e := ev("chunk", `{"t":"tok"}`)
	e.Ephemeral = true
	res := mustAppend(t, s, ev("a", `{}`), e, ev("b", `{}`))
	require.Equal(t, []int64{1, 2, 3}, res.Offsets, "ephemeral events take an offset")

	page, err := client.GetEventPage(ctx, s, itx.Query{})
	require.NoError(t, err)
	require.Equal(t, []int64{1, 3}, offsetsOf(page.Events), "range reads skip them")
	require.Equal(t, int64(3), page.StreamMaxOffset, "the head counts them")

	page, err = client.GetEventPage(ctx, s, itx.Query{IncludeEphemeral: true})
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2, 3}, offsetsOf(page.Events))
	require.True(t, page.Events[1].Ephemeral)

	_, err = client.Append(ctx, s, []itx.EventInput{{Type: "x", Ephemeral: true, IdempotencyKey: "k"}}, itx.AppendOptions{})
	requireCode(t, err, itx.EInvalid)
}

func TestStream_ConditionalAppend(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/cas")
	ctx := ctxT(t)

	res, err := client.Append(ctx, s, []itx.EventInput{ev("a", `{}`)}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 0})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.HeadOffset)

	_, err = client.Append(ctx, s, []itx.EventInput{ev("b", `{}`)}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 0})
	requireCode(t, err, itx.EOffsetConflict)

	_, err = client.Append(ctx, s, []itx.EventInput{ev("b", `{}`)}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 1})
	require.NoError(t, err)
	all, err := client.ReadAll(ctx, s, itx.Query{})
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2}, offsetsOf(all))
}

func TestStream_CircuitBreaker(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	ts := startServer(t, server.Config{Clock: clock, BreakerBurst: 10, BreakerRefillPerMinute: 60})
	s := stream(t, ts.project(t), "/runaway")
	other := stream(t, ts.project(t), "/calm")
	ctx := ctxT(t)

	batch := make([]itx.EventInput, 10)
	for i := range batch {
		batch[i] = ev("spam", `{}`)
	}
	mustAppend(t, s, batch...)
	_, err := client.Append(ctx, s, []itx.EventInput{ev("spam", `{}`)}, itx.AppendOptions{})
	requireCode(t, err, itx.ERateLimited)
	all, err := client.ReadAll(ctx, s, itx.Query{})
	require.NoError(t, err)
	require.Len(t, all, 10, "a refused call writes nothing")

	mustAppend(t, other, ev("fine", `{}`)) // the breaker is per stream

	clock.Advance(2 * time.Second) // one token per second
	mustAppend(t, s, ev("spam", `{}`), ev("spam", `{}`))
}

// Every bad input is answered by its typed error, and nothing of the call is written.
func TestStream_BadInput(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	s := stream(t, p, "/bad")
	ctx := ctxT(t)
	mustAppend(t, s, ev("seed", `{}`))

	huge := `{"x":"` + strings.Repeat("a", itx.MaxEventBytes) + `"}`
	tooMany := make([]itx.EventInput, itx.MaxAppendEvents+1)
	for i := range tooMany {
		tooMany[i] = ev("x", `{}`)
	}
	for _, tc := range []struct {
		name   string
		events []itx.EventInput
		code   itx.Code
	}{
		{"no events", nil, itx.EInvalid},
		{"empty type", []itx.EventInput{ev("ok", `{}`), ev("", `{}`)}, itx.EInvalid},
		{"type with a space", []itx.EventInput{ev("a b", `{}`)}, itx.EInvalid},
		{"payload not JSON", []itx.EventInput{ev("ok", `{}`), ev("x", `{"a":`)}, itx.EInvalid},
		{"payload not an object", []itx.EventInput{ev("x", `[1,2]`)}, itx.EInvalid},
		{"metadata not an object", []itx.EventInput{{Type: "x", Metadata: json.RawMessage(`"m"`)}}, itx.EInvalid},
		{"ephemeral with a key", []itx.EventInput{{Type: "x", Ephemeral: true, IdempotencyKey: "k"}}, itx.EInvalid},
		{"unknown core event", []itx.EventInput{ev("stream/made-up", `{}`)}, itx.EInvalid},
		{"ephemeral core event", []itx.EventInput{{Type: "stream/error-occurred", Payload: json.RawMessage(`{"message":"m"}`), Ephemeral: true}}, itx.EInvalid},
		{"oversize event", []itx.EventInput{ev("ok", `{}`), ev("x", huge)}, itx.ETooLarge},
		{"too many events", tooMany, itx.ETooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := client.Append(ctx, s, tc.events, itx.AppendOptions{})
			requireCode(t, err, tc.code)
			info, err := client.Describe(ctx, s)
			require.NoError(t, err)
			require.Equal(t, int64(1), info.HeadOffset, "nothing written")
		})
	}

	t.Run("bad paths", func(t *testing.T) {
		for _, path := range []string{"", "relative", "/trailing/", "/a//b", "/../x", "/sp ace"} {
			_, err := client.Append(ctx, stream(t, p, path), []itx.EventInput{ev("x", `{}`)}, itx.AppendOptions{})
			requireCode(t, err, itx.EInvalid)
		}
		streams, err := client.ListStreams(ctx, p, "")
		require.NoError(t, err)
		require.Len(t, streams, 1, "no stream was created")
	})
	t.Run("bad reads", func(t *testing.T) {
		// A limit over the page's bound is capped (the schema's "capped at 500"), not refused.
		big := stream(t, p, "/big-page")
		batch := make([]itx.EventInput, itx.MaxPageLimit+100)
		for i := range batch {
			batch[i] = ev("x", `{}`)
		}
		mustAppend(t, big, batch...)
		page, err := client.GetEventPage(ctx, big, itx.Query{Limit: 2 * itx.MaxPageLimit})
		require.NoError(t, err)
		require.Len(t, page.Events, itx.MaxPageLimit)
		require.Equal(t, int64(itx.MaxPageLimit), page.NextAfter)
		require.Equal(t, int64(itx.MaxPageLimit+100), page.StreamMaxOffset, "the envelope says more follow")
		events, err := client.GetEvents(ctx, big, itx.Query{Limit: 2 * itx.MaxPageLimit})
		require.NoError(t, err, "getEvents caps a limit over the page's bound too")
		require.Len(t, events, itx.MaxPageLimit)
		_, err = client.WaitForEvent(ctx, s, itx.Predicate{Where: "payload.("}, 0, time.Second)
		requireCode(t, err, itx.EInvalid)
		// A runaway predicate is the caller's error; the server lives on (unbounded, this
		// recursion overflows the Go stack and ends the process).
		_, err = client.WaitForEvent(ctx, s, itx.Predicate{Where: `($f := function($x){ $f($x) }; $f(1))`}, 0, time.Second)
		requireCode(t, err, itx.EInvalid)
		require.Contains(t, err.Error(), "depth limit")
		_, err = client.WaitForEvent(ctx, s, itx.Predicate{PayloadContains: json.RawMessage("{nope")}, 0, time.Second)
		requireCode(t, err, itx.EInvalid)
		_, err = client.WaitForEvent(ctx, s, itx.Predicate{}, 99, time.Second)
		requireCode(t, err, itx.EInvalid)
	})
}

func TestStream_WaitForEvent(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/wait")
	ctx := ctxT(t)
	mustAppend(t, s, ev("order", `{"id":1,"status":"new"}`))

	t.Run("an event already in the log", func(t *testing.T) {
		e, err := client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"order"}}, 0, 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, int64(1), e.Offset)
	})

	t.Run("a later event, by payload and JSONata", func(t *testing.T) {
		type result struct {
			e   itx.Event
			err error
		}
		got := make(chan result, 1)
		go func() {
			e, err := client.WaitForEvent(ctx, stream(t, ts.project(t), "/wait"), itx.Predicate{
				Types: []string{"order"}, PayloadContains: json.RawMessage(`{"status":"paid"}`), Where: "payload.id > 1",
			}, 1, 20*time.Second)
			got <- result{e, err}
		}()
		// Appended while the waiter may or may not be waiting yet: either way it must be found,
		// and the near misses must not be.
		mustAppend(t, s, ev("order", `{"id":1,"status":"paid"}`), ev("order", `{"id":2,"status":"new"}`))
		mustAppend(t, s, ev("order", `{"id":2,"status":"paid"}`))
		r := <-got
		require.NoError(t, r.err)
		require.Equal(t, int64(4), r.e.Offset)
	})

	t.Run("timeout", func(t *testing.T) {
		clock := clocktest.New(time.Unix(1_700_000_000, 0))
		ts := startServer(t, server.Config{Clock: clock})
		s := stream(t, ts.project(t), "/quiet")
		mustAppend(t, s, ev("other", `{}`))
		errc := make(chan error, 1)
		go func() {
			_, err := client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"never"}}, 0, 3*time.Second)
			errc <- err
		}()
		// Move virtual time on until the barrier's timer fires (it may not be armed yet: counting
		// pending timers raced with the server's own).
		var err error
		require.Eventually(t, func() bool {
			select {
			case err = <-errc:
				return true
			default:
				clock.Advance(time.Second)
				return false
			}
		}, 20*time.Second, 5*time.Millisecond)
		requireCode(t, err, itx.EDeadlineExceeded)
		require.Contains(t, itx.ErrorMessage(err), "recent types: other")
	})

	t.Run("the timeout also bounds catching up on a long log", func(t *testing.T) {
		clock := clocktest.New(time.Unix(1_700_000_000, 0))
		ts := startServer(t, server.Config{Clock: clock})
		s := stream(t, ts.project(t), "/long")
		const n = 50_000
		batch := make([]itx.EventInput, 1000)
		for i := range batch {
			batch[i] = ev("tick", `{"n":1}`)
		}
		for range n / len(batch) {
			mustAppend(t, s, batch...)
		}
		// The server's own timers (its alarm loop's, armed at most a minute ahead) are pending
		// already: the barrier's is one more.
		timers := clock.Pending()
		errc := make(chan error, 1)
		go func() {
			_, err := client.WaitForEvent(ctx, s, itx.Predicate{Where: "payload.n > 1 and $count($keys(payload)) > 5"}, 0, 3*time.Second)
			errc <- err
		}()
		require.Eventually(t, func() bool { return clock.Pending() > timers }, 10*time.Second, time.Millisecond)
		clock.Advance(3 * time.Second) // while it is still scanning the 50,000 events
		err := <-errc
		requireCode(t, err, itx.EDeadlineExceeded)
		var seen int
		_, scanErr := fmt.Sscanf(itx.ErrorMessage(err)[strings.Index(itx.ErrorMessage(err), "(saw "):], "(saw %d events", &seen)
		require.NoError(t, scanErr, itx.ErrorMessage(err))
		require.Less(t, seen, n, "the call stopped scanning when its time was up")
	})

	t.Run("the server shutting down ends a barrier at once", func(t *testing.T) {
		ts := startServer(t, server.Config{})
		s := stream(t, ts.project(t), "/bye")
		errc := make(chan error, 1)
		go func() {
			_, err := client.WaitForEvent(context.Background(), s, itx.Predicate{Types: []string{"never"}}, 0, time.Minute)
			errc <- err
		}()
		require.Eventually(t, func() bool { return ts.srv.LoadedStreams() == 1 }, 10*time.Second, time.Millisecond)
		closeCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, ts.srv.Close(closeCtx))
		err := <-errc
		requireCode(t, err, itx.EUnavailable)
	})
}

func TestStreams_ListAndDescribe(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	ctx := ctxT(t)
	for _, path := range []string{"/agents/a1", "/agents/a2", "/other"} {
		mustAppend(t, stream(t, p, path), ev("x", `{}`), ev("y", `{}`))
	}
	list, err := client.ListStreams(ctx, p, "/agents/")
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, "/agents/a1", list[0].Path)
	require.Equal(t, int64(2), list[0].HeadOffset)
	require.NotEmpty(t, list[0].StreamID)

	info, err := client.Describe(ctx, stream(t, p, "/other"))
	require.NoError(t, err)
	require.Equal(t, int64(2), info.HeadOffset)
	require.NotZero(t, info.CreatedAt)

	// The deployment root sees its own (global) streams, not the project's.
	root := dial(t, ts.addr).Login(ctx, ts.creds.DeploymentToken)
	defer root.Release()
	list, err = client.ListStreams(ctx, root, "")
	require.NoError(t, err)
	require.Empty(t, list)
	mustAppend(t, stream(t, root, "/global"), ev("g", `{}`))
	list, err = client.ListStreams(ctx, root, "")
	require.NoError(t, err)
	require.Len(t, list, 1)
	page, err := client.GetEventPage(ctx, stream(t, p, "/global"), itx.Query{})
	require.NoError(t, err)
	require.Empty(t, page.Events, "a project does not see global streams")
}

// Streams unload when idle and reload with their log intact; reopening the data directory is a
// restart.
func TestStream_UnloadAndRestart(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	dir := t.TempDir()
	ts := startServer(t, server.Config{DataDir: dir, Clock: clock, IdleTimeout: time.Minute})
	p := ts.project(t)
	ctx := ctxT(t)
	s := stream(t, p, "/persist")
	first := mustAppend(t, s, ev("a", `{"n":1}`), ev("b", `{"n":2}`))
	require.Equal(t, 1, ts.srv.LoadedStreams())

	clock.Advance(2 * time.Minute)
	ts.srv.Sweep()
	require.Equal(t, 0, ts.srv.LoadedStreams(), "idle stream unloaded")

	res := mustAppend(t, s, ev("c", `{"n":3}`))
	require.Equal(t, []int64{3}, res.Offsets, "the head survived the unload")
	require.Equal(t, first.StreamID, res.StreamID)

	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, ts.srv.Close(closeCtx))

	ts2 := startServer(t, server.Config{DataDir: dir})
	require.Equal(t, ts.creds, ts2.creds, "the data directory keeps its projects")
	all, err := client.ReadAll(ctx, stream(t, ts2.project(t), "/persist"), itx.Query{})
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2, 3}, offsetsOf(all))
	list, err := client.ListStreams(ctx, ts2.project(t), "")
	require.NoError(t, err)
	require.Equal(t, int64(3), list[0].HeadOffset, "the directory summary was refreshed on unload")
}

func TestStream_MaxLoadedStreams(t *testing.T) {
	ts := startServer(t, server.Config{MaxLoadedStreams: 5})
	p := ts.project(t)
	for i := 0; i < 20; i++ {
		mustAppend(t, stream(t, p, fmt.Sprintf("/s%d", i)), ev("x", `{}`))
	}
	require.Eventually(t, func() bool { return ts.srv.LoadedStreams() <= 5 }, 10*time.Second, time.Millisecond)
	all, err := client.ReadAll(ctx(t), stream(t, p, "/s0"), itx.Query{})
	require.NoError(t, err)
	require.Len(t, all, 1)
}

func ctx(t *testing.T) context.Context { return ctxT(t) }

// Ephemeral rows past their retention are swept while the stream stays loaded; the head, and
// every offset, stay put.
func TestStream_EphemeralSweep(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	ts := startServer(t, server.Config{Clock: clock, EphemeralRetention: time.Hour})
	s := stream(t, ts.project(t), "/sweep")
	ctx := ctxT(t)
	chunk := ev("chunk", `{"t":"x"}`)
	chunk.Ephemeral = true
	mustAppend(t, s, ev("a", `{}`), chunk, chunk) // 1, 2, 3
	all, err := client.GetEvents(ctx, s, itx.Query{IncludeEphemeral: true})
	require.NoError(t, err)
	require.Len(t, all, 3)

	clock.Advance(2 * time.Hour)
	mustAppend(t, s, ev("b", `{}`)) // 4: the commit that triggers the sweep
	all, err = client.GetEvents(ctx, s, itx.Query{IncludeEphemeral: true})
	require.NoError(t, err)
	require.Equal(t, []int64{1, 4}, offsetsOf(all), "the old ephemeral rows are gone, leaving a gap")
	res := mustAppend(t, s, ev("c", `{}`))
	require.Equal(t, []int64{5}, res.Offsets, "offsets are never reissued")
}

// A registered reader is the ephemeral sweep's floor: expired ephemeral rows after its checkpoint
// stay until it moves past them (or it is removed); the ones before go as usual.
func TestStream_EphemeralSweepKeepsWhatAReaderHasNotRead(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	ts := startServer(t, server.Config{Clock: clock, EphemeralRetention: time.Hour})
	s := stream(t, ts.project(t), "/floor")
	ctx := ctxT(t)
	chunk := ev("chunk", `{"t":"x"}`)
	chunk.Ephemeral = true
	mustAppend(t, s, chunk, ev("a", `{}`), chunk, chunk) // 1 (eph), 2, 3 and 4 (eph)
	fut, release := s.Readers(ctx, nil)
	defer release()
	readers := fut.Readers()
	require.NoError(t, client.RegisterReader(ctx, readers, "mirror", 2))
	read := func() []int64 {
		all, err := client.GetEvents(ctx, s, itx.Query{IncludeEphemeral: true})
		require.NoError(t, err)
		return offsetsOf(all)
	}

	clock.Advance(2 * time.Hour)
	mustAppend(t, s, ev("b", `{}`)) // 5: the commit that triggers the sweep
	require.Equal(t, []int64{2, 3, 4, 5}, read(), "1 is before the reader's checkpoint; 3 and 4 wait for it")

	require.NoError(t, client.RegisterReader(ctx, readers, "mirror", 3))
	clock.Advance(time.Hour)
	mustAppend(t, s, ev("c", `{}`)) // 6
	require.Equal(t, []int64{2, 4, 5, 6}, read(), "the reader moved past 3")

	require.NoError(t, client.RemoveReader(ctx, readers, "mirror"))
	clock.Advance(time.Hour)
	mustAppend(t, s, ev("d", `{}`)) // 7
	require.Equal(t, []int64{2, 5, 6, 7}, read(), "no reader left: every expired row goes")
}

// The ephemeral buffer is bounded per stream: past it the oldest ephemeral rows go first (FIFO),
// long before their retention ends; durable rows and offsets are untouched. The bound holds
// across a restart (the buffer's size is re-read on load).
func TestStream_EphemeralBufferIsFIFO(t *testing.T) {
	dir := t.TempDir()
	const limit = 1000
	cfg := server.Config{DataDir: dir, EphemeralBufferBytes: limit}
	ts := startServer(t, cfg)
	ctx := ctxT(t)
	chunk := ev("chunk", `{"t":"`+strings.Repeat("x", 80)+`"}`)
	chunk.Ephemeral = true
	size := len(chunk.Type) + len(`{"t":"`+strings.Repeat("x", 80)+`"}`)

	check := func(s schema.Stream, durable []int64, lastEphemeral int64) {
		t.Helper()
		all, err := client.ReadAll(ctx, s, itx.Query{IncludeEphemeral: true})
		require.NoError(t, err)
		var ephemeral, kept []int64
		for _, e := range all {
			if e.Ephemeral {
				ephemeral = append(ephemeral, e.Offset)
			} else {
				kept = append(kept, e.Offset)
			}
		}
		require.Equal(t, durable, kept, "durable rows are never evicted")
		require.LessOrEqual(t, len(ephemeral)*size, limit, "the buffer holds at most its bound")
		require.GreaterOrEqual(t, len(ephemeral)*size, limit/2, "eviction frees the oldest, not everything")
		require.Equal(t, lastEphemeral, ephemeral[len(ephemeral)-1], "the newest is kept")
		for i := 1; i < len(ephemeral); i++ {
			require.Equal(t, ephemeral[i-1]+1, ephemeral[i], "what is kept is the newest run, in order")
		}
	}

	s := stream(t, ts.project(t), "/fifo")
	mustAppend(t, s, ev("a", `{}`)) // 1
	for i := 0; i < 30; i++ {
		mustAppend(t, s, chunk) // 2..31
	}
	mustAppend(t, s, ev("b", `{}`)) // 32
	check(s, []int64{1, 32}, 31)

	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, ts.srv.Close(closeCtx))
	ts = startServer(t, cfg)
	s = stream(t, ts.project(t), "/fifo")
	for i := 0; i < 10; i++ {
		mustAppend(t, s, chunk) // 33..42
	}
	check(s, []int64{1, 32}, 42)
	res := mustAppend(t, s, ev("c", `{}`))
	require.Equal(t, []int64{43}, res.Offsets, "offsets are never reissued")
}

// Streams.list pages in path order: nextAfter names where the next page starts and is empty on
// the last one; the client's ListStreams walks every page.
func TestStreams_ListPages(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	ctx := ctxT(t)
	var want []string
	for i := 0; i < 25; i++ {
		path := fmt.Sprintf("/paged/%02d", i)
		mustAppend(t, stream(t, p, path), ev("x", `{}`))
		want = append(want, path)
	}
	mustAppend(t, stream(t, p, "/other"), ev("x", `{}`))
	sf, release := p.Streams(ctx, nil)
	defer release()
	streams := sf.Streams()

	var got []string
	var sizes []int
	after := ""
	for {
		page, next, err := client.ListStreamsPage(ctx, streams, "/paged/", after, 10)
		require.NoError(t, err)
		sizes = append(sizes, len(page))
		for _, info := range page {
			got = append(got, info.Path)
		}
		if next == "" {
			break
		}
		require.Equal(t, page[len(page)-1].Path, next)
		after = next
	}
	require.Equal(t, []int{10, 10, 5}, sizes)
	require.Equal(t, want, got, "every stream once, in path order")

	all, err := client.ListStreams(ctx, p, "/paged/")
	require.NoError(t, err)
	require.Len(t, all, 25)
	page, next, err := client.ListStreamsPage(ctx, streams, "", "/paged/23", 0)
	require.NoError(t, err)
	require.Empty(t, next)
	require.Len(t, page, 1)
	require.Equal(t, "/paged/24", page[0].Path, "after is exclusive; /other sorts before it")

	_, _, err = client.ListStreamsPage(ctx, streams, "", "", server.MaxListStreams+1)
	requireCode(t, err, itx.EInvalid)
}
