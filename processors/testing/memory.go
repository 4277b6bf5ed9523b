package proctest

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
)

// MemoryStream is an in-memory stream with the server's append rules that matter to processors:
// atomic batches, stored-form normalization, idempotency keys that dedupe the same body and
// refuse another (itx.EIdempotencyConflict), ephemeral events that reads skip, and itxd's
// checks of a processor's stream/* appends that need no subscription catalog (server-only and
// unknown types refused, payload shapes). Its Append is the committed-but-undelivered door: it
// commits without driving delivery.
type MemoryStream struct {
	path  string
	clock itx.Clock

	mu     sync.Mutex
	events []itx.Event
	keys   map[string]int // idempotency key -> index in events
	fail   func(in itx.EventInput) error
	lose   func(in itx.EventInput) bool
	// scheduled appends by key, landed by Land (the harness's AdvanceTime calls it)
	scheduled map[string]itx.ScheduledEvent
}

var _ processors.StreamLog = (*MemoryStream)(nil)

// NewMemoryStream returns an empty stream at path whose createdAt stamps come from clock.
func NewMemoryStream(path string, clock itx.Clock) *MemoryStream {
	return &MemoryStream{path: path, clock: clock, keys: map[string]int{}, scheduled: map[string]itx.ScheduledEvent{}}
}

// Path is the stream's path.
func (s *MemoryStream) Path() string { return s.path }

// FailAppends injects a fault: while set, a batch holding an event for which fail returns an
// error is refused whole with that error. nil removes the fault.
func (s *MemoryStream) FailAppends(fail func(in itx.EventInput) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = fail
}

// LoseAcks injects the other fault: while set, a batch holding an event for which lose returns
// true commits, and then the caller gets an itx.EUnavailable error as if the answer was lost.
// nil removes the fault.
func (s *MemoryStream) LoseAcks(lose func(in itx.EventInput) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lose = lose
}

// Schedule keeps event to append at at (processors.StreamLog), as itxd's Stream.schedule does:
// the key names it, scheduling it again moves it, and a key already in the log schedules nothing
// (with another body than the logged event's, it fails with itx.EIdempotencyConflict), and a new
// key past itx.MaxScheduledPerStream pending (itxd's default bound) fails with
// itx.ELimitExceeded. Scheduled events land when Land is called at or after their time.
func (s *MemoryStream) Schedule(ctx context.Context, event itx.EventInput, at time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if event.IdempotencyKey == "" || event.Ephemeral || itx.IsCoreType(event.Type) || at.UnixMilli() < 0 {
		return itx.Errorf(itx.EInvalid, "a scheduled event needs an idempotency key and a time after 1970, and cannot be ephemeral or a stream/* record")
	}
	if err := event.Normalize(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, landed := s.keys[event.IdempotencyKey]; landed {
		if prior := s.events[i]; !itx.SameBody(&prior, &event) {
			return itx.Errorf(itx.EIdempotencyConflict,
				"idempotency key %q belongs to event %d with another body", event.IdempotencyKey, prior.Offset)
		}
		return nil
	}
	if _, pending := s.scheduled[event.IdempotencyKey]; !pending && len(s.scheduled) >= itx.MaxScheduledPerStream {
		return itx.Errorf(itx.ELimitExceeded,
			"a stream holds at most %d scheduled events (--max-scheduled-per-stream)", itx.MaxScheduledPerStream)
	}
	event.Payload, event.Metadata = slices.Clone(event.Payload), slices.Clone(event.Metadata)
	s.scheduled[event.IdempotencyKey] = itx.ScheduledEvent{DueAt: at.UnixMilli(), Event: event}
	return nil
}

// Scheduled lists the pending scheduled appends in due order.
func (s *MemoryStream) Scheduled() []itx.ScheduledEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]itx.ScheduledEvent, 0, len(s.scheduled))
	for _, sc := range s.scheduled {
		out = append(out, sc)
	}
	slices.SortFunc(out, func(a, b itx.ScheduledEvent) int {
		if a.DueAt != b.DueAt {
			return cmp.Compare(a.DueAt, b.DueAt)
		}
		return strings.Compare(a.Event.IdempotencyKey, b.Event.IdempotencyKey)
	})
	return out
}

// Land appends the scheduled events due at now, in due order, each alone, and reports how many
// landed. One refused (its key taken meanwhile by another body) is done, with a
// stream/error-occurred record saying so, as in itxd.
func (s *MemoryStream) Land(now time.Time) int {
	n := 0
	for _, sc := range s.Scheduled() {
		if sc.DueAt > now.UnixMilli() {
			break
		}
		s.mu.Lock()
		delete(s.scheduled, sc.Event.IdempotencyKey)
		s.mu.Unlock()
		_, err := s.Append(context.Background(), []itx.EventInput{sc.Event})
		if err != nil {
			payload, _ := json.Marshal(itx.ErrorOccurredPayload{
				Message: fmt.Sprintf("scheduled event %q was not appended: %s", sc.Event.IdempotencyKey, itx.ErrorMessage(err)),
			})
			_, err = s.Append(context.Background(), []itx.EventInput{{
				Type: itx.TypeErrorOccurred, Payload: payload,
				IdempotencyKey: fmt.Sprintf("scheduled-refused:%s@%d", sc.Event.IdempotencyKey, sc.DueAt),
			}})
		}
		if err == nil {
			n++
		}
	}
	return n
}

// Append commits events atomically (processors.StreamLog).
func (s *MemoryStream) Append(ctx context.Context, inputs []itx.EventInput) ([]itx.Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// The bounds of one append call, as itxd refuses a client's (and a processor's): a batch
	// that passes here and not there would fail its frame at every redelivery in production.
	if len(inputs) == 0 {
		return nil, itx.Errorf(itx.EInvalid, "append needs at least one event")
	}
	if len(inputs) > itx.MaxAppendEvents {
		return nil, itx.ErrAppendTooManyEvents(len(inputs))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	next := s.head() + 1
	staged := map[string]itx.Event{}
	var out, fresh []itx.Event
	total := 0
	for i, in := range inputs {
		in.Payload = slices.Clone(in.Payload)
		in.Metadata = slices.Clone(in.Metadata)
		if err := in.Normalize(); err != nil {
			return nil, err
		}
		if len(in.Provenance) > 0 {
			return nil, itx.Errorf(itx.EInvalid, "event %d: provenance is written only by copy-to-stream", i)
		}
		if strings.HasPrefix(in.IdempotencyKey, itx.InternalKeyPrefix) {
			return nil, itx.Errorf(itx.EInvalid, "event %d: idempotency keys starting %q are the server's", i, itx.InternalKeyPrefix)
		}
		total += in.Size()
		if err := checkCore(in); err != nil {
			return nil, err
		}
		if s.fail != nil {
			if err := s.fail(in); err != nil {
				return nil, err
			}
		}
		if in.IdempotencyKey != "" {
			prior, ok := staged[in.IdempotencyKey]
			if i, committed := s.keys[in.IdempotencyKey]; committed {
				prior, ok = s.events[i], true
			}
			if ok {
				if !itx.SameBody(&prior, &in) {
					return nil, itx.Errorf(itx.EIdempotencyConflict,
						"idempotency key %q belongs to event %d with another body", in.IdempotencyKey, prior.Offset)
				}
				out = append(out, prior)
				continue
			}
		}
		e := itx.Event{
			Offset: next, Type: in.Type, Payload: in.Payload, CreatedAt: s.clock.Now().UnixMilli(),
			IdempotencyKey: in.IdempotencyKey, Metadata: in.Metadata, Ephemeral: in.Ephemeral,
		}
		next++
		if in.IdempotencyKey != "" {
			staged[in.IdempotencyKey] = e
		}
		fresh = append(fresh, e)
		out = append(out, e)
	}
	if total > itx.MaxAppendBytes {
		return nil, itx.ErrAppendTooLarge(total)
	}
	for _, e := range fresh {
		if e.IdempotencyKey != "" {
			s.keys[e.IdempotencyKey] = len(s.events)
		}
		s.events = append(s.events, e)
	}
	if s.lose != nil {
		for _, in := range inputs {
			if s.lose(in) {
				return nil, itx.Errorf(itx.EUnavailable, "injected: the append committed but its answer was lost")
			}
		}
	}
	return out, nil
}

// checkCore holds the stream/* events a processor (or a test's premise) appends to itxd's rules
// for a client's append, as far as they need no catalog: a stream/* type itxd does not know, or
// one only itxd writes (stream/woken, stream/subscription-delivery-halted), is refused, and the
// subscription control events must have their payload's shape. That the subscription a control
// event names exists, or that a cursor stays within the head, is checked by itxd only: a
// processor appending those is exercised against a real itxd.
func checkCore(in itx.EventInput) error {
	if !itx.IsCoreType(in.Type) {
		return nil
	}
	switch in.Type {
	case itx.TypeWoken, itx.TypeSubscriptionHalted:
		return itx.Errorf(itx.EInvalid, "%s is written by the server only", in.Type)
	case itx.TypeSubscriptionConfigured:
		cfg, err := itx.ParseSubscriptionConfig(in.Payload)
		if err != nil {
			return err
		}
		return itx.CheckNewSubscriptionConfig(cfg)
	case itx.TypeSubscriptionCursorSet:
		var p itx.CursorSetPayload
		if err := itx.DecodeStrict(in.Payload, &p); err != nil {
			return itx.Errorf(itx.EInvalid, "%s: %v", in.Type, err)
		}
		if strings.TrimSpace(p.Name) == "" || p.AfterOffset < 0 {
			return itx.Errorf(itx.EInvalid, "%s: needs a name and an afterOffset of 0 or more", in.Type)
		}
	case itx.TypeSubscriptionResumed:
		var p itx.NamePayload
		if err := itx.DecodeStrict(in.Payload, &p); err != nil {
			return itx.Errorf(itx.EInvalid, "%s: %v", in.Type, err)
		}
		if strings.TrimSpace(p.Name) == "" {
			return itx.Errorf(itx.EInvalid, "%s: subscription name must not be empty", in.Type)
		}
	case itx.TypeSubscriptionRemoved:
		var p itx.RemovedPayload
		if err := itx.DecodeStrict(in.Payload, &p); err != nil {
			return itx.Errorf(itx.EInvalid, "%s: %v", in.Type, err)
		}
		if strings.TrimSpace(p.Name) == "" || p.Reason != "requested" {
			return itx.Errorf(itx.EInvalid, "%s: needs a name and the reason \"requested\"", in.Type)
		}
	case itx.TypeErrorOccurred, itx.TypeProcessorRevived:
	default:
		return itx.Errorf(itx.EInvalid, "unknown core event type %q", in.Type)
	}
	switch in.Type {
	case itx.TypeErrorOccurred:
		var p itx.ErrorOccurredPayload
		if err := itx.DecodeStrict(in.Payload, &p); err != nil || p.Message == "" {
			return itx.Errorf(itx.EInvalid, "%s: payload must be {message, error?}", in.Type)
		}
	case itx.TypeProcessorRevived:
		var p map[string]any
		if err := json.Unmarshal(in.Payload, &p); err != nil {
			return itx.Errorf(itx.EInvalid, "%s: %v", in.Type, err)
		}
		if _, ok := p["processorSlug"].(string); !ok {
			return itx.Errorf(itx.EInvalid, "%s: processorSlug must be a string", in.Type)
		}
	}
	return nil
}

// Read returns up to limit durable events after offset after (processors.StreamLog). Ephemeral
// events are skipped but scanned; a page that scanned nothing else says so (EphemeralOnly).
func (s *MemoryStream) Read(ctx context.Context, after int64, limit int) (processors.Page, error) {
	if err := ctx.Err(); err != nil {
		return processors.Page{}, err
	}
	if limit <= 0 {
		limit = processors.DefaultPageSize
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	head := s.head()
	p := processors.Page{Head: head, ScannedThrough: max(after, head)}
	i, _ := slices.BinarySearchFunc(s.events, after+1, func(e itx.Event, off int64) int {
		return int(e.Offset - off)
	})
	for ; i < len(s.events); i++ {
		e := s.events[i]
		if e.Ephemeral {
			continue
		}
		if len(p.Events) == limit {
			p.ScannedThrough = p.Events[len(p.Events)-1].Offset
			break
		}
		p.Events = append(p.Events, e)
	}
	// Unfiltered, a page without events scanned only ephemeral offsets.
	p.EphemeralOnly = len(p.Events) == 0
	return p, nil
}

func (s *MemoryStream) head() int64 {
	if len(s.events) == 0 {
		return 0
	}
	return s.events[len(s.events)-1].Offset
}

// Head is the highest committed offset.
func (s *MemoryStream) Head() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.head()
}

// Events returns the committed events, all of them or those of the given types.
func (s *MemoryStream) Events(types ...string) []itx.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []itx.Event
	for _, e := range s.events {
		if len(types) == 0 || slices.Contains(types, e.Type) {
			out = append(out, e)
		}
	}
	return out
}

// MemoryProgressStore is an in-memory processors.ProgressStore with the generation fence.
type MemoryProgressStore struct {
	mu      sync.Mutex
	records map[string]*storedProgress
}

type storedProgress struct {
	generation int64
	progress   *processors.Progress
}

var _ processors.ProgressStore = (*MemoryProgressStore)(nil)

// NewMemoryProgressStore returns an empty store.
func NewMemoryProgressStore() *MemoryProgressStore {
	return &MemoryProgressStore{records: map[string]*storedProgress{}}
}

// Claim bumps name's generation and returns a copy of its record.
func (m *MemoryProgressStore) Claim(ctx context.Context, name string) (*processors.Progress, int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.records[name]
	if r == nil {
		r = &storedProgress{}
		m.records[name] = r
	}
	r.generation++
	return copyProgress(r.progress), r.generation, nil
}

// Commit replaces name's record if generation is current.
func (m *MemoryProgressStore) Commit(ctx context.Context, name string, generation int64, p processors.Progress) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.records[name]
	if r == nil || r.generation != generation {
		current := int64(0)
		if r != nil {
			current = r.generation
		}
		return itx.Errorf(itx.EFailedPrecondition,
			"progress of %q is owned by generation %d, not %d", name, current, generation)
	}
	r.progress = copyProgress(&p)
	return nil
}

// Check fails as Commit would when generation is no longer name's current one.
func (m *MemoryProgressStore) Check(ctx context.Context, name string, generation int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.records[name]; r == nil || r.generation != generation {
		current := int64(0)
		if r != nil {
			current = r.generation
		}
		return itx.Errorf(itx.EFailedPrecondition,
			"progress of %q is owned by generation %d, not %d", name, current, generation)
	}
	return nil
}

// Load returns a copy of name's record (nil when none), without claiming it.
func (m *MemoryProgressStore) Load(name string) *processors.Progress {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.records[name]; r != nil {
		return copyProgress(r.progress)
	}
	return nil
}

func copyProgress(p *processors.Progress) *processors.Progress {
	if p == nil {
		return nil
	}
	c := *p
	c.State = slices.Clone(p.State)
	return &c
}

// MemoryKV is an in-memory processors.KV.
type MemoryKV struct {
	mu sync.Mutex
	m  map[string][]byte
}

var _ processors.KV = (*MemoryKV)(nil)

// NewMemoryKV returns an empty KV.
func NewMemoryKV() *MemoryKV { return &MemoryKV{m: map[string][]byte{}} }

// Get returns a copy of the value under key.
func (kv *MemoryKV) Get(ctx context.Context, key string) ([]byte, bool, error) {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	v, ok := kv.m[key]
	return slices.Clone(v), ok, nil
}

// Put stores a copy of value under key.
func (kv *MemoryKV) Put(ctx context.Context, key string, value []byte) error {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	kv.m[key] = slices.Clone(value)
	return nil
}

// Delete removes key (a key that is not there is no error).
func (kv *MemoryKV) Delete(ctx context.Context, key string) error {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	delete(kv.m, key)
	return nil
}

// MemoryAlarm is an in-memory processors.AlarmCell.
type MemoryAlarm struct {
	mu sync.Mutex
	at time.Time
}

var _ processors.AlarmCell = (*MemoryAlarm)(nil)

// SetAlarm arms the cell at at (zero disarms).
func (a *MemoryAlarm) SetAlarm(ctx context.Context, at time.Time) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.at = at
	return nil
}

// At is the armed time, zero when disarmed.
func (a *MemoryAlarm) At() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.at
}

// fence is one incarnation's right to write. Crash revokes it: whatever a dead incarnation's
// goroutines still try (a late timer, a background attempt) fails, as an evicted process cannot
// write.
type fence struct{ dead atomic.Bool }

func (f *fence) check() error {
	if f.dead.Load() {
		return itx.Errorf(itx.EFailedPrecondition, "this processor incarnation was evicted")
	}
	return nil
}

type fencedLog struct {
	f     *fence
	log   processors.StreamLog
	other func(path string) *MemoryStream // the streams AppendTo reaches (Harness.StreamAt)
	pages *partition                      // random page sizes (Config.PartitionSeed); nil: off
}

// partition draws the size of each page read under Config.PartitionSeed.
type partition struct {
	mu  sync.Mutex // reads run on the processor's goroutines
	rng *rand.Rand
}

// size is a random page size of 1 to limit.
func (p *partition) size(limit int) int {
	if p == nil || limit <= 1 {
		return limit
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return 1 + p.rng.IntN(limit)
}

// AppendTo forwards to another in-memory stream of the harness (itx.ProcessorOutbox), refusing
// what itxd refuses there: the control events (stream/*) of another stream.
func (l fencedLog) AppendTo(ctx context.Context, path string, events []itx.EventInput) (itx.AppendResult, error) {
	if err := l.f.check(); err != nil {
		return itx.AppendResult{}, err
	}
	if err := itx.CheckForward(events); err != nil {
		return itx.AppendResult{}, err
	}
	s := l.other(path)
	before := s.Head()
	out, err := s.Append(ctx, events)
	if err != nil {
		return itx.AppendResult{}, err
	}
	res := itx.AppendResult{Offsets: make([]int64, len(out)), Duplicate: make([]bool, len(out)), HeadOffset: s.Head()}
	for i, e := range out {
		res.Offsets[i], res.Duplicate[i] = e.Offset, e.Offset <= before
	}
	return res, nil
}

func (l fencedLog) Read(ctx context.Context, after int64, limit int) (processors.Page, error) {
	if err := l.f.check(); err != nil {
		return processors.Page{}, err
	}
	return l.log.Read(ctx, after, l.pages.size(limit))
}

func (l fencedLog) Schedule(ctx context.Context, event itx.EventInput, at time.Time) error {
	if err := l.f.check(); err != nil {
		return err
	}
	return l.log.Schedule(ctx, event, at)
}

func (l fencedLog) Append(ctx context.Context, events []itx.EventInput) ([]itx.Event, error) {
	if err := l.f.check(); err != nil {
		return nil, err
	}
	return l.log.Append(ctx, events)
}

type fencedProgress struct {
	f *fence
	s processors.ProgressStore
}

func (p fencedProgress) Claim(ctx context.Context, name string) (*processors.Progress, int64, error) {
	if err := p.f.check(); err != nil {
		return nil, 0, err
	}
	return p.s.Claim(ctx, name)
}

func (p fencedProgress) Commit(ctx context.Context, name string, gen int64, pr processors.Progress) error {
	if err := p.f.check(); err != nil {
		return err
	}
	return p.s.Commit(ctx, name, gen, pr)
}

func (p fencedProgress) Check(ctx context.Context, name string, gen int64) error {
	if err := p.f.check(); err != nil {
		return err
	}
	return p.s.Check(ctx, name, gen)
}

type fencedKV struct {
	f  *fence
	kv processors.KV
}

func (k fencedKV) Get(ctx context.Context, key string) ([]byte, bool, error) {
	if err := k.f.check(); err != nil {
		return nil, false, err
	}
	return k.kv.Get(ctx, key)
}

func (k fencedKV) Put(ctx context.Context, key string, value []byte) error {
	if err := k.f.check(); err != nil {
		return err
	}
	return k.kv.Put(ctx, key, value)
}

func (k fencedKV) Delete(ctx context.Context, key string) error {
	if err := k.f.check(); err != nil {
		return err
	}
	return k.kv.Delete(ctx, key)
}

type fencedAlarm struct {
	f *fence
	a processors.AlarmCell
}

func (a fencedAlarm) SetAlarm(ctx context.Context, at time.Time) error {
	if err := a.f.check(); err != nil {
		return err
	}
	return a.a.SetAlarm(ctx, at)
}
