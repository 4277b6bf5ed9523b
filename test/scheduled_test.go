package test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// eventsOfType reads a stream's durable events of one type.
func eventsOfType(t testing.TB, s schema.Stream, typ string) []itx.Event {
	t.Helper()
	events, err := client.ReadAll(ctxT(t), s, itx.Query{Types: []string{typ}})
	require.NoError(t, err)
	return events
}

// A scheduled append lands at its time, once: listed until then, gone after; scheduling its key
// again once it landed schedules nothing and names its offset; rescheduling before moves it
// (time and body); a cancelled one never lands.
func TestScheduled_LandsOnceAtItsTime(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	ts := startServer(t, server.Config{Clock: clock})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/timers")
	mustAppend(t, s, ev("a", `{}`))

	remind := keyed("reminder", `{"n":1}`, "remind-1")
	due, appended, err := client.Schedule(ctx, s, remind, clock.Now().Add(10*time.Minute))
	require.NoError(t, err)
	require.Zero(t, appended)
	require.Equal(t, clock.Now().Add(10*time.Minute).UnixMilli(), due.UnixMilli())
	list, err := client.ListScheduled(ctx, s)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "remind-1", list[0].Event.IdempotencyKey)
	require.JSONEq(t, `{"n":1}`, string(list[0].Event.Payload))

	// Moved: a minute earlier, another body.
	moved := keyed("reminder", `{"n":2}`, "remind-1")
	_, _, err = client.Schedule(ctx, s, moved, clock.Now().Add(9*time.Minute))
	require.NoError(t, err)
	// Another, cancelled before its time.
	_, _, err = client.Schedule(ctx, s, keyed("reminder", `{"n":3}`, "remind-2"), clock.Now().Add(5*time.Minute))
	require.NoError(t, err)
	found, err := client.CancelScheduled(ctx, s, "remind-2")
	require.NoError(t, err)
	require.True(t, found)
	found, err = client.CancelScheduled(ctx, s, "remind-2")
	require.NoError(t, err)
	require.False(t, found)

	clock.Advance(8*time.Minute + 59*time.Second)
	require.NoError(t, ts.srv.Settle(ctx, server.StreamRef{ProjectID: "default", Path: "/timers"}))
	require.Empty(t, eventsOfType(t, s, "reminder"), "not due yet")

	clock.Advance(time.Second)
	waitUntil(t, "the reminder landed", func() bool { return len(eventsOfType(t, s, "reminder")) == 1 })
	got := eventsOfType(t, s, "reminder")[0]
	require.JSONEq(t, `{"n":2}`, string(got.Payload), "the moved body")
	require.Equal(t, "remind-1", got.IdempotencyKey)
	require.Equal(t, clock.Now().UnixMilli(), got.CreatedAt)
	list, err = client.ListScheduled(ctx, s)
	require.NoError(t, err)
	require.Empty(t, list)

	_, appended, err = client.Schedule(ctx, s, moved, clock.Now().Add(time.Minute))
	require.NoError(t, err)
	require.Equal(t, got.Offset, appended, "already in the log: nothing scheduled")
	clock.Advance(time.Hour)
	require.NoError(t, ts.srv.Settle(ctx, server.StreamRef{ProjectID: "default", Path: "/timers"}))
	require.Len(t, eventsOfType(t, s, "reminder"), 1, "exactly once")
}

// A scheduled append survives its stream's unload: the directory alarm loads the stream when it
// comes due, with nothing else touching it.
func TestScheduled_LoadsAnUnloadedStream(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	ts := startServer(t, server.Config{Clock: clock, IdleTimeout: time.Second})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/timers-unloaded")
	mustAppend(t, s, ev("a", `{}`))
	_, _, err := client.Schedule(ctx, s, keyed("wake", `{}`, "wake-1"), clock.Now().Add(time.Hour))
	require.NoError(t, err)
	s.Release()
	waitUntil(t, "unloaded", func() bool {
		clock.Advance(500 * time.Millisecond)
		ts.srv.Sweep()
		return ts.srv.LoadedStreams() == 0
	})
	clock.Advance(time.Hour)
	s = stream(t, ts.project(t), "/timers-unloaded")
	waitUntil(t, "landed by the alarm", func() bool {
		page, err := client.GetEventPage(ctx, s, itx.Query{Types: []string{"wake"}})
		require.NoError(t, err)
		return len(page.Events) == 1
	})
}

// A scheduled append survives a kill -9 and lands once after the restart.
func TestScheduled_SurvivesKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dir := t.TempDir()
	proc := startItxd(t, dir)
	ctx := ctxT(t)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	s := client.Stream(ctx, p, "/timers-crash")
	mustAppend(t, s, ev("a", `{}`))
	_, _, err := client.Schedule(ctx, s, keyed("later", `{"x":1}`, "later-1"), time.Now().Add(300*time.Millisecond))
	require.NoError(t, err)
	proc.kill9(t)

	proc = startItxd(t, dir)
	p = dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	s = client.Stream(ctx, p, "/timers-crash")
	waitUntil(t, "landed after the restart", func() bool {
		page, err := client.GetEventPage(ctx, s, itx.Query{Types: []string{"later"}})
		require.NoError(t, err)
		return len(page.Events) == 1
	})
	proc.stop(t)
	proc = startItxd(t, dir)
	p = dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	s = client.Stream(ctx, p, "/timers-crash")
	page, err := client.GetEventPage(ctx, s, itx.Query{Types: []string{"later"}})
	require.NoError(t, err)
	require.Len(t, page.Events, 1, "exactly once")
	list, err := client.ListScheduled(ctx, s)
	require.NoError(t, err)
	require.Empty(t, list)
}

// Bad input is refused with invalidArgument and nothing is scheduled; past the per-stream bound
// a new key is refused with limitExceeded (moving one already scheduled is not); a read-only
// view may list but not schedule.
func TestScheduled_Refused(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	ts := startServer(t, server.Config{Clock: clock, MaxScheduledPerStream: 2})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/timers-refused")
	later := clock.Now().Add(time.Hour)
	_, _, err := client.Schedule(ctx, s, keyed("x", `{}`, "k0"), later)
	requireCode(t, err, itx.ENotFound) // a stream exists from its first append
	mustAppend(t, s, ev("a", `{}`))
	eph := keyed("x", `{}`, "k-eph")
	eph.Ephemeral = true
	for _, in := range []itx.EventInput{ev("x", `{}`), eph, keyed("stream/subscription-removed", `{"name":"a"}`, "k-core"), keyed("bad type", `{}`, "k")} {
		_, _, err := client.Schedule(ctx, s, in, later)
		requireCode(t, err, itx.EInvalid)
	}
	for _, key := range []string{"k1", "k2"} {
		_, _, err := client.Schedule(ctx, s, keyed("x", `{}`, key), later)
		require.NoError(t, err)
	}
	_, _, err = client.Schedule(ctx, s, keyed("x", `{}`, "k3"), later)
	requireCode(t, err, itx.ELimitExceeded)
	_, _, err = client.Schedule(ctx, s, keyed("x", `{"moved":true}`, "k2"), later)
	require.NoError(t, err, "moving a scheduled key takes no new room")

	ro := client.ReadOnly(ctx, s)
	defer ro.Release()
	_, _, err = client.Schedule(ctx, ro, keyed("x", `{}`, "k1"), later)
	requireCode(t, err, itx.EPermissionDenied)
	list, err := client.ListScheduled(ctx, ro)
	require.NoError(t, err)
	require.Len(t, list, 2)
}

type timeoutCount struct {
	N int `json:"n"`
}

// A processor's durable timer (Args.ScheduleAppend) in itxd: the timeout lands at its time on the
// server's clock, once, and the processor reduces it.
func TestScheduled_ProcessorTimer(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	host := processors.NewHost("test")
	require.NoError(t, processors.Add(host, func() processors.Contract[timeoutCount] {
		return processors.Contract[timeoutCount]{
			Name: "timeouts", ConsumedTypes: []string{"task/opened", "task/timed-out"}, ReducerVersion: "1",
			InitialState: func() timeoutCount { return timeoutCount{} },
			Reduce: func(s timeoutCount, e itx.Event) timeoutCount {
				if e.Type == "task/timed-out" {
					s.N++
				}
				return s
			},
			ProcessEvent: func(ctx context.Context, a *processors.Args[timeoutCount]) error {
				if a.Event == nil || a.Event.Type != "task/opened" {
					return nil
				}
				return a.ScheduleAppend(ctx, time.UnixMilli(a.Event.CreatedAt).Add(10*time.Minute),
					itx.EventInput{Type: "task/timed-out", IdempotencyKey: a.IdempotencyKey("timeout", a.Event)})
			},
		}
	}))
	ts := startServer(t, server.Config{Clock: clock, Processors: host})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/tasks")
	configureProcessor(t, s, "timeouts")
	head := mustAppend(t, s, ev("task/opened", `{}`)).HeadOffset
	sub, proc := processorOf(t, s, "timeouts")
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	list, err := client.ListScheduled(ctx, s)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, clock.Now().Add(10*time.Minute).UnixMilli(), list[0].DueAt)

	clock.Advance(10 * time.Minute)
	waitUntil(t, "the timeout landed and was processed", func() bool {
		snap, err := client.Snapshot(ctx, proc)
		require.NoError(t, err)
		return snap.State == `{"n":1}`
	})
	require.Len(t, eventsOfType(t, s, "task/timed-out"), 1)
}

// A scheduled append whose time has come lands at once, not a breaker's retry (a second) later:
// one scheduled for a time already past, and the ones past a step's worth (1,000) when more come
// due together. The clock does not move after the time, so only a step taken at once lands them.
func TestScheduled_DueLandsAtOnce(t *testing.T) {
	t.Run("a time already past", func(t *testing.T) {
		clock := clocktest.New(time.Unix(1_700_000_000, 0))
		ts := startServer(t, server.Config{Clock: clock})
		ctx := ctxT(t)
		s := stream(t, ts.project(t), "/timers-past")
		mustAppend(t, s, ev("a", `{}`))
		_, _, err := client.Schedule(ctx, s, keyed("late", `{}`, "late-1"), clock.Now().Add(-time.Minute))
		require.NoError(t, err)
		waitUntil(t, "the past-due event landed", func() bool { return len(eventsOfType(t, s, "late")) == 1 })
	})
	// dueAt 0 (the epoch, as `itx` sends a Date or epoch ms of 0) is a time past like any other,
	// also beside later ones: the earliest time pending is 0, not "none".
	t.Run("the epoch, beside later ones", func(t *testing.T) {
		clock := clocktest.New(time.Unix(1_700_000_000, 0))
		ts := startServer(t, server.Config{Clock: clock})
		ctx := ctxT(t)
		s := stream(t, ts.project(t), "/timers-epoch")
		mustAppend(t, s, ev("a", `{}`))
		for i := range 8 {
			_, _, err := client.Schedule(ctx, s, keyed("later", `{}`, fmt.Sprintf("later-%d", i)), clock.Now().Add(time.Hour))
			require.NoError(t, err)
		}
		_, _, err := client.Schedule(ctx, s, keyed("epoch", `{}`, "epoch-1"), time.UnixMilli(0))
		require.NoError(t, err)
		waitUntil(t, "the epoch-due event landed", func() bool { return len(eventsOfType(t, s, "epoch")) == 1 })
		list, err := client.ListScheduled(ctx, s)
		require.NoError(t, err)
		require.Len(t, list, 8, "the later ones wait for their time")
	})
	t.Run("more than a step's worth", func(t *testing.T) {
		clock := clocktest.New(time.Unix(1_700_000_000, 0))
		ts := startServer(t, server.Config{Clock: clock})
		ctx := ctxT(t)
		s := stream(t, ts.project(t), "/timers-many")
		mustAppend(t, s, ev("a", `{}`))
		at := clock.Now().Add(time.Minute)
		n := itx.MaxAppendEvents + 1
		keys := make(chan int)
		errs := make(chan error, n)
		for range 32 {
			go func() {
				for i := range keys {
					_, _, err := client.Schedule(ctx, s, keyed("tick", `{}`, fmt.Sprintf("tick-%d", i)), at)
					errs <- err
				}
			}()
		}
		for i := range n {
			keys <- i
		}
		close(keys)
		for range n {
			require.NoError(t, <-errs)
		}
		clock.Advance(time.Minute)
		waitUntil(t, "every due event landed", func() bool { return len(eventsOfType(t, s, "tick")) == n })
		list, err := client.ListScheduled(ctx, s)
		require.NoError(t, err)
		require.Empty(t, list)
	})
}

// A scheduled event whose payload nests as deep as an append takes (itx.MaxJSONDepth) is listed
// and lands as sent, and the stream goes on; one level deeper is refused as an append is. (Before
// the bound, a payload at Go's 10,000 levels sat one level deeper in its row than the decoder
// reads: listScheduled failed `internal`, and once it came due every step of the stream failed.)
func TestScheduled_DeepPayloadLands(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	ts := startServer(t, server.Config{Clock: clock})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/timers/deep")
	mustAppend(t, s, ev("a", `{}`))
	nest := func(depth int) string { return strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth) }
	deep := nest(itx.MaxJSONDepth)
	mustAppend(t, s, ev("deep", deep)) // an append takes it

	_, _, err := client.Schedule(ctx, s, keyed("deeper", nest(itx.MaxJSONDepth+1), "deeper-1"), clock.Now().Add(time.Minute))
	require.Equal(t, itx.EInvalid, itx.ErrorCode(err), "%v", err)
	_, _, err = client.Schedule(ctx, s, keyed("deep", deep, "deep-1"), clock.Now().Add(time.Minute))
	require.NoError(t, err)
	list, err := client.ListScheduled(ctx, s)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, deep, string(list[0].Event.Payload))

	clock.Advance(time.Minute)
	landed, err := client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"deep"}}, 2, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, "deep-1", landed.IdempotencyKey)
	require.Equal(t, deep, string(landed.Payload))
	res := mustAppend(t, s, ev("after", `{}`))
	require.Equal(t, landed.Offset+1, res.HeadOffset, "the stream goes on")
}
