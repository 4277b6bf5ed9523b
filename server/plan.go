package server

import (
	"fmt"
	"strings"
	"time"

	"github.com/itx-dev/itx"
)

// appendReq is one append call queued to a stream actor. Its inputs are already normalized.
type appendReq struct {
	inputs    []itx.EventInput
	opts      itx.AppendOptions
	authority authority
	copy      *copyStamp   // set for copy-to-stream deliveries
	effect    *effectStamp // set for a processor's forward from its home stream (fenced by key)
	queued    time.Time
	reply     chan appendReply // buffered: the actor never blocks on a caller that left; nil for the server's own records
	// inReserve lets the request use the disk reserve (Config.MinFreeDisk): the server's audit
	// records. The server's own records (authCore) always may.
	inReserve bool
}

type appendReply struct {
	result itx.AppendResult
	err    error
}

// groupPlan is the outcome of planning one group commit. Its ordering rule: Events must be
// durably committed before any reply in Replies is sent, and a failed commit turns every
// successful reply into that failure (a reply may name offsets only the commit makes real).
type groupPlan struct {
	Events  []itx.Event    // rows to insert, offsets assigned
	Head    int64          // the head once Events commit
	Replies []appendReply  // one per request, in request order
	Core    *coreState     // the reduced state once Events commit (unchanged: the input state)
	Effects []cursorEffect // cursor-row changes to commit with Events, in event order
}

// planGroup decides a group commit. It is pure: committed holds the already-stored events of
// every idempotency key the group uses (prefetched by the actor), bucket is the stream's breaker,
// core the reduced state before the group, rc the reduction's context and now the clock reading
// for the whole group. Each request is all-or-nothing: a refused request contributes no rows,
// takes no tokens, leaves the core state alone and never affects its neighbours. Core events are
// reduced inline, before commit, with their assigned offsets.
func planGroup(head int64, streamID string, bucket *tokenBucket, room func() error, core *coreState, rc reduceContext,
	reqs []*appendReq, committed map[string]*itx.Event, now time.Time) groupPlan {
	p := groupPlan{Head: head, Replies: make([]appendReply, len(reqs)), Core: core}
	var roomErr error // room's answer, asked once per group and only if a request needs it
	roomAsked := false
	pending := map[string]*itx.Event{} // keys taken by rows of this group
	createdAt := itx.UnixMilli(now)
	for i, req := range reqs {
		res := itx.AppendResult{
			Offsets:   make([]int64, len(req.inputs)),
			Duplicate: make([]bool, len(req.inputs)),
			StreamID:  streamID,
		}
		var rows []itx.Event
		mine := map[string]*itx.Event{}
		mineAt := map[string]int{} // the input that took a key of mine: its row is not committed
		var err error
		var working *coreState // a clone of p.Core, made when this request touches it
		var effects []cursorEffect
		next := p.Head
		for j := range req.inputs {
			in := &req.inputs[j]
			if key := in.IdempotencyKey; key != "" {
				prior := mine[key]
				if prior == nil {
					prior = pending[key]
				}
				if prior == nil {
					prior = committed[key]
				}
				if prior != nil {
					if !sameEvent(prior, in, req.authority) {
						by := fmt.Sprintf("offset %d", prior.Offset)
						if at, ok := mineAt[key]; ok && mine[key] == prior {
							// Nothing of this call is written: the offset it would have had is no
							// event anyone can read.
							by = fmt.Sprintf("event %d of this append", at)
						}
						err = itx.Errorf(itx.EIdempotencyConflict,
							"event %d: idempotency key %q is already used by %s with a different body", j, key, by)
						break
					}
					res.Offsets[j], res.Duplicate[j] = prior.Offset, true
					continue
				}
			}
			cur := p.Core
			if working != nil {
				cur = working
			}
			if req.effect != nil && in.IdempotencyKey != "" && cur.effectTaken(req.effect, in.IdempotencyKey) {
				// A forward this stream took already from the processor, its key forgotten with
				// a trim and the event redelivered: a duplicate all the same (its offset is gone).
				res.Duplicate[j] = true
				continue
			}
			if req.copy != nil && len(in.Provenance) > 0 {
				// A copy whose source event this stream took already under the same stamp, its
				// key forgotten with a trim: a duplicate all the same (its offset is gone).
				if hop := in.Provenance[len(in.Provenance)-1]; hop.StreamID == req.copy.StreamID && cur.tookAlready(req.copy, hop.Offset) {
					res.Duplicate[j] = true
					continue
				}
			}
			if entry := cur.identicalConfigure(in); entry != nil && in.IdempotencyKey == "" {
				res.Offsets[j], res.Duplicate[j] = entry.configOffset(), true
				continue
			}
			next++
			rows = append(rows, itx.Event{
				Offset: next, Type: in.Type, Payload: in.Payload, CreatedAt: createdAt,
				IdempotencyKey: in.IdempotencyKey, Metadata: in.Metadata, Ephemeral: in.Ephemeral,
				Provenance: in.Provenance,
			})
			res.Offsets[j] = next
			if itx.IsCoreType(in.Type) && len(in.Provenance) == 0 {
				if working == nil {
					working = p.Core.clone()
				}
				rc.head, rc.authority, rc.receivedAt = next-1, req.authority, createdAt
				eff, rerr := working.reduce(&rows[len(rows)-1], &rc)
				if rerr != nil {
					e := itx.AsError(rerr)
					err = &itx.Error{Code: e.Code, Message: fmt.Sprintf("event %d: %s", j, e.Message)}
					break
				}
				effects = append(effects, eff...)
			}
			if in.IdempotencyKey != "" {
				mine[in.IdempotencyKey] = &rows[len(rows)-1]
				mineAt[in.IdempotencyKey] = j
			}
		}
		// A retry whose every event is a duplicate is answered from the log whatever the head:
		// the condition held when the original committed.
		if err == nil && len(rows) > 0 && req.opts.Conditional && req.opts.ExpectedHeadOffset != p.Head {
			err = itx.Errorf(itx.EOffsetConflict, "expected head offset %d, the head is %d", req.opts.ExpectedHeadOffset, p.Head)
		}
		if err == nil && req.copy != nil && len(rows) > 0 {
			if working == nil {
				working = p.Core.clone()
			}
			var offsets []int64 // the source offsets taken
			for k := range rows {
				if prov := rows[k].Provenance; len(prov) > 0 && prov[len(prov)-1].StreamID == req.copy.StreamID {
					offsets = append(offsets, prov[len(prov)-1].Offset)
				}
			}
			err = working.acceptCopy(req.copy, len(rows), offsets, createdAt)
		}
		if err == nil && req.effect != nil {
			var keys []string // the keys taken
			for k := range rows {
				if rows[k].IdempotencyKey != "" {
					keys = append(keys, rows[k].IdempotencyKey)
				}
			}
			cur := p.Core
			if working != nil {
				cur = working
			}
			if cur.effectsChange(req.effect, keys) {
				if working == nil {
					working = p.Core.clone()
				}
				working.acceptEffects(req.effect, keys, createdAt)
			}
		}
		charged, takesRoom := 0, false
		for k := range rows {
			if req.authority != authCore && !isSubscriptionControl(rows[k].Type) {
				charged++
			}
			takesRoom = takesRoom || (req.authority != authCore && !req.inReserve && !freesOrMoves(rows[k].Type))
		}
		if err == nil && takesRoom && room != nil {
			if !roomAsked {
				roomErr, roomAsked = room(), true
			}
			err = roomErr
		}
		if err == nil && charged > 0 && float64(charged) > bucket.burst {
			// It said "retry later" to an append no retry could pass.
			err = itx.Errorf(itx.ERateLimited, "the append's %d events are more than the stream's circuit breaker ever admits at once (--breaker-burst %d): it never passes; append fewer at a time", charged, int64(bucket.burst))
		} else if err == nil && charged > 0 && !bucket.take(charged, now) {
			err = itx.Errorf(itx.ERateLimited, "the stream's circuit breaker is open: too many events appended too fast (--breaker-burst, --breaker-refill-per-minute); retry later")
		}
		if err != nil {
			p.Replies[i] = appendReply{err: err}
			continue
		}
		for k := range rows {
			p.Events = append(p.Events, rows[k])
			if key := rows[k].IdempotencyKey; key != "" {
				pending[key] = &p.Events[len(p.Events)-1]
			}
		}
		p.Head = next
		if working != nil {
			p.Core = working
		}
		p.Effects = append(p.Effects, effects...)
		res.HeadOffset = next
		p.Replies[i] = appendReply{result: res}
	}
	return p
}

// freesOrMoves reports whether a client's event of typ is one the disk reserve lets through: a
// subscription's removal, resumption or cursor move (small, bounded by the subscriptions, and
// what an operator reaches for while the disk is short).
func freesOrMoves(typ string) bool {
	switch typ {
	case itx.TypeSubscriptionCursorSet, itx.TypeSubscriptionResumed, itx.TypeSubscriptionRemoved:
		return true
	}
	return false
}

// sameEvent reports whether in, appended under the idempotency key prior holds, is the event the
// log holds: the same body for a client's event; for the server's own, the same fact. A copy is
// the same copy (sameCopy). A server record under a server key (the evidence of an expression's
// failure on an event, a skip, a scheduled append's refusal) is keyed by the fact it records,
// and its message may differ when it is written again: a filter that fails with another message
// at the next try (an $error over $now() or $random(), a time limit reached on one try and not
// the next) records the same failure of the same event. The first record stands; refusing the
// second would fail the whole step with it, and the appends and delivery outcomes it carries.
func sameEvent(prior *itx.Event, in *itx.EventInput, auth authority) bool {
	switch {
	case itx.SameBody(prior, in):
		return true
	case auth == authCopy:
		return sameCopy(prior, in)
	case auth == authCore:
		return strings.HasPrefix(in.IdempotencyKey, itx.InternalKeyPrefix)
	}
	return false
}

// sameCopy reports whether a copy being appended is one already in the log: the same last hop
// (source stream, path, offset, subscription and seek epoch) under the same key. A copy's key
// names those coordinates, not its body, and a redelivery after a lost acknowledgement shapes
// the body again: a transform reading $now(), $millis() or $random() makes another one. That is
// still the copy the log holds, kept as first written; refusing it as a conflict would fail the
// delivery forever over a copy that landed.
func sameCopy(prior *itx.Event, in *itx.EventInput) bool {
	a, b := prior.Provenance, in.Provenance
	return len(a) > 0 && len(b) > 0 && a[len(a)-1] == b[len(b)-1]
}
