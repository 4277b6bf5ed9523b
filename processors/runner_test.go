package processors_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/processors"
	proctest "github.com/itx-dev/itx/processors/testing"
)

// The counting processor of these tests: it sums count/added, echoes every added event with a
// per-event key (a durable forward) and, at the head, records a summary keyed by the total (a
// state-derived effect).
type counted struct {
	N int `json:"n"`
}

type countState struct {
	Total int     `json:"total"`
	Seen  []int64 `json:"seen"`
}

const (
	added   = processors.EventType[counted]("count/added")
	echoed  = processors.EventType[counted]("count/echoed")
	summary = processors.EventType[countState]("count/summary")
)

// calls records what ProcessEvent saw, for tests that assert on dispatch itself.
type calls struct {
	events   []int64 // offsets; 0 is the eventless pass
	caughtUp []int64
}

func counter(t *testing.T, version string, rec *calls) processors.Contract[countState] {
	return processors.Contract[countState]{
		Name:           "counter",
		ConsumedTypes:  []string{string(added)},
		ReducerVersion: version,
		InitialState:   func() countState { return countState{} },
		Validate: func(e itx.Event) error {
			p, err := added.Decode(e)
			if err == nil && p.N <= 0 {
				err = errors.New("n must be positive")
			}
			return err
		},
		Reduce: func(s countState, e itx.Event) countState {
			if e.Ephemeral {
				t.Errorf("Reduce saw ephemeral event %d", e.Offset)
			}
			p, _ := added.Decode(e)
			return countState{Total: s.Total + p.N, Seen: append(slices.Clone(s.Seen), e.Offset)}
		},
		ProcessEvent: func(ctx context.Context, a *processors.Args[countState]) error {
			if rec != nil {
				off := int64(0)
				if a.Event != nil {
					off = a.Event.Offset
				}
				rec.events = append(rec.events, off)
				if a.Delivery.CaughtUp {
					rec.caughtUp = append(rec.caughtUp, off)
				}
			}
			if a.Event != nil {
				if a.Event.Ephemeral {
					t.Errorf("ProcessEvent saw ephemeral event %d", a.Event.Offset)
				}
				p, _ := added.Decode(*a.Event)
				// Blocking: the echo is this event's whole consequence; dropped, it is lost.
				a.BlockProcessorWhile("echo", func(ctx context.Context) error {
					_, err := a.Append(ctx, echoed.Input(p, a.IdempotencyKey("echo", a.Event)))
					return err
				})
			}
			if a.Delivery.CaughtUp {
				st := a.State
				a.BlockProcessorWhile("summary", func(ctx context.Context) error {
					_, err := a.Append(ctx, summary.Input(countState{Total: st.Total}, fmt.Sprintf("summary@%d", st.Total)))
					return err
				})
			}
			return nil
		},
	}
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type fixture struct {
	clock  *clocktest.Clock
	stream *proctest.MemoryStream
	store  *proctest.MemoryProgressStore
}

func newFixture() *fixture {
	clock := clocktest.New(t0)
	return &fixture{clock: clock, stream: proctest.NewMemoryStream("/test", clock), store: proctest.NewMemoryProgressStore()}
}

func (f *fixture) runner(t *testing.T, c processors.Contract[countState]) *processors.Runner[countState] {
	t.Helper()
	r, err := processors.NewRunner(c, processors.RunnerConfig{
		Path: "/test", Log: f.stream, Progress: f.store, Clock: f.clock, PageSize: 3, Logf: t.Logf,
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

// drain delivers until the runner is at the stream's head, its own appends included.
func drain(t *testing.T, f *fixture, r *processors.Runner[countState]) {
	t.Helper()
	for range 100 {
		if err := r.CatchUp(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if r.ProcessedThrough() >= f.stream.Head() {
			return
		}
	}
	t.Fatalf("no fixpoint: cursor %d, head %d", r.ProcessedThrough(), f.stream.Head())
}

func (f *fixture) append(t *testing.T, events ...itx.EventInput) []itx.Event {
	t.Helper()
	out, err := f.stream.Append(context.Background(), events)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// mixedStream appends n events: valid and malformed count/added, unconsumed noise and
// ephemeral count/added, chosen by a seeded generator.
func mixedStream(t *testing.T, f *fixture, seed uint64, n int) []itx.Event {
	rng := rand.New(rand.NewPCG(seed, 0))
	var in []itx.EventInput
	for i := 0; i < n; i++ {
		switch rng.IntN(6) {
		case 0:
			in = append(in, itx.EventInput{Type: "noise/ping", Payload: json.RawMessage(`{}`)})
		case 1:
			in = append(in, itx.EventInput{Type: string(added), Payload: json.RawMessage(`{"n":-1}`)})
		case 2:
			in = append(in, itx.EventInput{Type: string(added), Payload: json.RawMessage(`{"n":100}`), Ephemeral: true})
		default:
			in = append(in, added.Input(counted{N: 1 + rng.IntN(9)}, ""))
		}
	}
	return f.append(t, in...)
}

// outcome renders what a run left: the state and, sorted, every event appended after the input.
func outcome(t *testing.T, f *fixture, r *processors.Runner[countState], after int64) string {
	t.Helper()
	_, st := r.Snapshot()
	raw, _ := json.Marshal(st)
	var lines []string
	for _, e := range f.stream.Events() {
		if e.Offset > after {
			lines = append(lines, fmt.Sprintf("%s %s %s", e.Type, e.IdempotencyKey, e.Payload))
		}
	}
	slices.Sort(lines)
	return "state " + string(raw) + "\n" + strings.Join(lines, "\n")
}

func TestRunner_PartitionInvariance(t *testing.T) {
	const seed, n = 7, 40
	partitions := map[string]func(rng *rand.Rand, events []itx.Event) [][]itx.Event{
		"one batch": func(_ *rand.Rand, events []itx.Event) [][]itx.Event { return [][]itx.Event{events} },
		"singletons": func(_ *rand.Rand, events []itx.Event) [][]itx.Event {
			var out [][]itx.Event
			for i := range events {
				out = append(out, events[i:i+1])
			}
			return out
		},
		"random": func(rng *rand.Rand, events []itx.Event) [][]itx.Event {
			var out [][]itx.Event
			for len(events) > 0 {
				k := 1 + rng.IntN(min(len(events), 7))
				out = append(out, events[:k])
				events = events[k:]
			}
			return out
		},
	}
	results := map[string]string{}
	for _, name := range []string{"one batch", "singletons", "random"} {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture()
			events := mixedStream(t, f, seed, n)
			r := f.runner(t, counter(t, "v1", nil))
			after := int64(0)
			for _, part := range partitions[name](rand.New(rand.NewPCG(seed, 1)), events) {
				last := part[len(part)-1].Offset
				frame := processors.Frame{Events: part, ScannedAfter: after, ScannedThrough: last, Head: int64(n)}
				if err := r.Deliver(context.Background(), frame); err != nil {
					t.Fatalf("%s: deliver (%d, %d]: %v", name, after, last, err)
				}
				after = last
			}
			drain(t, f, r) // diagnostics and trailing catch-ups run in the background
			results[name] = outcome(t, f, r, n)
		})
	}
	want := results["one batch"]
	if !strings.Contains(want, "count/summary") || !strings.Contains(want, "stream/error-occurred") || !strings.Contains(want, "count/echoed") {
		t.Fatalf("the input exercises too little:\n%s", want)
	}
	for name, got := range results {
		if got != want {
			t.Errorf("%s:\n%s\nwant (one batch):\n%s", name, got, want)
		}
	}
}

func TestRunner_CaughtUp(t *testing.T) {
	t.Run("filtered frame reaching the head marks its last consumed event", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture()
			events := f.append(t, added.Input(counted{N: 1}, ""), itx.EventInput{Type: "noise/ping"}, itx.EventInput{Type: "noise/ping"})
			var rec calls
			r := f.runner(t, counter(t, "v1", &rec))
			// A consumes-filtered wake: only event 1, but the scan covers the head.
			err := r.Deliver(context.Background(), processors.Frame{Events: events[:1], ScannedThrough: 3, Head: 3})
			if err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			if got, want := fmt.Sprint(rec.caughtUp), "[1]"; got != want {
				t.Errorf("caught up at %s, want %s", got, want)
			}
		})
	})
	t.Run("a scan to the head without a consumed event gets the eventless pass", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture()
			events := f.append(t, added.Input(counted{N: 2}, ""), itx.EventInput{Type: "noise/ping"})
			var rec calls
			r := f.runner(t, counter(t, "v1", &rec))
			// A filtered frame that stops short of the head: event 1 is not caught up, and the
			// trailing catch-up over the unconsumed tail gives the eventless pass.
			if err := r.Deliver(context.Background(), processors.Frame{Events: events[:1], ScannedThrough: 1, Head: 2}); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			if err := r.CatchUp(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got, want := fmt.Sprint(rec.events, rec.caughtUp), "[1 0 0] [0 0]"; got != want {
				t.Errorf("calls %s, want %s (event 1 behind, then eventless passes)", got, want)
			}
			if got := f.stream.Events(string(summary)); len(got) != 1 || string(got[0].Payload) != `{"total":2,"seen":null}` {
				t.Errorf("summaries %v, want one with total 2", got)
			}
		})
	})
	t.Run("a frame queued before the processor's own append does not claim the head", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture()
			events := f.append(t, added.Input(counted{N: 1}, ""), added.Input(counted{N: 1}, ""))
			var rec calls
			r := f.runner(t, counter(t, "v1", &rec))
			// Frame 1 was produced when the head was 1.
			if err := r.Deliver(context.Background(), processors.Frame{Events: events[:1], ScannedThrough: 1, Head: 1}); err != nil {
				t.Fatal(err)
			}
			// Frame 2 was produced when the head was 2, but event 1's echo now sits at 3.
			if err := r.Deliver(context.Background(), processors.Frame{Events: events[1:], ScannedAfter: 1, ScannedThrough: 2, Head: 2}); err != nil {
				t.Fatal(err)
			}
			if slices.Contains(rec.caughtUp, 2) {
				t.Errorf("event 2 was caught up though the processor's own append at 3 is unreduced")
			}
		})
	})
}

func TestRunner_BlockProcessorWhile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture()
		f.append(t, added.Input(counted{N: 1}, ""))
		var order []string
		c := counter(t, "v1", nil)
		c.ProcessEvent = func(ctx context.Context, a *processors.Args[countState]) error {
			if a.Event == nil {
				return nil
			}
			a.BlockProcessorWhile("first", func(ctx context.Context) error {
				order = append(order, "first")
				_, err := a.Append(ctx, echoed.Input(counted{N: 1}, "first"))
				return err
			})
			a.BlockProcessorWhile("second", func(ctx context.Context) error {
				// FIFO: the first blocker's append is already on the stream.
				order = append(order, fmt.Sprintf("second sees %d echo", len(f.stream.Events(string(echoed)))))
				return nil
			})
			order = append(order, "body returned")
			return nil
		}
		r := f.runner(t, c)
		if err := r.CatchUp(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got, want := strings.Join(order, ", "), "body returned, first, second sees 1 echo"; got != want {
			t.Errorf("order %q, want %q", got, want)
		}
	})
	t.Run("a failed blocker holds the cursor and the frame is redelivered", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture()
			f.append(t, added.Input(counted{N: 5}, ""))
			r := f.runner(t, counter(t, "v1", nil))
			f.stream.FailAppends(func(in itx.EventInput) error {
				if in.Type == string(echoed) {
					return itx.Errorf(itx.EUnavailable, "injected")
				}
				return nil
			})
			if err := r.CatchUp(context.Background()); err == nil {
				t.Fatal("catch-up succeeded with the echo failing")
			}
			if got, st := r.ProcessedThrough(), r.Progress(); got != 0 || string(st.State) != `{"total":0,"seen":null}` {
				t.Fatalf("after a failed frame: cursor %d state %s, want 0 and the initial state", got, st.State)
			}
			f.stream.FailAppends(nil)
			if err := r.CatchUp(context.Background()); err != nil {
				t.Fatal(err)
			}
			if _, st := r.Snapshot(); st.Total != 5 || len(f.stream.Events(string(echoed))) != 1 {
				t.Errorf("after redelivery: total %d, %d echoes; want 5 and 1", st.Total, len(f.stream.Events(string(echoed))))
			}
		})
	})
}

// A blocker registered inside a running blocker is still at-least-once work of the frame: it runs
// after the registrations already queued (FIFO), before the frame commits. One registered once the
// frame moved on could no longer hold its cursor, so it fails loudly instead of vanishing.
func TestRunner_BlockProcessorWhileRegisteredLate(t *testing.T) {
	t.Run("inside a blocker: runs in FIFO order before the commit", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture()
			f.append(t, added.Input(counted{N: 1}, ""))
			var order []string
			c := counter(t, "v1", nil)
			c.ProcessEvent = func(ctx context.Context, a *processors.Args[countState]) error {
				if a.Event == nil {
					return nil
				}
				a.BlockProcessorWhile("outer", func(ctx context.Context) error {
					order = append(order, "outer")
					a.BlockProcessorWhile("inner", func(ctx context.Context) error {
						order = append(order, "inner")
						_, err := a.Append(ctx, echoed.Input(counted{N: 1}, "inner"))
						return err
					})
					return nil
				})
				a.BlockProcessorWhile("second", func(ctx context.Context) error {
					order = append(order, "second")
					return nil
				})
				return nil
			}
			r := f.runner(t, c)
			f.stream.FailAppends(func(in itx.EventInput) error {
				if in.Type == string(echoed) {
					return itx.Errorf(itx.EUnavailable, "injected")
				}
				return nil
			})
			if err := r.CatchUp(context.Background()); err == nil || r.ProcessedThrough() != 0 {
				t.Fatalf("catch-up: %v, cursor %d; want the failing inner blocker to hold the cursor at 0", err, r.ProcessedThrough())
			}
			f.stream.FailAppends(nil)
			order = nil
			if err := r.CatchUp(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got, want := strings.Join(order, ", "), "outer, second, inner"; got != want {
				t.Errorf("order %q, want %q", got, want)
			}
			if got := len(f.stream.Events(string(echoed))); got != 1 {
				t.Errorf("%d echoes from the inner blocker, want 1", got)
			}
		})
	})
	t.Run("after the frame: refused loudly", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture()
			f.append(t, added.Input(counted{N: 1}, ""))
			committed, refused := make(chan struct{}), make(chan any, 1)
			ran := false
			c := counter(t, "v1", nil)
			c.ProcessEvent = func(ctx context.Context, a *processors.Args[countState]) error {
				if a.Event == nil {
					return nil
				}
				// Droppable: this test is about a misuse inside it.
				a.RunInBackground(func(ctx context.Context) error {
					<-committed
					defer func() { refused <- recover() }()
					a.BlockProcessorWhile("too late", func(ctx context.Context) error {
						ran = true
						return nil
					})
					return nil
				})
				return nil
			}
			r := f.runner(t, c)
			if err := r.CatchUp(context.Background()); err != nil {
				t.Fatal(err)
			}
			close(committed)
			synctest.Wait()
			if p := <-refused; p == nil || !strings.Contains(fmt.Sprint(p), "BlockProcessorWhile") {
				t.Errorf("a registration after the frame: recovered %v, want a refusal naming BlockProcessorWhile", p)
			}
			if ran {
				t.Error("the late blocker ran outside any frame")
			}
		})
	})
}

func TestRunner_RunInBackground(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture()
		f.append(t, added.Input(counted{N: 1}, ""))
		release := make(chan struct{})
		c := counter(t, "v1", nil)
		c.ProcessEvent = func(ctx context.Context, a *processors.Args[countState]) error {
			if a.Event != nil {
				// Droppable: nothing recovers it, which is what this test shows.
				a.RunInBackground(func(ctx context.Context) error {
					select {
					case <-release:
					case <-ctx.Done():
						return ctx.Err()
					}
					_, err := a.Append(ctx, echoed.Input(counted{N: 1}, "late"))
					return err
				})
			}
			return nil
		}
		r := f.runner(t, c)
		if err := r.CatchUp(context.Background()); err != nil {
			t.Fatal(err)
		}
		// The cursor advanced without waiting for the attempt (at-most-once).
		if got := r.ProcessedThrough(); got != 1 {
			t.Fatalf("cursor %d while the background attempt is pending, want 1", got)
		}
		r.Close() // eviction: the attempt is lost
		synctest.Wait()
		close(release)
		synctest.Wait()
		if got := f.stream.Events(string(echoed)); len(got) != 0 {
			t.Errorf("an evicted background attempt appended %v", got)
		}
	})
}

func TestRunner_Open(t *testing.T) {
	t.Run("a reducer version change re-reduces with Reduce only", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture()
			f.append(t, added.Input(counted{N: 2}, ""), added.Input(counted{N: 3}, ""))
			r1 := f.runner(t, counter(t, "v1", nil))
			drain(t, f, r1)
			head := f.stream.Head()
			var rec calls
			c := counter(t, "v2", &rec)
			reduced := 0
			reduce := c.Reduce
			c.Reduce = func(s countState, e itx.Event) countState { reduced++; return reduce(s, e) }
			r2 := f.runner(t, c)
			if err := r2.CatchUp(context.Background()); err != nil {
				t.Fatal(err)
			}
			if len(rec.events) != 0 || reduced != 2 || f.stream.Head() != head {
				t.Errorf("v2 open: %d ProcessEvent calls, %d reductions, head %d -> %d; want 0, 2, unchanged",
					len(rec.events), reduced, head, f.stream.Head())
			}
			if p := f.store.Load("counter"); p.ReducerVersion != "v2" || string(p.State) != `{"total":5,"seen":[1,2]}` {
				t.Errorf("stored progress %+v", p)
			}
		})
	})
	t.Run("a stale incarnation's commit loses", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture()
			f.append(t, added.Input(counted{N: 2}, ""))
			stale := f.runner(t, counter(t, "v1", nil))
			fresh := f.runner(t, counter(t, "v1", nil)) // claims the record
			err := stale.CatchUp(context.Background())
			if itx.ErrorCode(err) != itx.EFailedPrecondition {
				t.Fatalf("stale catch-up: %v, want %s", err, itx.EFailedPrecondition)
			}
			if p := f.store.Load("counter"); p != nil {
				t.Errorf("a stale incarnation committed %+v", p)
			}
			if err := fresh.CatchUp(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := stale.CatchUp(context.Background()); itx.ErrorCode(err) != itx.EFailedPrecondition {
				t.Errorf("a fenced runner delivered again: %v", err)
			}
			if stale.RuntimeState().Fenced == "" {
				t.Error("the fenced runner's runtime state does not say so")
			}
		})
	})
	t.Run("a stale incarnation runs no effects", func(t *testing.T) {
		// Fenced since its last frame, it learns so before ProcessEvent, not at its commit:
		// the effects of the frame are its successor's to run, once.
		synctest.Test(t, func(t *testing.T) {
			f := newFixture()
			f.append(t, added.Input(counted{N: 2}, ""))
			var staleCalls calls
			stale := f.runner(t, counter(t, "v1", &staleCalls))
			drain(t, f, stale)
			staleCalls = calls{}
			f.runner(t, counter(t, "v1", nil)) // claims the record
			head := f.stream.Head()
			f.append(t, added.Input(counted{N: 3}, ""))
			err := stale.CatchUp(context.Background())
			if itx.ErrorCode(err) != itx.EFailedPrecondition {
				t.Fatalf("stale catch-up: %v, want %s", err, itx.EFailedPrecondition)
			}
			if len(staleCalls.events) != 0 || f.stream.Head() != head+1 {
				t.Errorf("the fenced runner ran ProcessEvent for %v (head %d, want %d): its successor runs those effects too",
					staleCalls.events, f.stream.Head(), head+1)
			}
		})
	})
}

func TestRunner_ReprocessFrom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture()
		f.append(t, added.Input(counted{N: 1}, ""), added.Input(counted{N: 10}, ""), added.Input(counted{N: 100}, ""))
		var seen []string
		c := counter(t, "v1", nil)
		c.ProcessEvent = func(ctx context.Context, a *processors.Args[countState]) error {
			if a.Event != nil {
				seen = append(seen, fmt.Sprintf("%d:%d", a.Event.Offset, a.State.Total))
			}
			return nil
		}
		r := f.runner(t, c)
		if err := r.CatchUp(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := r.ReprocessFrom(context.Background(), 2); err != nil {
			t.Fatal(err)
		}
		if p := r.Progress(); p.ProcessedThrough != 1 || p.CursorRevision != 1 {
			t.Fatalf("after the rewind: %+v", p)
		}
		if err := r.CatchUp(context.Background()); err != nil {
			t.Fatal(err)
		}
		// Event-time state: at event 2 the state is the reduction through 2, not current truth.
		if got, want := strings.Join(seen, " "), "1:1 2:11 3:111 2:11 3:111"; got != want {
			t.Errorf("ProcessEvent saw %q, want %q", got, want)
		}
	})
}

func TestRunner_Malformed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture()
		f.append(t, itx.EventInput{Type: string(added), Payload: json.RawMessage(`{"n":"x"}`)}, added.Input(counted{N: 4}, ""))
		r := f.runner(t, counter(t, "v1", nil))
		for range 2 {
			if err := r.CatchUp(context.Background()); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
		}
		// A second incarnation replays from scratch: the diagnostic dedupes.
		f2 := &fixture{clock: f.clock, stream: f.stream, store: proctest.NewMemoryProgressStore()}
		r2 := f2.runner(t, counter(t, "v1", nil))
		if err := r2.CatchUp(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		diags := f.stream.Events(itx.TypeErrorOccurred)
		if len(diags) != 1 || diags[0].IdempotencyKey != "event-malformed:counter@/test:1" {
			t.Fatalf("diagnostics %+v, want one keyed to event 1", diags)
		}
		// The shape of the TypeScript schema: a message, and an error object with its own.
		var p struct {
			Message string `json:"message"`
			Error   struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(diags[0].Payload, &p); err != nil || p.Message == "" || p.Error.Message == "" {
			t.Errorf("diagnostic %s (%v): want message and error.message", diags[0].Payload, err)
		}
		if _, st := r2.Snapshot(); st.Total != 4 {
			t.Errorf("total %d, want 4 (the malformed event skipped)", st.Total)
		}
	})
}

func TestRunner_Panics(t *testing.T) {
	for _, where := range []string{"reduce", "process", "blocker"} {
		t.Run(where, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFixture()
				f.append(t, added.Input(counted{N: 1}, ""))
				c := counter(t, "v1", nil)
				reduce := c.Reduce
				c.Reduce = func(s countState, e itx.Event) countState {
					if where == "reduce" {
						panic("poisoned reducer")
					}
					return reduce(s, e)
				}
				c.ProcessEvent = func(ctx context.Context, a *processors.Args[countState]) error {
					if where == "process" {
						panic("poisoned processEvent")
					}
					a.BlockProcessorWhile("poison", func(ctx context.Context) error { panic("poisoned blocker") })
					return nil
				}
				r := f.runner(t, c)
				if err := r.CatchUp(context.Background()); itx.ErrorCode(err) != itx.EInternal {
					t.Fatalf("catch-up: %v, want %s", err, itx.EInternal)
				}
				if got := r.ProcessedThrough(); got != 0 {
					t.Errorf("cursor %d after a panic, want 0", got)
				}
			})
		})
	}
}

func TestRunner_WaitUntilProcessed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture()
		r := f.runner(t, counter(t, "v1", nil))
		done := make(chan error, 1)
		go func() { done <- r.WaitUntilProcessed(context.Background(), 2) }()
		out := f.append(t, added.Input(counted{N: 1}, ""), added.Input(counted{N: 1}, ""))
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("returned before the offset was processed: %v", err)
		default:
		}
		if err := r.CatchUp(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("still waiting with the cursor at %d, past offset %d", r.ProcessedThrough(), out[1].Offset)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := r.WaitUntilProcessed(ctx, 100); err == nil {
			t.Error("a cancelled wait returned nil")
		}
		if rs := r.RuntimeState(); rs.ProcessedThrough < 2 || rs.Generation != 1 || rs.Fenced != "" {
			t.Errorf("runtime state %+v", rs)
		}
	})
}

// A Reduce that panics while the runner re-reduces with Reduce only (Open under a new reducer
// version, an operator's rewind) fails that call with EInternal, as a panic in a frame does: it
// must not take the host process down with it (itxd, or a remote host, on every load).
func TestRunner_PanicsWhileReReducing(t *testing.T) {
	poisoned := func(t *testing.T, version string) processors.Contract[countState] {
		c := counter(t, version, nil)
		c.Reduce = func(countState, itx.Event) countState { panic("poisoned reducer") }
		return c
	}
	t.Run("open under a new reducer version", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture()
			f.append(t, added.Input(counted{N: 1}, ""))
			drain(t, f, f.runner(t, counter(t, "v1", nil)))
			r, err := processors.NewRunner(poisoned(t, "v2"), processors.RunnerConfig{
				Path: "/test", Log: f.stream, Progress: f.store, Clock: f.clock, Logf: t.Logf,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			if err := r.Open(context.Background()); itx.ErrorCode(err) != itx.EInternal {
				t.Fatalf("open: %v, want %s", err, itx.EInternal)
			}
			if p := f.store.Load("counter"); p.ReducerVersion != "v1" {
				t.Errorf("stored progress %+v, want v1's untouched", p)
			}
		})
	})
	t.Run("a Validate that panics rejects the event", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture()
			f.append(t, added.Input(counted{N: 1}, ""))
			c := counter(t, "v1", nil)
			c.Validate = func(itx.Event) error { panic("poisoned validate") }
			r := f.runner(t, c)
			if err := r.CatchUp(context.Background()); err != nil {
				t.Fatalf("catch-up: %v, want the event skipped as malformed", err)
			}
			synctest.Wait()
			if got := len(f.stream.Events(itx.TypeErrorOccurred)); got != 1 {
				t.Errorf("%d diagnostics, want 1", got)
			}
		})
	})
	t.Run("reprocess from", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture()
			f.append(t, added.Input(counted{N: 1}, ""), added.Input(counted{N: 2}, ""))
			r := f.runner(t, poisoned(t, "v1")) // nothing to reduce yet at open
			if err := r.ReprocessFrom(context.Background(), 2); itx.ErrorCode(err) != itx.EInternal {
				t.Fatalf("reprocess: %v, want %s", err, itx.EInternal)
			}
		})
	})
}

// A frame that runs past its budget commits through the event it is at and leaves the rest to the
// next frame, which gets the CaughtUp the cut one could not claim: a page of slow events commits
// as it goes instead of all or nothing.
func TestRunner_FrameBudgetCommitsAPrefix(t *testing.T) {
	f := newFixture()
	var seen, caughtUp []int64
	c := processors.Contract[int]{
		Name: "slow", ConsumedTypes: []string{string(added)}, ReducerVersion: "1",
		InitialState: func() int { return 0 },
		Reduce:       func(n int, _ itx.Event) int { return n + 1 },
		ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
			if a.Event == nil {
				return nil
			}
			seen = append(seen, a.Event.Offset)
			if a.Delivery.CaughtUp {
				caughtUp = append(caughtUp, a.Event.Offset)
			}
			a.BlockProcessorWhile("vendor", func(context.Context) error {
				f.clock.Advance(4 * time.Second) // a slow vendor call
				return nil
			})
			return nil
		},
	}
	r, err := processors.NewRunner(c, processors.RunnerConfig{
		Path: "/test", Log: f.stream, Progress: f.store, Clock: f.clock, FrameBudget: 10 * time.Second, Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Open(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var in []itx.EventInput
	for i := range 6 {
		in = append(in, added.Input(counted{N: i + 1}, ""))
	}
	events := f.append(t, in...)
	frame := processors.Frame{Events: events, ScannedAfter: 0, ScannedThrough: 6, Head: 6, Continued: true}
	if err := r.Deliver(t.Context(), frame); err != nil {
		t.Fatal(err)
	}
	if got := r.ProcessedThrough(); got != 3 {
		t.Fatalf("after a 12 s frame with a 10 s budget the cursor is at %d, want 3", got)
	}
	if _, n := r.Snapshot(); n != 3 {
		t.Fatalf("state %d at the cut, want 3", n)
	}
	frame.Events, frame.ScannedAfter = events[3:], 3
	if err := r.Deliver(t.Context(), frame); err != nil {
		t.Fatal(err)
	}
	if got := r.ProcessedThrough(); got != 6 {
		t.Fatalf("cursor %d after the rest, want 6", got)
	}
	if !slices.Equal(seen, []int64{1, 2, 3, 4, 5, 6}) || !slices.Equal(caughtUp, []int64{6}) {
		t.Fatalf("ProcessEvent saw %v, CaughtUp on %v; want each once and CaughtUp on 6 only", seen, caughtUp)
	}
}
