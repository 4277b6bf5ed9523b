package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	jsonata "github.com/blues/jsonata-go"
	"github.com/blues/jsonata-go/jlib"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

// sender is one receiver kind's send adapter. It returns the offset the far side confirmed
// through (0: the whole batch) or an error.
type sender interface {
	send(ctx context.Context, d *deliverer, batch *itx.DeliveryBatch) (int64, error)
}

// deliverer does one subscription's delivery I/O: it reads a batch after the cursor, filters
// and transforms it, sends it and reports the outcome to the actor as an input. It never writes
// state. The actor builds one per subscription generation and runs at most one push at a time.
type deliverer struct {
	srv    *Server
	ref    StreamRef
	name   string
	kind   string
	ctx    context.Context // ends when the subscription changes or the stream unloads
	cancel context.CancelFunc

	send      sender
	condition *jsonataRef // compiled on use, within the process's budget (jsonata_cache.go)
	transform *jsonataRef
	types     map[string]bool
	scope     string // the configuring token's prefix: events are read under it ("": as stored)
	buildErr  error  // a stored expression that no longer compiles: a terminal failure

	// stuck is the send that outlived its deadline (a receiver that stopped reading its socket
	// blocks the write itself); until it returns, no other push goes to that receiver. Pushes
	// of one deliverer are sequential, ordered by the actor.
	stuck chan struct{}
	// reached is the mount generation the send under way was handed to (0: none yet, or not a
	// mounted receiver), set by the sender as it looks the mount up: a send that runs out its
	// deadline carries it, as a failure the receiver answered does (fromMount). Only one send
	// writes it at a time: the next starts once the last has returned (see stuck).
	reached atomic.Uint64

	actor *actor // the stream's actor: processor-wake deliverers start its processors

	// deadLetter is where this subscription's skipped events land (receiver.delivery.
	// deadLetterPath; empty Path: none). A skip waits until its dead letter has landed.
	deadLetter StreamRef
	// remoteContract is the contract of a processor-wake subscription placed remote ("" for any
	// other): the host holding it (in the namespace of remoteScope) is told when the subscription
	// stops running there.
	remoteContract, remoteScope string
}

// newDeliverer builds the deliverer of a catalog entry under ctx.
func newDeliverer(ctx context.Context, s *Server, ref StreamRef, entry *catalogEntry) *deliverer {
	d := &deliverer{srv: s, ref: ref, name: entry.Config.Name, kind: entry.Kind(), scope: entry.Config.Scope}
	d.ctx, d.cancel = context.WithCancel(ctx)
	if entry.Kind() == itx.KindProcessorWake && !isInProcess(entry) {
		d.remoteContract, d.remoteScope = entry.Config.ProcessorContract(), entry.mountScope()
	}
	if f := entry.Config.Filter; f != nil {
		d.types = typeSet(f.EventTypes)
		if f.JSONataCondition != "" {
			var err error
			if d.condition, err = newJSONataRef(f.JSONataCondition, ref.ProjectID); err != nil {
				d.buildErr = fmt.Errorf("the filter condition no longer compiles: %w", err)
			}
		}
	}
	if t := entry.Config.Receiver.JSONataTransform; t != "" {
		var err error
		if d.transform, err = newJSONataRef(t, ref.ProjectID); err != nil {
			d.buildErr = fmt.Errorf("the transform no longer compiles: %w", err)
		}
	}
	d.send = s.senderFor(ref, entry)
	if p := entry.Config.Receiver.EffectiveDelivery().DeadLetterPath; p != "" && entry.Kind() != itx.KindProcessorWake && entry.Kind() != itx.KindCopyToStream {
		d.deadLetter = StreamRef{ProjectID: ref.ProjectID, Path: p}
	}
	return d
}

// expressionFailure is a filter condition or transform that failed on one event.
type expressionFailure struct {
	offset int64
	err    error
}

func (e *expressionFailure) Error() string { return e.err.Error() }

// push makes one delivery try and reports what happened. Its ordering: the events it reads
// were committed before the actor started it (commit before push). A failure the ladder will
// answer with a skip first lands the event in the dead-letter stream, when there is one.
func (d *deliverer) push(job pushJob, store streamStore, streamID string) deliveryOutcome {
	out := d.try(job, store, streamID)
	if d.deadLetter.Path != "" && out.failure != nil && out.failure.class == classEvent && out.failure.eventOffset > 0 {
		d.deadLetterSkip(job, store, streamID, &out)
	}
	return out
}

// deadLetterSkip appends the failing event of out to the dead-letter stream when the ladder,
// deciding from the same cursor row, will skip it: exactly once (its idempotency key names the
// subscription's epochs and the offset, so a repeat after a crash is a duplicate), and before
// the skip, which the actor takes only from an outcome marked deadLettered. When it cannot land,
// the failure becomes an outage of the dead-letter stream: the cursor stays, and the ladder
// retries.
func (d *deliverer) deadLetterSkip(job pushJob, store streamStore, streamID string, out *deliveryOutcome) {
	f := out.failure
	dec := decideFailure(job.row, *f, itx.OnFailingSkip, 0, 0)
	if dec.kind != decideSkip {
		return
	}
	letter, err := d.deadLetterOf(job, store, streamID, f, dec.failingAttempt)
	if err == nil {
		// Bounded as a delivery is (on the server's clock): a dead-letter stream that does not
		// answer is an outage.
		ctx, cancel := context.WithCancel(d.ctx)
		t := d.srv.clock.AfterFunc(d.srv.cfg.DeliveryTimeout, cancel)
		// Stamped as a copy is, so the dead-letter stream's inbound fence knows the letter once
		// a trim took it (and its key) away: written again after a crash, it is a duplicate. An
		// offset-acking subscription's letters are fenced by the offsets they name and by its
		// confirmed cursor (it sends again from there, so it may skip an event below one it
		// skipped before: see inboundRecord.AckedThrough).
		stamp := &copyStamp{SourcePath: d.ref.Path, Name: d.name, StreamID: streamID, CursorChangedAtOffset: job.row.CursorChangedAtOffset,
			Acking: job.acking, Confirmed: job.row.ConfirmedOffset}
		_, err = d.srv.appendAs(ctx, d.deadLetter, []itx.EventInput{letter}, authCopy, stamp)
		t.Stop()
		cancel()
		if err == nil && deadLetterCommittedHook != nil {
			deadLetterCommittedHook()
		}
	}
	if err != nil {
		if d.ctx.Err() != nil {
			*out = deliveryOutcome{name: out.name, gen: out.gen, birth: out.birth, seek: out.seek} // unknown: redeliver
			return
		}
		// lastError is read by every reader of this stream, among them sessions limited to a
		// prefix that may not hold the dead-letter stream: the config names it, this does not.
		msg := itx.ErrorMessage(err)
		if d.deadLetter.Path != "/" {
			msg = strings.ReplaceAll(msg, d.deadLetter.Path, "the dead-letter stream")
		}
		out.failure = &deliveryFailure{class: classOutage, count: 1, last: f.eventOffset, msg: truncate(fmt.Sprintf(
			"the dead-letter stream refused the letter: %s (the failing event at offset %d waits for it: %s)", msg, f.eventOffset, f.msg), itx.MaxHaltErrorLength)}
		return
	}
	f.deadLettered = true
}

// deadLetterCommittedHook, when set (tests), runs once a dead letter has committed and before the
// skip it allows is taken: a crash there makes the letter's next try a duplicate of it.
var deadLetterCommittedHook func()

// deadLetterOf builds the dead letter of failure f: the event as stored, with its error. An
// event too large to travel inside one keeps only its offset, type and time (it stays readable
// at its offset in the source stream).
func (d *deliverer) deadLetterOf(job pushJob, store streamStore, streamID string, f *deliveryFailure, attempts int) (itx.EventInput, error) {
	events, err := store.Events(d.ctx, storage.Query{After: f.eventOffset - 1, UpTo: f.eventOffset, Limit: 1})
	if err != nil {
		return itx.EventInput{}, fmt.Errorf("reading the failing event: %w", err)
	}
	if len(events) != 1 || events[0].Offset != f.eventOffset {
		return itx.EventInput{}, fmt.Errorf("the failing event at offset %d is not in the log", f.eventOffset)
	}
	// The letter carries the event as the configuring token reads it; its own provenance (below)
	// stays true, as a copy's does, so cycles are found by it.
	shown := events[0]
	if v, changed := itx.ScopedEvent(d.scope, shown); changed {
		shown = v
	}
	// Nor does it carry a webhook's credentials: the letter's readers hold no more than the
	// receiver did.
	if v, changed := itx.RedactedEvent(shown); changed {
		shown = v
	}
	p := itx.DeadLetterPayload{ProjectID: d.ref.ProjectID, StreamID: streamID, Path: d.ref.Path, Subscription: d.name,
		ConfiguredAtOffset: job.row.ConfiguredAtOffset, CursorChangedAtOffset: job.row.CursorChangedAtOffset,
		Offset: f.eventOffset, Attempts: attempts, Error: truncate(f.msg, itx.MaxCursorErrorLength), Event: shown}
	body, err := json.Marshal(p)
	if err != nil {
		return itx.EventInput{}, err
	}
	key, _ := json.Marshal([]any{d.ref.ProjectID, d.ref.Path, streamID, d.name, job.row.ConfiguredAtOffset, job.row.CursorChangedAtOffset, f.eventOffset})
	// The letter comes from this stream as a copy does: a copy of it back here is a cycle, dropped.
	prov := events[0].Provenance
	if len(prov) < itx.MaxProvenanceHops {
		prov = append(append([]itx.Hop{}, prov...), itx.Hop{StreamID: streamID, Path: d.ref.Path, Offset: f.eventOffset,
			Subscription: d.name, CursorChangedAtOffset: job.row.CursorChangedAtOffset, Type: events[0].Type})
	}
	in := itx.EventInput{Type: itx.TypeDeadLetter, Payload: body, IdempotencyKey: internalKey("dead-letter", key), Provenance: prov}
	// An event as deep as an append takes (itx.MaxJSONDepth; one stored before the bound, up to
	// Go's 10,000) is two levels deeper inside the letter, which the dead-letter stream would
	// refuse at every retry until the subscription halted: named, as one too large to fit. (The
	// letter is json.Marshal's output, so its depth is the one way it can be refused.)
	if in.Size() > itx.MaxEventBytes-1024 || itx.JSONDepth(in.Payload) > itx.MaxJSONDepth {
		e := &p.Event
		e.Payload, e.Metadata, e.IdempotencyKey, e.Provenance, p.EventOmitted = json.RawMessage(`{}`), nil, "", nil, true
		if in.Payload, err = json.Marshal(p); err != nil {
			return itx.EventInput{}, err
		}
	}
	return in, nil
}

// try is one delivery try, without the dead letter.
func (d *deliverer) try(job pushJob, store streamStore, streamID string) deliveryOutcome {
	out := deliveryOutcome{name: job.name, gen: job.gen, birth: job.row.ConfiguredAtOffset, seek: job.row.CursorChangedAtOffset,
		acking: job.acking, resets: job.resets}
	after := job.row.ConfirmedOffset
	if job.acking {
		after = job.after
	}
	fail := func(class failureClass, count int, last int64, err error) deliveryOutcome {
		out.failure = &deliveryFailure{class: class, count: count, last: last, msg: err.Error()}
		if count == 1 {
			out.failure.eventOffset = last
		}
		return out
	}
	if d.buildErr != nil {
		return fail(classTerminal, 0, 0, d.buildErr)
	}
	if d.kind == itx.KindProcessorWake {
		return d.wake(job, store, out)
	}
	// The subscription's controls bound what is delivered, so a filter or a transform reads a
	// wider page: events the filter passes over use up neither bound, and the bytes counted are
	// the transformed events'. Without either, what is read is what is delivered.
	limit, maxBytes := job.limit, job.maxBytes
	if d.types != nil || d.condition != nil || d.transform != nil {
		limit, maxBytes = max(limit, itx.DeliveryBatchEvents), max(maxBytes, itx.DeliveryBatchBytes)
	}
	events, scanned, err := d.scan(job, store, after, limit, maxBytes)
	if err != nil {
		if storage.Damaged(err) {
			// The ladder retries it as an outage (the file may be restored); the operator hears.
			d.srv.noteDamaged(d.ref.ProjectID, d.ref.Path, streamID, err)
		}
		return fail(classOutage, 0, 0, err)
	}
	skipped, err := d.skippedAgain(job, store, events)
	if err != nil {
		return fail(classOutage, 0, 0, err)
	}

	var matched []itx.Event
	var failed *expressionFailure
	// busy is an expression the server could not evaluate now (too many evaluations wait for a
	// core): the try stops before busyAt, and the rest waits for a later try as after an outage.
	var busy error
	var busyAt int64
	through, size := scanned, 0
	for i := range events {
		e := &events[i]
		if skipped[e.Offset] {
			continue // skipped already: passed over as the skip passed it
		}
		if d.scope != "" {
			// Configured by a token limited to a prefix: the receiver reads what that token
			// reads. A copy keeps its true provenance (the copy's own readers read it under
			// their scope, and cycles are found by it); events may be shared: never written.
			if v, changed := itx.ScopedEvent(d.scope, *e); changed {
				if d.kind == itx.KindCopyToStream {
					v.Provenance = e.Provenance
				}
				e = &v
			}
		}
		// A receiver is not the stream's administrator: it reads webhooks' credentials (a
		// configured event's header values, its URL's userinfo and query) redacted, whoever
		// configured it, so a subscribe token cannot forward them to itself.
		if v, changed := itx.RedactedEvent(*e); changed {
			e = &v
		}
		if !d.matches(e) {
			continue
		}
		if d.condition != nil {
			ok, err := d.condition.holds(e)
			if errors.Is(err, errJSONataBusy) {
				busy, busyAt = err, e.Offset
				break
			}
			if err != nil && d.ownRecord(e) {
				continue
			}
			if err != nil {
				failed = &expressionFailure{e.Offset, fmt.Errorf("filter condition failed on offset %d: %w", e.Offset, err)}
				break
			}
			if !ok {
				continue
			}
		}
		delivered, measured := *e, *e
		if d.transform != nil {
			shaped, err := d.transform.apply(e)
			if errors.Is(err, errJSONataBusy) {
				busy, busyAt = err, e.Offset
				break
			}
			if err != nil && d.ownRecord(e) {
				continue
			}
			if err != nil {
				failed = &expressionFailure{e.Offset, fmt.Errorf("transform failed on offset %d: %w", e.Offset, err)}
				break
			}
			// A copy shapes its own again (its hop records the source event), but is measured
			// as it will be delivered: by this same shaping.
			if measured = shaped; d.kind != itx.KindCopyToStream {
				delivered = shaped
			}
		}
		n := deliveredSize(&measured)
		if len(matched) > 0 && size+n > job.maxBytes { // the first event always goes
			through = e.Offset - 1
			break
		}
		size += n
		matched = append(matched, delivered)
		if len(matched) == job.limit {
			through = e.Offset
			break
		}
	}
	if failed != nil {
		through = failed.offset - 1
	}
	if busy != nil {
		through = busyAt - 1
		if len(matched) == 0 && through <= after {
			return fail(classOutage, 0, 0, fmt.Errorf("could not evaluate the subscription's expressions on offset %d now: %w", busyAt, busy))
		}
	}
	if len(matched) > 0 {
		batch := &itx.DeliveryBatch{DeliveryEnvelope: itx.DeliveryEnvelope{
			ProjectID: d.ref.ProjectID, StreamID: streamID, Path: d.ref.Path, Subscription: d.name,
			ConfiguredAtOffset: job.row.ConfiguredAtOffset, CursorChangedAtOffset: job.row.CursorChangedAtOffset,
			Attempt: job.row.Attempt + 1, HeadOffset: job.head,
		}, Events: matched}
		// Named by the events it carries, not by how far the scan read: a retry of the same events
		// keeps its id (webhook-id) even when events the filter passes over were appended since.
		batch.DeliveryID = deliveryID(batch.StreamID, d.name, job.row.CursorChangedAtOffset, matched[0].Offset, matched[len(matched)-1].Offset)
		confirmed, err := d.sendWithTimeout(batch)
		var ef *expressionFailure
		switch {
		case errors.As(err, &ef):
			// The receiver's own shaping failed on one event after taking every event of the
			// batch before it (confirmed, when there were any): the cursor may move to just
			// before it, over what the filter passed too, and the failure is that event's. Only
			// a copy shapes on its side, and a copy is never offset-acking.
			failed, through = ef, ef.offset-1
			if through > after {
				out.through, out.delivered = through, confirmed > after
			}
		case err != nil:
			if d.ctx.Err() != nil {
				return out // unloading or replaced: the outcome is unknown, so the events redeliver
			}
			last := matched[len(matched)-1].Offset
			out.failure = &deliveryFailure{class: classify(err), count: len(matched), last: last, msg: err.Error(), mount: reachedMount(err),
				retryAfter: retryAfterOf(err)}
			out.before = after
			if len(matched) == 1 {
				out.failure.eventOffset = last
			}
			return out
		case job.acking:
			// Delivered; confirmed only through what the answer names (0: nothing yet).
			out.through, out.delivered, out.lastEvent = through, true, matched[len(matched)-1].Offset
			for _, e := range matched {
				out.offsets = append(out.offsets, e.Offset)
			}
			out.confirmed = min(confirmed, through)
		case confirmed > 0 && confirmed <= after:
			return fail(classOutage, 0, 0, fmt.Errorf("%s confirmed through offset %d, no progress past the cursor at %d", d.send, confirmed, after))
		default:
			if confirmed > 0 && confirmed < through {
				through = confirmed // an offset-acking receiver took only part: the rest redelivers
			}
			out.through, out.delivered = through, true
		}
	} else if through > after {
		out.through = through
	}
	if failed != nil && through == failed.offset-1 {
		out.failure = &deliveryFailure{class: classEvent, count: 1, last: failed.offset, eventOffset: failed.offset, expression: true, msg: failed.Error()}
		out.before = after
		if len(matched) > 0 {
			out.before = through // the events it carried before the failing one were taken
		}
	}
	return out
}

// skippedAgain is, for an offset-acking subscription sending again from its confirmed cursor
// (after a failure, a new mount of its receiver, a restart), the offsets among events it skipped
// already under its epochs: their skip records are in the log (skipRecordKind). They are not sent
// again: the receiver refused them, the ladder passed them and their letters are written. Before,
// each went once more, to be refused again and passed then (skippedAlready): a receiver that had
// no way to take it saw it anew after every restart.
func (d *deliverer) skippedAgain(job pushJob, store streamStore, events []itx.Event) (map[int64]bool, error) {
	if !job.acking {
		return nil, nil
	}
	var keys []string
	offsets := map[string]int64{}
	for i := range events {
		o := events[i].Offset
		if o > job.row.DeliveredOffset {
			break // never delivered, so never skipped
		}
		if !d.matches(&events[i]) {
			continue
		}
		k := recordKey(skipRecordKind, d.name, job.row.ConfiguredAtOffset, job.row.CursorChangedAtOffset, o)
		keys, offsets[k] = append(keys, k), o
	}
	if len(keys) == 0 {
		return nil, nil
	}
	found, err := store.EventsByKeys(d.ctx, keys)
	if err != nil {
		return nil, fmt.Errorf("reading skip records: %w", err)
	}
	skipped := map[int64]bool{}
	for k, e := range found {
		if e != nil {
			skipped[offsets[k]] = true
		}
	}
	return skipped, nil
}

// scan reads a push's durable events after after, up to the head, at most limit events and
// maxBytes, and returns the offset the read covers: the head unless the page filled
// up. Everything scanned that does not match still advances the cursor (the filter makes it a
// watermark). At the tail it serves the last commit's events from memory.
func (d *deliverer) scan(job pushJob, store streamStore, after int64, limit, maxBytes int) ([]itx.Event, int64, error) {
	scanned := job.head
	events, ok := durableFrom(job.recent, after, job.head, limit)
	if ok {
		if len(events) == limit {
			scanned = events[len(events)-1].Offset
		}
	} else {
		// Bounded by bytes too: capBytes keeps no more than that.
		q := storage.Query{After: after, UpTo: job.head, Limit: limit, MaxBytes: maxBytes}
		var err error
		if events, err = store.Events(d.ctx, q); err != nil {
			return nil, 0, fmt.Errorf("reading events: %w", err)
		}
		if q.Cut(events) {
			scanned = events[len(events)-1].Offset
		}
	}
	events, scanned = capBytes(events, scanned, maxBytes)
	return events, scanned, nil
}

// durableFrom serves a push at the tail from the last commit's events when they are exactly what
// follows the cursor, up to the head: the durable ones, at most limit, as reading the log would.
func durableFrom(recent []itx.Event, after, head int64, limit int) ([]itx.Event, bool) {
	if len(recent) == 0 || recent[0].Offset != after+1 || recent[len(recent)-1].Offset != head {
		return nil, false
	}
	out := make([]itx.Event, 0, min(len(recent), limit))
	for _, e := range recent {
		if !e.Ephemeral {
			out = append(out, e)
			if len(out) == limit {
				break
			}
		}
	}
	return out, true
}

// ownRecord reports whether e is a record the server wrote on this stream about this very
// subscription's failures: the evidence of an expression that failed on an event, a skip, a
// halt. A filter condition or transform that fails on one of them passes over it instead of
// making it a failing event of its own: each failure would otherwise write another record to
// fail on, and under "skip" the subscription's own evidence would spend its consecutive-skip
// fuse and halt it. (Clients cannot write these: the halt type and the internal keys are the
// server's.)
func (d *deliverer) ownRecord(e *itx.Event) bool {
	if len(e.Provenance) > 0 {
		return false // a copy of another stream's record
	}
	switch e.Type {
	case itx.TypeSubscriptionHalted:
		var p itx.HaltedPayload
		return json.Unmarshal(e.Payload, &p) == nil && p.Name == d.name
	case itx.TypeErrorOccurred:
		own := false
		for _, kind := range []string{"subscription-expression-failed", skipRecordKind} {
			k := itx.InternalKeyPrefix + kind
			own = own || strings.HasPrefix(e.IdempotencyKey, k+":") || strings.HasPrefix(e.IdempotencyKey, k+"#")
		}
		var p itx.ErrorOccurredPayload
		return own && json.Unmarshal(e.Payload, &p) == nil && strings.HasPrefix(p.Message, fmt.Sprintf("subscription %q", d.name))
	}
	return false
}

func (d *deliverer) matches(e *itx.Event) bool {
	if e.Ephemeral || (d.types != nil && !d.types[e.Type]) {
		return false
	}
	return true
}

// deliveredSize is what an event counts toward maxDeliveryBytes: its type, payload and metadata
// plus a fixed allowance for the envelope fields.
func deliveredSize(e *itx.Event) int { return len(e.Payload) + len(e.Metadata) + len(e.Type) + 64 }

// capBytes keeps a batch within maxBytes (the first event always goes) and returns the offset
// the kept part covers.
func capBytes(events []itx.Event, scanned int64, maxBytes int) ([]itx.Event, int64) {
	total := 0
	for i := range events {
		total += deliveredSize(&events[i])
		if total > maxBytes && i > 0 {
			return events[:i], events[i-1].Offset
		}
	}
	return events, scanned
}

func deliveryID(streamID, name string, seek, first, through int64) string {
	b, _ := json.Marshal([]any{streamID, name, seek, first, through})
	return "delivery:" + string(b)
}

// bounded is a sender whose sends take a slot of a channel shared across subscriptions.
type bounded interface{ inFlight() chan struct{} }

// sendWithTimeout sends within the delivery timeout on the injected clock. A send that does not
// return by then is abandoned, not awaited: a receiver whose connection stopped reading blocks
// the write itself, whatever its context says. The next try writes only once that send has
// returned, so at most one abandoned send exists per subscription: it waits for it within a
// delivery timeout of its own, and fails as an outage if it is still blocked then. (Usually the
// abandoned send is returning already, its context cancelled with its deadline: failing at once
// would take that for a receiver still blocked, and burn an attempt on a backoff. A receiver
// replaced under its name meanwhile would wait that backoff out instead of being delivered to.)
func (d *deliverer) sendWithTimeout(batch *itx.DeliveryBatch) (int64, error) {
	if d.stuck != nil {
		waited := make(chan struct{})
		t := d.srv.clock.AfterFunc(d.srv.cfg.DeliveryTimeout, func() { close(waited) })
		select {
		case <-d.stuck:
			t.Stop()
			d.stuck = nil
		case <-waited:
			return 0, itx.Errorf(itx.EDeadlineExceeded, "%s %q: the previous push is still blocked writing to the receiver", d.send, d.name)
		case <-d.ctx.Done():
			t.Stop()
			return 0, itx.Errorf(itx.ECancelled, "%s %q: %v", d.send, d.name, d.ctx.Err())
		}
	}
	if b, ok := d.send.(bounded); ok {
		// A sender whose every request holds a socket (webhooks) takes a slot of a bound shared
		// by all subscriptions. A delivery waits for one before its timeout starts (waiting
		// holds no socket, and at most one waits per subscription).
		// First one of the project's own slots (its share of the bound), then one of the
		// server's: a project whose receivers hang holds at most its share, and the other
		// projects' deliveries find the rest free instead of queueing behind its own.
		own := d.srv.webhookSlots(d.ref.ProjectID)
		select {
		case own <- struct{}{}:
		default:
			d.srv.shareFull(d.ref.ProjectID, flagWebhookShare, cap(own))
			select {
			case own <- struct{}{}:
			case <-d.ctx.Done():
				return 0, itx.Errorf(itx.ECancelled, "%s %q: %v", d.send, d.name, d.ctx.Err())
			}
		}
		defer func() {
			<-own
			if len(own) <= cap(own)/2 {
				d.srv.shareFree(d.ref.ProjectID, flagWebhookShare)
			}
		}()
		slots := b.inFlight()
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
		case <-d.ctx.Done():
			return 0, itx.Errorf(itx.ECancelled, "%s %q: %v", d.send, d.name, d.ctx.Err())
		}
	}
	ctx, cancel := context.WithCancel(d.ctx)
	timedOut := make(chan struct{})
	// A timeout is the receiver's failure like any other it answers: it names the mount it
	// reached, so that once another receiver is mounted under the name it is no verdict on the
	// events (see applyOutcome). A provider that vanished without its connection ending fails
	// its calls this way.
	d.reached.Store(0)
	timeout := func() error {
		err := itx.Errorf(itx.EDeadlineExceeded, "%s %q timed out after %s", d.send, d.name, d.srv.cfg.DeliveryTimeout)
		if g := d.reached.Load(); g != 0 {
			return fromMount(g, err)
		}
		return err
	}
	t := d.srv.clock.AfterFunc(d.srv.cfg.DeliveryTimeout, func() { close(timedOut); cancel() })
	defer t.Stop()
	type result struct {
		confirmed int64
		err       error
	}
	done := make(chan struct{})
	var res result
	go func() {
		defer close(done)
		defer cancel()
		res.confirmed, res.err = d.send.send(ctx, d, batch)
	}()
	select {
	case <-done:
		select {
		case <-timedOut:
			return 0, timeout()
		default:
		}
		return res.confirmed, res.err
	case <-timedOut:
		d.stuck = done
		return 0, timeout()
	case <-d.ctx.Done():
		d.stuck = done
		return 0, itx.Errorf(itx.ECancelled, "%s %q: %v", d.send, d.name, d.ctx.Err())
	}
}

// applyTransform runs a JSONata transform over an event. The result must be an object; its
// type, payload and metadata replace the event's, and whatever it omits is kept. Offsets,
// times, keys and provenance always stay the source's.
func applyTransform(project string, expr *jsonata.Expr, e *itx.Event) (itx.Event, error) {
	res, err := evalJSONata(project, expr, e)
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
