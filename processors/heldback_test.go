package processors_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
	proctest "github.com/itx-dev/itx/processors/testing"
)

// holdLog runs before ahead of every append; an error from it refuses the append.
type holdLog struct {
	*proctest.MemoryStream
	before func(inputs []itx.EventInput) error
}

// Schedule runs before too.
func (l holdLog) Schedule(ctx context.Context, event itx.EventInput, at time.Time) error {
	if err := l.before([]itx.EventInput{event}); err != nil {
		return err
	}
	return l.MemoryStream.Schedule(ctx, event, at)
}

func (l holdLog) Append(ctx context.Context, inputs []itx.EventInput) ([]itx.Event, error) {
	if err := l.before(inputs); err != nil {
		return nil, err
	}
	return l.MemoryStream.Append(ctx, inputs)
}

// checkHook runs onCheck (once, then clears it) ahead of a fence check: the frame has been
// planned by then, and its processor code has not run yet.
type checkHook struct {
	*proctest.MemoryProgressStore
	mu      sync.Mutex
	onCheck func()
}

func (p *checkHook) Check(ctx context.Context, name string, generation int64) error {
	p.mu.Lock()
	f := p.onCheck
	p.onCheck = nil
	p.mu.Unlock()
	if f != nil {
		f()
	}
	return p.MemoryProgressStore.Check(ctx, name, generation)
}

// echoState is what the starter has reduced: the added events and the echo of the first.
type echoState struct {
	Added  int `json:"added"`
	Echoed int `json:"echoed"`
}

// passLog records ProcessEvent's calls as "offset:caughtUp" (offset 0 is the eventless pass),
// with the state each CaughtUp call decided on.
type passLog struct {
	mu    sync.Mutex
	calls []string
	bad   []string // CaughtUp calls over a state that lacks an echo in flight or landed
	// refused is set by the log as it refuses the echo's append, before the runner can learn of
	// it: the attempt's own mark comes only after Args.Append returns, and the runner's
	// eventless pass may run in between (seen once under -race).
	refused bool
}

// refuse marks the echo's append refused when err is not nil, and returns err for a log hook to
// return.
func (l *passLog) refuse(err error) error {
	if err != nil {
		l.mu.Lock()
		l.refused = true
		l.mu.Unlock()
	}
	return err
}

func (l *passLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.calls, " ")
}

// starter is a processor whose CaughtUp pass at event 1 starts a background attempt that appends
// the echo (a state-derived obligation's started fact, in miniature); start gates the attempt
// before its append. Every CaughtUp call after the attempt began must see the echo.
func starter(rec *passLog, start <-chan struct{}) processors.Contract[echoState] {
	return starterWith(rec, start, func(ctx context.Context, a *processors.Args[echoState]) error {
		_, err := a.Append(ctx, echoed.Input(counted{N: 1}, a.IdempotencyKey("echo", nil)))
		return err
	})
}

// starterWith is starter with the attempt's append given (it must land the echo, or fail).
func starterWith(rec *passLog, start <-chan struct{}, echo func(ctx context.Context, a *processors.Args[echoState]) error) processors.Contract[echoState] {
	var mu sync.Mutex
	began := false  // the attempt has begun (it may not have reached its append yet)
	ended := false  // its append returned
	landed := false // and landed the echo
	return processors.Contract[echoState]{
		Name:           "starter",
		ConsumedTypes:  []string{string(added), string(echoed)},
		ReducerVersion: "v1",
		InitialState:   func() echoState { return echoState{} },
		Reduce: func(s echoState, e itx.Event) echoState {
			if e.Type == string(echoed) {
				s.Echoed++
			} else {
				s.Added++
			}
			return s
		},
		ProcessEvent: func(ctx context.Context, a *processors.Args[echoState]) error {
			off := int64(0)
			if a.Event != nil {
				off = a.Event.Offset
			}
			mu.Lock()
			owed := began && (!ended || landed) // the echo is in flight, or in the stream
			mu.Unlock()
			rec.mu.Lock()
			rec.calls = append(rec.calls, fmt.Sprintf("%d:%v", off, a.Delivery.CaughtUp))
			if a.Delivery.CaughtUp && owed && !rec.refused && a.State.Echoed == 0 {
				rec.bad = append(rec.bad, fmt.Sprintf("%d:%+v", off, a.State))
			}
			rec.mu.Unlock()
			if off != 1 || !a.Delivery.CaughtUp {
				return nil
			}
			mu.Lock()
			began = true
			mu.Unlock()
			// Droppable: these tests do not evict.
			a.RunInBackground(func(ctx context.Context) error {
				if start != nil {
					select {
					case <-start:
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				err := echo(ctx, a)
				mu.Lock()
				ended, landed = true, err == nil
				mu.Unlock()
				return err
			})
			return nil
		},
	}
}

func heldBackRunner(t *testing.T, f *fixture, log processors.StreamLog, progress processors.ProgressStore, rec *passLog, start <-chan struct{}) *processors.Runner[echoState] {
	t.Helper()
	return runStarter(t, f, log, progress, starter(rec, start))
}

func runStarter(t *testing.T, f *fixture, log processors.StreamLog, progress processors.ProgressStore, c processors.Contract[echoState]) *processors.Runner[echoState] {
	t.Helper()
	r, err := processors.NewRunner(c, processors.RunnerConfig{
		Path: "/test", Log: log, Progress: progress, Clock: f.clock, PageSize: 3, Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

func catchUp[S any](t *testing.T, r *processors.Runner[S]) {
	t.Helper()
	if err := r.CatchUp(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func (l *passLog) check(t *testing.T, want string) {
	t.Helper()
	if got := l.String(); got != want {
		t.Errorf("ProcessEvent calls %q, want %q", got, want)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range l.bad {
		t.Errorf("a pass claimed CaughtUp over a state without the echo its attempt was appending or had landed: %s", b)
	}
}

// Args.Append's promise, for an append that does not belong to the frame (a background attempt's):
// a frame planned while it is in flight, or before it began but deciding after, holds its
// CaughtUp back; the event lands in a later frame, which claims it; and when no event lands
// (the append failed, or deduped onto an offset already processed), the eventless pass still runs
// once nothing is in flight.
func TestRunner_CaughtUpHeldBackByAnAppendInFlight(t *testing.T) {
	t.Run("a frame planned while the append is in flight", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture()
			release := make(chan error)
			log := holdLog{f.stream, func(in []itx.EventInput) error {
				if in[0].Type == string(echoed) {
					return <-release
				}
				return nil
			}}
			var rec passLog
			r := heldBackRunner(t, f, log, f.store, &rec, nil)
			f.append(t, added.Input(counted{N: 1}, ""))
			catchUp(t, r)
			synctest.Wait() // the attempt's echo append is in flight, held
			f.append(t, added.Input(counted{N: 1}, ""))
			catchUp(t, r) // event 2's frame is planned at the head, the echo still in flight
			release <- nil
			synctest.Wait()
			catchUp(t, r) // the echo, at 3
			synctest.Wait()
			rec.check(t, "1:true 2:false 3:true")
		})
	})
	t.Run("a frame planned before the append began, deciding after it landed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture()
			start := make(chan struct{})
			progress := &checkHook{MemoryProgressStore: f.store}
			var rec passLog
			r := heldBackRunner(t, f, f.stream, progress, &rec, start)
			f.append(t, added.Input(counted{N: 1}, ""))
			catchUp(t, r)
			synctest.Wait() // the attempt waits to append
			f.append(t, added.Input(counted{N: 1}, ""))
			progress.mu.Lock()
			progress.onCheck = func() { // event 2's frame is planned: now the echo lands
				close(start)
				synctest.Wait()
			}
			progress.mu.Unlock()
			catchUp(t, r)
			if got := len(f.stream.Events(string(echoed))); got != 1 {
				t.Fatalf("%d echoes, want 1", got)
			}
			catchUp(t, r)
			synctest.Wait()
			rec.check(t, "1:true 2:false 3:true")
		})
	})
	t.Run("a failed append owes the eventless pass", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture()
			release := make(chan error)
			var rec passLog
			log := holdLog{f.stream, func(in []itx.EventInput) error {
				if in[0].Type == string(echoed) {
					return rec.refuse(<-release)
				}
				return nil
			}}
			r := heldBackRunner(t, f, log, f.store, &rec, nil)
			f.append(t, added.Input(counted{N: 1}, ""))
			catchUp(t, r)
			synctest.Wait()
			f.append(t, added.Input(counted{N: 1}, ""))
			catchUp(t, r)
			release <- errors.New("refused")
			synctest.Wait() // nothing lands: the runner's repass runs the pass at the head
			rec.check(t, "1:true 2:false 0:true")
			if got := r.ProcessedThrough(); got != 2 {
				t.Errorf("cursor %d, want 2", got)
			}
		})
	})
	t.Run("a schedule in flight holds back too, and owes the eventless pass when nothing lands", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture()
			release := make(chan error)
			log := holdLog{f.stream, func(in []itx.EventInput) error {
				if in[0].Type == string(echoed) {
					return <-release
				}
				return nil
			}}
			var rec passLog
			// The attempt schedules the echo an hour out: nothing lands now.
			r := runStarter(t, f, log, f.store, starterWith(&rec, nil, func(ctx context.Context, a *processors.Args[echoState]) error {
				return a.ScheduleAppend(ctx, a.Now().Add(time.Hour), echoed.Input(counted{N: 1}, a.IdempotencyKey("echo", nil)))
			}))
			f.append(t, added.Input(counted{N: 1}, ""))
			catchUp(t, r)
			synctest.Wait()
			f.append(t, added.Input(counted{N: 1}, ""))
			catchUp(t, r)
			release <- nil
			synctest.Wait()
			if got := len(f.stream.Scheduled()); got != 1 {
				t.Errorf("%d scheduled, want 1", got)
			}
			// Only the claim matters here: the scheduled echo is not in the state, and rightly so.
			if got, want := rec.String(), "1:true 2:false 0:true"; got != want {
				t.Errorf("ProcessEvent calls %q, want %q", got, want)
			}
		})
	})
	t.Run("an ephemeral append in flight holds back too, and its range owes the eventless pass", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture()
			release := make(chan error)
			const chunk = "chunk/streamed"
			log := holdLog{f.stream, func(in []itx.EventInput) error {
				if in[0].Type == chunk {
					return <-release
				}
				return nil
			}}
			var rec passLog
			// The attempt streams one ephemeral chunk: no frame will ever deliver it, and the
			// range it lands in holds no durable event, yet the claim held back is owed there.
			r := runStarter(t, f, log, f.store, starterWith(&rec, nil, func(ctx context.Context, a *processors.Args[echoState]) error {
				_, err := a.Append(ctx, itx.EventInput{Type: chunk, Payload: []byte(`{}`), Ephemeral: true})
				return err
			}))
			f.append(t, added.Input(counted{N: 1}, ""))
			catchUp(t, r)
			synctest.Wait()
			f.append(t, added.Input(counted{N: 1}, ""))
			catchUp(t, r)
			release <- nil
			synctest.Wait()
			catchUp(t, r) // the chunk's range: ephemeral only
			synctest.Wait()
			if got, want := rec.String(), "1:true 2:false 0:true"; got != want {
				t.Errorf("ProcessEvent calls %q, want %q", got, want)
			}
			if got, want := r.ProcessedThrough(), f.stream.Head(); got != want {
				t.Errorf("cursor %d, want the head %d", got, want)
			}
		})
	})
	t.Run("an append deduped onto a processed offset owes the eventless pass", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture()
			release := make(chan error)
			log := holdLog{f.stream, func(in []itx.EventInput) error {
				if in[0].Type == string(echoed) {
					return <-release
				}
				return nil
			}}
			var rec passLog
			r := heldBackRunner(t, f, log, f.store, &rec, nil)
			f.append(t, added.Input(counted{N: 1}, ""))
			catchUp(t, r)
			synctest.Wait()
			// An earlier incarnation's attempt landed the echo already (at 2).
			f.append(t, echoed.Input(counted{N: 1}, processors.IdempotencyKey("starter", "echo", "/test", nil)))
			catchUp(t, r)
			release <- nil
			synctest.Wait()
			rec.check(t, "1:true 2:false 0:true")
			if got := len(f.stream.Events(string(echoed))); got != 1 {
				t.Errorf("%d echoes, want 1 (the attempt's append deduped)", got)
			}
		})
	})
}

// The frame's own appends (its earlier events' blockers, under the context ProcessEvent got) do
// not hold its last event back: the head it reaches is the one it was planned at, as before.
func TestRunner_CaughtUpNotHeldBackByTheFramesOwnAppends(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture()
		f.append(t, added.Input(counted{N: 1}, ""), added.Input(counted{N: 2}, ""))
		var rec calls
		r := f.runner(t, counter(t, "v1", &rec))
		catchUp(t, r) // event 1's echo lands at 3 before event 2 is dispatched
		synctest.Wait()
		if got, want := fmt.Sprint(rec.events, rec.caughtUp), "[1 2] [2]"; got != want {
			t.Errorf("calls %s, want %s", got, want)
		}
		if got := len(f.stream.Events(string(echoed))); got != 2 {
			t.Errorf("%d echoes, want 2", got)
		}
	})
}
