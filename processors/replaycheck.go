package processors

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
)

// ReplayReport is what a replay check of a contract's Reduce over stored history found.
type ReplayReport struct {
	// Events is how many consumed events were reduced (Validate's rejects are skipped, as the
	// runner skips them), Skipped how many Validate rejected.
	Events, Skipped int
	// ReducedThrough is the offset the replay reached: the head when it started.
	ReducedThrough int64
	// State is the replayed state as the progress record would store it.
	State json.RawMessage
}

// ReplayCheck reduces the history of log, from offset 1 through the head it finds on its first
// read, with c's Reduce only (never ProcessEvent: nothing is appended, no vendor is called), and
// checks what a new reducer version must hold before it goes live:
//   - Reduce does not panic on any stored event (the error names the offset and type);
//   - Reduce is deterministic: folding the same event into the same state twice gives the same
//     state (a clock, a random number or map iteration order in Reduce breaks this);
//   - the state survives its progress record: encoded to JSON and decoded, it encodes the same.
//
// Run it against a copy of production history (ReplayCheckStream reads a stream over RPC)
// before rolling out a reducer change, and compare the report's State with the live
// processor's snapshot when the ReducerVersion did not change (SameState): a difference means
// Reduce changed without a new ReducerVersion, so live instances would keep a stale reduction.
func ReplayCheck[S any](ctx context.Context, c Contract[S], log itx.ProcessorLog) (ReplayReport, error) {
	var rep ReplayReport
	if err := c.validate(); err != nil {
		return rep, err
	}
	state := c.InitialState()
	head := int64(-1)
	for after := int64(0); head < 0 || after < head; {
		page, err := log.Read(ctx, after, DefaultPageSize)
		if err != nil {
			return rep, fmt.Errorf("replay check of %q: read after %d: %w", c.Name, after, err)
		}
		if head < 0 {
			head = page.Head
		}
		for _, e := range page.Events {
			if e.Offset > head || e.Ephemeral || !c.consumes(e.Type) {
				continue
			}
			rejected, err := validateChecked(&c, e)
			if err != nil {
				return rep, err
			}
			if rejected {
				rep.Skipped++
				continue
			}
			next, err := reduceChecked(&c, state, e)
			if err != nil {
				return rep, err
			}
			state = next
			rep.Events++
		}
		if page.ScannedThrough <= after {
			break // nothing more to read
		}
		after = page.ScannedThrough
	}
	rep.ReducedThrough = max(head, 0)
	raw, err := json.Marshal(state)
	if err != nil {
		return rep, fmt.Errorf("replay check of %q: the state does not encode: %w", c.Name, err)
	}
	var back S
	if err := json.Unmarshal(raw, &back); err != nil {
		return rep, fmt.Errorf("replay check of %q: the encoded state does not decode: %w", c.Name, err)
	}
	if again, _ := json.Marshal(back); !bytes.Equal(again, raw) {
		return rep, fmt.Errorf("replay check of %q: the state does not survive its progress record: %s decodes and encodes as %s", c.Name, raw, again)
	}
	rep.State = raw
	return rep, nil
}

// reduceChecked folds e into state twice, from two copies of it, and fails if Reduce panics or
// the two results differ.
func reduceChecked[S any](c *Contract[S], state S, e itx.Event) (next S, err error) {
	raw, err := json.Marshal(state)
	if err != nil {
		return next, fmt.Errorf("replay check of %q: the state before offset %d does not encode: %w", c.Name, e.Offset, err)
	}
	var twin S
	if err := json.Unmarshal(raw, &twin); err != nil {
		return next, fmt.Errorf("replay check of %q: the state before offset %d does not decode: %w", c.Name, e.Offset, err)
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("replay check of %q: Reduce panicked on offset %d (%s): %v", c.Name, e.Offset, e.Type, p)
		}
	}()
	next = c.Reduce(state, e)
	other := c.Reduce(twin, e)
	a, errA := json.Marshal(next)
	b, errB := json.Marshal(other)
	if errA != nil || errB != nil {
		return next, fmt.Errorf("replay check of %q: the state after offset %d does not encode: %v", c.Name, e.Offset, errors.Join(errA, errB))
	}
	if !bytes.Equal(a, b) {
		return next, fmt.Errorf("replay check of %q: Reduce is not deterministic: offset %d (%s) folded into the same state gave %s, then %s", c.Name, e.Offset, e.Type, a, b)
	}
	// The runner may commit after any event (batches are transport, not semantics), and its
	// successor resumes from that record: every state on the way must survive it, not only the
	// last one.
	var back S
	if err := json.Unmarshal(a, &back); err != nil {
		return next, fmt.Errorf("replay check of %q: the state after offset %d does not decode: %w", c.Name, e.Offset, err)
	}
	if again, _ := json.Marshal(back); !bytes.Equal(again, a) {
		return next, fmt.Errorf("replay check of %q: the state after offset %d does not survive its progress record: %s decodes and encodes as %s", c.Name, e.Offset, a, again)
	}
	return next, nil
}

// validateChecked is Validate's verdict on e, failing the check if Validate panics (the runner
// would take that for a rejection, silently skipping events a sound Validate would keep).
func validateChecked[S any](c *Contract[S], e itx.Event) (rejected bool, err error) {
	if c.Validate == nil {
		return false, nil
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("replay check of %q: Validate panicked on offset %d (%s): %v", c.Name, e.Offset, e.Type, p)
		}
	}()
	return c.Validate(e) != nil, nil
}

// SameState reports whether the replayed state equals a live processor's state (as JSON values,
// so key order and number spelling do not matter).
func (r ReplayReport) SameState(live json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(r.State, &x) != nil || json.Unmarshal(live, &y) != nil {
		return false
	}
	a, _ := json.Marshal(x)
	b, _ := json.Marshal(y)
	return bytes.Equal(a, b)
}

// ReplayCheckStream is ReplayCheck over a stream read through itxd (getEventPage), for a check
// against stored history from outside the server. It reads every event the contract consumes;
// for a processor whose subscription has a filter, use ReplayCheckSubscription.
func ReplayCheckStream[S any](ctx context.Context, c Contract[S], s schema.Stream) (ReplayReport, error) {
	return ReplayCheck(ctx, c, streamReader{s: s})
}

// ReplayCheckSubscription is ReplayCheckStream reading the stream as its subscription name is
// delivered: the subscription's filter applies on top of what the contract consumes, as it does
// for the live processor, so the report's State compares with that processor's snapshot. An
// unknown name fails notFound.
func ReplayCheckSubscription[S any](ctx context.Context, c Contract[S], s schema.Stream, name string) (ReplayReport, error) {
	return ReplayCheck(ctx, c, streamReader{s: s, subscription: name})
}

// streamReader is an itx.ProcessorLog that only reads (ReplayCheck never writes).
type streamReader struct {
	s            schema.Stream
	subscription string // read as this subscription is delivered ("": every event)
}

func (r streamReader) Read(ctx context.Context, after int64, limit int) (itx.ProcessorPage, error) {
	page, err := client.GetEventPage(ctx, r.s, itx.Query{After: after, Limit: limit, Subscription: r.subscription})
	if err != nil {
		return itx.ProcessorPage{}, err
	}
	out := itx.ProcessorPage{Events: page.Events, Head: page.StreamMaxOffset, ScannedThrough: page.NextAfter}
	if out.ScannedThrough <= after && len(page.Events) > 0 {
		out.ScannedThrough = page.Events[len(page.Events)-1].Offset
	}
	return out, nil
}

func (streamReader) Append(context.Context, []itx.EventInput) ([]itx.Event, error) {
	return nil, itx.Errorf(itx.EFailedPrecondition, "a replay check appends nothing")
}

func (streamReader) Schedule(context.Context, itx.EventInput, time.Time) error {
	return itx.Errorf(itx.EFailedPrecondition, "a replay check schedules nothing")
}
