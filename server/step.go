package server

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

// streamState is everything one stream's actor decides on. Only the actor goroutine touches it,
// and only through step: head, core state and cursor rows change nowhere else.
type streamState struct {
	streamID     string // planned before the first commit; an identity once born is true
	created      bool   // the stream has a database (its directory entry and file are made)
	born         bool   // its first commit landed: the stream exists (see bornKey and step's bornNow)
	head         int64
	createdAt    int64
	lastAppendAt int64
	trimmed      int64           // Stream.trim deleted the events through here (stream/* records kept)
	retention    retentionPolicy // Stream.setRetention's policy (stored in the KV)
	core         *coreState
	rows         map[string]*storage.CursorRow
	readers      map[string]storage.Reader
	bucket       *tokenBucket
	procAlarms   map[string]int64 // the processors' alarm slices by owner ("": in-process; a remote processor's name)
	// The processors' KV in all: its keys, and their bytes with their values'. Counted at load,
	// kept by every put, so the bounds cost no scan.
	procKVKeys  int
	procKVBytes int64
	scheduled   map[string]*scheduled // pending scheduled appends by key
	firstDue    int64                 // the earliest DueAt of scheduled (see earliestDue); -1: recompute

	// Not durable: rebuilt on load.
	procs      map[string]*procRecord // processor records read so far (see procRecordOf)
	procFiring map[string]bool        // slices whose fire is being handled
	procsDirty bool                   // procs changed since the last publish

	subs       map[string]*subRuntime
	dirty      map[string]bool // rows changed in memory since they were last committed
	nextGen    int64
	alarmSet   bool // the directory alarm reads "due now" while loaded (see load)
	summaryOld bool // the directory summary is marked stale (see storage.StaleStreams)
}

// subRuntime is a subscription's delivery state that lives only as long as the actor.
type subRuntime struct {
	gen            int64 // the current deliverer's generation: fences outcomes of older ones
	inFlight       bool
	isolateThrough int64 // deliver one event at a time until the cursor reaches this
	// unmountedInFlight: the mount its receiver is reached through went away while a push was
	// in flight (see step, 3'): once that push's outcome is in, it parks unless something is
	// mounted under the name by then.
	unmountedInFlight bool

	// An offset-acking subscription (confirmWindow) delivers ahead of its confirmed cursor:
	// sendFrom is where its next delivery reads after (0: the confirmed cursor), and marks the
	// deliveries since the confirmed cursor, in order. A reset (a failure, a new mount of its
	// receiver's name, an effect on its row) sends again from the confirmed cursor; resets
	// counts them, so a delivery started before one does not move sendFrom after it.
	sendFrom int64
	// runMount is the mount generation of the receiver this run of sends went to (itx-call;
	// 0: none known): a presence signal of that same mount, late, is no new receiver.
	runMount uint64
	marks    []deliveryMark
	resets   uint64
	// held are the offsets of the events delivered since the confirmed cursor (those at or below
	// it are trimmed as it moves): the window bounds how many the receiver holds, not how many
	// offsets a filter passed over between them.
	held []int64
}

// MaxAckingDeliveries bounds the deliveries an offset-acking subscription has out unconfirmed
// (the step keeps a mark for each): with one event per delivery, its window is at most this.
const MaxAckingDeliveries = 256

// deliveryMark is one delivery of an offset-acking subscription: the offset of the last event
// it carried (0: none, the filter passed over everything it read) and how far it read.
type deliveryMark struct {
	last, through int64
}

// resetSending makes an offset-acking subscription deliver again from its confirmed cursor.
func (rt *subRuntime) resetSending() {
	rt.sendFrom, rt.marks, rt.held, rt.runMount = 0, nil, nil, 0
	rt.resets++
}

// holdsUnconfirmed reports whether an offset-acking subscription holds events delivered and
// unconfirmed (its runtime knows them; a new load would deliver them again).
func (st *streamState) holdsUnconfirmed() bool {
	for _, rt := range st.subs {
		if len(rt.marks) > 0 {
			return true
		}
	}
	return false
}

// heldEvents is how many events an offset-acking subscription holds delivered and unconfirmed
// past confirmed.
func (rt *subRuntime) heldEvents(confirmed int64) int64 {
	i := 0
	for i < len(rt.held) && rt.held[i] <= confirmed {
		i++
	}
	if i > 0 {
		rt.held = rt.held[i:]
	}
	return int64(len(rt.held))
}

// confirmTo moves an offset-acking subscription's confirmed cursor through c: past the whole of
// each delivery whose last event is confirmed (over what its filter passed too), and past
// deliveries that carried nothing once everything before them is confirmed.
func confirmTo(r *storage.CursorRow, rt *subRuntime, c int64) bool {
	to := max(r.ConfirmedOffset, c)
	defer func() { rt.heldEvents(r.ConfirmedOffset) }()
	for len(rt.marks) > 0 {
		m := rt.marks[0]
		if m.through > to && m.last > to {
			break
		}
		to = max(to, m.through)
		rt.marks = rt.marks[1:]
	}
	if to <= r.ConfirmedOffset {
		return false
	}
	r.ConfirmedOffset = to
	r.DeliveredOffset = max(r.DeliveredOffset, to)
	return true
}

func newStreamState(bucket *tokenBucket) *streamState {
	return &streamState{core: newCoreState(), rows: map[string]*storage.CursorRow{}, readers: map[string]storage.Reader{}, bucket: bucket,
		subs: map[string]*subRuntime{}, dirty: map[string]bool{}, procs: map[string]*procRecord{},
		procAlarms: map[string]int64{}, procFiring: map[string]bool{}, scheduled: map[string]*scheduled{}}
}

// stepInput is one batch of the actor's inputs, taken together in one step.
type stepInput struct {
	appends   []*appendReq      // client, copy and server appends, in queue order
	outcomes  []deliveryOutcome // finished delivery tries
	mounted   []string          // capabilities mounted in the project since the last step
	unmounted []string          // capabilities unmounted (presence tokens): their subscriptions park
	readers   []readerOp        // register, move or remove registered readers
	flush     bool              // the cursor flush delay passed: write dirty rows now
	final     bool              // unloading: write dirty rows, start nothing
	procOps   []procOp          // processor port writes: progress, KV, alarm
	schedules []scheduleOp      // schedule or cancel scheduled appends
	woken     string            // an incarnation id: record stream/woken (processors are hosted here)
	// newVersion: this process hosts processors under another version than the one before it
	// (the antidote deploy): the in-process alarm slice fires now, however far its backoff set it,
	// so the registry resets the crash-loop budget and revives at once.
	newVersion bool
	// clockBack: the wall clock went back this far (ms) since the waits of this stream were
	// armed (Server.noteClock): retry times, wall times, lie that much further ahead than the
	// ladder set them, and the processors' alarm slices too.
	clockBack int64
	settles   []chan<- int      // not the step's: Settle callers the actor answers after it
	written   []chan<- struct{} // not the step's: barriers answered once the step's flush committed
}

// deliveryOutcome is what one push reports: how far the cursor may move and, if the try
// failed, how. A push both advances (a healthy prefix, a filter watermark) and fails at once
// when a later event of its batch failed.
type deliveryOutcome struct {
	name        string
	gen         int64
	birth, seek int64 // the epochs the push was read under
	through     int64 // the cursor may move to here (0: not at all)
	delivered   bool  // the receiver took events (a success: the skip count resets)
	notStarted  bool  // refused at its project's share of the held streams: the row is not even touched, so a wait writes nothing
	failure     *deliveryFailure
	// An offset-acking subscription's try (pushJob.acking): through is how far it delivered,
	// lastEvent the offset of the last event it carried (0: none) and confirmed what the
	// receiver's answer confirmed (0: nothing). resets is the job's.
	acking    bool
	lastEvent int64
	offsets   []int64 // the offsets of the events it carried
	confirmed int64
	resets    uint64
	// before is, for a failed offset-acking try, the offset the events before its failing one
	// end at: what earlier tries delivered, or this one carried. They are confirmed, or the
	// event is not skipped (a skip would pass them too).
	before int64
}

// pushJob is a delivery try the actor starts: read after row.ConfirmedOffset up to head, at most
// limit events, and report a deliveryOutcome.
type pushJob struct {
	name  string
	gen   int64
	row   storage.CursorRow
	head  int64
	limit int // events per delivery (the subscription's maxDeliveryEvents, or 1 while isolating)
	// maxBytes: bytes per delivery (the subscription's maxDeliveryBytes); the first event always goes.
	maxBytes int
	recent   []itx.Event // the last commit's events, set by the actor (see view.recent)
	// procSeek is the seek epoch a processor-wake subscription's progress honors (procRecord.Seek).
	procSeek int64
	// after is where the read starts: row.ConfirmedOffset, or, for an offset-acking
	// subscription (acking), where its last delivery ended.
	after  int64
	acking bool
	resets uint64
}

// stepEnv is what a step may consult besides the state: configuration, pure functions, and one
// read-only look-up of committed idempotency keys (like raft's Storage, read inside the step).
type stepEnv struct {
	rc              reduceContext
	lookupKeys      func(keys []string) (map[string]*itx.Event, error)
	loadKV          func(key string) ([]byte, error) // a committed kv value (nil: none)
	maxProcKVKeys   int                              // the processors' KV bounds (0: none)
	maxProcKVBytes  int64
	random          func() float64
	flushDelay      time.Duration
	deliveryTimeout time.Duration
	batchLimits     func(name string) int // events per delivery: the config's BatchLimits
	// loadScheduled reads the events of scheduled appends by key (committed ones only).
	loadScheduled func(keys []string) (map[string][]byte, error)
	maxScheduled  int // scheduled appends per stream (0: none)
	// mountedNow is the generation of the mount a subscription's receiver is reached through
	// now (an itx-call capability, a remote processor host), 0 when none: an absent failure
	// parks only while nothing other than the receiver that vanished is mounted. nil: none.
	mountedNow func(entry *catalogEntry) uint64
	// room is nil while an append may add events (the data directory's disk above its reserve,
	// the project under its quota), else the error it is refused with (nil func: no bound).
	room func() error
}

// step applies one batch of inputs to st and returns what to do about it. It mutates st in place;
// if the returned commit then fails, the actor drops st and reloads it from storage, as after a
// crash, so memory never runs ahead of disk for longer than one failed step.
func step(st *streamState, in stepInput, now time.Time, env stepEnv) (effects, error) {
	var eff effects
	nowMs := itx.UnixMilli(now)

	// 1. Appends: plan them (core events reduced inline), in queue order, then the scheduled
	// appends that are due (each alone: one refused never holds back another).
	group := in.appends
	var due []*scheduled
	if !in.final && len(st.scheduled) > 0 && st.earliestDue() <= nowMs {
		due, _ = st.dueScheduled(nowMs)
		due = due[:min(len(due), itx.MaxAppendEvents)] // the rest in the next step
		raw, err := env.loadScheduled(scheduledKeys(due))
		if err != nil {
			return eff, err
		}
		for _, sc := range due {
			input, err := unmarshalScheduled(raw[sc.Key])
			if err != nil {
				return eff, fmt.Errorf("scheduled event %q does not decode: %w", sc.Key, err)
			}
			group = append(group, &appendReq{inputs: []itx.EventInput{input}, authority: authClient})
		}
	}
	committed, err := env.lookupKeys(keysOf(group))
	if err != nil {
		return eff, err
	}
	plan := planGroup(st.head, st.streamID, st.bucket, env.room, st.core, env.rc, group, committed, now)
	eff.replies = append(eff.replies, replyBatch{group: group, plan: plan})
	st.absorb(plan, now, env, &eff)
	var own []*appendReq
	heldBack := false // the breaker refused a due one: the due ones wait scheduledRetry
	for i, sc := range due {
		r := plan.Replies[len(in.appends)+i]
		if c := itx.ErrorCode(r.err); c == itx.ERateLimited || c == itx.EResourceExhausted {
			heldBack = true
			continue // the breaker is open, or the disk is short: it stays, and is tried again (see wakeAt below)
		}
		// Appended, a duplicate of what its key already holds, or refused for good (its key
		// taken by another body): either way it is done, and a refusal is recorded.
		delete(st.scheduled, sc.Key)
		st.firstDue = -1
		eff.commit.ScheduledDeletes = append(eff.commit.ScheduledDeletes, sc.Key)
		if r.err != nil {
			own = append(own, serverRecord(itx.TypeErrorOccurred, itx.ErrorOccurredPayload{
				Message: fmt.Sprintf("scheduled event %q was not appended: %s", sc.Key, itx.ErrorMessage(r.err))},
				"scheduled", sc.Key, sc.DueAt, 0, 0))
		}
	}

	// 2. Delivery outcomes, fenced by epoch and generation; failures go through the ladder and
	// may append server-authored records (halts, skips, expression failures).
	failed := false
	for i := range in.outcomes {
		own = append(own, st.applyOutcome(&in.outcomes[i], nowMs, env, &eff)...)
		failed = failed || in.outcomes[i].failure != nil
	}

	// 3. Mounts un-park the itx-call subscriptions waiting for them, and cut their backoff.
	for _, capability := range in.mounted {
		for name, entry := range st.core.Subscriptions {
			r := st.rows[name]
			if r == nil || waitsFor(entry) != capability {
				continue
			}
			if rt := st.subs[name]; rt != nil && entry.Config.ConfirmWindow > 0 && (env.mountedNow == nil || env.mountedNow(entry) != rt.runMount) {
				// A new receiver under the name: what the old one took unconfirmed goes again
				// (not for a late signal of the mount the sends already went to).
				rt.resetSending()
			}
			if r.Status == storage.StatusParked {
				r.Status, r.LastError = storage.StatusActive, ""
				st.touch(name, now)
			} else if r.Status == storage.StatusActive && r.NextAttemptAt > nowMs {
				r.NextAttemptAt = 0
				st.touch(name, now)
			}
		}
	}

	// 3'. An unmount (a provider or processor host that disconnected or let its mount go) parks
	// the subscriptions it served, as a failed delivery would, unless something mounted under
	// the name since: a caught-up subscription shows its receiver gone without waiting for an
	// event. A push in flight is left to its own outcome: a failure parks it on its own, and
	// once the outcome is in (a success too, as when the provider answered and then let go) it
	// parks here.
	parkUnmounted := func(name string, entry *catalogEntry, r *storage.CursorRow) {
		if env.mountedNow != nil && env.mountedNow(entry) != 0 {
			return
		}
		what := fmt.Sprintf("capability %q is offline: no Receiver is mounted under that name", entry.Config.Receiver.Capability)
		if entry.Kind() == itx.KindProcessorWake {
			what = fmt.Sprintf("no processor host announcing %q is mounted", entry.Config.ProcessorContract())
		}
		r.Status, r.NextAttemptAt = storage.StatusParked, 0
		r.LastError = truncate(itx.Errorf(itx.ECapabilityOffline, "%s (it was unmounted)", what).Error(), itx.MaxCursorErrorLength)
		st.touch(name, now)
		eff.rowsChanged = true // describe and live state show it at once
		// A park like one a delivery finds: logged and counted (itx_subscription_parks_total),
		// or the gauge of parked subscriptions rises with no park counted or logged.
		eff.ladder = append(eff.ladder, ladderNote{name: name, decision: decidePark, offset: r.ConfirmedOffset, attempts: r.Attempt, msg: r.LastError})
	}
	for name, rt := range st.subs {
		if !rt.unmountedInFlight || rt.inFlight {
			continue
		}
		rt.unmountedInFlight = false
		if entry, r := st.core.Subscriptions[name], st.rows[name]; entry != nil && r != nil && waitsFor(entry) != "" && r.Status == storage.StatusActive {
			parkUnmounted(name, entry, r)
		}
	}
	for _, capability := range in.unmounted {
		for name, entry := range st.core.Subscriptions {
			r, rt := st.rows[name], st.subs[name]
			if r == nil || waitsFor(entry) != capability || r.Status != storage.StatusActive {
				continue
			}
			if rt != nil && rt.inFlight {
				rt.unmountedInFlight = true
				continue
			}
			parkUnmounted(name, entry, r)
		}
	}

	// 3a. A remote processor backing off (its alarm slice armed ahead) is woken when a host
	// announcing its contract mounts: a new build there (the antidote deploy) resets its
	// breaker's budget and revives it at once; the same build finds it not due and re-arms it
	// where it was. Likewise the in-process slice when this process runs a new version.
	for _, capability := range in.mounted {
		for name, entry := range st.core.Subscriptions {
			if entry.Kind() == itx.KindProcessorWake && waitsFor(entry) == capability {
				st.fireEarly(name, nowMs, &eff)
			}
		}
	}
	if in.newVersion {
		st.fireEarly("", nowMs, &eff)
	}
	if in.clockBack > 0 {
		// Each retry waits the rest of what the ladder set, not that plus the step. The
		// processors' slices fire now: a keepalive takes its own times again (an early fire
		// is tolerated: it arms its slice again, see processors.Registry.HandleAlarm).
		for name, r := range st.rows {
			if r.NextAttemptAt > nowMs {
				r.NextAttemptAt = max(nowMs, r.NextAttemptAt-in.clockBack)
				st.touch(name, now)
			}
		}
		owners := make([]string, 0, len(st.procAlarms))
		for owner := range st.procAlarms {
			owners = append(owners, owner)
		}
		sort.Strings(owners)
		for _, owner := range owners {
			st.fireEarly(owner, nowMs, &eff)
		}
	}

	// 3b. A new incarnation of a stream whose processors this server hosts says so once.
	if in.woken != "" {
		own = append(own, serverRecord(itx.TypeWoken, map[string]any{"incarnationId": in.woken, "reason": "loaded"},
			"woken", in.woken, 0, 0, 0))
	}

	// 4. The server's own records, planned after everything above.
	if len(own) > 0 {
		committed, err := env.lookupKeys(keysOf(own))
		if err != nil {
			return eff, err
		}
		ownPlan := planGroup(st.head, st.streamID, st.bucket, nil, st.core, env.rc, own, committed, now)
		for i, r := range ownPlan.Replies {
			if r.err != nil {
				return eff, fmt.Errorf("server record %s refused: %w", own[i].inputs[0].Type, r.err)
			}
		}
		st.absorb(ownPlan, now, env, &eff)
	}

	// 4b. Registered readers: validated against the head, written with this commit.
	for _, op := range in.readers {
		if op.confirm {
			confirmed, err := st.applyConfirm(op, now, &eff)
			if op.confirmed != nil {
				*op.confirmed = confirmed
			}
			eff.readerReplies = append(eff.readerReplies, readerReply{op: op, err: err})
			continue
		}
		eff.readerReplies = append(eff.readerReplies, readerReply{op: op, err: st.applyReader(op, now, env.rc, &eff)})
	}

	// 4c. Processor port writes: progress records (fenced), KV, the alarm slice; first, the
	// records of removed processors are forgotten, so a write of theirs in this step is fenced.
	for _, name := range eff.forgetProcs {
		st.forgetProc(name, env, &eff)
	}
	for _, op := range in.procOps {
		eff.procAnswers = append(eff.procAnswers, procAnswer{op: op, reply: st.applyProc(op, now, env, &eff)})
	}

	// 4d. Scheduled appends: schedule, move or cancel.
	for _, op := range in.schedules {
		eff.scheduleAnswers = append(eff.scheduleAnswers, scheduleAnswer{op: op, reply: st.applySchedule(op, env, &eff)})
	}

	if len(eff.commit.ScheduledUpserts) > 0 || len(eff.commit.ScheduledDeletes) > 0 {
		eff.rowsChanged = true // publish the new list
	}

	// 5. The commit: new events, and the dirty rows when anything else is written, when the flush
	// delay passed, when unloading, or when a try failed. Progress alone may wait for the delay (a
	// crash only redelivers), but the retry state a failure decided (attempt, next attempt time,
	// last error, a park) is written at once, so a restart goes on along the ladder instead of
	// starting it over with a try before its time. Tries are spaced by the backoff, so this costs
	// at most one commit per failed try.
	if len(eff.commit.Events) > 0 || len(eff.commit.KV) > 0 || len(eff.commit.KVDeletes) > 0 || len(eff.commit.CursorDeletes) > 0 || eff.coreChanged || in.flush || in.final ||
		failed || eff.confirmed || eff.retryCleared || len(eff.commit.ReaderUpserts) > 0 || len(eff.commit.ReaderDeletes) > 0 ||
		len(eff.commit.ScheduledUpserts) > 0 || len(eff.commit.ScheduledDeletes) > 0 {
		eff.commit.CursorUpserts = eff.commit.CursorUpserts[:0]
		names := make([]string, 0, len(st.dirty))
		for name := range st.dirty {
			if st.rows[name] != nil {
				names = append(names, name)
			}
		}
		sort.Strings(names)
		for _, name := range names {
			eff.commit.CursorUpserts = append(eff.commit.CursorUpserts, *st.rows[name])
		}
		clear(st.dirty)
		eff.flushed = true
	}
	// A stream exists from its first commit: one with events, or one that registers a reader
	// (seed 000's browser mirror registers its position before anything is written; issue 9's
	// checkpoint is at most the head, 0 here). That commit creates the stream's database if it
	// has none, and writes bornKey, which says so to every later load and start when the head
	// is still 0 (a creation a crash cut short is dropped at start; this one is not). A reader
	// removed afterwards leaves the stream: it exists until it is deleted.
	bornNow := !st.born && (len(eff.commit.Events) > 0 || len(eff.commit.ReaderUpserts) > 0 || len(eff.commit.ReaderDeletes) > 0)
	// The creating commit checkpoints the core state too, even an empty one: a stream without a
	// checkpoint is re-reduced from offset 1 by every reload, and a reload after a commit a full
	// disk refused cannot write one either (each refused append would read the whole stream).
	if eff.coreChanged || bornNow {
		b, err := json.Marshal(st.core)
		if err != nil {
			return eff, fmt.Errorf("encode core state: %w", err)
		}
		if eff.commit.KV == nil {
			eff.commit.KV = map[string][]byte{}
		}
		eff.commit.KV[coreStateKey] = b
	}
	if len(eff.commit.Events) > 0 {
		eff.commit.HeadOffset, eff.commit.LastAppendAt = st.head, st.lastAppendAt
	}
	if bornNow {
		eff.commit.KV[bornKey] = []byte(strconv.FormatInt(nowMs, 10))
		eff.createStream, eff.born, st.born = !st.created, true, true
	}
	if eff.hasWrites() {
		// Any commit can move what the directory summarizes: the head, and where consumers
		// stand (cursor rows, readers). Marked once per load; refreshed on unload or restart.
		eff.markStale = !st.summaryOld
	}
	if eff.hasWrites() && !st.alarmSet && (len(st.core.Subscriptions) > 0 || len(st.scheduled) > 0 || st.retention.MaxAgeMs > 0) {
		eff.alarmNow = true
	}
	if !eff.flushed && len(st.dirty) > 0 {
		eff.flushAfter = env.flushDelay
	}
	if in.final {
		return eff, nil
	}

	// 5b. The next scheduled append comes due then; one the breaker refused is tried a second on.
	// One due now that this step did not try (scheduled for a time already past, or past the
	// 1,000 a step lands) is landed by another step at once.
	if len(st.scheduled) > 0 {
		at := st.earliestDue()
		if at <= nowMs && !heldBack {
			eff.stepAgain = true
		} else {
			if at <= nowMs {
				at = nowMs + scheduledRetry.Milliseconds()
			}
			if eff.wakeAt == 0 || at < eff.wakeAt {
				eff.wakeAt = at
			}
		}
	}

	// 6. The processors' alarm, then pushes: every active subscription behind the head with its
	// retry due and nothing in flight.
	for owner, at := range st.procAlarms {
		if at <= 0 || st.procFiring[owner] {
			continue
		}
		if at <= nowMs {
			st.procFiring[owner] = true
			eff.fireProcAlarms = append(eff.fireProcAlarms, owner)
		} else if eff.wakeAt == 0 || at < eff.wakeAt {
			eff.wakeAt = at
		}
	}
	sort.Strings(eff.fireProcAlarms)
	for name, entry := range st.core.Subscriptions {
		r, rt := st.rows[name], st.subs[name]
		if r == nil || rt == nil || rt.inFlight || r.Status != storage.StatusActive {
			continue
		}
		after, window, held := r.ConfirmedOffset, int64(entry.Config.ConfirmWindow), int64(0)
		if window > 0 {
			// Offset-acking: on from the last delivery while the window has room for events
			// (and the deliveries out unconfirmed are within their bound). A run of sends goes
			// to one mount of the receiver: another one mounted meanwhile starts a new run.
			if env.mountedNow != nil {
				if m := env.mountedNow(entry); m != rt.runMount {
					if len(rt.marks) > 0 {
						rt.resetSending()
					}
					rt.runMount = m
				}
			}
			after, held = max(after, rt.sendFrom), rt.heldEvents(r.ConfirmedOffset)
			if held >= window || len(rt.marks) >= MaxAckingDeliveries {
				continue
			}
		}
		if after >= st.head {
			continue
		}
		if r.NextAttemptAt > retryHorizon(nowMs) {
			// Set before the wall clock went back (see retryHorizon): due now, rather than when
			// the clock reads that time again, as long after as it went back.
			r.NextAttemptAt = nowMs
			st.touch(name, now)
		}
		if r.NextAttemptAt > nowMs {
			if eff.wakeAt == 0 || r.NextAttemptAt < eff.wakeAt {
				eff.wakeAt = r.NextAttemptAt
			}
			continue
		}
		limit := env.batchLimits(name)
		if r.ConfirmedOffset < rt.isolateThrough {
			limit = 1
		}
		if window > 0 {
			limit = int(min(int64(limit), window-held))
		}
		rt.inFlight = true
		r.InFlightDeadlineAt = nowMs + env.deliveryTimeout.Milliseconds()
		if st.core.Subscriptions[name].Kind() == itx.KindProcessorWake {
			// A wake, in-process or remote, is given up at twice the delivery timeout.
			r.InFlightDeadlineAt = nowMs + 2*env.deliveryTimeout.Milliseconds()
		}
		r.InFlightConnectionGeneration = rt.gen
		job := pushJob{name: name, gen: rt.gen, row: *r, head: st.head, limit: limit, after: after, acking: window > 0, resets: rt.resets}
		_, job.maxBytes = st.core.Subscriptions[name].Config.BatchLimits()
		if st.core.Subscriptions[name].Kind() == itx.KindProcessorWake {
			// Both placements: the wake asks for the operator's rewind only while the committed
			// record does not honor it, so a rewind a host took in a wake that then failed (or
			// whose report was lost) is not asked again by the retry, which would run
			// ProcessEvent over the same events again, nor by every later wake.
			if rec, err := st.procRecordOf(name, env); err == nil {
				job.procSeek = rec.Seek
			}
		}
		eff.pushes = append(eff.pushes, job)
	}
	if len(eff.pushes) > 0 {
		// A push written into its row's in-flight block is part of the row describe shows
		// (seed 000's in_flight_deadline_at, in_flight_connection_generation): publish it.
		eff.rowsChanged = true
	}
	sort.Slice(eff.pushes, func(i, j int) bool { return eff.pushes[i].name < eff.pushes[j].name })
	return eff, nil
}

// readerOp registers (or moves) a reader's checkpoint, or removes the reader.
type readerOp struct {
	name       string
	checkpoint int64
	remove     bool
	// by is the caller's right over readers others registered (ReaderCaller).
	by    ReaderCaller
	reply chan error // buffered
	// confirm: Subscription.confirm of an offset-acking subscription through checkpoint; the
	// step sets *confirmed to its confirmed cursor (answered once that is written).
	confirm   bool
	confirmed *int64
}

type readerReply struct {
	op  readerOp
	err error
}

// applyReader validates one reader operation and stages its write.
func (st *streamState) applyReader(op readerOp, now time.Time, rc reduceContext, eff *effects) error {
	// The subscription name's rules (one name space), in the reader's words: "reader name must
	// not be empty", not "reader name: subscription name must not be empty".
	if err := itx.ValidateName("reader name", op.name); err != nil {
		return err
	}
	if op.remove {
		r, ok := st.readers[op.name]
		if !ok {
			return itx.Errorf(itx.ENotFound, "reader %q is not registered", op.name)
		}
		if err := op.by.mayChange(r); err != nil {
			return err
		}
		delete(st.readers, op.name)
		eff.commit.ReaderUpserts = removeReader(eff.commit.ReaderUpserts, op.name)
		eff.commit.ReaderDeletes = append(eff.commit.ReaderDeletes, op.name)
		eff.rowsChanged = true
		return nil
	}
	// At most the head (issue 9), which is 0 on a stream with no event yet: registering there
	// creates the stream (its first commit, see step), one beyond it writes nothing.
	if op.checkpoint < 0 || op.checkpoint > st.head {
		return itx.Errorf(itx.EInvalid, "checkpoint %d is outside 0..%d (the stream's head)", op.checkpoint, st.head)
	}
	if !st.born && op.by.NoHold {
		// Creating a stream is a writer's or a consumer's act: a caller that may only read (a
		// read-only token, a readOnly() attenuation) would otherwise fill the project's stream
		// bound with empty streams, and the writers' next new path would be refused.
		return itx.Errorf(itx.ENotFound, "the stream does not exist yet, and registering a reader creates it only for a caller with the subscribe right (this one may only read): register after its first append")
	}
	if st.core.Subscriptions[op.name] != nil {
		return itx.Errorf(itx.EFailedPrecondition, "%q names a subscription of this stream: reader names share the subscription name space", op.name)
	}
	was, registered := st.readers[op.name]
	owner := op.by.TokenID
	if op.by.Principal != "" {
		owner = op.by.Principal
	}
	noHold := op.by.NoHold
	if registered {
		if err := op.by.mayChange(was); err != nil {
			return err
		}
		// A move keeps a hold a holder of subscribe gave it (its own readOnly() moves it on);
		// an admin's move leaves it its registrant's, holding as it did.
		noHold = was.NoHold && noHold
		if was.Owner != "" && was.Owner != owner {
			owner, noHold = was.Owner, was.NoHold
		}
	}
	if !registered {
		// New names only: a reader registered before the prefix was reserved still moves.
		if err := notGenerated("reader name", op.name); err != nil {
			return err
		}
	}
	if !registered && rc.maxReaders > 0 && len(st.readers) >= rc.maxReaders {
		return itx.Errorf(itx.ELimitExceeded, "a stream may have at most %d registered readers (--max-readers-per-stream)", rc.maxReaders)
	}
	r := storage.Reader{Name: op.name, Checkpoint: op.checkpoint, UpdatedAt: itx.UnixMilli(now), Owner: owner, NoHold: noHold}
	st.readers[op.name] = r
	// A delete staged earlier in this step may stay: a commit deletes before it upserts.
	eff.commit.ReaderUpserts = append(removeReader(eff.commit.ReaderUpserts, op.name), r)
	eff.rowsChanged = true
	return nil
}

// notGenerated refuses a connection key or reader name in the prefix of generated subscription
// names (seed 000: "one reserved prefix survives: auto-generated names are subscription:<offset>"):
// in the one name space they share, a configure without a name must never find its generated
// name taken.
func notGenerated(what, name string) error {
	if strings.HasPrefix(name, itx.GeneratedNamePrefix) {
		return itx.Errorf(itx.EInvalid, "%s %q: names beginning %q are reserved for subscriptions configured without a name", what, name, itx.GeneratedNamePrefix)
	}
	return nil
}

func removeReader(rs []storage.Reader, name string) []storage.Reader {
	out := rs[:0]
	for _, r := range rs {
		if r.Name != name {
			out = append(out, r)
		}
	}
	return out
}

// keysOf lists the idempotency keys a group uses, once each.
func keysOf(group []*appendReq) []string {
	var keys []string
	seen := map[string]bool{}
	for _, r := range group {
		for i := range r.inputs {
			if key := r.inputs[i].IdempotencyKey; key != "" && !seen[key] {
				seen[key] = true
				keys = append(keys, key)
			}
		}
	}
	return keys
}

// absorb takes a planned group into the state and the pending commit: its events, the new core
// state, and the cursor rows its core events changed.
func (st *streamState) absorb(plan groupPlan, now time.Time, env stepEnv, eff *effects) {
	if len(plan.Events) == 0 && plan.Core == st.core {
		return
	}
	eff.commit.Events = append(eff.commit.Events, plan.Events...)
	if len(plan.Events) > 0 {
		st.head, st.lastAppendAt = plan.Head, itx.UnixMilli(now)
	}
	if plan.Core != st.core {
		st.core = plan.Core
		eff.coreChanged = true
	}
	for _, ce := range plan.Effects {
		name := ce.name
		switch ce.kind {
		case effectRemove:
			eff.forgetProcs = appendOnce(eff.forgetProcs, name)
			delete(st.rows, name)
			delete(st.dirty, name)
			delete(st.subs, name)
			eff.commit.CursorDeletes = append(eff.commit.CursorDeletes, name)
			eff.rebuild = appendOnce(eff.rebuild, name)
			continue
		case effectBorn:
			// A new birth epoch: outcomes of the old deliverer are fenced by it and by generation.
			// A delete of the old row staged in this step may stay: a commit deletes first.
			st.subs[name] = st.newRuntime()
			eff.rebuild = appendOnce(eff.rebuild, name)
			if ce.retire {
				eff.forgetProcs = appendOnce(eff.forgetProcs, name)
			}
		case effectReconfigure:
			// A new birth epoch and a new receiver, the cursor kept: fence the old deliverer (epoch, generation).
			if rt := st.subs[name]; rt != nil {
				*rt = *st.newRuntime()
			} else {
				st.subs[name] = st.newRuntime()
			}
			eff.rebuild = appendOnce(eff.rebuild, name)
		case effectSeek:
			if rt := st.subs[name]; rt != nil {
				rt.isolateThrough = 0
			}
		}
		if rt := st.subs[name]; rt != nil {
			rt.resetSending() // a halt, a resume, a seek: an offset-acking one sends from its cursor
		}
		pending := int64(0)
		if ce.kind == effectReconfigure {
			pending = st.pendingProcSeek(name, env)
		}
		st.rows[name] = applyEffect(st.rows[name], ce, now)
		if pending != 0 {
			// A processor's seek its runner has not taken yet (a cursor-set while it was halted,
			// parked or unhosted) survives the reconfigure, as a push subscription's cursor-set
			// does: the row keeps the position the operator set and the seek epoch the next
			// wake's rewind answers to (the new birth epoch and generation still fence the old
			// deliverer). Without it the row took the runner's own cursor back at its next
			// commit and the seek was lost: a poison event skipped, then the contract fixed
			// with a configure, was processed again.
			st.rows[name].CursorChangedAtOffset = pending
		}
		st.dirty[name] = true
	}
	eff.rowsChanged = eff.rowsChanged || len(plan.Effects) > 0
}

// pendingProcSeek returns the seek epoch of a cursor-set on the processor-wake subscription name
// that its processor has not honored yet (its progress record carries another), or 0.
func (st *streamState) pendingProcSeek(name string, env stepEnv) int64 {
	r, entry := st.rows[name], st.core.Subscriptions[name]
	if r == nil || entry == nil || entry.Kind() != itx.KindProcessorWake || r.CursorChangedAtOffset == r.ConfiguredAtOffset {
		return 0
	}
	rec, err := st.procRecordOf(name, env)
	if err != nil || rec.Seek == r.CursorChangedAtOffset {
		return 0 // unreadable: as before, the reconfigure is a new seek epoch
	}
	return r.CursorChangedAtOffset
}

func (st *streamState) newRuntime() *subRuntime {
	st.nextGen++
	return &subRuntime{gen: st.nextGen}
}

// applyAcking takes an offset-acking subscription's try: what it delivered moves the delivered
// offset and, unless a reset came after the try started, where the next delivery starts; what
// the receiver confirmed moves the cursor.
func (st *streamState) applyAcking(o *deliveryOutcome, r *storage.CursorRow, rt *subRuntime) {
	before := max(r.DeliveredOffset, r.ConfirmedOffset)
	if o.resets == rt.resets && o.through > max(r.ConfirmedOffset, rt.sendFrom) {
		if n := len(rt.marks); n > 0 && o.lastEvent == 0 {
			// Nothing carried (the filter passed over what it read): it goes with the delivery
			// before it, so marks stay within the window's events.
			rt.marks[n-1].through = o.through
		} else {
			rt.marks = append(rt.marks, deliveryMark{last: o.lastEvent, through: o.through})
		}
		rt.held = append(rt.held, o.offsets...)
		rt.sendFrom = o.through
	}
	// What it carried was delivered, also by a try a reset made stale (the receiver answered):
	// the receiver may confirm it, though sending starts over from the cursor.
	r.DeliveredOffset = max(r.DeliveredOffset, o.through)
	if o.delivered && (o.through > before || (r.FailingEventOffset > 0 && o.through >= r.FailingEventOffset)) {
		// A success clears the retry block only once it delivers something the receiver did
		// not take before, or the event that failed: after a failure the unconfirmed events
		// before it go again, and their success says nothing about it (else its attempts would
		// restart at every retry and the ladder would never skip or halt it). Both are kept
		// with the row, so this holds across an unload between retries.
		r.Attempt, r.NextAttemptAt, r.LastError = 0, 0, ""
		r.FailingEventOffset, r.FailingEventAttempt, r.FailingEventSkips = 0, 0, 0
	}
	confirmTo(r, rt, min(o.confirmed, max(r.DeliveredOffset, r.ConfirmedOffset)))
	if r.ConfirmedOffset >= rt.isolateThrough {
		rt.isolateThrough = 0
	}
}

// applyConfirm takes Subscription.confirm: an offset-acking subscription's receiver confirms
// through offset, at most what was delivered. It returns the confirmed cursor.
func (st *streamState) applyConfirm(op readerOp, now time.Time, eff *effects) (int64, error) {
	entry, r, rt := st.core.Subscriptions[op.name], st.rows[op.name], st.subs[op.name]
	if entry == nil || r == nil || rt == nil {
		if _, isReader := st.readers[op.name]; isReader {
			return 0, itx.Errorf(itx.EFailedPrecondition, "%q is a registered reader: readers().register moves its checkpoint", op.name)
		}
		return 0, itx.Errorf(itx.ENotFound, "no subscription %q on this stream", op.name)
	}
	if entry.Config.ConfirmWindow == 0 {
		return 0, itx.Errorf(itx.EFailedPrecondition, "subscription %q is not offset-acking (no confirmWindow): its receiver's answers confirm its deliveries", op.name)
	}
	if delivered := max(r.DeliveredOffset, r.ConfirmedOffset); op.checkpoint > delivered {
		return 0, itx.Errorf(itx.EInvalid, "offset %d was not delivered to subscription %q: delivered through %d", op.checkpoint, op.name, delivered)
	}
	if confirmTo(r, rt, op.checkpoint) {
		if r.ConfirmedOffset >= rt.isolateThrough {
			rt.isolateThrough = 0
		}
		st.touch(op.name, now)
		eff.rowsChanged = true
		eff.confirmed = true
	} else if st.dirty[op.name] {
		// The cursor did not move, but where it is may not be written yet (a receiver's answer
		// confirmed it, and progress waits for the flush): the reply names it, so write it first.
		eff.confirmed = true
	}
	return r.ConfirmedOffset, nil
}

// touch marks a row changed in memory: it rides the next commit, or the flush after the delay.
func (st *streamState) touch(name string, now time.Time) {
	if r := st.rows[name]; r != nil {
		r.UpdatedAt = stamp(now)
		st.dirty[name] = true
	}
}

// applyOutcome moves a cursor row for a finished push, under the fence of the epochs it was read
// under and its deliverer's generation; a late outcome is refused. It returns the server's own
// records the ladder's decision needs appended.
func (st *streamState) applyOutcome(o *deliveryOutcome, nowMs int64, env stepEnv, eff *effects) []*appendReq {
	now := time.UnixMilli(nowMs)
	rt := st.subs[o.name]
	if rt != nil && rt.gen == o.gen {
		rt.inFlight = false
	}
	r := st.rows[o.name]
	entry := st.core.Subscriptions[o.name]
	if r == nil || entry == nil || rt == nil || rt.gen != o.gen || r.ConfiguredAtOffset != o.birth || r.CursorChangedAtOffset != o.seek {
		eff.lateOutcomes++
		return nil
	}
	eff.rowsChanged = true
	r.InFlightDeadlineAt, r.InFlightConnectionGeneration = 0, 0
	if o.notStarted {
		return nil
	}
	block := retryBlockOf(r)
	if o.acking {
		st.applyAcking(o, r, rt)
	} else if o.through > r.ConfirmedOffset {
		// Progress: the retry block describes the position the cursor just left.
		r.ConfirmedOffset = o.through
		r.Attempt, r.NextAttemptAt, r.LastError = 0, 0, ""
		r.FailingEventOffset, r.FailingEventAttempt = 0, 0
		if o.delivered {
			r.FailingEventSkips = 0
		}
		if r.ConfirmedOffset >= rt.isolateThrough {
			rt.isolateThrough = 0
		}
	}
	st.touch(o.name, now)
	f := o.failure
	if f == nil {
		// Progress alone may wait for the flush, but a success that clears the retry block is
		// written at once: left to the flush, a crash brought back the attempts, the failing
		// event and the skips of the outage or poison events the receiver had got past (an
		// offset-acking subscription's resends after the restart do not clear them again), so the
		// next failure could halt at once, or the next skip halt.
		if retryBlockOf(r) != block {
			eff.retryCleared = true
		}
		return nil
	}
	// An offset-acking try: a skip of its failing event may go after the unconfirmed deliveries
	// before it (as a delivery of nothing), when they reach just before it in this run of sends.
	var kept subRuntime
	markable := false
	if o.acking {
		markable = o.resets == rt.resets && max(rt.sendFrom, r.ConfirmedOffset) == o.before
		kept = subRuntime{sendFrom: rt.sendFrom, marks: rt.marks, held: rt.held, runMount: rt.runMount}
		rt.resetSending() // what the receiver took unconfirmed goes again, from the confirmed cursor
	}
	eff.failedKinds = append(eff.failedKinds, entry.Kind())
	var own []*appendReq
	if f.expression {
		// Evidence, once per failing event (its key makes a retry's record a duplicate).
		own = append(own, serverRecord(itx.TypeErrorOccurred, itx.ErrorOccurredPayload{Message: truncate(fmt.Sprintf(
			"subscription %q: %s", o.name, f.msg), itx.MaxHaltErrorLength)}, "subscription-expression-failed", o.name, r.ConfiguredAtOffset, r.CursorChangedAtOffset, f.eventOffset))
	}
	policy := entry.Config.Receiver.EffectiveDelivery().OnFailingEvent
	if entry.Kind() == itx.KindCopyToStream {
		policy = itx.OnFailingHalt // ordered receivers never skip
	}
	if o.acking && r.ConfirmedOffset < o.before && !markable {
		// Skipping the event would pass unconfirmed ones before it too, and they are not the
		// deliveries the step holds (a reset came meanwhile): not yet. It climbs the ladder
		// until they are confirmed or delivered again before it.
		policy = itx.OnFailingHalt
	}
	if f.mount != 0 && f.class != classAbsent && env.mountedNow != nil {
		if g := env.mountedNow(entry); g != 0 && g != f.mount {
			// The try reached a receiver that another has replaced under its name since (a
			// provider that reconnected, whose old session refused or timed out what it was
			// given): its failure says nothing of the events, nor of the receiver mounted now.
			// Deliver to that one at once, with no attempt burnt (an absence is decided below,
			// the same way).
			r.LastError = truncate(f.msg, itx.MaxCursorErrorLength)
			r.NextAttemptAt = 0
			return own
		}
	}
	if o.acking && policy == itx.OnFailingSkip && st.skippedAlready(o.name, r, f, env) {
		// Sending again from the confirmed cursor (after a failure, a new mount or a restart)
		// reached an event this subscription skipped already under its epochs: its skip record
		// is in the log. It stays skipped, passed over as the skip passed it, with no attempt
		// burnt and no second skip counted: counted again, a second failing event behind the
		// receiver's unconfirmed ones sent the first back up the ladder after each of its own
		// failures, and neither was ever passed; after a crash, the skips already taken counted
		// twice toward the halt. (A try a reset made stale is sent again from the cursor, at
		// once, and reaches the event again in order.)
		switch {
		case r.ConfirmedOffset < o.before && !markable:
		case r.ConfirmedOffset < o.before:
			rt.sendFrom, rt.held, rt.runMount = f.eventOffset, kept.held, kept.runMount
			rt.marks = append(kept.marks, deliveryMark{through: f.eventOffset})
			r.DeliveredOffset = max(r.DeliveredOffset, f.eventOffset)
		default:
			r.ConfirmedOffset = max(r.ConfirmedOffset, f.eventOffset)
			r.DeliveredOffset = max(r.DeliveredOffset, r.ConfirmedOffset)
		}
		r.NextAttemptAt = 0
		return own
	}
	if f.refolded {
		// Progress, though not past the cursor: the retry block starts over, as when the cursor
		// moves.
		r.Attempt, r.FailingEventOffset, r.FailingEventAttempt = 0, 0, 0
	}
	d := decideFailure(*r, *f, policy, nowMs, env.random())
	r.LastError = truncate(d.msg, itx.MaxCursorErrorLength)
	switch d.kind {
	case decideRetry:
		r.Attempt, r.NextAttemptAt = d.attempt, d.nextAttemptAt
		r.FailingEventOffset, r.FailingEventAttempt = d.failingOffset, d.failingAttempt
	case decideIsolate:
		rt.isolateThrough = d.isolateThrough
	case decidePark:
		if env.mountedNow != nil {
			if g := env.mountedNow(entry); g != 0 && g != f.mount {
				// The receiver the try reached is gone, but another was mounted under its
				// name meanwhile (a provider that reconnected took over before its old session
				// died): no absence. Its mount's presence signal may already have been taken,
				// so parking would wait for the next mount; deliver to it now instead.
				r.NextAttemptAt = 0
				break
			}
		}
		r.Status, r.NextAttemptAt = storage.StatusParked, 0
		eff.ladder = append(eff.ladder, ladderNote{name: o.name, decision: decidePark, offset: r.ConfirmedOffset, attempts: d.attempt, msg: d.msg})
	case decideSkip:
		deadLetter := entry.Config.Receiver.EffectiveDelivery().DeadLetterPath
		if deadLetter != "" && !f.deadLettered {
			// The try was read under an older row, so its deliverer did not land the dead letter
			// the skip waits for: try again at once, from this row.
			r.NextAttemptAt = 0
			break
		}
		eff.ladder = append(eff.ladder, ladderNote{name: o.name, decision: decideSkip, offset: d.skipOffset, attempts: d.failingAttempt, msg: d.msg, deadLetter: deadLetter})
		where := ""
		if deadLetter != "" {
			where = fmt.Sprintf(" (its dead letter is in %q)", deadLetter)
		}
		own = append(own, serverRecord(itx.TypeErrorOccurred, itx.ErrorOccurredPayload{Message: truncate(fmt.Sprintf(
			"subscription %q skipped failing event at offset %d after %d event-specific attempts%s: %s", o.name, d.skipOffset, d.failingAttempt, where, f.msg), itx.MaxHaltErrorLength)},
			skipRecordKind, o.name, r.ConfiguredAtOffset, r.CursorChangedAtOffset, d.skipOffset))
		if o.acking && r.ConfirmedOffset < o.before {
			// The events before it are delivered and unconfirmed: the skip goes after them, as a
			// delivery of nothing through the skipped event. Sending goes on past it, and the
			// cursor passes it once the receiver confirms them (it never passes them unasked).
			rt.sendFrom, rt.held, rt.runMount = d.skipOffset, kept.held, kept.runMount
			rt.marks = append(kept.marks, deliveryMark{through: d.skipOffset})
			r.DeliveredOffset = max(r.DeliveredOffset, d.skipOffset)
		} else {
			r.ConfirmedOffset = max(r.ConfirmedOffset, d.skipOffset)
			if o.acking {
				r.DeliveredOffset = max(r.DeliveredOffset, r.ConfirmedOffset)
			}
		}
		r.FailingEventSkips++
		r.Attempt, r.NextAttemptAt, r.FailingEventOffset, r.FailingEventAttempt = 0, 0, 0, 0
	case decideHalt:
		r.Attempt, r.FailingEventOffset, r.FailingEventAttempt = d.attempt, d.failingOffset, d.failingAttempt
		halted := itx.HaltedPayload{Name: o.name, Reason: "delivery-failed", AfterOffset: r.ConfirmedOffset, Attempts: d.attempt, Error: d.msg}
		own = append(own, serverRecord(itx.TypeSubscriptionHalted, halted, "", "", 0, 0, 0))
		eff.ladder = append(eff.ladder, ladderNote{name: o.name, decision: decideHalt, offset: r.ConfirmedOffset, attempts: d.attempt, msg: d.msg})
	}
	return own
}

// retryBlock is the part of a cursor row the retry ladder keeps.
type retryBlock struct {
	attempt, failingAttempt, skips int
	failingOffset                  int64
}

func retryBlockOf(r *storage.CursorRow) retryBlock {
	return retryBlock{attempt: r.Attempt, failingAttempt: r.FailingEventAttempt, skips: r.FailingEventSkips, failingOffset: r.FailingEventOffset}
}

// skipRecordKind keys the stream/error-occurred record of a skip (serverRecord): one per
// subscription epochs and skipped offset.
const skipRecordKind = "subscription-failing-event-skipped"

// skippedAlready reports whether the event whose failure f reports was skipped already by
// subscription name under the epochs of its row r: an offset-acking subscription may send it
// again (it sends again from its confirmed cursor), and its skip record in the log says so.
func (st *streamState) skippedAlready(name string, r *storage.CursorRow, f *deliveryFailure, env stepEnv) bool {
	if f.class != classEvent || f.eventOffset <= 0 || f.eventOffset > r.DeliveredOffset || env.lookupKeys == nil {
		return false
	}
	key := recordKey(skipRecordKind, name, r.ConfiguredAtOffset, r.CursorChangedAtOffset, f.eventOffset)
	found, err := env.lookupKeys([]string{key})
	return err == nil && found[key] != nil
}

// recordKey is the idempotency key of a server record of kind about subscription name (its
// epochs) and an offset.
func recordKey(kind, name string, birth, seek, offset int64) string {
	key, _ := json.Marshal([]any{name, birth, seek, offset})
	return internalKey(kind, key)
}

// serverRecord is an append of the stream's own authority. A non-empty kind keys it by the
// subscription's epochs and an offset, so the same record is written once whatever the retries.
func serverRecord(typ string, payload any, kind, name string, birth, seek, offset int64) *appendReq {
	b, _ := json.Marshal(payload)
	in := itx.EventInput{Type: typ, Payload: b}
	if kind != "" {
		in.IdempotencyKey = recordKey(kind, name, birth, seek, offset)
	}
	_ = in.Normalize()
	return &appendReq{inputs: []itx.EventInput{in}, authority: authCore}
}

func appendOnce(names []string, name string) []string {
	for _, n := range names {
		if n == name {
			return names
		}
	}
	return append(names, name)
}
