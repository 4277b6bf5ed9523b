package proctest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
	proctest "github.com/itx-dev/itx/processors/testing"
)

type tally struct {
	N int `json:"n"`
}

// straggler consumes "job/queued" and starts a background attempt that waits for gate, ignoring
// its context, then appends "job/done": a closure that outlives its incarnation.
func straggler(gate <-chan struct{}, result chan<- error) func(proctest.Env) processors.Contract[tally] {
	return func(env proctest.Env) processors.Contract[tally] {
		return processors.Contract[tally]{
			Name: "straggler", ConsumedTypes: []string{"job/queued"}, ReducerVersion: "1",
			InitialState: func() tally { return tally{} },
			Reduce:       func(s tally, e itx.Event) tally { return tally{N: s.N + 1} },
			ProcessEvent: func(ctx context.Context, a *processors.Args[tally]) error {
				if a.Event == nil {
					return nil
				}
				// Droppable on purpose: this test is about what a dropped attempt can still do.
				a.RunInBackground(func(ctx context.Context) error {
					<-gate
					_, err := a.Append(context.Background(), itx.EventInput{Type: "job/done", IdempotencyKey: a.IdempotencyKey("done", a.Event)})
					result <- err
					return err
				})
				return nil
			},
		}
	}
}

func TestHarness_Crash(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate, result := make(chan struct{}), make(chan error, 1)
		h := proctest.New(t, proctest.Config[tally]{New: straggler(gate, result)})
		h.Append(itx.EventInput{Type: "job/queued"})
		if h.AlarmAt().IsZero() {
			t.Fatal("no alarm while the attempt is in flight")
		}
		h.Crash()
		if got := h.Incarnation(); got != 2 {
			t.Errorf("incarnation %d after a crash, want 2", got)
		}
		close(gate) // the dead incarnation's attempt wakes up and tries to append
		synctest.Wait()
		if err := <-result; itx.ErrorCode(err) != itx.EFailedPrecondition {
			t.Errorf("the dead incarnation's append: %v, want it fenced (%s)", err, itx.EFailedPrecondition)
		}
		if got := h.Events("job/done"); len(got) != 0 {
			t.Errorf("a dead incarnation's append landed: %v", got)
		}
		// The successor is not delivered to until a wake: its state comes from progress.
		if got := h.State().N; got != 1 {
			t.Errorf("successor state %d, want 1 (committed before the crash)", got)
		}
	})
}

func TestHarness_Play(t *testing.T) {
	gateClosed := make(chan struct{})
	close(gateClosed)
	proctest.Run(t, proctest.Config[tally]{New: straggler(gateClosed, make(chan error, 10))}, func(t *testing.T, h *proctest.Harness[tally]) {
		var mid int
		start := h.Clock.Now()
		h.Play(
			proctest.AppendStep[tally](itx.EventInput{Type: "job/queued"}),
			proctest.AdvanceStep[tally](time.Minute),
			proctest.Do[tally](func() { mid = h.State().N }),
			proctest.AppendStep[tally](itx.EventInput{Type: "job/queued"}),
		)
		if mid != 1 || h.State().N != 2 {
			t.Errorf("state mid-play %d, at the end %d; want 1 and 2", mid, h.State().N)
		}
		if got := h.Clock.Now().Sub(start); got != time.Minute {
			t.Errorf("clock moved %v, want 1m", got)
		}
		// Both attempts settled cleanly: the confirmation fire disarmed the alarm and the
		// keepalive record shows no revival.
		if got := len(h.Events("job/done")); got != 2 {
			t.Errorf("%d job/done, want 2", got)
		}
		h.AdvanceTime(processors.KeepaliveLead)
		if !h.AlarmAt().IsZero() || h.Keepalive().Revivals != 0 {
			t.Errorf("alarm %v keepalive %+v, want disarmed and no revivals", h.AlarmAt(), h.Keepalive())
		}
		raw, _ := json.Marshal(h.Fires())
		if string(raw) == "null" {
			t.Errorf("no alarm fire recorded")
		}
	})
}

// timeouts opens a task on "task/opened" and schedules its "task/timed-out" ten minutes later
// (a durable timer); the state counts the timeouts that landed.
func timeouts(env proctest.Env) processors.Contract[tally] {
	return processors.Contract[tally]{
		Name: "timeouts", ConsumedTypes: []string{"task/opened", "task/timed-out"}, ReducerVersion: "1",
		InitialState: func() tally { return tally{} },
		Reduce: func(s tally, e itx.Event) tally {
			if e.Type == "task/timed-out" {
				s.N++
			}
			return s
		},
		ProcessEvent: func(ctx context.Context, a *processors.Args[tally]) error {
			if a.Event == nil || a.Event.Type != "task/opened" {
				return nil
			}
			return a.ScheduleAppend(ctx, time.UnixMilli(a.Event.CreatedAt).Add(10*time.Minute),
				itx.EventInput{Type: "task/timed-out", IdempotencyKey: a.IdempotencyKey("timeout", a.Event)})
		},
	}
}

// A scheduled append lands at its time on the virtual clock, once, across a crash in between.
func TestHarness_ScheduledAppendSurvivesACrash(t *testing.T) {
	proctest.Run(t, proctest.Config[tally]{New: timeouts}, func(t *testing.T, h *proctest.Harness[tally]) {
		h.Append(itx.EventInput{Type: "task/opened"})
		if got := len(h.Stream.Scheduled()); got != 1 {
			t.Fatalf("%d scheduled, want 1", got)
		}
		h.AdvanceTime(9 * time.Minute)
		h.Crash()
		if got := h.Events("task/timed-out"); len(got) != 0 {
			t.Fatalf("timed out early: %v", got)
		}
		h.AdvanceTime(time.Minute)
		if got := h.Events("task/timed-out"); len(got) != 1 {
			t.Fatalf("%d timeouts after ten minutes, want 1", len(got))
		}
		if got := h.State().N; got != 1 {
			t.Errorf("state %d, want the landed timeout reduced", got)
		}
		h.AdvanceTime(time.Hour)
		if got := h.Events("task/timed-out"); len(got) != 1 {
			t.Errorf("%d timeouts, want exactly one", len(got))
		}
	})
}

// A scheduled append whose time has already passed lands at the next settle, as in itxd, without
// the test moving the clock.
func TestHarness_PastDueScheduledAppendLandsAtOnce(t *testing.T) {
	proctest.Run(t, proctest.Config[tally]{New: timeouts}, func(t *testing.T, h *proctest.Harness[tally]) {
		past := h.Clock.Now().Add(-time.Minute)
		if err := h.Stream.Schedule(context.Background(), itx.EventInput{Type: "task/timed-out", IdempotencyKey: "late"}, past); err != nil {
			t.Fatal(err)
		}
		h.Append(itx.EventInput{Type: "unrelated"})
		if got := len(h.Events("task/timed-out")); got != 1 {
			t.Fatalf("%d landed, want the past-due one", got)
		}
		if got := h.State().N; got != 1 {
			t.Errorf("state %d, want the landed event reduced", got)
		}
	})
}

// doors is a state whose InitialState is not empty: one door, "front", open until closed. A
// closed door is deleted from the map (copy on write).
func doors(env proctest.Env) processors.Contract[map[string]bool] {
	return processors.Contract[map[string]bool]{
		Name: "doors", ConsumedTypes: []string{"door/closed"}, ReducerVersion: "1",
		InitialState: func() map[string]bool { return map[string]bool{"front": true} },
		Reduce: func(s map[string]bool, e itx.Event) map[string]bool {
			var closed struct{ Door string }
			_ = json.Unmarshal(e.Payload, &closed)
			next := map[string]bool{}
			for k, v := range s {
				if k != closed.Door {
					next[k] = v
				}
			}
			return next
		},
	}
}

// A successor incarnation's state is the committed one, not the committed one laid over
// InitialState: the door closed before the crash stays closed (its key deleted from the map), as
// Reduce folded over the stream says.
func TestHarness_CrashKeepsTheCommittedState(t *testing.T) {
	proctest.Run(t, proctest.Config[map[string]bool]{New: doors}, func(t *testing.T, h *proctest.Harness[map[string]bool]) {
		h.Append(itx.EventInput{Type: "door/closed", Payload: json.RawMessage(`{"door":"front"}`)})
		if got := h.State(); len(got) != 0 {
			t.Fatalf("state %v before the crash, want no open door", got)
		}
		h.Crash()
		h.Wake()
		if got := h.State(); len(got) != 0 {
			t.Errorf("state %v after the crash, want no open door", got)
		}
		h.Append(itx.EventInput{Type: "unrelated"})
		if got := h.State(); len(got) != 0 {
			t.Errorf("state %v after the successor's first frame, want no open door", got)
		}
	})
}

// A scheduled append refused when it comes due (its key was taken meanwhile by another body) is
// done, and leaves its evidence on the stream, one stream/error-occurred, as in itxd.
func TestHarness_RefusedScheduledAppendIsRecorded(t *testing.T) {
	proctest.Run(t, proctest.Config[tally]{New: timeouts}, func(t *testing.T, h *proctest.Harness[tally]) {
		h.Append(itx.EventInput{Type: "task/opened"})
		pending := h.Stream.Scheduled()
		if len(pending) != 1 {
			t.Fatalf("%d scheduled, want 1", len(pending))
		}
		h.Append(itx.EventInput{Type: "task/timed-out", Payload: json.RawMessage(`{"early":true}`), IdempotencyKey: pending[0].Event.IdempotencyKey})
		h.AdvanceTime(time.Hour)
		if got := len(h.Stream.Scheduled()); got != 0 {
			t.Errorf("%d still scheduled, want none", got)
		}
		if got := len(h.Events("task/timed-out")); got != 1 {
			t.Errorf("%d timeouts, want the early one only", got)
		}
		if got := h.Events(itx.TypeErrorOccurred); len(got) != 1 {
			t.Errorf("%d error records (%v), want 1 for the refused scheduled append", len(got), got)
		}
	})
}

// waiter consumes "job/queued" and starts a background attempt that waits two seconds on the
// virtual clock, then appends "job/done".
func waiter(env proctest.Env) processors.Contract[tally] {
	return processors.Contract[tally]{
		Name: "waiter", ConsumedTypes: []string{"job/queued"}, ReducerVersion: "1",
		InitialState: func() tally { return tally{} },
		Reduce:       func(s tally, e itx.Event) tally { return tally{N: s.N + 1} },
		ProcessEvent: func(ctx context.Context, a *processors.Args[tally]) error {
			if a.Event == nil {
				return nil
			}
			// Droppable: the test is about when it runs, not what recovers it.
			a.RunInBackground(func(ctx context.Context) error {
				elapsed := make(chan struct{})
				t := env.Clock.AfterFunc(2*time.Second, func() { close(elapsed) })
				defer t.Stop()
				select {
				case <-elapsed:
				case <-ctx.Done():
					return ctx.Err()
				}
				_, err := a.Append(ctx, itx.EventInput{Type: "job/done", IdempotencyKey: a.IdempotencyKey("done", a.Event)})
				return err
			})
			return nil
		},
	}
}

// AdvanceTime stops at every clock timer on the way, so the work a timer releases runs at the
// timer's time, before a later alarm fire looks at it: the attempt appends at +2s, and the
// keepalive's fire at +10s finds it settled (quiet and clean), not still in flight.
func TestHarness_AdvanceTimeRunsTimersAtTheirTime(t *testing.T) {
	proctest.Run(t, proctest.Config[tally]{New: waiter}, func(t *testing.T, h *proctest.Harness[tally]) {
		start := h.Clock.Now()
		h.Append(itx.EventInput{Type: "job/queued"})
		h.AdvanceTime(time.Minute)
		done := h.Events("job/done")
		if len(done) != 1 {
			t.Fatalf("%d job/done, want 1", len(done))
		}
		if got := time.UnixMilli(done[0].CreatedAt).Sub(start); got != 2*time.Second {
			t.Errorf("job/done appended at +%v, want +2s (its timer's time)", got)
		}
		raw, _ := json.Marshal(h.Fires())
		if got, want := string(raw), `[{"Name":"waiter","Action":"clean-disarm"}]`; got != want {
			t.Errorf("alarm fires %s, want %s", got, want)
		}
	})
}

// A hung attempt no deadline owns (it ignores its context) trips the busy-fire cap: the keepalive
// re-arms at the lead for about 15 minutes, then revives along the backoff, not at the lead.
func TestHarness_WedgedAttemptDecaysAlongTheBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{}) // made in the bubble, so an attempt blocked on it is durably blocked
		defer close(gate)
		h := proctest.New(t, proctest.Config[tally]{New: straggler(gate, make(chan error, 1))})
		h.Append(itx.EventInput{Type: "job/queued"})
		startedAt := h.Clock.Now()
		h.AdvanceTime(14 * time.Minute)
		if n := len(h.Events(itx.TypeProcessorRevived)); n != 0 {
			t.Errorf("%d revivals while the attempt is younger than the wedge bound", n)
		}
		h.AdvanceTime(3 * time.Minute)
		revived := h.Events(itx.TypeProcessorRevived)
		if len(revived) != 3 {
			t.Fatalf("%d revivals 17 minutes in, want 3", len(revived))
		}
		if got := time.UnixMilli(revived[0].CreatedAt).Sub(startedAt); got < processors.WedgedAfter || got > processors.WedgedAfter+processors.KeepaliveLead {
			t.Errorf("first revival %v after the attempt started, want within a lead of %v", got, processors.WedgedAfter)
		}
		var gaps []string
		for i := 1; i < len(revived); i++ {
			gaps = append(gaps, (time.Duration(revived[i].CreatedAt-revived[i-1].CreatedAt) * time.Millisecond).String())
		}
		if got, want := strings.Join(gaps, " "), "10s 1m0s"; got != want {
			t.Errorf("gaps between wedged revivals %q, want %q", got, want)
		}
	})
}

// How long an attempt has run is measured on the monotonic clock: a step of the wall clock an
// hour forward (NTP, an operator) while it runs does not make it look wedged, which would revive
// the processor while the attempt still runs; 15 minutes of it running still do.
func TestHarness_WedgedAttemptNotByAStepOfTheWallClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		defer close(gate)
		h := proctest.New(t, proctest.Config[tally]{New: straggler(gate, make(chan error, 1))})
		h.Append(itx.EventInput{Type: "job/queued"})
		startedAt := h.Clock.Now()
		h.Clock.Jump(time.Hour)
		h.AdvanceTime(time.Minute)
		if n := len(h.Events(itx.TypeProcessorRevived)); n != 0 {
			t.Fatalf("%d revivals a minute into the attempt, after the wall clock stepped an hour forward", n)
		}
		fires := h.Fires()
		if len(fires) == 0 {
			t.Fatal("no alarm fire in the minute after the step")
		}
		for _, f := range fires {
			if f.Action != processors.ActionBusyRearmed {
				t.Fatalf("alarm fires %v, want each %s", fires, processors.ActionBusyRearmed)
			}
		}
		h.AdvanceTime(13 * time.Minute)
		if n := len(h.Events(itx.TypeProcessorRevived)); n != 0 {
			t.Fatalf("%d revivals 14 minutes into the attempt", n)
		}
		h.AdvanceTime(2 * time.Minute)
		revived := h.Events(itx.TypeProcessorRevived)
		if len(revived) == 0 {
			t.Fatal("no revival 16 minutes into a hung attempt")
		}
		ran := time.UnixMilli(revived[0].CreatedAt).Sub(startedAt) - time.Hour
		if ran < processors.WedgedAfter || ran > processors.WedgedAfter+processors.KeepaliveLead {
			t.Errorf("first revival %v into the attempt (the step left out), want within a lead of %v", ran, processors.WedgedAfter)
		}
	})
}

// hanger consumes "job/queued" and blocks on it until its incarnation ends: the poison of an
// event whose processing takes the incarnation down every time.
func hanger(env proctest.Env) processors.Contract[tally] {
	return processors.Contract[tally]{
		Name: "hanger", ConsumedTypes: []string{"job/queued"}, ReducerVersion: "1",
		InitialState: func() tally { return tally{} },
		Reduce:       func(s tally, e itx.Event) tally { return tally{N: s.N + 1} },
		ProcessEvent: func(ctx context.Context, a *processors.Args[tally]) error {
			if a.Event == nil {
				return nil
			}
			// Blocking: the poison under test; it never settles while the incarnation lives.
			a.BlockProcessorWhile("hang", func(ctx context.Context) error {
				<-ctx.Done()
				return ctx.Err()
			})
			return nil
		},
	}
}

// A poison that evicts its incarnation every time it is delivered: each fresh incarnation's
// redelivery is tracked work, but it must not pull the alarm back to the lead while the breaker
// backs off, or the stream wakes (and the poison runs) every ten seconds forever. Revivals follow
// the backoff, and the alarm fires at most twice per revival (the revival, and the confirmation
// that finds the dead incarnation's successor still owing).
func TestHarness_EvictingPoisonWakesAlongTheBackoff(t *testing.T) {
	proctest.Run(t, proctest.Config[tally]{New: hanger}, func(t *testing.T, h *proctest.Harness[tally]) {
		start := h.Clock.Now()
		h.Append(itx.EventInput{Type: "job/queued"})
		for {
			h.Crash() // the poison takes the incarnation down
			at := h.AlarmAt()
			if at.IsZero() {
				t.Fatalf("no alarm armed at +%v: the crash loop is not revived", h.Clock.Now().Sub(start))
			}
			if at.Sub(start) > 7*time.Hour {
				break
			}
			h.AdvanceTime(at.Sub(h.Clock.Now()))
		}
		revived := h.Events(itx.TypeProcessorRevived)
		var gaps []string
		for i := 1; i < len(revived); i++ {
			gaps = append(gaps, (time.Duration(revived[i].CreatedAt-revived[i-1].CreatedAt) * time.Millisecond).String())
		}
		if got, want := strings.Join(gaps, " "), "10s 1m0s 5m0s 30m0s 6h0m0s"; got != want {
			t.Errorf("gaps between revivals %q, want %q", got, want)
		}
		if fires := len(h.Fires()); fires > 2*len(revived) {
			t.Errorf("%d alarm fires for %d revivals in 7h: the poison ran at the lead, not along the backoff", fires, len(revived))
		}
	})
}

// MemoryKV's Delete removes a key, and deleting an absent key is no error (processors.KV).
func TestMemoryKV_Delete(t *testing.T) {
	ctx := context.Background()
	kv := proctest.NewMemoryKV()
	if err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := kv.Get(ctx, "k"); ok {
		t.Error("got the deleted key back")
	}
	if err := kv.Delete(ctx, "k"); err != nil {
		t.Errorf("deleting an absent key: %v", err)
	}
}

// reminder consumes "job/queued" and arms a one-minute timer on the virtual clock that it never
// stops (user code: no context, no fence), recording which incarnation's callback ran.
func reminder(fired chan<- int) func(proctest.Env) processors.Contract[tally] {
	return func(env proctest.Env) processors.Contract[tally] {
		return processors.Contract[tally]{
			Name: "reminder", ConsumedTypes: []string{"job/queued"}, ReducerVersion: "1",
			InitialState: func() tally { return tally{} },
			Reduce:       func(s tally, e itx.Event) tally { return tally{N: s.N + 1} },
			ProcessEvent: func(ctx context.Context, a *processors.Args[tally]) error {
				if a.Event != nil {
					env.Clock.AfterFunc(time.Minute, func() { fired <- env.Incarnation })
				}
				return nil
			},
		}
	}
}

// A crash kills the incarnation's timers with it (a dead isolate runs nothing): a timer the dead
// incarnation armed never fires, however far the clock moves; the successor's own timers fire
// at their time. Before, the dead incarnation's callback ran when the clock passed it.
func TestHarness_CrashCancelsTheDeadIncarnationsTimers(t *testing.T) {
	fired := make(chan int, 10)
	proctest.Run(t, proctest.Config[tally]{New: reminder(fired)}, func(t *testing.T, h *proctest.Harness[tally]) {
		h.Append(itx.EventInput{Type: "job/queued"})
		h.Crash()
		h.AdvanceTime(2 * time.Minute)
		synctest.Wait()
		if len(fired) != 0 {
			t.Fatalf("incarnation %d's timer fired after it was killed", <-fired)
		}
		h.Append(itx.EventInput{Type: "job/queued"}) // the successor's wake
		h.AdvanceTime(2 * time.Minute)
		synctest.Wait()
		var got []int
		for len(fired) > 0 {
			got = append(got, <-fired)
		}
		if len(got) != 1 || got[0] != 2 {
			t.Errorf("timers fired for incarnations %v, want [2]", got)
		}
	})
}

// recordingTB is a testing.TB whose failures and cleanups a test of the harness observes instead
// of suffering: Errorf and Logf are recorded, and the cleanups run when the test says.
type recordingTB struct {
	testing.TB
	errors   []string
	logs     []string
	cleanups []func()
}

func (r *recordingTB) Logf(format string, args ...any) {
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
	r.TB.Logf(format, args...)
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func (r *recordingTB) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }

// end runs the cleanups, last first, as the end of a test does.
func (r *recordingTB) end() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.cleanups = nil
}

var errPoison = errors.New("poisoned job")

// poisoned fails every frame that holds a "job/queued": a processEvent bug.
func poisoned(env proctest.Env) processors.Contract[tally] {
	return processors.Contract[tally]{
		Name: "poisoned", ConsumedTypes: []string{"job/queued"}, ReducerVersion: "1",
		InitialState: func() tally { return tally{} },
		Reduce:       func(s tally, e itx.Event) tally { return tally{N: s.N + 1} },
		ProcessEvent: func(ctx context.Context, a *processors.Args[tally]) error {
			if a.Event == nil {
				return nil
			}
			return errPoison
		},
	}
}

// Under StrictDeliveryErrors a delivery failure nobody examined fails the test when it ends,
// naming the error, although every assertion the test made about the stream held; one the test
// listed or took does not. By default the stream is the assertion surface: an unexamined
// failure is logged, naming the error, and the test passes on what the stream shows.
func TestHarness_TakeDeliveryErrors(t *testing.T) {
	strict := proctest.Config[tally]{New: poisoned, StrictDeliveryErrors: true}
	t.Run("unexamined is logged by default", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tb := &recordingTB{TB: t}
			h := proctest.New(tb, proctest.Config[tally]{New: poisoned})
			h.Append(itx.EventInput{Type: "job/queued"})
			tb.end()
			if len(tb.errors) != 0 {
				t.Errorf("errors at the end %q, want none (not strict)", tb.errors)
			}
			logged := false
			for _, l := range tb.logs {
				logged = logged || strings.Contains(l, "did not examine") && strings.Contains(l, errPoison.Error())
			}
			if !logged {
				t.Errorf("logs %q, want the unexamined failure naming %q", tb.logs, errPoison)
			}
		})
	})
	t.Run("unexamined fails a strict test", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tb := &recordingTB{TB: t}
			h := proctest.New(tb, strict)
			h.Append(itx.EventInput{Type: "job/queued"})
			tb.end()
			if len(tb.errors) != 1 || !strings.Contains(tb.errors[0], errPoison.Error()) {
				t.Errorf("errors at the end %q, want one naming %q", tb.errors, errPoison)
			}
		})
	})
	t.Run("taken does not", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tb := &recordingTB{TB: t}
			h := proctest.New(tb, strict)
			queued := h.Append(itx.EventInput{Type: "job/queued"})[0]
			h.Wake() // the redelivery fails again
			errs := h.TakeDeliveryErrors()
			if len(errs) != 2 || !errors.Is(errs[0], errPoison) || !errors.Is(errs[1], errPoison) {
				t.Errorf("taken %v, want two failures of %v", errs, errPoison)
			}
			for _, err := range errs {
				if got := itx.FailingEventOf(err); got != queued.Offset {
					t.Errorf("failing event of %v: %d, want %d", err, got, queued.Offset)
				}
			}
			if again := h.TakeDeliveryErrors(); len(again) != 0 {
				t.Errorf("taken twice: %v", again)
			}
			tb.end()
			if len(tb.errors) != 0 {
				t.Errorf("errors at the end %q, want none (the failures were taken)", tb.errors)
			}
		})
	})
	t.Run("listed does not, until another fails", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tb := &recordingTB{TB: t}
			h := proctest.New(tb, strict)
			h.Append(itx.EventInput{Type: "job/queued"})
			if errs := h.DeliveryErrors(); len(errs) != 1 || !errors.Is(errs[0], errPoison) {
				t.Errorf("listed %v, want one failure of %v", errs, errPoison)
			}
			if errs := h.DeliveryErrors(); len(errs) != 1 {
				t.Errorf("listed again %v: listing does not clear", errs)
			}
			tb.end()
			if len(tb.errors) != 0 {
				t.Errorf("errors at the end %q, want none (the failure was listed)", tb.errors)
			}
		})
		synctest.Test(t, func(t *testing.T) {
			tb := &recordingTB{TB: t}
			h := proctest.New(tb, strict)
			h.Append(itx.EventInput{Type: "job/queued"})
			h.DeliveryErrors()
			h.Wake() // fails again, after the listing
			tb.end()
			if len(tb.errors) != 1 {
				t.Errorf("errors at the end %q, want the one after the listing", tb.errors)
			}
		})
	})
	t.Run("failed after the take fails the test", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tb := &recordingTB{TB: t}
			h := proctest.New(tb, strict)
			h.Append(itx.EventInput{Type: "job/queued"})
			if errs := h.TakeDeliveryErrors(); len(errs) != 1 {
				t.Fatalf("taken %v, want one failure", errs)
			}
			h.Wake()
			tb.end()
			if len(tb.errors) != 1 {
				t.Errorf("errors at the end %q, want the one after the take", tb.errors)
			}
		})
	})
}

// flaky consumes "job/queued" and starts a background attempt that fails: a droppable attempt's
// bug (the keepalive revives it, and it fails again).
func flaky(env proctest.Env) processors.Contract[tally] {
	return processors.Contract[tally]{
		Name: "flaky", ConsumedTypes: []string{"job/queued"}, ReducerVersion: "1",
		InitialState: func() tally { return tally{} },
		Reduce:       func(s tally, e itx.Event) tally { return tally{N: s.N + 1} },
		ProcessEvent: func(ctx context.Context, a *processors.Args[tally]) error {
			if a.Event == nil {
				return nil
			}
			// Droppable: the test is about its failure being seen.
			a.RunInBackground(func(ctx context.Context) error { return errPoison })
			return nil
		},
	}
}

// A failed background attempt is recorded for the test to take and assert on; a droppable
// attempt failing is not by itself a failed test. The frame that started it succeeded.
func TestHarness_TakeBackgroundErrors(t *testing.T) {
	t.Run("untaken does not fail the test", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tb := &recordingTB{TB: t}
			h := proctest.New(tb, proctest.Config[tally]{New: flaky})
			h.Append(itx.EventInput{Type: "job/queued"})
			tb.end()
			if len(tb.errors) != 0 {
				t.Errorf("errors at the end %q, want none", tb.errors)
			}
		})
	})
	t.Run("taken", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tb := &recordingTB{TB: t}
			h := proctest.New(tb, proctest.Config[tally]{New: flaky})
			h.Append(itx.EventInput{Type: "job/queued"})
			if errs := h.TakeBackgroundErrors(); len(errs) != 1 || !errors.Is(errs[0], errPoison) {
				t.Errorf("taken %v, want one failure of %v", errs, errPoison)
			}
			if errs := h.TakeDeliveryErrors(); len(errs) != 0 {
				t.Errorf("delivery failures %v, want none: the frame succeeded", errs)
			}
			if errs := h.TakeBackgroundErrors(); len(errs) != 0 {
				t.Errorf("taken twice: %v", errs)
			}
		})
	})
	t.Run("a crash's attempt is not recorded", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tb := &recordingTB{TB: t}
			gate := make(chan struct{})
			h := proctest.New(tb, proctest.Config[tally]{New: straggler(gate, make(chan error, 1))})
			h.Append(itx.EventInput{Type: "job/queued"})
			h.Crash()
			close(gate) // the dead incarnation's attempt is fenced: the eviction's doing
			synctest.Wait()
			if errs := h.TakeBackgroundErrors(); len(errs) != 0 {
				t.Errorf("recorded %v, want nothing: the crash ended the attempt", errs)
			}
			tb.end()
		})
	})
}

// debouncer consumes "job/queued" and, in a background attempt, waits 250 ms on the time
// package (wait) before appending "job/debounced": processor code on real timers, not Env.Clock.
func debouncer(wait func(d time.Duration)) func(proctest.Env) processors.Contract[tally] {
	return func(env proctest.Env) processors.Contract[tally] {
		return processors.Contract[tally]{
			Name: "debouncer", ConsumedTypes: []string{"job/queued"}, ReducerVersion: "1",
			InitialState: func() tally { return tally{} },
			Reduce:       func(s tally, e itx.Event) tally { return tally{N: s.N + 1} },
			ProcessEvent: func(ctx context.Context, a *processors.Args[tally]) error {
				if a.Event == nil {
					return nil
				}
				key := a.IdempotencyKey("debounced", a.Event)
				// Droppable: losing the timer costs latency only in this test's story.
				a.RunInBackground(func(ctx context.Context) error {
					wait(250 * time.Millisecond)
					_, err := a.Append(ctx, itx.EventInput{Type: "job/debounced", IdempotencyKey: key})
					return err
				})
				return nil
			},
		}
	}
}

// AdvanceTime moves the synctest bubble's clock too, so a debounce on the time package fires
// during AdvanceTime(1s), and not before its 250 ms have passed.
func TestHarness_AdvanceTimeMovesTheTimePackage(t *testing.T) {
	waits := map[string]func(time.Duration){
		"time.After": func(d time.Duration) { <-time.After(d) },
		"time.Sleep": time.Sleep,
		"time.AfterFunc": func(d time.Duration) {
			fired := make(chan struct{})
			time.AfterFunc(d, func() { close(fired) })
			<-fired
		},
	}
	for name, wait := range waits {
		t.Run(name, func(t *testing.T) {
			proctest.Run(t, proctest.Config[tally]{New: debouncer(wait)}, func(t *testing.T, h *proctest.Harness[tally]) {
				h.Append(itx.EventInput{Type: "job/queued"})
				h.AdvanceTime(200 * time.Millisecond)
				if got := len(h.Events("job/debounced")); got != 0 {
					t.Fatalf("%d job/debounced after 200ms, want 0 (the debounce is 250ms)", got)
				}
				h.AdvanceTime(800 * time.Millisecond)
				if got := len(h.Events("job/debounced")); got != 1 {
					t.Fatalf("%d job/debounced after AdvanceTime(1s) in all, want 1", got)
				}
			})
		})
	}
}

// poisonedUntil is poisoned on every host version but fixed (the antidote), healthy on fixed.
func poisonedUntil(fixed string) func(proctest.Env) processors.Contract[tally] {
	return func(env proctest.Env) processors.Contract[tally] {
		c := poisoned(env)
		if env.Version == fixed {
			c.ProcessEvent = func(ctx context.Context, a *processors.Args[tally]) error { return nil }
		}
		return c
	}
}

// The antidote deploy: a poison the breaker backs off at the plateau (next revival six hours
// away) is revived the moment a new version is deployed, with a fresh budget, and the fixed
// processor settles: its frame is processed and a quiet clean fire disarms the keepalive.
func TestHarness_Deploy(t *testing.T) {
	cfg := proctest.Config[tally]{Version: "v1", New: poisonedUntil("v2")}
	proctest.Run(t, cfg, func(t *testing.T, h *proctest.Harness[tally]) {
		h.Append(itx.EventInput{Type: "job/queued"})
		h.AdvanceTime(7 * time.Hour)
		if got := h.Keepalive(); got.Revivals < 5 || got.Version != "v1" {
			t.Fatalf("keepalive %+v, want the breaker at the plateau on v1", got)
		}
		if wait := h.AlarmAt().Sub(h.Clock.Now()); wait < time.Hour {
			t.Fatalf("next revival in %v, want the plateau's hours", wait)
		}
		before := len(h.Events(itx.TypeProcessorRevived))
		deployed := h.Clock.Now()

		h.Deploy("v2")
		revived := h.Events(itx.TypeProcessorRevived)
		if len(revived) != before+1 {
			t.Fatalf("%d revivals after the deploy, want %d (one at once)", len(revived), before+1)
		}
		last := revived[len(revived)-1]
		if got := time.UnixMilli(last.CreatedAt); !got.Equal(deployed) {
			t.Errorf("revived at %v, want at the deploy (%v)", got, deployed)
		}
		var p struct {
			Revivals int    `json:"revivals"`
			Version  string `json:"version"`
		}
		if err := json.Unmarshal(last.Payload, &p); err != nil || p.Revivals != 1 || p.Version != "v2" {
			t.Errorf("revival payload %s, want the first revival of v2 (a fresh budget)", last.Payload)
		}
		if got := h.State().N; got != 1 || h.Runner().ProcessedThrough() != h.Stream.Head() {
			t.Errorf("state %d cursor %d head %d, want the fixed processor through the head", got, h.Runner().ProcessedThrough(), h.Stream.Head())
		}

		h.AdvanceTime(time.Minute)
		if got := h.Keepalive(); got.Revivals != 0 || !h.AlarmAt().IsZero() {
			t.Errorf("keepalive %+v alarm %v, want a quiet clean fire to reset and disarm", got, h.AlarmAt())
		}
		if got := len(h.Events(itx.TypeProcessorRevived)); got != before+1 {
			t.Errorf("%d revivals, want no more after the fix (%d)", got, before+1)
		}
	})
}

// tallier counts "job/queued" events, acknowledges each with an append of its own, and at the
// head appends a summary of the count (keyed by it): outcomes that must not depend on how the
// stream was cut into frames. With leaky, each acknowledgement's body also says whether it was
// made caught up: where the head falls relative to an event depends on the cut (caughtUp is true
// on the last consumed event of a scan that reaches the head), so the variant's outcome does too.
func tallier(leaky bool) func(proctest.Env) processors.Contract[tally] {
	return func(proctest.Env) processors.Contract[tally] {
		return processors.Contract[tally]{
			Name: "tallier", ConsumedTypes: []string{"job/queued"}, ReducerVersion: "1",
			InitialState: func() tally { return tally{} },
			Reduce:       func(s tally, e itx.Event) tally { return tally{N: s.N + 1} },
			ProcessEvent: func(ctx context.Context, a *processors.Args[tally]) error {
				var out []itx.EventInput
				if a.Event != nil {
					ack := itx.EventInput{Type: "job/acked", IdempotencyKey: a.IdempotencyKey("ack", a.Event)}
					if leaky {
						ack.Payload = json.RawMessage(fmt.Sprintf(`{"caughtUp":%t}`, a.Delivery.CaughtUp))
					}
					out = append(out, ack)
				}
				if a.Delivery.CaughtUp {
					body, _ := json.Marshal(a.State)
					out = append(out, itx.EventInput{Type: "job/summary", Payload: body, IdempotencyKey: fmt.Sprintf("summary@%d", a.State.N)})
				}
				if len(out) == 0 {
					return nil
				}
				_, err := a.Append(ctx, out...)
				return err
			},
		}
	}
}

// Partition invariance (seed 002): one stream delivered in one batch, as singletons and in random
// partitions (Config.PartitionSeed) leaves the same state and the same appends. A processor whose
// per-event effect says where the head stood is caught: its outcome depends on the cut.
func TestHarness_PartitionInvariance(t *testing.T) {
	var input []itx.EventInput
	for i := 0; i < 23; i++ {
		typ := "job/queued"
		if i%3 == 1 || i >= 20 { // unconsumed noise, and an unconsumed tail at the head
			typ = "noise/ping"
		}
		input = append(input, itx.EventInput{Type: typ})
	}
	outcome := func(t *testing.T, leaky bool, pageSize int, seed uint64) string {
		var out string
		cfg := proctest.Config[tally]{New: tallier(leaky), PageSize: pageSize, PartitionSeed: seed, StrictDeliveryErrors: true}
		proctest.Run(t, cfg, func(t *testing.T, h *proctest.Harness[tally]) {
			if _, err := h.Stream.Append(context.Background(), input); err != nil { // committed, not delivered
				t.Fatal(err)
			}
			h.Wake()
			var lines []string
			for _, e := range h.Events() {
				if e.Offset > int64(len(input)) {
					lines = append(lines, fmt.Sprintf("%s %s %s", e.Type, e.IdempotencyKey, e.Payload))
				}
			}
			slices.Sort(lines)
			out = fmt.Sprintf("state %+v\n%s", h.State(), strings.Join(lines, "\n"))
		})
		return out
	}
	cuts := []struct {
		name     string
		pageSize int
		seed     uint64
	}{{"one batch", 100, 0}, {"singletons", 1, 0}, {"random 1", 7, 1}, {"random 2", 7, 2}, {"random 3", 4, 3}}
	for _, leaky := range []bool{false, true} {
		want := outcome(t, leaky, cuts[0].pageSize, cuts[0].seed)
		if !strings.Contains(want, "job/summary summary@13") || strings.Count(want, "job/acked") != 13 {
			t.Fatalf("one batch left too little to compare:\n%s", want)
		}
		differs := false
		for _, c := range cuts[1:] {
			got := outcome(t, leaky, c.pageSize, c.seed)
			differs = differs || got != want
			if got != want && !leaky {
				t.Errorf("%s:\n%s\nwant (one batch):\n%s", c.name, got, want)
			}
		}
		if leaky && !differs {
			t.Errorf("a processor whose acknowledgements say caughtUp left the same outcome under every cut: the comparison cannot fail")
		}
	}
}

// The harness's clock has a type other modules can name (its defining package is internal).
var _ *proctest.Clock = (&proctest.Harness[int]{}).Clock
