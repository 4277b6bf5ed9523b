package itx

import (
	"context"
	"encoding/json"
	"errors"
	"time"
	"unicode/utf8"
)

// The processor hosting seam. A host (itxd in-process, a remote program later) gives the
// processors of one stream these ports; the SDK (package processors) implements the runners and
// the registry over them. Both sides name only these types, so neither imports the other.

// InstanceLog is a ProcessorLog that can read as one processor instance's subscription is
// delivered: its filter composes with the contract's consumed types (seed 000), in every read
// of the runner (frames, catch-up, the rewind's re-reduction), and ScannedThrough passes what
// the filter drops. The registry gives each runner ForInstance(its name); a log that does not
// implement it is read as is.
type InstanceLog interface {
	ForInstance(name string) ProcessorLog
}

// ProcessorLog is a processor's home stream as the runner needs it.
type ProcessorLog interface {
	// Read returns up to limit durable events after offset after, in offset order. Ephemeral
	// events may be omitted or included (the runner drops them); the page's ScannedThrough says
	// how far the read looked, so a page of filtered rows still proves progress.
	Read(ctx context.Context, after int64, limit int) (ProcessorPage, error)
	// Append commits events atomically. A key already committed with the same body returns the
	// committed event; with another body it fails with EIdempotencyConflict.
	Append(ctx context.Context, events []EventInput) ([]Event, error)
	// Schedule has the stream append event at at, exactly once, surviving restarts (a durable
	// timer; the stream's Stream.schedule). Its idempotency key names it: scheduling the key
	// again moves it; a key already in the log schedules nothing (with another body it fails with
	// EIdempotencyConflict, as Append does).
	Schedule(ctx context.Context, event EventInput, at time.Time) error
}

// ProcessorOutbox is a ProcessorLog that can also append to other streams of the home stream's
// project (processors.Args.AppendTo: a router forwarding to a per-thread stream, say). Fenced as
// Append is, as far as the host can: a stopped incarnation's AppendTo fails.
type ProcessorOutbox interface {
	// AppendTo commits events atomically to the stream at path (created by its first append),
	// with the append's ordinary idempotency and validation.
	AppendTo(ctx context.Context, path string, events []EventInput) (AppendResult, error)
}

// EffectOrigin is where in its home stream a processor's forward to another stream comes from:
// the event being processed and the processor's committed cursor then. The receiving stream keeps
// the idempotency keys of the forwards it took from events above that cursor (the ones a crash
// redelivers) past a trim of its own, so a forward made again after the stream trimmed the first
// is still a duplicate. An Offset at or below ProcessedThrough (0: a pass repeated at the
// committed cursor, a host that does not say) fences nothing: the key alone dedupes, until a
// trim takes it.
type EffectOrigin struct {
	Offset           int64 // the home event being processed (the eventless pass: the offset its frame commits through)
	ProcessedThrough int64 // the processor's committed processing cursor when the effect was made
}

// ProcessorEffectOutbox is a ProcessorOutbox that can say where a forward comes from (Args
// .AppendTo uses it when the log has it).
type ProcessorEffectOutbox interface {
	AppendToFrom(ctx context.Context, path string, events []EventInput, origin EffectOrigin) (AppendResult, error)
}

// CheckEffectOrigin refuses an origin with a negative offset or cursor.
func CheckEffectOrigin(o EffectOrigin) error {
	if o.Offset < 0 || o.ProcessedThrough < 0 {
		return Errorf(EInvalid, "effect origin: offset (%d) and processedThrough (%d) must not be negative", o.Offset, o.ProcessedThrough)
	}
	return nil
}

// CheckForward refuses what a ProcessorOutbox does not append to another stream: its control
// events (stream/*), which are that stream's own.
func CheckForward(events []EventInput) error {
	for i, in := range events {
		if IsCoreType(in.Type) {
			return Errorf(EInvalid, "event %d: AppendTo appends ordinary events, not %s (a stream's control events are its own)", i, in.Type)
		}
	}
	return nil
}

// ProcessorPage is one read of a ProcessorLog.
type ProcessorPage struct {
	Events         []Event
	ScannedThrough int64 // every offset in (after, ScannedThrough] was examined
	Head           int64 // the stream's highest offset when the page was read
	// EphemeralOnly says no durable event lies in (after, ScannedThrough]: every offset there is
	// an ephemeral row (or the gap a swept one left). A filtered page leaves out durable events
	// too, so its Events being empty does not say this; false claims nothing.
	EphemeralOnly bool
}

// ProcessorFrame is one delivery to a runner: the events of a scanned range (possibly filtered
// to the consumed types) and where the stream's head was. The scanned range, not the events, is
// what moves the cursor and tells the runner whether it reached the head.
type ProcessorFrame struct {
	Events         []Event
	ScannedAfter   int64 // the frame covers offsets (ScannedAfter, ScannedThrough]
	ScannedThrough int64
	Head           int64 // the stream's highest offset when the frame was produced
	// Continued says the host itself delivers (ScannedThrough, Head] in later frames (a frame cut
	// by its size limit), so the runner need not pull that tail with a trailing catch-up.
	Continued bool
	// EphemeralOnly says no durable event lies in (ScannedAfter, ScannedThrough] (as on
	// ProcessorPage): seed 002's ephemeral appends never reach processor delivery, so the runner
	// moves its cursor over such a range without a pass, unless the state there is still owed
	// its pass at the head.
	EphemeralOnly bool
}

// ProcessorProgress is a processor's durable record: the reduction (a disposable cache of Reduce
// over the stream, keyed by ReducerVersion) and the processing cursor (authoritative: every
// effect at or below ProcessedThrough is settled). Both are committed together, once per frame.
type ProcessorProgress struct {
	ReducerVersion string `json:"reducerVersion"`
	// Contract is the contract whose Reduce built State: an instance reconfigured to run another
	// contract re-reduces even when the two ReducerVersions are spelled alike. Empty in records
	// written before it was kept.
	Contract         string          `json:"contract,omitempty"`
	ReducedThrough   int64           `json:"reducedThrough"`
	State            json.RawMessage `json:"state"`
	ProcessedThrough int64           `json:"processedThrough"`
	// CursorRevision counts operator rewinds (ReprocessFrom); it is the only sanctioned way for
	// ProcessedThrough to move backward.
	CursorRevision int64 `json:"cursorRevision"`
}

// ParseProcessorProgress decodes a progress record a processor host commits (ProcessorPorts
// .commit): one JSON object of valid UTF-8 with no unknown field and nothing after it, its
// offsets and cursor revision never negative (no runner writes one; a negative processedThrough
// would become the subscription's confirmed offset).
func ParseProcessorProgress(raw []byte) (ProcessorProgress, error) {
	var p ProcessorProgress
	if !utf8.Valid(raw) {
		return p, Errorf(EInvalid, "progress is not valid UTF-8")
	}
	if err := DecodeStrict(raw, &p); err != nil {
		return p, Errorf(EInvalid, "progress: %v", err)
	}
	if p.ReducedThrough < 0 || p.ProcessedThrough < 0 || p.CursorRevision < 0 {
		return p, Errorf(EInvalid, "progress: reducedThrough (%d), processedThrough (%d) and cursorRevision (%d) must not be negative",
			p.ReducedThrough, p.ProcessedThrough, p.CursorRevision)
	}
	return p, nil
}

// ProcessorProgressStore keeps one ProcessorProgress per processor name, fenced by incarnation:
// Claim starts an incarnation and a commit from any earlier one fails. In itxd the record is
// written through the stream's single writer.
type ProcessorProgressStore interface {
	// Claim bumps the name's generation and returns its record (nil when none) and the
	// generation this incarnation's commits must carry.
	Claim(ctx context.Context, name string) (*ProcessorProgress, int64, error)
	// Commit replaces the record if the stored generation is still generation; otherwise it
	// fails with EFailedPrecondition and writes nothing.
	Commit(ctx context.Context, name string, generation int64, p ProcessorProgress) error
	// Check fails with EFailedPrecondition, as Commit would, when generation is no longer the
	// name's current one (another incarnation claimed the record, or the host lost the right to
	// write it). The runner asks before a frame's effects, not only at its commit: a fenced
	// incarnation must not run the effects its successor runs too.
	Check(ctx context.Context, name string, generation int64) error
}

// ProcessorKV is per-stream storage below the reduction: keepalive and crash-loop records live
// here so a poisoned reducer cannot be asked to reduce its own pause.
type ProcessorKV interface {
	// Get returns the value under key, or ok false.
	Get(ctx context.Context, key string) (value []byte, ok bool, err error)
	Put(ctx context.Context, key string, value []byte) error
	// Delete removes key; deleting a key that is not there is no error.
	Delete(ctx context.Context, key string) error
}

// ProcessorKVPrefix is the part of the processors' KV that belongs to the processor instance
// name (its keepalive record, say): a host deletes it with the instance's subscription, so a
// subscription created anew under that name starts without the removed one's records.
func ProcessorKVPrefix(name string) string { return "processor/" + name + "/" }

// ProcessorAlarm is the processors' slice of the stream's alarm. The host calls the stream's
// processors' HandleAlarm once the armed time has come, also in a fresh process after a crash.
type ProcessorAlarm interface {
	// SetAlarm arms the slice at at; the zero time disarms it.
	SetAlarm(ctx context.Context, at time.Time) error
}

// ProcessorRuntimeState is a runner's view of itself: its committed cursors and what this
// incarnation observed. It is runtime state, not durable truth.
type ProcessorRuntimeState struct {
	Name             string `json:"name"`
	ReducerVersion   string `json:"reducerVersion"`
	ReducedThrough   int64  `json:"reducedThrough"`
	ProcessedThrough int64  `json:"processedThrough"`
	CursorRevision   int64  `json:"cursorRevision"`
	ObservedHead     int64  `json:"observedHead"`
	Generation       int64  `json:"generation"`
	Fenced           string `json:"fenced,omitempty"` // why this incarnation may no longer commit
}

// ProcessorEventError is a processor's failure on one event of its home stream: a hook
// (Reduce, ProcessEvent, a blocker) returned an error or panicked on the event at Offset. A host
// reports Offset as the processor-wake subscription's failingEventOffset; Err is the failure
// (its code, if any, is the error's: ErrorCode reads through).
type ProcessorEventError struct {
	Offset int64
	Err    error
}

func (e *ProcessorEventError) Error() string { return e.Err.Error() }
func (e *ProcessorEventError) Unwrap() error { return e.Err }

// FailingEventOf is the offset of the event err names as a processor's failing event (a
// *ProcessorEventError in its chain), 0 when it names none.
func FailingEventOf(err error) int64 {
	if e, ok := errors.AsType[*ProcessorEventError](err); ok {
		return e.Offset
	}
	return 0
}

// ProcessorRunner is a runner without its state type: what a host drives.
type ProcessorRunner interface {
	Name() string
	// Consumes reports whether the processor consumes events of type typ (a host may filter
	// frames with it, keeping the scanned range).
	Consumes(typ string) bool
	// Deliver processes one frame (a wake). It returns after the frame's progress committed.
	Deliver(ctx context.Context, f ProcessorFrame) error
	// CatchUp reads the home stream from the processing cursor and delivers it through the head
	// it finds on its first read.
	CatchUp(ctx context.Context) error
	// ReprocessFrom rewinds (or moves) the processing cursor so events from offset on are
	// processed again, with event-time state re-reduced through offset-1.
	ReprocessFrom(ctx context.Context, offset int64) error
	// ProcessedThrough is the committed processing cursor.
	ProcessedThrough() int64
	// WaitUntilProcessed returns once the processing cursor reaches offset.
	WaitUntilProcessed(ctx context.Context, offset int64) error
	// SnapshotJSON is the committed reduced state and the offset it was reduced through.
	SnapshotJSON() (int64, json.RawMessage)
	// RuntimeState is what the runner knows beyond its progress record (getRuntimeState).
	RuntimeState() ProcessorRuntimeState
	// Close ends the incarnation: background work's context is cancelled.
	Close()
}

// ProcessorInfo is a contract as a host announces it.
type ProcessorInfo struct {
	Name           string   `json:"name"`
	ReducerVersion string   `json:"reducerVersion"`
	ConsumedTypes  []string `json:"consumedTypes"`
	// InitialState is the contract's initial state as JSON (empty: not announced): what itxd
	// answers as the snapshot of a remote instance that has committed nothing yet, since the
	// contract runs on the host.
	InitialState json.RawMessage `json:"initialState,omitempty"`
}

// ProcessorPorts is what a host gives the processors of one stream in one incarnation.
type ProcessorPorts struct {
	Path     string
	Log      ProcessorLog
	Progress ProcessorProgressStore
	KV       ProcessorKV
	Alarm    ProcessorAlarm
	Clock    Clock
	Logf     func(format string, args ...any)
	// FrameBudget is how long a frame may run before it commits what it has processed, at the
	// next event boundary, and leaves the rest for a frame of its own (0: the SDK's default):
	// a host that bounds its wakes sets it below that bound, so a page of slow events (a
	// vendor call each) commits progress instead of being cut off whole at every wake.
	FrameBudget time.Duration
}

// StreamProcessors is the processors of one stream in one incarnation.
type StreamProcessors interface {
	// Start opens the processor instance name, running the registered contract (empty: the
	// contract called name), on the stream (once; later calls return the same runner). Every
	// record of the instance (progress, keepalive, idempotency keys) is keyed by name. An unknown
	// contract fails with ENotFound.
	Start(ctx context.Context, name, contract string) (ProcessorRunner, error)
	// Runner returns the runner Start opened under name.
	Runner(name string) (ProcessorRunner, bool)
	// Stop ends the incarnation of r, if it is still the runner Start opened for its name, as an
	// eviction would (work in flight is lost; the records stay): the next Start opens a fresh one
	// from the instance's records. A host stops a runner whose record another incarnation has
	// claimed since (the instance ran elsewhere meanwhile): its commits would all be refused.
	Stop(r ProcessorRunner)
	// HandleAlarm services a fire of the processors' alarm slice (keepalive and revival).
	HandleAlarm(ctx context.Context) error
	// Close ends every runner's incarnation.
	Close()
}

// ProcessorHost is a set of contracts a host can run on any stream.
type ProcessorHost interface {
	Contracts() []ProcessorInfo
	// Version is the host's build: a new one resets every crash-loop budget, and its processors
	// owing a revival are retried at once (the antidote deploy).
	Version() string
	// Open returns the processors of one stream incarnation over ports. Nothing is claimed
	// until Start.
	Open(ctx context.Context, ports ProcessorPorts) (StreamProcessors, error)
}
