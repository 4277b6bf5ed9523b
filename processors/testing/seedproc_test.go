package proctest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
	proctest "github.com/itx-dev/itx/processors/testing"
)

// call is one ProcessEvent call as a seed-002 reader would observe it.
type call struct {
	offset      int64 // 0 on the eventless pass
	prev, state int
	caughtUp    bool
}

// recorder counts "c/item" events and records every ProcessEvent call; bg, if set, is started
// as a RunInBackground attempt on each consumed event.
type recorder struct {
	mu    sync.Mutex
	calls []call
	now   []time.Time
	bg    func(ctx context.Context, a *processors.Args[tally]) error
	types []string
}

func (r *recorder) taken() []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.calls
	r.calls = nil
	return out
}

func (r *recorder) contract(env proctest.Env) processors.Contract[tally] {
	types := r.types
	if types == nil {
		types = []string{"c/item"}
	}
	return processors.Contract[tally]{
		Name: "recorder", ConsumedTypes: types, ReducerVersion: "1",
		InitialState: func() tally { return tally{} },
		Reduce: func(s tally, e itx.Event) tally {
			if e.Type == "c/item" {
				s.N++
			}
			return s
		},
		ProcessEvent: func(ctx context.Context, a *processors.Args[tally]) error {
			c := call{prev: a.PreviousState.N, state: a.State.N, caughtUp: a.Delivery.CaughtUp}
			if a.Event != nil {
				c.offset = a.Event.Offset
			}
			r.mu.Lock()
			r.calls = append(r.calls, c)
			r.now = append(r.now, a.Now())
			r.mu.Unlock()
			if a.Event != nil && r.bg != nil {
				a.RunInBackground(func(ctx context.Context) error { return r.bg(ctx, a) })
			}
			return nil
		},
	}
}

// Seed 002: the runner reduces and processes one event at a time; ProcessEvent sees the state
// after Reduce of its event (event-time state); CaughtUp is true only on the last consumed event
// of a scan reaching the head; a scan to the head with no consumed event gets exactly one
// eventless pass with the final state; ephemeral events never reach Reduce or ProcessEvent.
func TestSeedProc_ProcessEventSeesEventTimeStateAndCaughtUp(t *testing.T) {
	r := &recorder{}
	proctest.Run(t, proctest.Config[tally]{New: r.contract, PageSize: 100}, func(t *testing.T, h *proctest.Harness[tally]) {
		in := []itx.EventInput{
			{Type: "c/item"}, {Type: "c/other"}, {Type: "c/item"}, {Type: "c/item", Ephemeral: true},
			{Type: "c/item"}, {Type: "c/other"},
		}
		if _, err := h.Stream.Append(t.Context(), in); err != nil {
			t.Fatal(err)
		}
		if got := r.taken(); len(got) != 0 {
			t.Fatalf("raw Stream.Append delivered: %v", got)
		}
		h.Wake()
		got := r.taken()
		want := []call{{1, 0, 1, false}, {3, 1, 2, false}, {5, 2, 3, true}}
		if !equalCalls(got, want) {
			t.Errorf("calls %+v, want %+v", got, want)
		}
		h.Append(itx.EventInput{Type: "c/other"})
		if got, want := r.taken(), []call{{0, 3, 3, true}}; !equalCalls(got, want) {
			t.Errorf("unconsumed append: calls %+v, want one eventless pass %+v", got, want)
		}
		if got := h.State().N; got != 3 {
			t.Errorf("state %d, want 3 (the ephemeral item never reduces)", got)
		}
	})
}

// A backlog read in pages: CaughtUp only on the last consumed event of the stream, and when the
// last page holds no consumed event, the eventless pass follows instead.
func TestSeedProc_CaughtUpAcrossPages(t *testing.T) {
	r := &recorder{}
	proctest.Run(t, proctest.Config[tally]{New: r.contract, PageSize: 3}, func(t *testing.T, h *proctest.Harness[tally]) {
		var in []itx.EventInput
		for range 7 {
			in = append(in, itx.EventInput{Type: "c/item"})
		}
		for range 4 {
			in = append(in, itx.EventInput{Type: "c/other"})
		}
		if _, err := h.Stream.Append(t.Context(), in); err != nil {
			t.Fatal(err)
		}
		h.Wake()
		got := r.taken()
		if len(got) != 8 {
			t.Fatalf("calls %+v, want 7 events and one eventless pass", got)
		}
		for i, c := range got[:7] {
			if c.caughtUp || c.offset != int64(i+1) || c.state != i+1 {
				t.Errorf("call %d: %+v, want offset %d, state %d, not caught up", i, c, i+1, i+1)
			}
		}
		if last := got[7]; last != (call{0, 7, 7, true}) {
			t.Errorf("last call %+v, want the eventless pass over state 7, caught up", last)
		}
	})
}

// Args.Now is the injected (virtual) clock.
func TestSeedProc_NowIsTheVirtualClock(t *testing.T) {
	r := &recorder{}
	proctest.Run(t, proctest.Config[tally]{New: r.contract}, func(t *testing.T, h *proctest.Harness[tally]) {
		h.AdvanceTime(3 * time.Hour)
		want := h.Clock.Now()
		h.Append(itx.EventInput{Type: "c/item"})
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.now) != 1 || !r.now[0].Equal(want) {
			t.Errorf("Args.Now %v, want the virtual clock %v", r.now, want)
		}
	})
}

// runInBackground is at-most-once and its failure marks the keepalive window: the next fire
// revives (one stream/processor-revived) instead of disarming; a later quiet clean fire resets
// the budget and disarms.
func TestSeedProc_BackgroundFailureRevives(t *testing.T) {
	r := &recorder{bg: func(ctx context.Context, a *processors.Args[tally]) error { return errors.New("vendor said no") }}
	proctest.Run(t, proctest.Config[tally]{New: r.contract}, func(t *testing.T, h *proctest.Harness[tally]) {
		start := h.Clock.Now()
		h.Append(itx.EventInput{Type: "c/item"})
		if errs := h.TakeBackgroundErrors(); len(errs) != 1 {
			t.Fatalf("background errors %v, want 1", errs)
		}
		if got, want := h.AlarmAt(), start.Add(processors.KeepaliveLead); !got.Equal(want) {
			t.Errorf("alarm %v, want %v (the lead ahead of the attempt)", got, want)
		}
		r.taken()
		h.AdvanceTime(processors.KeepaliveLead)
		if got := len(h.Events(itx.TypeProcessorRevived)); got != 1 {
			t.Fatalf("%d revivals after the failed attempt, want 1", got)
		}
		// The revival reaches the processor through ordinary delivery: it does not consume the
		// fact, so it gets the eventless pass at the head.
		if got, want := r.taken(), []call{{0, 1, 1, true}}; !equalCalls(got, want) {
			t.Errorf("after the revival: calls %+v, want %+v", got, want)
		}
		h.AdvanceTime(processors.KeepaliveLead)
		if !h.AlarmAt().IsZero() || h.Keepalive().Revivals != 0 {
			t.Errorf("alarm %v, keepalive %+v: want a quiet clean fire to disarm and reset", h.AlarmAt(), h.Keepalive())
		}
		if got := len(h.Events(itx.TypeProcessorRevived)); got != 1 {
			t.Errorf("%d revivals, want still 1", got)
		}
	})
}

// Work that settles cleanly needs no revival: the confirmation fire disarms.
func TestSeedProc_CleanWorkDisarmsWithoutRevival(t *testing.T) {
	r := &recorder{bg: func(ctx context.Context, a *processors.Args[tally]) error { return nil }}
	proctest.Run(t, proctest.Config[tally]{New: r.contract}, func(t *testing.T, h *proctest.Harness[tally]) {
		h.Append(itx.EventInput{Type: "c/item"})
		h.AdvanceTime(time.Hour)
		if !h.AlarmAt().IsZero() || len(h.Events(itx.TypeProcessorRevived)) != 0 || h.Keepalive().Revivals != 0 {
			t.Errorf("alarm %v, revivals %v, keepalive %+v: want disarmed, none", h.AlarmAt(), h.Events(itx.TypeProcessorRevived), h.Keepalive())
		}
	})
}

// Eviction with an attempt in flight: the attempt is lost (no retry by the framework), the alarm
// armed ~10s ahead survives, fires in the fresh incarnation, which appends exactly one revival
// fact and reaches the head with CaughtUp; the next quiet fire disarms and resets.
func TestSeedProc_EvictionMidAttemptRevivesOnce(t *testing.T) {
	var mu sync.Mutex
	attempts := 0
	r := &recorder{bg: func(ctx context.Context, a *processors.Args[tally]) error {
		mu.Lock()
		attempts++
		mu.Unlock()
		<-ctx.Done() // a vendor that has not answered
		return ctx.Err()
	}}
	proctest.Run(t, proctest.Config[tally]{New: r.contract}, func(t *testing.T, h *proctest.Harness[tally]) {
		start := h.Clock.Now()
		h.Append(itx.EventInput{Type: "c/item"})
		if got := h.Runner().ProcessedThrough(); got != 1 {
			t.Errorf("cursor %d while the background attempt hangs, want 1 (it advances at once)", got)
		}
		r.taken()
		h.Crash()
		if got, want := h.AlarmAt(), start.Add(processors.KeepaliveLead); !got.Equal(want) {
			t.Fatalf("alarm %v after the crash, want %v", got, want)
		}
		h.AdvanceTime(processors.KeepaliveLead)
		revived := h.Events(itx.TypeProcessorRevived)
		if len(revived) != 1 || revived[0].CreatedAt != start.Add(processors.KeepaliveLead).UnixMilli() {
			t.Fatalf("revivals %+v, want one at +10s", revived)
		}
		if got, want := r.taken(), []call{{0, 1, 1, true}}; !equalCalls(got, want) {
			t.Errorf("fresh incarnation: calls %+v, want the eventless pass %+v", got, want)
		}
		mu.Lock()
		if attempts != 1 {
			t.Errorf("%d attempts, want 1: the lost attempt is not re-run by the framework", attempts)
		}
		mu.Unlock()
		h.AdvanceTime(time.Hour)
		if !h.AlarmAt().IsZero() || h.Keepalive().Revivals != 0 || len(h.Events(itx.TypeProcessorRevived)) != 1 {
			t.Errorf("alarm %v keepalive %+v revivals %d: want disarmed, reset, one", h.AlarmAt(), h.Keepalive(), len(h.Events(itx.TypeProcessorRevived)))
		}
	})
}

// A processor that consumes stream/processor-revived receives the fact itself, CaughtUp.
func TestSeedProc_RevivalFactConsumed(t *testing.T) {
	r := &recorder{
		types: []string{"c/item", itx.TypeProcessorRevived},
		bg: func(ctx context.Context, a *processors.Args[tally]) error {
			<-ctx.Done()
			return ctx.Err()
		},
	}
	proctest.Run(t, proctest.Config[tally]{New: r.contract}, func(t *testing.T, h *proctest.Harness[tally]) {
		h.Append(itx.EventInput{Type: "c/item"})
		h.Crash()
		r.taken()
		r.bg = nil
		h.AdvanceTime(processors.KeepaliveLead)
		if got, want := r.taken(), []call{{2, 1, 1, true}}; !equalCalls(got, want) {
			t.Errorf("calls %+v, want the revival fact, caught up: %+v", got, want)
		}
	})
}

// A poison frame: the breaker revives along 10s, 1m, 5m, 30m, 6h (plateau), records one
// crash-loop evidence event at the third revival, and a quiet clean fire after the poison is
// cured resets the budget.
func TestSeedProc_BreakerOnAFailingFrame(t *testing.T) {
	var mu sync.Mutex
	poisoned := true
	c := func(env proctest.Env) processors.Contract[tally] {
		return processors.Contract[tally]{
			Name: "poison", ConsumedTypes: []string{"c/item"}, ReducerVersion: "1",
			InitialState: func() tally { return tally{} },
			Reduce:       func(s tally, e itx.Event) tally { return tally{N: s.N + 1} },
			ProcessEvent: func(ctx context.Context, a *processors.Args[tally]) error {
				mu.Lock()
				defer mu.Unlock()
				if a.Event != nil && poisoned {
					return errors.New("poison")
				}
				return nil
			},
		}
	}
	proctest.Run(t, proctest.Config[tally]{New: c}, func(t *testing.T, h *proctest.Harness[tally]) {
		start := h.Clock.Now()
		h.Append(itx.EventInput{Type: "c/item"})
		h.AdvanceTime(7 * time.Hour)
		revived := h.Events(itx.TypeProcessorRevived)
		var at []string
		for _, e := range revived {
			at = append(at, (time.Duration(e.CreatedAt-start.UnixMilli()) * time.Millisecond).String())
		}
		// The first revival at the lead; then 10s, 1m, 5m, 30m, 6h after each.
		if got, want := strings.Join(at, " "), "10s 20s 1m20s 6m20s 36m20s 6h36m20s"; got != want {
			t.Errorf("revivals at %q, want %q", got, want)
		}
		evidence := h.Events(itx.TypeErrorOccurred)
		if len(evidence) != 1 || evidence[0].IdempotencyKey != "processor-host-crash-loop:test-harness" {
			t.Errorf("crash-loop evidence %+v, want one keyed processor-host-crash-loop:<version>", evidence)
		}
		// The harness retries a failed frame at every settle that follows a fire (standing in for
		// the wake lane's retry), so the poison runs at each revival and at most once more at the
		// confirmation fire after it, never at the lead.
		if errs := h.TakeDeliveryErrors(); len(errs) < len(revived)+1 || len(errs) > 2*len(revived)+1 {
			t.Errorf("%d delivery failures for %d revivals, want between %d and %d", len(errs), len(revived), len(revived)+1, 2*len(revived)+1)
		}
		if h.Keepalive().Revivals != len(revived) {
			t.Errorf("keepalive %+v, want %d revivals", h.Keepalive(), len(revived))
		}
		mu.Lock()
		poisoned = false // the vendor recovers: no deploy
		mu.Unlock()
		h.AdvanceTime(6 * time.Hour)
		if h.State().N != 1 || h.Runner().ProcessedThrough() != h.Stream.Head() {
			t.Errorf("state %d cursor %d head %d: want the cured frame processed", h.State().N, h.Runner().ProcessedThrough(), h.Stream.Head())
		}
		if !h.AlarmAt().IsZero() || h.Keepalive().Revivals != 0 {
			t.Errorf("alarm %v keepalive %+v, want a quiet clean fire to disarm and reset", h.AlarmAt(), h.Keepalive())
		}
	})
}

// blockProcessorWhile holds the cursor: a crash while the blocker hangs redelivers the event, the
// blocker runs again, and its stably keyed append lands once.
func TestSeedProc_BlockerHoldsTheCursorAcrossACrash(t *testing.T) {
	var release chan struct{} // made inside the bubble, so a wait on it is durable
	var mu sync.Mutex
	runs := 0
	c := func(env proctest.Env) processors.Contract[tally] {
		return processors.Contract[tally]{
			Name: "blocker", ConsumedTypes: []string{"c/item"}, ReducerVersion: "1",
			InitialState: func() tally { return tally{} },
			Reduce:       func(s tally, e itx.Event) tally { return tally{N: s.N + 1} },
			ProcessEvent: func(ctx context.Context, a *processors.Args[tally]) error {
				if a.Event == nil {
					return nil
				}
				key := a.IdempotencyKey("ack", a.Event)
				a.BlockProcessorWhile("ack", func(ctx context.Context) error {
					mu.Lock()
					runs++
					n := runs
					mu.Unlock()
					if n == 1 {
						select { // the first attempt hangs until the crash
						case <-release:
						case <-ctx.Done():
							return ctx.Err()
						}
					}
					_, err := a.Append(ctx, itx.EventInput{Type: "c/acked", IdempotencyKey: key})
					return err
				})
				return nil
			},
		}
	}
	proctest.Run(t, proctest.Config[tally]{New: c}, func(t *testing.T, h *proctest.Harness[tally]) {
		release = make(chan struct{})
		h.Append(itx.EventInput{Type: "c/item"})
		if got := h.Runner().ProcessedThrough(); got != 0 {
			t.Errorf("cursor %d while the blocker hangs, want 0", got)
		}
		h.Crash()
		h.AdvanceTime(processors.KeepaliveLead) // the due alarm is the wake
		if got := len(h.Events("c/acked")); got != 1 {
			t.Errorf("%d acks, want 1", got)
		}
		mu.Lock()
		if runs != 2 {
			t.Errorf("blocker ran %d times, want 2 (redelivered after the crash)", runs)
		}
		mu.Unlock()
		if h.State().N != 1 || h.Runner().ProcessedThrough() < 1 {
			t.Errorf("state %d cursor %d", h.State().N, h.Runner().ProcessedThrough())
		}
		close(release)
	})
}

// A reducer-version change re-reduces from offset 1 with Reduce only: ProcessEvent never runs
// again for processed events, and the state is the new Reduce folded over the stream.
func TestSeedProc_ReducerVersionChangeReReducesOnly(t *testing.T) {
	var mu sync.Mutex
	var processed []int64
	c := func(env proctest.Env) processors.Contract[tally] {
		version, step := "1", 1
		if env.Incarnation > 1 {
			version, step = "2", 10
		}
		return processors.Contract[tally]{
			Name: "versioned", ConsumedTypes: []string{"c/item"}, ReducerVersion: version,
			InitialState: func() tally { return tally{} },
			Reduce:       func(s tally, e itx.Event) tally { return tally{N: s.N + step} },
			ProcessEvent: func(ctx context.Context, a *processors.Args[tally]) error {
				if a.Event != nil {
					mu.Lock()
					processed = append(processed, a.Event.Offset)
					mu.Unlock()
				}
				return nil
			},
		}
	}
	proctest.Run(t, proctest.Config[tally]{New: c}, func(t *testing.T, h *proctest.Harness[tally]) {
		for range 3 {
			h.Append(itx.EventInput{Type: "c/item"})
		}
		h.Crash() // the next incarnation runs reducer version 2
		if got := h.State().N; got != 30 {
			t.Errorf("state %d after the version change, want 30 (re-reduced by the new Reduce)", got)
		}
		h.Append(itx.EventInput{Type: "c/item"})
		mu.Lock()
		defer mu.Unlock()
		if got, want := fmt.Sprint(processed), "[1 2 3 4]"; got != want {
			t.Errorf("ProcessEvent ran on %s, want %s (never again for processed events)", got, want)
		}
		if got := h.State().N; got != 40 {
			t.Errorf("state %d, want 40", got)
		}
	})
}

// Blockers run in strict FIFO order, each after the previous one settled: when one fails, the
// later ones do not run, nothing of the frame commits, and the next wake redelivers the event
// and runs them all again, in order.
func TestSeedProc_FailedBlockerStopsTheQueue(t *testing.T) {
	var mu sync.Mutex
	var order []string
	failFirst := true
	c := func(env proctest.Env) processors.Contract[tally] {
		return processors.Contract[tally]{
			Name: "fifo", ConsumedTypes: []string{"c/item"}, ReducerVersion: "1",
			InitialState: func() tally { return tally{} },
			Reduce:       func(s tally, e itx.Event) tally { return tally{N: s.N + 1} },
			ProcessEvent: func(ctx context.Context, a *processors.Args[tally]) error {
				if a.Event == nil {
					return nil
				}
				a.BlockProcessorWhile("first", func(ctx context.Context) error {
					mu.Lock()
					defer mu.Unlock()
					order = append(order, "first")
					if failFirst {
						failFirst = false
						return errors.New("transient")
					}
					return nil
				})
				a.BlockProcessorWhile("second", func(ctx context.Context) error {
					mu.Lock()
					defer mu.Unlock()
					order = append(order, "second")
					return nil
				})
				return nil
			},
		}
	}
	proctest.Run(t, proctest.Config[tally]{New: c}, func(t *testing.T, h *proctest.Harness[tally]) {
		h.Append(itx.EventInput{Type: "c/item"})
		if errs := h.TakeDeliveryErrors(); len(errs) != 1 || !strings.Contains(errs[0].Error(), "transient") {
			t.Fatalf("delivery errors %v, want the first blocker's", errs)
		}
		if got := h.Runner().ProcessedThrough(); got != 0 {
			t.Errorf("cursor %d after a failed blocker, want 0 (held)", got)
		}
		mu.Lock()
		if got := strings.Join(order, " "); got != "first" {
			t.Errorf("ran %q, want only the first blocker", got)
		}
		mu.Unlock()
		h.Wake()
		mu.Lock()
		if got := strings.Join(order, " "); got != "first first second" {
			t.Errorf("ran %q, want the redelivery to run both in order", got)
		}
		mu.Unlock()
		if h.State().N != 1 || h.Runner().ProcessedThrough() != 1 {
			t.Errorf("state %d cursor %d, want 1 and 1", h.State().N, h.Runner().ProcessedThrough())
		}
	})
}

// Long legitimate work keeps the alarm about KeepaliveLead ahead of it (busy fires push it on)
// and is never revived; once it settles cleanly the confirmation fire disarms and the budget
// stays at zero.
func TestSeedProc_LongWorkIsKeptAliveNotRevived(t *testing.T) {
	c := func(env proctest.Env) processors.Contract[tally] {
		return processors.Contract[tally]{
			Name: "long", ConsumedTypes: []string{"c/item"}, ReducerVersion: "1",
			InitialState: func() tally { return tally{} },
			Reduce:       func(s tally, e itx.Event) tally { return tally{N: s.N + 1} },
			ProcessEvent: func(ctx context.Context, a *processors.Args[tally]) error {
				if a.Event == nil {
					return nil
				}
				// Droppable: the test is about the keepalive around it.
				a.RunInBackground(func(ctx context.Context) error {
					done := make(chan struct{})
					env.Clock.AfterFunc(95*time.Second, func() { close(done) }) // a slow vendor
					select {
					case <-done:
						return nil
					case <-ctx.Done():
						return ctx.Err()
					}
				})
				return nil
			},
		}
	}
	proctest.Run(t, proctest.Config[tally]{New: c}, func(t *testing.T, h *proctest.Harness[tally]) {
		start := h.Clock.Now()
		h.Append(itx.EventInput{Type: "c/item"})
		h.AdvanceTime(90 * time.Second)
		if got, want := h.AlarmAt(), start.Add(90*time.Second+processors.KeepaliveLead); !got.Equal(want) {
			t.Errorf("alarm %v while the work runs, want %v (the lead ahead)", got, want)
		}
		h.AdvanceTime(time.Hour)
		if n := len(h.Events(itx.TypeProcessorRevived)); n != 0 {
			t.Errorf("%d revivals of legitimate long work, want 0", n)
		}
		if !h.AlarmAt().IsZero() || h.Keepalive().Revivals != 0 {
			t.Errorf("alarm %v keepalive %+v, want disarmed and no revivals", h.AlarmAt(), h.Keepalive())
		}
		var actions []string
		for _, f := range h.Fires() {
			actions = append(actions, string(f.Action))
		}
		if got := strings.Join(actions, " "); !strings.HasSuffix(got, string(processors.ActionCleanDisarm)) || strings.Contains(got, "reviv") {
			t.Errorf("fires %q, want busy re-arms then a clean disarm", got)
		}
	})
}

func equalCalls(a, b []call) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Seed 002: ephemeral appends never reach processor delivery, and the keepalive tracks work in
// flight. Streaming chunks appended ephemeral after the processor's pass at the head run no pass
// and are no tracked work: the disarmed keepalive stays disarmed (no arm, no confirmation fire
// per burst of chunks), while the processing cursor still passes them.
func TestSeedProc_EphemeralChunksAreNoKeepaliveWork(t *testing.T) {
	r := &recorder{}
	proctest.Run(t, proctest.Config[tally]{New: r.contract}, func(t *testing.T, h *proctest.Harness[tally]) {
		h.Append(itx.EventInput{Type: "c/item"})
		if got := r.taken(); len(got) != 1 || !got[0].caughtUp {
			t.Fatalf("passes %+v, want the item's, caught up", got)
		}
		h.AdvanceTime(processors.KeepaliveLead) // the confirmation fire disarms
		if at := h.AlarmAt(); !at.IsZero() {
			t.Fatalf("alarm armed at %v after the quiet confirmation", at)
		}
		fires := len(h.Fires())
		for range 3 {
			h.Append(itx.EventInput{Type: "c/item", Ephemeral: true})
		}
		if got := r.taken(); len(got) != 0 {
			t.Errorf("passes %+v for ephemeral chunks, want none", got)
		}
		if at := h.AlarmAt(); !at.IsZero() {
			t.Errorf("ephemeral chunks armed the keepalive at %v", at)
		}
		h.AdvanceTime(processors.KeepaliveLead)
		if got := h.Fires()[fires:]; len(got) != 0 {
			t.Errorf("fires %+v after ephemeral chunks, want none", got)
		}
		if got, want := h.Runner().ProcessedThrough(), h.Stream.Head(); got != want {
			t.Errorf("cursor %d, want the head %d", got, want)
		}
	})
}
