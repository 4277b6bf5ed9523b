package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	jsonata "github.com/blues/jsonata-go"
	"github.com/blues/jsonata-go/jlib"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

// deliverer pushes one subscription's events to its receiver: in order, at least once, resuming
// after the confirmed cursor. One runs per configured subscription while its stream is loaded;
// a reconfigure (a new birth epoch) or a removal replaces it.
type deliverer struct {
	a      *actor
	name   string
	birth  int64 // the birth epoch this deliverer serves
	gen    int64 // its connection generation: fences acks of an older deliverer
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	send       sender
	condition  *jsonata.Expr
	transform  *jsonata.Expr
	types      map[string]bool
	onFailing  string
	limitToOne bool // after a multi-event failure under skip: find the failing event alone
	pinned     bool
}

// DeliveryEnvelope says where a delivery comes from and which attempt it is.
type DeliveryEnvelope struct {
	ProjectID             string `json:"projectId"`
	StreamID              string `json:"streamId"`
	Path                  string `json:"path"`
	Subscription          string `json:"subscription"`
	ConfiguredAtOffset    int64  `json:"configuredAtOffset"`
	CursorChangedAtOffset int64  `json:"cursorChangedAtOffset"`
	DeliveryID            string `json:"deliveryId"` // stable across retries of the same range
	Attempt               int    `json:"attempt"`
	HeadOffset            int64  `json:"headOffset"`
}

// DeliveryBatch is what a push receiver is given: events of one stream, in offset order.
type DeliveryBatch struct {
	DeliveryEnvelope
	Events []itx.Event `json:"events"`
}

// sender is one receiver kind's send adapter. It returns the offset the far side confirmed
// through (0: the whole batch) or an error.
type sender interface {
	send(ctx context.Context, d *deliverer, batch *DeliveryBatch) (int64, error)
	batchLimit() int
}

// startDeliverers starts one deliverer per subscription (on load).
func (a *actor) startDeliverers() {
	for name := range a.core.Subscriptions {
		a.restartDeliverer(name)
	}
}

// restartDeliverer replaces the deliverer of name to match the catalog (none if removed).
// Runs on the actor goroutine.
func (a *actor) restartDeliverer(name string) {
	if old := a.deliverers[name]; old != nil {
		old.cancel()
		delete(a.deliverers, name)
	}
	a.mu.Lock()
	entry := a.core.Subscriptions[name]
	a.mu.Unlock()
	if entry == nil || a.dctx.Err() != nil {
		return
	}
	a.nextGen++
	d := &deliverer{a: a, name: name, birth: entry.ConfiguredAtOffset, gen: a.nextGen,
		done: make(chan struct{}), onFailing: entry.Config.Receiver.EffectiveDelivery().OnFailingEvent}
	d.ctx, d.cancel = context.WithCancel(a.dctx)
	if f := entry.Config.Filter; f != nil {
		for _, t := range f.EventTypes {
			if t == "*" {
				d.types = nil
				break
			}
			if d.types == nil {
				d.types = map[string]bool{}
			}
			d.types[t] = true
		}
		if f.JSONataCondition != "" {
			d.condition, _ = CompileJSONata(f.JSONataCondition) // compiled at configure time
		}
	}
	if t := entry.Config.Receiver.JSONataTransform; t != "" {
		d.transform, _ = CompileJSONata(t)
	}
	d.send = a.srv.senderFor(a, entry)
	a.deliverers[name] = d
	go d.run()
}

// snapshot is what one delivery pass decides on.
type snapshot struct {
	row      storage.CursorRow
	entry    *catalogEntry
	head     int64
	streamID string
	store    *storage.Stream
	changed  <-chan struct{}
}

// snap reads the subscription's state; ok is false when this deliverer no longer serves it.
func (d *deliverer) snap() (snapshot, bool) {
	a := d.a
	a.mu.Lock()
	defer a.mu.Unlock()
	entry := a.core.Subscriptions[d.name]
	row := a.rows[d.name]
	if entry == nil || row == nil || entry.ConfiguredAtOffset != d.birth || row.ConfiguredAtOffset != d.birth {
		return snapshot{}, false
	}
	return snapshot{row: *row, entry: entry, head: a.head, streamID: a.streamID, store: a.store, changed: a.changed}, true
}

func (d *deliverer) run() {
	defer close(d.done)
	defer d.unpin()
	clock := d.a.srv.clock
	for d.ctx.Err() == nil {
		s, ok := d.snap()
		if !ok {
			return
		}
		now := itx.UnixMilli(clock.Now())
		switch {
		case s.row.Status == storage.StatusHalted || s.row.ConfirmedOffset >= s.head:
			d.unpin()
			d.wait(s.changed, 0)
			continue
		case s.row.NextAttemptAt > now:
			d.unpin()
			d.wait(s.changed, time.Duration(s.row.NextAttemptAt-now)*time.Millisecond)
			continue
		}
		if !d.pin() {
			return // the stream is being unloaded
		}
		d.pass(s)
	}
}

// wait blocks until a commit or a presence signal (both close changed), the timeout (0: none)
// or the end.
func (d *deliverer) wait(changed <-chan struct{}, timeout time.Duration) {
	var expired chan struct{}
	if timeout > 0 {
		expired = make(chan struct{})
		t := d.a.srv.clock.AfterFunc(timeout, func() { close(expired) })
		defer t.Stop()
	}
	select {
	case <-changed:
	case <-expired:
	case <-d.ctx.Done():
	}
}

// pin keeps the stream loaded while this subscription has work due.
func (d *deliverer) pin() bool {
	if !d.pinned {
		if !d.a.srv.pin(d.a) {
			return false
		}
		d.pinned = true
	}
	return true
}

func (d *deliverer) unpin() {
	if d.pinned {
		d.pinned = false
		d.a.srv.release(d.a)
	}
}

// pass makes one delivery attempt: read after the cursor, filter, transform, send, then ack or
// record the failure.
func (d *deliverer) pass(s snapshot) {
	limit := d.send.batchLimit()
	if d.limitToOne {
		limit = 1
	}
	events, err := s.store.Events(d.ctx, storage.Query{After: s.row.ConfirmedOffset, UpTo: s.head, Limit: limit})
	if err != nil {
		if d.ctx.Err() == nil {
			d.fail(s, 1, 0, itx.Errorf(itx.EUnavailable, "reading events: %v", err))
		}
		return
	}
	// The scan covers the head unless the page filled up; everything scanned that does not
	// match still advances the cursor (the filter makes it a watermark).
	scanned := s.head
	if len(events) == limit {
		scanned = events[len(events)-1].Offset
	}
	events, scanned = capBytes(events, scanned)

	var matched []itx.Event
	var failing *itx.Event
	var failErr error
	for i := range events {
		e := &events[i]
		if !d.matches(e) {
			continue
		}
		if d.condition != nil {
			ok, err := EvalCondition(d.condition, e)
			if err != nil {
				failing, failErr = e, fmt.Errorf("filter condition failed on offset %d: %w", e.Offset, err)
				break
			}
			if !ok {
				continue
			}
		}
		if _, copies := d.send.(*copySender); d.transform != nil && !copies { // a copy shapes its own
			out, err := applyTransform(d.transform, e)
			if err != nil {
				failing, failErr = e, fmt.Errorf("transform failed on offset %d: %w", e.Offset, err)
				break
			}
			matched = append(matched, out)
			continue
		}
		matched = append(matched, *e)
	}
	through := scanned
	if failing != nil {
		through = failing.Offset - 1
	}
	if len(matched) > 0 {
		batch := &DeliveryBatch{DeliveryEnvelope: DeliveryEnvelope{
			ProjectID: d.a.ref.ProjectID, StreamID: s.streamID, Path: d.a.ref.Path, Subscription: d.name,
			ConfiguredAtOffset: s.row.ConfiguredAtOffset, CursorChangedAtOffset: s.row.CursorChangedAtOffset,
			Attempt: s.row.Attempt + 1, HeadOffset: s.head,
		}, Events: matched}
		batch.DeliveryID = deliveryID(batch.StreamID, d.name, s.row.CursorChangedAtOffset, matched[0].Offset, through)
		d.a.markInFlight(d, s.row)
		confirmed, err := d.sendWithTimeout(batch)
		if d.ctx.Err() != nil {
			return // unloading or closing: the outcome is unknown, so the events redeliver
		}
		if err != nil {
			d.fail(s, len(matched), matched[len(matched)-1].Offset, err)
			return
		}
		if confirmed > 0 && confirmed < through {
			through = confirmed // an offset-acking receiver took only part: the rest redelivers
		}
		d.limitToOne = false
		d.a.ack(d, s.row, through, ackDelivered)
	} else if through > s.row.ConfirmedOffset {
		d.a.ack(d, s.row, through, ackWatermark)
	}
	if failing != nil && through == failing.Offset-1 {
		s2, ok := d.snap()
		if ok {
			d.fail(s2, 1, failing.Offset, failErr)
		}
	}
}

func (d *deliverer) matches(e *itx.Event) bool {
	if e.Ephemeral || (d.types != nil && !d.types[e.Type]) {
		return false
	}
	return true
}

// capBytes keeps a batch within DeliveryBatchBytes (the first event always goes) and returns the
// offset the kept part covers.
func capBytes(events []itx.Event, scanned int64) ([]itx.Event, int64) {
	total := 0
	for i := range events {
		total += len(events[i].Payload) + len(events[i].Metadata) + len(events[i].Type) + 64
		if total > itx.DeliveryBatchBytes && i > 0 {
			return events[:i], events[i-1].Offset
		}
	}
	return events, scanned
}

func deliveryID(streamID, name string, seek, first, through int64) string {
	b, _ := json.Marshal([]any{streamID, name, seek, first, through})
	return "delivery:" + string(b)
}

// sendWithTimeout sends within itx.DeliveryTimeout on the injected clock.
func (d *deliverer) sendWithTimeout(batch *DeliveryBatch) (int64, error) {
	ctx, cancel := context.WithCancel(d.ctx)
	defer cancel()
	timedOut := make(chan struct{})
	t := d.a.srv.clock.AfterFunc(d.a.srv.cfg.DeliveryTimeout, func() { close(timedOut); cancel() })
	defer t.Stop()
	confirmed, err := d.send.send(ctx, d, batch)
	select {
	case <-timedOut:
		return 0, itx.Errorf(itx.EDeadlineExceeded, "%s %q timed out after %s", d.send, d.name, d.a.srv.cfg.DeliveryTimeout)
	default:
	}
	return confirmed, err
}

// fail applies the retry ladder and the failing-event policy to a failed attempt on count events
// ending at offset last.
func (d *deliverer) fail(s snapshot, count int, last int64, cause error) {
	msg := truncate(cause.Error(), itx.MaxHaltErrorLength)
	code := itx.ErrorCode(cause)
	unavailable := code == itx.EDeadlineExceeded || code == itx.EUnavailable || code == itx.ERateLimited
	d.a.srv.metrics.DeliveryFailures.WithLabelValues(s.entry.Kind()).Inc()
	if !unavailable && d.onFailing == itx.OnFailingSkip {
		if count > 1 {
			d.limitToOne = true // find the failing event alone, at once
			return
		}
		attempt := 1
		if s.row.FailingEventOffset == last {
			attempt = s.row.FailingEventAttempt + 1
		}
		if attempt >= itx.FailingEventConfirmAttempts {
			skips := s.row.FailingEventSkips + 1
			if skips >= itx.MaxFailingEventSkips {
				d.halt(s, s.row.Attempt+1, msg)
				return
			}
			d.skip(s, last, attempt, msg)
			return
		}
		d.retryLater(s, msg, last, attempt)
		return
	}
	d.retryLater(s, msg, 0, 0)
}

// retryLater records a failure and schedules the next attempt, or halts at the end of the ladder.
func (d *deliverer) retryLater(s snapshot, msg string, failingOffset int64, failingAttempt int) {
	attempt := s.row.Attempt + 1
	if attempt >= itx.MaxDeliveryAttempts {
		d.halt(s, attempt, msg)
		return
	}
	srv := d.a.srv
	delay := itx.Backoff(attempt, srv.random())
	next := itx.UnixMilli(srv.clock.Now().Add(delay))
	d.a.nack(d, s.row, attempt, next, msg, failingOffset, failingAttempt)
}

// skip gives up on one event under the skip policy: an error-occurred record, then the cursor
// moves past it with the skip counted.
func (d *deliverer) skip(s snapshot, offset int64, attempts int, msg string) {
	payload, _ := json.Marshal(itx.ErrorOccurredPayload{Message: fmt.Sprintf(
		"subscription %q skipped failing event at offset %d after %d event-specific attempts: %s", d.name, offset, attempts, msg)})
	key, _ := json.Marshal([]any{d.name, s.row.ConfiguredAtOffset, s.row.CursorChangedAtOffset, offset})
	_, err := d.a.appendOwn(d.ctx, []itx.EventInput{{
		Type: itx.TypeErrorOccurred, Payload: payload, IdempotencyKey: itx.InternalKeyPrefix + "subscription-failing-event-skipped:" + string(key),
	}})
	if err != nil {
		if d.ctx.Err() == nil {
			d.retryLater(s, "recording a skip: "+err.Error(), offset, attempts)
		}
		return
	}
	d.a.ack(d, s.row, offset, ackSkipped)
}

// halt ends the ladder loudly: a stream/subscription-delivery-halted event carrying the error.
func (d *deliverer) halt(s snapshot, attempts int, msg string) {
	payload, _ := json.Marshal(itx.HaltedPayload{Name: d.name, Reason: "delivery-failed",
		AfterOffset: s.row.ConfirmedOffset, Attempts: attempts, Error: strings.TrimSpace(msg)})
	_, err := d.a.appendOwn(d.ctx, []itx.EventInput{{Type: itx.TypeSubscriptionHalted, Payload: payload}})
	if err != nil && d.ctx.Err() == nil {
		d.a.srv.log.Error().Err(err).Str("path", d.a.ref.Path).Str("subscription", d.name).Msg("halt not recorded; retrying")
		next := itx.UnixMilli(d.a.srv.clock.Now().Add(time.Second))
		d.a.nack(d, s.row, s.row.Attempt, next, msg, 0, 0)
		return
	}
	d.a.srv.log.Warn().Str("path", d.a.ref.Path).Str("subscription", d.name).Int("attempts", attempts).Str("error", msg).Msg("subscription halted")
}

// ack modes.
const (
	ackDelivered = iota // the receiver took it: clear retry and skip state
	ackWatermark        // nothing matched: advance, keep the skip count
	ackSkipped          // a failing event given up on: advance, count the skip
)

// ack moves a cursor forward in memory if the row still belongs to the epochs the delivery was
// read under (birth, seek and this deliverer's generation); a late ack from an older epoch is
// refused and reported false.
func (a *actor) ack(d *deliverer, read storage.CursorRow, through int64, mode int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.rows[d.name]
	if r == nil || r.ConfiguredAtOffset != read.ConfiguredAtOffset || r.CursorChangedAtOffset != read.CursorChangedAtOffset ||
		(r.InFlightConnectionGeneration != 0 && r.InFlightConnectionGeneration != d.gen) {
		a.srv.metrics.LateAcks.Inc()
		return false
	}
	if through > r.ConfirmedOffset {
		r.ConfirmedOffset = through
	}
	r.Attempt, r.NextAttemptAt, r.LastError = 0, 0, ""
	r.FailingEventOffset, r.FailingEventAttempt = 0, 0
	switch mode {
	case ackDelivered:
		r.FailingEventSkips = 0
	case ackSkipped:
		r.FailingEventSkips++
	}
	r.InFlightDeadlineAt, r.InFlightConnectionGeneration = 0, 0
	r.UpdatedAt = stamp(a.srv.clock.Now())
	a.touchRow(d.name)
	return true
}

// nack records a failed attempt and when to retry, under the same fence as ack.
func (a *actor) nack(d *deliverer, read storage.CursorRow, attempt int, next int64, msg string, failingOffset int64, failingAttempt int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.rows[d.name]
	if r == nil || r.ConfiguredAtOffset != read.ConfiguredAtOffset || r.CursorChangedAtOffset != read.CursorChangedAtOffset {
		return
	}
	r.Attempt, r.NextAttemptAt, r.LastError = attempt, next, truncate(msg, itx.MaxCursorErrorLength)
	r.FailingEventOffset, r.FailingEventAttempt = failingOffset, failingAttempt
	r.InFlightDeadlineAt, r.InFlightConnectionGeneration = 0, 0
	r.UpdatedAt = stamp(a.srv.clock.Now())
	a.touchRow(d.name)
}

// markInFlight records the attempt in progress (its deadline and connection generation).
func (a *actor) markInFlight(d *deliverer, read storage.CursorRow) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.rows[d.name]
	if r == nil || r.CursorChangedAtOffset != read.CursorChangedAtOffset || r.ConfiguredAtOffset != read.ConfiguredAtOffset {
		return
	}
	r.InFlightDeadlineAt = itx.UnixMilli(a.srv.clock.Now().Add(a.srv.cfg.DeliveryTimeout))
	r.InFlightConnectionGeneration = d.gen
}

// applyTransform runs a JSONata transform over an event. The result must be an object; its
// type, payload and metadata replace the event's, and whatever it omits is kept. Offsets,
// times, keys and provenance always stay the source's.
func applyTransform(expr *jsonata.Expr, e *itx.Event) (itx.Event, error) {
	res, err := evalJSONata(expr, e)
	if err != nil {
		return itx.Event{}, err
	}
	obj, ok := res.(map[string]any)
	if !ok {
		return itx.Event{}, errors.New("the transform must produce an object such as {\"type\": ..., \"payload\": {...}}")
	}
	// Refused before encoding: a result that shares itself can be exponentially large encoded.
	if err := jlib.CheckEncodedSize(obj, 2*itx.MaxEventBytes); err != nil {
		return itx.Event{}, err
	}
	out := *e
	for k, v := range obj {
		switch k {
		case "type":
			t, ok := v.(string)
			if !ok || itx.ValidateType(t) != nil {
				return itx.Event{}, fmt.Errorf("the transform produced an invalid type %v", v)
			}
			out.Type = t
		case "payload", "metadata":
			m, ok := v.(map[string]any)
			if !ok {
				return itx.Event{}, fmt.Errorf("the transform's %s must be an object", k)
			}
			b, err := json.Marshal(m)
			if err != nil {
				return itx.Event{}, err
			}
			if k == "payload" {
				out.Payload = b
			} else {
				out.Metadata = b
			}
		}
	}
	return out, nil
}

// appendOwn appends server-authored events to the deliverer's own stream. It goes straight to
// the actor the deliverer has pinned, never through the registry: the registry may be waiting
// for this very actor to unload, which waits for its deliverers.
func (a *actor) appendOwn(ctx context.Context, inputs []itx.EventInput) (AppendResult, error) {
	if err := validateAppend(inputs, authCore); err != nil {
		return AppendResult{}, err
	}
	req := &appendReq{inputs: inputs, authority: authCore, queued: time.Now(), reply: make(chan appendReply, 1)}
	if err := a.submit(ctx, req); err != nil {
		return AppendResult{}, err
	}
	select {
	case r := <-req.reply:
		return r.result, r.err
	case <-ctx.Done():
		return AppendResult{}, itx.Errorf(itx.ECancelled, "append: %v", ctx.Err())
	}
}
