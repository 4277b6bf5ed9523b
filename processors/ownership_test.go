package processors_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/processors"
	proctest "github.com/itx-dev/itx/processors/testing"
)

var errKeysPoisoned = errors.New("poisoned")

// keysPoison fails every frame holding a "keys/poison": a crash loop.
func keysPoison() processors.Contract[int] {
	return processors.Contract[int]{
		Name: "poison", ConsumedTypes: []string{"keys/poison"}, ReducerVersion: "1",
		InitialState: func() int { return 0 },
		Reduce:       func(n int, e itx.Event) int { return n + 1 },
		ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
			if a.Event != nil {
				return errKeysPoisoned
			}
			return nil
		},
	}
}

// A crash loop leaves evidence on the stream: one error-occurred fact keyed
// "processor-host-crash-loop:<version>" (seed 002: one per host version per stream), naming the
// processor in its payload.
func TestKeepalive_CrashLoopEvidenceKey(t *testing.T) {
	cfg := proctest.Config[int]{Version: "v7", New: func(proctest.Env) processors.Contract[int] { return keysPoison() }}
	proctest.Run(t, cfg, func(t *testing.T, h *proctest.Harness[int]) {
		h.Append(itx.EventInput{Type: "keys/poison", Payload: []byte(`{}`)})
		h.AdvanceTime(10 * time.Minute)
		errs := h.Events(itx.TypeErrorOccurred)
		if len(errs) != 1 {
			t.Fatalf("%d error-occurred facts, want 1", len(errs))
		}
		if got, want := errs[0].IdempotencyKey, "processor-host-crash-loop:v7"; got != want {
			t.Errorf("crash-loop evidence key %q, want %q", got, want)
		}
		if !strings.Contains(string(errs[0].Payload), `"processorSlug":"poison"`) {
			t.Errorf("crash-loop evidence %s, want the processor named", errs[0].Payload)
		}
		// The loop is the poison failing its frame, again and again, and nothing else.
		failed := h.TakeDeliveryErrors()
		if len(failed) == 0 {
			t.Error("no delivery failed, want the poison's")
		}
		for _, err := range failed {
			if !errors.Is(err, errKeysPoisoned) {
				t.Errorf("delivery failed with %v, want only %v", err, errKeysPoisoned)
			}
		}
	})
}

// flakyAlarm refuses the first SetAlarm that arms (a transient platform/RPC failure).
type flakyAlarm struct {
	mu     sync.Mutex
	failed bool
	inner  proctest.MemoryAlarm
}

func (a *flakyAlarm) SetAlarm(ctx context.Context, at time.Time) error {
	a.mu.Lock()
	if !at.IsZero() && !a.failed {
		a.failed = true
		a.mu.Unlock()
		return errors.New("injected: setAlarm failed")
	}
	a.mu.Unlock()
	return a.inner.SetAlarm(ctx, at)
}

// While work is in flight the alarm sits ahead of it. One failed alarm write (a transient RPC
// failure for a remote host) does not lose it: the next tracked attempt writes it again, so
// failed background attempts are still revived.
func TestKeepalive_FailedAlarmWriteIsReasserted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		stream := proctest.NewMemoryStream("/keys", clock)
		kv := proctest.NewMemoryKV()
		alarm := &flakyAlarm{}
		reg, err := processors.NewRegistry(processors.RegistryConfig{
			Path: "/keys", Log: stream, KV: kv, Alarm: alarm, Clock: clock, Version: "v1",
			Logf: t.Logf,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer reg.Close()
		c := processors.Contract[int]{
			Name: "bg", ConsumedTypes: []string{"keys/x"}, ReducerVersion: "1",
			InitialState: func() int { return 0 },
			Reduce:       func(n int, e itx.Event) int { return n + 1 },
			ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
				if a.Event != nil {
					// A droppable attempt whose failure must be revived.
					a.RunInBackground(func(ctx context.Context) error { return errors.New("attempt failed") })
				}
				return nil
			},
		}
		r, err := processors.Register(context.Background(), reg, c, proctest.NewMemoryProgressStore())
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if _, err := stream.Append(context.Background(), []itx.EventInput{{Type: "keys/x", Payload: []byte(`{}`)}}); err != nil {
				t.Fatal(err)
			}
			if err := r.CatchUp(context.Background()); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			clock.Advance(time.Duration(i+1) * time.Second)
		}
		rec, _ := reg.Keepalive("bg")
		if alarm.inner.At().IsZero() {
			t.Errorf("failed work tracked with a keepalive desire at %v, but the alarm cell is empty: nothing will ever fire",
				time.UnixMilli(rec.ArmedAt).UTC())
		}
		// The host fires the cell when it is due: the failed attempts are revived.
		clock.Advance(time.Until(alarm.inner.At()) + time.Hour)
		if _, err := reg.HandleAlarm(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if n := len(stream.Events(itx.TypeProcessorRevived)); n == 0 {
			t.Errorf("no revival after the alarm fired (alarm cell %v)", alarm.inner.At())
		}
	})
}

func acker(slug string) processors.Contract[int] {
	return processors.Contract[int]{
		Name: slug, ConsumedTypes: []string{"keys/in"}, ReducerVersion: "1",
		InitialState: func() int { return 0 },
		Reduce:       func(n int, e itx.Event) int { return n + 1 },
		ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
			if a.Event == nil {
				return nil
			}
			ack := itx.EventInput{Type: "keys/ack", Payload: []byte(`{"by":"` + slug + `"}`),
				IdempotencyKey: a.IdempotencyKey("ack", a.Event)}
			// Blocking: the ack is this event's whole consequence.
			a.BlockProcessorWhile("ack", func(ctx context.Context) error {
				_, err := a.Append(ctx, ack)
				return err
			})
			return nil
		},
	}
}

// Args.IdempotencyKey is owned by the processor: two processors on one stream using one key word
// for one event append two effects (a shared key would wedge the second's frame on a conflict).
func TestArgs_IdempotencyKeyIsProcessorOwned(t *testing.T) {
	cfg := proctest.Config[int]{New: func(proctest.Env) processors.Contract[int] { return acker("alpha") }}
	proctest.Run(t, cfg, func(t *testing.T, alpha *proctest.Harness[int]) {
		beta := proctest.New(t, proctest.Config[int]{Substrate: alpha.Substrate(),
			New: func(proctest.Env) processors.Contract[int] { return acker("beta") }})
		alpha.Append(itx.EventInput{Type: "keys/in", Payload: []byte(`{}`)})
		beta.Wake() // a conflict failing beta's frame fails the test at its end (a delivery error never examined)
		acks := alpha.Events("keys/ack")
		if len(acks) != 2 {
			t.Errorf("%d acks, want one per processor (2)", len(acks))
		}
		if got, want := acks[0].IdempotencyKey, "alpha/ack@"+acks[0].IdempotencyKey[len("alpha/ack@"):]; got != want || !strings.HasPrefix(got, "alpha/ack@/") {
			t.Errorf("key %q, want alpha/ack@<path>:<offset>", got)
		}
	})
}
