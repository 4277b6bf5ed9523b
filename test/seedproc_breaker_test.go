package test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/remote"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// revivalFact is one stream/processor-revived as a client reads it.
type revivalFact struct {
	at       int64 // createdAt, epoch ms on itxd's clock
	revivals int   // the breaker's count in the payload
}

func revivalFacts(t testing.TB, ctx context.Context, s schema.Stream) []revivalFact {
	t.Helper()
	evs, err := client.ReadAll(ctx, s, itx.Query{Types: []string{itx.TypeProcessorRevived}})
	require.NoError(t, err)
	out := make([]revivalFact, 0, len(evs))
	for _, e := range evs {
		var p struct {
			Revivals int `json:"revivals"`
		}
		require.NoError(t, json.Unmarshal(e.Payload, &p))
		out = append(out, revivalFact{at: e.CreatedAt, revivals: p.Revivals})
	}
	return out
}

// breakerRig is itxd on a virtual clock running poisonContract, one stream held open
// (so the idle sweep never unloads it: every fire below is the same incarnation's).
type breakerRig struct {
	t      *testing.T
	ctx    context.Context
	clock  *clocktest.Clock
	ts     *testServer
	ref    server.StreamRef
	s      schema.Stream
	broken atomic.Bool
}

// newBreakerRigAt builds the rig with the processor in-process (placement "") or on a remote host
// on the same virtual clock ("remote").
func newBreakerRigAt(t *testing.T, path, placement string) *breakerRig {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	r := &breakerRig{t: t, ctx: ctx, clock: clocktest.New(time.Unix(1_700_000_000, 0))}
	r.broken.Store(true)
	host := processors.NewHost("v1")
	require.NoError(t, processors.Add(host, func() processors.Contract[int] { return poisonContract(&r.broken) }))
	// A wake's bound (twice the delivery timeout) well past the longest step below: a step that
	// jumped past a frame's deadline while it ran would cancel it, a failure of the test's making.
	cfg := server.Config{Clock: r.clock, DeliveryTimeout: time.Hour}
	if placement == "" {
		cfg.Processors = host
	}
	r.ts = startServer(t, cfg)
	if placement == "remote" {
		mountedRemoteHost(t, remote.Config{Addr: r.ts.addr, Token: r.ts.creds.ProjectToken, Name: "poison-host", Host: host, Clock: r.clock})
	}
	r.ref = server.StreamRef{ProjectID: "default", Path: path}
	r.s = stream(t, r.ts.project(t), path)
	subs := client.Subscriptions(ctx, r.s)
	defer subs.Release()
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{
		Name: "poison", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Placement: placement},
	})
	require.NoError(t, err)
	return r
}

// step moves the clock timer by timer, settling after each (clocktest.AdvanceEach): the work a
// fire releases runs at the fire's time, not after the step's later timers.
func (r *breakerRig) step(d time.Duration) {
	r.clock.AdvanceEach(d, func() { require.NoError(r.t, r.ts.srv.Settle(r.ctx, r.ref)) })
}

// untilRevivals steps the clock by step until the stream holds n revival facts, at most limit
// of virtual time, and returns them.
func (r *breakerRig) untilRevivals(n int, step, limit time.Duration) []revivalFact {
	r.t.Helper()
	for moved := time.Duration(0); ; moved += step {
		if got := revivalFacts(r.t, r.ctx, r.s); len(got) >= n {
			return got
		}
		require.LessOrEqual(r.t, moved, limit, "no revival %d within %v", n, limit)
		r.step(step)
	}
}

// Seed 002: "every revival durably marks a counter before doing anything and arms its retry
// along a backoff (10s → 1m → 5m → 30m → 6h plateau, forever ≈ 4 wakes/day)". Over real RPC
// against itxd on a virtual clock, in-process and on a remote host: a processor whose frame always fails is revived first one
// keepalive lead (10 s) after its failed work, then along exactly that backoff, the 6 h plateau
// repeating; each fact counts its revival. The clock moves by a tenth of the awaited gap, so
// each gap is measured to that precision (plus a lead, see below).
func TestSeedProc_BreakerBackoffOverRPC(t *testing.T) {
	for _, placement := range []string{"", "remote"} {
		name := "in-process"
		if placement != "" {
			name = placement
		}
		t.Run(name, func(t *testing.T) { testBreakerBackoff(t, placement) })
	}
}

func testBreakerBackoff(t *testing.T, placement string) {
	r := newBreakerRigAt(t, "/seedproc/breaker-backoff", placement)
	mustAppend(t, r.s, ev("crash/poison", `{}`))
	r.step(0) // its first frame fails at the append's instant
	evs, err := client.ReadAll(r.ctx, r.s, itx.Query{Types: []string{"crash/poison"}})
	require.NoError(t, err)
	require.Len(t, evs, 1)
	prev := evs[0].CreatedAt

	// The first gap is the lead from the failed work to the fire that finds it failed; then
	// RevivalBackoff(1..) after each revival.
	want := []time.Duration{processors.KeepaliveLead, 10 * time.Second, time.Minute, 5 * time.Minute,
		30 * time.Minute, 6 * time.Hour, 6 * time.Hour}
	for i, gap := range want {
		step := max(time.Second, gap/10)
		facts := r.untilRevivals(i+1, step, gap+2*step+processors.KeepaliveLead)
		got := facts[i]
		require.Len(t, facts, i+1, "two revivals in one step of %v", step)
		require.Equal(t, i+1, got.revivals, "revival %d's count", i+1)
		// A fire that finds a frame in flight (a retry of the wake's ladder landing in the same
		// step) pushes the revival one lead later: that much slack, and one step's.
		d := time.Duration(got.at-prev) * time.Millisecond
		if d < gap || d > gap+step+processors.KeepaliveLead {
			t.Errorf("revival %d came %v after the previous mark, want %v (to within %v)", i+1, d, gap, step+processors.KeepaliveLead)
		}
		prev = got.at
	}
}

// Seed 002: "The budget resets only on a quiet-clean confirmation (a fire that finds all work
// settled successfully) or a version change". Over real RPC against itxd, in-process and on a
// remote host: a crash loop backing
// off (three revivals, the next 5 min away) whose cause goes away without a deploy (the poison's
// outside condition is fixed) is confirmed clean and stops: at most the revival already owed
// runs, then nothing more for a day. The next failure, on the same version, starts the breaker
// from a fresh budget: revived one lead after it with count 1, then 10 s later with count 2,
// not at the 30 min or 6 h the old loop had reached.
func TestSeedProc_BreakerBudgetResetsOnQuietCleanConfirmation(t *testing.T) {
	for _, placement := range []string{"", "remote"} {
		name := "in-process"
		if placement != "" {
			name = placement
		}
		t.Run(name, func(t *testing.T) { testBreakerReset(t, placement) })
	}
}

func testBreakerReset(t *testing.T, placement string) {
	r := newBreakerRigAt(t, "/seedproc/breaker-reset", placement)
	first := mustAppend(t, r.s, ev("crash/poison", `{}`)).HeadOffset
	r.step(0)
	r.untilRevivals(3, 5*time.Second, 5*time.Minute)

	r.broken.Store(false) // the vendor came back: the same build now gets through
	sub := client.Subscription(r.ctx, r.s, "poison")
	defer sub.Release()
	for moved := time.Duration(0); ; moved += 10 * time.Second {
		d, err := client.DescribeSubscription(r.ctx, sub)
		require.NoError(t, err)
		if d.ConfirmedOffset >= first {
			break
		}
		require.Less(t, moved, 10*time.Minute, "the fixed processor never got past the poison: %+v", d)
		r.step(10 * time.Second)
	}
	for range 6 * 24 {
		r.step(10 * time.Minute)
	}
	afterFix := revivalFacts(t, r.ctx, r.s)
	require.LessOrEqual(t, len(afterFix), 4, "revived on along the backoff after the loop's cause was gone: %+v", afterFix)

	r.broken.Store(true)
	mustAppend(t, r.s, ev("crash/poison", `{}`))
	r.step(0)
	evs, err := client.ReadAll(r.ctx, r.s, itx.Query{Types: []string{"crash/poison"}})
	require.NoError(t, err)
	failedAt := evs[len(evs)-1].CreatedAt
	facts := r.untilRevivals(len(afterFix)+1, time.Second, time.Minute)
	got := facts[len(afterFix)]
	require.Equal(t, 1, got.revivals, "the new loop's first revival counts from a fresh budget")
	if d := time.Duration(got.at-failedAt) * time.Millisecond; d < processors.KeepaliveLead || d > 2*processors.KeepaliveLead+time.Second {
		t.Errorf("the new loop's first revival came %v after its failure, want the lead %v", d, processors.KeepaliveLead)
	}
	facts = r.untilRevivals(len(afterFix)+2, time.Second, time.Minute)
	next := facts[len(afterFix)+1]
	require.Equal(t, 2, next.revivals)
	if d := time.Duration(next.at-got.at) * time.Millisecond; d < processors.RevivalBackoff(1) || d > processors.RevivalBackoff(1)+processors.KeepaliveLead+time.Second {
		t.Errorf("the new loop's second revival came %v after its first, want %v", d, processors.RevivalBackoff(1))
	}
}

// Seed 002: "Enforcement lives in DO KV below the reduction — deliberately: a poisoned reducer
// cannot be asked to reduce its own pause fact." Over real RPC against itxd: a processor whose
// Reduce panics on an event (it never gets to ProcessEvent, and no state of its can record
// anything) crash-loops under the same breaker as a failing ProcessEvent: revived one lead after
// the failure, then 10 s and 1 m apart, each fact counting on from the last.
func TestSeedProc_BreakerHoldsAPoisonedReducer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	host := processors.NewHost("v1")
	require.NoError(t, processors.Add(host, func() processors.Contract[int] {
		return processors.Contract[int]{
			Name: "folder", ConsumedTypes: []string{"fold/item"}, ReducerVersion: "1",
			InitialState: func() int { return 0 },
			Reduce: func(n int, e itx.Event) int {
				if string(e.Payload) == `{"poison":true}` {
					panic("cannot fold it")
				}
				return n + 1
			},
			ProcessEvent: func(context.Context, *processors.Args[int]) error { return nil },
		}
	}))
	ts := startServer(t, server.Config{Clock: clock, Processors: host, DeliveryTimeout: time.Hour})
	ref := server.StreamRef{ProjectID: "default", Path: "/seedproc/poisoned-reducer"}
	s := stream(t, ts.project(t), ref.Path)
	configureProcessor(t, s, "folder")
	mustAppend(t, s, ev("fold/item", `{"poison":true}`))
	require.NoError(t, ts.srv.Settle(ctx, ref))
	evs, err := client.ReadAll(ctx, s, itx.Query{Types: []string{"fold/item"}})
	require.NoError(t, err)
	prev := evs[0].CreatedAt
	step := time.Second
	var facts []revivalFact
	for i, gap := range []time.Duration{processors.KeepaliveLead, processors.RevivalBackoff(1), processors.RevivalBackoff(2)} {
		for moved := time.Duration(0); len(facts) <= i; moved += step {
			require.LessOrEqual(t, moved, gap+processors.KeepaliveLead+2*step, "no revival %d: %+v", i+1, facts)
			clock.Advance(step)
			require.NoError(t, ts.srv.Settle(ctx, ref))
			facts = revivalFacts(t, ctx, s)
		}
		require.Equal(t, i+1, facts[i].revivals)
		if d := time.Duration(facts[i].at-prev) * time.Millisecond; d < gap || d > gap+processors.KeepaliveLead+step {
			t.Errorf("revival %d came %v after the previous mark, want %v", i+1, d, gap)
		}
		prev = facts[i].at
	}
}
