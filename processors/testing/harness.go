// Package proctest (imported from processors/testing) is the processor test harness of seed 002:
// the real runner, registry and keepalive over an in-memory stream, progress store, KV and alarm
// cell, a virtual clock, Crash, Deploy (a new host version: the antidote deploy), Append,
// AdvanceTime and step tuples.
//
// Its honesty rules: runtime state comes from lifecycle only (an empty live-set is produced by
// Crash, an in-flight attempt by a vendor fake that has not answered), so every state a test
// exercises is reachable; the stream is the assertion surface, with the alarm cell and the
// keepalive record (the layer below the reduction) as the only other observables; and a crashed
// incarnation is fenced: nothing its goroutines still do lands, and no timer it armed fires.
//
// A delivery attempt that fails is recorded (Harness.DeliveryErrors, Harness.TakeDeliveryErrors)
// for a scenario that wants to assert on it. The stream is the assertion surface, so by default
// a failure the test never examined is only logged when it ends: a poison scenario that asserts
// on the revivals and the crash-loop evidence, or an at-least-once scenario whose blocker fails
// once, passes on what the stream shows. Config.StrictDeliveryErrors makes an unexamined failure
// fail the test instead, for a suite that wants no frame to fail unnoticed. A failed frame is
// delivered again at the harness's next settle (every step, and every stop AdvanceTime makes at a
// timer, a scheduled append or the alarm), not along itxd's retry ladder, so a vendor fake
// counting calls through failing frames sees more attempts than itxd would make: assert on what
// the stream shows, or on at least one attempt. A RunInBackground
// attempt is droppable by design, so one that fails is only recorded
// (Harness.TakeBackgroundErrors).
//
// Scenarios run inside a testing/synctest bubble (Run does this): settling waits until every
// goroutine is finished or durably blocked, a condition, never a sleep. AdvanceTime moves the
// bubble's clock with the virtual one, so processor timers on the time package (time.After,
// time.Sleep, time.AfterFunc) follow it too. A goroutine blocked on a channel, mutex or
// WaitGroup made outside the bubble (a vendor fake built before Run) is never durably blocked,
// so no step could settle: Run's real-time watchdog (Config.Watchdog, DefaultWatchdog) ends the
// test binary then, saying so, instead of leaving it to the go test timeout. Vendor fakes that hang
// must block on a channel or on their context, so that a crash or the end of the test releases
// them.
package proctest

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/processors"
)

// Config describes a harness.
type Config[S any] struct {
	// New builds the processor for one incarnation: in-memory runtime state (live-sets, vendor
	// clients) belongs in its closures and dies with the incarnation.
	New func(env Env) processors.Contract[S]
	// Path is the stream's path; default "/harness/processor".
	Path string
	// Version is the host version; default "test-harness".
	Version string
	// Start is the virtual clock's start; default 2026-01-01T00:00:00Z.
	Start time.Time
	// PageSize is the runner's read page; default 5, so paging is exercised.
	PageSize int
	// PartitionSeed, when not 0, makes each read the runner makes take a random number of
	// events, 1 to PageSize, from a generator seeded with it: a random partition of the stream
	// into frames. Seed 002 requires a processor's outcome to be the same under one batch
	// (a PageSize past the stream's length), singletons (PageSize 1) and random partitions;
	// run a scenario under each and compare (see the package's partition invariance example).
	PartitionSeed uint64
	// StrictDeliveryErrors makes a failed delivery attempt the test never examined
	// (Harness.DeliveryErrors, Harness.TakeDeliveryErrors) fail it when it ends, so a processor
	// whose frames keep failing cannot pass because the stream happened to look right. Off by
	// default: the stream is the assertion surface, and an unexamined failure is only logged.
	StrictDeliveryErrors bool
	// Watchdog bounds, in real time, how long Run lets one step (Append, AdvanceTime, Settle...)
	// wait for the scenario's goroutines to settle before it ends the test binary with an
	// explanation: a goroutine blocked on a channel or mutex made outside the synctest bubble
	// (a hanging vendor fake built before Run) never settles. 0 is DefaultWatchdog; negative
	// turns it off. A harness built with New, inside a bubble the test made, has none.
	Watchdog time.Duration
	// Substrate, if set, runs this harness over another harness's stream and clock with a fresh
	// progress store, KV and alarm: a full replay from offset 1 (Harness.Substrate).
	Substrate *Substrate
}

// Substrate is the part of a harness another one can share.
type Substrate struct {
	Stream *MemoryStream
	Clock  *Clock
}

// Env is what a processor incarnation gets from the harness.
type Env struct {
	// Clock is the virtual clock as the incarnation sees it: the timers it arms die with the
	// incarnation (Crash), as a dead isolate runs nothing.
	Clock       itx.Clock
	Incarnation int    // 1 for the first, +1 per Crash or Deploy
	Version     string // the host version the incarnation runs (Config.Version, then Deploy's)
}

// Now reads the virtual clock.
func (e Env) Now() time.Time { return e.Clock.Now() }

// Harness drives one processor through scenarios. Its methods are called from the test's
// goroutine only.
type Harness[S any] struct {
	t   testing.TB
	cfg Config[S]

	// Stream is the in-memory stream; Stream.Append commits without delivering.
	Stream *MemoryStream
	// Clock is the virtual clock (AdvanceTime moves it).
	Clock    *Clock
	Progress *MemoryProgressStore
	KV       *MemoryKV
	Alarm    *MemoryAlarm

	name       string // the contract's name
	n          int    // the current incarnation
	fence      *fence // the current incarnation's right to write
	clock      *incarnationClock
	ctx        context.Context
	cancel     context.CancelFunc // ends the incarnation's delivery attempts
	registry   *processors.Registry
	runner     *processors.Runner[S]
	deliver    bool       // delivery is attached (false after Crash until a wake)
	delivering chan error // the delivery attempt in flight, nil when none
	errs       []error    // failed delivery attempts the test has not taken
	examined   int        // errs[:examined] the test has seen (DeliveryErrors)
	fires      []processors.AlarmOutcome

	watchdog *watchdog // Run's, nil under New

	pages *partition // Config.PartitionSeed's generator, shared by the incarnations; nil: off

	streamsMu sync.Mutex               // guards streams: AppendTo runs on the processor's goroutines
	streams   map[string]*MemoryStream // the other streams AppendTo reached, by path (StreamAt)

	mu     sync.Mutex // guards bgErrs: background attempts fail on their own goroutines
	bgErrs []error    // failed background attempts the test has not taken
}

// maxSettleRounds bounds one Settle: a processor that appends forever is a bug the harness reports.
const maxSettleRounds = 1000

// Run runs body against a fresh harness inside a synctest bubble, under a real-time watchdog
// (Config.Watchdog) that ends the test binary with an explanation if a step, or the bubble's
// end, never settles.
func Run[S any](t *testing.T, cfg Config[S], body func(t *testing.T, h *Harness[S])) {
	t.Helper()
	wd := startWatchdog(cfg.Watchdog) // outside the bubble: it keeps real time
	defer wd.close()
	synctest.Test(t, func(t *testing.T) {
		h := New(t, cfg)
		h.watchdog = wd
		defer wd.enter("the end of the scenario (synctest.Test waits for its goroutines)")
		defer h.close()
		body(t, h)
	})
	wd.exit()
}

// New builds a harness; it must be called inside a synctest bubble (Run does both). Several
// harnesses may share one bubble (a replay over another's Substrate).
func New[S any](t testing.TB, cfg Config[S]) *Harness[S] {
	if cfg.New == nil {
		t.Fatal("harness: Config.New is required")
	}
	if cfg.Path == "" {
		cfg.Path = "/harness/processor"
	}
	if cfg.Version == "" {
		cfg.Version = "test-harness"
	}
	if cfg.Start.IsZero() {
		cfg.Start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	if cfg.PageSize == 0 {
		cfg.PageSize = 5
	}
	clock := clocktest.New(cfg.Start)
	stream := NewMemoryStream(cfg.Path, clock)
	if cfg.Substrate != nil {
		clock, stream = cfg.Substrate.Clock, cfg.Substrate.Stream
		cfg.Path = stream.Path()
	}
	h := &Harness[S]{
		t: t, cfg: cfg, Clock: clock,
		Stream:   stream,
		Progress: NewMemoryProgressStore(),
		KV:       NewMemoryKV(),
		Alarm:    &MemoryAlarm{},
		deliver:  true,
	}
	if cfg.PartitionSeed != 0 {
		h.pages = &partition{rng: rand.New(rand.NewPCG(cfg.PartitionSeed, 0))}
	}
	h.incarnate()
	t.Cleanup(h.close)
	return h
}

// StreamAt is the in-memory stream at path: the home stream (Stream), or another one, made
// empty on first use, that the processor forwards to with Args.AppendTo. Safe from any goroutine.
func (h *Harness[S]) StreamAt(path string) *MemoryStream {
	if path == h.cfg.Path {
		return h.Stream
	}
	h.streamsMu.Lock()
	defer h.streamsMu.Unlock()
	if h.streams == nil {
		h.streams = map[string]*MemoryStream{}
	}
	s := h.streams[path]
	if s == nil {
		s = NewMemoryStream(path, h.Clock)
		h.streams[path] = s
	}
	return s
}

// Substrate is this harness's stream and clock, for a second harness to replay over
// (Config.Substrate): a full replay from offset 1 with a fresh progress store, KV and alarm.
func (h *Harness[S]) Substrate() *Substrate { return &Substrate{Stream: h.Stream, Clock: h.Clock} }

// Wake attaches delivery and settles, without appending: the production wake lane redelivering
// what is committed beyond the processing cursor (after Stream.Append, or after a Crash).
func (h *Harness[S]) Wake() {
	h.t.Helper()
	h.deliver = true
	h.Settle()
}

// incarnate starts the next incarnation: a fresh processor, registry and runner over the durable
// substrate, behind a fresh fence. Opening the runner claims the progress record, which fences
// the previous incarnation's commits too. It does not deliver.
func (h *Harness[S]) incarnate() {
	h.n++
	n := h.n
	f := &fence{}
	clock := &incarnationClock{c: h.Clock, timers: map[*incarnationTimer]struct{}{}}
	reg, err := processors.NewRegistry(processors.RegistryConfig{
		Path: h.cfg.Path, Log: fencedLog{f, h.Stream, h.StreamAt, h.pages}, KV: fencedKV{f, h.KV}, Alarm: fencedAlarm{f, h.Alarm},
		Clock: clock, Version: h.cfg.Version, PageSize: h.cfg.PageSize,
		Logf: func(format string, args ...any) {
			h.t.Logf("[incarnation %d] %s", n, fmt.Sprintf(format, args...))
		},
		BackgroundFailed: func(name string, err error) {
			if f.dead.Load() {
				return // the eviction's doing, not the processor's
			}
			h.mu.Lock()
			h.bgErrs = append(h.bgErrs, fmt.Errorf("processor %q: background work: %w", name, err))
			h.mu.Unlock()
		},
	})
	if err != nil {
		h.t.Fatalf("harness: %v", err)
	}
	c := h.cfg.New(Env{Clock: clock, Incarnation: n, Version: h.cfg.Version})
	r, err := processors.Register(context.Background(), reg, c, fencedProgress{f, h.Progress})
	if err != nil {
		h.t.Fatalf("harness: register %q: %v", c.Name, err)
	}
	h.name, h.fence, h.clock, h.registry, h.runner, h.delivering = c.Name, f, clock, reg, r, nil
	h.ctx, h.cancel = context.WithCancel(context.Background())
}

// close ends the test: the last incarnation is fenced and its goroutines released, and each
// delivery failure the test did not examine is logged, or fails it under StrictDeliveryErrors.
// A delivery or background attempt still in flight dies
// with the incarnation, as in Crash: its outcome is the eviction's, not the processor's.
func (h *Harness[S]) close() {
	if h.fence.dead.Load() {
		return
	}
	h.fence.dead.Store(true)
	h.clock.kill()
	h.cancel()
	h.registry.Close()
	for _, err := range h.errs[h.examined:] {
		if h.cfg.StrictDeliveryErrors {
			h.t.Errorf("harness: a delivery failed and the test never examined it (DeliveryErrors, TakeDeliveryErrors; Config.StrictDeliveryErrors is set): %v", err)
		} else {
			h.t.Logf("harness: a delivery failed and the test did not examine it (not a failure; Config.StrictDeliveryErrors makes it one): %v", err)
		}
	}
}

// Append commits events to the stream and drives delivery to a fixpoint (a wake).
func (h *Harness[S]) Append(events ...itx.EventInput) []itx.Event {
	h.t.Helper()
	out, err := h.Stream.Append(context.Background(), events)
	if err != nil {
		h.t.Fatalf("harness: append: %v", err)
	}
	h.deliver = true
	h.Settle()
	return out
}

// AdvanceTime moves the virtual clock, and the synctest bubble's clock with it (timers of the
// time package fire on the way), by d. Each time a clock timer, the alarm or a scheduled
// append (Args.ScheduleAppend) comes due on the way, the clock stops there: due timers fire and
// the work they release runs (at their time, not at the next stop), due scheduled appends land
// and are delivered, the current incarnation's registry handles the alarm's fire (the real
// HandleAlarm path), and delivery is driven to a fixpoint.
func (h *Harness[S]) AdvanceTime(d time.Duration) {
	h.t.Helper()
	target := h.Clock.Now().Add(d)
	for stuck := 0; ; {
		at := h.Alarm.At()
		if next := h.Stream.Scheduled(); len(next) > 0 {
			if due := time.UnixMilli(next[0].DueAt); at.IsZero() || due.Before(at) {
				at = due
			}
		}
		timer, ok := h.Clock.Next()
		if ok && (at.IsZero() || timer.Before(at)) {
			at = timer
		}
		if at.IsZero() || at.After(target) {
			break
		}
		if now := h.Clock.Now(); at.After(now) {
			stuck = 0
			h.advance(at.Sub(now))
		} else if stuck++; stuck > maxSettleRounds {
			h.t.Fatalf("harness: the alarm keeps firing at %v", at)
		}
		if ok && !timer.After(h.Clock.Now()) {
			// The timers fired: let what they released run now (and be delivered, when
			// delivery is attached), before anything later looks at it.
			h.Settle()
		}
		if h.Stream.Land(h.Clock.Now()) > 0 {
			h.deliver = true
			h.Settle()
		}
		if a := h.Alarm.At(); a.IsZero() || a.After(h.Clock.Now()) {
			continue
		}
		h.Alarm.SetAlarm(context.Background(), time.Time{}) // the fire consumes the cell
		out, err := h.registry.HandleAlarm(context.Background())
		if err != nil {
			// Only the KV or the alarm cell can fail a fire, and the live incarnation's
			// in-memory ones never do: no scenario provokes this, so it is a defect.
			h.t.Errorf("harness: alarm fire at %v: %v", at, err)
		}
		h.fires = append(h.fires, out...)
		h.deliver = true // the revival fact is a wake
		h.Settle()
	}
	if now := h.Clock.Now(); target.After(now) {
		h.advance(target.Sub(now))
	}
	h.Settle()
}

// advance moves the bubble's clock by d, then the virtual clock, so that processor code on the
// time package (time.After, time.Sleep, time.AfterFunc: a debounce) follows AdvanceTime as code
// on Env.Clock does. The sleep is instant in real time: inside the synctest bubble, time jumps
// once every goroutine is blocked. The two clocks agree at every stop; a time-package timer due
// between two stops runs during the sleep, with the virtual clock still at the earlier stop (an
// AdvanceTime to its due time first makes it see that time). Sleeping first keeps what a clock
// timer at the stop releases on the bubble's time at the stop, so a debounce it arms there waits
// its whole delay.
func (h *Harness[S]) advance(d time.Duration) {
	h.watchdog.enter("an AdvanceTime")
	defer h.watchdog.exit()
	time.Sleep(d)
	synctest.Wait() // what the time package's timers released runs before the stop's work
	h.Clock.Advance(d)
}

// Crash evicts the current incarnation: its runtime state and closures die (whatever they still
// try is fenced), the stream, progress, KV, alarm and clock survive, and a successor incarnation
// is built but not delivered to: the next append or a due alarm is its wake. A delivery attempt
// still in flight dies too, unrecorded: its outcome is the eviction's (cancelled, fenced). A
// failure it reached before the crash is recorded only if a step settled after it (Do settles).
func (h *Harness[S]) Crash() {
	h.fence.dead.Store(true)
	h.clock.kill() // its timers die with it: nothing of a dead incarnation runs
	h.cancel()
	h.registry.Close()
	h.deliver = false
	h.incarnate()
}

// Deploy is a deploy of a new host version: the current incarnation is evicted (as in Crash) and
// its successor runs version (Env.Version, for New to build the fixed processor). A keepalive
// armed under the old version is due at once with a fresh crash-loop budget (the antidote
// deploy), so a processor the breaker is backing off, even at the plateau, is revived now: the
// due alarm fires and its revival is delivered before Deploy returns. A successor that owes no
// revival is not delivered to, as after Crash.
func (h *Harness[S]) Deploy(version string) {
	h.t.Helper()
	if version == "" || version == h.cfg.Version {
		h.t.Fatalf("harness: Deploy(%q): want a version other than the running %q", version, h.cfg.Version)
	}
	h.cfg.Version = version
	h.Crash()
	h.AdvanceTime(0) // a deploy boots the stream: an alarm that is due fires
}

// Settle drives delivery to a fixpoint: the runner catches up to the head, background work runs
// until it finishes or blocks, and again while that work appended. It stops at a delivery
// failure (recorded, see DeliveryErrors) or at an attempt that is
// durably blocked (a vendor fake that has not answered), which is a stable scenario boundary.
func (h *Harness[S]) Settle() {
	h.t.Helper()
	h.watchdog.enter("a Settle")
	defer h.watchdog.exit()
	for round := 0; round < maxSettleRounds; round++ {
		synctest.Wait()
		h.watchdog.alive() // a long Settle that keeps settling is no hang
		if h.delivering != nil {
			select {
			case err := <-h.delivering:
				h.delivering = nil
				if err != nil {
					h.errs = append(h.errs, err)
					h.t.Logf("harness: delivery failed: %v", err)
					return
				}
			default:
				return // blocked in processor code: a stable boundary
			}
		}
		if h.Stream.Land(h.Clock.Now()) > 0 { // a scheduled append already due lands at once, as in itxd
			h.deliver = true
		}
		if !h.deliver || h.runner.ProcessedThrough() >= h.Stream.Head() {
			return
		}
		done := make(chan error, 1)
		h.delivering = done
		r, ctx := h.runner, h.ctx
		go func() { done <- r.CatchUp(ctx) }()
	}
	h.t.Fatalf("harness: no fixpoint after %d rounds (head %d)", maxSettleRounds, h.Stream.Head())
}

// Clock is the harness's virtual clock (Harness.Clock, Substrate.Clock): named here so that code
// outside this module can name its type (the package that defines it is internal).
type Clock = clocktest.Clock

// Step is one scenario step for Play.
type Step[S any] func(h *Harness[S])

// Play runs steps in order; each one settles delivery before the next.
func (h *Harness[S]) Play(steps ...Step[S]) {
	h.t.Helper()
	for _, s := range steps {
		s(h)
	}
}

// AppendStep is the step form of Harness.Append.
func AppendStep[S any](events ...itx.EventInput) Step[S] {
	return func(h *Harness[S]) { h.Append(events...) }
}

// AdvanceStep is the step form of Harness.AdvanceTime.
func AdvanceStep[S any](d time.Duration) Step[S] {
	return func(h *Harness[S]) { h.AdvanceTime(d) }
}

// CrashStep is the step form of Harness.Crash.
func CrashStep[S any]() Step[S] { return func(h *Harness[S]) { h.Crash() } }

// DeployStep is the step form of Harness.Deploy.
func DeployStep[S any](version string) Step[S] { return func(h *Harness[S]) { h.Deploy(version) } }

// Do is an arbitrary step (answer a vendor fake, assert mid-scenario); delivery settles after it.
func Do[S any](f func()) Step[S] {
	return func(h *Harness[S]) { f(); h.Settle() }
}

// State is the current incarnation's committed reduced state (a copy).
func (h *Harness[S]) State() S {
	_, st := h.runner.Snapshot()
	return st
}

// Runner is the current incarnation's runner.
func (h *Harness[S]) Runner() *processors.Runner[S] { return h.runner }

// Incarnation is the current incarnation's number (1 for the first).
func (h *Harness[S]) Incarnation() int { return h.n }

// Events returns the committed events, all or of the given types.
func (h *Harness[S]) Events(types ...string) []itx.Event { return h.Stream.Events(types...) }

// AlarmAt is the armed alarm time, zero when disarmed.
func (h *Harness[S]) AlarmAt() time.Time { return h.Alarm.At() }

// Keepalive reads the processor's keepalive record from KV (the layer below the reduction).
func (h *Harness[S]) Keepalive() processors.KeepaliveRecord {
	var rec processors.KeepaliveRecord
	raw, ok, _ := h.KV.Get(context.Background(), processors.KeepaliveKey(h.name))
	if ok {
		if err := json.Unmarshal(raw, &rec); err != nil {
			h.t.Fatalf("harness: keepalive record: %v", err)
		}
	}
	return rec
}

// Fires lists what every alarm fire so far did.
func (h *Harness[S]) Fires() []processors.AlarmOutcome { return h.fires }

// DeliveryErrors lists the delivery attempts that failed so far (since the last take), oldest
// first; itx.FailingEventOf names the event a failure was on (0: the eventless pass). Looking is how a test says it expected them: under Config.StrictDeliveryErrors one it
// has never listed or taken when it ends fails it (otherwise it is logged), so assert on what is
// listed (the error, how many) rather than discarding it.
func (h *Harness[S]) DeliveryErrors() []error {
	h.examined = len(h.errs)
	return slices.Clone(h.errs)
}

// TakeDeliveryErrors is DeliveryErrors, clearing what it returns: a failure after the take is
// then the only one listed, and (under Config.StrictDeliveryErrors) must be examined again.
func (h *Harness[S]) TakeDeliveryErrors() []error {
	errs := h.errs
	h.errs, h.examined = nil, 0
	return errs
}

// TakeBackgroundErrors returns the RunInBackground attempts that failed since the last take,
// oldest first, and clears them. A failed attempt is droppable by design (the keepalive marks
// the window, and a fire or the next at-head pass derives it again), so an untaken one does not
// fail the test; a scenario that provokes one (a refused started-append) takes it to assert on
// it. An attempt a crash ended is not recorded. Call it after a step: a step settles, so every
// attempt not blocked on a vendor fake has ended by then.
func (h *Harness[S]) TakeBackgroundErrors() []error {
	h.mu.Lock()
	defer h.mu.Unlock()
	errs := h.bgErrs
	h.bgErrs = nil
	return errs
}

// incarnationClock is the virtual clock as one incarnation sees it: it arms the timers on the
// harness's clock and kills them with the incarnation, so a timer a dead incarnation armed (its
// runner's, its registry's, or the processor's own through Env.Clock) never fires.
type incarnationClock struct {
	c *clocktest.Clock

	mu     sync.Mutex
	dead   bool
	timers map[*incarnationTimer]struct{} // armed and not yet fired or stopped
}

type incarnationTimer struct {
	ic *incarnationClock
	t  itx.Timer
}

// Now reads the harness's clock.
func (ic *incarnationClock) Now() time.Time { return ic.c.Now() }

// Monotonic reads the harness's monotonic time (see itx.Monotonic).
func (ic *incarnationClock) Monotonic() time.Time { return ic.c.Monotonic() }

// AfterFunc arms f on the harness's clock, for as long as the incarnation lives.
func (ic *incarnationClock) AfterFunc(d time.Duration, f func()) itx.Timer {
	return ic.arm(func(g func()) itx.Timer { return ic.c.AfterFunc(d, g) }, f)
}

// AfterFuncAt is AfterFunc at an instant (see itx.AfterFuncAt).
func (ic *incarnationClock) AfterFuncAt(at time.Time, f func()) itx.Timer {
	return ic.arm(func(g func()) itx.Timer { return ic.c.AfterFuncAt(at, g) }, f)
}

func (ic *incarnationClock) arm(arm func(func()) itx.Timer, f func()) itx.Timer {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	it := &incarnationTimer{ic: ic}
	if ic.dead {
		return it // never armed: Stop reports false
	}
	ic.timers[it] = struct{}{}
	it.t = arm(func() {
		ic.mu.Lock()
		alive := !ic.dead
		delete(ic.timers, it)
		ic.mu.Unlock()
		if alive {
			f()
		}
	})
	return it
}

// kill stops every timer the incarnation armed; later ones are never armed.
func (ic *incarnationClock) kill() {
	ic.mu.Lock()
	ic.dead = true
	timers := ic.timers
	ic.timers = nil
	ic.mu.Unlock()
	for it := range timers {
		it.t.Stop()
	}
}

// Stop cancels the timer if it has not fired (nor died with its incarnation).
func (it *incarnationTimer) Stop() bool {
	it.ic.mu.Lock()
	_, armed := it.ic.timers[it]
	delete(it.ic.timers, it)
	t := it.t
	it.ic.mu.Unlock()
	if !armed {
		return false
	}
	return t.Stop()
}
