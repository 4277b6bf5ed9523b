package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// poisonRuns counts the poisonContract frames that failed, over every test of the package (a
// test reads its own difference).
var poisonRuns atomic.Int64

// poisonContract fails every frame holding an crash/poison event while broken is set.
func poisonContract(broken *atomic.Bool) processors.Contract[int] {
	return processors.Contract[int]{
		Name: "poison", ConsumedTypes: []string{"crash/poison"}, ReducerVersion: "1",
		InitialState: func() int { return 0 },
		Reduce:       func(n int, e itx.Event) int { return n + 1 },
		ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
			if a.Event != nil && broken.Load() {
				poisonRuns.Add(1)
				return errors.New("poisoned")
			}
			return nil
		},
	}
}

// A processor whose frame always fails crash-loops: its keepalive revives it along the breaker's
// backoff (10s, 1m, 5m, 30m, then 6h forever), each revival delivered at once (so the failure is
// seen and the budget never resets while the loop lasts), the revivals go on after the retry
// ladder halts the wake subscription, and the fix deployed as a new version gets it through.
func TestProcessors_CrashLoopBackoffOwnedByTheBreaker(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	var broken atomic.Bool
	broken.Store(true)
	host := func(version string) *processors.Host {
		h := processors.NewHost(version)
		require.NoError(t, processors.Add(h, func() processors.Contract[int] { return poisonContract(&broken) }))
		return h
	}
	dir := t.TempDir()
	cfg := server.Config{DataDir: dir, Clock: clock, Processors: host("v1")}
	ts := startServer(t, cfg)
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/processors/crash-loop")
	configureProcessor(t, s, "poison")
	poison := mustAppend(t, s, ev("crash/poison", `{}`)).HeadOffset
	sub := client.Subscription(ctx, s, "poison")
	defer sub.Release()
	// Timer by timer, settling after each: a revival's redelivery runs at the revival's time, as
	// on a real clock. Within one 10-minute Advance, the frame's deadline and the confirming
	// fire (10 s after the revival) fired while the frame was still on its way: the frame was
	// cancelled unrun, the fire found the window quiet and disarmed (CI, 5 runs in 30 here).
	step := func(d time.Duration) {
		clock.AdvanceEach(d, func() {
			require.NoError(t, ts.srv.Settle(ctx, server.StreamRef{ProjectID: "default", Path: "/processors/crash-loop"}))
		})
	}
	var halted time.Duration
	for i := 0; ; i++ {
		d, err := client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		if d.Status == itx.StatusHalted {
			halted = time.Duration(i) * 10 * time.Second
			break
		}
		require.Less(t, i, 3600, "never halted")
		step(10 * time.Second)
	}
	revivedAtHalt, runsAtHalt := countType(t, s, itx.TypeProcessorRevived), poisonRuns.Load()
	evs, err := client.ReadAll(ctx, s, itx.Query{Types: []string{itx.TypeProcessorRevived}})
	require.NoError(t, err)
	{
		prev := 0
		for _, e := range evs {
			var p struct{ Revivals int }
			_ = json.Unmarshal(e.Payload, &p)
			if p.Revivals < prev {
				t.Errorf("BUDGET RESET during an unbroken crash loop: revivals %d after %d (the poison frame never succeeded)", p.Revivals, prev)
			}
			prev = p.Revivals
		}
	}
	require.GreaterOrEqual(t, revivedAtHalt, 4, "the breaker revived along its backoff before the ladder halted (after %v)", halted)
	for range 24 * 6 {
		step(10 * time.Minute)
	}
	revivedDayLater := countType(t, s, itx.TypeProcessorRevived)
	if revivedDayLater-revivedAtHalt < 3 {
		t.Errorf("in the 24h after the halt the breaker revived %d times; the seed's plateau is about 4 wakes/day forever", revivedDayLater-revivedAtHalt)
	}
	// Each revival is one run: the retry ladder does not start over behind it.
	require.Equal(t, int64(revivedDayLater-revivedAtHalt), poisonRuns.Load()-runsAtHalt,
		"the poison ran once per revival in the 24h after the halt")

	// The antidote deploy: the bug is fixed and itxd restarts on a new version.
	broken.Store(false)
	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, ts.srv.Close(closeCtx))
	cfg.Processors = host("v2")
	ts = startServer(t, cfg)
	s = stream(t, ts.project(t), "/processors/crash-loop")
	sub2 := client.Subscription(ctx, s, "poison")
	defer sub2.Release()
	for range 7 * 6 {
		step(10 * time.Minute)
	}
	d, err := client.DescribeSubscription(ctx, sub2)
	require.NoError(t, err)
	if d.ConfirmedOffset < poison {
		t.Errorf("7h after the antidote deploy the processor is still stuck: confirmed %d < poison %d, status %s", d.ConfirmedOffset, poison, d.Status)
	}
}

// A crash-looping processor whose subscription the operator removes is gone: its incarnation ends
// with the subscription, so its keepalive no longer revives it (no stream/processor-revived for a
// processor that no longer exists, however long the stream stays loaded).
func TestProcessors_RemovedProcessorIsNotRevived(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	var broken atomic.Bool
	broken.Store(true)
	host := processors.NewHost("v1")
	require.NoError(t, processors.Add(host, func() processors.Contract[int] { return poisonContract(&broken) }))
	ts := startServer(t, server.Config{Clock: clock, Processors: host})
	ctx := ctxT(t)
	ref := server.StreamRef{ProjectID: "default", Path: "/processors/removed"}
	s := stream(t, ts.project(t), ref.Path)
	configureProcessor(t, s, "poison")
	mustAppend(t, s, ev("crash/poison", `{}`))
	sub := client.Subscription(ctx, s, "poison")
	defer sub.Release()
	waitUntil(t, "a failed frame", func() bool {
		d, err := client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		return d.LastError != ""
	})
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, err := client.RemoveSubscription(ctx, subs, "poison")
	require.NoError(t, err)
	for range 12 {
		clock.Advance(processors.KeepaliveLead)
		require.NoError(t, ts.srv.Settle(ctx, ref))
	}
	require.Zero(t, countType(t, s, itx.TypeProcessorRevived), "revived after its subscription was removed")
}

// A crash loop's evidence (stream/error-occurred keyed processor-host-crash-loop:<version>) is
// recorded when the mark reaches the threshold, before that revival's fact: it is about the
// marks so far and does not wait on the revival (seed 002: mark before anything; the reference
// keepalive appends the evidence ahead of the revival pass), so the stream reads
// revived 1, revived 2, crash-loop evidence, revived 3.
func TestProcessors_CrashLoopEvidenceBeforeItsRevival(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	var broken atomic.Bool
	broken.Store(true)
	host := processors.NewHost("v1")
	require.NoError(t, processors.Add(host, func() processors.Contract[int] { return poisonContract(&broken) }))
	ts := startServer(t, server.Config{Clock: clock, Processors: host})
	ctx := ctxT(t)
	ref := server.StreamRef{ProjectID: "default", Path: "/processors/crash-loop-evidence"}
	s := stream(t, ts.project(t), ref.Path)
	configureProcessor(t, s, "poison")
	mustAppend(t, s, ev("crash/poison", `{}`))
	for i := 0; countType(t, s, itx.TypeProcessorRevived) < processors.CrashLoopEvidenceAt; i++ {
		require.Less(t, i, 1000, "the breaker never revived %d times", processors.CrashLoopEvidenceAt)
		clock.Advance(10 * time.Second)
		require.NoError(t, ts.srv.Settle(ctx, ref))
	}
	evs, err := client.ReadAll(ctx, s, itx.Query{Types: []string{itx.TypeProcessorRevived, itx.TypeErrorOccurred}})
	require.NoError(t, err)
	var got []string
	for _, e := range evs {
		switch e.Type {
		case itx.TypeErrorOccurred:
			if e.IdempotencyKey == processors.CrashLoopEvidenceKey("v1") {
				got = append(got, "evidence")
			}
		case itx.TypeProcessorRevived:
			var p struct{ Revivals int }
			require.NoError(t, json.Unmarshal(e.Payload, &p))
			got = append(got, fmt.Sprintf("revived %d", p.Revivals))
		}
	}
	require.Equal(t, []string{"revived 1", "revived 2", "evidence", "revived 3"}, got[:min(len(got), 4)])
}
