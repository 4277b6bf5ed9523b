package server

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

// AuditStreamTrimmed records a Stream.trim that deleted events in the deployment's AuditPath.
const AuditStreamTrimmed = "admin/stream-trimmed"

// trimChunkEvents is how many events one trim transaction deletes: a trim of millions goes a
// chunk at a time, the stream's other work (appends, deliveries) taking turns between chunks.
const trimChunkEvents = 5000

// trimChunkCommittedHook, when set (tests), runs after each trim chunk that deleted events
// committed, before the next.
var trimChunkCommittedHook func()

// trimAuditedHook, when set (tests), runs once a trim's audit record is in the deployment's
// audit stream, before the stream forgets its pending copy (auditPendingKey).
var trimAuditedHook func()

// trimReq is a Stream.trim under way on the actor.
type trimReq struct {
	through       int64 // 0: no offset bound
	createdBefore int64 // epoch ms; 0: no time bound (resolved to an offset by the first chunk)
	deleted       int64 // so far, over its chunks
	reply         chan trimReply
	auto          bool // the stream's retention policy (applyRetention): nobody waits for it
	// more: the policy's size bound read only sizeScanRows of the events it would trim: once
	// this trim reaches its end, another pass follows at once.
	more    bool
	started bool // its first chunk ran (counted in actor.trims)
	// audit is the trim's admin/stream-trimmed record (nil: a retention policy's trim), its
	// payload auditFields with what was deleted so far: each chunk commits it pending in the
	// stream (auditPendingKey), so a crash between the chunks, or after the last one, cannot
	// lose it.
	audit       *storage.AuditRecord
	auditFields map[string]any
}

type trimReply struct {
	trimmed, deleted int64
	err              error
	audited          <-chan struct{} // closed once the trim's audit record was appended (or failed)
}

// TrimResult answers Stream.trim.
type TrimResult struct {
	TrimmedThrough int64 // how far the stream is trimmed now
	Deleted        int64 // the events this call deleted
}

// TrimStream deletes a stream's events through an offset and/or created before a time (epoch
// ms; 0: no such bound, at least one needed), except its stream/* records, never past what every
// consumer holds (durableFloor). Offsets are never reissued; reads pass the gap. It needs the
// stream to exist.
func (s *Server) TrimStream(ctx context.Context, by Admin, ref StreamRef, through, createdBefore int64) (TrimResult, error) {
	if err := itx.ValidatePath(ref.Path); err != nil {
		return TrimResult{}, err
	}
	switch {
	case through < 0:
		return TrimResult{}, itx.Errorf(itx.EInvalid, "throughOffset %d is negative", through)
	case createdBefore < 0:
		return TrimResult{}, itx.Errorf(itx.EInvalid, "createdBefore %d is negative", createdBefore)
	case through == 0 && createdBefore == 0:
		return TrimResult{}, itx.Errorf(itx.EInvalid, "trim needs throughOffset, createdBefore or both")
	}
	a, err := s.acquire(ctx, ref)
	if err != nil {
		return TrimResult{}, err
	}
	defer s.release(a)
	if a.view().streamID == "" {
		return TrimResult{}, itx.Errorf(itx.ENotFound, "no stream %s", ref.Path)
	}
	// The record is made before the trim and committed with each of its chunks (trimReq.audit).
	fields := map[string]any{"projectId": ref.ProjectID, "path": ref.Path}
	rec, err := auditRecord(by, AuditStreamTrimmed, fields)
	if err != nil {
		return TrimResult{}, err
	}
	r := &trimReq{through: through, createdBefore: createdBefore, reply: make(chan trimReply, 1), audit: rec, auditFields: fields}
	a.post(actorMsg{trim: r})
	select {
	case rep := <-r.reply:
		if rep.audited != nil {
			<-rep.audited // in /audit when the call answers (or pending, appended at the next load)
		}
		return TrimResult{TrimmedThrough: rep.trimmed, Deleted: rep.deleted}, rep.err
	case <-a.done:
		return TrimResult{}, a.ended()
	case <-ctx.Done():
		// The chunks committed stay trimmed; the rest goes on while the stream stays loaded
		// (a trim again answers where it stands).
		return TrimResult{}, itx.Errorf(itx.ECancelled, "trim of %s: %v", ref.Path, ctx.Err())
	}
}

// trimChunk deletes one chunk of a trim on the actor, between two commits, and queues the next
// one behind what is waiting, or answers.
func (a *actor) trimChunk(r *trimReq) {
	if !r.started {
		r.started = true
		a.trims++
	}
	answer := func(err error) {
		if a.trims--; a.trims == 0 {
			a.vacuumSoon() // once no trim is under way: see vacuumChunk
		}
		if a.store != nil {
			a.noteOldFileTrimmed(r.deleted)
		}
		if r.auto {
			a.autoTrimming = false
			if err != nil {
				a.srv.log.Warn().Err(err).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg("the stream's retention policy could not trim it (tried again later)")
			}
			a.armRetention()
			if err == nil && r.more && a.st.trimmed >= r.through { // not when a consumer held it back
				a.applyRetention(a.srv.clock.Now())
			}
			return
		}
		rep := trimReply{trimmed: a.st.trimmed, deleted: r.deleted, err: err}
		if r.audit != nil && r.deleted > 0 {
			rep.audited = a.appendTrimAudit(*r.audit)
		}
		r.reply <- rep
	}
	if a.store == nil {
		answer(itx.Errorf(itx.ENotFound, "no stream %s", a.ref.Path))
		return
	}
	if r.auto && r.through == 0 {
		if a.st.retention.MaxBytes > 0 && !a.trimmableKnown {
			done, err := a.measureTrimmable()
			if err != nil {
				answer(itx.Errorf(storage.ErrorCode(err), "retention of %s: %v", a.ref.Path, err))
				return
			}
			if !done {
				go a.post(actorMsg{trim: r}) // the next chunk after what is queued now
				return
			}
		}
		through, more, err := a.retentionThrough()
		r.more = more
		if err != nil {
			answer(itx.Errorf(storage.ErrorCode(err), "retention of %s: %v", a.ref.Path, err))
			return
		}
		if r.through = through; through == 0 {
			answer(nil) // the policy keeps everything, or was cleared meanwhile
			return
		}
	}
	if r.through == 0 {
		r.through = a.st.head
	}
	if r.createdBefore > 0 {
		last, err := a.store.LastCreatedBefore(context.Background(), r.createdBefore)
		if err != nil {
			answer(itx.Errorf(storage.ErrorCode(err), "trim of %s: %v", a.ref.Path, err))
			return
		}
		r.through, r.createdBefore = min(r.through, last), 0 // resolved once: the next chunks keep it
	}
	target := min(r.through, a.durableFloor())
	if target <= a.st.trimmed {
		answer(nil)
		return
	}
	var note func(deleted, reached int64) map[string][]byte
	var pending []storage.AuditRecord
	if r.audit != nil {
		if !a.st.alarmSet {
			// As for a retention policy: due now while loaded, and set before the chunk commits
			// the record, so a crash after it leaves a load owed, which appends it.
			if err := a.srv.dir.SetAlarm(context.Background(), a.st.streamID, itx.UnixMilli(a.srv.clock.Now())); err == nil {
				a.st.alarmSet = true
			} else {
				a.srv.log.Warn().Err(err).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg("the stream's alarm not set for a trim's audit record (appended at its next load)")
			}
		}
		note = func(deleted, reached int64) map[string][]byte {
			if r.deleted+deleted == 0 {
				return nil // nothing deleted yet: nothing to record
			}
			r.auditFields["trimmedThrough"], r.auditFields["deleted"] = reached, r.deleted+deleted
			rec := *r.audit
			rec.Payload, _ = json.Marshal(r.auditFields)
			pending = slices.DeleteFunc(slices.Clone(a.pendingAudits), func(p storage.AuditRecord) bool { return p.ID == rec.ID })
			pending = append(pending, rec)
			b, _ := json.Marshal(pending)
			return map[string][]byte{auditPendingKey: b}
		}
	}
	n, reached, bytes, err := a.store.TrimNoting(context.Background(), target, trimChunkEvents, note)
	if err != nil {
		answer(itx.Errorf(storage.ErrorCode(err), "trim of %s: %v", a.ref.Path, err))
		return
	}
	if pending != nil {
		a.pendingAudits = pending
		r.audit.Payload = pending[len(pending)-1].Payload
	}
	if trimChunkCommittedHook != nil && n > 0 {
		trimChunkCommittedHook()
	}
	r.deleted += n
	a.trimmable -= bytes
	if a.sizeScan != nil && n > 0 {
		// Deleted under the measure (a Stream.trim between its chunks): some of it was not read
		// yet, so the measure starts over at the policy's next pass.
		a.sizeScan, a.trimmableKnown = nil, false
	}
	a.srv.metrics.TrimmedEvents.Add(float64(n))
	if reached > a.st.trimmed {
		a.st.trimmed = reached
		a.publish(false) // describe shows the reach
	}
	if reached < target {
		go a.post(actorMsg{trim: r}) // after what is queued now (an unload ends it: post returns)
		return
	}
	answer(nil)
}

// appendTrimAudit appends a trim's audit record, pending in the stream since its chunks
// (trimReq.audit), to the deployment's audit stream on its own goroutine, then has the actor
// forget it: the returned channel closes once it is done, or failed (the record then stays
// pending, appended at the stream's next load; its id keys the event, so a record appended
// before a crash kept it pending is a duplicate then). Actor goroutine only.
func (a *actor) appendTrimAudit(rec storage.AuditRecord) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := a.srv.appendAudit(a.srv.base, &rec); err != nil {
			if a.srv.base.Err() == nil {
				a.srv.log.Error().Err(err).Str("type", rec.Type).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg("could not record an audit event (it is appended when the stream next loads)")
			}
			return
		}
		if trimAuditedHook != nil {
			trimAuditedHook()
		}
		a.post(actorMsg{auditDone: rec.ID})
	}()
	return done
}

// vacuumChunkBytes is how much free space one vacuum turn gives back to the file system, in one
// transaction on the stream's writer: about as long as a trim chunk when every page given back
// moves (docs/benchmarks.md, "Retention: giving the space back"), appends and deliveries taking
// turns between them.
const vacuumChunkBytes = 512 << 10

// vacuumChunkCommittedHook, when set (tests), runs after each vacuum turn that gave space back,
// with what it gave back and what is left.
var vacuumChunkCommittedHook func(freed, left int64)

// vacuumSoon queues a vacuum turn behind what is waiting, unless one is queued: after a trim, a
// sweep or a processor's records deleted, and at load (an unload or a crash may have cut the
// last turns short). Actor goroutine only.
func (a *actor) vacuumSoon() {
	if a.store == nil || a.vacuumQueued || a.dctx.Err() != nil {
		return
	}
	a.vacuumQueued = true
	go a.post(actorMsg{vacuum: true}) // after what is queued now (an unload ends it: post returns)
}

// vacuumChunk gives one chunk of the stream's free space back to the file system, on the actor
// between two steps, and queues the next turn while more is free: a trim's chunks and then
// these, each its own transaction, so an append waits behind one at most. While a trim is under
// way it waits for the trim's end (which queues it again): the pages a vacuum moves from the
// end of the file are events the trim may be about to delete, and a vacuum after the trim moves
// only what is left.
func (a *actor) vacuumChunk() {
	a.vacuumQueued = false
	if a.store == nil || a.trims > 0 || a.dctx.Err() != nil {
		return // an unloading stream leaves the rest to its next load
	}
	freed, left, err := a.store.Vacuum(context.Background(), vacuumChunkBytes)
	if err != nil {
		// A full or failing disk: tried again after the next trim or sweep, or at the next load.
		a.srv.log.Warn().Err(err).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg("the stream's free space was not given back to the file system")
		a.forgetDeferredAudits()
		return
	}
	if freed > 0 {
		a.srv.metrics.VacuumedBytes.Add(float64(freed))
		if vacuumChunkCommittedHook != nil {
			vacuumChunkCommittedHook(freed, left)
		}
	}
	if left > 0 {
		a.vacuumSoon()
		return
	}
	if freed > 0 {
		a.noteSize(0, true) // the file is cut: the project's usage falls
	}
	a.forgetDeferredAudits()
}

// durableFloor is the offset through which every consumer of the stream holds its events: the
// lowest confirmed offset of its subscriptions (one without a cursor row yet holds nothing),
// checkpoint of its registered readers and delivered offset of its open connections (those
// opened or registered with the subscribe right); the head when it has none. A trim never passes it.
func (a *actor) durableFloor() int64 {
	st := a.st
	floor := st.head
	if st.core != nil {
		for name := range st.core.Subscriptions {
			confirmed := int64(0)
			if r := st.rows[name]; r != nil {
				confirmed = r.ConfirmedOffset
			}
			floor = min(floor, confirmed)
		}
	}
	// Readers and connections without the subscribe right hold nothing back (ReaderCaller.NoHold).
	for _, r := range st.readers {
		if !r.NoHold {
			floor = min(floor, r.Checkpoint)
		}
	}
	for _, c := range a.conns {
		if !c.opts.NoHold {
			floor = min(floor, c.delivered.Load())
		}
	}
	return floor
}

// retentionPolicy is a stream's own retention (Stream.setRetention), kept in its KV.
type retentionPolicy struct {
	MaxAgeMs  int64 `json:"maxAgeMs,omitempty"`
	MaxEvents int64 `json:"maxEvents,omitempty"`
	// MaxBytes bounds the size (storage.EventSize) of the events a trim could delete: past it
	// the oldest go.
	MaxBytes int64 `json:"maxBytes,omitempty"`
}

// retentionKey is the stream KV key of its retention policy.
const retentionKey = "retention"

// retentionEvery is how often a stream appended to applies its retention policy.
const retentionEvery = time.Minute

// minRetentionAge is the shortest maxAgeMs a policy takes: a shorter one is a unit mistake more
// often than a wish.
const minRetentionAge = time.Minute

// maxRetentionAge is the longest maxAgeMs a policy takes: past it the time an event ages out is
// no longer a time (epoch milliseconds overflow), and a longer one keeps everything anyway.
const maxRetentionAge = 100 * 365 * 24 * time.Hour

func (p retentionPolicy) set() bool { return p.MaxAgeMs > 0 || p.MaxEvents > 0 || p.MaxBytes > 0 }

// applyRetention starts a trim to what the stream's policy no longer keeps, unless one runs:
// its chunks follow the step under way, the floor of every consumer applying as for a trim.
// Actor goroutine only.
func (a *actor) applyRetention(now time.Time) {
	p := a.st.retention
	if !p.set() || a.store == nil || a.autoTrimming {
		return
	}
	a.lastRetention = now
	a.autoTrimming = true
	go a.post(actorMsg{trim: &trimReq{auto: true}}) // bounds taken when it runs: retentionThrough
}

// retentionThrough is how far the stream's policy would trim it now: past any of its limits an
// event goes (more than MaxEvents offsets below the head, created more than MaxAgeMs ago, or
// among the oldest events whose size the newer ones leave over MaxBytes); 0 when it keeps
// everything. The size bound reads at most sizeScanRows events' headers (the actor waits on
// it): more says it stopped short, and a trim to through leaves more to trim.
func (a *actor) retentionThrough() (through int64, more bool, err error) {
	p := a.st.retention
	if p.MaxEvents > 0 {
		through = max(0, a.st.head-p.MaxEvents)
	}
	if p.MaxBytes > 0 && a.trimmableKnown {
		if over := a.trimmable - p.MaxBytes; over > 0 {
			last, bytes, n, err := a.store.TrimmableThroughBytes(context.Background(), over, sizeScanRows)
			if err != nil {
				return 0, false, err
			}
			through, more = max(through, last), bytes < over && n == sizeScanRows
		}
	}
	if p.MaxAgeMs > 0 {
		last, err := a.store.LastCreatedBefore(context.Background(), itx.UnixMilli(a.srv.clock.Now())-p.MaxAgeMs)
		if err != nil {
			return 0, false, err
		}
		through = max(through, last)
	}
	return through, more, nil
}

// sizeScanRows is how many events one chunk of a stream's size measure reads.
var sizeScanRows = 20_000

// sizeScan is a measure of the stream's size under way (actor.trimmable): the events through
// upTo (the head when it began) are read a chunk at a time, after after.
type sizeScan struct{ after, upTo int64 }

// measureTrimmable reads one chunk of the stream's size (actor.trimmable), starting the measure
// if none runs, and reports whether it is complete. Actor goroutine only.
func (a *actor) measureTrimmable() (bool, error) {
	if a.sizeScan == nil {
		a.sizeScan, a.trimmable = &sizeScan{upTo: a.st.head}, 0 // the commits from now add theirs
	}
	sc := a.sizeScan
	bytes, last, n, err := a.store.TrimmableBytes(context.Background(), sc.after, sc.upTo, sizeScanRows)
	if err != nil {
		a.sizeScan = nil
		return false, err
	}
	a.trimmable += bytes
	sc.after = last
	if n < sizeScanRows {
		a.sizeScan, a.trimmableKnown = nil, true
		return true, nil
	}
	return false, nil
}

// retentionDue is when the stream's age limit next has an event to trim (epoch ms, maybe
// past): 0 when there is none (no age limit, nothing a trim could delete), and when the oldest
// such event is held by a consumer (durableFloor): only that consumer moving lets the policy
// trim, and that loads the stream, which applies the policy again.
func (a *actor) retentionDue() (int64, error) {
	p := a.st.retention
	if p.MaxAgeMs <= 0 || a.store == nil {
		return 0, nil
	}
	off, at, err := a.store.OldestTrimmable(context.Background())
	if err != nil || off == 0 || off > a.durableFloor() {
		return 0, err
	}
	return at + p.MaxAgeMs + 1, nil // an event goes once created before now - MaxAgeMs
}

// armRetention keeps a loaded stream with an age limit trimming as its events age, appended to
// or not: a timer for when its oldest event passes the limit, at least retentionEvery from now
// (and again every retentionEvery while a consumer holds it back). Actor goroutine only.
func (a *actor) armRetention() {
	if a.retT != nil {
		a.retT.Stop()
		a.retT = nil
	}
	if a.st.retention.MaxAgeMs <= 0 || a.store == nil {
		return
	}
	now := a.srv.clock.Now()
	due, err := a.retentionDue()
	if err != nil {
		a.srv.log.Warn().Err(err).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg("the stream's retention policy: its oldest event not read (tried again later)")
	}
	at := now.Add(retentionEvery)
	if due > 0 && time.UnixMilli(due).After(at) {
		at = time.UnixMilli(due)
	}
	a.armRetentionAt(at)
}

// armRetentionAt arms retT for at, a wall time: within alarmSleep, then again from the clock as
// it reads then, since the timer runs on the monotonic clock (armed for the whole wait, a stream
// held loaded trimmed an event a step forward aged only when the wait before the step ran out:
// up to the age limit, 30 days for a limit of 30 days). Actor goroutine only.
func (a *actor) armRetentionAt(at time.Time) {
	if a.retT != nil {
		a.retT.Stop()
	}
	a.retAt = at
	fire := at
	if soon := a.srv.clock.Now().Add(alarmSleep); soon.Before(fire) {
		fire = soon
	}
	a.retT = itx.AfterFuncAt(a.srv.clock, fire, func() { a.post(actorMsg{retentionDue: true}) })
}

// SetRetention stores a stream's retention policy and applies it at once.
func (s *Server) SetRetention(ctx context.Context, by Admin, ref StreamRef, maxAgeMs, maxEvents, maxBytes int64) error {
	if err := itx.ValidatePath(ref.Path); err != nil {
		return err
	}
	switch {
	case maxAgeMs < 0 || maxEvents < 0 || maxBytes < 0:
		return itx.Errorf(itx.EInvalid, "retention: maxAgeMs, maxEvents and maxBytes cannot be negative")
	case maxAgeMs > 0 && maxAgeMs < minRetentionAge.Milliseconds():
		return itx.Errorf(itx.EInvalid, "retention: maxAgeMs %d (%v) is under a minute, the shortest retention by age", maxAgeMs, time.Duration(maxAgeMs)*time.Millisecond)
	case maxAgeMs > maxRetentionAge.Milliseconds():
		return itx.Errorf(itx.EInvalid, "retention: maxAgeMs %d is over 100 years (%d ms): leave it 0 to keep events whatever their age", maxAgeMs, maxRetentionAge.Milliseconds())
	}
	a, err := s.acquire(ctx, ref)
	if err != nil {
		return err
	}
	defer s.release(a)
	if a.view().streamID == "" {
		return itx.Errorf(itx.ENotFound, "no stream %s", ref.Path)
	}
	// The record is made before the change and committed with it in the stream (see
	// auditPendingKey), so a crash after the change cannot lose it.
	rec, err := auditRecord(by, AuditRetentionSet, map[string]any{"projectId": ref.ProjectID, "path": ref.Path,
		"maxAgeMs": maxAgeMs, "maxEvents": maxEvents, "maxBytes": maxBytes})
	if err != nil {
		return err
	}
	reply := make(chan error, 1)
	req := &retentionReq{policy: retentionPolicy{MaxAgeMs: maxAgeMs, MaxEvents: maxEvents, MaxBytes: maxBytes}, audit: rec, reply: reply}
	a.post(actorMsg{retention: req})
	select {
	case err := <-reply:
		if err != nil {
			return err
		}
	case <-a.done:
		return a.ended()
	case <-ctx.Done():
		return itx.Errorf(itx.ECancelled, "set retention of %s: %v", ref.Path, ctx.Err())
	}
	if req.unchanged {
		return nil
	}
	if err := s.appendAudit(context.WithoutCancel(ctx), rec); err != nil {
		s.log.Error().Err(err).Str("type", rec.Type).Str("project", ref.ProjectID).Str("path", ref.Path).Msg("could not record an audit event (it is appended when the stream next loads)")
	} else {
		a.post(actorMsg{auditDone: rec.ID})
	}
	return nil
}

// AuditRetentionSet records a stream's retention policy set (or cleared).
const AuditRetentionSet = "admin/stream-retention-set"

// retentionReq is Stream.setRetention on the actor.
type retentionReq struct {
	policy retentionPolicy
	audit  *storage.AuditRecord // the change's record, committed with it (auditPendingKey)
	reply  chan error
	// unchanged is set before the reply when the stream already had the policy: nothing was
	// committed and the record is not appended.
	unchanged bool
}

// auditPendingKey is the stream KV key of the audit records of changes made to the stream itself
// (its retention policy), committed in the change's own transaction and kept until they are in
// the deployment's audit stream, as the directory keeps those of its own changes: a crash
// between the two cannot lose one. The change's commit sets the stream's alarm due first, so a
// restart loads the stream, and every load appends what is pending (flushAudits).
const auditPendingKey = "audit/pending"

// retentionSetCommittedHook, when set (tests), runs in setRetention between the policy's commit
// and its answer: the window a crash must not lose the audit record or the alarm in.
var retentionSetCommittedHook func()

// setRetention stores the policy with the stream, between two commits, and applies it.
func (a *actor) setRetention(r *retentionReq) {
	if a.store == nil {
		r.reply <- itx.Errorf(itx.ENotFound, "no stream %s", a.ref.Path)
		return
	}
	if r.policy == a.st.retention {
		// Nothing changes, so nothing is recorded: each change is an /audit record, and a
		// holder of the admin right repeating one policy must not grow the deployment's audit
		// stream (it is applied again, as a change would be).
		r.unchanged = true
		r.reply <- nil
		a.applyRetention(a.srv.clock.Now())
		return
	}
	if err := a.srv.disk.room(); err != nil {
		// A change is an /audit record, and those may use the disk reserve: below it a loop of
		// policy changes would take the disk to its last byte. Trim frees space below it.
		r.reply <- itx.Errorf(itx.ErrorCode(err), "set retention of %s: %s (Stream.trim still frees space)", a.ref.Path, itx.ErrorMessage(err))
		return
	}
	b, _ := json.Marshal(r.policy)
	kv := map[string][]byte{retentionKey: b}
	pending := a.pendingAudits
	if r.audit != nil {
		pending = append(slices.Clone(pending), *r.audit)
		kv[auditPendingKey], _ = json.Marshal(pending)
	}
	if !a.st.alarmSet {
		// As for a stream with subscriptions: due now while loaded, and set before the commit,
		// so a crash after it leaves a load owed (which appends the change's audit record and
		// applies the policy); the unload records when the policy next trims (nextAlarm).
		if err := a.srv.dir.SetAlarm(context.Background(), a.st.streamID, itx.UnixMilli(a.srv.clock.Now())); err == nil {
			a.st.alarmSet = true
		} else {
			a.srv.log.Warn().Err(err).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg("the stream's alarm not set for its retention policy (applied at its next load)")
		}
	}
	if err := a.store.Commit(context.Background(), storage.Commit{KV: kv}); err != nil {
		r.reply <- itx.Errorf(storage.ErrorCode(err), "set retention of %s: %v", a.ref.Path, err)
		return
	}
	if retentionSetCommittedHook != nil {
		retentionSetCommittedHook()
	}
	a.pendingAudits = pending
	a.st.retention = r.policy
	a.publish(false) // describe shows the policy
	r.reply <- nil
	a.armRetention()
	a.applyRetention(a.srv.clock.Now())
}

// forgetAudit drops an audit record that is in the deployment's audit stream from the stream's
// pending ones (auditPendingKey). Actor goroutine only.
func (a *actor) forgetAudit(id string) {
	if a.trims > 0 || a.vacuumQueued {
		// After the vacuum that follows a trim: written once its last turn checkpointed, the
		// commit goes at the start of the write-ahead log instead of growing it (the project's
		// usage counts the log).
		a.forgetLater = append(a.forgetLater, id)
		return
	}
	a.dropPendingAudits(id)
}

// dropPendingAudits drops the audit records ids from the stream's pending ones, in one commit.
// Actor goroutine only.
func (a *actor) dropPendingAudits(ids ...string) {
	kept := slices.DeleteFunc(slices.Clone(a.pendingAudits), func(r storage.AuditRecord) bool { return slices.Contains(ids, r.ID) })
	if a.store == nil || len(kept) == len(a.pendingAudits) {
		return
	}
	c := storage.Commit{KVDeletes: []string{auditPendingKey}}
	if len(kept) > 0 {
		b, _ := json.Marshal(kept)
		c = storage.Commit{KV: map[string][]byte{auditPendingKey: b}}
	}
	if err := a.store.Commit(context.Background(), c); err != nil {
		a.srv.log.Warn().Err(err).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg("an audit record in the audit stream stays pending (appended again, as a duplicate, at the next load)")
		return
	}
	a.pendingAudits = kept
}

// forgetDeferredAudits forgets the audit records forgetAudit left for after a vacuum: once it
// is done, and at the unload, which ends a vacuum under way (the next load vacuums again; kept
// pending, the records would be appended to /audit again by that load, which their pending
// state makes due at once). Actor goroutine only.
func (a *actor) forgetDeferredAudits() {
	ids := a.forgetLater
	a.forgetLater = nil
	if len(ids) > 0 {
		a.dropPendingAudits(ids...)
	}
}

// flushAudits appends the audit records a crash (or a failure) left pending in the stream
// (auditPendingKey), then has the actor forget them. It runs on its own goroutine.
func (a *actor) flushAudits(recs []storage.AuditRecord) {
	for i := range recs {
		if err := a.srv.appendAudit(a.srv.base, &recs[i]); err != nil {
			if a.srv.base.Err() == nil {
				a.srv.log.Error().Err(err).Str("type", recs[i].Type).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg("could not record an audit event (it is appended when the stream next loads)")
			}
			continue
		}
		a.post(actorMsg{auditDone: recs[i].ID})
	}
}
