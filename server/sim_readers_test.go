package server

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

// The simulation's registered readers and scheduled appends. Both are driven through the step's
// readers and schedules inputs; modelStep predicts every step's effect on them from the model
// alone (the due appends landing first, in due order, then each operation in order), compares the
// prediction with the step's answers and with the log, and takes it as the model once the step's
// commit ran (answered, or its answer lost after it ran). checkReadersSched compares the model
// with the disk and with memory after every step.

// simReaderNames are the names reader operations use: two of them are subscription names too.
var simReaderNames = []string{"a", "c", "r1", "r2", "r3"}

// The sim's bounds: fewer readers and scheduled appends than names, so both are reached.
const (
	simMaxReaders   = 3
	simMaxScheduled = 6
)

// simBody is an event's body as the model knows it.
type simBody struct {
	typ, payload string
}

// simSched is a pending scheduled append the model knows of.
type simSched struct {
	dueAt int64
	body  simBody
}

// simLogged is a scheduling key (sN) in the log.
type simLogged struct {
	off  int64
	body simBody
}

func isSchedKey(key string) bool { return strings.HasPrefix(key, "s") }

func bodyOf(in *itx.EventInput) simBody { return simBody{in.Type, string(in.Payload)} }

// readerOps registers, moves and removes readers: one or two operations in a step, sometimes
// beside a configure of a subscription name (the one name space, decided within one step).
func (s *sim) readerOps() {
	var ops []readerOp
	var desc []string
	for range 1 + s.rng.IntN(2) {
		op := readerOp{name: simReaderNames[s.rng.IntN(len(simReaderNames))]}
		if s.rng.IntN(8) == 0 {
			op.name = []string{"", "subscription:9", "x\ny"}[s.rng.IntN(3)] // refused: invalid, reserved
		}
		switch k := s.rng.IntN(20); {
		case k < 5:
			op.remove = true
		case k < 15:
			op.checkpoint = s.rng.Int64N(s.st.head + 1)
		case k < 17:
			op.checkpoint = s.st.head + 1 + s.rng.Int64N(3) // beyond the head
		case k < 18:
			op.checkpoint = -1
		default:
			op.checkpoint = s.st.head
		}
		ops = append(ops, op)
		if op.remove {
			desc = append(desc, fmt.Sprintf("remove %q", op.name))
		} else {
			desc = append(desc, fmt.Sprintf("register %q@%d", op.name, op.checkpoint))
		}
	}
	in := stepInput{readers: ops}
	switch name := simNames[s.rng.IntN(len(simNames))]; s.rng.IntN(8) {
	case 0:
		b, _ := json.Marshal(itx.SubscriptionConfig{Name: name, Receiver: itx.Receiver{Action: itx.KindITXCall, Capability: "c0"}})
		in.appends = []*appendReq{{inputs: []itx.EventInput{{Type: itx.TypeSubscriptionConfigured, Payload: b}}, reply: make(chan appendReply, 1)}}
		desc = append(desc, "with configure "+name)
	case 1:
		// The subscription goes in this step: the reader may take its name in the same step.
		b, _ := json.Marshal(itx.RemovedPayload{Name: name, Reason: "requested"})
		in.appends = []*appendReq{{inputs: []itx.EventInput{{Type: itx.TypeSubscriptionRemoved, Payload: b}}, reply: make(chan appendReply, 1)}}
		desc = append(desc, "with remove subscription "+name)
	}
	s.history = append(s.history, fmt.Sprintf("readers (head %d): %s", s.st.head, strings.Join(desc, ", ")))
	s.apply(in)
	if !s.lastOK {
		s.history = append(s.history, "  readers: unanswered (the commit failed)")
		return
	}
	var answers []string
	for _, rr := range s.lastEff.readerReplies {
		answers = append(answers, fmt.Sprint(itx.ErrorCode(rr.err)))
	}
	s.history = append(s.history, "  readers answered "+strings.Join(answers, ", "))
}

// schedKey picks a scheduling key: a pending one (to move or cancel it), one in the log (a
// schedule of it answers its offset, or a conflict), or one never used.
func (s *sim) schedKey() string {
	var keys []string
	switch k := s.rng.IntN(20); {
	case k < 9:
		keys = slices.Sorted(maps.Keys(s.sched))
	case k < 12:
		keys = slices.Sorted(maps.Keys(s.logged))
	}
	if len(keys) > 0 {
		return keys[s.rng.IntN(len(keys))]
	}
	s.schedNext++
	return fmt.Sprintf("s%d", s.schedNext)
}

// scheduleOps schedules and cancels appends (keys sN), schedules a key an append already put
// in the log, or appends a scheduling key directly (its schedule, when due, then finds it there).
func (s *sim) scheduleOps() {
	nowMs := itx.UnixMilli(s.clock.Now())
	var in stepInput
	var desc []string
	for range 1 + s.rng.IntN(2) {
		key := s.schedKey()
		v := 0
		if s.rng.IntN(5) == 0 {
			v = 1 // another body: a move, or a conflict with the log
		}
		input := itx.EventInput{Type: "tick", IdempotencyKey: key, Payload: json.RawMessage(fmt.Sprintf(`{"sched":%q,"v":%d}`, key, v))}
		k := s.rng.IntN(20)
		if k == 17 && len(s.keys) > 0 {
			// A key an acknowledged append holds, with its body: it answers that offset.
			keys := slices.Sorted(maps.Keys(s.keys))
			key = keys[s.rng.IntN(len(keys))]
			a := s.acks[s.keys[key]]
			input = itx.EventInput{Type: a.typ, IdempotencyKey: key, Payload: json.RawMessage(a.payload)}
			k = 0
		}
		switch {
		case k < 12:
			due := nowMs - 2000 + s.rng.Int64N(10_000)
			switch j := s.rng.IntN(20); {
			case j < 4 && len(s.sched) > 0:
				// At the time of another: the same-time order.
				keys := slices.Sorted(maps.Keys(s.sched))
				due = s.sched[keys[s.rng.IntN(len(keys))]].dueAt
			case j < 5:
				due = 0 // the epoch: a time past
			}
			op, err := newScheduleOp(input, due)
			if err != nil {
				s.fail("schedule %s: %v", key, err)
			}
			in.schedules = append(in.schedules, op)
			desc = append(desc, fmt.Sprintf("schedule %s %s %s due %+dms", key, input.Type, input.Payload, due-nowMs))
		case k < 17:
			in.schedules = append(in.schedules, scheduleOp{key: key})
			desc = append(desc, "cancel "+key)
		default:
			if s.rng.IntN(2) == 0 {
				// Racing a pending schedule of the key, as often with its body as with another.
				input.Payload = json.RawMessage(fmt.Sprintf(`{"sched":%q,"v":%d}`, key, 1-v))
			}
			if err := input.Normalize(); err != nil {
				s.fail("normalize: %v", err)
			}
			in.appends = append(in.appends, &appendReq{inputs: []itx.EventInput{input}, reply: make(chan appendReply, 1)})
			desc = append(desc, fmt.Sprintf("append %s %s directly", key, input.Payload))
		}
	}
	s.history = append(s.history, "schedules: "+strings.Join(desc, ", "))
	s.apply(in)
	if !s.lastOK {
		s.history = append(s.history, "  schedules: unanswered (the commit failed)")
		return
	}
	var answers []string
	for _, sa := range s.lastEff.scheduleAnswers {
		r := sa.reply
		answers = append(answers, fmt.Sprintf("{due %+d appended %d found %v err %s}", r.dueAt-nowMs, r.appended, r.found, itx.ErrorCode(r.err)))
	}
	s.history = append(s.history, "  schedules answered "+strings.Join(answers, ", "))
}

// modelStep is the model's side of one step (see the top of this file). ran: the step's commit ran
// (or it had nothing to write); answered: its answers were given.
func (s *sim) modelStep(in stepInput, nowMs, headBefore int64, eff effects, ran, answered bool) {
	readers, sched, logged := maps.Clone(s.readers), maps.Clone(s.sched), maps.Clone(s.logged)

	// 1. The step's client appends of scheduling keys (the plan's replies say which landed new).
	client := map[string]bool{}
	if len(eff.replies) > 0 {
		plan := eff.replies[0].plan
		for i, req := range in.appends {
			r := plan.Replies[i]
			if r.err != nil {
				continue
			}
			for j := range req.inputs {
				key := req.inputs[j].IdempotencyKey
				if _, ok := logged[key]; ok || !isSchedKey(key) {
					continue
				}
				logged[key] = simLogged{off: r.result.Offsets[j], body: bodyOf(&req.inputs[j])}
				client[key] = true
			}
		}
	}

	// 2. The due appends, in due order (time, then key): each lands unless its key is in the log
	// already (a conflicting body leaves an error record); either way it is no longer pending.
	var due []string
	for key, sc := range sched {
		if sc.dueAt <= nowMs {
			due = append(due, key)
		}
	}
	sort.Slice(due, func(i, j int) bool {
		a, b := sched[due[i]], sched[due[j]]
		if a.dueAt != b.dueAt {
			return a.dueAt < b.dueAt
		}
		return due[i] < due[j]
	})
	stepOff := map[string]int64{}
	for i := range eff.commit.Events {
		if e := &eff.commit.Events[i]; e.IdempotencyKey != "" {
			stepOff[e.IdempotencyKey] = e.Offset
		}
	}
	var landed, conflicts []string
	for _, key := range due {
		sc := sched[key]
		delete(sched, key)
		if l, ok := logged[key]; ok {
			if l.body != sc.body {
				conflicts = append(conflicts, key)
			}
			continue
		}
		off, ok := stepOff[key]
		if !ok {
			s.fail("scheduled %s was due at %d (now %d) but the step did not append it", key, sc.dueAt, nowMs)
		}
		logged[key] = simLogged{off: off, body: sc.body}
		landed = append(landed, key)
	}

	// 3. Reader operations, after the step's appends: against the head and the catalog they left.
	head := headBefore + int64(len(eff.commit.Events))
	var wantReaders []itx.Code
	for _, op := range in.readers {
		if op.confirm {
			continue
		}
		var code itx.Code
		_, registered := readers[op.name]
		switch {
		case itx.ValidateSubscriptionName(op.name) != nil:
			code = itx.EInvalid
		case op.remove && !registered:
			code = itx.ENotFound
		case op.remove:
			delete(readers, op.name)
		case op.checkpoint < 0 || op.checkpoint > head:
			code = itx.EInvalid
		case s.st.core.Subscriptions[op.name] != nil:
			code = itx.EFailedPrecondition // one name space
		case !registered && strings.HasPrefix(op.name, itx.GeneratedNamePrefix):
			code = itx.EInvalid
		case !registered && len(readers) >= simMaxReaders:
			code = itx.ELimitExceeded
		default:
			readers[op.name] = op.checkpoint
		}
		wantReaders = append(wantReaders, code)
	}

	// 4. Schedule and cancel operations, in order.
	var wantSched []scheduleReply
	for _, op := range in.schedules {
		var want scheduleReply
		_, pending := sched[op.key]
		switch {
		case op.input == nil:
			want.found = pending
			delete(sched, op.key)
		case !isSchedKey(op.key):
			// A key an acknowledged append holds, with its body.
			want.appended = s.keys[op.key]
		case logged[op.key].off != 0:
			if l := logged[op.key]; l.body == bodyOf(op.input) {
				want.appended = l.off
			} else {
				want.err = itx.Errorf(itx.EIdempotencyConflict, "")
			}
		case !pending && len(sched) >= simMaxScheduled:
			want.err = itx.Errorf(itx.ELimitExceeded, "")
		default:
			sched[op.key] = simSched{dueAt: op.dueAt, body: bodyOf(op.input)}
			want.dueAt = op.dueAt
		}
		wantSched = append(wantSched, want)
	}

	if answered {
		for _, c := range wantReaders {
			s.stats["reader "+string(c)]++
		}
		for _, w := range wantSched {
			switch {
			case w.err != nil:
				s.stats["schedule "+string(itx.ErrorCode(w.err))]++
			case w.appended != 0:
				s.stats["schedule appended"]++
			case w.dueAt != 0 || len(in.schedules) > 0 && w.found:
				s.stats["schedule ok/found"]++
			}
		}
		i := 0
		for _, rr := range eff.readerReplies {
			if rr.op.confirm {
				continue
			}
			if got := itx.ErrorCode(rr.err); got != wantReaders[i] {
				s.fail("reader op {name %q checkpoint %d remove %v} answered %q (%v), the model says %q", rr.op.name, rr.op.checkpoint, rr.op.remove, got, rr.err, wantReaders[i])
			}
			i++
		}
		for i, sa := range eff.scheduleAnswers {
			got, want := sa.reply, wantSched[i]
			if itx.ErrorCode(got.err) != itx.ErrorCode(want.err) || got.dueAt != want.dueAt || got.appended != want.appended || got.found != want.found {
				s.fail("schedule op %s answered {due %d appended %d found %v err %v}, the model says {due %d appended %d found %v err %s}",
					sa.op.key, got.dueAt, got.appended, got.found, got.err, want.dueAt, want.appended, want.found, itx.ErrorCode(want.err))
			}
		}
	}
	if !ran {
		return // nothing of it is on disk: the reload reads back the model as it was
	}

	// The log's new events: the due appends in due order, with their bodies, not before their
	// time; no scheduling key but those and the step's client appends; a record of each conflict.
	var fresh []itx.Event
	if head > headBefore {
		var err error
		if fresh, err = s.store.Events(s.ctx, storage.Query{After: headBefore, UpTo: head, Limit: 1 << 20, IncludeEphemeral: true}); err != nil {
			s.fail("read: %v", err)
		}
	}
	byOff := map[int64]*itx.Event{}
	for i := range fresh {
		byOff[fresh[i].Offset] = &fresh[i]
	}
	prev := int64(0)
	for _, key := range landed {
		l := logged[key]
		e := byOff[l.off]
		if e == nil || e.IdempotencyKey != key || (simBody{e.Type, string(e.Payload)}) != l.body {
			s.fail("scheduled %s landed at %d as %+v, want %s %s", key, l.off, e, l.body.typ, l.body.payload)
		}
		if e.CreatedAt < s.sched[key].dueAt {
			s.fail("scheduled %s appended at %d, before its time %d", key, e.CreatedAt, s.sched[key].dueAt)
		}
		if l.off <= prev {
			s.fail("scheduled appends landed out of due order: %v (due order) at offsets %v", landed, offsetsOf(logged, landed))
		}
		prev = l.off
	}
	for _, e := range fresh {
		if key := e.IdempotencyKey; isSchedKey(key) && !client[key] && logged[key].off != e.Offset {
			s.fail("offset %d appended scheduling key %s, which the model did not expect to land", e.Offset, key)
		}
	}
	for _, key := range conflicts {
		found := false
		for _, e := range fresh {
			found = found || (e.Type == itx.TypeErrorOccurred && strings.Contains(string(e.Payload), fmt.Sprintf(`scheduled event \"%s\" was not appended`, key)))
		}
		if !found {
			s.fail("scheduled %s came due with its key in the log under another body, but no error record says so", key)
		}
	}
	s.stats["landed"] += len(landed)
	s.stats["due conflicts"] += len(conflicts)
	if len(landed) > 1 {
		s.stats["landed together"]++
	}
	if !answered {
		s.stats["ran, answer lost"]++
	}
	if len(landed) > 0 || len(conflicts) > 0 {
		s.history = append(s.history, fmt.Sprintf("  due: landed %v at %v, dropped as conflicts %v", landed, offsetsOf(logged, landed), conflicts))
	}

	// The actor is told to come back: at once while one is due, else by the earliest time.
	if len(sched) > 0 && !in.final {
		first := int64(-1)
		for _, sc := range sched {
			if first < 0 || sc.dueAt < first {
				first = sc.dueAt
			}
		}
		if first <= nowMs && !eff.stepAgain {
			s.fail("a scheduled append is due (at %d, now %d) but the step asks for no step again", first, nowMs)
		}
		if first > nowMs && (eff.wakeAt == 0 || eff.wakeAt > first) {
			s.fail("the next scheduled append is due at %d but the step wakes at %d", first, eff.wakeAt)
		}
	}
	// What readers and listings see is republished when either changed.
	if (!maps.Equal(readers, s.readers) || !maps.Equal(sched, s.sched)) && !eff.rowsChanged {
		s.fail("readers or scheduled appends changed, but the step does not publish (rowsChanged false)")
	}
	s.readers, s.sched, s.logged = readers, sched, logged
}

func offsetsOf(logged map[string]simLogged, keys []string) []int64 {
	var out []int64
	for _, k := range keys {
		out = append(out, logged[k].off)
	}
	return out
}

// checkReadersSched compares the model of readers and scheduled appends with the disk and memory.
func (s *sim) checkReadersSched(events []itx.Event) {
	disk, err := s.store.Readers(s.ctx)
	if err != nil {
		s.fail("readers: %v", err)
	}
	got := map[string]int64{}
	for _, r := range disk {
		got[r.Name] = r.Checkpoint
	}
	if !maps.Equal(got, s.readers) {
		s.fail("readers on disk %v, the model %v", got, s.readers)
	}
	mem := map[string]int64{}
	for name, r := range s.st.readers {
		mem[name] = r.Checkpoint
	}
	if !maps.Equal(mem, s.readers) {
		s.fail("readers in memory %v, the model %v", mem, s.readers)
	}
	rows, err := s.store.CursorRows(s.ctx)
	if err != nil {
		s.fail("rows: %v", err)
	}
	for _, r := range rows {
		if _, ok := s.readers[r.Name]; ok {
			s.fail("%q is a reader and has a cursor row", r.Name)
		}
	}
	for name := range s.readers {
		if s.st.core.Subscriptions[name] != nil {
			s.fail("%q is a reader and a subscription", name)
		}
	}

	list, err := s.store.ScheduledEvents(s.ctx, 1000, 1<<30)
	if err != nil {
		s.fail("scheduled: %v", err)
	}
	if len(list) != len(s.sched) {
		s.fail("%d scheduled appends on disk, the model has %d (%v)", len(list), len(s.sched), s.sched)
	}
	for i, r := range list {
		m, ok := s.sched[r.Key]
		in, _ := unmarshalScheduled(r.Event)
		if !ok || m.dueAt != r.DueAt || bodyOf(&in) != m.body || in.IdempotencyKey != r.Key {
			s.fail("scheduled %s due %d (%s) on disk, the model has %+v (present %v)", r.Key, r.DueAt, r.Event, m, ok)
		}
		if i > 0 && (list[i-1].DueAt > r.DueAt || list[i-1].DueAt == r.DueAt && list[i-1].Key >= r.Key) {
			s.fail("the scheduled listing is not in due order at %s", r.Key)
		}
	}
	if len(s.st.scheduled) != len(s.sched) {
		s.fail("%d scheduled appends in memory, the model has %d", len(s.st.scheduled), len(s.sched))
	}
	for key, sc := range s.st.scheduled {
		if m, ok := s.sched[key]; !ok || m.dueAt != sc.DueAt {
			s.fail("scheduled %s due %d in memory, the model has %+v (present %v)", key, sc.DueAt, m, ok)
		}
	}
	if len(s.st.scheduled) > 0 {
		first := int64(-1)
		for _, sc := range s.st.scheduled {
			if first < 0 || sc.DueAt < first {
				first = sc.DueAt
			}
		}
		if s.st.earliestDue() != first {
			s.fail("earliestDue %d, the earliest pending is due at %d", s.st.earliestDue(), first)
		}
	}

	// The log: an idempotency key at most once; the scheduling keys where the model has them.
	seen := map[string]int64{}
	for _, e := range events {
		if e.IdempotencyKey == "" {
			continue
		}
		if prev, ok := seen[e.IdempotencyKey]; ok {
			s.fail("idempotency key %s at offsets %d and %d", e.IdempotencyKey, prev, e.Offset)
		}
		seen[e.IdempotencyKey] = e.Offset
		if isSchedKey(e.IdempotencyKey) {
			l, ok := s.logged[e.IdempotencyKey]
			if !ok || l.off != e.Offset || l.body != (simBody{e.Type, string(e.Payload)}) {
				s.fail("scheduling key %s at %d (%s %s) in the log, the model has %+v (present %v)", e.IdempotencyKey, e.Offset, e.Type, e.Payload, l, ok)
			}
		}
	}
	for key, l := range s.logged {
		if seen[key] != l.off {
			s.fail("scheduling key %s should be in the log at %d", key, l.off)
		}
	}
}

// drainScheduled ends a run: the clock passes every pending scheduled append, and each lands.
func (s *sim) drainScheduled() {
	s.clock.Advance(time.Minute)
	s.history = append(s.history, "drain: advance 1m0s, every scheduled append due")
	s.apply(stepInput{})
	s.check()
	if len(s.sched) > 0 {
		s.fail("scheduled appends still pending after they all came due: %v", s.sched)
	}
}
