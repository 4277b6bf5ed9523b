package server

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
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
//	go test ./server -run TestSimulation -sim.from 501 -sim.seeds 500     # other schedules
var (
	simSeeds = flag.Int("sim.seeds", 12, "simulation seeds to run")
	simSteps = flag.Int("sim.steps", 250, "steps per seed")
	simSeed  = flag.Uint64("sim.seed", 0, "run only this seed")
	simFrom  = flag.Int("sim.from", 1, "the first of the -sim.seeds seeds (a later range explores schedules earlier runs did not)")
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

	// An offset-acking subscription (confirmWindow > 0): the receiver's side of the model.
	window   int64
	types    map[string]bool // its filter's event types (nil: every event)
	received map[int64]bool  // offsets the receiver took under this (birth, seek)
	maxRecv  int64           // the highest of them
	maxRead  int64           // the furthest a delivery read (over what the filter passed too)
	recvConf int64           // the highest offset the receiver confirmed (an answer, or an accepted confirm)
	promised int64           // the highest cursor a confirm reply reported (it must be durable)
	covered  map[int64]bool  // offsets a delivery covered since the last reset the model knows of
	resets   int             // the model's resets (reload, failure, mount of its receiver's name)
	durDeliv int64           // DeliveredOffset last seen on disk
	answers  int             // of 10 answers, how many confirm something (0: it confirms only later, by confirm ops)
}

// matches reports whether an acking subscription's receiver is sent the event (its filter).
func (sub *simSub) matches(e itx.Event) bool {
	return !e.Ephemeral && (sub.types == nil || sub.types[e.Type])
}

// resetCovered is a reset the step must honor: what was delivered unconfirmed goes again.
func (sub *simSub) resetCovered() {
	sub.covered = map[int64]bool{}
	sub.resets++
}

type sim struct {
	afterStep func() // runs once, right after the next step
	t         *testing.T
	seed      uint64
	rng       *rand.Rand
	ctx       context.Context
	clock     *clocktest.Clock
	srv       *Server
	file      string
	store     *faultyStore
	st        *streamState
	acks      map[int64]acked // every acknowledged event: offset -> content
	keys      map[string]int64
	subs      map[string]*simSub
	inflight  map[string]pushJob
	ds        map[string]*deliverer
	stepNo    int
	history   []string

	// The processor "proc": its claims and commits are port writes the step fences.
	procGen   int64                   // the generation last claimed and acknowledged
	procLost  bool                    // a later claim's answer was lost: procGen may be stale
	procAcked *procRecord             // the last commit acknowledged
	procMaybe []itx.ProcessorProgress // the commits attempted since the last acknowledged one
	// procForgotMaybe: a removal of proc whose answer was lost may have forgotten its record.
	procForgotMaybe bool
	answers         []procAnswer // of the last step that committed

	// The last step: whether it committed (or had nothing to write), and its effects.
	lastOK  bool
	lastEff effects
	// jobResets is, per push in flight, the model's reset count of its subscription when it
	// was planned: a delivery covers offsets only if no reset came between.
	jobResets map[string]int

	// Registered readers and scheduled appends (sim_readers_test.go): the model.
	readers   map[string]int64     // name -> checkpoint
	sched     map[string]simSched  // pending scheduled appends by key
	logged    map[string]simLogged // the scheduling keys (sN) in the log
	stats     map[string]int       // what the run exercised (logged with -v)
	schedNext int                  // the last scheduling key made (sN)
}

func TestSimulation(t *testing.T) {
	seeds := []uint64{}
	if *simSeed != 0 {
		seeds = append(seeds, *simSeed)
	} else {
		for i := *simFrom; i < *simFrom+*simSeeds; i++ {
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
		file: filepath.Join(t.TempDir(), "s.db"), acks: map[int64]acked{}, keys: map[string]int64{}, subs: map[string]*simSub{},
		readers: map[string]int64{}, sched: map[string]simSched{}, logged: map[string]simLogged{}, stats: map[string]int{}}
	store, err := storage.CreateStream(ctx, s.file, storage.StreamMeta{StreamID: "sim", ProjectID: "p", Path: "/sim", CreatedAt: 1})
	if err != nil {
		t.Fatal(err)
	}
	// The stream the simulation drives exists from the start (its first commit landed), so its
	// model takes a schedule before any append; a database at head 0 without bornKey is a
	// creation cut short, where a schedule is notFound.
	if err := store.Commit(ctx, storage.Commit{KV: map[string][]byte{bornKey: []byte("1")}}); err != nil {
		t.Fatal(err)
	}
	s.store = &faultyStore{streamStore: store}
	s.reload(0)
	defer func() { s.store.Close() }()
	for s.stepNo = 1; s.stepNo <= steps; s.stepNo++ {
		s.act()
		// The actor steps again at once when a step leaves a scheduled append due.
		for i := 0; s.lastOK && s.lastEff.stepAgain; i++ {
			if i == 3 {
				s.fail("a step asks for another step again and again")
			}
			s.history = append(s.history, "step again (a scheduled append is due)")
			s.apply(stepInput{})
		}
		s.check()
	}
	s.drain()
	s.drainScheduled()
	t.Logf("exercised: %v", s.stats)
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
	s.jobResets = map[string]int{}
	s.ds = map[string]*deliverer{}
	for name, sub := range s.subs {
		// A restart forgets what was delivered unconfirmed: it goes again from the cursor.
		sub.resetCovered()
		if rt := st.subs[name]; rt != nil && (rt.sendFrom != 0 || len(rt.marks) != 0) {
			s.fail("%s: reloaded with sendFrom %d and %d marks, not from its confirmed cursor", name, rt.sendFrom, len(rt.marks))
		}
	}
	// The first step of an incarnation schedules what the last one owed.
	s.apply(stepInput{})
}

func (s *sim) env() stepEnv {
	return stepEnv{
		rc: reduceContext{path: "/sim", projectID: "p", maxSubs: 4, maxReaders: simMaxReaders,
			compile: func(src string) error { _, err := CompileJSONata(src); return err },
			nameTaken: func(name string) string { // as the actor's: a registered reader holds its name
				if _, ok := s.st.readers[name]; ok {
					return "a registered reader"
				}
				return ""
			}},
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
		loadScheduled:   func(keys []string) (map[string][]byte, error) { return s.store.ScheduledByKeys(s.ctx, keys) },
		maxScheduled:    simMaxScheduled,
	}
}

// apply runs one step and carries out its effects as the actor does: commit, then on success
// replies and pushes; on failure, reload from disk.
func (s *sim) apply(in stepInput) []appendReply {
	nowMs, headBefore := itx.UnixMilli(s.clock.Now()), s.st.head
	eff, err := step(s.st, in, s.clock.Now(), s.env())
	if s.afterStep != nil {
		s.afterStep() // the model's side of what the step decided, before its pushes are checked
		s.afterStep = nil
	}
	stepErr, failBefore := err, s.store.failBefore
	if err == nil && eff.hasWrites() {
		err = s.store.Commit(s.ctx, eff.commit)
	}
	if stepErr == nil {
		// The commit ran unless it failed before it ran (an injected fault after it leaves it
		// durable, its answer lost).
		s.modelStep(in, nowMs, headBefore, eff, err == nil || (errors.Is(err, errInjected) && !failBefore), err == nil)
	}
	s.lastOK, s.lastEff = false, effects{}
	if err != nil {
		s.history = append(s.history, fmt.Sprintf("  commit failed (%v): reload", err))
		s.reload(s.st.nextGen)
		s.lastOK, s.lastEff = false, effects{} // the reload's own step is not this one
		return nil
	}
	s.lastOK, s.lastEff = true, eff
	if debugSim && s.stepNo > 230 {
		fmt.Printf("DBG step %d in=%+v writes=%v upserts=%v\n  mem c=%+v\n  disk c=%+v\n", s.stepNo, in.outcomes, eff.hasWrites(), len(eff.commit.CursorUpserts), s.st.rows["c"], s.diskRow("c"))
	}
	for _, name := range eff.rebuild {
		delete(s.ds, name)
		delete(s.inflight, name)
	}
	for _, job := range eff.pushes {
		s.checkPush(job)
		s.inflight[job.name] = job
		s.jobResets[job.name] = 0 // a new epoch's model starts with no resets
		if sub := s.subs[job.name]; sub != nil && sub.birth == job.row.ConfiguredAtOffset && sub.seek == job.row.CursorChangedAtOffset {
			s.jobResets[job.name] = sub.resets
		}
	}
	s.answers = eff.procAnswers
	var replies []appendReply
	for _, rb := range eff.replies {
		replies = append(replies, rb.plan.Replies...)
	}
	return replies
}

const debugSim = false

var simNames = []string{"a", "b", "c"}

// act performs one random action.
func (s *sim) act() {
	r := s.rng.IntN(109)
	switch {
	case r >= 104:
		s.scheduleOps()
	case r >= 100:
		s.readerOps()
	case r < 28:
		s.appendEvents()
	case r < 35:
		s.configure()
	case r < 40:
		s.control()
	case r < 62:
		s.deliver(-1)
	case r < 68:
		s.confirm()
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
		typ := "e"
		if s.rng.IntN(4) == 0 {
			typ = "n" // passed over by the acking subscriptions' filters
		}
		in := itx.EventInput{Type: typ, Payload: json.RawMessage(fmt.Sprintf(`{"step":%d,"i":%d}`, s.stepNo, i))}
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
	if s.rng.IntN(2) == 0 {
		// Offset-acking: a small window, so it fills and stalls; a filter, sometimes, so some
		// deliveries carry nothing.
		cfg.ConfirmWindow = 1 + s.rng.IntN(5)
		if s.rng.IntN(2) == 0 {
			cfg.Filter = &itx.SubscriptionFilter{EventTypes: []string{"e"}}
		}
	}
	b, _ := json.Marshal(cfg)
	s.history = append(s.history, fmt.Sprintf("configure %s %s %s %s window=%d filter=%v", name, cfg.Receiver.Capability, start, policy, cfg.ConfirmWindow, cfg.Filter != nil))
	_, isReader := s.readers[name]
	replies := s.apply(stepInput{appends: []*appendReq{{inputs: []itx.EventInput{{Type: itx.TypeSubscriptionConfigured, Payload: b}}, reply: make(chan appendReply, 1)}}})
	if len(replies) > 0 && isReader && itx.ErrorCode(replies[0].err) != itx.EFailedPrecondition {
		// One name space: a registered reader's name is refused to a subscription.
		s.fail("configure %s, a registered reader's name, answered %v", name, replies[0].err)
	}
}

func (s *sim) control() {
	name := append(simNames, "proc")[s.rng.IntN(len(simNames)+1)]
	var typ string
	var payload any
	switch s.rng.IntN(4) {
	case 3:
		s.mount("c" + fmt.Sprint(s.rng.IntN(2)))
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
// An offset-acking subscription's receiver takes the whole batch and its answer confirms its
// last event, nothing, or an offset it took earlier. force >= 0 picks the receiver's mode (and an
// acking receiver then confirms the batch's last event).
func (s *sim) deliver(force int) {
	var names []string
	for _, n := range simNames {
		if _, ok := s.inflight[n]; ok {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		s.apply(stepInput{})
		return
	}
	s.deliverTo(names[s.rng.IntN(len(names))], force)
}

func (s *sim) deliverTo(name string, force int) {
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
	sub := s.subs[name]
	if sub != nil && (sub.birth != job.row.ConfiguredAtOffset || sub.seek != job.row.CursorChangedAtOffset) {
		sub = nil // read under another epoch: the model of this one learns nothing from it
	}
	mode := force
	if mode < 0 {
		mode = s.rng.IntN(10)
	}
	if job.acking && sub != nil && sub.answers == 0 && force < 0 {
		mode = 0 // a receiver slow to confirm takes everything but the poison events
	}
	var took []int64
	var answered int64
	d.send = &simSender{next: func(b *itx.DeliveryBatch) (int64, error) {
		// The acking receivers refuse a batch that holds a fourth event of an append; one slow to
		// confirm refuses every fifth offset too.
		poison := false
		for _, e := range b.Events {
			poison = poison || (job.acking && force < 0 && strings.Contains(string(e.Payload), `"i":3`)) ||
				(job.acking && force < 0 && sub != nil && sub.answers == 0 && e.Offset%5 == 0)
		}
		switch {
		case poison:
			return 0, withClass(classEvent, errors.New("receiver refused a poison event"))
		case job.acking && mode < 6:
			for _, e := range b.Events {
				took = append(took, e.Offset)
			}
			last := b.Events[len(b.Events)-1].Offset
			switch pick := s.rng.IntN(10); {
			case force >= 0:
				answered = last
			case sub == nil || pick >= sub.answers:
				answered = 0 // confirms nothing yet: a later confirm, or a redelivery
			case pick < sub.answers/2:
				answered = last
			default:
				answered = s.rng.Int64N(max(sub.maxRecv, last)) + 1 // through something it took
				if answered > last && !sub.received[answered] {
					answered = last
				}
			}
			return answered, nil
		case mode < 5:
			for _, e := range b.Events {
				took = append(took, e.Offset)
			}
			return 0, nil
		case job.acking && mode < 7:
			return 0, withClass(classOutage, errors.New("receiver down"))
		case job.acking && mode < 8 && s.rng.IntN(2) == 0:
			return 0, withClass(classAbsent, errors.New("receiver absent"))
		case job.acking && (mode < 9 || s.rng.IntN(5) > 0):
			return 0, withClass(classEvent, errors.New("receiver refused"))
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
	s.history = append(s.history, fmt.Sprintf("deliver %s after=%d (confirmed %d) head=%d limit=%d acking=%v mode=%d took=%v answered=%d -> through=%d last=%d confirmed=%d failure=%v",
		name, job.after, job.row.ConfirmedOffset, job.head, job.limit, job.acking, mode, took, answered, out.through, out.lastEvent, out.confirmed, out.failure != nil))
	if sub := s.subs[name]; sub != nil && sub.birth == job.row.ConfiguredAtOffset && sub.seek == job.row.CursorChangedAtOffset {
		sub.delivered = append(sub.delivered, took...)
	}
	if sub != nil && job.acking {
		for _, off := range took {
			sub.received[off] = true
			sub.maxRecv = max(sub.maxRecv, off)
		}
		sub.recvConf = max(sub.recvConf, answered)
		if out.failure == nil {
			sub.maxRead = max(sub.maxRead, out.through)
		}
		rt, r := s.st.subs[name], s.st.rows[name]
		accepted := rt != nil && r != nil && rt.gen == out.gen && r.ConfiguredAtOffset == out.birth && r.CursorChangedAtOffset == out.seek
		switch {
		case out.failure != nil && accepted:
			kept, skips := sub.covered, r.FailingEventSkips
			// An event this epoch skipped already, refused again when sent again from the
			// cursor, is passed as its skip passed it (no second skip is counted).
			again := sub.skipped[out.failure.eventOffset] && out.failure.eventOffset <= r.DeliveredOffset
			sub.resetCovered() // a failure: what went unconfirmed goes again
			s.afterStep = func() {
				if row := s.st.rows[name]; row != nil && (row.FailingEventSkips > skips || again) && row.ConfirmedOffset < out.failure.eventOffset {
					// A skip after unconfirmed deliveries: it went after them as a delivery of
					// nothing, so they (and the skipped event) stay delivered in this run of sends.
					sub.covered = kept
					for off := job.after + 1; off <= out.failure.eventOffset; off++ {
						sub.covered[off] = true
					}
					// The skipped event counts as delivered (the receiver may confirm through it)
					// but as nothing the receiver holds: what it took of it in a failed try was
					// not delivered.
					sub.maxRead = max(sub.maxRead, out.failure.eventOffset)
					sub.skipped[out.failure.eventOffset] = true
				}
			}
			s.apply(stepInput{outcomes: []deliveryOutcome{out}})
			return
		case out.failure == nil && s.jobResets[name] == sub.resets:
			for off := job.after + 1; off <= out.through; off++ {
				sub.covered[off] = true
			}
		}
	}
	s.apply(stepInput{outcomes: []deliveryOutcome{out}})
}

// mount is a new mount of a receiver's name: the acking subscriptions it reaches send again from
// their confirmed cursors (the new receiver may not hold what the old one took unconfirmed).
func (s *sim) mount(capability string) {
	s.history = append(s.history, "mount "+capability)
	for name, sub := range s.subs {
		if e := s.st.core.Subscriptions[name]; e != nil && e.Config.ConfirmWindow > 0 && e.Config.Receiver.Capability == capability {
			sub.resetCovered()
		}
	}
	s.apply(stepInput{mounted: []string{capability}})
}

// diskRow reads one cursor row as storage holds it (nil: none).
func (s *sim) diskRow(name string) *storage.CursorRow {
	rows, err := s.store.CursorRows(s.ctx)
	if err != nil {
		s.fail("rows: %v", err)
	}
	for i := range rows {
		if rows[i].Name == name {
			return &rows[i]
		}
	}
	return nil
}

// confirm is a Subscription.confirm from an acking subscription's receiver, mostly through an
// offset it took; sometimes past what it was delivered (refused), or of a subscription that is
// not offset-acking or does not exist (refused).
func (s *sim) confirm() {
	var acking []string
	for _, n := range simNames {
		if e := s.st.core.Subscriptions[n]; e != nil && e.Config.ConfirmWindow > 0 {
			acking = append(acking, n)
		}
	}
	name := simNames[s.rng.IntN(len(simNames))]
	if len(acking) > 0 && s.rng.IntN(5) > 0 {
		name = acking[s.rng.IntN(len(acking))]
	}
	entry, sub := s.st.core.Subscriptions[name], s.subs[name]
	var maxRecv int64
	if sub != nil {
		maxRecv = sub.maxRecv
	}
	var c int64
	switch k := s.rng.IntN(6); {
	case k < 4:
		c = s.rng.Int64N(maxRecv + 1)
	case k < 5:
		c = s.rng.Int64N(s.st.head + 2)
	default:
		c = maxRecv + 1
	}
	if sub != nil && sub.window > 0 && sub.answers == 0 && s.rng.IntN(4) > 0 {
		c = min(c, sub.recvConf) // a receiver slow to confirm: mostly nothing new
	}
	before := s.diskRow(name)
	var memBefore int64
	if r := s.st.rows[name]; r != nil {
		memBefore = r.ConfirmedOffset
	}
	var got int64
	if debugSim {
		fmt.Printf("DBG before confirm %s c=%d disk=%+v mem=%+v\n", name, c, before, s.st.rows[name])
	}
	s.apply(stepInput{readers: []readerOp{{name: name, checkpoint: c, confirm: true, confirmed: &got, reply: make(chan error, 1)}}})
	if debugSim {
		fmt.Printf("DBG after confirm upserts=%+v writes=%v\n", s.lastEff.commit.CursorUpserts, s.lastEff.hasWrites())
	}
	if !s.lastOK {
		s.history = append(s.history, fmt.Sprintf("confirm %s through %d: unanswered (the commit failed)", name, c))
		if sub != nil {
			sub.recvConf = max(sub.recvConf, c) // it may have landed (the answer lost)
		}
		return
	}
	var err error
	for _, rr := range s.lastEff.readerReplies {
		err = rr.err
	}
	s.history = append(s.history, fmt.Sprintf("confirm %s through %d -> %d err=%v", name, c, got, err))
	switch {
	case entry == nil:
		want := itx.ENotFound
		if _, isReader := s.readers[name]; isReader {
			want = itx.EFailedPrecondition // a reader's checkpoint moves by register
		}
		if itx.ErrorCode(err) != want {
			s.fail("confirm of %q, no subscription: %v (want %s)", name, err, want)
		}
		return
	case entry.Config.ConfirmWindow == 0:
		if itx.ErrorCode(err) != itx.EFailedPrecondition {
			s.fail("confirm of %q, not offset-acking: %v", name, err)
		}
		return
	case err != nil:
		if itx.ErrorCode(err) != itx.EInvalid {
			s.fail("confirm of %q through %d: %v", name, c, err)
		}
		if before != nil && c <= max(before.DeliveredOffset, before.ConfirmedOffset) {
			s.fail("confirm of %q through %d refused, though storage held it delivered through %d: %v", name, c, max(before.DeliveredOffset, before.ConfirmedOffset), err)
		}
		return
	}
	if sub != nil && c > max(sub.maxRecv, sub.maxRead, memBefore) {
		s.fail("confirm of %q through %d accepted, but it was delivered only through %d", name, c, max(sub.maxRecv, sub.maxRead))
	}
	if got < c || got < memBefore {
		s.fail("confirm of %q through %d answered %d (the cursor was at %d)", name, c, got, memBefore)
	}
	after := s.diskRow(name)
	if after == nil || after.ConfirmedOffset < got {
		held := int64(-1)
		if after != nil {
			held = after.ConfirmedOffset
		}
		s.fail("confirm of %q answered the confirmed cursor %d, but storage holds %d: a restart would lose what the reply promised", name, got, held)
	}
	if sub != nil {
		sub.recvConf = max(sub.recvConf, c)
		sub.promised = max(sub.promised, got)
	}
}

// checkPush verifies a planned push of an offset-acking subscription: it reads within the
// window, and after its confirmed cursor only over offsets delivered since the last reset.
func (s *sim) checkPush(job pushJob) {
	entry := s.st.core.Subscriptions[job.name]
	if entry == nil || entry.Kind() != itx.KindITXCall {
		return
	}
	window := int64(entry.Config.ConfirmWindow)
	if job.acking != (window > 0) {
		s.fail("%s: push acking=%v with confirmWindow %d", job.name, job.acking, window)
	}
	if !job.acking {
		return
	}
	conf := job.row.ConfirmedOffset
	sub := s.subs[job.name]
	// The window counts the events the receiver holds unconfirmed: those it took after the
	// cursor (not the offsets a filter passed over between them).
	held := int64(0)
	if sub != nil {
		for off := conf + 1; off <= job.after; off++ {
			if sub.received[off] && sub.covered[off] && !sub.skipped[off] { // a skip delivers nothing
				held++
			}
		}
	}
	if job.after < conf || held >= window || job.after >= job.head {
		s.fail("%s: push after %d with the cursor at %d, %d events held, window %d, head %d", job.name, job.after, conf, held, window, job.head)
	}
	if job.limit < 1 || int64(job.limit) > window-held {
		s.fail("%s: push limit %d with %d events of window %d unconfirmed", job.name, job.limit, held, window)
	}
	if sub == nil || sub.birth != job.row.ConfiguredAtOffset || sub.seek != job.row.CursorChangedAtOffset {
		if job.after != conf {
			s.fail("%s: the first push of a new epoch reads after %d, not its cursor %d", job.name, job.after, conf)
		}
		return
	}
	for off := conf + 1; off <= job.after; off++ {
		if !sub.covered[off] {
			s.fail("%s: push reads after %d (cursor %d), but offset %d was not delivered since the last reset (failure, mount, restart)", job.name, job.after, conf, off)
		}
	}
}

// drain ends a run: every receiver is mounted and takes and confirms all it is sent, halted
// subscriptions are resumed, and every offset-acking subscription must reach the head.
func (s *sim) drain() {
	s.history = append(s.history, "drain: receivers mounted, taking and confirming everything")
	s.store.failBefore, s.store.failAfter = false, false
	for range 60 {
		s.stepNo++
		done := true
		for _, name := range simNames {
			e, r := s.st.core.Subscriptions[name], s.st.rows[name]
			if e == nil || r == nil || e.Config.ConfirmWindow == 0 {
				continue
			}
			if r.ConfirmedOffset < s.st.head || r.Status != storage.StatusActive {
				done = false
			}
			if r.Status == storage.StatusHalted {
				b, _ := json.Marshal(itx.NamePayload{Name: name})
				s.history = append(s.history, "resume "+name)
				s.apply(stepInput{appends: []*appendReq{{inputs: []itx.EventInput{{Type: itx.TypeSubscriptionResumed, Payload: b}}, reply: make(chan appendReply, 1)}}})
			}
		}
		if done {
			break
		}
		s.mount("c0")
		s.mount("c1")
		s.clock.Advance(10 * time.Minute)
		s.apply(stepInput{flush: true})
		for range 200 {
			var names []string
			for _, n := range simNames {
				if _, ok := s.inflight[n]; ok {
					names = append(names, n)
				}
			}
			if len(names) == 0 {
				break
			}
			s.deliverTo(names[0], 0)
			s.check()
		}
		s.check()
	}
	for _, name := range simNames {
		e, r := s.st.core.Subscriptions[name], s.st.rows[name]
		if e != nil && r != nil && e.Config.ConfirmWindow > 0 && (r.ConfirmedOffset < s.st.head || r.Status != storage.StatusActive) {
			s.fail("%s: stalled at %d (%s, delivered %d) below the head %d with its receiver taking and confirming everything", name, r.ConfirmedOffset, r.Status, r.DeliveredOffset, s.st.head)
		}
	}
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
	s.checkReadersSched(events)
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
			nsub := &simSub{birth: r.ConfiguredAtOffset, seek: r.CursorChangedAtOffset, durable: r.ConfirmedOffset, start: start, skipped: map[int64]bool{},
				received: map[int64]bool{}, covered: map[int64]bool{}}
			if e := s.st.core.Subscriptions[r.Name]; e != nil && e.Config.ConfirmWindow > 0 {
				nsub.window = int64(e.Config.ConfirmWindow)
				nsub.answers = []int{0, 3, 6, 10}[s.rng.IntN(4)]
				if f := e.Config.Filter; f != nil && len(f.EventTypes) > 0 {
					nsub.types = map[string]bool{}
					for _, t := range f.EventTypes {
						nsub.types[t] = true
					}
				}
			}
			s.subs[r.Name] = nsub
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
		if sub.window > 0 {
			s.checkAcking(r, sub, events)
			continue
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

// checkAcking verifies an offset-acking subscription's row on disk and its state in memory.
func (s *sim) checkAcking(r storage.CursorRow, sub *simSub, events []itx.Event) {
	head := int64(len(events))
	if r.ConfirmedOffset > head || r.DeliveredOffset > head {
		s.fail("%s: confirmed %d, delivered %d, beyond the head %d", r.Name, r.ConfirmedOffset, r.DeliveredOffset, head)
	}
	if r.ConfirmedOffset < sub.promised {
		s.fail("%s: a confirm reply reported the cursor at %d, storage holds %d", r.Name, sub.promised, r.ConfirmedOffset)
	}
	if r.DeliveredOffset < sub.durDeliv {
		s.fail("%s: the delivered offset moved back from %d to %d without a cursor-set", r.Name, sub.durDeliv, r.DeliveredOffset)
	}
	sub.durDeliv = r.DeliveredOffset
	if r.ConfirmedOffset > r.DeliveredOffset && r.ConfirmedOffset != sub.start && !sub.skipped[r.ConfirmedOffset] {
		s.fail("%s: confirmed %d beyond delivered %d (neither its start %d nor a skip)", r.Name, r.ConfirmedOffset, r.DeliveredOffset, sub.start)
	}
	// Every event the filter passes, at or below the cursor, was delivered and confirmed by the
	// receiver, or skipped on the record; the cursor passes over the rest only.
	for off := sub.start + 1; off <= r.ConfirmedOffset; off++ {
		if !sub.matches(events[off-1]) || sub.skipped[off] {
			continue
		}
		if !sub.received[off] {
			s.fail("%s: offset %d is at or below the confirmed cursor %d but was never delivered (start %d)", r.Name, off, r.ConfirmedOffset, sub.start)
		}
		if off > sub.recvConf {
			s.fail("%s: the confirmed cursor %d passed offset %d, which the receiver never confirmed (it confirmed through %d)", r.Name, r.ConfirmedOffset, off, sub.recvConf)
		}
	}
	// In memory: the cursor within the head, the deliveries since it in order and past it.
	mr, rt := s.st.rows[r.Name], s.st.subs[r.Name]
	if mr == nil || rt == nil || mr.ConfiguredAtOffset != r.ConfiguredAtOffset || mr.CursorChangedAtOffset != r.CursorChangedAtOffset {
		return
	}
	if mr.ConfirmedOffset > s.st.head || rt.sendFrom > s.st.head || mr.ConfirmedOffset < r.ConfirmedOffset {
		s.fail("%s: in memory confirmed %d, sendFrom %d (head %d, on disk %d)", r.Name, mr.ConfirmedOffset, rt.sendFrom, s.st.head, r.ConfirmedOffset)
	}
	prev := mr.ConfirmedOffset
	for _, m := range rt.marks {
		if m.through <= prev || (m.last != 0 && (m.last > m.through || m.last <= prev)) {
			s.fail("%s: marks %v out of order past the cursor %d", r.Name, rt.marks, mr.ConfirmedOffset)
		}
		prev = m.through
	}
	if len(rt.marks) > 0 && rt.marks[len(rt.marks)-1].through != rt.sendFrom {
		s.fail("%s: marks %v end short of sendFrom %d", r.Name, rt.marks, rt.sendFrom)
	}
}

// nopWarn drops re-reduction warnings (zerolog's nil event is a no-op).
func nopWarn() *zerolog.Event { return nil }
