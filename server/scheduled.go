package server

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

// Scheduled appends (durable timers): an event a caller hands the stream now for it to append
// at a later time. Each is named by its idempotency key and kept with the stream's state, so it
// survives unloads, crashes and restarts; the commit that appends it deletes its row, and the
// key dedupes the event itself, so it lands exactly once. The directory alarm loads an unloaded
// stream when one is due.

// DefaultMaxScheduledPerStream bounds the scheduled appends one stream holds.
const DefaultMaxScheduledPerStream = itx.MaxScheduledPerStream

// scheduleOp schedules (or reschedules) an event, or cancels one by key.
type scheduleOp struct {
	key    string
	input  *itx.EventInput // nil: cancel key
	dueAt  int64           // epoch ms
	reply  chan scheduleReply
	queued time.Time
}

type scheduleReply struct {
	dueAt    int64 // when it will be appended
	appended int64 // the key is already in the log at this offset: nothing was scheduled
	found    bool  // a cancel found the key
	err      error
}

// scheduled is one pending scheduled append as memory keeps it: its key and time. Its event
// stays on disk until it lands (ten thousand of up to 1 MiB each would not fit in memory).
type scheduled struct {
	Key   string
	DueAt int64
}

// Schedule asks the stream to append input at dueAt (epoch ms; a time already past means at
// once). The input's idempotency key names it: scheduling the key again moves it (its time and
// event); a key already in the log schedules nothing and returns its offset, or, when the log holds
// it with another body, fails with EIdempotencyConflict as an append of the key would.
func (s *Server) Schedule(ctx context.Context, ref StreamRef, input itx.EventInput, dueAt int64) (due, appended int64, err error) {
	p, err := s.StartSchedule(ctx, ref, input, dueAt)
	if err != nil {
		return 0, 0, err
	}
	return p.WaitSchedule(ctx)
}

// StartSchedule validates a schedule and queues it on the stream (see Schedule). Schedule and
// cancel operations queued on one stream apply in queue order: the caller may release its RPC
// call queue (call.Go) only after this returns, so a key scheduled twice in a row is moved to
// the later time, and a cancel sent after a schedule cancels it.
func (s *Server) StartSchedule(ctx context.Context, ref StreamRef, input itx.EventInput, dueAt int64) (*PendingSchedule, error) {
	op, err := newScheduleOp(input, dueAt)
	if err != nil {
		return nil, err
	}
	if err := serverWritten(ref); err != nil {
		return nil, err
	}
	return s.startScheduleOp(ctx, ref, op)
}

// newScheduleOp checks a scheduled event as an append is checked, and more: it needs a key, and
// cannot be ephemeral or a stream/* record.
func newScheduleOp(input itx.EventInput, dueAt int64) (scheduleOp, error) {
	// What no scheduled event may be is said first: the append's own checks would refuse an
	// ephemeral one for the key it must carry, and a stream/* record for its payload.
	switch {
	case input.Ephemeral:
		return scheduleOp{}, itx.Errorf(itx.EInvalid, "a scheduled event cannot be ephemeral")
	case itx.IsCoreType(input.Type):
		return scheduleOp{}, itx.Errorf(itx.EInvalid, "a scheduled event cannot be a stream/* record")
	}
	in := []itx.EventInput{input}
	if err := validateAppend(in, authClient); err != nil {
		return scheduleOp{}, itx.Errorf(itx.AsError(err).Code, "%s", strings.TrimPrefix(itx.ErrorMessage(err), "event 0: "))
	}
	input = in[0] // normalized
	switch {
	case input.IdempotencyKey == "":
		return scheduleOp{}, itx.Errorf(itx.EInvalid, "a scheduled event needs an idempotencyKey: it names the schedule, and makes its append exactly once")
	case dueAt < 0:
		return scheduleOp{}, itx.Errorf(itx.EInvalid, "dueAt must be an epoch time in milliseconds")
	}
	return scheduleOp{key: input.IdempotencyKey, input: &input, dueAt: dueAt}, nil
}

// CancelScheduled drops the scheduled append named key, reporting whether there was one.
func (s *Server) CancelScheduled(ctx context.Context, ref StreamRef, key string) (bool, error) {
	p, err := s.StartCancelScheduled(ctx, ref, key)
	if err != nil {
		return false, err
	}
	return p.WaitCancel(ctx)
}

// StartCancelScheduled queues a cancel on the stream, as StartSchedule does a schedule.
func (s *Server) StartCancelScheduled(ctx context.Context, ref StreamRef, key string) (*PendingSchedule, error) {
	// Trimmed as an idempotency key is when an event is scheduled, so the key as given to
	// schedule names the same schedule here.
	if key = strings.TrimSpace(key); key == "" {
		return nil, itx.Errorf(itx.EInvalid, "cancelScheduled needs the event's idempotencyKey")
	}
	return s.startScheduleOp(ctx, ref, scheduleOp{key: key})
}

// PendingSchedule is a schedule or cancel queued on its stream's actor.
type PendingSchedule struct {
	srv *Server
	a   *actor
	op  *scheduleOp
}

func (s *Server) startScheduleOp(ctx context.Context, ref StreamRef, op scheduleOp) (*PendingSchedule, error) {
	if err := itx.ValidatePath(ref.Path); err != nil {
		return nil, err
	}
	a, err := s.acquire(ctx, ref)
	if err != nil {
		return nil, err
	}
	op.reply, op.queued = make(chan scheduleReply, 1), time.Now()
	select {
	case a.inbox <- &actorMsg{schedule: &op}:
	case <-ctx.Done():
		s.release(a)
		return nil, itx.Errorf(itx.ECancelled, "schedule: %v", ctx.Err())
	}
	return &PendingSchedule{srv: s, a: a, op: &op}, nil
}

func (p *PendingSchedule) wait(ctx context.Context) (scheduleReply, error) {
	select {
	case r := <-p.op.reply:
		p.srv.release(p.a)
		return r, r.err
	case <-ctx.Done():
		// Keep the reference until the actor answers, so the stream is not unloaded under it.
		go func() { <-p.op.reply; p.srv.release(p.a) }()
		return scheduleReply{}, itx.Errorf(itx.ECancelled, "schedule: %v", ctx.Err())
	}
}

// WaitSchedule waits for a schedule's commit: its due time, or the offset its key already holds.
func (p *PendingSchedule) WaitSchedule(ctx context.Context) (due, appended int64, err error) {
	r, err := p.wait(ctx)
	return r.dueAt, r.appended, err
}

// WaitCancel waits for a cancel's commit: whether there was a scheduled append to cancel.
func (p *PendingSchedule) WaitCancel(ctx context.Context) (bool, error) {
	r, err := p.wait(ctx)
	return r.found, err
}

// schedule hands the actor a schedule operation and waits for its commit (the caller holds the
// actor).
func (a *actor) schedule(ctx context.Context, op scheduleOp) (scheduleReply, error) {
	op.reply, op.queued = make(chan scheduleReply, 1), time.Now()
	select {
	case a.inbox <- &actorMsg{schedule: &op}:
	case <-ctx.Done():
		return scheduleReply{}, itx.Errorf(itx.ECancelled, "schedule: %v", ctx.Err())
	}
	select {
	case r := <-op.reply:
		return r, r.err
	case <-ctx.Done():
		return scheduleReply{}, itx.Errorf(itx.ECancelled, "schedule: %v", ctx.Err())
	}
}

// ListScheduled lists a stream's pending scheduled appends in due order: the first
// itx.MaxPageLimit, ending after the one that brings their events to itx.MaxPageBytes.
func (s *Server) ListScheduled(ctx context.Context, ref StreamRef) ([]itx.ScheduledEvent, error) {
	var out []itx.ScheduledEvent
	err := s.withView(ctx, ref, false, func(v view) error {
		if v.store == nil || v.scheduled == 0 {
			return nil
		}
		rows, err := v.store.ScheduledEvents(ctx, itx.MaxPageLimit, itx.MaxPageBytes)
		if err != nil {
			return itx.Errorf(itx.EUnavailable, "list scheduled events: %v", err)
		}
		for _, r := range rows {
			sc := itx.ScheduledEvent{DueAt: r.DueAt}
			var err error
			if sc.Event, err = unmarshalScheduled(r.Event); err != nil {
				return itx.Errorf(itx.EInternal, "scheduled event %q does not decode: %v", r.Key, err)
			}
			out = append(out, sc)
		}
		return nil
	})
	return out, err
}

// applySchedule takes one schedule or cancel into the state and stages its write.
func (st *streamState) applySchedule(op scheduleOp, env stepEnv, eff *effects) scheduleReply {
	if op.input == nil {
		if _, ok := st.scheduled[op.key]; !ok {
			return scheduleReply{}
		}
		delete(st.scheduled, op.key)
		st.firstDue = -1
		// A commit deletes before it upserts: a schedule of this key staged earlier in this
		// step must go too, or the cancelled append would stay on disk (and land after a reload).
		eff.commit.ScheduledUpserts = dropScheduled(eff.commit.ScheduledUpserts, op.key)
		eff.commit.ScheduledDeletes = append(eff.commit.ScheduledDeletes, op.key)
		return scheduleReply{found: true}
	}
	if !st.born {
		return scheduleReply{err: itx.Errorf(itx.ENotFound, "the stream does not exist yet (a stream exists from its first commit: an append, or a reader's registration)")}
	}
	committed, err := env.lookupKeys([]string{op.key})
	if err != nil {
		return scheduleReply{err: itx.Errorf(itx.EUnavailable, "schedule: %v", err)}
	}
	// A key already in the log answers as an append of the key would: the same body names its
	// offset, another body is a conflict (else a caller whose body changed would be told its
	// event is in the log when the log holds another).
	prior := committed[op.key]
	if prior == nil {
		// This step's own events are not committed yet: the key may be landing in this very step
		// (it came due as the call arrived), or be appended by a call taken with it.
		for i := range eff.commit.Events {
			if e := &eff.commit.Events[i]; e.IdempotencyKey == op.key {
				prior = e
				break
			}
		}
	}
	if prior != nil {
		if !itx.SameBody(prior, op.input) {
			return scheduleReply{err: itx.Errorf(itx.EIdempotencyConflict,
				"idempotency key %q is already used by offset %d with a different body", op.key, prior.Offset)}
		}
		return scheduleReply{appended: prior.Offset}
	}
	if _, ok := st.scheduled[op.key]; !ok && env.maxScheduled > 0 && len(st.scheduled) >= env.maxScheduled {
		return scheduleReply{err: itx.Errorf(itx.ELimitExceeded,
			"a stream holds at most %d scheduled events (--max-scheduled-per-stream)", env.maxScheduled)}
	}
	if _, ok := st.scheduled[op.key]; !ok && env.room != nil {
		if err := env.room(); err != nil {
			return scheduleReply{err: err} // a new one takes room; moving one does not
		}
	}
	raw := marshalScheduled(op.input)
	st.scheduled[op.key] = &scheduled{Key: op.key, DueAt: op.dueAt}
	st.firstDue = -1
	eff.commit.ScheduledUpserts = append(dropScheduled(eff.commit.ScheduledUpserts, op.key), storage.Scheduled{Key: op.key, DueAt: op.dueAt, Event: raw})
	return scheduleReply{dueAt: op.dueAt}
}

// scheduledRow is a scheduled event's row: the event with its payload and metadata as JSON
// strings, kept byte for byte (json.Marshal copies a json.RawMessage HTML-escaped: '<' came
// back as \u003c) and at no added depth. Held as values inside the event's object they sat one
// level deeper than the payload: before itx.MaxJSONDepth, a payload at Go's 10,000-level limit
// made a row that did not decode, so listScheduled failed and, once it came due, every step of
// its stream. Rows written before hold "payload" and "metadata" as values, and decode as they
// did (such a deep one still does not).
type scheduledRow struct {
	itx.EventInput
	PayloadText  *string `json:"payloadText,omitempty"`
	MetadataText *string `json:"metadataText,omitempty"`
}

// marshalScheduled encodes a scheduled event for its row.
func marshalScheduled(in *itx.EventInput) []byte {
	row := scheduledRow{EventInput: *in}
	payload, metadata := string(in.Payload), string(in.Metadata)
	row.Payload, row.PayloadText = nil, &payload
	if len(in.Metadata) > 0 {
		row.Metadata, row.MetadataText = nil, &metadata
	}
	raw, _ := json.Marshal(row) // always encodes: strings, numbers and validated provenance
	return raw
}

// unmarshalScheduled decodes a scheduled event's row, of either form.
func unmarshalScheduled(raw []byte) (itx.EventInput, error) {
	var row scheduledRow
	if err := json.Unmarshal(raw, &row); err != nil {
		return itx.EventInput{}, err
	}
	if row.PayloadText != nil {
		row.Payload = json.RawMessage(*row.PayloadText)
	}
	if row.MetadataText != nil {
		row.Metadata = json.RawMessage(*row.MetadataText)
	}
	return row.EventInput, nil
}

// dropScheduled removes the staged upserts of key.
func dropScheduled(ups []storage.Scheduled, key string) []storage.Scheduled {
	out := ups[:0]
	for _, u := range ups {
		if u.Key != key {
			out = append(out, u)
		}
	}
	return out
}

// dueScheduled returns the scheduled appends due at nowMs, in due order, and the earliest time
// of those not due (0: none).
func (st *streamState) dueScheduled(nowMs int64) (due []*scheduled, next int64) {
	for _, sc := range st.scheduled {
		if sc.DueAt <= nowMs {
			due = append(due, sc)
		} else if next == 0 || sc.DueAt < next {
			next = sc.DueAt
		}
	}
	sort.Slice(due, func(i, j int) bool {
		if due[i].DueAt != due[j].DueAt {
			return due[i].DueAt < due[j].DueAt
		}
		return due[i].Key < due[j].Key
	})
	return due, next
}

// scheduledRetry is how long a due scheduled append the circuit breaker refused waits.
const scheduledRetry = time.Second

// loadScheduled reads the pending scheduled appends' keys and times into st.
func loadScheduled(ctx context.Context, store streamStore, st *streamState) error {
	rows, err := store.ScheduledDue(ctx)
	if err != nil {
		return err
	}
	for _, r := range rows {
		st.scheduled[r.Key] = &scheduled{Key: r.Key, DueAt: r.DueAt}
	}
	st.firstDue = -1
	return nil
}

// earliestDue is the earliest DueAt of the pending scheduled appends (0 when there are none;
// callers check len(st.scheduled) first, since 0, the epoch, is also a time one may be due at),
// recomputed only after they changed, so a step of a stream holding many costs nothing until
// one is due.
func (st *streamState) earliestDue() int64 {
	if st.firstDue >= 0 {
		return st.firstDue
	}
	first, seen := int64(0), false
	for _, sc := range st.scheduled {
		if !seen || sc.DueAt < first {
			first, seen = sc.DueAt, true
		}
	}
	st.firstDue = first
	return first
}

func scheduledKeys(list []*scheduled) []string {
	out := make([]string, len(list))
	for i, sc := range list {
		out[i] = sc.Key
	}
	return out
}
