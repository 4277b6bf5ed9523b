package processors_test

import (
	"context"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
	proctest "github.com/itx-dev/itx/processors/testing"
)

// The README's smallest complete processor and its harness test, kept compiling and passing here.

type Greeting struct {
	Name string `json:"name"`
}

const (
	Greeted  = processors.EventType[Greeting]("hello/greeted")
	Answered = processors.EventType[Greeting]("hello/answered")
)

func Hello() processors.Contract[int] {
	return processors.Contract[int]{
		Name:           "hello",
		ConsumedTypes:  []string{string(Greeted)},
		ReducerVersion: "1",
		InitialState:   func() int { return 0 },
		// A greeting that does not decode is skipped with one stream/error-occurred: returned
		// from ProcessEvent, its error would fail the frame at every redelivery, then halt it.
		Validate: func(e itx.Event) error { _, err := Greeted.Decode(e); return err },
		Reduce:   func(n int, e itx.Event) int { return n + 1 },
		ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
			if a.Event == nil {
				return nil // the eventless pass at the head: nothing state-derived to do
			}
			g, err := Greeted.Decode(*a.Event) // Validate passed it
			if err != nil {
				return err
			}
			answer := Answered.Input(g, a.IdempotencyKey("answer", a.Event))
			// Blocking: the answer is this event's whole consequence; dropped, it is lost.
			a.BlockProcessorWhile("answer", func(ctx context.Context) error {
				_, err := a.Append(ctx, answer)
				return err
			})
			return nil
		},
	}
}

func TestHello_Crash(t *testing.T) {
	cfg := proctest.Config[int]{New: func(proctest.Env) processors.Contract[int] { return Hello() }}
	proctest.Run(t, cfg, func(t *testing.T, h *proctest.Harness[int]) {
		h.Append(Greeted.Input(Greeting{Name: "ada"}, "")) // commit and deliver
		if _, err := h.Stream.Append(t.Context(), []itx.EventInput{Greeted.Input(Greeting{Name: "bob"}, "")}); err != nil {
			t.Fatal(err) // commit only
		}
		h.Crash() // eviction: the successor is not delivered to
		h.Wake()  // the wake lane redelivers past the cursor
		if got := len(h.Events(string(Answered))); got != 2 {
			t.Errorf("%d answers, want 2", got)
		}
		if got := h.State(); got != 2 {
			t.Errorf("state %d, want 2", got)
		}
	})
}

// The README's example skips a malformed greeting (Validate) rather than failing its frame at
// every redelivery: the greetings after it are answered, and no delivery fails.
func TestHello_MalformedGreetingIsSkipped(t *testing.T) {
	cfg := proctest.Config[int]{New: func(proctest.Env) processors.Contract[int] { return Hello() }, StrictDeliveryErrors: true}
	proctest.Run(t, cfg, func(t *testing.T, h *proctest.Harness[int]) {
		h.Append(itx.EventInput{Type: string(Greeted), Payload: []byte(`{"name": 5}`)})
		h.Append(Greeted.Input(Greeting{Name: "ada"}, ""))
		if got := len(h.Events(string(Answered))); got != 1 {
			t.Errorf("%d answers, want 1 (ada's)", got)
		}
		if got := len(h.Events(itx.TypeErrorOccurred)); got != 1 {
			t.Errorf("%d diagnostics, want 1 (the malformed greeting's)", got)
		}
		if got := h.State(); got != 1 {
			t.Errorf("state %d, want 1", got)
		}
	})
}
