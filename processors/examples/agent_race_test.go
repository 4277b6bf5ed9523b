package examples_test

import (
	"context"
	"strings"
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

// A frame planned at the head while an attempt's started append is still in flight would claim
// CaughtUp over a state without started. If it reached ProcessEvent only after that attempt had
// run its course (started landed, the vendor answered, the settlement landed, the live-set
// forgot the request), the request would look requested and undriven: a second start. The
// runner holds such a frame's CaughtUp back now (processors' TestRunner_CaughtUpHeldBack*); the
// agent's own guard for what the runner cannot see (a second start's started append conflicts)
// is exercised by TestAgent_AnOverlappingIncarnationDoesNotDialAgain. Either way the vendor is
// dialed once.
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
	deliver := func() error { return deliverToHead(ctx, r, stream) }
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

// An incarnation that overlaps its predecessor's last attempt (the predecessor's started append
// still in flight when the successor, with an empty live-set, decides at the head) starts the
// request a second time: the runner cannot hold that back, those appends are another runner's.
// The started fact naming its attempt makes the two started appends conflict, so only one of the
// attempts dials the vendor.
func TestAgent_AnOverlappingIncarnationDoesNotDialAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clock := itx.SystemClock{}
	v := &vendorFake{t: t}
	stream := proctest.NewMemoryStream("/agents/overlap", clock)
	store := proctest.NewMemoryProgressStore()

	var mu sync.Mutex
	var holdStarted chan struct{} // while set, the next started append waits for it
	held := make(chan struct{})   // closed once a started append waits
	log := gatedLog{MemoryStream: stream, beforeAppend: func(inputs []itx.EventInput) {
		if inputs[0].Type != string(examples.LLMStarted) {
			return
		}
		mu.Lock()
		hold := holdStarted
		holdStarted = nil
		mu.Unlock()
		if hold != nil {
			close(held)
			<-hold
		}
	}}
	cfg := examples.AgentConfig{HesitationMs: 0, ExpiryMs: 60_000, ReserveMs: 1_000}
	// incarnate opens a fresh incarnation (a fresh agent, live-set included): its Open claims
	// the progress record, fencing the previous one's commits but not its appends in flight.
	incarnate := func() (*processors.Runner[examples.AgentState], *idleTracker) {
		tracker := &idleTracker{done: make(chan struct{})}
		r, err := processors.NewRunner(examples.Agent(clock, v, cfg), processors.RunnerConfig{
			Path: stream.Path(), Log: log, Progress: store, Clock: clock, Tracker: tracker, Logf: t.Logf,
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Open(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		return r, tracker
	}
	deliver := func(r *processors.Runner[examples.AgentState]) {
		if err := deliverToHead(ctx, r, stream); err != nil {
			t.Fatal(err)
		}
	}
	appendNow := func(in itx.EventInput) {
		if _, err := stream.Append(ctx, []itx.EventInput{in}); err != nil {
			t.Fatal(err)
		}
	}

	first, firstIdle := incarnate()
	appendNow(examples.MessageAdded.Input(examples.Message{Text: "hi"}, ""))
	deliver(first) // the message: its request is appended
	release := make(chan struct{})
	mu.Lock()
	holdStarted = release
	mu.Unlock()
	deliver(first) // the request: the first attempt starts, its started append held
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("the first attempt never reached its started append")
	}

	second, secondIdle := incarnate()
	appendNow(examples.MessageRetracted.Input(examples.MessageRef{MessageOffset: 999}, ""))
	deliver(second) // at the head with an empty live-set: the second attempt starts
	secondIdle.waitIdle(t)
	close(release) // the first attempt's started append lands only now
	firstIdle.waitIdle(t)

	if n := len(stream.Events(string(examples.LLMSettled))); n != 1 {
		t.Errorf("%d settlements, want 1", n)
	}
	if calls := v.Calls(); len(calls) != 1 {
		t.Errorf("the vendor was dialed %d times (%v) for one request", len(calls), calls)
	}
}

// A user's retraction can land while the request its message's window led to is being appended:
// the caught-up pass decided on a state holding the message, and the request is recorded after
// the retraction in the log. The retraction is in the log first, so the request is born
// retracted: it settles as a cancellation and the vendor is never dialed. Before, the request's
// reduce found no message left to tie it to and opened it as an ordinary obligation, so the
// vendor answered a message the user had withdrawn (seen in bench/soak: 20 of 1,246 retracted
// prompts sent to the vendor, 19 answered).
func TestAgent_ARequestRecordedAfterItsRetractionIsCancelled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clock := itx.SystemClock{}
	v := &vendorFake{t: t}
	v.loud()
	stream := proctest.NewMemoryStream("/agents/retracted", clock)
	var once sync.Once
	log := gatedLog{MemoryStream: stream, beforeAppend: func(inputs []itx.EventInput) {
		if inputs[0].Type != string(examples.LLMRequested) {
			return
		}
		once.Do(func() { // the user's retraction commits first
			if _, err := stream.Append(ctx, []itx.EventInput{examples.MessageRetracted.Input(examples.MessageRef{MessageOffset: 1}, "")}); err != nil {
				t.Error(err)
			}
		})
	}}
	tracker := &idleTracker{done: make(chan struct{})}
	cfg := examples.AgentConfig{HesitationMs: 0, ExpiryMs: 60_000, ReserveMs: 1_000}
	r, err := processors.NewRunner(examples.Agent(clock, v, cfg), processors.RunnerConfig{
		Path: stream.Path(), Log: log, Progress: proctest.NewMemoryProgressStore(), Clock: clock, Tracker: tracker, Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	deliver := func() {
		if err := deliverToHead(ctx, r, stream); err != nil {
			t.Fatal(err)
		}
		tracker.waitIdle(t)
	}
	if _, err := stream.Append(ctx, []itx.EventInput{examples.MessageAdded.Input(examples.Message{Text: "never mind"}, "")}); err != nil {
		t.Fatal(err)
	}
	deliver() // the message: its request is appended, behind the retraction
	var types []string
	for _, e := range stream.Events() {
		types = append(types, e.Type)
	}
	if got, want := strings.Join(types, " "), "agent/message-added agent/message-retracted agent/llm-request-requested"; got != want {
		t.Fatalf("log %q, want %q", got, want)
	}
	deliver() // the retraction and the request
	deliver() // whatever the last pass appended
	if got, want := settlementsOf(t, stream), "msg-1 cancellation "+examples.ReasonRetracted; got != want {
		t.Errorf("settlements %q, want %q", got, want)
	}
	if n := len(stream.Events(string(examples.LLMStarted))); n != 0 {
		t.Errorf("%d started facts for a request recorded after its message's retraction", n)
	}
	if calls := v.Calls(); len(calls) != 0 {
		t.Errorf("the vendor was dialed for %v", calls)
	}
}

// deliverToHead hands the runner one frame from its cursor to the stream's head as read now.
func deliverToHead(ctx context.Context, r *processors.Runner[examples.AgentState], stream *proctest.MemoryStream) error {
	after := r.ProcessedThrough()
	page, err := stream.Read(ctx, after, 0)
	if err != nil {
		return err
	}
	return r.Deliver(ctx, processors.Frame{Events: page.Events, ScannedAfter: after, ScannedThrough: page.ScannedThrough, Head: page.Head})
}
