package processors

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"strconv"
	"sync"
	"time"

	"github.com/itx-dev/itx"
)

// DefaultPageSize is how many events a runner reads per page when it catches up or re-reduces.
const DefaultPageSize = 500

// DefaultFrameBudget is RunnerConfig.FrameBudget's default.
const DefaultFrameBudget = 10 * time.Second

// Tracker is told about every unit of in-flight work (a frame attempt, a blocker, a background
// attempt): the keepalive keeps an alarm ahead of it. done reports how the work ended.
type Tracker interface {
	Track() (done func(err error))
}

// RunnerConfig wires a runner to its host.
type RunnerConfig struct {
	Path     string        // the home stream's path (idempotency keys carry it)
	Log      StreamLog     // the home stream
	Progress ProgressStore // the fenced progress record
	Clock    itx.Clock     // the only time source
	Tracker  Tracker       // nil runs untracked (no keepalive)
	PageSize int           // 0 means DefaultPageSize
	// FrameBudget bounds how long one frame runs before it commits: once it has passed (on
	// Clock), the frame commits through the event whose ProcessEvent and blockers just ended,
	// as if it had been delivered cut there, and the rest of the frame is left to the next
	// delivery (CatchUp and a host's wake lane deliver it at once). A page of slow events
	// (a vendor call per event) then commits as it goes instead of being redelivered whole
	// each time a host's bound on the wake cuts it off. 0 means DefaultFrameBudget.
	FrameBudget time.Duration
	Logf        func(format string, args ...any)
	// BackgroundFailed, if set, hears each RunInBackground attempt that failed while the
	// incarnation lived (it is logged either way); one ended by Close is the eviction's, not a
	// failure.
	BackgroundFailed func(err error)
}

// Runner drives one processor over its home stream: one event at a time, one fenced progress
// commit per frame after every blocker settled. Frames, catch-ups and rewinds are serialized;
// readers (Snapshot, ProcessedThrough) see only committed progress.
type Runner[S any] struct {
	c   Contract[S]
	cfg RunnerConfig

	chain chan struct{} // a one-slot semaphore: a channel, so a waiter can also watch its ctx

	bgCtx    context.Context
	bgCancel context.CancelFunc

	mu            sync.Mutex
	generation    int64
	progress      Progress // committed
	state         S        // committed, decoded
	observedHead  int64
	highestAppend int64
	// The processor's appends to the home stream that a frame did not make itself (background
	// attempts, diagnostics, strays): a frame must not claim CaughtUp over a state that may lack
	// one of them (see heldBack).
	appending int       // home appends and schedules in flight, the frame's own included
	appendSeq int64     // bumped when an append or schedule that is not the running frame's starts
	frameTok  *frameTok // the running frame's token (its context carries it), nil between frames
	withheld  bool      // a pass reached the head but held its CaughtUp back: one is owed
	// offeredAt is the processing cursor at which the last committed frame reached the head (its
	// state had its pass there, or withheld owes it); -1 until one did in this incarnation. An
	// ephemeral-only range after it changes nothing a pass would decide on (see processFrame).
	offeredAt int64
	repassing bool // a repass is queued and has not started yet
	fenced    error
	changed   chan struct{} // closed and replaced on every commit
}

var _ Hosted = (*Runner[int])(nil)

// NewRunner returns a runner for c. Open must succeed before it delivers.
func NewRunner[S any](c Contract[S], cfg RunnerConfig) (*Runner[S], error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	if cfg.Log == nil || cfg.Progress == nil || cfg.Clock == nil {
		return nil, itx.Errorf(itx.EInvalid, "processor %q: runner needs a log, a progress store and a clock", c.Name)
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = DefaultPageSize
	}
	if cfg.FrameBudget <= 0 {
		cfg.FrameBudget = DefaultFrameBudget
	}
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	r := &Runner[S]{c: c, cfg: cfg, chain: make(chan struct{}, 1), changed: make(chan struct{}), offeredAt: -1}
	r.bgCtx, r.bgCancel = context.WithCancel(context.Background())
	return r, nil
}

// Name is the contract's name.
func (r *Runner[S]) Name() string { return r.c.Name }

// Consumes reports whether the contract consumes typ.
func (r *Runner[S]) Consumes(typ string) bool { return r.c.consumes(typ) }

// Open claims the progress record (fencing every earlier incarnation) and loads it. A reduction
// under another reducer version, one that no longer decodes, or one that lags the processing
// cursor is rebuilt with Reduce only through the cursor and committed: ProcessEvent never re-runs
// for acknowledged events.
func (r *Runner[S]) Open(ctx context.Context) error {
	if err := r.acquire(ctx); err != nil {
		return err
	}
	defer r.release()
	rec, gen, err := r.cfg.Progress.Claim(ctx, r.c.Name)
	if err != nil {
		return fmt.Errorf("open processor %q: %w", r.c.Name, err)
	}
	r.mu.Lock()
	r.generation = gen
	r.mu.Unlock()
	if rec == nil {
		r.publish(Progress{ReducerVersion: r.c.ReducerVersion, Contract: r.c.contractName()}, r.c.InitialState(), nil)
		return nil
	}
	if r.c.reducedBy(rec) && rec.ReducedThrough == rec.ProcessedThrough {
		if st, err := r.decode(rec.State); err == nil {
			r.publish(*rec, st, rec.State)
			return nil
		}
	}
	from, after := r.c.InitialState(), int64(0)
	if r.c.reducedBy(rec) && rec.ReducedThrough < rec.ProcessedThrough {
		if st, err := r.decode(rec.State); err == nil {
			from, after = st, rec.ReducedThrough // extend a lagging cache instead of refolding
		}
	}
	// A long refold commits as it goes, each FrameBudget, as a reduction lagging the processing
	// cursor, which the next Open extends: a host that bounds its wakes (a remote one: the
	// refold runs inside the wake) would otherwise cut it off whole, every time.
	lagging := func(st S, through int64) error {
		next := *rec
		next.ReducerVersion, next.ReducedThrough = r.c.ReducerVersion, through
		return r.commit(ctx, next, st)
	}
	st, err := r.reduceOnly(ctx, from, after, rec.ProcessedThrough, lagging)
	if err != nil {
		return fmt.Errorf("open processor %q: re-reduce: %w", r.c.Name, err)
	}
	next := *rec
	next.ReducerVersion, next.ReducedThrough = r.c.ReducerVersion, rec.ProcessedThrough
	return r.commit(ctx, next, st)
}

// Deliver processes one frame. A frame with work in it is tracked by the keepalive, so an
// incarnation that dies mid-frame is revived. When the frame leaves the cursor below the head it reported (a
// filtered frame whose unconsumed tail the wake lane will not deliver), a trailing catch-up runs
// in the background so that tail cannot strand state-derived work. The processor's own appends
// are new events: the wake lane delivers them.
func (r *Runner[S]) Deliver(ctx context.Context, f Frame) error {
	if err := r.acquire(ctx); err != nil {
		return err
	}
	err := r.processFrame(ctx, f)
	behind := err == nil && !f.Continued && r.ProcessedThrough() < f.Head
	r.release()
	if behind {
		r.background(r.CatchUp)
	}
	return err
}

// CatchUp delivers the home stream from the processing cursor through the head it finds on its
// first read, page by page.
func (r *Runner[S]) CatchUp(ctx context.Context) error {
	if err := r.acquire(ctx); err != nil {
		return err
	}
	defer r.release()
	return r.catchUp(ctx)
}

// catchUp delivers up to the head it finds on its first read. It does not chase the processor's
// own appends beyond that head: they are new events, and the next wake (or CatchUp) delivers
// them, so a processor that appends on every pass cannot spin one call forever.
func (r *Runner[S]) catchUp(ctx context.Context) error {
	target := int64(-1)
	for {
		after := r.ProcessedThrough()
		if target >= 0 && after >= target {
			return nil
		}
		page, err := r.cfg.Log.Read(ctx, after, r.cfg.PageSize)
		if err != nil {
			return fmt.Errorf("catch up processor %q: %w", r.c.Name, err)
		}
		if target < 0 {
			target = page.Head
		}
		if page.ScannedThrough <= after {
			return nil
		}
		f := Frame{Events: page.Events, ScannedAfter: after, ScannedThrough: page.ScannedThrough, Head: page.Head, EphemeralOnly: page.EphemeralOnly}
		if err := r.processFrame(ctx, f); err != nil {
			return err
		}
	}
}

// ReprocessFrom moves the processing cursor to offset-1 under a new cursor revision, with the
// reduction rebuilt (Reduce only) through offset-1, so the next delivery runs ProcessEvent again
// from offset on with event-time state. It is the operator's rewind; the host reaches it through
// the subscription's cursor-set.
func (r *Runner[S]) ReprocessFrom(ctx context.Context, offset int64) error {
	if offset < 1 {
		return itx.Errorf(itx.EInvalid, "reprocess from offset %d: offsets start at 1", offset)
	}
	if err := r.acquire(ctx); err != nil {
		return err
	}
	defer r.release()
	if err := r.fence(); err != nil {
		return err
	}
	r.mu.Lock()
	next := r.progress
	r.offeredAt = -1 // the rewound state has not had its pass at the head
	r.mu.Unlock()
	next.ReducerVersion, next.ProcessedThrough = r.c.ReducerVersion, offset-1
	next.CursorRevision++
	// A long refold commits as it goes, as the rewound cursor with a reduction lagging it, which
	// the next frame (or open) extends: a remote host runs the rewind inside a bounded wake.
	lagging := func(st S, through int64) error {
		p := next
		p.ReducedThrough = through
		return r.commit(ctx, p, st)
	}
	st, err := r.reduceOnly(ctx, r.c.InitialState(), 0, offset-1, lagging)
	if err != nil {
		return fmt.Errorf("reprocess processor %q from %d: %w", r.c.Name, offset, err)
	}
	next.ReducedThrough = offset - 1
	return r.commit(ctx, next, st)
}

// extendReduction folds what a committed reduction lags its processing cursor by (a rewind's
// refold cut short), committing as it goes, so a frame starts from the state at its cursor.
func (r *Runner[S]) extendReduction(ctx context.Context) error {
	r.mu.Lock()
	p, from := r.progress, r.state
	r.mu.Unlock()
	if p.ReducedThrough >= p.ProcessedThrough {
		return nil
	}
	lagging := func(st S, through int64) error {
		q := p
		q.ReducedThrough = through
		return r.commit(ctx, q, st)
	}
	st, err := r.reduceOnly(ctx, from, p.ReducedThrough, p.ProcessedThrough, lagging)
	if err != nil {
		return fmt.Errorf("processor %q: extend the reduction through %d: %w", r.c.Name, p.ProcessedThrough, err)
	}
	p.ReducedThrough = p.ProcessedThrough
	return r.commit(ctx, p, st)
}

// processFrame is one frame: plan, then for each new consumed event Reduce, ProcessEvent and its
// blockers in FIFO order, then the eventless pass if owed, then one commit. Nothing is published
// before the commit lands; on any failure the committed state is what the next attempt starts
// from, and the frame is redelivered whole (at-least-once).
func (r *Runner[S]) processFrame(ctx context.Context, f Frame) (err error) {
	if err := r.fence(); err != nil {
		return err
	}
	if err := r.extendReduction(ctx); err != nil {
		return err
	}
	r.mu.Lock()
	committed := r.progress
	observed := max(r.observedHead, r.highestAppend)
	busy, seq := r.appending > 0, r.appendSeq
	// Seed 002: ephemeral appends never reach processor delivery. A range holding no durable
	// event leaves the state as it was; when that state already had its pass at the head (and
	// no held-back CaughtUp is owed), the range only moves the cursor: a stream of ephemeral
	// chunks must not run the at-head pass once per chunk. A state that has not had it (the
	// frame before was cut behind the head, a fresh incarnation, a rewind) still gets the
	// eventless pass, as behind a filtered durable tail.
	quiet := f.EphemeralOnly && !r.withheld && r.offeredAt == committed.ProcessedThrough
	r.mu.Unlock()
	plan, err := planFrame(committed.ProcessedThrough, observed, f, r.classify)
	if err != nil {
		return fmt.Errorf("processor %q: %w", r.c.Name, err)
	}
	r.mu.Lock()
	r.observedHead = max(r.observedHead, plan.head)
	r.mu.Unlock()
	if !plan.commit {
		return nil
	}
	if quiet {
		// Only ephemeral offsets past a state that had its pass at the head: the cursor moves,
		// and nothing else happens. No processor code runs, so it is no tracked work either (an
		// alarm armed and a confirmation fire per streamed chunk), nor a clean settlement.
		next := committed
		next.ReducerVersion, next.ReducedThrough, next.ProcessedThrough = r.c.ReducerVersion, plan.through, plan.through
		if err := r.commit(ctx, next, r.committedState()); err != nil {
			return err
		}
		r.mu.Lock()
		r.offeredAt = plan.through // the same state, which had its pass at the head
		r.mu.Unlock()
		return nil
	}
	if r.c.ProcessEvent != nil {
		// The fence is checked before the effects, not only at the commit: an incarnation
		// fenced since its last frame (another one claimed the record, on this host or another)
		// would otherwise run this frame's effects, which its successor runs too.
		if err := r.checkFence(ctx); err != nil {
			return err
		}
	}
	// Tracked from here: a frame that moves nothing is no work, and must not count as a clean
	// settlement that would disarm the keepalive of a dead incarnation's obligations.
	ctx, endPass := r.beginPass(ctx)
	claimed := false
	// What runs now, for a panic to name: the hook and the event (nil: the eventless pass); no
	// hook: the runner's own code between them.
	hook, at := "", (*itx.Event)(nil)
	defer func() {
		if p := recover(); p != nil {
			if hook == "" {
				err = itx.Errorf(itx.EInternal, "processor %q: the runner panicked in the frame (%d, %d]: %v", r.c.Name, f.ScannedAfter, f.ScannedThrough, p)
			} else {
				err = onEvent(at, itx.Errorf(itx.EInternal, "processor %q: %s panicked on %s: %v", r.c.Name, hook, describe(at), p))
			}
		}
		if err != nil {
			r.restoreCommittedState()
		}
		endPass(err)
		if err == nil {
			r.mu.Lock()
			if claimed {
				r.withheld = false
			}
			r.mu.Unlock()
			r.maybeRepass()
		}
	}()
	delivery := Delivery{ObservedHead: plan.head, CursorRevision: committed.CursorRevision}
	state := r.committedState()
	var malformed []itx.Event
	// A frame past its budget is cut after the event just processed: it commits through that
	// event, exactly as a frame delivered cut there would (no CaughtUp: events are left), and the
	// rest is the next frame's. Never after the CaughtUp event, which is the last one to deliver.
	deadline := r.cfg.Clock.Now().Add(r.cfg.FrameBudget)
	through, eventless := plan.through, plan.eventless
events:
	for i := range plan.events {
		pe := &plan.events[i]
		switch pe.kind {
		case kindMalformed:
			malformed = append(malformed, pe.event)
		case kindDeliver:
			hook, at = "Reduce", &pe.event
			next := r.c.Reduce(state, pe.event)
			hook = ""
			d := delivery
			d.CaughtUp = pe.caughtUp && !r.heldBack(busy, seq)
			claimed = claimed || d.CaughtUp
			hook = "ProcessEvent"
			if err := r.dispatch(ctx, &pe.event, state, next, d, 0); err != nil {
				return err
			}
			hook, state = "", next
			if !pe.caughtUp && i < len(plan.events)-1 && !r.cfg.Clock.Now().Before(deadline) {
				through, eventless = pe.event.Offset, false
				break events
			}
		}
	}
	if eventless && !r.heldBack(busy, seq) {
		claimed = true
		d := delivery
		d.CaughtUp = true
		hook, at = "ProcessEvent", nil
		// Its forwards come from the frame's end: redelivered until the frame commits.
		if err := r.dispatch(ctx, nil, state, state, d, through); err != nil {
			return err
		}
		hook = ""
	}
	next := committed
	next.ReducerVersion, next.ReducedThrough, next.ProcessedThrough = r.c.ReducerVersion, through, through
	if err := r.commit(ctx, next, state); err != nil {
		return err
	}
	if through >= plan.head {
		r.mu.Lock()
		r.offeredAt = through
		r.mu.Unlock()
	}
	// Diagnostics follow the commit: the malformed event is already behind the cursor, so a
	// failing diagnostic append can never fail this frame again; the key dedupes redelivery.
	// A rejected stream/error-occurred is skipped without one: it may be a diagnostic (this
	// processor's own, or another's), and diagnosing it would write another that the same
	// Validate rejects, without end (a Validate over "*" that wants its own payload shape).
	for _, e := range malformed {
		if e.Type == itx.TypeErrorOccurred {
			continue
		}
		r.background(func(ctx context.Context) error { return r.diagnose(ctx, e) })
	}
	return nil
}

// frameTok marks the context of one pass (a frame, or a repass's eventless pass): the appends
// made under it are the pass's own (ProcessEvent's and its blockers').
type frameTok struct{}

type frameKey struct{}

// beginPass starts a pass that runs processor code: its work is tracked, and its context carries
// a token that tells its own appends from the others (see heldBack). end must be called once.
func (r *Runner[S]) beginPass(ctx context.Context) (context.Context, func(err error)) {
	tok := &frameTok{}
	r.mu.Lock()
	r.frameTok = tok
	r.mu.Unlock()
	done := r.track()
	return context.WithValue(ctx, frameKey{}, tok), func(err error) {
		r.mu.Lock()
		r.frameTok = nil
		r.mu.Unlock()
		done(err)
	}
}

// heldBack reports whether a pass planned when busy (an append in flight) and seq (the append
// sequence) must hold back its CaughtUp (the flag and the eventless pass): an append that is not
// the pass's own was in flight when it was planned, or has started since, so the state it decides
// on may lack that append's event, which its offset (unknown at planning) keeps out of the plan's
// head. Such an append is a background attempt's, most of the time: the processor's live-set may
// already have forgotten the attempt by the time this pass runs, and the state then reads as an
// obligation nobody drives. The event lands in a later frame, which claims CaughtUp; when none
// comes (the append failed, deduped onto an old offset, or was a schedule not yet due), the
// runner's repass owes the eventless pass (maybeRepass). The pass's own appends (its earlier
// events' blockers) keep their old treatment: they are in the plan's head only if they ended
// before it was planned.
func (r *Runner[S]) heldBack(busy bool, seq int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	held := busy || r.appendSeq != seq
	if held {
		r.withheld = true
	}
	return held
}

// beginAppend counts an append (or schedule) to the home stream in flight; finishAppend with the
// events it appended ends it.
func (r *Runner[S]) beginAppend(ctx context.Context) {
	tok, _ := ctx.Value(frameKey{}).(*frameTok)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.appending++
	if tok == nil || tok != r.frameTok {
		r.appendSeq++
	}
}

// finishAppend raises the observed head by the offsets appended before the append stops counting
// as in flight (one step, so no pass is planned in between without both), and queues the repass
// a held-back pass may be owed.
func (r *Runner[S]) finishAppend(out []itx.Event) {
	r.mu.Lock()
	for _, e := range out {
		r.highestAppend = max(r.highestAppend, e.Offset)
	}
	r.appending--
	r.mu.Unlock()
	r.maybeRepass()
}

// maybeRepass queues a repass when a pass held its CaughtUp back, no append is in flight any
// more, and no append of the processor's lies past the processing cursor (one that does lands in
// a later frame, which claims CaughtUp itself).
func (r *Runner[S]) maybeRepass() {
	r.mu.Lock()
	owed := r.withheld && r.appending == 0 && !r.repassing && r.fenced == nil &&
		r.highestAppend <= r.progress.ProcessedThrough
	if owed {
		r.repassing = true
	}
	r.mu.Unlock()
	if owed {
		r.background(r.repass)
	}
}

// repass gives a held-back CaughtUp its due: it catches up (whatever landed meanwhile is
// delivered, and its last frame claims CaughtUp) and, when the cursor is then at the head with the
// claim still owed, runs the eventless pass over the committed state.
func (r *Runner[S]) repass(ctx context.Context) error {
	err := r.acquire(ctx)
	r.mu.Lock()
	r.repassing = false // from here on, an append that ends queues another repass
	r.mu.Unlock()
	if err != nil {
		return err
	}
	defer r.release()
	if err := ctx.Err(); err != nil {
		return err
	}
	if !r.owed() {
		return nil
	}
	if err := r.catchUp(ctx); err != nil {
		return err
	}
	return r.passAtHead(ctx)
}

// owed reports whether a held-back CaughtUp is owed and could be claimed now.
func (r *Runner[S]) owed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.withheld && r.appending == 0 && r.fenced == nil
}

// passAtHead runs the owed eventless pass at the committed cursor, which moves nothing: nothing
// is committed, the fence is checked before the effects.
func (r *Runner[S]) passAtHead(ctx context.Context) (err error) {
	if err := r.fence(); err != nil {
		return err
	}
	r.mu.Lock()
	committed := r.progress
	head := max(r.observedHead, r.highestAppend, committed.ProcessedThrough)
	owed := r.withheld && r.appending == 0 && committed.ProcessedThrough >= head
	seq := r.appendSeq
	r.mu.Unlock()
	if !owed {
		return nil
	}
	if r.c.ProcessEvent != nil {
		if err := r.checkFence(ctx); err != nil {
			return err
		}
	}
	ctx, endPass := r.beginPass(ctx)
	defer func() {
		if p := recover(); p != nil {
			err = itx.Errorf(itx.EInternal, "processor %q: ProcessEvent panicked on the eventless pass: %v", r.c.Name, p)
		}
		endPass(err)
	}()
	if r.heldBack(false, seq) {
		return nil // an append started meanwhile: its end queues the next repass
	}
	state := r.committedState()
	d := Delivery{CaughtUp: true, ObservedHead: head, CursorRevision: committed.CursorRevision}
	if err := r.dispatch(ctx, nil, state, state, d, 0); err != nil {
		return err
	}
	r.mu.Lock()
	r.withheld = false
	r.offeredAt = committed.ProcessedThrough
	r.mu.Unlock()
	return nil
}

// dispatch calls ProcessEvent and then runs its blockers one after another. passAt is where an
// eventless pass's frame commits through (0: a repass, which commits nothing).
func (r *Runner[S]) dispatch(ctx context.Context, e *itx.Event, prev, state S, d Delivery, passAt int64) error {
	if r.c.ProcessEvent == nil {
		return nil
	}
	a := &Args[S]{Event: e, PreviousState: prev, State: state, Delivery: d, Path: r.cfg.Path, name: r.c.Name, passAt: passAt, frame: &frameWork{}, run: r}
	defer a.frame.close()
	if err := r.c.ProcessEvent(ctx, a); err != nil {
		return onEvent(e, fmt.Errorf("processor %q: %s: %w", r.c.Name, describe(e), err))
	}
	for {
		b, ok := a.frame.next()
		if !ok {
			break
		}
		done := r.track()
		err := runRecovered(ctx, "blocker", b.work)
		done(err)
		if err != nil {
			return onEvent(e, fmt.Errorf("processor %q: %s: blocker %q: %w", r.c.Name, describe(e), b.name, err))
		}
	}
	return nil
}

// onEvent marks err as the failure of the event e (a *itx.ProcessorEventError, which the host
// reports as the subscription's failingEventOffset); the eventless pass (nil) names none.
func onEvent(e *itx.Event, err error) error {
	if e == nil {
		return err
	}
	return &itx.ProcessorEventError{Offset: e.Offset, Err: err}
}

func describe(e *itx.Event) string {
	if e == nil {
		return "eventless pass"
	}
	return fmt.Sprintf("event %d (%s)", e.Offset, e.Type)
}

func (r *Runner[S]) classify(e itx.Event) eventKind {
	if !r.c.consumes(e.Type) {
		return kindSkip
	}
	if r.c.invalid(e) != nil {
		return kindMalformed
	}
	return kindDeliver
}

// diagnose records a malformed event once, as stream/error-occurred keyed by the event.
func (r *Runner[S]) diagnose(ctx context.Context, e itx.Event) error {
	verr := r.c.invalid(e)
	// The error object carries name and message as the TypeScript schema of
	// stream/error-occurred has them (error.message is required there).
	detail, _ := json.Marshal(map[string]any{
		"name":          "MalformedEvent",
		"message":       fmt.Sprint(verr),
		"processorSlug": r.c.Name,
		"offset":        e.Offset,
		"eventType":     e.Type,
		"reason":        fmt.Sprint(verr),
	})
	payload, _ := json.Marshal(itx.ErrorOccurredPayload{
		Message: fmt.Sprintf("processor %q skipped malformed event %d (%s)", r.c.Name, e.Offset, e.Type),
		Error:   detail,
	})
	_, err := r.appendHome(ctx, []itx.EventInput{{
		Type:           itx.TypeErrorOccurred,
		Payload:        payload,
		IdempotencyKey: boundedKey("event-malformed:" + r.c.Name + "@" + r.cfg.Path + ":" + strconv.FormatInt(e.Offset, 10)),
	}})
	if itx.ErrorCode(err) == itx.EIdempotencyConflict {
		// The event's diagnosis stands already, written by a release whose record read
		// differently (this one's error object gained name and message).
		return nil
	}
	return err
}

// reduceOnly folds consumed, well-formed, durable events in (after, through] into from. A Reduce
// that panics fails it with EInternal naming the event, as in a frame: a poisoned reducer must
// not take the host process down at every load.
func (r *Runner[S]) reduceOnly(ctx context.Context, from S, after, through int64, checkpoint func(st S, through int64) error) (st S, err error) {
	st = from
	deadline := r.cfg.Clock.Now().Add(r.cfg.FrameBudget)
	var at *itx.Event
	defer func() {
		if p := recover(); p != nil {
			err = onEvent(at, itx.Errorf(itx.EInternal, "processor %q: Reduce panicked on %s: %v", r.c.Name, describe(at), p))
		}
	}()
	for after < through {
		page, err := r.cfg.Log.Read(ctx, after, r.cfg.PageSize)
		if err != nil {
			return st, err
		}
		if page.ScannedThrough <= after {
			break
		}
		for _, e := range page.Events {
			if e.Offset > through {
				return st, nil
			}
			if r.classify(e) == kindDeliver && !e.Ephemeral {
				at = &e
				st = r.c.Reduce(st, e)
				if checkpoint != nil && e.Offset < through && !r.cfg.Clock.Now().Before(deadline) {
					if err := checkpoint(st, e.Offset); err != nil {
						return st, err
					}
					deadline = r.cfg.Clock.Now().Add(r.cfg.FrameBudget)
				}
			}
		}
		after = page.ScannedThrough
	}
	return st, nil
}

// commit writes next with st as its state, fenced by this incarnation's generation, and
// publishes it only once it landed. A fenced commit retires this runner for good.
func (r *Runner[S]) commit(ctx context.Context, next Progress, st S) error {
	raw, err := json.Marshal(st)
	if err != nil {
		return itx.Errorf(itx.EInternal, "processor %q: state does not encode: %v", r.c.Name, err)
	}
	next.State, next.Contract = raw, r.c.contractName()
	r.mu.Lock()
	gen := r.generation
	r.mu.Unlock()
	if err := r.cfg.Progress.Commit(ctx, r.c.Name, gen, next); err != nil {
		if itx.ErrorCode(err) == itx.EFailedPrecondition {
			r.mu.Lock()
			r.fenced = err
			r.mu.Unlock()
		}
		return fmt.Errorf("commit processor %q: %w", r.c.Name, err)
	}
	r.publish(next, st, raw)
	return nil
}

func (r *Runner[S]) publish(p Progress, st S, raw json.RawMessage) {
	if raw == nil {
		raw, _ = json.Marshal(st)
	}
	p.State = raw
	r.mu.Lock()
	r.progress, r.state = p, st
	r.observedHead = max(r.observedHead, p.ProcessedThrough)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

// restoreCommittedState re-decodes the committed state after a failed frame, in case Reduce
// mutated shared parts of it in place.
func (r *Runner[S]) restoreCommittedState() {
	r.mu.Lock()
	raw := r.progress.State
	r.mu.Unlock()
	if st, err := r.decode(raw); err == nil {
		r.mu.Lock()
		r.state = st
		r.mu.Unlock()
	}
}

// decode reads a committed state. It decodes into a zero S, not over InitialState: laid over a
// non-empty initial state, JSON would bring back what Reduce removed (a map's deleted keys, an
// omitempty field's initial value), so the state would no longer be Reduce folded over the stream
// (ReplayCheck's round trip decodes the same way). On failure it returns InitialState.
func (r *Runner[S]) decode(raw json.RawMessage) (S, error) {
	if len(raw) == 0 {
		return r.c.InitialState(), errors.New("empty state")
	}
	var st S
	if err := json.Unmarshal(raw, &st); err != nil {
		return r.c.InitialState(), err
	}
	return st, nil
}

func (r *Runner[S]) committedState() S {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state
}

// checkFence asks the progress store whether this incarnation's generation is still current,
// and retires the runner for good when it is not.
func (r *Runner[S]) checkFence(ctx context.Context) error {
	r.mu.Lock()
	gen := r.generation
	r.mu.Unlock()
	if err := r.cfg.Progress.Check(ctx, r.c.Name, gen); err != nil {
		if itx.ErrorCode(err) == itx.EFailedPrecondition {
			r.mu.Lock()
			r.fenced = err
			r.mu.Unlock()
			return r.fence()
		}
		return fmt.Errorf("processor %q: check its fence: %w", r.c.Name, err)
	}
	return nil
}

func (r *Runner[S]) fence() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fenced != nil {
		return fmt.Errorf("processor %q: a newer incarnation owns the progress record: %w", r.c.Name, r.fenced)
	}
	return nil
}

func (r *Runner[S]) processedThrough() int64 { return r.ProcessedThrough() }

// ProcessedThrough is the committed processing cursor.
func (r *Runner[S]) ProcessedThrough() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.progress.ProcessedThrough
}

// Progress is the committed progress record.
func (r *Runner[S]) Progress() Progress {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.progress
}

// Snapshot returns a copy of the committed reduced state and the offset it was reduced through.
func (r *Runner[S]) Snapshot() (int64, S) {
	r.mu.Lock()
	p := r.progress
	r.mu.Unlock()
	st, err := r.decode(p.State)
	if err != nil {
		st = r.c.InitialState()
	}
	return p.ReducedThrough, st
}

// SnapshotJSON is Snapshot with the state in its committed JSON form.
func (r *Runner[S]) SnapshotJSON() (int64, json.RawMessage) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.progress.ReducedThrough, r.progress.State
}

// RuntimeState reports the runner's cursors and observations.
func (r *Runner[S]) RuntimeState() RuntimeState {
	r.mu.Lock()
	defer r.mu.Unlock()
	rs := RuntimeState{
		Name: r.c.Name, ReducerVersion: r.progress.ReducerVersion, ReducedThrough: r.progress.ReducedThrough,
		ProcessedThrough: r.progress.ProcessedThrough, CursorRevision: r.progress.CursorRevision,
		ObservedHead: max(r.observedHead, r.highestAppend), Generation: r.generation,
	}
	if r.fenced != nil {
		rs.Fenced = r.fenced.Error()
	}
	return rs
}

// WaitUntilProcessed returns once the processing cursor reaches offset (read-your-writes: append,
// then wait on the returned offset), or ctx's error.
func (r *Runner[S]) WaitUntilProcessed(ctx context.Context, offset int64) error {
	for {
		r.mu.Lock()
		reached, changed := r.progress.ProcessedThrough >= offset, r.changed
		r.mu.Unlock()
		if reached {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Close ends the incarnation: background attempts see their context cancelled. Progress already
// committed stays; work in flight is simply lost, as in an eviction.
func (r *Runner[S]) Close() { r.bgCancel() }

func (r *Runner[S]) acquire(ctx context.Context) error {
	select {
	case r.chain <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *Runner[S]) release() { <-r.chain }

func (r *Runner[S]) track() func(error) {
	if r.cfg.Tracker == nil {
		return func(error) {}
	}
	return r.cfg.Tracker.Track()
}

// The doors Args uses.

func (r *Runner[S]) now() time.Time { return r.cfg.Clock.Now() }

func (r *Runner[S]) appendHome(ctx context.Context, events []itx.EventInput) (out []itx.Event, err error) {
	r.beginAppend(ctx)
	defer func() { r.finishAppend(out) }() // deferred: a panicking log must not leave it in flight
	out, err = r.cfg.Log.Append(ctx, events)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// appendTo appends to another stream through the log's outbox (itx.ProcessorOutbox), saying
// where the forward comes from when the outbox takes it (itx.ProcessorEffectOutbox).
func (r *Runner[S]) appendTo(ctx context.Context, path string, events []itx.EventInput, origin itx.EffectOrigin) (itx.AppendResult, error) {
	if o, ok := r.cfg.Log.(itx.ProcessorEffectOutbox); ok {
		return o.AppendToFrom(ctx, path, events, origin)
	}
	o, ok := r.cfg.Log.(itx.ProcessorOutbox)
	if !ok {
		return itx.AppendResult{}, itx.Errorf(itx.EFailedPrecondition, "processor %q: this host appends to the home stream only", r.c.Name)
	}
	return o.AppendTo(ctx, path, events)
}

// scheduleHome counts as an append in flight too: a schedule already due lands at once.
func (r *Runner[S]) scheduleHome(ctx context.Context, event itx.EventInput, at time.Time) error {
	r.beginAppend(ctx)
	defer r.finishAppend(nil)
	return r.cfg.Log.Schedule(ctx, event, at)
}

func (r *Runner[S]) background(work func(ctx context.Context) error) {
	done := r.track()
	go func() {
		err := runRecovered(r.bgCtx, "background work", work)
		done(err)
		if err != nil && r.bgCtx.Err() == nil {
			r.cfg.Logf("processor %q: background work failed: %v", r.c.Name, err)
			if r.cfg.BackgroundFailed != nil {
				r.cfg.BackgroundFailed(err)
			}
		}
	}()
}

// runRecovered runs work, turning a panic into an EInternal error saying what panicked.
func runRecovered(ctx context.Context, what string, work func(ctx context.Context) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = itx.Errorf(itx.EInternal, "%s panicked: %v", what, p)
		}
	}()
	return work(ctx)
}
