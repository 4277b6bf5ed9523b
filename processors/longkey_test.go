package processors_test

import (
	"context"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
	proctest "github.com/itx-dev/itx/processors/testing"
)

// The longest names the server takes: a processor instance is named by its subscription (1-500
// characters) and a stream path may have 1,024 bytes.
var (
	longName = strings.Repeat("n", 500)
	longPath = "/" + strings.Repeat("p", itx.MaxPathLength-1)
)

// Keys the SDK builds fit the server's bound on an idempotency key whatever the processor's name
// and path: one that did not was refused (invalidArgument) at every redelivery, so a processor
// following the README to the letter, on a legal name and path, stalled on its first effect
// until the ladder halted it, and its revivals and diagnostics never landed.
func TestIdempotencyKey_FitsTheServersBound(t *testing.T) {
	e := &itx.Event{Offset: 1 << 40}
	short := processors.IdempotencyKey("hello", "answer", "/a", e)
	if short != "hello/answer@/a:1099511627776" {
		t.Errorf("a short key changed: %q", short)
	}
	long := processors.IdempotencyKey(longName, "answer", longPath, e)
	if len(long) > itx.MaxIdempotencyKeyLength {
		t.Fatalf("key of %d bytes, the bound is %d", len(long), itx.MaxIdempotencyKeyLength)
	}
	if again := processors.IdempotencyKey(longName, "answer", longPath, e); again != long {
		t.Errorf("the key is not stable: %q then %q", long, again)
	}
	other := processors.IdempotencyKey(longName, "answer", longPath, &itx.Event{Offset: 1<<40 + 1})
	if other == long {
		t.Errorf("two events share the key %q", long)
	}
	multi := strings.Repeat("é", 400) // a cut inside a rune would not be valid UTF-8
	in := itx.EventInput{Type: "x", IdempotencyKey: processors.IdempotencyKey(multi, "k", longPath, e)}
	if err := in.Normalize(); err != nil {
		t.Errorf("the server refuses the key: %v", err)
	}
}

// A processor with the longest name on the longest path answers, is diagnosed and revived.
func TestHarness_LongNameAndPath(t *testing.T) {
	var held bool
	cfg := proctest.Config[int]{Path: longPath, New: func(proctest.Env) processors.Contract[int] {
		c := Hello()
		c.Name = longName
		inner := c.ProcessEvent
		c.ProcessEvent = func(ctx context.Context, a *processors.Args[int]) error {
			if a.Event != nil && !held {
				held = true
				a.RunInBackground(func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
			}
			return inner(ctx, a)
		}
		return c
	}}
	proctest.Run(t, cfg, func(t *testing.T, h *proctest.Harness[int]) {
		h.Append(Greeted.Input(Greeting{Name: "ada"}, ""))
		h.Append(itx.EventInput{Type: string(Greeted), Payload: []byte(`{"name": 7}`)})
		if errs := h.TakeDeliveryErrors(); len(errs) != 0 {
			t.Fatalf("delivery failed: %v", errs)
		}
		if got := len(h.Events(string(Answered))); got != 1 {
			t.Errorf("%d answers, want 1", got)
		}
		if got := len(h.Events(itx.TypeErrorOccurred)); got != 1 {
			t.Errorf("%d diagnostics of the malformed greeting, want 1", got)
		}
		h.Crash() // the background attempt dies owing work
		h.AdvanceTime(2 * processors.KeepaliveLead)
		if got := len(h.Events(itx.TypeProcessorRevived)); got != 1 {
			t.Errorf("%d revivals, want 1 (fires: %v)", got, h.Fires())
		}
	})
}
