package proctest_test

// Black-box probes of seed 002's harness and its required scenarios, written from the seed and
// the package's public surface alone, with an obligation-carrying processor of their own (a
// mailer: requested, started, one settled with a result union, expiresAt). Kept: the probes that
// found a defect (the required scenarios themselves are examples/agent_test.go's and
// harness_test.go's).

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
	proctest "github.com/itx-dev/itx/processors/testing"
)

type bbRequest struct {
	ID        string `json:"id"`
	ExpiresAt int64  `json:"expiresAt"` // epoch ms
}

type bbSettled struct {
	ID     string `json:"id"`
	Kind   string `json:"kind"` // success | failure
	Reason string `json:"reason,omitempty"`
}

const (
	bbRequested = processors.EventType[bbRequest]("mail/send-requested")
	bbStarted   = processors.EventType[bbRequest]("mail/send-started")
	bbSettle    = processors.EventType[bbSettled]("mail/send-settled")
)

type bbMail struct {
	Phase     string `json:"phase"` // requested | started
	ExpiresAt int64  `json:"expiresAt"`
}

type bbState struct {
	Open    map[string]bbMail `json:"open"`
	Settled int               `json:"settled"`
}

// bbVendor is the vendor fake: it records calls and answers through answer (nil: hang until
// the attempt's context ends).
type bbVendor struct {
	mu     sync.Mutex
	calls  []string
	answer func(id string) error
}

func (v *bbVendor) send(ctx context.Context, id string) error {
	v.mu.Lock()
	v.calls = append(v.calls, id)
	answer := v.answer
	v.mu.Unlock()
	if answer == nil {
		<-ctx.Done()
		return ctx.Err()
	}
	return answer(id)
}

func (v *bbVendor) called() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.calls)
}

// bbMailer is the obligation pattern: at head, walk open obligations against this
// incarnation's live-set.
func bbMailer(v *bbVendor) func(env proctest.Env) processors.Contract[bbState] {
	return func(env proctest.Env) processors.Contract[bbState] {
		var mu sync.Mutex
		live := map[string]bool{}
		return processors.Contract[bbState]{
			Name:           "mailer",
			ConsumedTypes:  []string{string(bbRequested), string(bbStarted), string(bbSettle)},
			ReducerVersion: "1",
			InitialState:   func() bbState { return bbState{Open: map[string]bbMail{}} },
			Reduce: func(s bbState, e itx.Event) bbState {
				open := map[string]bbMail{}
				for k, m := range s.Open {
					open[k] = m
				}
				switch e.Type {
				case string(bbRequested):
					r, _ := bbRequested.Decode(e)
					if _, ok := open[r.ID]; !ok {
						open[r.ID] = bbMail{Phase: "requested", ExpiresAt: r.ExpiresAt}
					}
				case string(bbStarted):
					r, _ := bbStarted.Decode(e)
					if m, ok := open[r.ID]; ok {
						m.Phase = "started"
						open[r.ID] = m
					}
				case string(bbSettle):
					r, _ := bbSettle.Decode(e)
					if _, ok := open[r.ID]; ok {
						delete(open, r.ID)
						s.Settled++
					}
				}
				return bbState{Open: open, Settled: s.Settled}
			},
			ProcessEvent: func(ctx context.Context, a *processors.Args[bbState]) error {
				if !a.Delivery.CaughtUp {
					return nil
				}
				now := a.Now().UnixMilli()
				for id, m := range a.State.Open {
					mu.Lock()
					driving := live[id]
					mu.Unlock()
					if driving {
						continue
					}
					settle := func(kind, reason string) {
						in := bbSettle.Input(bbSettled{ID: id, Kind: kind, Reason: reason}, a.IdempotencyKey("settle@"+id, nil))
						// Blocking: the settlement is the obligation's one terminal fact.
						a.BlockProcessorWhile("settle", func(ctx context.Context) error {
							_, err := a.Append(ctx, in)
							if itx.ErrorCode(err) == itx.EIdempotencyConflict {
								return nil // lost the race: already settled
							}
							return err
						})
					}
					switch {
					case now >= m.ExpiresAt:
						settle("failure", "expired")
					case m.Phase == "started":
						settle("failure", "orphaned")
					default:
						mu.Lock()
						live[id] = true
						mu.Unlock()
						started := bbStarted.Input(bbRequest{ID: id, ExpiresAt: m.ExpiresAt}, a.IdempotencyKey("start@"+id, nil))
						done := bbSettle.Input(bbSettled{ID: id, Kind: "success"}, a.IdempotencyKey("settle@"+id, nil))
						// Recovered by the next caught-up pass: requested stays open, or
						// started is settled as orphaned.
						a.RunInBackground(func(ctx context.Context) error {
							defer func() { mu.Lock(); delete(live, id); mu.Unlock() }()
							if _, err := a.Append(ctx, started); err != nil {
								return err
							}
							if err := v.send(ctx, id); err != nil {
								return err
							}
							_, err := a.Append(ctx, done)
							return err
						})
					}
				}
				return nil
			},
		}
	}
}

func bbRequestAt(h *proctest.Harness[bbState], id string, ttl time.Duration) itx.EventInput {
	return bbRequested.Input(bbRequest{ID: id, ExpiresAt: h.Clock.Now().Add(ttl).UnixMilli()}, "")
}

func bbSettlements(t *testing.T, h *proctest.Harness[bbState]) []bbSettled {
	t.Helper()
	var out []bbSettled
	for _, e := range h.Events(string(bbSettle)) {
		s, err := bbSettle.Decode(e)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// Seed 002's malformed consumed event (parseConsumedInput) advances the cursor with one
// diagnostic after the commit. A processor over every type ("*") whose Validate wants its own
// payload shape rejects that diagnostic (a stream/error-occurred) too: diagnosing it again
// appended another, without end.
func TestBlackbox_RejectedDiagnosticIsNotDiagnosedAgain(t *testing.T) {
	cfg := proctest.Config[int]{New: func(proctest.Env) processors.Contract[int] {
		return processors.Contract[int]{
			Name: "strict", ConsumedTypes: []string{"*"}, ReducerVersion: "1",
			InitialState: func() int { return 0 },
			Validate: func(e itx.Event) error {
				var p struct{ N *int }
				if err := json.Unmarshal(e.Payload, &p); err != nil || p.N == nil {
					return errors.New("no n")
				}
				return nil
			},
			Reduce: func(n int, e itx.Event) int { return n + 1 },
		}
	}}
	proctest.Run(t, cfg, func(t *testing.T, h *proctest.Harness[int]) {
		h.Append(itx.EventInput{Type: "x/bad", Payload: json.RawMessage(`{}`)})
		h.Append(itx.EventInput{Type: "x/good", Payload: json.RawMessage(`{"n":1}`)})
		h.AdvanceTime(time.Minute)
		if got := h.Events(itx.TypeErrorOccurred); len(got) != 1 || len(h.Events()) != 3 {
			t.Fatalf("%d events, %d diagnostics: want the bad event's one", len(h.Events()), len(got))
		}
		if h.State() != 1 {
			t.Fatalf("state %d, want the good event alone", h.State())
		}
	})
}

// Eviction mid-attempt where the successor is delivered to before the alarm comes due (in itxd
// every load of a stream that hosts processors appends stream/woken, which wakes them): it
// settles the orphaned attempt on that wake, and the alarm's first fire still revives, once,
// leaving the seed's evidence (requested, revived, settled) and marking the breaker's counter.
func TestBlackbox_RevivalOwedEvenWhenTheSuccessorSettledFirst(t *testing.T) {
	v := &bbVendor{}
	proctest.Run(t, proctest.Config[bbState]{New: bbMailer(v)}, func(t *testing.T, h *proctest.Harness[bbState]) {
		h.Append(bbRequestAt(h, "m1", time.Hour))
		h.Crash()
		h.Append(itx.EventInput{Type: "mail/unrelated", Payload: json.RawMessage(`{}`)})
		if got := bbSettlements(t, h); len(got) != 1 || got[0].Reason != "orphaned" {
			t.Fatalf("settlements %+v, want the orphaned attempt settled on the wake", got)
		}
		h.AdvanceTime(11 * time.Second)
		if n := len(h.Events(itx.TypeProcessorRevived)); n != 1 {
			t.Fatalf("%d revivals, want 1: the dead incarnation owed work", n)
		}
		h.AdvanceTime(time.Minute)
		if n := len(h.Events(itx.TypeProcessorRevived)); n != 1 || !h.AlarmAt().IsZero() || h.Keepalive().Revivals != 0 {
			t.Fatalf("%d revivals, alarm %v, keepalive %+v: want one, then a quiet clean disarm", n, h.AlarmAt(), h.Keepalive())
		}
	})
}
