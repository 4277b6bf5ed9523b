package processors

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/itx-dev/itx"
)

// Contract is a processor: what it consumes, how it reduces, what it does. Reduce must be pure
// and deterministic (no clock, no I/O): it is re-run from offset 1 whenever ReducerVersion
// changes, and at each event the state ProcessEvent sees is Reduce folded up to that event.
type Contract[S any] struct {
	// Name is the processor's slug (a processor-wake subscription's name selects it).
	Name string
	// ConsumedTypes lists the event types Reduce and ProcessEvent see; "*" means all.
	ConsumedTypes []string
	// ReducerVersion keys the reduction cache: a new value re-reduces from the start with
	// Reduce only, never ProcessEvent.
	ReducerVersion string
	// InitialState returns the state before any event.
	InitialState func() S
	// Validate, if set, rejects a malformed consumed event: the runner skips it (no Reduce, no
	// ProcessEvent), moves past it, and records one diagnostic after the commit (none for a
	// rejected stream/error-occurred, which may be a diagnostic itself).
	Validate func(e itx.Event) error
	// Reduce folds one consumed event into the state. It must not mutate its input state in
	// place when that state is shared (maps, slices): return a new value or copy on write.
	Reduce func(state S, e itx.Event) S
	// ProcessEvent causes side effects. It runs after Reduce for each consumed event and once
	// eventless (Args.Event nil, CaughtUp true) when a scan reaches the head without a consumed
	// event. Returning an error fails the frame: nothing of it is committed and it is
	// redelivered.
	ProcessEvent func(ctx context.Context, a *Args[S]) error

	// contract is the registered contract's name when Name is an instance's (Host.Add sets it):
	// it keys the reduction with ReducerVersion.
	contract string
}

// contractName is the name of the contract itself, whatever instance runs it.
func (c *Contract[S]) contractName() string {
	if c.contract != "" {
		return c.contract
	}
	return c.Name
}

// reducedBy reports whether p's reduction is this contract's Reduce under this ReducerVersion
// (a record that does not name its contract is taken to be this one's).
func (c *Contract[S]) reducedBy(p *itx.ProcessorProgress) bool {
	return p.ReducerVersion == c.ReducerVersion && (p.Contract == "" || p.Contract == c.contractName())
}

// consumes reports whether the contract consumes events of type typ.
func (c *Contract[S]) consumes(typ string) bool {
	return slices.Contains(c.ConsumedTypes, "*") || slices.Contains(c.ConsumedTypes, typ)
}

// ParseConsumedInput checks an input at a domain object's write door, before anything is
// appended (seed 002: a typed append door whose runtime boundary the processor's contract
// validates, so a client of the door cannot write what the processor would only skip): the input
// must be well formed (itx.EventInput.Normalize), durable (processors never see an ephemeral
// event), of a type the contract consumes, and accepted by Validate, if set, as the event it
// would become. It returns the input in stored form; a refused one is an invalidArgument error
// (tooLarge for an oversize event) naming the processor and the reason, and the door appends
// nothing of its call. A door that takes several inputs parses them all before one append.
func (c *Contract[S]) ParseConsumedInput(in itx.EventInput) (itx.EventInput, error) {
	if err := in.Normalize(); err != nil {
		return itx.EventInput{}, itx.Errorf(itx.ErrorCode(err), "processor %q: event %q: %s", c.Name, in.Type, itx.ErrorMessage(err))
	}
	if in.Ephemeral {
		return itx.EventInput{}, itx.Errorf(itx.EInvalid, "processor %q cannot consume ephemeral event %q", c.Name, in.Type)
	}
	if !c.consumes(in.Type) {
		return itx.EventInput{}, itx.Errorf(itx.EInvalid, "processor %q does not consume event %q", c.Name, in.Type)
	}
	e := itx.Event{Type: in.Type, Payload: in.Payload, Metadata: in.Metadata, IdempotencyKey: in.IdempotencyKey}
	if err := c.invalid(e); err != nil {
		return itx.EventInput{}, itx.Errorf(itx.EInvalid, "processor %q refuses event %q: %v", c.Name, in.Type, err)
	}
	return in, nil
}

// invalid is Validate's verdict on e (nil when Validate is unset); a Validate that panics
// rejects e. The runner plans frames outside a frame's own recovery and a door runs in its
// caller's handler: a panic in either would take the host process down.
func (c *Contract[S]) invalid(e itx.Event) (err error) {
	if c.Validate == nil {
		return nil
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("Validate panicked: %v", p)
		}
	}()
	return c.Validate(e)
}

func (c *Contract[S]) validate() error {
	switch {
	case c.Name == "":
		return itx.Errorf(itx.EInvalid, "processor contract has no name")
	case strings.TrimSpace(c.Name) != c.Name:
		// A subscription's name is trimmed: one with spaces around it would never run.
		return itx.Errorf(itx.EInvalid, "processor %q: a name with spaces around it never matches a subscription's (trimmed) name", c.Name)
	case itx.ValidateSubscriptionName(c.Name) != nil:
		return itx.Errorf(itx.EInvalid, "processor %q: %s (it runs under a subscription of that name)", c.Name, itx.ErrorMessage(itx.ValidateSubscriptionName(c.Name)))
	case len(c.ConsumedTypes) == 0:
		return itx.Errorf(itx.EInvalid, "processor %q consumes no event types", c.Name)
	case c.ReducerVersion == "":
		return itx.Errorf(itx.EInvalid, "processor %q has no reducer version", c.Name)
	case c.InitialState == nil || c.Reduce == nil:
		return itx.Errorf(itx.EInvalid, "processor %q needs InitialState and Reduce", c.Name)
	}
	return nil
}

// Delivery says where an event sits relative to the head the runner has observed.
type Delivery struct {
	// CaughtUp is true on the last consumed event of a scan that reached the observed head, and
	// on the eventless pass, unless one of the processor's own appends from outside the frame
	// was in flight (see Args.Append): then a later pass claims it. Behind the head the state is
	// partial: state-derived effects (starting obligations) wait for CaughtUp; per-event effects
	// (forwards) need not.
	CaughtUp bool
	// ObservedHead is the highest offset the runner has seen (frames and its own appends).
	ObservedHead int64
	// CursorRevision is the processing cursor's rewind count.
	CursorRevision int64
}

// Args is what ProcessEvent gets for one event (or for the eventless pass).
type Args[S any] struct {
	// Event is the consumed event, or nil on the eventless pass at the head.
	Event *itx.Event
	// PreviousState is the state before Event; State the state after it (event-time state, not
	// current truth: during a replay it is the reduction up to Event).
	PreviousState S
	State         S
	Delivery      Delivery
	// Path is the home stream's path.
	Path string

	name   string // the processor's name, the owner of its idempotency keys
	passAt int64  // the eventless pass in a frame: the offset the frame commits through
	frame  *frameWork
	run    runnerDoors
}

// runnerDoors is what Args needs from its runner, without the state type.
type runnerDoors interface {
	now() time.Time
	appendHome(ctx context.Context, events []itx.EventInput) ([]itx.Event, error)
	appendTo(ctx context.Context, path string, events []itx.EventInput, origin itx.EffectOrigin) (itx.AppendResult, error)
	processedThrough() int64
	scheduleHome(ctx context.Context, event itx.EventInput, at time.Time) error
	background(work func(ctx context.Context) error)
}

// frameWork collects one ProcessEvent call's blocking registrations, run in FIFO order after it
// returns. A blocker may register more (they join the queue); once the queue has drained, the
// frame has moved on and a registration could no longer hold its cursor.
type frameWork struct {
	mu       sync.Mutex
	blockers []blocker
	closed   bool
}

// next pops the oldest registration, or closes the queue when none is left.
func (f *frameWork) next() (blocker, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.blockers) == 0 {
		f.closed = true
		return blocker{}, false
	}
	b := f.blockers[0]
	f.blockers = f.blockers[1:]
	return b, true
}

// close ends the queue without running what is left (the frame failed: it is redelivered whole).
func (f *frameWork) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
}

type blocker struct {
	name string
	work func(ctx context.Context) error
}

// Now is the injected clock: processors with expiry or freshness logic read time here only.
func (a *Args[S]) Now() time.Time { return a.run.now() }

// BlockProcessorWhile registers must-happen work with at-least-once semantics: the frame's
// progress commit waits for it, a failure fails the frame, and a crash redelivers the event, so
// the work must be idempotent (appends with stable keys). Registrations run one after another
// in registration order once ProcessEvent returns: a later one observes the earlier one's
// appends. It head-of-line-blocks every later event; keep it short and say at the call site
// which per-event consequence would be lost without it. Call it from ProcessEvent or from one of
// its blockers (the new one runs after those already registered): once the event's blockers
// have all run, the cursor moves on, and a registration then (from a RunInBackground closure,
// say) panics rather than let must-happen work silently never run.
func (a *Args[S]) BlockProcessorWhile(name string, work func(ctx context.Context) error) {
	a.frame.mu.Lock()
	defer a.frame.mu.Unlock()
	if a.frame.closed {
		panic(fmt.Sprintf("processors: BlockProcessorWhile(%q) after its event's blockers ran: nothing can hold the cursor for it now", name))
	}
	a.frame.blockers = append(a.frame.blockers, blocker{name: name, work: work})
}

// RunInBackground starts a droppable attempt with at-most-once semantics: the cursor advances
// without waiting, and an eviction loses the closure silently. The call site must answer "what
// recovers the outcome if this drops?" (usually: the CaughtUp branch restarts it from state).
// The work is tracked by the keepalive, and its failure marks the keepalive window, so the next
// alarm fire revives the processor. It runs on a goroutine of its own, which may not have begun
// when RunInBackground returns, nor when the next event's ProcessEvent runs: record the attempt
// in the processor's in-memory live-set before calling RunInBackground (the seed's "synchronously,
// before any await"), not as the first statement of work, or the next CaughtUp pass can find the
// obligation undriven and start it twice.
func (a *Args[S]) RunInBackground(work func(ctx context.Context) error) {
	a.run.background(work)
}

// Append appends to the home stream (the typed door: build inputs with EventType.Input). Its
// offsets raise the runner's observed head, so a frame planned after it returned does not reach
// the head before its event. An append that is not the running frame's own (a RunInBackground
// attempt's, made under another context than the one ProcessEvent got) also holds back CaughtUp
// while it is in flight: a frame planned while it is in flight, or that gets to its CaughtUp
// decision after it began, delivers CaughtUp false and skips the eventless pass; the event lands
// in a later frame, which claims CaughtUp, and when none lands (the append failed, or deduped
// onto an offset already processed) the runner runs the eventless pass once no append is in
// flight. So a CaughtUp pass never decides on a state that lacks an append of the processor's
// begun before that pass was called. An append begun while the CaughtUp pass runs (by an attempt
// started earlier) can still land and be followed by its attempt's whole course before the pass
// reads its in-memory live-set: state-derived starts must stay safe against that (a started
// fact that names its attempt, say). The frame's own appends (its earlier events' blockers) do
// not hold back its last event: they are in the head of the next frame, which is CaughtUp again.
func (a *Args[S]) Append(ctx context.Context, events ...itx.EventInput) ([]itx.Event, error) {
	return a.run.appendHome(ctx, events)
}

// AppendTo appends to another stream of the home stream's project (created by its first
// append): a forward, such as a router's to a per-thread stream. Nothing there reaches this
// processor unless it consumes that stream too, so it neither raises the observed head nor holds
// back CaughtUp (an AppendTo of the home path is Append, its result then holding the offsets
// only). It is fenced like Append, and a crash between the forward and the frame's commit
// forwards again when the event is redelivered: key it with IdempotencyKey, whose
// @<path>:<offset> keeps same-name processors of different streams forwarding into one stream
// apart. A host that cannot reach other streams fails it with itx.EFailedPrecondition.
func (a *Args[S]) AppendTo(ctx context.Context, path string, events ...itx.EventInput) (itx.AppendResult, error) {
	if path == a.Path {
		out, err := a.run.appendHome(ctx, events)
		if err != nil {
			return itx.AppendResult{}, err
		}
		res := itx.AppendResult{Offsets: make([]int64, len(out))}
		for i, e := range out {
			res.Offsets[i] = e.Offset
		}
		return res, nil
	}
	if err := itx.ValidatePath(path); err != nil {
		return itx.AppendResult{}, err
	}
	origin := itx.EffectOrigin{Offset: a.passAt, ProcessedThrough: a.run.processedThrough()}
	if a.Event != nil {
		origin.Offset = a.Event.Offset
	}
	return a.run.appendTo(ctx, path, events, origin)
}

// ScheduleAppend is a durable timer: the home stream appends event at at, exactly once, even if
// this processor is evicted, the process dies or the stream unloads meanwhile; the processor sees
// it as any consumed event when it lands (a reminder, a timeout of an obligation, a retry later).
// While the call is in flight it holds back CaughtUp as Append does (one already due lands at
// once).
// event.IdempotencyKey is required and names the timer (build it with IdempotencyKey, keyed by
// the event that set it, so a replay schedules the same timer): scheduling the key again moves
// it, and once the event has landed scheduling it again does nothing (with another body it fails
// with itx.EIdempotencyConflict, as Append does). Cancel it by landing
// nothing: the reducer decides, when the event arrives, whether it still matters. A timer left to
// its time keeps one of the stream's pending places (10,000, itxd's --max-scheduled-per-stream;
// past them ScheduleAppend fails with itx.ELimitExceeded) until it lands, so to cancel one due
// far off, move it: schedule its key and body again at the cancelling event's CreatedAt, and it
// lands at once (a replay finds it landed with that body and does nothing).
func (a *Args[S]) ScheduleAppend(ctx context.Context, at time.Time, event itx.EventInput) error {
	if event.IdempotencyKey == "" {
		return itx.Errorf(itx.EInvalid, "ScheduleAppend needs an idempotency key (Args.IdempotencyKey)")
	}
	return a.run.scheduleHome(ctx, event, at)
}

// IdempotencyKey is the processor-owned key for an effect: "<name>/<key>@<path>:<offset>" for an
// effect of event e, where name is the processor's (its subscription name), so two processors
// using one key word never collide, nor do same-name processors forwarding into one stream. With
// a nil event (the eventless pass, or an obligation keyed by its own identity, embedded by hand
// after an @: "settle@<identity>") it is "<name>/<key>". A raw key, not built here, is for
// deliberate convergence across processors; say so at the call site. A key past the server's
// bound (itx.MaxIdempotencyKeyLength, 512 bytes: a long subscription name on a deep path) keeps
// its first bytes and ends with "#sha256:" and the hash of the whole, so it stays stable and
// distinct.
func (a *Args[S]) IdempotencyKey(key string, e *itx.Event) string {
	return IdempotencyKey(a.name, key, a.Path, e)
}

// IdempotencyKey is Args.IdempotencyKey for a known processor name and path.
func IdempotencyKey(name, key, path string, e *itx.Event) string {
	key = name + "/" + key
	if e == nil {
		return boundedKey(key)
	}
	return boundedKey(key + "@" + path + ":" + strconv.FormatInt(e.Offset, 10))
}

// boundedKey keeps a key the SDK builds within itx.MaxIdempotencyKeyLength, which every append
// checks: a subscription name may have 500 characters and a path 1,024 bytes, and a key over the
// bound was refused at every redelivery, stalling the processor on its first effect (and its
// revivals and diagnostics, which are keyed by its name, never landed). A longer key keeps its
// first bytes (cut at a rune boundary) and ends with "#sha256:" and the hash of the whole key.
// A key within the bound is left as it is: no key over it was ever written, so no stored key
// changes meaning.
func boundedKey(key string) string {
	if len(key) <= itx.MaxIdempotencyKeyLength {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	suffix := "#sha256:" + hex.EncodeToString(sum[:])
	cut := itx.MaxIdempotencyKeyLength - len(suffix)
	for cut > 0 && !utf8.RuneStart(key[cut]) {
		cut--
	}
	return key[:cut] + suffix
}

// EventType is a typed event vocabulary entry: the payload type travels with the type name, so
// producers and the reducer agree on one shape.
type EventType[P any] string

// Input builds an event to append with payload p and idempotency key key ("" for none).
func (t EventType[P]) Input(p P, key string) itx.EventInput {
	raw, err := json.Marshal(p)
	if err != nil {
		// P is a plain data type chosen by the processor author; a payload that cannot encode
		// is a programming error, not an input.
		panic(fmt.Sprintf("processors: %s payload does not encode: %v", string(t), err))
	}
	return itx.EventInput{Type: string(t), Payload: raw, IdempotencyKey: key}
}

// Decode reads e's payload as P. It fails with itx.EInvalid when e is of another type or its
// payload does not decode (a Contract.Validate usually calls it).
func (t EventType[P]) Decode(e itx.Event) (P, error) {
	var p P
	if e.Type != string(t) {
		return p, itx.Errorf(itx.EInvalid, "event %d is %q, not %q", e.Offset, e.Type, string(t))
	}
	if err := json.Unmarshal(e.Payload, &p); err != nil {
		return p, itx.Errorf(itx.EInvalid, "event %d (%s): %v", e.Offset, e.Type, err)
	}
	return p, nil
}
