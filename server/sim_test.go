package server

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/storage"
	"github.com/rs/zerolog"
)

// The deterministic simulation: the real step function and the real SQLite store, driven through
// random schedules of appends, configures, cursor-sets, delivery outcomes, timer fires, flushes
// and crashes (memory dropped, state reloaded from disk), with a store that fails commits before
// or after they run. After every step it checks the invariants the core promises. A failing run
// prints its seed; -sim.seed replays it.
//
//	go test ./server -run TestSimulation -sim.seeds 500 -sim.steps 2000   # a longer run
var (
	simSeeds = flag.Int("sim.seeds", 12, "simulation seeds to run")
	simSteps = flag.Int("sim.steps", 250, "steps per seed")
	simSeed  = flag.Uint64("sim.seed", 0, "run only this seed")
)

// faultyStore fails commits on demand: before the transaction (nothing written) or after it (the
// work is durable, the answer lost).
type faultyStore struct {
	streamStore
	failBefore, failAfter bool
}

var errInjected = errors.New("injected fault")

func (f *faultyStore) Commit(ctx context.Context, c storage.Commit) error {
	switch {
	case f.failBefore:
		f.failBefore = false
		return errInjected
	case f.failAfter:
		f.failAfter = false
		if err := f.streamStore.Commit(ctx, c); err != nil {
			return err
		}
		return errInjected
	}
	return f.streamStore.Commit(ctx, c)
}

// simSender is the receiver side of the simulation: it answers what the schedule tells it to.
type simSender struct {
	next func(b *itx.DeliveryBatch) (int64, error)
}

func (s *simSender) send(_ context.Context, _ *deliverer, b *itx.DeliveryBatch) (int64, error) {
	return s.next(b)
}
func (s *simSender) String() string { return "sim" }

type acked struct {
	typ     string
	payload string
}

type simSub struct {
	birth, seek int64
	durable     int64   // the confirmed offset last seen on disk
	delivered   []int64 // offsets the receiver took under this (birth, seek), in arrival order
	skipped     map[int64]bool
	start       int64
}

type sim struct {
	t        *testing.T
	seed     uint64
	rng      *rand.Rand
	ctx      context.Context
	clock    *clocktest.Clock
	srv      *Server
	file     string
	store    *faultyStore
	st       *streamState
	acks     map[int64]acked // every acknowledged event: offset -> content
	keys     map[string]int64
	subs     map[string]*simSub
	inflight map[string]pushJob
	ds       map[string]*deliverer
	stepNo   int
	history  []string

	// The processor "proc": its claims and commits are port writes the step fences.
	procGen   int64                   // the generation last claimed and acknowledged
	procLost  bool                    // a later claim's answer was lost: procGen may be stale
	procAcked *procRecord             // the last commit acknowledged
	procMaybe []itx.ProcessorProgress // the commits attempted since the last acknowledged one
	// procForgotMaybe: a removal of proc whose answer was lost may have forgotten its record.
	procForgotMaybe bool
	answers         []procAnswer // of the last step that committed
}

func TestSimulation(t *testing.T) {
	seeds := []uint64{}
	if *simSeed != 0 {
		seeds = append(seeds, *simSeed)
	} else {
		for i := 1; i <= *simSeeds; i++ {
			seeds = append(seeds, uint64(i)*7919)
		}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runSim(t, seed, *simSteps) })
	}
}

func runSim(t *testing.T, seed uint64, steps int) {
	ctx := context.Background()
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	s := &sim{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), ctx: ctx, clock: clock,
		srv:  &Server{cfg: Config{DeliveryTimeout: 20 * time.Second}, clock: clock, recv: receivers{mounts: map[mountKey]*mount{}}},
		file: filepath.Join(t.TempDir(), "s.db"), acks: map[int64]acked{}, keys: map[string]int64{}, subs: map[string]*simSub{}}
	store, err := storage.CreateStream(ctx, s.file, storage.StreamMeta{StreamID: "sim", ProjectID: "p", Path: "/sim", CreatedAt: 1})
	if err != nil {
		t.Fatal(err)
	}
	s.store = &faultyStore{streamStore: store}
	s.reload(0)
	defer func() { s.store.Close() }()
	for s.stepNo = 1; s.stepNo <= steps; s.stepNo++ {
		s.act()
		s.check()
	}
}

func (s *sim) fail(format string, args ...any) {
	s.t.Helper()
	tail := s.history
	if len(tail) > 15 {
		tail = tail[len(tail)-15:]
	}
	s.t.Fatalf("seed %d step %d: %s\nlast actions:\n  %s\nreplay: go test ./server -run TestSimulation -sim.seed %d -sim.steps %d",
		s.seed, s.stepNo, fmt.Sprintf(format, args...), joinLines(tail), s.seed, s.stepNo)
}

func joinLines(lines []string) string {
	out := ""
	for i, l := range lines {
		if i > 0 {
			out += "\n  "
		}
		out += l
	}
	return out
}

// reload drops memory and reads the state back from disk, as a restarted actor does.
func (s *sim) reload(nextGen int64) {
	st, err := loadState(s.ctx, s.store, s.env().rc, s.clock.Now(), nopWarn)
	if err != nil {
		s.fail("reload: %v", err)
	}
	st.bucket = newTokenBucket(itx.BreakerBurst, itx.BreakerRefillPerMinute, s.clock.Now())
	st.nextGen = nextGen
	for name := range st.core.Subscriptions {
		st.subs[name] = st.newRuntime()
	}
	s.st = st
	s.inflight = map[string]pushJob{}
	s.ds = map[string]*deliverer{}
	// The first step of an incarnation schedules what the last one owed.
	s.apply(stepInput{})
}

func (s *sim) env() stepEnv {
	return stepEnv{
		rc: reduceContext{path: "/sim", projectID: "p", maxSubs: 4,
			compile: func(src string) error { _, err := CompileJSONata(src); return err }},
		lookupKeys: func(keys []string) (map[string]*itx.Event, error) {
			if len(keys) == 0 {
				return nil, nil
			}
			return s.store.EventsByKeys(s.ctx, keys)
		},
		loadKV:          func(key string) ([]byte, error) { return s.store.KV(s.ctx, key) },
		maxProcKVKeys:   3,
		maxProcKVBytes:  40,
		random:          s.rng.Float64,
		flushDelay:      200 * time.Millisecond,
		deliveryTimeout: 20 * time.Second,
		batchLimits:     func(string) int { return 3 },
	}
}

// apply runs one step and carries out its effects as the actor does: commit, then on success
// replies and pushes; on failure, reload from disk.
func (s *sim) apply(in stepInput) []appendReply {
	eff, err := step(s.st, in, s.clock.Now(), s.env())
	if err == nil && eff.hasWrites() {
		err = s.store.Commit(s.ctx, eff.commit)
	}
	if err != nil {
		s.history = append(s.history, fmt.Sprintf("  commit failed (%v): reload", err))
		s.reload(s.st.nextGen)
		return nil
	}
	for _, name := range eff.rebuild {
		delete(s.ds, name)
		delete(s.inflight, name)
	}
	for _, job := range eff.pushes {
		s.inflight[job.name] = job
	}
	s.answers = eff.procAnswers
	var replies []appendReply
	for _, rb := range eff.replies {
		replies = append(replies, rb.plan.Replies...)
	}
	return replies
}

var simNames = []string{"a", "b", "c"}

// act performs one random action.
func (s *sim) act() {
	r := s.rng.IntN(100)
	switch {
	case r < 30:
		s.appendEvents()
	case r < 37:
		s.configure()
	case r < 40:
		s.control()
	case r < 68:
		s.deliver()
	case r < 75:
		s.proc()
	case r < 85:
		d := time.Duration(s.rng.IntN(5000)) * time.Millisecond
		s.clock.Advance(d)
		s.history = append(s.history, fmt.Sprintf("advance %s", d))
		s.apply(stepInput{})
	case r < 90:
		s.history = append(s.history, "flush")
		s.apply(stepInput{flush: true})
	case r < 95:
		s.history = append(s.history, "crash")
		s.store.Close()
		store, err := storage.OpenStream(s.ctx, s.file)
		if err != nil {
			s.fail("reopen: %v", err)
		}
		s.store = &faultyStore{streamStore: store}
		s.reload(s.st.nextGen)
	default:
		if s.rng.IntN(2) == 0 {
			s.store.failBefore = true
			s.history = append(s.history, "next commit fails before it runs")
		} else {
			s.store.failAfter = true
			s.history = append(s.history, "next commit fails after it ran (ack lost)")
		}
	}
}

func (s *sim) appendEvents() {
	n := 1 + s.rng.IntN(4)
	var inputs []itx.EventInput
	for i := 0; i < n; i++ {
		in := itx.EventInput{Type: "e", Payload: json.RawMessage(fmt.Sprintf(`{"step":%d,"i":%d}`, s.stepNo, i))}
		if s.rng.IntN(3) == 0 {
			in.IdempotencyKey = fmt.Sprintf("k%d", s.rng.IntN(40))
			// a key's body is a function of the key, so a reuse is a retry, never a conflict
			in.Payload = json.RawMessage(fmt.Sprintf(`{"key":%q}`, in.IdempotencyKey))
		}
		if err := in.Normalize(); err != nil {
			s.fail("normalize: %v", err)
		}
		inputs = append(inputs, in)
	}
	s.history = append(s.history, fmt.Sprintf("append %d", n))
	replies := s.apply(stepInput{appends: []*appendReq{{inputs: inputs, reply: make(chan appendReply, 1)}}})
	if len(replies) == 0 || replies[0].err != nil {
		return // not acknowledged
	}
	for i, off := range replies[0].result.Offsets {
		in := inputs[i]
		if prev, ok := s.keys[in.IdempotencyKey]; ok && in.IdempotencyKey != "" && prev != off {
			s.fail("key %s answered %d, earlier %d", in.IdempotencyKey, off, prev)
		}
		if in.IdempotencyKey != "" {
			s.keys[in.IdempotencyKey] = off
		}
		s.acks[off] = acked{typ: in.Type, payload: string(in.Payload)}
	}
}

func (s *sim) configure() {
	if s.rng.IntN(4) == 0 {
		b, _ := json.Marshal(itx.SubscriptionConfig{Name: "proc", Receiver: itx.Receiver{Action: itx.KindProcessorWake}})
		s.history = append(s.history, "configure proc (processor-wake)")
		s.apply(stepInput{appends: []*appendReq{{inputs: []itx.EventInput{{Type: itx.TypeSubscriptionConfigured, Payload: b}}, reply: make(chan appendReply, 1)}}})
		return
	}
	name := simNames[s.rng.IntN(len(simNames))]
	policy := []string{itx.OnFailingHalt, itx.OnFailingSkip}[s.rng.IntN(2)]
	start := []string{itx.StartBeginning, itx.StartNow}[s.rng.IntN(2)]
	cfg := itx.SubscriptionConfig{Name: name, Receiver: itx.Receiver{Action: itx.KindITXCall, Capability: "c" + fmt.Sprint(s.rng.IntN(2)),
		Delivery: &itx.DeliveryPolicy{Start: start, OnFailingEvent: policy}}}
	b, _ := json.Marshal(cfg)
	s.history = append(s.history, fmt.Sprintf("configure %s %s %s %s", name, cfg.Receiver.Capability, start, policy))
	s.apply(stepInput{appends: []*appendReq{{inputs: []itx.EventInput{{Type: itx.TypeSubscriptionConfigured, Payload: b}}, reply: make(chan appendReply, 1)}}})
}

func (s *sim) control() {
	name := append(simNames, "proc")[s.rng.IntN(len(simNames)+1)]
	var typ string
	var payload any
	switch s.rng.IntN(4) {
	case 3:
		capability := "c" + fmt.Sprint(s.rng.IntN(2))
		s.history = append(s.history, "mount "+capability)
		s.apply(stepInput{mounted: []string{capability}})
		return
	case 0:
		typ, payload = itx.TypeSubscriptionCursorSet, itx.CursorSetPayload{Name: name, AfterOffset: s.rng.Int64N(s.st.head + 1)}
	case 1:
		typ, payload = itx.TypeSubscriptionResumed, itx.NamePayload{Name: name}
	default:
		typ, payload = itx.TypeSubscriptionRemoved, itx.RemovedPayload{Name: name, Reason: "requested"}
	}
	b, _ := json.Marshal(payload)
	s.history = append(s.history, fmt.Sprintf("%s %s", typ, b))
	req := &appendReq{inputs: []itx.EventInput{{Type: typ, Payload: b}}, reply: make(chan appendReply, 1)}
	existed := s.st.core.Subscriptions[name] != nil
	s.apply(stepInput{appends: []*appendReq{req}})
	if typ == itx.TypeSubscriptionRemoved && name == "proc" && existed {
		// Removal forgets the processor's record (a bumped generation, no progress): whatever
		// was acknowledged is gone, and procGen is fenced. Unanswered, it may have landed.
		s.procLost = true
		select {
		case r := <-req.reply:
			if r.err == nil {
				s.procAcked, s.procMaybe, s.procForgotMaybe = nil, nil, false
			}
		default:
			s.procForgotMaybe = true
		}
	}
}

// deliver completes one in-flight push through the real deliverer, with a receiver that
// succeeds, confirms part, fails in one of the classes, or never answers (its outcome is lost).
func (s *sim) deliver() {
	if len(s.inflight) == 0 {
		s.apply(stepInput{})
		return
	}
	var name string
	for _, n := range simNames {
		if _, ok := s.inflight[n]; ok {
			name = n
			break
		}
	}
	job := s.inflight[name]
	delete(s.inflight, name)
	entry := s.st.core.Subscriptions[name]
	if entry == nil {
		return
	}
	d := s.ds[name]
	if d == nil {
		d = newDeliverer(s.ctx, s.srv, StreamRef{ProjectID: "p", Path: "/sim"}, entry)
		s.ds[name] = d
	}
	mode := s.rng.IntN(10)
	var took []int64
	d.send = &simSender{next: func(b *itx.DeliveryBatch) (int64, error) {
		switch {
		case mode < 5:
			for _, e := range b.Events {
				took = append(took, e.Offset)
			}
			return 0, nil
		case mode < 6:
			k := 1 + s.rng.IntN(len(b.Events))
			for _, e := range b.Events[:k] {
				took = append(took, e.Offset)
			}
			return b.Events[k-1].Offset, nil
		case mode < 7:
			return 0, withClass(classOutage, errors.New("receiver down"))
		case mode < 8:
			return 0, withClass(classAbsent, errors.New("receiver absent"))
		case mode < 9:
			return 0, withClass(classEvent, errors.New("receiver refused"))
		}
		return 0, withClass(classTerminal, errors.New("never"))
	}}
	out := d.push(job, s.store, "sim")
	s.history = append(s.history, fmt.Sprintf("deliver %s after=%d head=%d limit=%d mode=%d took=%v -> through=%d failure=%v",
		name, job.row.ConfirmedOffset, job.head, job.limit, mode, took, out.through, out.failure != nil))
	sub := s.subs[name]
	if sub != nil && sub.birth == job.row.ConfiguredAtOffset && sub.seek == job.row.CursorChangedAtOffset {
		sub.delivered = append(sub.delivered, took...)
	}
	s.apply(stepInput{outcomes: []deliveryOutcome{out}})
}

// proc is one port write of the processor "proc", as a runner (or a dead incarnation of it)
// makes them: a claim, a commit under the current generation, or one under a stale generation,
// which must be refused. A commit may be an operator's rewind, carrying the seek it honors.
func (s *sim) proc() {
	if s.rng.IntN(4) == 0 {
		s.procKV()
		return
	}
	if s.rng.IntN(4) == 0 {
		s.history = append(s.history, "proc claim")
		s.answers = nil
		s.apply(stepInput{procOps: []procOp{{claim: "proc"}}})
		if len(s.answers) == 1 && s.answers[0].reply.err == nil {
			s.procGen, s.procLost = s.answers[0].reply.generation, false
		} else {
			s.procLost = true // it may have committed: a newer generation may fence procGen
		}
		return
	}
	gen, stale := s.procGen, s.procGen > 1 && s.rng.IntN(4) == 0
	if stale {
		gen = s.procGen - 1 - s.rng.Int64N(s.procGen-1)
	}
	var prev itx.ProcessorProgress
	if s.procAcked != nil && s.procAcked.Progress != nil {
		prev = *s.procAcked.Progress
	}
	p := prev
	p.ReducerVersion = "1"
	p.ProcessedThrough = min(s.st.head, prev.ProcessedThrough+s.rng.Int64N(4))
	var seek int64
	if r := s.st.rows["proc"]; r != nil && s.rng.IntN(6) == 0 {
		p.ProcessedThrough, p.CursorRevision, seek = r.ConfirmedOffset, prev.CursorRevision+1, r.CursorChangedAtOffset
	}
	p.ReducedThrough = p.ProcessedThrough
	p.State = json.RawMessage(fmt.Sprintf(`{"n":%d}`, p.ProcessedThrough))
	s.history = append(s.history, fmt.Sprintf("proc commit gen=%d (current %d) processed=%d revision=%d seek=%d", gen, s.procGen, p.ProcessedThrough, p.CursorRevision, seek))
	s.answers = nil
	s.apply(stepInput{procOps: []procOp{{commit: &procCommit{name: "proc", generation: gen, seek: seek, progress: p}}}})
	if len(s.answers) != 1 {
		// Not acknowledged, though it may have landed: the runner goes on from what it knows
		// was committed, so the record may move back to there (a redelivery).
		s.procMaybe = append(s.procMaybe, p)
		return
	}
	err := s.answers[0].reply.err
	switch {
	case gen != s.procGen && err == nil:
		s.fail("a commit of stale generation %d was accepted (current %d)", gen, s.procGen)
	case gen == s.procGen && s.procGen > 0 && !s.procLost && err != nil:
		s.fail("a commit of the current generation %d was refused: %v", gen, err)
	case err == nil:
		s.procAcked, s.procMaybe, s.procForgotMaybe = &procRecord{Generation: gen, Progress: &p}, nil, false
	}
}

// procKV is a burst of processor KV puts in one step: keys from a small set, values of random size,
// so puts overwrite, repeat a key within the step and cross the sim's bounds (3 keys, 40 bytes).
func (s *sim) procKV() {
	var ops []procOp
	for range 1 + s.rng.IntN(3) {
		ops = append(ops, procOp{kvKey: fmt.Sprintf("k%d", s.rng.IntN(5)), kvVal: make([]byte, s.rng.IntN(20))})
	}
	s.history = append(s.history, fmt.Sprintf("proc kv puts %d", len(ops)))
	s.apply(stepInput{procOps: ops})
}

// checkProcKV verifies the processors' KV totals the state keeps against the disk, and the bounds.
func (s *sim) checkProcKV() {
	keys, bytes, err := s.store.KVUsage(s.ctx, procKVPrefix)
	if err != nil {
		s.fail("kv usage: %v", err)
	}
	if keys != s.st.procKVKeys || bytes != s.st.procKVBytes {
		s.fail("processor KV: disk holds %d keys, %d bytes; memory counts %d, %d", keys, bytes, s.st.procKVKeys, s.st.procKVBytes)
	}
	if keys > 3 || bytes > 40 {
		s.fail("processor KV past its bounds: %d keys, %d bytes", keys, bytes)
	}
}

// checkProc verifies the processor's record on disk: acknowledged progress is durable and nothing
// but the runner's own commits replace it, and the cursor row never confirms beyond it.
func (s *sim) checkProc() {
	raw, err := s.store.KV(s.ctx, procProgressPrefix+"proc")
	if err != nil {
		s.fail("read proc record: %v", err)
	}
	if raw == nil {
		if s.procAcked != nil || s.procGen > 0 {
			s.fail("the acknowledged proc record is gone")
		}
		return
	}
	var rec procRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		s.fail("proc record: %v", err)
	}
	if r := s.st.rows["proc"]; r != nil && r.CursorChangedAtOffset == r.ConfiguredAtOffset {
		processed := int64(0)
		if rec.Progress != nil {
			processed = rec.Progress.ProcessedThrough
		}
		if r.ConfirmedOffset > processed {
			s.fail("proc's cursor row confirms %d, beyond the processing cursor %d", r.ConfirmedOffset, processed)
		}
	}
	if rec.Generation < s.procGen {
		s.fail("proc generation %d on disk, %d was acknowledged", rec.Generation, s.procGen)
	}
	if a := s.procAcked; a != nil && !(s.procForgotMaybe && rec.Progress == nil) {
		// The record is the last acknowledged commit, or one attempted after it whose answer was
		// lost: nothing else, and nothing older.
		if rec.Progress == nil {
			s.fail("acknowledged proc progress is gone")
		}
		ok := sameProgress(*rec.Progress, *a.Progress)
		for _, m := range s.procMaybe {
			ok = ok || sameProgress(*rec.Progress, m)
		}
		if !ok {
			s.fail("proc record %+v is neither the acknowledged %+v nor a later attempt", *rec.Progress, *a.Progress)
		}
	}
}

func sameProgress(a, b itx.ProcessorProgress) bool {
	return a.ProcessedThrough == b.ProcessedThrough && a.CursorRevision == b.CursorRevision && string(a.State) == string(b.State)
}

// check verifies the invariants against what is on disk.
func (s *sim) check() {
	ctx := s.ctx
	s.checkProc()
	s.checkProcKV()
	meta, err := s.store.Meta(ctx)
	if err != nil {
		s.fail("meta: %v", err)
	}
	events, err := s.store.Events(ctx, storage.Query{After: 0, UpTo: meta.HeadOffset, Limit: 1 << 20, IncludeEphemeral: true})
	if err != nil {
		s.fail("read: %v", err)
	}
	// Offsets are dense from 1 and the head is the last one.
	for i, e := range events {
		if e.Offset != int64(i+1) {
			s.fail("offsets not dense: position %d holds offset %d", i, e.Offset)
		}
	}
	if int64(len(events)) != meta.HeadOffset || s.st.head != meta.HeadOffset {
		s.fail("head: disk %d, rows %d, memory %d", meta.HeadOffset, len(events), s.st.head)
	}
	// No acknowledged event is lost or changed.
	for off, a := range s.acks {
		if off > int64(len(events)) {
			s.fail("acknowledged offset %d lost (head %d)", off, len(events))
		}
		e := events[off-1]
		if e.Type != a.typ || string(e.Payload) != a.payload {
			s.fail("acknowledged offset %d changed: %s %s, want %s %s", off, e.Type, e.Payload, a.typ, a.payload)
		}
	}
	rows, err := s.store.CursorRows(ctx)
	if err != nil {
		s.fail("rows: %v", err)
	}
	seen := map[string]bool{}
	for _, r := range rows {
		seen[r.Name] = true
		if r.Name == "proc" {
			continue // a processor's row mirrors its progress record: checkProc
		}
		sub := s.subs[r.Name]
		if sub == nil || sub.birth != r.ConfiguredAtOffset || sub.seek != r.CursorChangedAtOffset {
			// A new birth or an explicit cursor-set: the only ways a cursor may move back. Both
			// are events on disk; check that one explains the new epoch.
			if sub != nil && sub.birth == r.ConfiguredAtOffset && r.CursorChangedAtOffset != r.ConfiguredAtOffset &&
				events[r.CursorChangedAtOffset-1].Type != itx.TypeSubscriptionCursorSet {
				s.fail("%s: seek epoch %d is not a cursor-set event", r.Name, r.CursorChangedAtOffset)
			}
			start := r.ConfirmedOffset
			s.subs[r.Name] = &simSub{birth: r.ConfiguredAtOffset, seek: r.CursorChangedAtOffset, durable: r.ConfirmedOffset, start: start, skipped: map[int64]bool{}}
			continue
		}
		if r.ConfirmedOffset < sub.durable {
			s.fail("%s: durable cursor moved back from %d to %d without a cursor-set", r.Name, sub.durable, r.ConfirmedOffset)
		}
		sub.durable = r.ConfirmedOffset
		// Every offset at or below the cursor was delivered, in order, or skipped on the record.
		for _, e := range events {
			if e.Type != itx.TypeErrorOccurred {
				continue
			}
			var p itx.ErrorOccurredPayload
			_ = json.Unmarshal(e.Payload, &p)
			var skipped int64
			if _, err := fmt.Sscanf(p.Message, fmt.Sprintf("subscription %q skipped failing event at offset %%d", r.Name), &skipped); err == nil {
				sub.skipped[skipped] = true
			}
		}
		next := 0
		for off := sub.start + 1; off <= r.ConfirmedOffset; off++ {
			if events[off-1].Ephemeral || sub.skipped[off] {
				continue
			}
			for next < len(sub.delivered) && sub.delivered[next] < off {
				next++
			}
			if next >= len(sub.delivered) || sub.delivered[next] != off {
				s.fail("%s: offset %d is at or below the confirmed cursor %d but was never delivered (delivered %v, start %d)",
					r.Name, off, r.ConfirmedOffset, sub.delivered, sub.start)
			}
		}
	}
	for name := range s.subs {
		if !seen[name] {
			delete(s.subs, name)
		}
	}
}

// nopWarn drops re-reduction warnings (zerolog's nil event is a no-op).
func nopWarn() *zerolog.Event { return nil }
