package processors

import "github.com/itx-dev/itx"

// eventKind is how a runner treats one event of a frame.
type eventKind uint8

const (
	kindSkip      eventKind = iota // not consumed (or ephemeral): the cursor moves past it
	kindDeliver                    // consumed: Reduce, then ProcessEvent
	kindMalformed                  // consumed but fails Validate: skipped, diagnosed after the commit
)

func (k eventKind) String() string {
	return [...]string{"skip", "deliver", "malformed"}[k]
}

// plannedEvent is one event of a frame the runner has not processed yet.
type plannedEvent struct {
	event    itx.Event
	kind     eventKind
	caughtUp bool
}

// framePlan is everything the runner decides about a frame before running any processor code.
type framePlan struct {
	events  []plannedEvent
	through int64 // the processing cursor after the frame commits
	head    int64 // the observed head, including this frame
	// eventless asks for the processEvent(nil) pass: the frame reaches the head but no consumed
	// event in it carries CaughtUp.
	eventless bool
	// commit is false for a frame that moves nothing (a redelivery of committed offsets).
	commit bool
}

// planFrame is the runner's pure core: given the committed cursor, the head observed so far and a
// frame, which events are new, which one is CaughtUp, and whether the eventless pass is owed.
//
// CaughtUp is a property of the scan, not of an event's offset: a frame whose scanned range
// reaches the observed head leaves the processor with everything the stream has, so its last
// deliverable event is caught up even if later rows were filtered out or not consumed. When the
// frame reaches the head with no deliverable event, the eventless pass stands in for it, so an
// unconsumed tail cannot strand state-derived work. Malformed events never take the flag: that
// would leave the real last event without it.
func planFrame(committed, observedHead int64, f Frame, classify func(itx.Event) eventKind) (framePlan, error) {
	if f.ScannedAfter > committed {
		return framePlan{}, itx.Errorf(itx.EFailedPrecondition,
			"frame starts after offset %d but the processing cursor is at %d", f.ScannedAfter, committed)
	}
	if f.ScannedThrough < f.ScannedAfter {
		return framePlan{}, itx.Errorf(itx.EInvalid, "frame scan regressed: %d -> %d", f.ScannedAfter, f.ScannedThrough)
	}
	prev := f.ScannedAfter
	for _, e := range f.Events {
		if e.Offset <= prev || e.Offset > f.ScannedThrough {
			return framePlan{}, itx.Errorf(itx.EInvalid,
				"frame event %d is out of order or outside the scan (%d, %d]", e.Offset, f.ScannedAfter, f.ScannedThrough)
		}
		prev = e.Offset
	}
	p := framePlan{through: max(committed, f.ScannedThrough)}
	p.head = max(observedHead, f.Head, p.through)
	last := -1
	for _, e := range f.Events {
		if e.Offset <= committed {
			continue // redelivered: already processed
		}
		k := kindSkip
		if !e.Ephemeral {
			k = classify(e)
		}
		if k == kindDeliver {
			last = len(p.events)
		}
		p.events = append(p.events, plannedEvent{event: e, kind: k})
	}
	p.commit = p.through > committed
	if !p.commit {
		return p, nil
	}
	if p.through >= p.head {
		if last >= 0 {
			p.events[last].caughtUp = true
		} else {
			p.eventless = true
		}
	}
	return p, nil
}
