package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

// Hosting processors in-process. The processors of a stream live as long as its actor: the
// actor opens them (Config.Processors) on first need, off its own goroutine, and hands them
// ports whose writes are actor inputs, so progress records, keepalive records and the
// processors' alarm are written by the stream's single writer, in its commits.

// Keys of the stream's kv table that belong to processors.
const (
	procAlarmKey       = "processors.alarm"     // the processors' alarm slices by owner (JSON)
	procKVPrefix       = "processors.kv/"       // the processors' KV (keepalive records)
	procProgressPrefix = "processors.progress/" // one procRecord per processor name
)

// procRecord is a processor's durable record: its progress and the fence around it.
type procRecord struct {
	// Generation counts claims: a commit carrying another generation is from a dead
	// incarnation and is refused.
	Generation int64 `json:"generation"`
	// Seek is the seek epoch (the subscription's cursorChangedAtOffset) the progress honors: a
	// cursor-set on the processor-wake subscription is a rewind the runner has not performed
	// until its record carries that epoch.
	Seek     int64                  `json:"seek,omitempty"`
	Progress *itx.ProcessorProgress `json:"progress,omitempty"`
}

// fence refuses generation unless it is the record's current one.
func (rec *procRecord) fence(name string, generation int64) error {
	switch {
	case generation > rec.Generation:
		return itx.Errorf(itx.EFailedPrecondition,
			"processor %q: generation %d was never claimed (the record is at %d): claim before committing", name, generation, rec.Generation)
	case rec.Generation != generation:
		return itx.Errorf(itx.EFailedPrecondition,
			"processor %q: generation %d was claimed by a newer incarnation (the record is at %d): this incarnation is dead", name, generation, rec.Generation)
	}
	return nil
}

// procOp is one processor port write, an actor input. Exactly one of the request fields is set.
type procOp struct {
	claim  string      // claim the named record: bump its generation
	commit *procCommit // replace a record, fenced by generation
	kvKey  string      // put kvValue under kvKey (with kvDel: delete kvKey)
	kvVal  []byte
	kvDel  bool
	check  *procCommit // fail as a commit of this generation would, writing nothing
	alarm  *int64      // arm the owner's alarm slice at this epoch ms (0: disarm)
	fired  bool        // the owner's alarm fire's handling finished
	owner  string      // of an alarm slice: "" for the in-process processors, else a remote processor's name
	// kvFor fences a remote host's KV write (its ports): the key must be under that processor's
	// prefix, and its progress record still at kvGen (the generation the ports' runner holds).
	kvFor string
	kvGen int64
	reply chan procReply
}

type procCommit struct {
	name       string
	generation int64
	seek       int64
	progress   itx.ProcessorProgress
}

type procReply struct {
	progress   *itx.ProcessorProgress
	generation int64
	err        error
}

type procAnswer struct {
	op    procOp
	reply procReply
}

// decodeProcAlarms reads the stored alarm slices (a bare number is the in-process slice).
func decodeProcAlarms(raw []byte) map[string]int64 {
	out := map[string]int64{}
	if err := json.Unmarshal(raw, &out); err != nil {
		var at int64
		if json.Unmarshal(raw, &at) == nil && at > 0 {
			out[""] = at
		}
	}
	return out
}

func isInProcess(entry *catalogEntry) bool {
	if entry == nil || entry.Kind() != itx.KindProcessorWake {
		return false
	}
	p := entry.Config.Receiver.Placement
	return p == "" || p == "in-process"
}

// procRecordOf returns the record of name, read through the step's look-up when not cached.
func (st *streamState) procRecordOf(name string, env stepEnv) (*procRecord, error) {
	if rec := st.procs[name]; rec != nil {
		return rec, nil
	}
	rec := &procRecord{}
	if env.loadKV == nil {
		return rec, nil
	}
	raw, err := env.loadKV(procProgressPrefix + name)
	if err != nil {
		return nil, err
	}
	if raw != nil {
		if err := json.Unmarshal(raw, rec); err != nil {
			return nil, fmt.Errorf("processor %q: progress record does not decode: %w", name, err)
		}
	}
	st.procs[name] = rec
	return rec, nil
}

// forgetRemovedProcs drops from memory the records of names that are no processor-wake
// subscription (removed, or reconfigured to another kind): each may hold a state of up to 1 MiB,
// and a client configuring and removing processors under new names would otherwise grow the
// cache for as long as the stream stays loaded. The record stays on disk (its generation keeps
// fencing a late incarnation) and procRecordOf reads it again if the name comes back. Call it
// only once the step's writes are committed, so a record read back is the one last written.
func (st *streamState) forgetRemovedProcs() {
	for name := range st.procs {
		if e := st.core.Subscriptions[name]; e == nil || e.Kind() != itx.KindProcessorWake {
			delete(st.procs, name)
			st.procsDirty = true
		}
	}
}

// applyProc takes one processor port write into the state and stages its write. A commit moves
// the processor-wake subscription's cursor row with it (confirmed = processed), so list, lag and
// barriers see processors like every other kind.
func (st *streamState) applyProc(op procOp, now time.Time, env stepEnv, eff *effects) procReply {
	stage := func(key string, v []byte) {
		if eff.commit.KV == nil {
			eff.commit.KV = map[string][]byte{}
		}
		eff.commit.KV[key] = v
	}
	switch {
	case op.fired:
		delete(st.procFiring, op.owner)
		return procReply{}
	case op.alarm != nil:
		if *op.alarm > 0 {
			st.procAlarms[op.owner] = *op.alarm
		} else {
			delete(st.procAlarms, op.owner)
		}
		b, _ := json.Marshal(st.procAlarms)
		stage(procAlarmKey, b)
		return procReply{}
	case op.kvKey != "" && op.kvDel:
		if err := st.kvFence(op, env); err != nil {
			return procReply{err: err}
		}
		return st.deleteProcKV(op, env, eff)
	case op.kvKey != "":
		if err := st.kvFence(op, env); err != nil {
			return procReply{err: err}
		}
		return st.putProcKV(op, env, eff)
	case op.check != nil:
		rec, err := st.procRecordOf(op.check.name, env)
		if err != nil {
			return procReply{err: err}
		}
		return procReply{err: rec.fence(op.check.name, op.check.generation)}
	case op.claim != "":
		rec, err := st.procRecordOf(op.claim, env)
		if err != nil {
			return procReply{err: err}
		}
		next := *rec
		next.Generation++
		b, _ := json.Marshal(next)
		st.procs[op.claim], st.procsDirty = &next, true
		stage(procProgressPrefix+op.claim, b)
		var p *itx.ProcessorProgress
		if next.Progress != nil {
			cp := *next.Progress
			p = &cp
		}
		return procReply{progress: p, generation: next.Generation}
	case op.commit != nil:
		c := op.commit
		rec, err := st.procRecordOf(c.name, env)
		if err != nil {
			return procReply{err: err}
		}
		if err := rec.fence(c.name, c.generation); err != nil {
			return procReply{err: err}
		}
		next := *rec
		p := c.progress
		next.Progress = &p
		// Only the rewind's own commit (the one raising the cursor revision) honors the seek epoch
		// it was taken for: a frame begun before the cursor-set may commit while the rewind waits
		// for the runner (a snapshot takes it off the wake lane), and tagged with the epoch, that
		// commit would mark the rewind honored before it ran, and for good if it then fails.
		var revision int64
		if rec.Progress != nil {
			revision = rec.Progress.CursorRevision
		}
		if c.seek != 0 && p.CursorRevision > revision {
			next.Seek = c.seek
		}
		b, _ := json.Marshal(next)
		st.procs[c.name], st.procsDirty = &next, true
		stage(procProgressPrefix+c.name, b)
		r, entry := st.rows[c.name], st.core.Subscriptions[c.name]
		if r != nil && isInProcess(entry) {
			// The row is the processing cursor (confirmed = processed) once the runner honors the
			// latest cursor-set; until then it holds the position the operator set. It moves back
			// with the processing cursor: on a rewind, and after a commit whose answer was lost
			// (the runner redelivers from what it knows was committed: at-least-once).
			honored := r.CursorChangedAtOffset == r.ConfiguredAtOffset || next.Seek == r.CursorChangedAtOffset
			if honored && p.ProcessedThrough != r.ConfirmedOffset && p.ProcessedThrough <= st.head {
				if p.ProcessedThrough > r.ConfirmedOffset {
					// Progress: the retry block describes the position the cursor just left, as
					// for a push subscription (the wake's outcome, which reports the same
					// progress, finds the row already moved here and would leave it standing).
					r.Attempt, r.NextAttemptAt, r.LastError = 0, 0, ""
					r.FailingEventOffset, r.FailingEventAttempt = 0, 0
				}
				r.ConfirmedOffset = p.ProcessedThrough
				st.touch(c.name, now)
				eff.rowsChanged = true
			}
		}
		return procReply{}
	}
	return procReply{err: itx.Errorf(itx.EInternal, "empty processor operation")}
}

// fireEarly fires the alarm slice of owner now if it is armed later (a version change may make
// the wait it keeps moot; the keepalive tolerates an early fire).
func (st *streamState) fireEarly(owner string, nowMs int64, eff *effects) {
	if at := st.procAlarms[owner]; at > nowMs && !st.procFiring[owner] {
		st.procFiring[owner] = true
		eff.fireProcAlarms = append(eff.fireProcAlarms, owner)
	}
}

// forgetProc resets the processor records of a removed subscription name, so a subscription
// created anew under that name starts as a new processor (as its cursor row starts anew): its
// progress record keeps only a bumped generation (which fences every runner of the removed one at
// its next check or commit), the processors' KV under the instance's prefix (keepalive record,
// crash-loop counters) is deleted, and its remote alarm slice is disarmed.
func (st *streamState) forgetProc(name string, env stepEnv, eff *effects) {
	rec, err := st.procRecordOf(name, env)
	if err != nil {
		rec = &procRecord{} // unreadable: forgotten all the same
	}
	if rec.Generation > 0 || rec.Progress != nil {
		next := &procRecord{Generation: rec.Generation + 1}
		b, _ := json.Marshal(next)
		st.procs[name], st.procsDirty = next, true
		if eff.commit.KV == nil {
			eff.commit.KV = map[string][]byte{}
		}
		eff.commit.KV[procProgressPrefix+name] = b
	}
	prefix := procKVPrefix + itx.ProcessorKVPrefix(name)
	// Names may hold "/": the prefix of processor "a" is also the start of "a/b"'s, whose
	// records stay.
	var keep []string
	for other, e := range st.core.Subscriptions {
		if p := procKVPrefix + itx.ProcessorKVPrefix(other); other != name && e.Kind() == itx.KindProcessorWake && strings.HasPrefix(p, prefix) {
			keep = append(keep, p)
		}
	}
	kept := func(k string) bool {
		return slices.ContainsFunc(keep, func(p string) bool { return strings.HasPrefix(k, p) })
	}
	for k := range eff.commit.KV {
		if strings.HasPrefix(k, prefix) && !kept(k) {
			delete(eff.commit.KV, k)
		}
	}
	eff.commit.KVDeletePrefixes = append(eff.commit.KVDeletePrefixes, prefix)
	eff.commit.KVKeepPrefixes = append(eff.commit.KVKeepPrefixes, keep...)
	eff.recountProcKV = true
	if _, ok := st.procAlarms[name]; ok {
		delete(st.procAlarms, name)
		b, _ := json.Marshal(st.procAlarms)
		if eff.commit.KV == nil {
			eff.commit.KV = map[string][]byte{}
		}
		eff.commit.KV[procAlarmKey] = b
	}
}

// deleteProcKV stages the delete of one key of the processors' KV, counting what it frees: the
// value the totals hold for it is the one staged earlier in this step, else the committed one.
func (st *streamState) deleteProcKV(op procOp, env stepEnv, eff *effects) procReply {
	key := procKVPrefix + op.kvKey
	cur, staged := eff.commit.KV[key]
	committed, err := st.committedProcKV(key, env, eff)
	if err != nil {
		return procReply{err: err}
	}
	if !staged {
		cur = committed
	}
	if staged || committed != nil {
		st.procKVKeys--
		st.procKVBytes -= int64(len(op.kvKey) + len(cur))
	}
	delete(eff.commit.KV, key)
	if committed != nil {
		eff.commit.KVDeletes = append(eff.commit.KVDeletes, key)
	}
	return procReply{}
}

// kvOwned refuses a put under the KV prefix of a processor instance (itx.ProcessorKVPrefix) that
// no processor-wake subscription of the catalog is: a removed processor's prefix is deleted with
// it (forgetProc), and a late write of one of its runners (a remote host that kept its ports, an
// in-process keepalive racing the removal) would otherwise hand its records to a subscription
// created anew under the name. Checked in the step, after this step's removals.
func (st *streamState) kvOwned(key string) error {
	if !strings.HasPrefix(key, "processor/") {
		return nil
	}
	for name, e := range st.core.Subscriptions {
		if e.Kind() == itx.KindProcessorWake && strings.HasPrefix(key, itx.ProcessorKVPrefix(name)) {
			return nil
		}
	}
	return itx.Errorf(itx.EFailedPrecondition, "processor KV key %q: no processor-wake subscription of this stream holds it (removed): this runner is dead", key)
}

// kvFence fences a remote host's KV write under the processors' records
// (itx.ProcessorKVPrefix): its ports write there only under their own processor's prefix, and
// only while the processor's progress record is at the generation their runner holds (claimed
// through them, else the record's at the wake), as a commit is fenced. A removal bumps the
// generation, so the removed processor's ports (a host that kept them) write nothing into one
// configured anew under its name; a newer wake's claim fences a stale runner's writes too. A
// reconfigure keeps the generation. Keys outside "processor/" are the stream's shared KV.
func (st *streamState) kvFence(op procOp, env stepEnv) error {
	if op.kvFor == "" || !strings.HasPrefix(op.kvKey, "processor/") {
		return nil
	}
	if prefix := itx.ProcessorKVPrefix(op.kvFor); !strings.HasPrefix(op.kvKey, prefix) {
		return itx.Errorf(itx.EPermissionDenied, "processor KV key %q: processor %q's ports write only under %q", op.kvKey, op.kvFor, prefix)
	}
	// Names may hold "/": "processor/a/" is also the start of processor "a/b"'s prefix, whose
	// records the ports of "a" do not write (those of "a/b" write their own, under "a"'s).
	own := itx.ProcessorKVPrefix(op.kvFor)
	for name, e := range st.core.Subscriptions {
		p := itx.ProcessorKVPrefix(name)
		if name != op.kvFor && e.Kind() == itx.KindProcessorWake && len(p) > len(own) && strings.HasPrefix(p, own) && strings.HasPrefix(op.kvKey, p) {
			return itx.Errorf(itx.EPermissionDenied, "processor KV key %q is processor %q's: processor %q's ports do not write it", op.kvKey, name, op.kvFor)
		}
	}
	rec, err := st.procRecordOf(op.kvFor, env)
	if err != nil {
		return err
	}
	return rec.fence(op.kvFor, op.kvGen)
}

// committedProcKV is the committed value of a processors' KV key as this step leaves it: nil
// once a delete of it is staged.
func (st *streamState) committedProcKV(key string, env stepEnv, eff *effects) ([]byte, error) {
	if slices.Contains(eff.commit.KVDeletes, key) || env.loadKV == nil {
		return nil, nil
	}
	v, err := env.loadKV(key)
	if err != nil {
		return nil, itx.Errorf(itx.EUnavailable, "read processor KV: %v", err)
	}
	return v, nil
}

// putProcKV stages a processor KV write within the stream's bounds. It looks up only the value it
// replaces (staged earlier in this step, or committed), so an overwrite counts its difference; a
// put that would grow a total past its bound is refused and writes nothing. One that does not grow
// it is taken even over the bound, so a stream holding more than a lowered bound can still shrink,
// and below the disk reserve.
func (st *streamState) putProcKV(op procOp, env stepEnv, eff *effects) procReply {
	if err := st.kvOwned(op.kvKey); err != nil {
		return procReply{err: err}
	}
	key := procKVPrefix + op.kvKey
	prev, found := eff.commit.KV[key]
	if !found {
		var err error
		if prev, err = st.committedProcKV(key, env, eff); err != nil {
			return procReply{err: err}
		}
		found = prev != nil
	}
	keys, bytes := st.procKVKeys, st.procKVBytes+int64(len(op.kvKey)+len(op.kvVal))
	if found {
		bytes -= int64(len(op.kvKey) + len(prev))
	} else {
		keys++
	}
	if !found && env.maxProcKVKeys > 0 && keys > env.maxProcKVKeys {
		return procReply{err: itx.Errorf(itx.ELimitExceeded,
			"the processors' KV of a stream holds at most %d keys (--max-processor-kv-keys): %q would be one more", env.maxProcKVKeys, op.kvKey)}
	}
	if bytes > st.procKVBytes && env.maxProcKVBytes > 0 && bytes > env.maxProcKVBytes {
		return procReply{err: itx.Errorf(itx.ELimitExceeded,
			"the processors' KV of a stream holds at most %d bytes of keys and values (--max-processor-kv-bytes): writing %q would bring it to %d", env.maxProcKVBytes, op.kvKey, bytes)}
	}
	if bytes > st.procKVBytes && env.room != nil {
		// Below the disk reserve (or past the project's quota) a put that grows the KV is
		// refused as an append is; overwrites that do not grow it and deletes still run.
		if err := env.room(); err != nil {
			return procReply{err: err}
		}
	}
	st.procKVKeys, st.procKVBytes = keys, bytes
	if eff.commit.KV == nil {
		eff.commit.KV = map[string][]byte{}
	}
	// Never nil: the kv column is not null, and an empty value is a value.
	eff.commit.KV[key] = append([]byte{}, op.kvVal...)
	return procReply{}
}

// --- the actor's side ----------------------------------------------------------------------

// wokenID is the incarnation id the first step records as stream/woken, or "" when this server
// hosts none of the stream's processors. Its key is the process's incarnation, so each process
// records it once per stream however often the stream loads.
func (a *actor) wokenID() string {
	if a.store == nil {
		return ""
	}
	for _, entry := range a.st.core.Subscriptions {
		if isInProcess(entry) && a.srv.hosted[entry.Config.ProcessorContract()] {
			return a.srv.incarnation
		}
	}
	return ""
}

// processors returns the stream's processors, opening them on first use. It is never called on
// the actor's goroutine: opening and starting write through the actor.
func (a *actor) processors(ctx context.Context) (itx.StreamProcessors, error) {
	a.procMu.Lock()
	defer a.procMu.Unlock()
	if a.procs != nil {
		return a.procs, nil
	}
	if a.procClosed || a.dctx.Err() != nil {
		return nil, itx.Errorf(itx.EUnavailable, "stream %s is unloading: its processors are gone with this incarnation", a.ref.Path)
	}
	host := a.srv.cfg.Processors
	if host == nil {
		return nil, itx.Errorf(itx.ENotFound, "this server hosts no processors")
	}
	log := a.srv.log
	ps, err := host.Open(ctx, itx.ProcessorPorts{
		Path: a.ref.Path, Log: procLog{a}, Progress: procProgress{a}, KV: procKV{a}, Alarm: procAlarmCell{a},
		Clock: a.srv.clock,
		Logf: func(format string, args ...any) {
			log.Info().Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg(fmt.Sprintf(format, args...))
		},
	})
	if err != nil {
		return nil, err
	}
	a.procs = ps
	return ps, nil
}

// closeProcessors ends this incarnation's processors (an eviction: work in flight is lost, and
// the keepalive's alarm revives what was owed).
func (a *actor) closeProcessors() {
	a.procMu.Lock()
	ps := a.procs
	a.procs, a.procClosed = nil, true
	a.procMu.Unlock()
	if ps != nil {
		ps.Close()
	}
}

// stopRunner ends the incarnation of the in-process runner of name, if one runs: its
// subscription was removed or placed elsewhere, so its keepalive must not revive it, nor its
// background work go on. Off the actor's goroutine: a Start in progress holds the processors'
// lock while it waits for the actor.
func (a *actor) stopRunner(name string) {
	a.procMu.Lock()
	ps := a.procs
	a.procMu.Unlock()
	if ps == nil {
		return
	}
	if r, ok := ps.Runner(name); ok {
		go ps.Stop(r)
	}
}

// runner starts (or finds) the in-process processor of a processor-wake subscription: the
// instance name, running the contract its config names.
func (a *actor) runner(ctx context.Context, name string) (itx.ProcessorRunner, error) {
	contract := a.contractOf(name)
	ps, err := a.processors(ctx)
	if err != nil {
		if itx.ErrorCode(err) == itx.ENotFound {
			return nil, a.unregistered(name, contract, itx.Errorf(itx.ENotFound, "no processor is registered under the name %q", contract))
		}
		return nil, err
	}
	r, err := a.startRunner(ctx, ps, name, contract)
	if itx.ErrorCode(err) == itx.ENotFound {
		return nil, a.unregistered(name, contract, err)
	}
	return r, err
}

// unregistered is err, the halt error of an in-process subscription whose contract this itxd
// does not host, with a hint when a remote host mounted in the subscription's scope announces
// the contract: the likeliest cause then is a subscription meant for that host configured
// without placement "remote" (the default is in-process), and the bare error left its author
// wondering why a contract processors.list() shows is "not registered".
func (a *actor) unregistered(name, contract string, err error) error {
	entry := a.catalogEntry(name)
	if entry == nil {
		return err
	}
	if a.srv.remoteHost(a.ref.ProjectID, entry.mountScope(), contract) == nil {
		return err
	}
	// The host is not named: lastError is read by every reader of the stream, among them
	// sessions limited to a prefix narrower than the scope the host was mounted in.
	return itx.Errorf(itx.ENotFound, "%s in this itxd; a remote host mounted for this subscription holds it: configure the subscription with placement \"remote\"",
		itx.AsError(err).Message)
}

// startRunner starts (or finds) the instance name running contract on ps, replacing a runner
// whose record moved on since it claimed it (another incarnation claimed it, or the subscription
// was removed): once a removal or a configure answered, no call reaches the removed runner.
func (a *actor) startRunner(ctx context.Context, ps itx.StreamProcessors, name, contract string) (itx.ProcessorRunner, error) {
	r, err := ps.Start(ctx, name, contract)
	if err != nil {
		return nil, err
	}
	gen, err := a.procGeneration(ctx, name)
	if err != nil {
		return nil, err
	}
	if gen > r.RuntimeState().Generation {
		// Another incarnation claimed the record since this runner did (the subscription was
		// placed on a remote host meanwhile), or the subscription was removed since (forgetProc
		// bumped the generation; the removal's stop of the runner runs off the actor and may not
		// have landed, even once a configure under the name answered): every commit of this
		// runner would be refused, and what it holds is not the current processor's, so its
		// incarnation ends and a fresh one claims the record back.
		ps.Stop(r)
		return ps.Start(ctx, name, contract)
	}
	return r, nil
}

// ask hands the actor a processor port write and waits for its commit.
func (a *actor) ask(ctx context.Context, op procOp) procReply {
	op.reply = make(chan procReply, 1)
	select {
	case a.inbox <- &actorMsg{proc: &op}:
	case <-a.done:
		return procReply{err: a.gone()}
	case <-ctx.Done():
		return procReply{err: itx.Errorf(itx.ECancelled, "processor write not queued: %v", ctx.Err())}
	}
	select {
	case r := <-op.reply:
		return r
	case <-ctx.Done():
		// Unloading waits for pushes, and a push may be waiting here: give up; the write may
		// still land (its outcome is unknown, as for an append whose caller left).
		return procReply{err: itx.Errorf(itx.ECancelled, "processor write: %v", ctx.Err())}
	case <-a.done:
		// The final step answers what it took; a write it never took did not happen.
		select {
		case r := <-op.reply:
			return r
		default:
			return procReply{err: a.gone()}
		}
	}
}

func (a *actor) gone() error {
	return itx.Errorf(itx.EUnavailable, "stream %s was unloaded: this incarnation's processors are gone", a.ref.Path)
}

// fireProcessorAlarm runs one fire of the processors' alarm slice off the actor's goroutine:
// every in-process processor of the stream is started (so its keepalive is registered and
// reconciled), then the registry decides and revives. The actor hears when it finished.
func (a *actor) fireProcessorAlarm(owner string) {
	if owner != "" {
		a.fireRemoteAlarm(owner)
		return
	}
	if !a.pinAlarm(owner) {
		return
	}
	names := map[string]string{} // instance -> contract
	for name, entry := range a.st.core.Subscriptions {
		if isInProcess(entry) {
			names[name] = entry.Config.ProcessorContract()
		}
	}
	go func() {
		defer a.srv.release(a)
		ctx := a.dctx
		err := a.handleProcessorAlarm(ctx, names)
		if err != nil && ctx.Err() == nil {
			a.srv.log.Warn().Err(err).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg("processor alarm")
		}
		a.ask(ctx, procOp{fired: true})
	}()
}

// pinAlarm takes the stream in use for owner's alarm fire within its project's share of the held
// streams, as a delivery try does (pinDelivery). A fire refused at the share stays firing and
// waits in alarmsWaiting for the next step (the release that takes the project under its share
// ticks the stream): the alarm is owed work, and its slice may be due already, so no timer would
// bring it back. Before, a fire pinned without looking: a remote host hanging on its alarm wakes
// held a project's streams past its share, and the other projects could load none.
// False: the fire does not run now (refused, or the stream is unloading and the alarm loop
// fires the stored slice after its next load).
func (a *actor) pinAlarm(owner string) bool {
	ok, full := a.srv.pinDelivery(a)
	if full {
		if a.alarmsWaiting == nil {
			a.alarmsWaiting = map[string]bool{}
		}
		a.alarmsWaiting[owner] = true
	}
	return ok
}

func (a *actor) handleProcessorAlarm(ctx context.Context, names map[string]string) error {
	ps, err := a.processors(ctx)
	if err != nil {
		if itx.ErrorCode(err) == itx.ENotFound {
			zero := int64(0) // nothing here can ever handle it: disarm rather than fire forever
			a.ask(ctx, procOp{alarm: &zero})
		}
		return err
	}
	for name, contract := range names {
		if _, err := a.startRunner(ctx, ps, name, contract); err != nil && itx.ErrorCode(err) != itx.ENotFound {
			a.srv.log.Warn().Err(err).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Str("processor", name).Msg("starting processor for its alarm")
		}
	}
	return ps.HandleAlarm(ctx)
}

// takeRewind has r take the operator's rewind row carries (its cursor-set: reprocess from the
// cursor set, event-time state re-reduced through it) unless name's committed record already
// honors it. The wake that delivers next takes it, or a snapshot or getRuntimeState asked once
// setSubscriptionCursor answered, so they read their write even while no wake comes (a seek
// leaves a halted subscription halted). One at a time per stream, the record read under the
// lock: whichever asks first takes it, and the other finds it taken.
func (a *actor) takeRewind(ctx context.Context, name string, r itx.ProcessorRunner, row storage.CursorRow) error {
	if row.CursorChangedAtOffset == row.ConfiguredAtOffset {
		return nil
	}
	a.rewindMu.Lock()
	defer a.rewindMu.Unlock()
	rec, err := a.procRecord(ctx, name)
	if err != nil {
		return err
	}
	if rec != nil && rec.Seek == row.CursorChangedAtOffset {
		return nil
	}
	a.setProcSeek(name, row.CursorChangedAtOffset)
	if err := r.ReprocessFrom(ctx, row.ConfirmedOffset+1); err != nil {
		return fmt.Errorf("reprocess from offset %d: %w", row.ConfirmedOffset+1, err)
	}
	return nil
}

// procSeekFor is the seek epoch a rewind of name's runner carries into its commits.
func (a *actor) procSeekFor(name string) int64 {
	a.procMu.Lock()
	defer a.procMu.Unlock()
	return a.procSeek[name]
}

// setProcSeek records name's rewind epoch; 0 (none: the subscription was removed or created
// anew) forgets the name, so that processor subscriptions coming and going under new names do
// not grow a stream that stays loaded.
func (a *actor) setProcSeek(name string, seek int64) {
	a.procMu.Lock()
	defer a.procMu.Unlock()
	if seek == 0 {
		delete(a.procSeek, name)
		return
	}
	a.procSeek[name] = seek
}

// --- the ports -----------------------------------------------------------------------------

// procLog is the stream as its processors read and append it.
type procLog struct{ a *actor }

func (l procLog) Read(ctx context.Context, after int64, limit int) (itx.ProcessorPage, error) {
	v := l.a.view()
	if v.store == nil {
		return itx.ProcessorPage{}, l.a.gone()
	}
	if limit <= 0 || limit > itx.MaxPageLimit {
		limit = itx.MaxPageLimit
	}
	page := itx.ProcessorPage{ScannedThrough: max(after, v.head), Head: v.head}
	if after >= v.head {
		page.ScannedThrough = after
		return page, nil
	}
	q := storage.Query{After: after, UpTo: v.head, Limit: limit, MaxBytes: itx.MaxPageBytes}
	events, err := v.store.Events(ctx, q)
	if err != nil {
		return itx.ProcessorPage{}, itx.Errorf(itx.EUnavailable, "read %s: %v", l.a.ref.Path, err)
	}
	if q.Cut(events) { // full, or cut by size: the scan covers through its last event
		page.ScannedThrough = events[len(events)-1].Offset
	}
	page.Events = events
	page.EphemeralOnly = len(events) == 0 // the query reads durable events only
	return page, nil
}

// ForInstance is the log as the processor-wake subscription name is delivered (itx.InstanceLog).
func (l procLog) ForInstance(name string) itx.ProcessorLog {
	return procInstanceLog{procLog: l, name: name}
}

// procInstanceLog reads the stream through the filter of one processor instance's subscription
// (seed 000: the announced consumes compose with the configured filter), so the runner's own
// reads (catch-up, the rewind's re-reduction) see what its wake frames see; appends and
// schedules are the stream's.
type procInstanceLog struct {
	procLog
	name string
}

func (l procInstanceLog) Read(ctx context.Context, after int64, limit int) (itx.ProcessorPage, error) {
	v := l.a.view()
	if v.store == nil {
		return itx.ProcessorPage{}, l.a.gone()
	}
	if _, ok := v.core.Subscriptions[l.name]; !ok {
		return l.procLog.Read(ctx, after, limit) // removed meanwhile: nothing filters it any more
	}
	if limit <= 0 || limit > itx.MaxPageLimit {
		limit = itx.MaxPageLimit
	}
	page, err := l.a.srv.readPageAs(ctx, l.a.ref.ProjectID, v, itx.Query{After: after, Limit: limit, Subscription: l.name})
	if err != nil {
		return itx.ProcessorPage{}, err
	}
	out := itx.ProcessorPage{Events: page.Events, ScannedThrough: page.NextAfter, Head: page.StreamMaxOffset}
	if len(out.Events) == 0 && out.ScannedThrough > after {
		// The filter hides durable events too: whether the range holds only ephemeral offsets
		// is the unfiltered log's to say.
		raw, err := l.procLog.Read(ctx, after, 1)
		if err != nil {
			return itx.ProcessorPage{}, err
		}
		out.EphemeralOnly = len(raw.Events) == 0 || raw.Events[0].Offset > out.ScannedThrough
	}
	return out, nil
}

// Append commits through this incarnation's actor only: a processor of an unloaded incarnation
// cannot load the stream again behind its successor's back.
func (l procLog) Append(ctx context.Context, inputs []itx.EventInput) ([]itx.Event, error) {
	a := l.a
	if err := validateAppend(inputs, authClient); err != nil {
		return nil, err
	}
	if !a.srv.pin(a) {
		return nil, a.gone()
	}
	req := &appendReq{inputs: inputs, authority: authClient, queued: time.Now(), reply: make(chan appendReply, 1)}
	if err := a.submit(ctx, req); err != nil {
		a.srv.release(a)
		return nil, err
	}
	res, err := (&PendingAppend{srv: a.srv, actor: a, req: req}).Wait(ctx)
	if err != nil {
		return nil, err
	}
	return l.readBack(ctx, res.Offsets)
}

// AppendTo appends to another stream of the project (itx.ProcessorOutbox) while this
// incarnation holds its own stream: a processor of an unloaded incarnation forwards nothing.
func (l procLog) AppendTo(ctx context.Context, path string, inputs []itx.EventInput) (itx.AppendResult, error) {
	a := l.a
	if !a.srv.pin(a) {
		return itx.AppendResult{}, a.gone()
	}
	defer a.srv.release(a)
	return a.srv.processorAppendTo(ctx, a.ref, "", path, inputs, nil)
}

// AppendToFrom is AppendTo saying which event of the home stream the forward comes from
// (itx.ProcessorEffectOutbox): the receiving stream fences it as this instance's effect.
func (l procInstanceLog) AppendToFrom(ctx context.Context, path string, inputs []itx.EventInput, origin itx.EffectOrigin) (itx.AppendResult, error) {
	a := l.a
	if !a.srv.pin(a) {
		return itx.AppendResult{}, a.gone()
	}
	defer a.srv.release(a)
	stamp, err := newEffectStamp(a.ref.Path, l.name, a.view().streamID, origin)
	if err != nil {
		return itx.AppendResult{}, err
	}
	return a.srv.processorAppendTo(ctx, a.ref, "", path, inputs, stamp)
}

// newEffectStamp stamps a forward of processor name of the stream at home (its stream id
// streamID) made at origin; nil when origin names no event above the processor's cursor (nothing
// a crash would redeliver: the key alone dedupes) or the home stream has no id yet.
func newEffectStamp(home, name, streamID string, origin itx.EffectOrigin) (*effectStamp, error) {
	if err := itx.CheckEffectOrigin(origin); err != nil {
		return nil, err
	}
	if origin.Offset <= origin.ProcessedThrough || streamID == "" {
		return nil, nil
	}
	return &effectStamp{SourcePath: home, Name: name, StreamID: streamID, Offset: origin.Offset, Processed: origin.ProcessedThrough}, nil
}

// processorAppendTo is a processor's forward from its home stream to another stream of the
// project, under scope (a remote processor's subscription's; "" for the whole project):
// ordinary events only, the control events (stream/*) of another stream being its
// subscribers' to append. A stamped forward is fenced by the receiving stream as its source
// processor's effect (effectStamp).
func (s *Server) processorAppendTo(ctx context.Context, home StreamRef, scope, path string, inputs []itx.EventInput, stamp *effectStamp) (itx.AppendResult, error) {
	if err := itx.ValidatePath(path); err != nil {
		return itx.AppendResult{}, err
	}
	switch {
	case path == home.Path:
		return itx.AppendResult{}, itx.Errorf(itx.EInvalid, "AppendTo the home stream %s: use Append", path)
	case home.ProjectID == DeploymentProjectID && path == AuditPath:
		return itx.AppendResult{}, itx.Errorf(itx.EPermissionDenied, "%s is written by the server only", AuditPath)
	case scope != "" && !itx.PathUnder(path, scope):
		return itx.AppendResult{}, itx.Errorf(itx.EPermissionDenied, "AppendTo %s: this processor's subscription is limited to streams under %s", path, scope)
	}
	if err := itx.CheckForward(inputs); err != nil {
		return itx.AppendResult{}, err
	}
	var res itx.AppendResult
	p, err := s.startClientAppend(ctx, StreamRef{ProjectID: home.ProjectID, Path: path}, inputs, itx.AppendOptions{}, stamp)
	if err == nil {
		res, err = p.Wait(ctx)
	}
	if err == nil && processorForwardCommittedHook != nil {
		processorForwardCommittedHook()
	}
	return res, err
}

// processorForwardCommittedHook, when set (tests), runs once a processor's forward to another
// stream has committed there, before the processor hears of it (so before its frame commits).
var processorForwardCommittedHook func()

// Schedule schedules through this incarnation's actor only, like Append.
func (l procLog) Schedule(ctx context.Context, input itx.EventInput, at time.Time) error {
	a := l.a
	op, err := newScheduleOp(input, at.UnixMilli())
	if err != nil {
		return err
	}
	if !a.srv.pin(a) {
		return a.gone()
	}
	defer a.srv.release(a)
	_, err = a.schedule(ctx, op)
	return err
}

// readBack returns the committed events at offsets (a duplicate's offset is its original's).
func (l procLog) readBack(ctx context.Context, offsets []int64) ([]itx.Event, error) {
	v := l.a.view()
	if v.store == nil {
		return nil, l.a.gone()
	}
	lo, hi := offsets[0], offsets[0]
	for _, o := range offsets {
		lo, hi = min(lo, o), max(hi, o)
	}
	events, err := v.store.Events(ctx, storage.Query{After: lo - 1, UpTo: hi, Limit: int(hi - lo + 1), IncludeEphemeral: true})
	if err != nil {
		return nil, itx.Errorf(itx.EUnavailable, "read back appended events: %v", err)
	}
	byOffset := make(map[int64]itx.Event, len(events))
	for _, e := range events {
		byOffset[e.Offset] = e
	}
	out := make([]itx.Event, 0, len(offsets))
	for _, o := range offsets {
		e, ok := byOffset[o]
		if !ok {
			return nil, itx.Errorf(itx.EInternal, "appended event %d is not readable", o)
		}
		out = append(out, e)
	}
	return out, nil
}

// procProgress is the fenced progress store, in the stream's kv table.
type procProgress struct{ a *actor }

func (p procProgress) Claim(ctx context.Context, name string) (*itx.ProcessorProgress, int64, error) {
	r := p.a.ask(ctx, procOp{claim: name})
	return r.progress, r.generation, r.err
}

func (p procProgress) Check(ctx context.Context, name string, generation int64) error {
	return p.a.ask(ctx, procOp{check: &procCommit{name: name, generation: generation}}).err
}

func (p procProgress) Commit(ctx context.Context, name string, generation int64, pr itx.ProcessorProgress) error {
	return p.a.ask(ctx, procOp{commit: &procCommit{name: name, generation: generation, seek: p.a.procSeekFor(name), progress: pr}}).err
}

// procKV is the processors' KV, in the stream's kv table below every reduction.
type procKV struct{ a *actor }

func (k procKV) Get(ctx context.Context, key string) ([]byte, bool, error) {
	v := k.a.view()
	if v.store == nil {
		return nil, false, k.a.gone()
	}
	b, err := v.store.KV(ctx, procKVPrefix+key)
	if err != nil {
		return nil, false, itx.Errorf(itx.EUnavailable, "read processor KV: %v", err)
	}
	return b, b != nil, nil
}

func (k procKV) Put(ctx context.Context, key string, value []byte) error {
	if key == "" || strings.ContainsRune(key, 0) {
		return itx.Errorf(itx.EInvalid, "processor KV key must be a non-empty string without NUL")
	}
	return k.a.ask(ctx, procOp{kvKey: key, kvVal: value}).err
}

func (k procKV) Delete(ctx context.Context, key string) error {
	if key == "" || strings.ContainsRune(key, 0) {
		return itx.Errorf(itx.EInvalid, "processor KV key must be a non-empty string without NUL")
	}
	return k.a.ask(ctx, procOp{kvKey: key, kvDel: true}).err
}

// procAlarmCell is the processors' slice of the stream's alarm.
type procAlarmCell struct{ a *actor }

func (c procAlarmCell) SetAlarm(ctx context.Context, at time.Time) error {
	ms := int64(0)
	if !at.IsZero() {
		ms = max(itx.UnixMilli(at), 1)
	}
	return c.a.ask(ctx, procOp{alarm: &ms}).err
}

// --- the wake ------------------------------------------------------------------------------

// wake is a processor-wake push: the runner of the subscription's contract gets the frame after
// its own processing cursor, with the scanned range (filtered rows included) so CaughtUp and the
// eventless pass are right, and the outcome reports the cursor its commit left.
func (d *deliverer) wake(job pushJob, store streamStore, out deliveryOutcome) deliveryOutcome {
	fail := func(class failureClass, count int, err error) deliveryOutcome {
		out.failure = &deliveryFailure{class: class, count: count, msg: err.Error()}
		return out
	}
	if entry := d.actor.catalogEntry(d.name); entry != nil && !isInProcess(entry) {
		return d.wakeRemote(job, out)
	}
	r, err := d.actor.runner(d.ctx, d.name)
	switch {
	case d.ctx.Err() != nil:
		return out
	case itx.ErrorCode(err) == itx.ENotFound:
		return fail(classTerminal, 0, err)
	case err != nil:
		return fail(classOutage, 0, err)
	}
	row := job.row
	if row.CursorChangedAtOffset != row.ConfiguredAtOffset && job.procSeek != row.CursorChangedAtOffset {
		// The operator's rewind (a cursor-set): reprocess from the cursor it set, once.
		if err := d.actor.takeRewind(d.ctx, d.name, r, row); err != nil {
			if d.ctx.Err() != nil {
				return out
			}
			return fail(classOutage, 0, err)
		}
	}
	after := r.ProcessedThrough()
	if after >= job.head {
		if after > row.ConfirmedOffset {
			out.through = min(after, job.head)
		}
		return out
	}
	events, scanned, err := d.scan(job, store, after, job.limit, job.maxBytes)
	if err != nil {
		return fail(classOutage, 0, err)
	}
	// The cursor row follows the runner's commit, so the wake lane itself delivers whatever
	// lies past this frame: no trailing catch-up is needed.
	// The scan reads durable events only: none means the range holds only ephemeral offsets,
	// which never reach a processor (the runner moves its cursor over them without a pass).
	frame := itx.ProcessorFrame{ScannedAfter: after, ScannedThrough: scanned, Head: job.head, Continued: true, EphemeralOnly: len(events) == 0}
	for i := range events {
		e := &events[i]
		if !d.matches(e) {
			continue
		}
		if d.condition != nil {
			ok, err := d.condition.holds(e)
			if err != nil {
				// The frame stops before the event the condition cannot judge; it waits alone.
				frame.ScannedThrough = e.Offset - 1
				if frame.ScannedThrough <= after && errors.Is(err, errJSONataBusy) {
					// The server's overload, not the event's: retried as an outage.
					return fail(classOutage, 0, fmt.Errorf("could not evaluate the filter condition on offset %d now: %w", e.Offset, err))
				}
				if frame.ScannedThrough <= after {
					return fail(classEvent, 1, fmt.Errorf("filter condition failed on offset %d: %w", e.Offset, err))
				}
				break
			}
			if !ok {
				continue
			}
		}
		frame.Events = append(frame.Events, *e)
	}
	// Bound as a remote host's wake is: a frame that has not finished by then (a ProcessEvent or
	// blocker that does not return, whatever its context says) is an outage the subscription
	// shows (lastError, attempt) and backs off from, not a wake in flight forever past its
	// deadline. The frame's context ends; a frame that ignores it is left running (it commits if
	// it ever ends), and the runner takes no other frame until it does.
	ctx, cancel := context.WithCancel(d.ctx)
	defer cancel()
	var late atomic.Bool
	bound := 2 * d.srv.cfg.DeliveryTimeout
	t := d.srv.clock.AfterFunc(bound, func() { late.Store(true); cancel() })
	defer t.Stop()
	done := make(chan error, 1)
	go func() { done <- r.Deliver(ctx, frame) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		switch {
		case d.ctx.Err() != nil:
			return out // unloading or replaced: the frame is redelivered
		case late.Load():
			return fail(classOutage, 0, itx.Errorf(itx.EDeadlineExceeded, "processor %q did not finish its frame (%d, %d] within %s", d.name, frame.ScannedAfter, frame.ScannedThrough, bound))
		}
		out = fail(classOutage, len(frame.Events), err)
		// The event a hook failed on, for describe's failingEventOffset (the frame is retried
		// whole along the ladder: a processor never skips an event).
		out.failure.eventOffset, out.failure.processorEvent = itx.FailingEventOf(err), true
		return out
	}
	through := r.ProcessedThrough()
	if through <= row.ConfirmedOffset {
		return fail(classOutage, 0, itx.Errorf(itx.EUnavailable, "processor %q processed through %d, no progress past the cursor at %d", d.name, through, row.ConfirmedOffset))
	}
	out.through, out.delivered = through, true
	return out
}

// contractOf is the contract the processor-wake subscription name runs (name itself when it is
// not one).
func (a *actor) contractOf(name string) string {
	if entry := a.catalogEntry(name); entry != nil {
		return entry.Config.ProcessorContract()
	}
	return name
}

// remoteOf is the scope and contract of name's remote host: the host announcing the contract
// in the namespace of the scope the subscription was configured under.
func (a *actor) remoteOf(name string) (scope, contract string) {
	if entry := a.catalogEntry(name); entry != nil {
		return entry.mountScope(), entry.Config.ProcessorContract()
	}
	return "", name
}

// catalogEntry is the published catalog entry of name (nil when none).
func (a *actor) catalogEntry(name string) *catalogEntry {
	v := a.view()
	if v.core == nil {
		return nil
	}
	return v.core.Subscriptions[name]
}

// --- barriers and inspection ---------------------------------------------------------------

// waitRunner waits until the current in-process runner of name has processed through offset
// (its cursor row already has), or expired.
func (s *Server) waitRunner(ctx context.Context, a *actor, name string, offset int64, expired <-chan struct{}) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-expired:
		case <-a.dctx.Done():
		case <-wctx.Done():
		}
		cancel()
	}()
	r, err := a.runner(wctx, name)
	if err == nil {
		err = r.WaitUntilProcessed(wctx, offset)
	}
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return itx.Errorf(itx.ECancelled, "waitUntilProcessed: %v", ctx.Err())
	case a.dctx.Err() != nil:
		return a.ended()
	case wctx.Err() != nil:
		return itx.Errorf(itx.EDeadlineExceeded, "processor %q committed through %d but its runner has not caught up", name, offset)
	}
	return err
}

// ProcessorSnapshot is an in-process processor's committed reduced state, the offset it was
// reduced through and its processing cursor. It is read from the committed record the stream
// publishes with its cursor rows, not from the runner: a commit moves the subscription's
// confirmed offset as it lands, and the runner publishes it only once the commit's answer is
// back, so a snapshot asked after describe showed the cursor there could read the runner's
// state from before (a rewind's reset state with the replay already confirmed). The runner's
// copy answers only while nothing is committed yet.
func (s *Server) ProcessorSnapshot(ctx context.Context, ref StreamRef, name string) (state json.RawMessage, reduced, processed int64, err error) {
	err = s.withProcessor(ctx, ref, name, func(a *actor, r itx.ProcessorRunner) error {
		rec, err := a.procRecord(ctx, name)
		if err != nil {
			return err
		}
		if rec == nil || rec.Progress == nil {
			reduced, state = r.SnapshotJSON()
			processed = r.ProcessedThrough()
			return nil
		}
		state, reduced, processed = rec.Progress.State, rec.Progress.ReducedThrough, rec.Progress.ProcessedThrough
		if len(state) == 0 {
			state = json.RawMessage("null")
		}
		return nil
	}, func(a *actor) (err error) {
		state, reduced, processed, err = s.remoteSnapshot(ctx, a, name)
		return err
	})
	return state, reduced, processed, err
}

// ProcessorRuntimeState is an in-process processor's view of itself, as JSON: its cursors,
// generation and what this incarnation observed, with the subscription's placement. Cursors the
// committed record holds ahead of the runner's (a commit landed, its answer not yet back to the
// runner) are the record's, as for a snapshot: describe already shows them.
func (s *Server) ProcessorRuntimeState(ctx context.Context, ref StreamRef, name string) (json.RawMessage, error) {
	var out json.RawMessage
	err := s.withProcessor(ctx, ref, name, func(a *actor, r itx.ProcessorRunner) error {
		rs := r.RuntimeState()
		rec, err := a.procRecord(ctx, name)
		if err != nil {
			return err
		}
		if rec != nil && rec.Progress != nil && rec.Generation == rs.Generation {
			p := rec.Progress
			if p.CursorRevision > rs.CursorRevision || (p.CursorRevision == rs.CursorRevision && p.ProcessedThrough > rs.ProcessedThrough) {
				rs.ReducedThrough, rs.ProcessedThrough, rs.CursorRevision = p.ReducedThrough, p.ProcessedThrough, p.CursorRevision
				rs.ObservedHead = max(rs.ObservedHead, p.ProcessedThrough)
			}
		}
		out, err = json.Marshal(struct {
			itx.ProcessorRuntimeState
			Placement string `json:"placement"`
		}{rs, "in-process"})
		return err
	}, func(a *actor) (err error) {
		out, err = s.remoteRuntimeState(ctx, a, name)
		return err
	})
	return out, err
}

func (s *Server) withProcessor(ctx context.Context, ref StreamRef, name string, f func(*actor, itx.ProcessorRunner) error, remote func(*actor) error) error {
	if err := itx.ValidatePath(ref.Path); err != nil {
		return err
	}
	a, err := s.acquire(ctx, ref)
	if err != nil {
		return err
	}
	defer s.release(a)
	entry := a.view().core.Subscriptions[name]
	switch {
	case entry == nil:
		return itx.Errorf(itx.ENotFound, "subscription %q does not exist", name)
	case entry.Kind() != itx.KindProcessorWake:
		return itx.Errorf(itx.EFailedPrecondition, "subscription %q is a %s subscription: only processor-wake subscriptions have a processor", name, entry.Kind())
	case !isInProcess(entry):
		if err := s.awaitRemoteRewind(ctx, a, name); err != nil {
			return err
		}
		return remote(a)
	}
	r, err := a.runner(ctx, name)
	if err != nil {
		return err
	}
	if row, ok := a.view().rows[name]; ok {
		if err := a.takeRewind(ctx, name, r, row); err != nil {
			return err
		}
	}
	return f(a, r)
}
