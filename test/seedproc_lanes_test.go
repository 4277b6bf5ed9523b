package test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/remote"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// laneProbe is what the lanes processor reports to its test: each hook call, each attempt's
// start, and a gate per lane that its work waits on (or its context).
type laneProbe struct {
	mu         sync.Mutex
	calls      map[int64]int // ProcessEvent calls per offset (0: the eventless pass)
	entered    chan string   // a blocker or attempt started its work
	blockGate  chan struct{}
	bgGate     chan struct{}
	bgStarts   atomic.Int64
	bgFinished atomic.Int64
}

func newLaneProbe() *laneProbe {
	return &laneProbe{calls: map[int64]int{}, entered: make(chan string, 16), blockGate: make(chan struct{}), bgGate: make(chan struct{})}
}

func (p *laneProbe) callsAt(off int64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[off]
}

// lanesContract consumes lane/block (its work in BlockProcessorWhile) and lane/bg (its work a
// RunInBackground attempt); both wait on their gate or their context.
func lanesContract(p *laneProbe) processors.Contract[int] {
	return processors.Contract[int]{
		Name: "lanes", ConsumedTypes: []string{"lane/block", "lane/bg"}, ReducerVersion: "1",
		InitialState: func() int { return 0 },
		Reduce:       func(n int, _ itx.Event) int { return n + 1 },
		ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
			var off int64
			if a.Event != nil {
				off = a.Event.Offset
			}
			p.mu.Lock()
			p.calls[off]++
			p.mu.Unlock()
			if a.Event == nil {
				return nil
			}
			switch a.Event.Type {
			case "lane/block":
				// Blocking: the test's whole point is the held checkpoint.
				a.BlockProcessorWhile("block", func(ctx context.Context) error {
					p.entered <- "block"
					select {
					case <-p.blockGate:
						return nil
					case <-ctx.Done():
						return ctx.Err()
					}
				})
			case "lane/bg":
				// Droppable: nothing recovers it, which is what the test shows.
				a.RunInBackground(func(ctx context.Context) error {
					p.bgStarts.Add(1)
					p.entered <- "bg"
					select {
					case <-p.bgGate:
						p.bgFinished.Add(1)
						return nil
					case <-ctx.Done():
						return ctx.Err()
					}
				})
			}
			return nil
		},
	}
}

func awaitEntered(t *testing.T, ctx context.Context, p *laneProbe, want string) {
	t.Helper()
	select {
	case got := <-p.entered:
		require.Equal(t, want, got)
	case <-ctx.Done():
		t.Fatalf("the %s work never started", want)
	}
}

// Seed 002, "Two primitives, two guarantees", over real RPC against itxd, in-process and on a
// remote host: runInBackground's checkpoint advances immediately (waitUntilProcessed passes the
// event, the subscription's confirmed cursor with it, while its attempt still runs),
// blockProcessorWhile's is held while its work runs (the confirmed cursor stays before the event
// until the work ends), and an eviction loses the background closure: after the incarnation
// dies mid-attempt (itxd restarts; the remote host's program ends and another mounts) the
// keepalive revives the processor (one stream/processor-revived, within a lead), but the event
// whose attempt died is not delivered again and the attempt never runs again.
func TestSeedProc_LanesOverRPC(t *testing.T) {
	for _, placement := range []string{"in-process", "remote"} {
		t.Run(placement, func(t *testing.T) {
			clock := clocktest.New(time.Unix(1_700_000_000, 0))
			probe := newLaneProbe()
			newHost := func() *processors.Host {
				h := processors.NewHost("v1")
				require.NoError(t, processors.Add(h, func() processors.Contract[int] { return lanesContract(probe) }))
				return h
			}
			cfg := server.Config{DataDir: t.TempDir(), Clock: clock}
			sc := client.SubscriptionConfig{Name: "lanes", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}}
			if placement == "remote" {
				sc.Receiver.Placement = "remote"
			} else {
				cfg.Processors = newHost()
			}
			ts := startServer(t, cfg)
			var stopHost func()
			runHost := func() {
				stopHost = mountedRemoteHost(t, remote.Config{Addr: ts.addr, Token: ts.creds.ProjectToken, Name: "lanes-host", Host: newHost(), Clock: clock})
			}
			if placement == "remote" {
				runHost()
			}
			ctx := ctxT(t)
			ref := server.StreamRef{ProjectID: "default", Path: "/seedproc/lanes"}
			s := stream(t, ts.project(t), ref.Path)
			subs := client.Subscriptions(ctx, s)
			_, _, err := client.ConfigureSubscription(ctx, subs, sc)
			subs.Release()
			require.NoError(t, err)
			sub := client.Subscription(ctx, s, "lanes")
			defer sub.Release()

			bg := mustAppend(t, s, ev("lane/bg", `{}`)).HeadOffset
			awaitEntered(t, ctx, probe, "bg")
			_, err = client.WaitUntilProcessed(ctx, sub, bg, 10*time.Second)
			require.NoError(t, err, "runInBackground held the checkpoint")
			d, err := client.DescribeSubscription(ctx, sub)
			require.NoError(t, err)
			require.GreaterOrEqual(t, d.ConfirmedOffset, bg, "the confirmed cursor waits on a background attempt")
			require.Zero(t, probe.bgFinished.Load(), "the attempt is still running")

			block := mustAppend(t, s, ev("lane/block", `{}`)).HeadOffset
			awaitEntered(t, ctx, probe, "block")
			// Half a second of real time for the checkpoint to pass the event, which it must
			// not: the blocker is running and only its gate ends it.
			held, cancelHeld := context.WithTimeout(ctx, 500*time.Millisecond)
			_, err = client.WaitUntilProcessed(held, sub, block, 10*time.Second)
			cancelHeld()
			require.Error(t, err, "the checkpoint passed an event whose blocker still runs")
			d, err = client.DescribeSubscription(ctx, sub)
			require.NoError(t, err)
			require.Less(t, d.ConfirmedOffset, block, "the checkpoint passed an event whose blocker still runs")
			close(probe.blockGate)
			_, err = client.WaitUntilProcessed(ctx, sub, block, 10*time.Second)
			require.NoError(t, err)
			require.Zero(t, probe.bgFinished.Load(), "the attempt is still running")

			// Eviction with the attempt in flight: a deploy of itxd, or the remote host's end.
			if placement == "remote" {
				stopHost()
				runHost()
			} else {
				closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				require.NoError(t, ts.srv.Close(closeCtx))
				ts = startServer(t, cfg)
				s = stream(t, ts.project(t), ref.Path)
			}
			require.NoError(t, ts.srv.Settle(ctx, ref))
			for i := 0; countType(t, s, itx.TypeProcessorRevived) == 0; i++ {
				require.Less(t, i, 4, "no revival two leads after the eviction")
				clock.Advance(processors.KeepaliveLead / 2)
				require.NoError(t, ts.srv.Settle(ctx, ref))
			}
			head := mustAppend(t, s, ev("lane/marker", `{}`)).HeadOffset
			sub2 := client.Subscription(ctx, s, "lanes")
			defer sub2.Release()
			_, err = client.WaitUntilProcessed(ctx, sub2, head, 10*time.Second)
			require.NoError(t, err)
			require.Equal(t, 1, countType(t, s, itx.TypeProcessorRevived), "the fresh incarnation revives for the dead one's work, once")
			require.Equal(t, 1, probe.callsAt(bg), "the event whose background attempt was lost is delivered again")
			require.Equal(t, int64(1), probe.bgStarts.Load(), "the lost background closure ran again")
			require.Equal(t, 1, probe.callsAt(block), "the blocked event, committed, is delivered again")
			select {
			case got := <-probe.entered:
				t.Fatalf("%s work started again after the eviction", got)
			default:
			}
		})
	}
}

// Seed 002: "Wedged work that never settles (a hung promise no deadline owns) trips a busy-fire
// cap after ~15 minutes and decays into the same backoff." Over real RPC against itxd on a
// virtual clock: a background attempt that ignores its context and never returns keeps the
// keepalive busy (its alarm pushed a lead ahead, no revival) for 15 minutes; then the processor
// is revived, and again along the breaker's backoff (10 s, then 1 m), while the attempt hangs on.
func TestSeedProc_WedgedAttemptDecaysAlongTheBackoffOverRPC(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	gate := make(chan struct{})
	build := func() processors.Contract[int] {
		return processors.Contract[int]{
			Name: "wedge", ConsumedTypes: []string{"wedge/start"}, ReducerVersion: "1",
			InitialState: func() int { return 0 },
			Reduce:       func(n int, _ itx.Event) int { return n + 1 },
			ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
				if a.Event != nil {
					// Droppable: a hung vendor call that takes no context, the wedge itself.
					a.RunInBackground(func(context.Context) error { <-gate; return nil })
				}
				return nil
			},
		}
	}
	host := processors.NewHost("v1")
	require.NoError(t, processors.Add(host, build))
	ts := startServer(t, server.Config{Clock: clock, Processors: host})
	t.Cleanup(func() { close(gate) }) // runs before the server closes
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ref := server.StreamRef{ProjectID: "default", Path: "/seedproc/wedge"}
	s := stream(t, ts.project(t), ref.Path)
	configureProcessor(t, s, "wedge")
	mustAppend(t, s, ev("wedge/start", `{}`))
	require.NoError(t, ts.srv.Settle(ctx, ref))
	start := clock.Now()
	step := 5 * time.Second
	var facts []revivalFact
	for moved := time.Duration(0); len(facts) < 3; moved += step {
		require.Less(t, moved, processors.WedgedAfter+5*time.Minute, "revivals by then: %+v", facts)
		clock.Advance(step)
		require.NoError(t, ts.srv.Settle(ctx, ref))
		facts = revivalFacts(t, ctx, s)
	}
	first := time.UnixMilli(facts[0].at).Sub(start)
	if first < processors.WedgedAfter || first > processors.WedgedAfter+processors.KeepaliveLead+step {
		t.Errorf("first revival %v after the attempt started, want the busy-fire cap %v (to within a lead)", first, processors.WedgedAfter)
	}
	for i, want := range []time.Duration{processors.RevivalBackoff(1), processors.RevivalBackoff(2)} {
		got := time.Duration(facts[i+1].at-facts[i].at) * time.Millisecond
		if got < want || got > want+step {
			t.Errorf("revival %d came %v after revival %d, want %v", i+2, got, i+1, want)
		}
		require.Equal(t, i+2, facts[i+1].revivals)
	}
}

// Seed 002: a failed attempt "propagates (marking the keepalive window), and a later at-head pass
// retries the whole attempt"; recovery has one entrypoint, batch delivery. Over real RPC against
// itxd, with no eviction at all: a RunInBackground attempt that fails leaves the processor's
// checkpoint where it was (past the event), and the keepalive's next fire, a lead later, revives
// it in the same incarnation: one stream/processor-revived, whose delivery gives the processor
// (which does not consume the fact) the eventless pass at the head with CaughtUp, where it starts
// the attempt again from its state; that one succeeds, and the confirmation fire after it is
// quiet: no second revival.
func TestSeedProc_FailedBackgroundAttemptRevivesOverRPC(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	var (
		mu        sync.Mutex
		attempts  int
		eventless []bool // CaughtUp of each eventless pass
	)
	build := func() processors.Contract[int] {
		return processors.Contract[int]{
			Name: "retrier", ConsumedTypes: []string{"job/requested"}, ReducerVersion: "1",
			InitialState: func() int { return 0 },
			Reduce:       func(n int, _ itx.Event) int { return n + 1 },
			ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
				mu.Lock()
				defer mu.Unlock()
				if a.Event == nil {
					eventless = append(eventless, a.Delivery.CaughtUp)
				}
				if !a.Delivery.CaughtUp || a.State == 0 || attempts >= 2 {
					return nil
				}
				attempts++
				n := attempts
				// Droppable: the caught-up pass starts it again from the state (the job
				// reduced, no success recorded) whenever the keepalive revives the processor.
				a.RunInBackground(func(context.Context) error {
					if n == 1 {
						return errors.New("the vendor refused the first attempt")
					}
					return nil
				})
				return nil
			},
		}
	}
	host := processors.NewHost("v1")
	require.NoError(t, processors.Add(host, build))
	ts := startServer(t, server.Config{Clock: clock, Processors: host})
	ctx := ctxT(t)
	ref := server.StreamRef{ProjectID: "default", Path: "/seedproc/failed-attempt"}
	s := stream(t, ts.project(t), ref.Path)
	configureProcessor(t, s, "retrier")
	job := mustAppend(t, s, ev("job/requested", `{}`)).HeadOffset
	require.NoError(t, ts.srv.Settle(ctx, ref))
	sub := client.Subscription(ctx, s, "retrier")
	defer sub.Release()
	_, err := client.WaitUntilProcessed(ctx, sub, job, 10*time.Second)
	require.NoError(t, err)
	mu.Lock()
	before := len(eventless)
	require.Equal(t, 1, attempts)
	mu.Unlock()
	require.Zero(t, countType(t, s, itx.TypeProcessorRevived))

	for i := 0; countType(t, s, itx.TypeProcessorRevived) == 0; i++ {
		require.Less(t, i, 12, "no revival a lead after the failed attempt")
		clock.Advance(time.Second)
		require.NoError(t, ts.srv.Settle(ctx, ref))
	}
	// Nothing but the revival was appended since: its delivery alone can start the attempt again.
	waitUntil(t, "the revival's caught-up pass starts the attempt again", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return attempts == 2
	})
	mu.Lock()
	require.Greater(t, len(eventless), before, "the revival's delivery gave no eventless pass")
	require.True(t, eventless[before], "the revival's eventless pass is not CaughtUp")
	mu.Unlock()
	for range 6 * 10 {
		clock.Advance(time.Second)
		require.NoError(t, ts.srv.Settle(ctx, ref))
	}
	require.Equal(t, 1, countType(t, s, itx.TypeProcessorRevived), "revived again after the retried attempt succeeded")
}

// Seed 002: "a processor may consume the fact when it reacts to the fact itself": over real RPC
// against itxd, in-process and on a remote host, a processor that consumes
// stream/processor-revived is handed its revival as an event (its own slug in the payload) with
// CaughtUp, instead of the eventless pass, and reduces it like any consumed event.
func TestSeedProc_RevivalFactConsumedOverRPC(t *testing.T) {
	for _, placement := range []string{"", "remote"} {
		name := "in-process"
		if placement != "" {
			name = placement
		}
		t.Run(name, func(t *testing.T) {
			clock := clocktest.New(time.Unix(1_700_000_000, 0))
			rec := &bbRecorder{}
			var failed atomic.Bool
			build := func() processors.Contract[int] {
				return processors.Contract[int]{
					Name: "watcher", ConsumedTypes: []string{"job/requested", itx.TypeProcessorRevived}, ReducerVersion: "1",
					InitialState: func() int { return 0 },
					Reduce:       func(n int, _ itx.Event) int { return n + 1 },
					ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
						rec.add(bbCallOf(a))
						if a.Event != nil && a.Event.Type == "job/requested" && failed.CompareAndSwap(false, true) {
							// Droppable: its failure marks the keepalive window, which is the point.
							a.RunInBackground(func(context.Context) error { return errors.New("refused") })
						}
						return nil
					},
				}
			}
			host := processors.NewHost("v1")
			require.NoError(t, processors.Add(host, build))
			cfg := server.Config{Clock: clock}
			if placement == "" {
				cfg.Processors = host
			}
			ts := startServer(t, cfg)
			if placement == "remote" {
				mountedRemoteHost(t, remote.Config{Addr: ts.addr, Token: ts.creds.ProjectToken, Name: "watcher-host", Host: host, Clock: clock})
			}
			ctx := ctxT(t)
			ref := server.StreamRef{ProjectID: "default", Path: "/seedproc/revival-consumed"}
			s := stream(t, ts.project(t), ref.Path)
			subs := client.Subscriptions(ctx, s)
			_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{
				Name: "watcher", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Placement: placement},
			})
			subs.Release()
			require.NoError(t, err)
			job := mustAppend(t, s, ev("job/requested", `{}`)).HeadOffset
			bbWait(t, s, "watcher", job)
			rec.take()
			for i := 0; countType(t, s, itx.TypeProcessorRevived) == 0; i++ {
				require.Less(t, i, 12, "no revival a lead after the failed attempt")
				clock.Advance(time.Second)
				require.NoError(t, ts.srv.Settle(ctx, ref))
			}
			revived, err := client.ReadAll(ctx, s, itx.Query{Types: []string{itx.TypeProcessorRevived}})
			require.NoError(t, err)
			require.Len(t, revived, 1)
			require.Contains(t, string(revived[0].Payload), `"processorSlug":"watcher"`)
			bbWait(t, s, "watcher", revived[0].Offset)
			require.Equal(t, []bbCall{{Offset: revived[0].Offset, Type: itx.TypeProcessorRevived, CaughtUp: true, Prev: 1, State: 2}}, rec.take(),
				"the consumed revival fact, caught up, and no eventless pass")
		})
	}
}
