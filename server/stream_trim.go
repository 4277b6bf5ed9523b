package server

import (
	"context"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

// AuditStreamTrimmed records a Stream.trim that deleted events in the deployment's AuditPath.
const AuditStreamTrimmed = "admin/stream-trimmed"

// trimChunkEvents is how many events one trim transaction deletes: a trim of millions goes a
// chunk at a time, the stream's other work (appends, deliveries) taking turns between chunks.
const trimChunkEvents = 5000

// trimReq is a Stream.trim under way on the actor.
type trimReq struct {
	through       int64 // 0: no offset bound
	createdBefore int64 // epoch ms; 0: no time bound (resolved to an offset by the first chunk)
	deleted       int64 // so far, over its chunks
	reply         chan trimReply
}

type trimReply struct {
	trimmed, deleted int64
	err              error
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
	r := &trimReq{through: through, createdBefore: createdBefore, reply: make(chan trimReply, 1)}
	a.post(actorMsg{trim: r})
	select {
	case rep := <-r.reply:
		res := TrimResult{TrimmedThrough: rep.trimmed, Deleted: rep.deleted}
		if res.Deleted > 0 {
			s.metrics.TrimmedEvents.Add(float64(res.Deleted))
			// Recorded once the events are gone (a crash in between leaves the trim unrecorded).
			if rec, err := auditRecord(by, AuditStreamTrimmed, map[string]any{"projectId": ref.ProjectID, "path": ref.Path,
				"trimmedThrough": res.TrimmedThrough, "deleted": res.Deleted}); err == nil {
				s.audit(context.WithoutCancel(ctx), rec)
			}
		}
		return res, rep.err
	case <-a.done:
		return TrimResult{}, a.ended()
	case <-ctx.Done():
		// The chunks already committed stay trimmed; the rest is left (trim again).
		return TrimResult{}, itx.Errorf(itx.ECancelled, "trim of %s: %v", ref.Path, ctx.Err())
	}
}

// trimChunk deletes one chunk of a trim on the actor, between two commits, and queues the next
// one behind what is waiting, or answers.
func (a *actor) trimChunk(r *trimReq) {
	answer := func(err error) { r.reply <- trimReply{a.st.trimmed, r.deleted, err} }
	if a.store == nil {
		answer(itx.Errorf(itx.ENotFound, "no stream %s", a.ref.Path))
		return
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
	n, reached, err := a.store.Trim(context.Background(), target, trimChunkEvents)
	if err != nil {
		answer(itx.Errorf(storage.ErrorCode(err), "trim of %s: %v", a.ref.Path, err))
		return
	}
	r.deleted += n
	if reached > a.st.trimmed {
		a.st.trimmed = reached
		a.publish(true)
	}
	if reached < target {
		go a.post(actorMsg{trim: r}) // after what is queued now; the caller's hold keeps a loaded
		return
	}
	answer(nil)
}

// durableFloor is the offset through which every consumer of the stream holds its events: the
// lowest confirmed offset of its subscriptions (one without a cursor row yet holds nothing),
// checkpoint of its registered readers and delivered offset of its open connections; the head
// when it has none. A trim never passes it.
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
	for _, r := range st.readers {
		floor = min(floor, r.Checkpoint)
	}
	for _, c := range a.conns {
		floor = min(floor, c.delivered.Load())
	}
	return floor
}
