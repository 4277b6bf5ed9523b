package examples

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
)

// The agent's vocabulary. A message opens a hesitation window; once it passes with the message
// still standing, the agent records an LLM request (the obligation), marks it started before the
// vendor is dialed, and settles it exactly once.
const (
	MessageAdded      = processors.EventType[Message]("agent/message-added")
	MessageRetracted  = processors.EventType[MessageRef]("agent/message-retracted")
	HesitationElapsed = processors.EventType[MessageRef]("agent/hesitation-elapsed")
	LLMRequested      = processors.EventType[LLMRequest]("agent/llm-request-requested")
	LLMStarted        = processors.EventType[LLMRef]("agent/llm-request-started")
	LLMSettled        = processors.EventType[LLMSettlement]("agent/llm-request-settled")
)

// Message is a user message to the agent.
type Message struct {
	Text string `json:"text"`
}

// MessageRef names a message by its offset.
type MessageRef struct {
	MessageOffset int64 `json:"messageOffset"`
}

// LLMRequest opens an obligation. ExpiresAt (epoch ms) bounds the whole obligation, settlement
// included.
type LLMRequest struct {
	RequestID string `json:"requestId"`
	Prompt    string `json:"prompt"`
	ExpiresAt int64  `json:"expiresAt"`
}

// LLMRef names a request. On a started fact, Attempt names the attempt that wrote it, so a
// second attempt's started append conflicts with the first's under the request's key instead
// of passing as its duplicate: exactly one attempt gets to dial the vendor.
type LLMRef struct {
	RequestID string `json:"requestId"`
	Attempt   string `json:"attempt,omitempty"`
}

// LLMSettlement is a request's one terminal fact.
type LLMSettlement struct {
	RequestID string `json:"requestId"`
	Result    Result `json:"result"`
}

// Result is how an obligation settled.
type Result struct {
	Kind   string `json:"kind"` // ResultSuccess, ResultFailure or ResultCancellation
	Text   string `json:"text,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// Result kinds and the failure reasons the agent itself produces.
const (
	ResultSuccess      = "success"
	ResultFailure      = "failure"
	ResultCancellation = "cancellation"

	ReasonExpired   = "expired"
	ReasonOrphaned  = "orphaned: the attempt died with its incarnation"
	ReasonRetracted = "retracted"
)

// Request statuses.
const (
	StatusRequested = "requested"
	StatusStarted   = "started"
	StatusSettled   = "settled"
)

// AgentConfig is the agent's timing, carried in its state so tests read it from there.
type AgentConfig struct {
	HesitationMs int64 `json:"hesitationMs"` // wall-clock between a message and its request
	ExpiryMs     int64 `json:"expiryMs"`     // a request's lifetime, from its message
	ReserveMs    int64 `json:"reserveMs"`    // kept back from the vendor call to append the settlement
}

// DefaultAgentConfig is the agent's default timing.
var DefaultAgentConfig = AgentConfig{HesitationMs: 2_000, ExpiryMs: 5 * 60_000, ReserveMs: 5_000}

// Pending is a message waiting out its hesitation window.
type Pending struct {
	MessageOffset int64  `json:"messageOffset"`
	Text          string `json:"text"`
	ReadyAt       int64  `json:"readyAt"`
	ExpiresAt     int64  `json:"expiresAt"`
	// Retracted: the user retracted the message before any request for it was recorded. It is
	// kept (never requested) so that a request a pass had already decided on, recorded behind
	// the retraction, is born retracted instead of opening an obligation the user withdrew. It
	// goes with that request, or once an event reduced after ExpiresAt shows no request can
	// dial the vendor any more.
	Retracted bool `json:"retracted,omitempty"`
}

// Request is an obligation as reduced.
type Request struct {
	ID        string  `json:"id"`
	Prompt    string  `json:"prompt"`
	ExpiresAt int64   `json:"expiresAt"`
	Status    string  `json:"status"`
	Result    *Result `json:"result,omitempty"`
	// Retracted: the user retracted the message after its request was recorded, or before it
	// while a pass's append of it was in flight (Pending.Retracted). The request is
	// settled as a cancellation (its one terminal fact, under its settlement key) at the next
	// caught-up pass, unless another settlement lands first.
	Retracted bool `json:"retracted,omitempty"`
}

// AgentState is the desired state: messages in their window and requests with their status.
type AgentState struct {
	Config   AgentConfig `json:"config"`
	Pending  []Pending   `json:"pending"`
	Requests []Request   `json:"requests"`
}

// Vendor is the LLM: one completion per request id. The call's context carries the agent's
// stream path (WithVendorScope): a real vendor receives VendorKey, the id qualified by it, as
// its idempotency key.
type Vendor interface {
	Complete(ctx context.Context, requestID, prompt string) (string, error)
}

// Agent returns one incarnation of the agent processor. Its live-set (the attempts this
// incarnation drives) is in memory and dies with it; that is the actual state the caught-up
// pass compares with the reduced, desired state.
func Agent(clock itx.Clock, vendor Vendor, cfg AgentConfig) processors.Contract[AgentState] {
	a := &agent{clock: clock, vendor: vendor, live: map[string]*attempt{}, waiting: map[string]bool{}, incarnation: rand.Text()[:12]}
	return processors.Contract[AgentState]{
		Name: "agent",
		ConsumedTypes: []string{
			string(MessageAdded), string(MessageRetracted),
			string(LLMRequested), string(LLMStarted), string(LLMSettled),
		},
		// 2: a retraction after the request marks it Retracted.
		// 3: a retraction before the request marks the pending message Retracted, and the
		// request recorded behind it is born Retracted.
		ReducerVersion: "3",
		InitialState:   func() AgentState { return AgentState{Config: cfg} },
		Validate:       validateAgentEvent,
		Reduce:         reduceAgent,
		ProcessEvent:   a.processEvent,
	}
}

func requestID(messageOffset int64) string { return fmt.Sprintf("msg-%d", messageOffset) }

func validateAgentEvent(e itx.Event) error {
	var err error
	switch e.Type {
	case string(MessageAdded):
		_, err = MessageAdded.Decode(e)
	case string(MessageRetracted):
		_, err = MessageRetracted.Decode(e)
	case string(LLMRequested):
		var r LLMRequest
		if r, err = LLMRequested.Decode(e); err == nil && (r.RequestID == "" || r.ExpiresAt <= 0) {
			err = errors.New("a request needs requestId and expiresAt")
		}
	case string(LLMStarted):
		_, err = LLMStarted.Decode(e)
	case string(LLMSettled):
		_, err = LLMSettled.Decode(e)
	}
	return err
}

// reduceAgent is pure: deadlines come from createdAt, never a clock.
func reduceAgent(st AgentState, e itx.Event) AgentState {
	next := AgentState{Config: st.Config, Pending: slices.Clone(st.Pending), Requests: slices.Clone(st.Requests)}
	find := func(id string) int {
		return slices.IndexFunc(next.Requests, func(r Request) bool { return r.ID == id })
	}
	// A retracted message kept past its expiry can no longer lead to a vendor call: a request
	// recorded now is settled as expired without dialing. Dropping it bounds the list.
	next.Pending = slices.DeleteFunc(next.Pending, func(p Pending) bool { return p.Retracted && e.CreatedAt >= p.ExpiresAt })
	switch e.Type {
	case string(MessageAdded):
		m, _ := MessageAdded.Decode(e)
		ready := e.CreatedAt + st.Config.HesitationMs
		next.Pending = append(next.Pending, Pending{
			MessageOffset: e.Offset, Text: m.Text, ReadyAt: ready, ExpiresAt: ready + st.Config.ExpiryMs,
		})
	case string(MessageRetracted):
		ref, _ := MessageRetracted.Decode(e)
		// A pass at the head may already have decided on this message's request, its append in
		// flight behind this retraction: the pending message stays, marked, for that request.
		if i := slices.IndexFunc(next.Pending, func(p Pending) bool { return p.MessageOffset == ref.MessageOffset }); i >= 0 {
			next.Pending[i].Retracted = true
		}
		// The intent to stop is its own event; the obligation it stops settles as a cancellation.
		if i := find(requestID(ref.MessageOffset)); i >= 0 && next.Requests[i].Status != StatusSettled {
			next.Requests[i].Retracted = true
		}
	case string(LLMRequested):
		r, _ := LLMRequested.Decode(e)
		retracted := slices.ContainsFunc(next.Pending, func(p Pending) bool { return requestID(p.MessageOffset) == r.RequestID && p.Retracted })
		next.Pending = slices.DeleteFunc(next.Pending, func(p Pending) bool { return requestID(p.MessageOffset) == r.RequestID })
		if find(r.RequestID) < 0 {
			next.Requests = append(next.Requests, Request{ID: r.RequestID, Prompt: r.Prompt, ExpiresAt: r.ExpiresAt, Status: StatusRequested, Retracted: retracted})
		}
	case string(LLMStarted):
		ref, _ := LLMStarted.Decode(e)
		if i := find(ref.RequestID); i >= 0 && next.Requests[i].Status == StatusRequested {
			next.Requests[i].Status = StatusStarted
		}
	case string(LLMSettled):
		s, _ := LLMSettled.Decode(e)
		// One terminal fact per obligation: a stale second settlement changes nothing.
		if i := find(s.RequestID); i >= 0 && next.Requests[i].Status != StatusSettled {
			res := s.Result
			next.Requests[i].Status, next.Requests[i].Result = StatusSettled, &res
		}
	}
	return next
}

type agent struct {
	clock  itx.Clock
	vendor Vendor

	incarnation string // random: attempt names are unique across incarnations and processes

	mu       sync.Mutex
	live     map[string]*attempt // requests an attempt of this incarnation is driving
	waiting  map[string]bool     // messages whose hesitation timer this incarnation armed
	attempts int                 // attempts this incarnation started
}

// processEvent is the agent's whole side-effect half. Everything it does is derived from the
// reduced state at the head, so it acts only when caught up: behind the head, a settlement may
// sit in pages not yet reduced.
func (ag *agent) processEvent(ctx context.Context, a *processors.Args[AgentState]) error {
	if !a.Delivery.CaughtUp {
		return nil
	}
	now := a.Now().UnixMilli()
	for _, p := range a.State.Pending {
		if p.Retracted {
			continue // withdrawn in its window: never requested
		}
		id := requestID(p.MessageOffset)
		if now < p.ReadyAt {
			ag.hesitate(a, p, time.Duration(p.ReadyAt-now)*time.Millisecond)
			continue
		}
		// Blocking: the request is the durable evidence the whole obligation hangs on. Its body is
		// a function of the reduced message, so a redelivery dedupes.
		req := LLMRequested.Input(LLMRequest{RequestID: id, Prompt: p.Text, ExpiresAt: p.ExpiresAt}, a.IdempotencyKey("llm-request-requested@"+id, nil))
		a.BlockProcessorWhile("request "+id, func(ctx context.Context) error {
			_, err := a.Append(ctx, req)
			return err
		})
	}
	for _, r := range a.State.Requests {
		if r.Status == StatusSettled {
			continue
		}
		if r.Retracted {
			// Cancelled by its message's retraction: whatever runs stops, and the cancellation
			// is the request's one terminal fact (its body a function of the request alone, so
			// a redelivery dedupes). An attempt's answer that landed first wins the key instead,
			// and this append's conflict is that settlement (settle tolerates it).
			ag.cancel(r.ID)
			ag.settleBlocking(a, r.ID, Result{Kind: ResultCancellation, Reason: ReasonRetracted})
			continue
		}
		if ag.driving(r.ID) {
			continue
		}
		switch {
		case now >= r.ExpiresAt:
			// Past its horizon the intent is stale: settle without dialing the vendor.
			ag.settleBlocking(a, r.ID, Result{Kind: ResultFailure, Reason: ReasonExpired})
		case r.Status == StatusStarted:
			// Started and nobody drives it: the attempt died with its incarnation and may have
			// half-run, so it fails rather than re-driving.
			ag.settleBlocking(a, r.ID, Result{Kind: ResultFailure, Reason: ReasonOrphaned})
		case now >= r.ExpiresAt-a.State.Config.ReserveMs:
			// Too late to start: what is left is the reserve kept for the settlement, so the
			// vendor would be dialed with no budget at all.
			ag.settleBlocking(a, r.ID, Result{Kind: ResultFailure, Reason: ReasonExpired})
		default:
			ag.start(a, r)
		}
	}
	return nil
}

func (ag *agent) driving(id string) bool {
	ag.mu.Lock()
	defer ag.mu.Unlock()
	return ag.live[id] != nil
}

// attempt is one live attempt; stop tells it the request was cancelled: it dials nothing more,
// drops the vendor's answer, and leaves the settlement to the pass that stopped it.
type attempt struct {
	stopped chan struct{}
	once    sync.Once
}

func (at *attempt) stop() { at.once.Do(func() { close(at.stopped) }) }

// cancel stops this incarnation's attempt at id, if one runs.
func (ag *agent) cancel(id string) {
	ag.mu.Lock()
	at := ag.live[id]
	ag.mu.Unlock()
	if at != nil {
		at.stop()
	}
}

// hesitate waits out a message's window once per incarnation, then appends a wake. Droppable:
// losing the timer costs latency, never the request, because the next caught-up pass derives the
// same intent from the reduced state (and the keepalive tracks the wait, so an eviction during
// the window still gets a revival).
func (ag *agent) hesitate(a *processors.Args[AgentState], p Pending, d time.Duration) {
	ag.mu.Lock()
	armed := ag.waiting[requestID(p.MessageOffset)]
	ag.waiting[requestID(p.MessageOffset)] = true
	ag.mu.Unlock()
	if armed {
		return
	}
	a.RunInBackground(func(ctx context.Context) error {
		defer func() {
			ag.mu.Lock()
			delete(ag.waiting, requestID(p.MessageOffset))
			ag.mu.Unlock()
		}()
		elapsed := make(chan struct{})
		t := ag.clock.AfterFunc(d, func() { close(elapsed) })
		defer t.Stop()
		select {
		case <-elapsed:
		case <-ctx.Done():
			return ctx.Err()
		}
		ref := MessageRef{MessageOffset: p.MessageOffset}
		_, err := a.Append(ctx, HesitationElapsed.Input(ref, a.IdempotencyKey(fmt.Sprintf("hesitation-elapsed@%d", p.MessageOffset), nil)))
		return err
	})
}

// start runs one attempt in the background. It enters the live-set before returning, so this
// pass and any later one in this incarnation see the request as driven.
//
// What recovers it if it drops? The stream: a request without started is started again by the
// next caught-up pass (after a revival); a started one nobody drives is settled as orphaned.
//
// The live-set alone cannot keep a request from being started twice: a pass may decide on a
// state that lacks an earlier attempt's started fact (its frame was planned at the head while
// that append was in flight) after the attempt has run its course and left the live-set, or an
// incarnation may overlap its predecessor's last attempt. So the started fact names its
// attempt: the second attempt's append conflicts under the request's key, and it leaves the
// request to the first (which settles it, or dies with it and leaves it to the orphan branch).
func (ag *agent) start(a *processors.Args[AgentState], r Request) {
	at := &attempt{stopped: make(chan struct{})}
	ag.mu.Lock()
	ag.live[r.ID] = at
	ag.attempts++
	name := fmt.Sprintf("%s-%d", ag.incarnation, ag.attempts)
	ag.mu.Unlock()
	a.RunInBackground(func(ctx context.Context) error {
		defer func() {
			ag.mu.Lock()
			if ag.live[r.ID] == at {
				delete(ag.live, r.ID)
			}
			ag.mu.Unlock()
		}()
		select {
		case <-at.stopped:
			return nil // cancelled before it began: the pass that stopped it settles
		default:
		}
		// The started fact lands before any external work: if it fails, nothing runs and nothing
		// settles, the request stays requested and the failure marks the keepalive window.
		_, err := a.Append(ctx, LLMStarted.Input(LLMRef{RequestID: r.ID, Attempt: name}, a.IdempotencyKey("llm-request-started@"+r.ID, nil)))
		if itx.ErrorCode(err) == itx.EIdempotencyConflict {
			return nil // another attempt started it first: it alone may dial
		}
		if err != nil {
			return fmt.Errorf("mark %s started: %w", r.ID, err)
		}
		// Bound the vendor call by the obligation's horizon, keeping a reserve to settle.
		budget := time.Duration(r.ExpiresAt-a.Now().UnixMilli()-a.State.Config.ReserveMs) * time.Millisecond
		if budget <= 0 {
			// The started append used up what was left: never dial the vendor without a budget.
			return settle(ctx, a, r.ID, Result{Kind: ResultFailure, Reason: ReasonExpired})
		}
		callCtx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		timer := ag.clock.AfterFunc(budget, func() { cancel(errExpired) })
		defer timer.Stop()
		// The attempt waits for the answer or the end of its budget, whichever comes first: a
		// vendor call that ignores its context (a wedged RPC with no deadline of its own) must
		// not hold the obligation past its horizon. A late answer is dropped.
		type answer struct {
			text string
			err  error
		}
		answered := make(chan answer, 1)
		go func() {
			text, err := ag.vendor.Complete(WithVendorScope(callCtx, a.Path), r.ID, r.Prompt)
			answered <- answer{text, err}
		}()
		var res Result
		select {
		case got := <-answered:
			res = Result{Kind: ResultSuccess, Text: got.text}
			if got.err != nil {
				res = Result{Kind: ResultFailure, Reason: got.err.Error()}
			}
		case <-callCtx.Done():
		case <-at.stopped:
			cancel(errCancelled)
			return nil // cancelled: the pass that stopped it settles; the answer is dropped
		}
		switch {
		case ctx.Err() != nil:
			return ctx.Err() // evicted: the orphan settlement is the next incarnation's job
		case errors.Is(context.Cause(callCtx), errExpired):
			res = Result{Kind: ResultFailure, Reason: ReasonExpired}
		}
		return settle(ctx, a, r.ID, res)
	})
}

var (
	errExpired   = errors.New("the request expired")
	errCancelled = errors.New("the request was cancelled")
)

// settleBlocking settles at the head under the frame: the settlement must land promptly, and
// holding the frame lets redelivery retry it.
func (ag *agent) settleBlocking(a *processors.Args[AgentState], id string, res Result) {
	a.BlockProcessorWhile("settle "+id, func(ctx context.Context) error { return settle(ctx, a, id, res) })
}

// settle appends the one terminal fact under the obligation's key. Bodies may differ between
// racing attempts (vendor text); losing that race means the obligation is already settled, so a
// key conflict is tolerated as the settlement.
func settle(ctx context.Context, a *processors.Args[AgentState], id string, res Result) error {
	_, err := a.Append(ctx, LLMSettled.Input(LLMSettlement{RequestID: id, Result: res}, a.IdempotencyKey("llm-request-settled@"+id, nil)))
	if itx.ErrorCode(err) == itx.EIdempotencyConflict {
		return nil
	}
	return err
}
