package examples_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/examples"
	proctest "github.com/itx-dev/itx/processors/testing"
)

// vendorFake is the LLM. answer decides each call; nil answers at once. Calls are recorded.
type vendorFake struct {
	t      *testing.T
	mu     sync.Mutex
	calls  []string
	keys   []string // the idempotency key each call carried (examples.VendorKey)
	answer func(ctx context.Context, id string) (string, error)
}

func (v *vendorFake) Complete(ctx context.Context, id, prompt string) (string, error) {
	v.mu.Lock()
	v.calls = append(v.calls, id)
	v.keys = append(v.keys, examples.VendorKey(ctx, id))
	answer := v.answer
	v.mu.Unlock()
	if answer == nil {
		return "re: " + prompt, nil
	}
	return answer(ctx, id)
}

func (v *vendorFake) Calls() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.calls...)
}

// hang makes every call block until the test answers it, ignoring its context like a wedged
// RPC with no deadline. Call it inside the bubble.
func (v *vendorFake) hang() (release func(text string)) {
	ch := make(chan string)
	v.mu.Lock()
	v.answer = func(ctx context.Context, id string) (string, error) { return <-ch, nil }
	v.mu.Unlock()
	return func(text string) { ch <- text }
}

// loud makes reaching the vendor fail the test: for paths that must never dial it.
func (v *vendorFake) loud() {
	v.answer = func(ctx context.Context, id string) (string, error) {
		v.t.Errorf("the vendor was dialed for %s", id)
		return "", fmt.Errorf("loud vendor")
	}
}

func agentHarness(t *testing.T, v *vendorFake, body func(t *testing.T, h *proctest.Harness[examples.AgentState])) {
	proctest.Run(t, agentConfig(v), body)
}

func agentConfig(v *vendorFake) proctest.Config[examples.AgentState] {
	return proctest.Config[examples.AgentState]{
		Path: "/agents/a1",
		// Every failed frame a scenario provokes is one it injected and takes (takeInjected).
		StrictDeliveryErrors: true,
		New: func(env proctest.Env) processors.Contract[examples.AgentState] {
			return examples.Agent(env.Clock, v, examples.DefaultAgentConfig)
		},
	}
}

// settlements renders the stream's settlements.
func settlements(t *testing.T, h *proctest.Harness[examples.AgentState]) string {
	t.Helper()
	return settlementsOf(t, h.Stream)
}

// settlementsOf renders a stream's settlements.
func settlementsOf(t *testing.T, stream *proctest.MemoryStream) string {
	t.Helper()
	var out []string
	for _, e := range stream.Events(string(examples.LLMSettled)) {
		s, err := examples.LLMSettled.Decode(e)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s %s %s%s", s.RequestID, s.Result.Kind, s.Result.Text, s.Result.Reason))
	}
	return strings.Join(out, "; ")
}

func hesitation(h *proctest.Harness[examples.AgentState]) time.Duration {
	return time.Duration(h.State().Config.HesitationMs) * time.Millisecond
}

func TestAgent_HesitationWindow(t *testing.T) {
	t.Run("a message standing through its window is answered", func(t *testing.T) {
		v := &vendorFake{t: t}
		agentHarness(t, v, func(t *testing.T, h *proctest.Harness[examples.AgentState]) {
			h.Append(examples.MessageAdded.Input(examples.Message{Text: "hi"}, ""))
			if n := len(h.Events(string(examples.LLMRequested))); n != 0 {
				t.Fatalf("%d requests inside the hesitation window", n)
			}
			h.AdvanceTime(hesitation(h))
			if got, want := settlements(t, h), "msg-1 success re: hi"; got != want {
				t.Errorf("settlements %q, want %q", got, want)
			}
			// Request ids repeat across agent streams: the vendor's key names the stream.
			v.mu.Lock()
			keys := slices.Clone(v.keys)
			v.mu.Unlock()
			if want := []string{h.Stream.Path() + "#msg-1"}; !slices.Equal(keys, want) {
				t.Errorf("vendor keys %q, want %q", keys, want)
			}
			if got := h.State().Requests; len(got) != 1 || got[0].Status != examples.StatusSettled {
				t.Errorf("requests %+v, want one settled", got)
			}
		})
	})
	t.Run("a message retracted inside its window is never requested", func(t *testing.T) {
		v := &vendorFake{t: t}
		v.loud()
		agentHarness(t, v, func(t *testing.T, h *proctest.Harness[examples.AgentState]) {
			added := h.Append(examples.MessageAdded.Input(examples.Message{Text: "oops"}, ""))
			h.AdvanceTime(hesitation(h) / 2)
			h.Append(examples.MessageRetracted.Input(examples.MessageRef{MessageOffset: added[0].Offset}, ""))
			h.AdvanceTime(hesitation(h))
			if n := len(h.Events(string(examples.LLMRequested))); n != 0 {
				t.Errorf("%d requests for a retracted message", n)
			}
		})
	})
}

func TestAgent_EvictionMidAttempt(t *testing.T) {
	v := &vendorFake{t: t}
	agentHarness(t, v, func(t *testing.T, h *proctest.Harness[examples.AgentState]) {
		release := v.hang()
		h.Play(
			proctest.AppendStep[examples.AgentState](examples.MessageAdded.Input(examples.Message{Text: "long one"}, "")),
			proctest.AdvanceStep[examples.AgentState](hesitation(h)),
		)
		if got := len(h.Events(string(examples.LLMStarted))); got != 1 || len(v.Calls()) != 1 {
			t.Fatalf("started %d, vendor calls %d; want the attempt in flight", got, len(v.Calls()))
		}
		if h.AlarmAt().IsZero() {
			t.Fatal("no keepalive alarm while the attempt is in flight")
		}
		h.Crash()
		// The dead incarnation's attempt gets its answer late; whatever it still does is fenced.
		release("too late")
		h.AdvanceTime(processors.KeepaliveLead)
		if got := h.Events(itx.TypeProcessorRevived); len(got) != 1 {
			t.Fatalf("revived facts %d, want 1", len(got))
		}
		if got, want := settlements(t, h), "msg-1 failure "+examples.ReasonOrphaned; got != want {
			t.Errorf("settlements %q, want %q", got, want)
		}
		if got := len(v.Calls()); got != 1 {
			t.Errorf("vendor calls %d, want 1 (orphans fail, they are not re-driven)", got)
		}
		// The confirmation fire finds the window quiet and clean: disarmed, budget reset.
		h.AdvanceTime(processors.KeepaliveLead)
		if !h.AlarmAt().IsZero() || h.Keepalive().Revivals != 0 {
			t.Errorf("after the confirmation fire: alarm %v, keepalive %+v", h.AlarmAt(), h.Keepalive())
		}
	})
}

// requestNow appends a request directly, committed but not delivered: the obligation is on the
// stream and no attempt ever ran.
func requestNow(t *testing.T, h *proctest.Harness[examples.AgentState], expiresIn time.Duration) {
	t.Helper()
	r := examples.LLMRequest{RequestID: "msg-0", Prompt: "late", ExpiresAt: h.Clock.Now().Add(expiresIn).UnixMilli()}
	if _, err := h.Stream.Append(context.Background(), []itx.EventInput{examples.LLMRequested.Input(r, "agent/llm-request-requested@msg-0")}); err != nil {
		t.Fatal(err)
	}
}

func TestAgent_EvictionBeforeAnyAttempt(t *testing.T) {
	v := &vendorFake{t: t}
	agentHarness(t, v, func(t *testing.T, h *proctest.Harness[examples.AgentState]) {
		requestNow(t, h, 5*time.Minute)
		h.Crash()
		h.AdvanceTime(time.Minute)
		h.Wake() // the wake lane redelivers what lies beyond the cursor
		if got, want := settlements(t, h), "msg-0 success re: late"; got != want {
			t.Errorf("settlements %q, want %q (provably never-ran work starts late)", got, want)
		}
	})
}

func TestAgent_ExpiredObligation(t *testing.T) {
	v := &vendorFake{t: t}
	v.loud()
	agentHarness(t, v, func(t *testing.T, h *proctest.Harness[examples.AgentState]) {
		requestNow(t, h, time.Minute)
		h.Crash()
		h.AdvanceTime(2 * time.Minute)
		h.Wake()
		if got, want := settlements(t, h), "msg-0 failure "+examples.ReasonExpired; got != want {
			t.Errorf("settlements %q, want %q", got, want)
		}
	})
}

// A request whose remaining budget is inside the reserve kept for its settlement has no time
// left for the vendor: it is refused as expired, not started with a budget already spent.
func TestAgent_NoBudgetLeftToStart(t *testing.T) {
	v := &vendorFake{t: t}
	v.loud()
	agentHarness(t, v, func(t *testing.T, h *proctest.Harness[examples.AgentState]) {
		reserve := time.Duration(h.State().Config.ReserveMs) * time.Millisecond
		requestNow(t, h, reserve/2)
		h.Wake()
		if got, want := settlements(t, h), "msg-0 failure "+examples.ReasonExpired; got != want {
			t.Errorf("settlements %q, want %q", got, want)
		}
		if n := len(h.Events(string(examples.LLMStarted))); n != 0 {
			t.Errorf("%d started facts, want none", n)
		}
	})
}

func TestAgent_Replay(t *testing.T) {
	live := &vendorFake{t: t}
	proctest.Run(t, agentConfig(live), func(t *testing.T, h *proctest.Harness[examples.AgentState]) {
		for _, text := range []string{"one", "two"} {
			h.Append(examples.MessageAdded.Input(examples.Message{Text: text}, ""))
			h.AdvanceTime(hesitation(h))
		}
		if got := len(h.Events(string(examples.LLMSettled))); got != 2 || len(live.Calls()) != 2 {
			t.Fatalf("live flow: %d settlements, %d calls", got, len(live.Calls()))
		}
		h.AdvanceTime(24 * time.Hour) // past every freshness horizon
		head := h.Stream.Head()

		// A second, fresh processor over the same stream from offset 1: that is a replay.
		replayVendor := &vendorFake{t: t}
		replayVendor.loud()
		cfg := agentConfig(replayVendor)
		cfg.Substrate = h.Substrate()
		replay := proctest.New(t, cfg)
		replay.Wake()
		if got := replay.Stream.Head(); got != head {
			t.Errorf("the replay appended %d events", got-head)
		}
		want, _ := json.Marshal(h.State())
		got, _ := json.Marshal(replay.State())
		if string(got) != string(want) {
			t.Errorf("replayed state\n%s\nwant the live state\n%s", got, want)
		}
	})
}

func TestAgent_FailedStartedAppend(t *testing.T) {
	v := &vendorFake{t: t}
	agentHarness(t, v, func(t *testing.T, h *proctest.Harness[examples.AgentState]) {
		h.Stream.FailAppends(injectFault(string(examples.LLMStarted), "the stream refused started"))
		h.Append(examples.MessageAdded.Input(examples.Message{Text: "hi"}, ""))
		h.AdvanceTime(hesitation(h))
		if n := len(h.Events(string(examples.LLMRequested))); n != 1 {
			t.Fatalf("%d requests, want 1", n)
		}
		if got := h.State().Requests[0].Status; got != examples.StatusRequested || len(v.Calls()) != 0 || settlements(t, h) != "" {
			t.Fatalf("after a failed started-append: status %s, %d calls, settlements %q; want requested, none, none",
				got, len(v.Calls()), settlements(t, h))
		}
		// The attempt failed on its started-append and said so; the frame that started it did not.
		if errs := takeInjectedBackground(t, h); len(errs) != 1 || !strings.Contains(errs[0].Error(), "mark msg-1 started") {
			t.Errorf("background failures %v, want the one attempt's started-append", errs)
		}
		// The failure marked the keepalive window: the next fire revives and retries the whole attempt.
		h.Stream.FailAppends(nil)
		h.AdvanceTime(processors.KeepaliveLead)
		if got, want := settlements(t, h), "msg-1 success re: hi"; got != want {
			t.Errorf("settlements %q, want %q", got, want)
		}
		if n := len(h.Events(string(examples.LLMStarted))); n != 1 {
			t.Errorf("%d started facts, want 1", n)
		}
	})
}

func TestAgent_CrashLoopBreaker(t *testing.T) {
	v := &vendorFake{t: t}
	agentHarness(t, v, func(t *testing.T, h *proctest.Harness[examples.AgentState]) {
		// The poison shape: every attempt's started-append fails, so every revival fails again.
		h.Stream.FailAppends(injectFault(string(examples.LLMStarted), "poisoned"))
		// A request that lives long enough to watch the breaker decay.
		r := examples.LLMRequest{RequestID: "msg-0", Prompt: "p", ExpiresAt: h.Clock.Now().Add(48 * time.Hour).UnixMilli()}
		h.Append(examples.LLMRequested.Input(r, "agent/llm-request-requested@msg-0"))
		h.AdvanceTime(7 * time.Hour)
		if got, want := revivalGaps(h.Events(itx.TypeProcessorRevived)), "10s 1m0s 5m0s 30m0s 6h0m0s"; got != want {
			t.Errorf("gaps between revivals %q, want %q", got, want)
		}
		if got := h.Keepalive().Revivals; got != 6 {
			t.Errorf("keepalive revivals %d, want 6", got)
		}
		if n := len(h.Events(itx.TypeErrorOccurred)); n != 1 {
			t.Errorf("%d crash-loop evidence facts, want 1", n)
		}
		// The poison ran as often as the breaker let it: the first attempt and one per revival,
		// each failing its started-append.
		errs := takeInjectedBackground(t, h)
		if want := 1 + h.Keepalive().Revivals; len(errs) != want {
			t.Errorf("%d failed attempts, want %d: the first and one per revival", len(errs), want)
		}
		for _, err := range errs {
			if !strings.Contains(err.Error(), "mark msg-0 started") {
				t.Errorf("attempt failed with %v, want msg-0's started-append", err)
			}
		}
		// The antidote: the fault is gone; the next revival settles and a quiet fire resets.
		h.Stream.FailAppends(nil)
		h.AdvanceTime(6*time.Hour + processors.KeepaliveLead)
		if got, want := settlements(t, h), "msg-0 success re: p"; got != want {
			t.Errorf("settlements %q, want %q", got, want)
		}
		if got := h.Keepalive(); got.Revivals != 0 || !h.AlarmAt().IsZero() {
			t.Errorf("after recovery: keepalive %+v alarm %v, want reset and disarmed", got, h.AlarmAt())
		}
	})
}

// A vendor call with no deadline of its own (it ignores its context) cannot hold the obligation
// past its horizon: expiresAt bounds the whole obligation, settlement included, so the attempt
// gives up on the call when its budget runs out and settles as expired inside the reserve.
func TestAgent_WedgedVendor(t *testing.T) {
	v := &vendorFake{t: t}
	agentHarness(t, v, func(t *testing.T, h *proctest.Harness[examples.AgentState]) {
		release := v.hang() // a call with no deadline that never answers
		h.Append(examples.MessageAdded.Input(examples.Message{Text: "stuck"}, ""))
		h.AdvanceTime(hesitation(h))
		if got := len(v.Calls()); got != 1 {
			t.Fatalf("%d vendor calls, want the one in flight", got)
		}
		expiresAt := h.State().Requests[0].ExpiresAt
		h.AdvanceTime(time.Duration(h.State().Config.ExpiryMs) * time.Millisecond)
		if got, want := settlements(t, h), "msg-1 failure "+examples.ReasonExpired; got != want {
			t.Fatalf("settlements %q at the horizon, want %q", got, want)
		}
		if at := h.Events(string(examples.LLMSettled))[0].CreatedAt; at > expiresAt {
			t.Errorf("settled %v after the obligation's expiresAt", time.Duration(at-expiresAt)*time.Millisecond)
		}
		// The answer comes long after: it changes nothing, and nothing is left in flight.
		release("finally")
		h.AdvanceTime(processors.KeepaliveLead)
		if got := len(h.Events(string(examples.LLMSettled))); got != 1 {
			t.Errorf("%d settlements, want 1", got)
		}
		if n := len(h.Events(itx.TypeProcessorRevived)); n != 0 {
			t.Errorf("%d revivals: the attempt settled, nothing was owed", n)
		}
	})
}

// Seed 002: cancellation is one way an obligation settles: the user's intent to stop is its own
// event (agent/message-retracted), and the request it stops gets one terminal fact, a settlement
// of kind cancellation under the settlement key, whose reduce guard keeps any later result out.
func TestAgent_RetractionCancelsTheObligation(t *testing.T) {
	t.Run("an attempt in flight is stopped and settles as a cancellation", func(t *testing.T) {
		v := &vendorFake{t: t}
		agentHarness(t, v, func(t *testing.T, h *proctest.Harness[examples.AgentState]) {
			release := v.hang()
			added := h.Append(examples.MessageAdded.Input(examples.Message{Text: "never mind"}, ""))
			h.AdvanceTime(hesitation(h))
			if got := len(h.Events(string(examples.LLMStarted))); got != 1 || len(v.Calls()) != 1 {
				t.Fatalf("started %d, vendor calls %d; want the attempt in flight", got, len(v.Calls()))
			}
			h.Append(examples.MessageRetracted.Input(examples.MessageRef{MessageOffset: added[0].Offset}, ""))
			if got, want := settlements(t, h), "msg-1 cancellation "+examples.ReasonRetracted; got != want {
				t.Fatalf("settlements %q, want %q", got, want)
			}
			release("too late") // the vendor answers after the cancellation: the answer is dropped
			h.AdvanceTime(processors.KeepaliveLead)
			if got, want := settlements(t, h), "msg-1 cancellation "+examples.ReasonRetracted; got != want {
				t.Errorf("after the late answer: settlements %q, want %q", got, want)
			}
			if got := h.State().Requests; len(got) != 1 || got[0].Status != examples.StatusSettled || got[0].Result.Kind != examples.ResultCancellation {
				t.Errorf("requests %+v, want one settled as a cancellation", got)
			}
			if got := len(v.Calls()); got != 1 {
				t.Errorf("vendor calls %d, want 1", got)
			}
		})
	})
	t.Run("a request no attempt started settles cancelled without dialing", func(t *testing.T) {
		v := &vendorFake{t: t}
		v.loud()
		agentHarness(t, v, func(t *testing.T, h *proctest.Harness[examples.AgentState]) {
			requestNow(t, h, time.Hour) // on the stream, never delivered: no attempt ever ran
			h.Crash()
			h.Append(examples.MessageRetracted.Input(examples.MessageRef{MessageOffset: 0}, ""))
			h.AdvanceTime(processors.KeepaliveLead)
			if got, want := settlements(t, h), "msg-0 cancellation "+examples.ReasonRetracted; got != want {
				t.Errorf("settlements %q, want %q", got, want)
			}
			if n := len(h.Events(string(examples.LLMStarted))); n != 0 {
				t.Errorf("%d started facts for a cancelled request", n)
			}
		})
	})
	t.Run("a retraction after the settlement changes nothing", func(t *testing.T) {
		v := &vendorFake{t: t}
		agentHarness(t, v, func(t *testing.T, h *proctest.Harness[examples.AgentState]) {
			added := h.Append(examples.MessageAdded.Input(examples.Message{Text: "hi"}, ""))
			h.AdvanceTime(hesitation(h))
			h.Append(examples.MessageRetracted.Input(examples.MessageRef{MessageOffset: added[0].Offset}, ""))
			h.AdvanceTime(processors.KeepaliveLead)
			if got, want := settlements(t, h), "msg-1 success re: hi"; got != want {
				t.Errorf("settlements %q, want %q", got, want)
			}
			if got := h.State().Requests; len(got) != 1 || got[0].Retracted {
				t.Errorf("requests %+v, want the settled one untouched", got)
			}
		})
	})
}
