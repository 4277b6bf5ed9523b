package examples_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/examples"
	proctest "github.com/itx-dev/itx/processors/testing"
)

// gatedLog runs beforeAppend ahead of every append.
type gatedLog struct {
	*proctest.MemoryStream
	beforeAppend func(inputs []itx.EventInput)
}

func (l gatedLog) Append(ctx context.Context, inputs []itx.EventInput) ([]itx.Event, error) {
	l.beforeAppend(inputs)
	return l.MemoryStream.Append(ctx, inputs)
}

// gatedProgress runs beforeCheck ahead of every fence check (a frame has been planned by then).
type gatedProgress struct {
	*proctest.MemoryProgressStore
	beforeCheck func()
}

func (p gatedProgress) Check(ctx context.Context, name string, generation int64) error {
	p.beforeCheck()
	return p.MemoryProgressStore.Check(ctx, name, generation)
}

// idleTracker counts the runner's tracked work in flight.
type idleTracker struct {
	mu     sync.Mutex
	active int
	done   chan struct{} // closed and replaced whenever a unit ends
}

func (tr *idleTracker) Track() func(error) {
	tr.mu.Lock()
	tr.active++
	tr.mu.Unlock()
	return func(error) {
		tr.mu.Lock()
		tr.active--
		close(tr.done)
		tr.done = make(chan struct{})
		tr.mu.Unlock()
	}
}

func (tr *idleTracker) waitIdle(t *testing.T) {
	deadline := time.After(20 * time.Second)
	for {
		tr.mu.Lock()
		active, done := tr.active, tr.done
		tr.mu.Unlock()
		if active == 0 {
			return
		}
		select {
		case <-done:
		case <-deadline:
			t.Errorf("the runner's work did not end")
			return
		}
	}
}

// A frame planned at the head while an attempt's started append is still in flight claims
// CaughtUp over a state without started. If it reaches ProcessEvent only after that attempt has
// run its course (started landed, the vendor answered, the settlement landed, the live-set
// forgot the request), the request looks requested and undriven: a second start. Its started
// append must not pass as the first one's duplicate: the vendor is dialed once.
func TestAgent_AStaleCaughtUpFrameDoesNotDialAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clock := itx.SystemClock{}
	v := &vendorFake{t: t}
	stream := proctest.NewMemoryStream("/agents/race", clock)

	var mu sync.Mutex
	var holdStarted chan struct{} // while set, the next started append waits for it
	var onCheck func()
	log := gatedLog{MemoryStream: stream, beforeAppend: func(inputs []itx.EventInput) {
		if inputs[0].Type != string(examples.LLMStarted) {
			return
		}
		mu.Lock()
		hold := holdStarted
		holdStarted = nil
		mu.Unlock()
		if hold != nil {
			<-hold
		}
	}}
	progress := gatedProgress{MemoryProgressStore: proctest.NewMemoryProgressStore(), beforeCheck: func() {
		mu.Lock()
		f := onCheck
		onCheck = nil
		mu.Unlock()
		if f != nil {
			f()
		}
	}}
	tracker := &idleTracker{done: make(chan struct{})}
	cfg := examples.AgentConfig{HesitationMs: 0, ExpiryMs: 60_000, ReserveMs: 1_000}
	r, err := processors.NewRunner(examples.Agent(clock, v, cfg), processors.RunnerConfig{
		Path: stream.Path(), Log: log, Progress: progress, Clock: clock, Tracker: tracker, Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// deliver hands the runner one frame from its cursor to the head as read now.
	deliver := func() error {
		after := r.ProcessedThrough()
		page, err := stream.Read(ctx, after, 0)
		if err != nil {
			return err
		}
		return r.Deliver(ctx, processors.Frame{Events: page.Events, ScannedAfter: after, ScannedThrough: page.ScannedThrough, Head: page.Head})
	}
	appendNow := func(in itx.EventInput) {
		if _, err := stream.Append(ctx, []itx.EventInput{in}); err != nil {
			t.Fatal(err)
		}
	}

	appendNow(examples.MessageAdded.Input(examples.Message{Text: "hi"}, ""))
	if err := deliver(); err != nil { // the message: its request is appended
		t.Fatal(err)
	}
	if n := len(stream.Events(string(examples.LLMRequested))); n != 1 {
		t.Fatalf("%d requests, want 1", n)
	}
	release := make(chan struct{})
	mu.Lock()
	holdStarted = release
	mu.Unlock()
	if err := deliver(); err != nil { // the request: an attempt starts, its started append held
		t.Fatal(err)
	}
	// Another consumed event lands ahead of started; its frame is planned at the head, then
	// held until the attempt has run its course.
	appendNow(examples.MessageRetracted.Input(examples.MessageRef{MessageOffset: 999}, ""))
	mu.Lock()
	onCheck = func() {
		close(release)
		tracker.waitIdle(t)
	}
	mu.Unlock()
	if err := deliver(); err != nil {
		t.Fatal(err)
	}
	tracker.waitIdle(t)
	if n := len(stream.Events(string(examples.LLMSettled))); n != 1 {
		t.Errorf("%d settlements, want 1", n)
	}
	if calls := v.Calls(); len(calls) != 1 {
		t.Errorf("the vendor was dialed %d times (%v) for one request", len(calls), calls)
	}
}
