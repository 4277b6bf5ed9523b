package proctest_test

// Black-box probes of seed 002's harness and its required scenarios, written from the seed and
// the package's public surface alone, with an obligation-carrying processor of their own (a
// mailer: requested, started, one settled with a result union, expiresAt).

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
			ConsumedTypes:  []string{string(bbRequested), string(bbStarted), string(bbSettle), "mail/poison"},
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
				if a.Event != nil && a.Event.Type == "mail/poison" {
					return errors.New("poison")
				}
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

// Eviction mid-attempt: the vendor has not answered when the incarnation dies; the keepalive's
// alarm fires in a fresh incarnation, which appends one stream/processor-revived and settles
// the orphaned attempt once, without dialing again.
func TestBlackbox_EvictionMidAttemptRevivalSettles(t *testing.T) {
	v := &bbVendor{}
	proctest.Run(t, proctest.Config[bbState]{New: bbMailer(v)}, func(t *testing.T, h *proctest.Harness[bbState]) {
		h.Append(bbRequestAt(h, "m1", time.Hour))
		if v.called() != 1 || len(h.Events(string(bbStarted))) != 1 {
			t.Fatalf("vendor calls %d, started %d: want an attempt in flight", v.called(), len(h.Events(string(bbStarted))))
		}
		if at := h.AlarmAt(); at.IsZero() || at.Sub(h.Clock.Now()) > 10*time.Second {
			t.Fatalf("alarm %v with work in flight at %v: want about 10 s ahead", at, h.Clock.Now())
		}
		h.Crash()
		if n := len(h.Events(itx.TypeProcessorRevived)); n != 0 {
			t.Fatalf("%d revivals before the alarm", n)
		}
		h.AdvanceTime(11 * time.Second)
		if n := len(h.Events(itx.TypeProcessorRevived)); n != 1 {
			t.Fatalf("%d revivals, want 1", n)
		}
		got := bbSettlements(t, h)
		if len(got) != 1 || got[0].Kind != "failure" || got[0].Reason != "orphaned" {
			t.Fatalf("settlements %+v, want one orphaned failure", got)
		}
		if v.called() != 1 {
			t.Fatalf("vendor dialed %d times, want 1", v.called())
		}
		// The confirming fire finds the window quiet and clean: disarmed, budget reset.
		h.AdvanceTime(time.Minute)
		if !h.AlarmAt().IsZero() || h.Keepalive().Revivals != 0 {
			t.Fatalf("after a quiet clean fire: alarm %v, keepalive %+v", h.AlarmAt(), h.Keepalive())
		}
		if n := len(h.Events(itx.TypeProcessorRevived)); n != 1 {
			t.Fatalf("%d revivals after settling, want 1", n)
		}
	})
}

// Eviction before any attempt: a request committed but never delivered starts late in the
// successor (woken by an append), or settles expired once past its expiresAt without the
// vendor ever being dialed.
func TestBlackbox_EvictionBeforeAnyAttempt(t *testing.T) {
	t.Run("starts late", func(t *testing.T) {
		v := &bbVendor{answer: func(string) error { return nil }}
		proctest.Run(t, proctest.Config[bbState]{New: bbMailer(v)}, func(t *testing.T, h *proctest.Harness[bbState]) {
			if _, err := h.Stream.Append(t.Context(), []itx.EventInput{bbRequestAt(h, "m1", time.Hour)}); err != nil {
				t.Fatal(err)
			}
			h.Crash()
			h.AdvanceTime(time.Minute) // nothing armed: nothing wakes the successor
			if v.called() != 0 || len(h.Events(string(bbStarted))) != 0 {
				t.Fatalf("the successor ran before its wake: vendor %d", v.called())
			}
			h.Append(itx.EventInput{Type: "mail/unrelated", Payload: json.RawMessage(`{}`)})
			got := bbSettlements(t, h)
			if len(got) != 1 || got[0].Kind != "success" || v.called() != 1 {
				t.Fatalf("settlements %+v, vendor %d: want one success", got, v.called())
			}
		})
	})
	t.Run("expires", func(t *testing.T) {
		v := &bbVendor{answer: func(string) error { t.Error("vendor dialed for an expired obligation"); return nil }}
		proctest.Run(t, proctest.Config[bbState]{New: bbMailer(v)}, func(t *testing.T, h *proctest.Harness[bbState]) {
			if _, err := h.Stream.Append(t.Context(), []itx.EventInput{bbRequestAt(h, "m1", time.Minute)}); err != nil {
				t.Fatal(err)
			}
			h.Crash()
			h.AdvanceTime(2 * time.Minute)
			h.Wake()
			got := bbSettlements(t, h)
			if len(got) != 1 || got[0].Reason != "expired" {
				t.Fatalf("settlements %+v, want one expired", got)
			}
			if len(h.Events(string(bbStarted))) != 0 {
				t.Fatal("an expired obligation was started")
			}
		})
	})
}

// Full-stream replay: a second, fresh processor over the same stream from offset 0, past the
// freshness horizon, with a vendor that fails the test when dialed: zero calls, zero new
// events, the same state.
func TestBlackbox_FullStreamReplay(t *testing.T) {
	v := &bbVendor{answer: func(string) error { return nil }}
	proctest.Run(t, proctest.Config[bbState]{New: bbMailer(v)}, func(t *testing.T, h *proctest.Harness[bbState]) {
		h.Append(bbRequestAt(h, "m1", time.Hour))
		h.Append(bbRequestAt(h, "m2", time.Minute))
		h.AdvanceTime(2 * time.Hour)
		before := len(h.Events())
		dangerous := &bbVendor{answer: func(id string) error { t.Errorf("replay dialed the vendor for %s", id); return errors.New("no") }}
		r := proctest.New(t, proctest.Config[bbState]{New: bbMailer(dangerous), Substrate: h.Substrate()})
		r.Wake()
		if dangerous.called() != 0 {
			t.Fatalf("replay dialed %d times", dangerous.called())
		}
		if n := len(h.Events()); n != before {
			t.Fatalf("replay appended %d events", n-before)
		}
		a, _ := json.Marshal(h.State())
		b, _ := json.Marshal(r.State())
		if string(a) != string(b) {
			t.Fatalf("replayed state %s, live %s", b, a)
		}
	})
}

// The crash-loop breaker on a poison shape: an event whose frame fails at every delivery. Each
// revival marks the counter first and is spaced along 10 s, 1 m, 5 m, 30 m, then 6 h forever;
// crash-loop evidence lands once per version; the antidote deploy (a new version) revives at
// once with a fresh budget.
func TestBlackbox_CrashLoopBreaker(t *testing.T) {
	v := &bbVendor{answer: func(string) error { return nil }}
	proctest.Run(t, proctest.Config[bbState]{New: bbMailer(v)}, func(t *testing.T, h *proctest.Harness[bbState]) {
		h.Append(itx.EventInput{Type: "mail/poison", Payload: json.RawMessage(`{}`)})
		if len(h.TakeDeliveryErrors()) == 0 {
			t.Fatal("the poison did not fail its frame")
		}
		h.AdvanceTime(13 * time.Hour)
		h.TakeDeliveryErrors()
		revived := h.Events(itx.TypeProcessorRevived)
		// The first fire after the failed frame revives (10 s, the lead); then the backoff.
		want := []time.Duration{10 * time.Second, time.Minute, 5 * time.Minute, 30 * time.Minute, 6 * time.Hour, 6 * time.Hour}
		if len(revived) != len(want)+1 {
			var at []string
			for _, e := range revived {
				at = append(at, time.UnixMilli(e.CreatedAt).Sub(h.Clock.Now()).String())
			}
			t.Fatalf("%d revivals in 13 h (at %v before the end), want %d", len(revived), at, len(want)+1)
		}
		for i, gap := range want {
			got := time.Duration(revived[i+1].CreatedAt-revived[i].CreatedAt) * time.Millisecond
			if got < gap || got > gap+15*time.Second {
				t.Fatalf("revival %d came %v after the one before, want %v", i+2, got, gap)
			}
		}
		evidence := 0
		for _, e := range h.Events(itx.TypeErrorOccurred) {
			if e.IdempotencyKey == processors.CrashLoopEvidenceKey("test-harness") {
				evidence++
			}
		}
		if evidence != 1 {
			t.Fatalf("%d crash-loop evidence events, want 1", evidence)
		}
		n := len(h.Events(itx.TypeProcessorRevived))
		h.Deploy("fixed")
		h.TakeDeliveryErrors()
		if got := len(h.Events(itx.TypeProcessorRevived)); got != n+1 {
			t.Fatalf("the antidote deploy did not revive at once: %d revivals, want %d", got, n+1)
		}
		if k := h.Keepalive(); k.Revivals != 1 || k.Version != "fixed" {
			t.Fatalf("keepalive after the deploy %+v: want a fresh budget", k)
		}
	})
}

// A failed started-append: nothing runs, nothing settles, the live-set is released, and a later
// batch retries the whole attempt.
func TestBlackbox_FailedStartedAppend(t *testing.T) {
	v := &bbVendor{answer: func(string) error { return nil }}
	proctest.Run(t, proctest.Config[bbState]{New: bbMailer(v)}, func(t *testing.T, h *proctest.Harness[bbState]) {
		h.Stream.FailAppends(func(in itx.EventInput) error {
			if in.Type == string(bbStarted) {
				return errors.New("stream unavailable")
			}
			return nil
		})
		h.Append(bbRequestAt(h, "m1", time.Hour))
		if errs := h.TakeBackgroundErrors(); len(errs) != 1 {
			t.Fatalf("background errors %v, want the refused started-append", errs)
		}
		if v.called() != 0 || len(h.Events(string(bbSettle))) != 0 {
			t.Fatalf("vendor %d, settled %d after a refused started-append", v.called(), len(h.Events(string(bbSettle))))
		}
		h.Stream.FailAppends(nil)
		h.Append(itx.EventInput{Type: "mail/unrelated", Payload: json.RawMessage(`{}`)})
		got := bbSettlements(t, h)
		if len(got) != 1 || got[0].Kind != "success" || v.called() != 1 {
			t.Fatalf("settlements %+v, vendor %d: want the whole attempt retried once", got, v.called())
		}
	})
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
