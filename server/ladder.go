package server

import (
	"errors"
	"fmt"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

// failureClass says what a failed delivery means, and so which policy applies to it.
type failureClass int

const (
	// classEvent: the receiver refused these events (or a filter or transform failed on one).
	// A multi-event batch is isolated (its healthy prefix goes first, one event at a time); a
	// single event climbs the ladder, and under onFailingEvent "skip" may be skipped.
	classEvent failureClass = iota
	// classOutage: the receiver is down or slow (refused connection, timeout, HTTP 5xx/429/408/3xx, a
	// receiver that says it is unavailable or confirms no progress). It backs off along the
	// ladder and never counts toward skip.
	classOutage
	// classAbsent: nothing is mounted to receive (an itx-call capability, a remote processor
	// host). The subscription parks: no attempt is burnt, and the next mount resumes it.
	classAbsent
	// classTerminal: it can never succeed (no such processor contract, an expression that no
	// longer compiles, an invalid receiver config). It halts at once with the exact error.
	classTerminal
)

func (c failureClass) String() string {
	return [...]string{"event", "outage", "absent", "terminal"}[c]
}

// classifiedError carries a sender's own judgement of a failure's class.
type classifiedError struct {
	class failureClass
	// mount: the mount generation the try reached (0: none, or not a mounted receiver); for
	// classAbsent, the one that vanished
	mount uint64
	// retryAfter: an outage whose receiver said when to try again (HTTP Retry-After).
	retryAfter time.Duration
	err        error
}

// retryAfterOf is the wait an outage's receiver asked for (0: none).
func retryAfterOf(err error) time.Duration {
	var ce *classifiedError
	if errors.As(err, &ce) && ce.class == classOutage {
		return ce.retryAfter
	}
	return 0
}

func (e *classifiedError) Error() string { return e.err.Error() }
func (e *classifiedError) Unwrap() error { return e.err }

// withClass marks err as being of class c.
func withClass(c failureClass, err error) error { return &classifiedError{class: c, err: err} }

// vanished marks err, a failure of the receiver mounted under generation mount, as that
// receiver being gone when it is (its session died): an absence, unless another has been
// mounted meanwhile (see stepEnv.mountedNow).
func vanished(mount uint64, err error) error {
	if err == nil || classify(err) != classAbsent {
		return err
	}
	return &classifiedError{class: classAbsent, mount: mount, err: err}
}

// vanishedMount is the mount generation an absent failure reached (0: none was mounted).
func vanishedMount(err error) uint64 {
	var ce *classifiedError
	if errors.As(err, &ce) && ce.class == classAbsent {
		return ce.mount
	}
	return 0
}

// fromMount marks err, any failure of the receiver mounted under generation mount, with that
// generation, its class kept: once another receiver is mounted under the name, whatever the
// old one answered is no verdict on the events (see stepEnv.mountedNow). Its vanishing (see
// vanished) is an absence as before.
func fromMount(mount uint64, err error) error {
	if err == nil {
		return nil
	}
	if classify(err) == classAbsent {
		return vanished(mount, err)
	}
	return &classifiedError{class: classify(err), mount: mount, retryAfter: retryAfterOf(err), err: err}
}

// reachedMount is the mount generation a failure reached, whatever its class (0: unknown, or
// none was mounted).
func reachedMount(err error) uint64 {
	var ce *classifiedError
	if errors.As(err, &ce) {
		return ce.mount
	}
	return 0
}

// classify decides a failure's class: a sender's own mark first, then the error code.
func classify(err error) failureClass {
	var ce *classifiedError
	if errors.As(err, &ce) {
		return ce.class
	}
	switch itx.ErrorCode(err) {
	case itx.EDeadlineExceeded, itx.EUnavailable, itx.ERateLimited, itx.ECancelled, itx.EInternal,
		// the server's own bounds (--max-held-streams) and a full disk: the receiving side
		// cannot take anything now, whatever the events
		itx.ELimitExceeded, itx.EResourceExhausted:
		return classOutage
	case itx.ECapabilityOffline:
		return classAbsent
	}
	return classEvent
}

// deliveryFailure is a failed delivery try as the deliverer reports it.
type deliveryFailure struct {
	class       failureClass
	count       int   // events in the failed try (0: nothing was sent, e.g. a filter failure)
	last        int64 // the last offset of the failed try
	eventOffset int64 // the failing event when it is known (a single-event try, an expression)
	expression  bool  // a filter or transform failed on eventOffset: recorded once as evidence
	msg         string
	retryAfter  time.Duration // an outage: the receiver asked to wait at least this long
	// mount is the mount generation the try reached (0: nothing was mounted, or the receiver is
	// not a mount): when another is mounted by the time the step sees the failure, it is no
	// absence, and no verdict on the events either.
	mount uint64
	// deadLettered: the failing event has landed in the subscription's dead-letter stream, so
	// the ladder may skip it.
	deadLettered bool
	// processorEvent: a processor's hook failed on eventOffset (an outage that names its event;
	// a webhook's outage on a single-event try names none, it is not held against the event).
	processorEvent bool
	// refolded: a remote processor's wake failed (cut off by the bound, or no progress past the
	// cursor) after committing its reduction further, as the refold of a rewind or of a new
	// reducer version does wake after wake: progress, so the ladder starts over from its first
	// rung instead of climbing (and halting a long refold after 15 bounds).
	refolded bool
}

// maxRetryWait is the longest wait the ladder sets: the backoff's cap with its jitter (a
// receiver's Retry-After is capped lower, at BackoffCap).
var maxRetryWait = time.Duration(float64(itx.BackoffCap) * (1 + itx.BackoffJitter))

// retryHorizon is the latest retry time a cursor row can hold at nowMs (epoch ms) while the wall
// clock only moved forward: one further ahead was set before the clock went back (stepped by NTP
// or an operator, a VM restored from a snapshot, a restart on a machine whose clock is behind).
// Such a retry is due at once: waiting for the clock to read its time again would hold it for
// as long as the clock went back (days, for a VM restored from an old snapshot), and the wait
// it was given, at most maxRetryWait, cannot be told apart from the step any more.
func retryHorizon(nowMs int64) int64 { return nowMs + maxRetryWait.Milliseconds() }

// decisionKind is what the ladder decides after a failure.
type decisionKind int

const (
	decideRetry   decisionKind = iota // back off: the next attempt at nextAttemptAt
	decideIsolate                     // retry at once, one event at a time, through isolateThrough
	decideSkip                        // give up on one event: record it and move past it
	decideHalt                        // end delivery loudly until resumed
	decidePark                        // wait, without attempts, for the receiver to mount
)

func (k decisionKind) String() string {
	return [...]string{"retry", "isolate", "skip", "halt", "park"}[k]
}

// ladderDecision is the ladder's verdict and the retry block the cursor row takes with it.
type ladderDecision struct {
	kind           decisionKind
	attempt        int   // the row's attempt count after this failure
	nextAttemptAt  int64 // retry: epoch ms
	failingOffset  int64
	failingAttempt int
	isolateThrough int64
	skipOffset     int64
	msg            string
}

// decideFailure applies the retry ladder and the failing-event policy to one failed try. It is
// pure: row is the cursor row the try was read under, now the clock reading (epoch ms) and
// random a number in [0,1) for the jitter.
//
// The rules, in order: a terminal failure halts at once; an absent receiver parks; an outage
// backs off along the ladder and halts at MaxDeliveryAttempts, never skipping; an event-specific
// failure of a batch isolates it first; a single failing event backs off too and, under "skip",
// is skipped after FailingEventConfirmAttempts tries on it alone, halting once MaxFailingEventSkips
// skips come without a success between them.
func decideFailure(row storage.CursorRow, f deliveryFailure, policy string, now int64, random float64) ladderDecision {
	attempt := row.Attempt + 1
	d := ladderDecision{attempt: attempt, msg: truncate(f.msg, itx.MaxHaltErrorLength),
		failingOffset: row.FailingEventOffset, failingAttempt: row.FailingEventAttempt}
	backoff := func() ladderDecision {
		if attempt >= itx.MaxDeliveryAttempts {
			d.kind = decideHalt
			return d
		}
		d.kind = decideRetry
		wait := itx.Backoff(attempt, random)
		if f.retryAfter > wait {
			wait = min(f.retryAfter, itx.BackoffCap) // the receiver asked for longer (Retry-After)
		}
		d.nextAttemptAt = now + wait.Milliseconds()
		return d
	}
	switch f.class {
	case classTerminal:
		d.kind = decideHalt
		return d
	case classAbsent:
		d.kind, d.attempt = decidePark, row.Attempt
		return d
	case classOutage:
		if f.processorEvent && f.eventOffset > 0 {
			// An outage that names its event (a processor's hook failed on it): backed off as
			// any outage, never skipped, and the event shows as the failing one.
			d.failingOffset, d.failingAttempt = f.eventOffset, 1
			if row.FailingEventOffset == f.eventOffset {
				d.failingAttempt = row.FailingEventAttempt + 1
			}
		}
		return backoff()
	}
	if f.count > 1 && f.eventOffset == 0 {
		// Which event failed is unknown: deliver the batch's events one at a time, so the healthy
		// prefix goes through and the failing event ends up alone. Nothing reached a verdict on
		// one event yet, so no attempt is burnt.
		d.kind, d.attempt, d.isolateThrough = decideIsolate, row.Attempt, f.last
		return d
	}
	offset := f.eventOffset
	if offset == 0 {
		offset = f.last
	}
	d.failingOffset, d.failingAttempt = offset, 1
	if row.FailingEventOffset == offset {
		d.failingAttempt = row.FailingEventAttempt + 1
	}
	if policy == itx.OnFailingSkip && d.failingAttempt >= itx.FailingEventConfirmAttempts {
		if row.FailingEventSkips+1 >= itx.MaxFailingEventSkips {
			d.kind = decideHalt
			// Say what happened: this event is not skipped (the cursor stays before it) and
			// the skips before it are the dead letters and error records the stream holds.
			skipped := fmt.Sprintf("%d events were", row.FailingEventSkips)
			if row.FailingEventSkips == 1 {
				skipped = "1 event was"
			}
			d.msg = truncate(fmt.Sprintf("offset %d failed %d times and %s skipped before it without a success between them: %s",
				offset, d.failingAttempt, skipped, f.msg), itx.MaxHaltErrorLength)
			return d
		}
		d.kind, d.skipOffset = decideSkip, offset
		return d
	}
	return backoff()
}
