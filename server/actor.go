package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

// maxGroupEvents bounds one group commit; requests beyond it wait for the next commit.
const maxGroupEvents = 20_000

// actor owns one loaded stream. Its goroutine (run) is the stream's only writer: it drains every
// queued append into one group commit, so concurrent appenders share one fsync, and the same
// transaction carries the cursor rows and core state the appended events imply. Readers and
// deliverers use the store's reader pool beside it and read shared state under mu.
type actor struct {
	srv *Server
	ref StreamRef

	reqs  chan *appendReq
	flush chan struct{} // a cursor flush is due
	quit  chan struct{}
	done  chan struct{}

	ready   chan struct{} // closed once load finished
	loadErr error

	// Registry fields, guarded by srv.mu.
	refs     int
	lastUsed time.Time

	// Owned by the run goroutine.
	bucket     *tokenBucket
	deliverers map[string]*deliverer
	nextGen    int64
	alarmSet   bool
	stale      bool            // the directory summary is marked stale (see storage.StaleStreams)
	lastSweep  time.Time       // of ephemeral rows
	ephBytes   int64           // held in ephemeral rows (see Config.EphemeralBufferBytes)
	dctx       context.Context // deliverers' context: ends on unload or server close
	dcancel    context.CancelFunc

	mu           sync.Mutex // guards the fields below
	store        *storage.Stream
	streamID     string
	createdAt    int64
	head         int64
	lastAppendAt int64
	changed      chan struct{} // closed and replaced after every commit
	progress     chan struct{} // closed and replaced whenever a cursor moves in memory
	core         *coreState    // published: never mutated, replaced whole
	rows         map[string]*storage.CursorRow
	rowVer       map[string]uint64 // bumped on every in-memory change of a row
	flushedVer   map[string]uint64 // the version last written durably
	flushArmed   bool
}

func newActor(s *Server, ref StreamRef) *actor {
	a := &actor{
		srv: s, ref: ref,
		reqs:       make(chan *appendReq, 1024),
		flush:      make(chan struct{}, 1),
		quit:       make(chan struct{}),
		done:       make(chan struct{}),
		ready:      make(chan struct{}),
		changed:    make(chan struct{}),
		progress:   make(chan struct{}),
		core:       newCoreState(),
		rows:       map[string]*storage.CursorRow{},
		rowVer:     map[string]uint64{},
		flushedVer: map[string]uint64{},
		deliverers: map[string]*deliverer{},
	}
	a.dctx, a.dcancel = context.WithCancel(s.base)
	return a
}

// load opens the stream's database if the stream exists, restores its core state (re-reducing
// from offset 1 when the checkpoint's version is not this server's) and reconciles its cursor
// rows with the catalog.
func (a *actor) load() error {
	ctx := context.Background()
	a.bucket = newTokenBucket(a.srv.cfg.BreakerBurst, a.srv.cfg.BreakerRefillPerMinute, a.srv.clock.Now())
	entry, err := a.srv.dir.Stream(ctx, a.ref.ProjectID, a.ref.Path)
	if err != nil {
		return itx.Errorf(itx.EUnavailable, "load stream %s: %v", a.ref.Path, err)
	}
	if entry == nil {
		return nil // exists from its first append
	}
	a.stale = entry.SummaryStale
	file := a.srv.streamFile(entry.StreamID)
	var store *storage.Stream
	if _, statErr := os.Stat(file); errors.Is(statErr, os.ErrNotExist) {
		// The directory entry committed but the process died before the database was created:
		// nothing was ever acknowledged on this stream, so it starts empty.
		store, err = storage.CreateStream(ctx, file, storage.StreamMeta{
			StreamID: entry.StreamID, ProjectID: entry.ProjectID, Path: entry.Path, CreatedAt: entry.CreatedAt,
		})
	} else {
		store, err = storage.OpenStream(ctx, file)
	}
	if err != nil {
		return itx.Errorf(itx.EUnavailable, "load stream %s: %v", a.ref.Path, err)
	}
	fail := func(err error) error {
		store.Close()
		return itx.Errorf(itx.EUnavailable, "load stream %s: %v", a.ref.Path, err)
	}
	meta, err := store.Meta(ctx)
	if err != nil {
		return fail(err)
	}
	a.store, a.streamID, a.createdAt, a.head, a.lastAppendAt = store, meta.StreamID, meta.CreatedAt, meta.HeadOffset, meta.LastAppendAt
	if err := a.restoreCore(ctx); err != nil {
		return fail(err)
	}
	rows, err := store.CursorRows(ctx)
	if err != nil {
		return fail(err)
	}
	for i := range rows {
		r := rows[i]
		a.rows[r.Name] = &r
	}
	if err := a.reconcileCursors(ctx); err != nil {
		return fail(err)
	}
	if len(a.core.Subscriptions) > 0 {
		// While loaded, the alarm reads "due now" (a crash leaves the stream owed a load); on
		// unload it records the next retry. Whatever woke this incarnation, it owns the alarm.
		if err := a.srv.dir.SetAlarm(ctx, entry.StreamID, itx.UnixMilli(a.srv.clock.Now())); err != nil {
			return fail(err)
		}
		a.alarmSet = true
	}
	a.sweepEphemeral(store)
	if a.ephBytes, err = store.EphemeralBytes(ctx); err != nil {
		return fail(err)
	}
	return nil
}

// evictEphemeral plans the FIFO eviction that keeps the ephemeral buffer within its bound once
// adding bytes: past the bound it frees the oldest rows down to three quarters of it, so
// evictions are rare. It never evicts the commit's own events. It returns the offset to evict
// through (0: none) and the bytes that frees.
func (a *actor) evictEphemeral(ctx context.Context, adding int64) (through, freed int64, err error) {
	limit := a.srv.cfg.EphemeralBufferBytes
	if a.store == nil || a.ephBytes+adding <= limit {
		return 0, 0, nil
	}
	return a.store.EphemeralCutoff(ctx, a.ephBytes+adding-limit*3/4)
}

// restoreCore reads the core-state checkpoint, or rebuilds it from the log.
func (a *actor) restoreCore(ctx context.Context) error {
	raw, err := a.store.KV(ctx, coreStateKey)
	if err != nil {
		return err
	}
	if raw != nil {
		if st, ok := decodeCoreState(raw); ok {
			a.core = st
			return nil
		}
		a.srv.log.Warn().Str("path", a.ref.Path).Msg("core state checkpoint is from another version: re-reducing from offset 1")
	}
	st := newCoreState()
	rc := a.reduceContext()
	rc.checkURL = nil // a rebuild replays history; today's egress policy does not rewrite it
	for after := int64(0); after < a.head; {
		page, err := a.store.Events(ctx, storage.Query{After: after, UpTo: a.head, Limit: 500})
		if err != nil {
			return err
		}
		if len(page) == 0 {
			break
		}
		for i := range page {
			e := &page[i]
			rc.head, rc.authority = e.Offset-1, authCore // history is already accepted: replay it
			if _, err := st.reduce(e, &rc); err != nil {
				a.srv.log.Warn().Err(err).Int64("offset", e.Offset).Str("path", a.ref.Path).Msg("re-reduction skipped an event")
			}
		}
		after = page[len(page)-1].Offset
	}
	a.core = st
	b, _ := json.Marshal(st)
	return a.store.Commit(ctx, storage.Commit{KV: map[string][]byte{coreStateKey: b}})
}

// reconcileCursors makes the cursor rows agree with the catalog (they are committed together,
// so this only repairs a rebuilt catalog): a row per subscription at its birth epoch, no other.
func (a *actor) reconcileCursors(ctx context.Context) error {
	var c storage.Commit
	for name := range a.rows {
		if a.core.Subscriptions[name] == nil {
			c.CursorDeletes = append(c.CursorDeletes, name)
			delete(a.rows, name)
		}
	}
	now := a.srv.clock.Now()
	for name, entry := range a.core.Subscriptions {
		if r := a.rows[name]; r != nil && r.ConfiguredAtOffset == entry.ConfiguredAtOffset {
			continue
		}
		r := bornRow(entry, now)
		a.rows[name] = r
		c.CursorUpserts = append(c.CursorUpserts, *r)
	}
	if len(c.CursorDeletes) == 0 && len(c.CursorUpserts) == 0 {
		return nil
	}
	return a.store.Commit(ctx, c)
}

// bornRow is a subscription's fresh cursor row at its start position.
func bornRow(entry *catalogEntry, now time.Time) *storage.CursorRow {
	initial := int64(0)
	if entry.Kind() != itx.KindProcessorWake && entry.Config.Receiver.EffectiveDelivery().Start == itx.StartNow {
		initial = entry.ConfiguredAtOffset
	}
	status := storage.StatusActive
	if entry.Halted != nil {
		status = storage.StatusHalted
	}
	return &storage.CursorRow{Name: entry.Config.Name, ConfiguredAtOffset: entry.ConfiguredAtOffset,
		CursorChangedAtOffset: entry.ConfiguredAtOffset, ConfirmedOffset: initial, Status: status, UpdatedAt: stamp(now)}
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// applyEffect computes a cursor row after a core event.
func applyEffect(prev *storage.CursorRow, eff cursorEffect, entry *catalogEntry, now time.Time) *storage.CursorRow {
	var r storage.CursorRow
	if prev != nil {
		r = *prev
	}
	clearRetry := func() {
		r.Attempt, r.NextAttemptAt, r.LastError = 0, 0, ""
		r.FailingEventOffset, r.FailingEventAttempt, r.FailingEventSkips = 0, 0, 0
		r.InFlightDeadlineAt, r.InFlightConnectionGeneration = 0, 0
	}
	switch eff.kind {
	case effectBorn:
		r = storage.CursorRow{Name: eff.name, ConfiguredAtOffset: eff.epoch, CursorChangedAtOffset: eff.epoch,
			ConfirmedOffset: eff.offset, Status: storage.StatusActive}
	case effectSeek:
		r.ConfirmedOffset, r.CursorChangedAtOffset = eff.offset, eff.epoch
		clearRetry()
	case effectHalt:
		r.Status = storage.StatusHalted
		clearRetry()
		r.LastError = truncate(eff.err, itx.MaxCursorErrorLength)
	case effectResume:
		r.Status = storage.StatusActive
		clearRetry()
	}
	r.UpdatedAt = stamp(now)
	return &r
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// sweepEphemeral deletes ephemeral rows past their retention: on load, on unload and as a loaded
// stream commits. Offsets are not reissued: the head lives in stream_meta.
func (a *actor) sweepEphemeral(store *storage.Stream) {
	a.lastSweep = a.srv.clock.Now()
	before := itx.UnixMilli(a.lastSweep.Add(-a.srv.cfg.EphemeralRetention))
	n, err := store.DeleteEphemeral(context.Background(), a.head, before)
	if err == nil && n > 0 {
		a.ephBytes, err = store.EphemeralBytes(context.Background()) // what the sweep freed
	}
	if err != nil {
		a.srv.log.Warn().Err(err).Str("path", a.ref.Path).Msg("ephemeral sweep failed")
	} else if n > 0 {
		a.srv.log.Debug().Int64("deleted", n).Str("path", a.ref.Path).Msg("swept ephemeral events")
	}
}

// unload stops the goroutine and closes the database. Only called with no references held:
// no request can be queued and no deliverer is working (idle ones are cancelled here).
func (a *actor) unload() {
	if a.loadErr != nil {
		return
	}
	close(a.quit)
	<-a.done
	a.srv.metrics.LoadedStreams.Dec()
}

func (a *actor) run() {
	defer close(a.done)
	a.startDeliverers()
	group := make([]*appendReq, 0, 64)
	for {
		select {
		case r := <-a.reqs:
			group = append(group[:0], r)
			events := len(r.inputs)
		drain:
			for events < maxGroupEvents {
				select {
				case r := <-a.reqs:
					group = append(group, r)
					events += len(r.inputs)
				default:
					break drain
				}
			}
			// A stream that stays loaded sweeps as it goes, a few times per retention period,
			// before the group commits: whoever sees the group acknowledged sees the sweep done.
			if a.store != nil && a.srv.clock.Now().Sub(a.lastSweep) >= a.srv.cfg.EphemeralRetention/4 {
				a.sweepEphemeral(a.store)
			}
			a.commitGroup(group)
			clear(group)
		case <-a.flush:
			a.commitGroup(nil)
		case <-a.quit:
			a.dcancel()
			for _, d := range a.deliverers {
				<-d.done
			}
			a.commitGroup(nil) // the last acks
			a.close()
			return
		}
	}
}

func (a *actor) close() {
	a.mu.Lock()
	store := a.store
	a.store = nil
	a.mu.Unlock()
	if store == nil {
		return
	}
	a.sweepEphemeral(store)
	ctx := context.Background()
	if err := a.srv.dir.UpdateStreamSummary(ctx, a.streamID, a.head, a.lastAppendAt, len(a.core.Subscriptions)); err != nil {
		a.srv.log.Warn().Err(err).Str("path", a.ref.Path).Msg("stream summary not refreshed")
	}
	if a.alarmSet {
		due := a.nextAlarm()
		if err := a.srv.dir.SetAlarm(ctx, a.streamID, due); err != nil {
			a.srv.log.Error().Err(err).Str("path", a.ref.Path).Msg("stream alarm not recorded")
		} else if due > 0 {
			a.srv.alarmChanged(due)
		}
	}
	if err := store.Close(); err != nil {
		a.srv.log.Warn().Err(err).Str("path", a.ref.Path).Msg("closing stream database")
	}
}

// nextAlarm is when this unloaded stream must be loaded again to deliver: now if an active
// subscription is behind with no retry pending, its earliest retry otherwise, 0 for never.
func (a *actor) nextAlarm() int64 {
	now := itx.UnixMilli(a.srv.clock.Now())
	due := int64(0)
	for name, r := range a.rows {
		if r.Status != storage.StatusActive || r.ConfirmedOffset >= a.head || a.core.Subscriptions[name] == nil {
			continue
		}
		at := max(r.NextAttemptAt, now)
		if due == 0 || at < due {
			due = at
		}
	}
	return due
}

// submit queues an append for the run goroutine. Queue order is commit order, which is what
// lets a client's successive appends on one capability commit in the order they were sent.
func (a *actor) submit(ctx context.Context, r *appendReq) error {
	select {
	case a.reqs <- r:
		return nil
	case <-ctx.Done():
		return itx.Errorf(itx.ECancelled, "append not queued: %v", ctx.Err())
	}
}

func (a *actor) reduceContext() reduceContext {
	return reduceContext{
		path: a.ref.Path, projectID: a.ref.ProjectID, maxSubs: a.srv.cfg.MaxSubscriptions,
		checkURL: a.srv.egress.checkURL,
		compile:  func(src string) error { _, err := CompileJSONata(src); return err },
	}
}

// commitGroup plans, commits and answers one group of append requests (none: a cursor flush).
//
// Ordering: the commit (fsync) completes before any reply is sent and before readers, barriers
// and deliverers can see the new head or cursor state; a failed commit answers every accepted
// request with the failure and publishes nothing.
func (a *actor) commitGroup(group []*appendReq) {
	ctx := context.Background()
	now := a.srv.clock.Now()
	m := a.srv.metrics

	committed, err := a.lookupKeys(ctx, group)
	if err != nil {
		a.failAll(group, err)
		return
	}
	if a.streamID == "" {
		a.streamID = newStreamID() // persisted with the stream on its first commit
	}
	plan := planGroup(a.head, a.streamID, a.bucket, a.core, a.reduceContext(), group, committed, now)

	// The cursor rows this commit writes: every row a core event changed, then every row a
	// deliverer moved since the last flush. Each carries the version it was taken at.
	a.mu.Lock()
	writes := map[string]*storage.CursorRow{}
	deleted := map[string]bool{}
	var order []string
	for _, eff := range plan.Effects {
		if eff.kind == effectRemove {
			delete(writes, eff.name)
			deleted[eff.name] = true
			continue
		}
		prev := writes[eff.name]
		if prev == nil && !deleted[eff.name] {
			prev = a.rows[eff.name]
		}
		delete(deleted, eff.name)
		if writes[eff.name] == nil {
			order = append(order, eff.name)
		}
		writes[eff.name] = applyEffect(prev, eff, plan.Core.Subscriptions[eff.name], now)
	}
	dirtyVer := map[string]uint64{}
	for name, v := range a.rowVer {
		if v != a.flushedVer[name] && writes[name] == nil && !deleted[name] && a.rows[name] != nil {
			r := *a.rows[name]
			writes[name] = &r
			order = append(order, name)
			dirtyVer[name] = v
		}
	}
	a.flushArmed = false
	a.mu.Unlock()

	if len(plan.Events) == 0 && len(writes) == 0 && len(deleted) == 0 {
		a.reply(group, plan)
		return
	}
	c := storage.Commit{Events: plan.Events, HeadOffset: plan.Head, LastAppendAt: itx.UnixMilli(now)}
	for _, name := range order {
		if w := writes[name]; w != nil {
			c.CursorUpserts = append(c.CursorUpserts, *w)
		}
	}
	for name := range deleted {
		c.CursorDeletes = append(c.CursorDeletes, name)
	}
	if plan.Core != a.core {
		b, err := json.Marshal(plan.Core)
		if err != nil {
			a.failAll(group, itx.Errorf(itx.EInternal, "encode core state: %v", err))
			return
		}
		c.KV = map[string][]byte{coreStateKey: b}
	}
	newSubscriptions := len(plan.Effects) > 0 && !a.alarmSet && len(plan.Core.Subscriptions) > 0
	var ephAdded, ephFreed int64
	for i := range plan.Events {
		if e := &plan.Events[i]; e.Ephemeral {
			ephAdded += int64(len(e.Type) + len(e.Payload) + len(e.Metadata))
		}
	}
	if ephAdded > 0 {
		if c.EvictEphemeralThrough, ephFreed, err = a.evictEphemeral(ctx, ephAdded); err != nil {
			a.failAll(group, itx.Errorf(itx.EInternal, "ephemeral eviction: %v", err))
			return
		}
	}

	start := time.Now()
	err = a.ensureCreated(ctx, now, len(plan.Events) > 0)
	if err == nil && len(plan.Events) > 0 && !a.stale {
		// The summary is refreshed on unload; a crash before then leaves this mark, and the
		// restarted server refreshes the summaries so marked (refreshStaleSummaries).
		if err = a.srv.dir.MarkSummaryStale(ctx, a.streamID); err == nil {
			a.stale = true
		}
	}
	if err == nil && newSubscriptions {
		// While a stream with subscriptions is loaded its alarm reads "due now", so a crash at
		// any point leaves the restarted server owing this stream a load.
		err = a.srv.dir.SetAlarm(ctx, a.streamID, itx.UnixMilli(now))
	}
	if err == nil {
		err = a.store.Commit(ctx, c)
	}
	if err != nil {
		a.srv.log.Error().Err(err).Str("path", a.ref.Path).Msg("group commit failed")
		failure := itx.Errorf(storage.ErrorCode(err), "append not committed: %v", err)
		for i := range plan.Replies {
			if plan.Replies[i].err == nil {
				plan.Replies[i] = appendReply{err: failure}
			}
		}
		a.reply(group, plan)
		return
	}
	if newSubscriptions {
		a.alarmSet = true
	}
	a.ephBytes += ephAdded - ephFreed
	if len(plan.Events) > 0 {
		m.CommitLatency.Observe(time.Since(start).Seconds())
		m.CommitEvents.Observe(float64(len(plan.Events)))
		m.CommitCalls.Observe(float64(len(group)))
		m.AppendedEvents.Add(float64(len(plan.Events)))
		var bytes int
		for i := range plan.Events {
			e := &plan.Events[i]
			bytes += len(e.Type) + len(e.Payload) + len(e.Metadata) + len(e.IdempotencyKey)
		}
		m.AppendedBytes.Add(float64(bytes))
	}

	// Publish: the new head, core state and cursor rows, then wake readers and deliverers.
	a.mu.Lock()
	if len(plan.Events) > 0 {
		a.head, a.lastAppendAt = plan.Head, itx.UnixMilli(now)
	}
	a.core = plan.Core
	for name := range deleted {
		delete(a.rows, name)
		delete(a.rowVer, name)
		delete(a.flushedVer, name)
	}
	for _, eff := range plan.Effects {
		if w := writes[eff.name]; w != nil && eff.kind != effectRemove {
			a.rows[eff.name] = w
			a.rowVer[eff.name]++
			a.flushedVer[eff.name] = a.rowVer[eff.name]
		}
	}
	for name, v := range dirtyVer {
		a.flushedVer[name] = v
	}
	close(a.changed)
	a.changed = make(chan struct{})
	close(a.progress)
	a.progress = make(chan struct{})
	a.mu.Unlock()

	a.reply(group, plan)
	for _, eff := range plan.Effects {
		switch eff.kind {
		case effectBorn, effectRemove:
			a.restartDeliverer(eff.name)
		}
	}
}

func (a *actor) reply(group []*appendReq, plan groupPlan) {
	m := a.srv.metrics
	for i, r := range group {
		reply := plan.Replies[i]
		if reply.err == nil {
			m.AppendCalls.WithLabelValues("ok").Inc()
		} else {
			m.AppendCalls.WithLabelValues(string(itx.ErrorCode(reply.err))).Inc()
		}
		m.AppendLatency.Observe(time.Since(r.queued).Seconds())
		r.reply <- reply
	}
}

// lookupKeys prefetches the committed events of every idempotency key the group uses.
func (a *actor) lookupKeys(ctx context.Context, group []*appendReq) (map[string]*itx.Event, error) {
	if a.store == nil {
		return nil, nil
	}
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
	if len(keys) == 0 {
		return nil, nil
	}
	found, err := a.store.EventsByKeys(ctx, keys)
	if err != nil {
		return nil, itx.Errorf(itx.EInternal, "append: %v", err)
	}
	return found, nil
}

// ensureCreated creates the stream on its first commit with events: the directory entry first,
// then the database (see storage.Directory.CreateStream for the crash window).
func (a *actor) ensureCreated(ctx context.Context, now time.Time, withEvents bool) error {
	if a.store != nil {
		return nil
	}
	if !withEvents {
		return errors.New("no stream database to write cursor state to")
	}
	createdAt := itx.UnixMilli(now)
	entry := storage.StreamEntry{StreamID: a.streamID, ProjectID: a.ref.ProjectID, Path: a.ref.Path, CreatedAt: createdAt}
	if err := a.srv.dir.CreateStream(ctx, entry); err != nil {
		return err
	}
	store, err := storage.CreateStream(ctx, a.srv.streamFile(a.streamID), storage.StreamMeta{
		StreamID: a.streamID, ProjectID: a.ref.ProjectID, Path: a.ref.Path, CreatedAt: createdAt,
	})
	if err != nil {
		return fmt.Errorf("create stream database: %w", err)
	}
	a.mu.Lock()
	a.store, a.createdAt = store, createdAt
	a.mu.Unlock()
	a.stale = true // created so
	return nil
}

func (a *actor) failAll(group []*appendReq, err error) {
	for _, r := range group {
		a.srv.metrics.AppendCalls.WithLabelValues(string(itx.ErrorCode(err))).Inc()
		r.reply <- appendReply{err: err}
	}
}

// touchRow records an in-memory change to a cursor row (a deliverer's ack or retry state) and
// arms a flush: cursor progress rides the next group commit or, when no append comes, a flush
// after CursorFlushDelay. Losing an unflushed ack to a crash only means redelivery, which
// at-least-once already allows. Called with a.mu held.
func (a *actor) touchRow(name string) {
	a.rowVer[name]++
	close(a.progress)
	a.progress = make(chan struct{})
	if !a.flushArmed {
		a.flushArmed = true
		a.srv.clock.AfterFunc(a.srv.cfg.CursorFlushDelay, func() {
			select {
			case a.flush <- struct{}{}:
			default:
			}
		})
	}
}

// view is a consistent snapshot of what readers need.
type view struct {
	store    *storage.Stream
	streamID string
	head     int64
	changed  <-chan struct{}
	info     streamTimes
	core     *coreState
}

type streamTimes struct{ createdAt, lastAppendAt int64 }

func (a *actor) view() view {
	a.mu.Lock()
	defer a.mu.Unlock()
	id := a.streamID
	if a.store == nil {
		id = "" // not created yet: a planned id is not an identity until it commits
	}
	return view{store: a.store, streamID: id, head: a.head, changed: a.changed,
		info: streamTimes{a.createdAt, a.lastAppendAt}, core: a.core}
}
