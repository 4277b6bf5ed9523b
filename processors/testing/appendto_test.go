package proctest_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
	proctest "github.com/itx-dev/itx/processors/testing"
)

// routerContract forwards each "msg" {thread} to /threads/<thread> with AppendTo, keyed per source
// event; a "bad" event tries to forward a control event, and a "home" one forwards to its own
// stream, which is an Append.

func routerContract(proctest.Env) processors.Contract[tally] {
	return processors.Contract[tally]{
		Name: "router", ConsumedTypes: []string{"msg", "bad", "home"}, ReducerVersion: "1",
		InitialState: func() tally { return tally{} },
		Reduce:       func(s tally, e itx.Event) tally { return tally{N: s.N + 1} },
		ProcessEvent: func(ctx context.Context, a *processors.Args[tally]) error {
			if a.Event == nil {
				return nil
			}
			switch a.Event.Type {
			case "bad":
				_, err := a.AppendTo(ctx, "/threads/x", itx.EventInput{Type: "stream/subscription-removed", Payload: json.RawMessage(`{"name":"y"}`)})
				if itx.ErrorCode(err) != itx.EInvalid {
					return err // refused is the expected outcome; anything else fails the frame
				}
				_, err = a.AppendTo(ctx, "no-slash", itx.EventInput{Type: "forwarded"})
				if itx.ErrorCode(err) != itx.EInvalid {
					return err
				}
				return nil
			case "home":
				_, err := a.AppendTo(ctx, a.Path, itx.EventInput{Type: "echo", IdempotencyKey: a.IdempotencyKey("echo", a.Event)})
				return err
			}
			var m struct{ Thread string }
			if err := json.Unmarshal(a.Event.Payload, &m); err != nil {
				return err
			}
			_, err := a.AppendTo(ctx, "/threads/"+m.Thread, itx.EventInput{Type: "forwarded", Payload: a.Event.Payload,
				IdempotencyKey: a.IdempotencyKey("forward", a.Event)})
			return err
		},
	}
}

// AppendTo forwards to other streams, once per source event even when a forward's answer is
// lost and the event redelivered (its key), refuses control events and bad paths, and to the
// home path is an Append.
func TestHarness_AppendToForwardsOncePerEvent(t *testing.T) {
	proctest.Run(t, proctest.Config[tally]{Path: "/inbox", New: routerContract}, func(t *testing.T, h *proctest.Harness[tally]) {
		// The first forward to /threads/a commits but its answer is lost: the frame fails and
		// the event is delivered again.
		lost := false
		h.StreamAt("/threads/a").LoseAcks(func(itx.EventInput) bool {
			if lost {
				return false
			}
			lost = true
			return true
		})
		h.Append(itx.EventInput{Type: "msg", Payload: json.RawMessage(`{"thread":"a"}`)},
			itx.EventInput{Type: "msg", Payload: json.RawMessage(`{"thread":"b"}`)})
		h.Append(itx.EventInput{Type: "msg", Payload: json.RawMessage(`{"thread":"a"}`)})
		h.AdvanceTime(time.Minute)
		if !lost {
			t.Fatal("the lost answer was never injected")
		}
		a, b := h.StreamAt("/threads/a").Events("forwarded"), h.StreamAt("/threads/b").Events("forwarded")
		if len(a) != 2 || len(b) != 1 {
			t.Fatalf("forwards: /threads/a %d, /threads/b %d; want 2 and 1", len(a), len(b))
		}
		if got, want := a[0].IdempotencyKey, "router/forward@/inbox:1"; got != want {
			t.Errorf("forward key %q, want %q", got, want)
		}
		if got := h.StreamAt("/threads/a").Events("stream/subscription-removed"); len(got) != 0 {
			t.Errorf("a control event was forwarded: %v", got)
		}

		h.Append(itx.EventInput{Type: "bad"}, itx.EventInput{Type: "home"})
		if n := len(h.Stream.Events("echo")); n != 1 {
			t.Errorf("%d echoes on the home stream, want 1", n)
		}
		if n := len(h.StreamAt("/threads/x").Events()); n != 0 {
			t.Errorf("/threads/x holds %d events, want none", n)
		}
	})
}
