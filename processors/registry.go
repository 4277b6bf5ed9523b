package processors

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/itx-dev/itx"
)

// RegistryConfig wires a registry to the stream that hosts its processors.
type RegistryConfig struct {
	Path     string    // the stream's path
	Log      StreamLog // the stream
	KV       KV        // keepalive records, below the reduction
	Alarm    AlarmCell // the processors' slice of the stream's alarm
	Clock    itx.Clock // the only time source
	Version  string    // the host's version: a new one resets every crash-loop budget
	PageSize int       // passed to runners; 0 means DefaultPageSize
	// FrameBudget is passed to runners (RunnerConfig.FrameBudget); 0 means DefaultFrameBudget.
	FrameBudget time.Duration
	Logf        func(format string, args ...any)
	// BackgroundFailed, if set, is each runner's RunnerConfig.BackgroundFailed, naming the
	// processor.
	BackgroundFailed func(processor string, err error)
}

// Registry hosts the processors of one stream in one incarnation: each registered runner gets a
// keepalive that keeps the stream's alarm about KeepaliveLead ahead of its in-flight work, and
// one alarm fire revives every processor that owes work. A fresh incarnation builds a fresh
// registry; what survives is the stream, the progress records, the KV and the alarm.
type Registry struct {
	cfg RegistryConfig

	mu      sync.Mutex // guards every keepalive's record and memory, and entries
	entries []*keepalive
	armed   int64 // the alarm cell's time as last set (ms), 0 when disarmed

	alarmMu sync.Mutex // orders alarm cell writes so the latest desire lands last
}

// NewRegistry returns an empty registry.
func NewRegistry(cfg RegistryConfig) (*Registry, error) {
	if cfg.Log == nil || cfg.KV == nil || cfg.Alarm == nil || cfg.Clock == nil {
		return nil, itx.Errorf(itx.EInvalid, "processor registry needs a log, a KV, an alarm cell and a clock")
	}
	if cfg.Version == "" {
		// Required: a silent default could never take the version-reset path.
		return nil, itx.Errorf(itx.EInvalid, "processor registry needs the host version")
	}
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	return &Registry{cfg: cfg}, nil
}

// Register builds and opens a runner for c over store, tracked by its own keepalive, and
// re-asserts any alarm desire a previous incarnation left in KV (the boot-time reconcile: a
// process that died owing work must still be revived).
func Register[S any](ctx context.Context, reg *Registry, c Contract[S], store ProgressStore) (*Runner[S], error) {
	reg.mu.Lock()
	for _, k := range reg.entries {
		if k.name == c.Name {
			reg.mu.Unlock()
			return nil, itx.Errorf(itx.EInvalid, "processor %q is already registered on %s", c.Name, reg.cfg.Path)
		}
	}
	reg.mu.Unlock()
	k := &keepalive{reg: reg, name: c.Name, starts: map[uint64]time.Time{}}
	raw, ok, err := reg.cfg.KV.Get(ctx, KeepaliveKey(c.Name))
	if err != nil {
		return nil, fmt.Errorf("register processor %q: %w", c.Name, err)
	}
	if ok {
		if err := json.Unmarshal(raw, &k.rec); err != nil {
			reg.cfg.Logf("processor %q: discarding an unreadable keepalive record: %v", c.Name, err)
			k.rec = KeepaliveRecord{}
		}
	}
	reset, stepped := false, false
	if rec := afterClockStepBack(k.rec, reg.cfg.Clock.Now().UnixMilli()); rec != k.rec {
		// The clock went back since the record was written: its alarm and backoff are taken
		// again from the clock as it reads now, and written so.
		k.rec, stepped = rec, true
	}
	if k.rec.ArmedAt != 0 && k.rec.Version != reg.cfg.Version {
		// The antidote deploy retries immediately: a revival owed (or a crash loop backing off,
		// up to the plateau) under another version is due now, with a fresh budget, rather than
		// at the time the old version's backoff armed.
		k.rec = KeepaliveRecord{Version: reg.cfg.Version, ArmedAt: reg.cfg.Clock.Now().UnixMilli()}
		reset = true
	}
	// An alarm a previous incarnation left armed is owed a revival at its first due fire.
	k.mem.owed = k.rec.ArmedAt != 0
	var failed func(error)
	if f := reg.cfg.BackgroundFailed; f != nil {
		failed = func(err error) { f(c.Name, err) }
	}
	runnerLog := reg.cfg.Log
	if il, ok := runnerLog.(itx.InstanceLog); ok {
		runnerLog = il.ForInstance(c.Name) // read through the instance's subscription filter
	}
	r, err := NewRunner(c, RunnerConfig{
		Path: reg.cfg.Path, Log: runnerLog, Progress: store, Clock: reg.cfg.Clock,
		Tracker: k, PageSize: reg.cfg.PageSize, FrameBudget: reg.cfg.FrameBudget, Logf: reg.cfg.Logf, BackgroundFailed: failed,
	})
	if err != nil {
		return nil, err
	}
	if err := r.Open(ctx); err != nil {
		return nil, err
	}
	k.runner = r
	reg.mu.Lock()
	reg.entries = append(reg.entries, k)
	reg.mu.Unlock()
	if reset || stepped {
		if reset {
			reg.cfg.Logf("processor %q: a new version (%s): its crash-loop budget is reset and its revival is due now", c.Name, reg.cfg.Version)
		}
		// A failed write is retried by the next tracked work (unsaved); the runner stays.
		_ = k.persist(ctx)
		return r, nil
	}
	if err := reg.syncAlarm(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// Runners lists the registered runners in registration order.
func (reg *Registry) Runners() []Hosted {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	out := make([]Hosted, len(reg.entries))
	for i, k := range reg.entries {
		out[i] = k.runner
	}
	return out
}

// Runner returns the runner registered under name.
func (reg *Registry) Runner(name string) (Hosted, bool) {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	for _, k := range reg.entries {
		if k.name == name {
			return k.runner, true
		}
	}
	return nil, false
}

// Keepalive returns the keepalive record of name as this incarnation last wrote or read it.
func (reg *Registry) Keepalive(name string) (KeepaliveRecord, bool) {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	for _, k := range reg.entries {
		if k.name == name {
			return k.rec, true
		}
	}
	return KeepaliveRecord{}, false
}

// AlarmOutcome is what one fire did for one processor.
type AlarmOutcome struct {
	Name   string
	Action AlarmAction
}

// HandleAlarm services a fire of the stream's alarm: every processor's keepalive whose time has
// come decides, and every one that owes a revival is marked (durably, before anything else)
// and appends one stream/processor-revived fact. That fact reaches the processors through
// ordinary delivery (the host's wake, or CatchUp): at the head each one gets either a consumed
// event with CaughtUp or the eventless pass. Errors are KV or alarm failures; a failed revival
// is the breaker's business and only shows in the outcomes. The host calls it from one goroutine
// at a time.
func (reg *Registry) HandleAlarm(ctx context.Context) ([]AlarmOutcome, error) {
	reg.mu.Lock()
	entries := append([]*keepalive(nil), reg.entries...)
	reg.armed = -1 // the fire consumed the cell: always set it again below
	reg.mu.Unlock()
	var outcomes []AlarmOutcome
	var errs []error
	for _, k := range entries {
		action, err := k.fire(ctx)
		if err != nil {
			errs = append(errs, err)
		}
		if action != ActionNotDue {
			outcomes = append(outcomes, AlarmOutcome{Name: k.name, Action: action})
		}
	}
	if err := reg.syncAlarm(ctx); err != nil {
		errs = append(errs, err)
	}
	return outcomes, errors.Join(errs...)
}

// Remove ends the incarnation of the runner registered under name and forgets it, so name can
// be registered again (with another contract): what survives is what survives any eviction, the
// progress record (whose next claim fences this runner's late commits) and the keepalive
// record, which the next registration reads back.
func (reg *Registry) Remove(name string) {
	reg.mu.Lock()
	var gone *keepalive
	for i, k := range reg.entries {
		if k.name == name {
			gone = k
			reg.entries = append(reg.entries[:i:i], reg.entries[i+1:]...)
			break
		}
	}
	reg.mu.Unlock()
	if gone != nil {
		gone.runner.Close()
	}
}

// Close ends every runner's incarnation.
func (reg *Registry) Close() {
	for _, h := range reg.Runners() {
		h.Close()
	}
}

// syncAlarm sets the alarm cell to the earliest desire of any keepalive.
func (reg *Registry) syncAlarm(ctx context.Context) error {
	reg.alarmMu.Lock()
	defer reg.alarmMu.Unlock()
	reg.mu.Lock()
	var at int64
	for _, k := range reg.entries {
		if k.rec.ArmedAt != 0 && (at == 0 || k.rec.ArmedAt < at) {
			at = k.rec.ArmedAt
		}
	}
	same := at == reg.armed
	reg.mu.Unlock()
	if same {
		return nil
	}
	t := time.Time{}
	if at != 0 {
		t = time.UnixMilli(at)
	}
	if err := reg.cfg.Alarm.SetAlarm(ctx, t); err != nil {
		return fmt.Errorf("arm processor alarm on %s: %w", reg.cfg.Path, err)
	}
	reg.mu.Lock()
	reg.armed = at
	reg.mu.Unlock()
	return nil
}

// KeepaliveKey is the KV key of a processor's keepalive record.
func KeepaliveKey(name string) string { return itx.ProcessorKVPrefix(name) + "keepalive" }

// keepalive is one processor's breaker in one incarnation: the record mirrors KV, the memory dies
// with the incarnation. Both are guarded by the registry's mu; writes to KV are ordered by wmu so
// the latest record always lands last.
type keepalive struct {
	reg    *Registry
	name   string
	runner Hosted

	rec     KeepaliveRecord
	mem     keepaliveMemory
	unsaved bool                 // the last KV write of rec failed
	starts  map[uint64]time.Time // in-flight work by id: when it started (itx.Monotonic)
	seq     uint64

	wmu sync.Mutex
}

// oldest returns the start of the oldest in-flight work. Called with reg.mu held.
func (k *keepalive) oldest() time.Time {
	var o time.Time
	found := false
	for _, at := range k.starts {
		if !found || at.Before(o) {
			o, found = at, true
		}
	}
	return o
}

// Track registers one unit of in-flight work (Tracker).
func (k *keepalive) Track() func(error) {
	reg := k.reg
	now, mono := reg.cfg.Clock.Now(), itx.Monotonic(reg.cfg.Clock)
	reg.mu.Lock()
	before := k.rec
	k.rec, k.mem = onTrack(k.rec, k.mem, now, reg.cfg.Version)
	epoch := k.mem.epoch
	k.seq++
	id := k.seq
	k.starts[id] = mono
	k.mem.oldest = k.oldest()
	changed := k.rec != before || k.unsaved
	reg.mu.Unlock()
	if changed {
		k.persist(context.Background())
	} else {
		// The record is in KV, but an earlier alarm write may have failed: every tracked
		// attempt re-asserts the alarm (a no-op when it is already armed where it should be).
		reg.syncAlarm(context.Background())
	}
	var once sync.Once
	return func(err error) {
		once.Do(func() {
			reg.mu.Lock()
			k.mem = onSettle(k.mem, err, epoch)
			delete(k.starts, id)
			k.mem.oldest = k.oldest()
			reg.mu.Unlock()
		})
	}
}

// fire runs one alarm fire for this keepalive: decide, mark, revive, record the outcome.
func (k *keepalive) fire(ctx context.Context) (AlarmAction, error) {
	reg := k.reg
	reg.mu.Lock()
	// Read under the lock: a fire that read the clock before another fire marked its revival
	// would see that mark ahead of its now, as after the clock went back (afterClockStepBack).
	now, mono := reg.cfg.Clock.Now(), itx.Monotonic(reg.cfg.Clock)
	action, rec, mem := onFire(k.rec, k.mem, now, mono, reg.cfg.Version)
	changed := rec != k.rec
	k.rec, k.mem = rec, mem
	reg.mu.Unlock()
	if changed {
		// Mark before revival: if this write fails, nothing else happens, and the next fire
		// tries again.
		if err := k.persist(ctx); err != nil {
			if action == ActionRevive {
				reg.mu.Lock()
				action, k.rec, k.mem = afterRevival(k.rec, k.mem, now, mono, err)
				reg.mu.Unlock()
			}
			return action, err
		}
	}
	if action != ActionRevive {
		return action, nil
	}
	passErr := k.revive(ctx, rec)
	if passErr != nil {
		reg.cfg.Logf("processor %q: revival %d failed; next attempt after %v: %v",
			k.name, rec.Revivals, RevivalBackoff(rec.Revivals), passErr)
	}
	reg.mu.Lock()
	action, k.rec, k.mem = afterRevival(k.rec, k.mem, reg.cfg.Clock.Now(), itx.Monotonic(reg.cfg.Clock), passErr)
	reg.mu.Unlock()
	return action, k.persist(ctx)
}

// revive records, once the loop looks like a crash loop, the evidence of it, then appends the
// revival fact (stably keyed by the mark, so a retried pass of the same mark dedupes). The
// evidence comes first, right after the mark, as in the reference keepalive: it is about the
// marks so far, so it does not wait on this revival, and a revival whose fact cannot be
// appended (the very failure a crash loop may be) still leaves it; the revival that reaches
// the mark only once would otherwise never record it for the version.
func (k *keepalive) revive(ctx context.Context, rec KeepaliveRecord) error {
	reg := k.reg
	if rec.Revivals == CrashLoopEvidenceAt {
		// Evidence, not enforcement: the breaker itself lives in KV, so evidence that does not
		// land costs the record, never the revival.
		if err := k.appendCrashLoopEvidence(ctx, rec); err != nil {
			reg.cfg.Logf("processor %q: crash-loop evidence not recorded: %v", k.name, err)
		}
	}
	payload, _ := json.Marshal(map[string]any{
		"processorSlug": k.name,
		"revivals":      rec.Revivals,
		"version":       rec.Version,
	})
	_, err := reg.cfg.Log.Append(ctx, []itx.EventInput{{
		Type:           itx.TypeProcessorRevived,
		Payload:        payload,
		IdempotencyKey: boundedKey(fmt.Sprintf("processor-revived:%s@%s:%d:%d", k.name, rec.Version, rec.Revivals, rec.LastRevivalAt)),
	}})
	return err
}

// CrashLoopEvidenceKey is the idempotency key of a stream's crash-loop evidence on a host
// version (seed 002): one stream/error-occurred fact per version per stream, whichever of its
// processors loops first; the processor is named in the payload.
func CrashLoopEvidenceKey(version string) string {
	return boundedKey("processor-host-crash-loop:" + version)
}

// appendCrashLoopEvidence appends the stream's crash-loop evidence for rec's version. Its body is
// a function of the processor and the version only, so a retried revival dedupes; a second
// processor looping on the same version finds the key taken by the first's body, which is the
// point of the key (the stream already holds this version's evidence), so that conflict is no
// error.
func (k *keepalive) appendCrashLoopEvidence(ctx context.Context, rec KeepaliveRecord) error {
	reg := k.reg
	detail, _ := json.Marshal(map[string]any{
		"name":          "CrashLoop",
		"message":       fmt.Sprintf("revived %d times in a row on version %s", rec.Revivals, rec.Version),
		"processorSlug": k.name,
		"path":          reg.cfg.Path,
		"revivals":      rec.Revivals,
		"version":       rec.Version,
		"plateau":       RevivalPlateau.String(),
	})
	p, _ := json.Marshal(itx.ErrorOccurredPayload{
		Message: fmt.Sprintf("processor %q revived %d times in a row on version %s; backing off up to %v. A new version resets the budget.",
			k.name, rec.Revivals, rec.Version, RevivalPlateau),
		Error: detail,
	})
	_, err := reg.cfg.Log.Append(ctx, []itx.EventInput{{
		Type: itx.TypeErrorOccurred, Payload: p, IdempotencyKey: CrashLoopEvidenceKey(rec.Version),
	}})
	if itx.ErrorCode(err) == itx.EIdempotencyConflict {
		reg.cfg.Logf("processor %q: crash-looping on version %s; this stream's evidence for the version already stands", k.name, rec.Version)
		return nil
	}
	return err
}

// persist writes the current record to KV and re-syncs the alarm.
func (k *keepalive) persist(ctx context.Context) error {
	k.wmu.Lock()
	k.reg.mu.Lock()
	rec := k.rec
	k.reg.mu.Unlock()
	raw, _ := json.Marshal(rec)
	err := k.reg.cfg.KV.Put(ctx, KeepaliveKey(k.name), raw)
	k.reg.mu.Lock()
	k.unsaved = err != nil // the next tracked attempt writes it again
	k.reg.mu.Unlock()
	k.wmu.Unlock()
	if err != nil {
		k.reg.cfg.Logf("processor %q: keepalive record not written: %v", k.name, err)
		return fmt.Errorf("write keepalive of processor %q: %w", k.name, err)
	}
	return k.reg.syncAlarm(ctx)
}
