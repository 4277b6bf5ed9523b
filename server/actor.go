package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
	"github.com/rs/zerolog"
)

// maxGroupEvents bounds one group commit; requests beyond it wait for the next commit.
const maxGroupEvents = 20_000

// actor owns one loaded stream. Its goroutine (run) is the stream's only writer: it gathers
// queued inputs (appends, delivery outcomes, mounts, timer fires), hands them to the pure step
// and applies the effects step returns, in their documented order. Concurrent appenders share
// one group commit and one fsync. Readers use the store's reader pool beside it and read the
// state the actor last published.
type actor struct {
	srv *Server
	ref StreamRef

	reqs  chan *appendReq // appends, in commit order
	inbox chan *actorMsg  // everything else (pointers: a slot costs 8 bytes, not the whole message)
	quit  chan struct{}
	done  chan struct{}

	ready   chan struct{} // closed once load finished
	loadErr error

	// Registry fields, guarded by srv.mu.
	refs     int
	lastUsed time.Time
	drained  chan struct{} // set while a removal waits for refs to reach 0 (see release)

	// Owned by the run goroutine.
	st    *streamState
	store streamStore
	// unmade is the directory entry of this stream when it committed but making the store
	// failed (a full disk): the next creation makes the store under that entry rather than
	// inserting another for the same path.
	unmade *storage.StreamEntry
	// dropT retries dropping unmade after dropWait, while it cannot be dropped (still full).
	dropT    itx.Timer
	dropWait time.Duration
	// noteHead: this incarnation created the stream, and the directory does not yet hold a
	// head for it (see storage.Directory.NoteStreamHead).
	noteHead        bool
	deliverers      map[string]*deliverer
	pushes          sync.WaitGroup
	pending         []deliveryOutcome // outcomes of pushes that could not start
	recent          []itx.Event       // the last commit's events (see view.recent)
	failedReaders   []readerOp        // the reader operations of a step whose commit failed
	failedSchedules []scheduleOp      // the schedule operations of a step whose commit failed
	wakeT           itx.Timer
	wakeAt          int64 // when the earliest wait the last step saw comes due (epoch ms; 0: none)
	wakeSeq         int64 // counts the wakeT armed; wakeFired is the last that fired
	wakeFired       atomic.Int64
	flushArmed      bool
	failedCommits   int       // in a row: the cursor flush backs off while storage refuses (flushDelay)
	limitLogged     bool      // a refusal for the project's stream limit was logged at info
	failLoggedAt    time.Time // when a failed step was last logged (reloadAfter: once a minute in a row)
	lastSweep       time.Time // of ephemeral rows
	ephBytes        int64     // held in ephemeral rows (see Config.EphemeralBufferBytes)
	lastRetention   time.Time // the retention policy last applied (applyRetention)
	autoTrimming    bool      // a trim of the retention policy is under way
	trims           int       // trims under way (their chunks queued), the retention policy's included
	vacuumQueued    bool      // a vacuum turn is queued (vacuumSoon)
	// alarmsWaiting are the processor alarm fires (by owner) refused at the project's share of
	// the held streams (pinDelivery): each stays firing (procFiring) and is tried again at the
	// next step, which the share's release ticks. Actor goroutine only.
	alarmsWaiting map[string]bool
	// trimmable is the size (storage.EventSize) of the events a trim could delete, for the
	// retention policy's maxBytes: measured once it is needed, a chunk at a time between steps
	// (sizeScan, while it runs: the events through its upTo are being read, the commits add
	// theirs above it), then kept by the commits and trims (trimmableKnown). Actor goroutine only.
	trimmable      int64
	trimmableKnown bool
	sizeScan       *sizeScan
	// usage is the project's disk usage (Config.MaxProjectBytes; nil: no quota), sinceStat the
	// bytes committed since this stream's files were last measured for it (noteSize).
	usage     *projectUsage
	sinceStat int64
	retT      itx.Timer // when the retention policy's age limit has an event to trim (armRetention)
	retAt     time.Time // what retT waits for: it sleeps at most alarmSleep, then reads the clock again
	// pendingAudits are the audit records of the stream's own changes not yet known to be in
	// /audit, as committed under auditPendingKey.
	pendingAudits []storage.AuditRecord
	forgetLater   []string // ids of pendingAudits in /audit, forgotten once the vacuum is done (forgetAudit)
	loadMounted   []string // the project's mounts when loaded: the first step's presence signal
	// secretRefs is the webhook secret references of the committed catalog: the directory's
	// secret_uses rows of this stream hold at least these (see apply).
	secretRefs map[string]bool
	dctx       context.Context
	dcancel    context.CancelFunc

	conns     map[string]*Connection // open connections by key
	connSeq   int
	connOrder []*Connection                  // conns sorted by key
	connList  atomic.Pointer[publishedConns] // what the live engine reads of them
	liveP     atomic.Pointer[liveEngine]
	liveCount atomic.Int64 // counted live-state subscribers (Config.MaxLiveSubscribersPerStream)
	deleted   atomic.Bool  // the stream is being deleted (alone, or with its project)
	// deletedWhy says why, to its connections and live views: set before deleted, read after.
	deletedWhy string
	// holding: an offset-acking subscription holds events delivered and unconfirmed, which an
	// unload would forget and deliver again on the next load: the idle sweep keeps it loaded.
	holding    atomic.Bool
	procLiveMu sync.Mutex // creates processor live engines (procLiveP)
	procLiveP  atomic.Pointer[map[string]*liveEngine]

	// Processors, opened off the actor's goroutine on first need (see processors.go).
	procMu     sync.Mutex
	procs      itx.StreamProcessors
	procClosed bool
	procSeek   map[string]int64 // rewinds in progress: the seek epoch their commits carry
	rewindMu   sync.Mutex       // one rewind taken at a time (takeRewind)
	failedProc []procOp         // the processor writes of a step whose commit failed

	mu      sync.Mutex // guards pub and changed
	pub     view
	changed chan struct{} // closed and replaced at every publish
}

// actorMsg is one non-append input.
type actorMsg struct {
	outcome *deliveryOutcome
	mounted string
	// unmounted: a capability or processor host's mount went away (a presence token).
	unmounted string
	flush     bool
	tick      bool
	clockBack int64      // ms: see stepInput.clockBack
	settle    chan<- int // answered after the step with the number of pushes in flight
	// written: answered once the step that flushes the cursor rows has committed them or failed
	// to (a disk refusing them: the barrier answers all the same, see writeRows). A barrier asks
	// it before answering with a cursor (see Server.WaitUntilProcessed).
	written  chan<- struct{}
	reader   *readerOp
	proc     *procOp
	schedule *scheduleOp

	// Connections and live state: the actor's registries, not step inputs (nothing durable).
	openConn  *Connection
	connReply chan<- error
	closeConn *Connection
	live      *liveSubscriber
	removed   bool // the stream is being deleted: close its connections as streamRemoved
	// stopRemotes: the stream is about to be deleted alone: its remote processors' hosts are
	// told to end their sessions of it (a project's deletion ends the hosts' sessions anyway).
	stopRemotes bool
	// dropUnmade: try again to drop the entry of a creation whose store could not be made.
	dropUnmade bool
	// freeze: a backup takes its instant (backup.go).
	freeze *freezeReq
	// trim: Stream.trim, one chunk at a time (stream_trim.go); retention: setRetention.
	trim      *trimReq
	retention *retentionReq
	// retentionDue: the retention policy's age limit has an event to trim (armRetention).
	retentionDue bool
	// vacuum: a turn giving the stream's free space back (vacuumSoon).
	vacuum bool
	// auditDone: a pending audit record of the stream's own (auditPendingKey) is in /audit.
	auditDone string
}

func newActor(s *Server, ref StreamRef) *actor {
	a := &actor{
		srv: s, ref: ref,
		reqs:       make(chan *appendReq, 1024),
		inbox:      make(chan *actorMsg, 64),
		quit:       make(chan struct{}),
		done:       make(chan struct{}),
		ready:      make(chan struct{}),
		changed:    make(chan struct{}),
		deliverers: map[string]*deliverer{},
		conns:      map[string]*Connection{},
		procSeek:   map[string]int64{},
	}
	a.dctx, a.dcancel = context.WithCancel(s.base)
	return a
}

// post hands the actor an input; it gives up once the actor has stopped.
func (a *actor) post(m actorMsg) {
	select {
	case a.inbox <- &m:
	case <-a.done:
	}
}

// ended is why a call holding this incarnation must stop once its deliverers' context ended
// while the call still held it: the server shutting down, or the stream being deleted (an
// idle unload never takes a stream that is held).
func (a *actor) ended() error {
	if a.srv.base.Err() != nil {
		return itx.Errorf(itx.EUnavailable, "the server is shutting down")
	}
	return itx.Errorf(itx.ENotFound, "stream %s was deleted", a.ref.Path)
}

// load opens the stream's database if the stream exists and restores its state.
func (a *actor) load() error {
	ctx := context.Background()
	now := a.srv.clock.Now()
	a.st = newStreamState(newTokenBucket(a.srv.cfg.BreakerBurst, a.srv.cfg.BreakerRefillPerMinute, now))
	entry, err := a.srv.dir.Stream(ctx, a.ref.ProjectID, a.ref.Path)
	if err != nil {
		return itx.Errorf(itx.EUnavailable, "load stream %s: %v", a.ref.Path, err)
	}
	if a.usage, err = a.srv.usage(ctx, a.ref.ProjectID); err != nil {
		return itx.Errorf(itx.EUnavailable, "load stream %s: %v", a.ref.Path, err)
	}
	a.sinceStat = usageStatBytes // measured at the first commit
	if entry != nil {
		a.srv.backupClaim(entry.StreamID) // a backup that owes this stream holds it before any write
		store, err := a.srv.backend.Open(ctx, entry.StreamID)
		if err == nil && store == nil && entry.Born {
			// The directory records the stream's first commit, so its store held it: the file
			// was deleted, truncated or lies on a file system not mounted. Made anew it would
			// answer an empty log and reissue acknowledged offsets from 1.
			return a.srv.storeLost(*entry)
		}
		if err == nil && store == nil {
			// The directory entry committed but the process died before the store was made:
			// nothing was ever acknowledged on this stream, so it starts empty.
			store, err = a.srv.backend.Create(ctx, storage.StreamMeta{
				StreamID: entry.StreamID, ProjectID: entry.ProjectID, Path: entry.Path, CreatedAt: entry.CreatedAt,
			})
		}
		if err != nil {
			a.srv.noteDamaged(entry.ProjectID, entry.Path, entry.StreamID, err)
			if storage.Damaged(err) {
				return &unreadableStore{itx.Errorf(itx.EUnavailable, "load stream %s: %v: the file is damaged; restore it from a backup (README, Damaged storage)", a.ref.Path, err)}
			}
			if code := loadFailureCode(err); code != itx.EUnavailable {
				return itx.Errorf(code, "load stream %s: %v", a.ref.Path, err) // a full disk: not the file's fault
			}
			return &unreadableStore{itx.Errorf(itx.EUnavailable, "load stream %s: %v", a.ref.Path, err)}
		}
		a.srv.noteOpened(store, a.ref.ProjectID, a.ref.Path, entry.StreamID)
		a.store = store
		if err := a.restore(ctx); err != nil {
			store.Close()
			a.srv.noteDamaged(entry.ProjectID, entry.Path, entry.StreamID, err)
			return &unreadableStore{itx.Errorf(itx.EUnavailable, "load stream %s: %v", a.ref.Path, err)}
		}
		// Served from its database again (restored, or its mode mended): no longer unavailable
		// in Streams.list or itx_streams_unavailable, and a new damage is logged anew.
		a.srv.damaged.Delete(entry.StreamID)
		a.st.summaryOld = entry.SummaryStale
		a.secretRefs = secretRefsOf(a.st.core)
		// Audit records a crash or a shutdown left pending (auditPendingKey): appended below, then
		// forgotten. While any is pending the stream owns its alarm (due now), so the unload
		// records it due again if the append did not happen, and clears it once it did.
		if raw, err := a.store.KV(ctx, auditPendingKey); err != nil {
			a.srv.log.Warn().Err(err).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg("pending audit records not read (read again at the next load)")
		} else if raw != nil {
			_ = json.Unmarshal(raw, &a.pendingAudits)
		}
		if len(a.st.core.Subscriptions) > 0 || len(a.st.scheduled) > 0 || a.st.retention.MaxAgeMs > 0 || len(a.pendingAudits) > 0 {
			// While loaded, the alarm reads "due now" (a crash leaves the stream owed a load); on
			// unload it records the next retry, or when its retention policy next trims. Whatever
			// woke this incarnation, it owns the alarm.
			if err := a.srv.dir.SetAlarm(ctx, entry.StreamID, itx.UnixMilli(now)); err == nil {
				a.st.alarmSet = true
			} else if storage.ErrorCode(err) == itx.EResourceExhausted {
				// A full disk: the stream still loads, to be read and to deliver what it owes.
				// Its alarm stays as recorded (due, or due later: a crash still leaves a load
				// owed), and the next commit sets it (alarmSet is false), once space returns.
				a.srv.log.Warn().Err(err).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg("the stream's alarm is not set to now on load (the disk is full)")
			} else {
				store.Close()
				return itx.Errorf(itx.EUnavailable, "load stream %s: %v", a.ref.Path, err)
			}
		}
		a.sweepEphemeral()
		if a.ephBytes, err = store.EphemeralBytes(ctx); err != nil {
			store.Close()
			return itx.Errorf(itx.EUnavailable, "load stream %s: %v", a.ref.Path, err)
		}
	}
	for _, m := range a.srv.Mounts(a.ref.ProjectID) {
		a.loadMounted = append(a.loadMounted, presence(m.Scope, m.Name))
	}
	a.loadMounted = append(a.loadMounted, a.srv.processorPresence(a.ref.ProjectID)...)
	if len(a.pendingAudits) > 0 {
		go a.flushAudits(slices.Clone(a.pendingAudits))
	}
	a.publish(true)
	return nil
}

// loadFailureCode is the code of a load whose store could not be opened or made: resourceExhausted
// when the disk is full (the call succeeds once space returns), unavailable otherwise.
func loadFailureCode(err error) itx.Code {
	if storage.ErrorCode(err) == itx.EResourceExhausted {
		return itx.EResourceExhausted
	}
	return itx.EUnavailable
}

// restore replaces the durable part of the state with what the store holds, keeping the
// generation counter so outcomes of pushes started before are fenced. It runs on load and after
// a failed commit (memory must never run ahead of disk).
func (a *actor) restore(ctx context.Context) error {
	st, err := loadState(ctx, a.store, a.reduceContext(), a.srv.clock.Now(), a.srv.log.Warn)
	if err != nil {
		return err
	}
	prev := a.st
	st.bucket, st.nextGen, st.alarmSet, st.summaryOld, st.created = prev.bucket, prev.nextGen, prev.alarmSet, prev.summaryOld, true
	st.procFiring = prev.procFiring
	for name := range st.core.Subscriptions {
		st.subs[name] = st.newRuntime()
	}
	a.st = st
	return nil
}

// loadState reads a stream's state from its store: meta, core state (re-reduced from offset 1 when
// the checkpoint is from another version, and checkpointed again) and cursor rows reconciled with
// the catalog. The simulation uses it to "crash": drop memory, reload from disk.
func loadState(ctx context.Context, store streamStore, rc reduceContext, now time.Time, warn func() *zerolog.Event) (*streamState, error) {
	st := newStreamState(nil)
	meta, err := store.Meta(ctx)
	if err != nil {
		return nil, err
	}
	st.streamID, st.head, st.lastAppendAt, st.createdAt, st.created = meta.StreamID, meta.HeadOffset, meta.LastAppendAt, meta.CreatedAt, true
	st.trimmed = meta.TrimmedThrough
	if raw, err := store.KV(ctx, retentionKey); err != nil {
		return nil, err
	} else if raw != nil {
		_ = json.Unmarshal(raw, &st.retention) // a policy that does not decode keeps nothing from being read
	}
	raw, err := store.KV(ctx, coreStateKey)
	if err != nil {
		return nil, err
	}
	if core, ok := decodeCoreState(raw); ok {
		st.core = core
	} else {
		if raw != nil {
			warn().Str("project", meta.ProjectID).Str("path", meta.Path).Msg("core state checkpoint is from another version: re-reducing from offset 1")
		}
		if st.core, err = rereduce(ctx, store, rc, st.head, warn); err != nil {
			return nil, err
		}
		// The checkpoint only saves the next load this replay: failing to write it (a full disk)
		// must not fail the load, or a restore after a failed commit would leave memory ahead of
		// the disk.
		b, _ := json.Marshal(st.core)
		if err := store.Commit(ctx, storage.Commit{KV: map[string][]byte{coreStateKey: b}}); err != nil {
			warn().Err(err).Str("project", meta.ProjectID).Str("path", meta.Path).Msg("could not write the core state checkpoint: the next load re-reduces")
		}
	}
	if raw, err := store.KV(ctx, procAlarmKey); err != nil {
		return nil, err
	} else if raw != nil {
		st.procAlarms = decodeProcAlarms(raw)
	}
	if st.procKVKeys, st.procKVBytes, err = store.KVUsage(ctx, procKVPrefix); err != nil {
		return nil, err
	}
	readers, err := store.Readers(ctx)
	if err != nil {
		return nil, err
	}
	if err := loadScheduled(ctx, store, st); err != nil {
		return nil, err
	}
	for _, r := range readers {
		st.readers[r.Name] = r
	}
	if st.born, err = bornIn(ctx, store, st.head, len(readers)); err != nil {
		return nil, err
	}
	rows, err := store.CursorRows(ctx)
	if err != nil {
		return nil, err
	}
	for i := range rows {
		r := rows[i]
		st.rows[r.Name] = &r
	}
	// The rows and the catalog commit together, so this only repairs a rebuilt catalog: a row
	// per subscription at its birth epoch, no other.
	var c storage.Commit
	for name := range st.rows {
		if st.core.Subscriptions[name] == nil {
			c.CursorDeletes = append(c.CursorDeletes, name)
			delete(st.rows, name)
		}
	}
	for name, entry := range st.core.Subscriptions {
		if r := st.rows[name]; r != nil && r.ConfiguredAtOffset == entry.ConfiguredAtOffset {
			r.InFlightDeadlineAt, r.InFlightConnectionGeneration = 0, 0 // no push survives a load
			continue
		}
		if r := st.rows[name]; r != nil && entry.ReconfiguredAtOffset != 0 && r.ConfiguredAtOffset < entry.ConfiguredAtOffset {
			// A changed config keeps the cursor under a new epoch; a row written before the
			// catalog learned that (an older binary) keeps its cursor and takes the epoch.
			r.ConfiguredAtOffset, r.CursorChangedAtOffset = entry.ConfiguredAtOffset, entry.ConfiguredAtOffset
			r.InFlightDeadlineAt, r.InFlightConnectionGeneration = 0, 0
			c.CursorUpserts = append(c.CursorUpserts, *r)
			continue
		}
		r := bornRow(entry, now)
		st.rows[name] = r
		c.CursorUpserts = append(c.CursorUpserts, *r)
	}
	if len(c.CursorDeletes) > 0 || len(c.CursorUpserts) > 0 {
		if err := store.Commit(ctx, c); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// rereduce rebuilds the core state from the log.
func rereduce(ctx context.Context, store streamStore, rc reduceContext, head int64, warn func() *zerolog.Event) (*coreState, error) {
	st := newCoreState()
	rc.checkURL = nil     // a rebuild replays history; today's egress policy does not rewrite it
	rc.nameTaken = nil    // nor do today's connections and readers
	rc.maxConfigBytes = 0 // nor today's bound on a config's size
	rc.parked = func(string) bool { return true }
	for after := int64(0); after < head; {
		page, err := store.Events(ctx, storage.Query{After: after, UpTo: head, Limit: itx.MaxPageLimit, MaxBytes: itx.MaxPageBytes})
		if err != nil {
			return nil, err
		}
		if len(page) == 0 {
			break
		}
		for i := range page {
			e := &page[i]
			rc.head, rc.authority = e.Offset-1, authCore // history is already accepted: replay it
			if _, err := st.reduce(e, &rc); err != nil {
				warn().Err(err).Int64("offset", e.Offset).Msg("re-reduction skipped an event")
			}
		}
		after = page[len(page)-1].Offset
	}
	return st, nil
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
func applyEffect(prev *storage.CursorRow, eff cursorEffect, now time.Time) *storage.CursorRow {
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
		r.DeliveredOffset = 0 // what was delivered before the seek is not confirmed after it
		// A seek neither un-halts nor un-parks (resume and a mount do): the row goes on saying
		// why it waits. A halted row keeps the retry block as the halt left it (only the try in
		// flight, fenced by the new seek epoch, is forgotten); a parked one starts its ladder
		// over, as an active one does.
		if r.Status == storage.StatusHalted {
			r.NextAttemptAt, r.InFlightDeadlineAt, r.InFlightConnectionGeneration = 0, 0, 0
			break
		}
		why := r.LastError
		clearRetry()
		if r.Status == storage.StatusParked {
			r.LastError = why
		}
	case effectHalt:
		// The retry block stays as the ladder left it, so describe shows how the halt came
		// about; only what schedules another try goes.
		r.Status = storage.StatusHalted
		r.NextAttemptAt, r.InFlightDeadlineAt, r.InFlightConnectionGeneration = 0, 0, 0
		r.Attempt = eff.tries
		r.LastError = truncate(eff.err, itx.MaxCursorErrorLength)
	case effectResume:
		r.Status = storage.StatusActive
		clearRetry()
	case effectRevive:
		// Delivered now, the ladder's count kept: once it halted, a revival that fails halts
		// again at once, so the breaker alone paces a crash loop (seed 002: about four wakes a
		// day), not the ladder's 15 tries over two hours after each revival. A success clears it.
		r.Status = storage.StatusActive
		r.NextAttemptAt = 0
		r.FailingEventOffset, r.FailingEventAttempt = 0, 0
	case effectReconfigure:
		r.ConfiguredAtOffset, r.CursorChangedAtOffset = eff.epoch, eff.epoch
		r.DeliveredOffset = 0 // a new receiver confirms only what it was given
		r.Status = storage.StatusActive
		clearRetry()
	}
	r.UpdatedAt = stamp(now)
	return &r
}

// truncate cuts s to at most n bytes, on a character boundary: a cut inside a multi-byte
// character would leave invalid UTF-8 in a cursor row or a record.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// sweepEphemeral deletes ephemeral rows past their retention: on load, on unload and as a loaded
// stream commits. Offsets are not reissued: the head lives in stream_meta. The retention floor
// is the lowest registered reader's checkpoint: rows after it stay until that reader moves past
// them (or the ephemeral buffer's bound evicts them, oldest first). Subscriptions do not count:
// they never receive ephemeral events, their cursors pass them as watermarks.
func (a *actor) sweepEphemeral() {
	if a.store == nil {
		return
	}
	a.lastSweep = a.srv.clock.Now()
	before := itx.UnixMilli(a.lastSweep.Add(-a.srv.cfg.EphemeralRetention))
	n, err := a.store.DeleteEphemeral(context.Background(), a.st.retentionFloor(), before)
	if err == nil && n > 0 {
		a.ephBytes, err = a.store.EphemeralBytes(context.Background()) // what the sweep freed
	}
	if err != nil {
		a.srv.log.Warn().Err(err).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg("ephemeral sweep failed")
	} else if n > 0 {
		a.srv.log.Debug().Int64("deleted", n).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg("swept ephemeral events")
		a.vacuumSoon()
	}
}

// retentionFloor is the offset through which expired ephemeral rows may be swept: the head, or
// the lowest registered reader's checkpoint below it.
func (st *streamState) retentionFloor() int64 {
	floor := st.head
	for _, r := range st.readers {
		floor = min(floor, r.Checkpoint)
	}
	return floor
}

// unload stops the goroutine and closes the database. Only called with no references held and
// the deliverers' context cancelled.
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
	a.apply(stepInput{mounted: a.loadMounted, woken: a.wokenID(), newVersion: a.srv.procVersionChanged && a.store != nil})
	a.loadMounted = nil
	a.applyRetention(a.srv.clock.Now())
	a.vacuumSoon() // what an unload or a crash left of a vacuum
	for {
		var in stepInput
		select {
		case r := <-a.reqs:
			in.appends = append(in.appends, r)
		case mp := <-a.inbox:
			m := *mp
			if a.handle(m) {
				continue
			}
			in.add(m)
		case <-a.quit:
			a.stop()
			return
		}
		a.gather(&in)
		a.apply(in)
	}
}

// gather adds whatever else is already queued to in, up to one group commit's worth of events.
func (a *actor) gather(in *stepInput) {
	events := 0
	for _, r := range in.appends {
		events += len(r.inputs)
	}
	for {
		select {
		case mp := <-a.inbox:
			m := *mp
			a.take(in, m)
			continue
		default:
		}
		if events >= maxGroupEvents {
			return
		}
		select {
		case r := <-a.reqs:
			in.appends = append(in.appends, r)
			events += len(r.inputs)
		default:
			return
		}
	}
}

// handle takes the actor's own registry messages (connections, live state); false for a step input.
func (a *actor) handle(m actorMsg) bool {
	switch {
	case m.openConn != nil:
		m.connReply <- a.register(m.openConn)
	case m.closeConn != nil:
		a.unregister(m.closeConn)
	case m.live != nil && m.live.engine != nil:
		m.live.engine.attach(m.live)
	case m.live != nil:
		a.liveEngine().attach(m.live)
	case m.freeze != nil:
		a.holdForBackup(m.freeze)
	case m.dropUnmade:
		a.dropT = nil
		if a.store == nil {
			a.dropUnmade(context.Background())
		}
	case m.trim != nil:
		a.trimChunk(m.trim)
	case m.retention != nil:
		a.setRetention(m.retention)
	case m.retentionDue:
		a.retT = nil
		if now := a.srv.clock.Now(); now.Before(a.retAt) {
			a.armRetentionAt(a.retAt) // not yet: the timer slept its alarmSleep
		} else if a.store != nil {
			a.applyRetention(now)
		}
	case m.vacuum:
		a.vacuumChunk()
	case m.auditDone != "":
		a.forgetAudit(m.auditDone)
	case m.stopRemotes:
		for name, d := range a.deliverers {
			if d.remoteContract != "" {
				a.stopRemote(d.remoteScope, d.remoteContract, name)
			}
		}
	case m.removed:
		a.deleted.Store(true) // its live views hear streamRemoved as they end
		for _, c := range a.conns {
			c.Close(CloseStreamRemoved, a.deletedReason())
		}
	default:
		return false
	}
	return true
}

// take routes one inbox message: the actor's own registries, or the step's input.
func (a *actor) take(in *stepInput, m actorMsg) {
	if !a.handle(m) {
		in.add(m)
	}
}

func (in *stepInput) add(m actorMsg) {
	switch {
	case m.settle != nil:
		in.settles = append(in.settles, m.settle)
	case m.written != nil:
		in.flush = true
		in.written = append(in.written, m.written)
	case m.reader != nil:
		in.readers = append(in.readers, *m.reader)
	case m.proc != nil:
		in.procOps = append(in.procOps, *m.proc)
	case m.schedule != nil:
		in.schedules = append(in.schedules, *m.schedule)
	case m.outcome != nil:
		in.outcomes = append(in.outcomes, *m.outcome)
	case m.mounted != "":
		in.mounted = append(in.mounted, m.mounted)
	case m.unmounted != "":
		in.unmounted = append(in.unmounted, m.unmounted)
	case m.flush:
		in.flush = true
	case m.clockBack > 0:
		in.clockBack = max(in.clockBack, m.clockBack)
	}
}

// stop ends the actor: pushes are cancelled and their outcomes taken, the last cursor progress
// is written, and the database closes.
func (a *actor) stop() {
	a.dcancel()
	a.closeProcessors()
	finished := make(chan struct{})
	go func() { a.pushes.Wait(); close(finished) }()
	in := stepInput{final: true}
	for waiting := true; waiting; {
		select {
		case mp := <-a.inbox:
			m := *mp
			a.take(&in, m)
		case <-finished:
			waiting = false
		}
	}
	for {
		select {
		case mp := <-a.inbox:
			m := *mp
			a.take(&in, m)
			continue
		default:
		}
		break
	}
	if a.wakeT != nil {
		a.wakeT.Stop()
	}
	if a.retT != nil {
		a.retT.Stop()
	}
	if a.dropT != nil {
		a.dropT.Stop()
	}
	if a.store != nil {
		a.apply(in) // the last acks
	}
	a.close()
}

func (a *actor) env() stepEnv {
	return stepEnv{
		rc: a.reduceContext(),
		lookupKeys: func(keys []string) (map[string]*itx.Event, error) {
			if a.store == nil || len(keys) == 0 {
				return nil, nil
			}
			found, err := a.store.EventsByKeys(context.Background(), keys)
			if err != nil {
				return nil, itx.Errorf(itx.EInternal, "append: %v", err)
			}
			return found, nil
		},
		loadKV: func(key string) ([]byte, error) {
			if a.store == nil {
				return nil, nil
			}
			return a.store.KV(context.Background(), key)
		},
		maxProcKVKeys: a.srv.cfg.MaxProcessorKVKeys,
		maxScheduled:  a.srv.cfg.MaxScheduledPerStream,
		loadScheduled: func(keys []string) (map[string][]byte, error) {
			if a.store == nil {
				return nil, nil
			}
			return a.store.ScheduledByKeys(context.Background(), keys)
		},
		maxProcKVBytes:  a.srv.cfg.MaxProcessorKVBytes,
		random:          a.srv.random,
		flushDelay:      a.srv.cfg.CursorFlushDelay,
		deliveryTimeout: a.srv.cfg.DeliveryTimeout,
		batchLimits: func(name string) int {
			if e := a.st.core.Subscriptions[name]; e != nil {
				n, _ := e.Config.BatchLimits()
				return n
			}
			return 1
		},
		mountedNow: a.mountedNow,
		room:       a.room,
	}
}

// room is nil while an append may add events: the data directory's disk above its reserve, the
// project under its quota.
func (a *actor) room() error {
	if err := a.srv.disk.room(); err != nil {
		return err
	}
	return a.usage.room(a.srv.cfg.MaxProjectBytes)
}

// mountedNow is the generation of what an itx-call or remote processor-wake subscription's
// receiver is mounted as now (0: nothing). A mount is registered before its presence signal is
// sent, so a step that reads 0 here is followed by that signal.
func (a *actor) mountedNow(entry *catalogEntry) uint64 {
	switch {
	case entry.Kind() == itx.KindITXCall:
		if m := a.srv.receiver(a.ref.ProjectID, entry.mountScope(), entry.Config.Receiver.Capability); m != nil {
			return m.gen
		}
	case entry.Kind() == itx.KindProcessorWake && !isInProcess(entry):
		if m := a.srv.remoteHost(a.ref.ProjectID, entry.mountScope(), entry.Config.ProcessorContract()); m != nil {
			return m.gen
		}
	}
	return 0
}

func (a *actor) reduceContext() reduceContext {
	return reduceContext{
		path: a.ref.Path, projectID: a.ref.ProjectID, maxSubs: a.srv.cfg.MaxSubscriptions,
		maxReaders: a.srv.cfg.MaxReadersPerStream, maxConfigBytes: a.srv.cfg.MaxSubscriptionConfigBytes,
		checkURL:  a.srv.egress.checkURL,
		compile:   func(src string) error { _, err := CompileJSONata(src); return err },
		nameTaken: a.nameTaken,
		parked: func(name string) bool {
			r := a.st.rows[name]
			return r != nil && r.Status == storage.StatusParked
		},
	}
}

// nameTaken says what other than a subscription holds name on this stream: an open connection
// or a registered reader. It runs on the actor's goroutine (inside a step).
func (a *actor) nameTaken(name string) string {
	if a.conns[name] != nil {
		return "an open connection"
	}
	if a.st != nil {
		if _, ok := a.st.readers[name]; ok {
			return "a registered reader"
		}
	}
	return ""
}

// apply runs one step and carries out its effects in their documented order.
func (a *actor) apply(in stepInput) {
	ctx := context.Background()
	now := a.srv.clock.Now()
	m := a.srv.metrics
	in.outcomes = append(a.pending, in.outcomes...)
	a.pending = nil
	if in.flush {
		a.flushArmed = false
	}
	// A stream that stays loaded sweeps as it goes, a few times per retention period, before
	// the group commits: whoever sees the group acknowledged sees the sweep done.
	if len(in.appends) > 0 && a.store != nil && now.Sub(a.lastSweep) >= a.srv.cfg.EphemeralRetention/4 {
		a.sweepEphemeral()
	}
	if len(in.appends) > 0 && now.Sub(a.lastRetention) >= retentionEvery {
		a.applyRetention(now) // its chunks run after this step
	}
	if a.st.streamID == "" {
		a.st.streamID = newStreamID() // an identity once the first commit creates the stream
	}
	a.failedReaders = in.readers // answered with the failure if this step does not commit
	a.failedProc = in.procOps
	a.failedSchedules = in.schedules
	eff, err := step(a.st, in, now, a.env())
	a.holding.Store(a.st.holdsUnconfirmed())
	if err != nil {
		a.reloadAfter(in.appends, err)
		a.answerSettles(in.settles)
		answerWritten(in.written)
		return
	}
	m.LateAcks.Add(float64(eff.lateOutcomes))
	for _, kind := range eff.failedKinds {
		m.DeliveryFailures.WithLabelValues(kind).Inc()
	}

	// 1-2. Directory marks, then the one commit.
	if eff.hasWrites() {
		var ephAdded, ephFreed int64
		for i := range eff.commit.Events {
			if e := &eff.commit.Events[i]; e.Ephemeral {
				ephAdded += int64(len(e.Type) + len(e.Payload) + len(e.Metadata))
			}
		}
		start := time.Now()
		err := a.ensureCreated(ctx, eff.createStream)
		// A secret this commit's catalog references is recorded as used before the commit, so
		// no committed reference is ever without its row (see collectSecrets).
		var refs map[string]bool
		if eff.coreChanged {
			refs = secretRefsOf(a.st.core)
			if added := refDiff(refs, a.secretRefs); err == nil && len(added) > 0 {
				err = a.srv.dir.AddSecretUses(ctx, a.ref.ProjectID, a.st.streamID, added)
			}
		}
		if err == nil && ephAdded > 0 {
			eff.commit.EvictEphemeralThrough, ephFreed, err = a.evictEphemeral(ctx, ephAdded)
		}
		if err == nil && eff.markStale && !a.st.summaryOld { // ensureCreated marks a new stream stale itself
			// The summary is refreshed on unload; a crash before then leaves this mark, and the
			// restarted server refreshes the summaries so marked (refreshStaleSummaries).
			if err = a.srv.dir.MarkSummaryStale(ctx, a.st.streamID); err == nil {
				a.st.summaryOld = true
			}
		}
		if err == nil && eff.alarmNow {
			// While a stream with subscriptions is loaded its alarm reads "due now", so a crash
			// at any point leaves the restarted server owing this stream a load.
			if err = a.srv.dir.SetAlarm(ctx, a.st.streamID, itx.UnixMilli(now)); err == nil {
				a.st.alarmSet = true
			}
		}
		if err == nil {
			err = a.store.Commit(ctx, eff.commit)
		}
		if err != nil {
			code := itx.ErrorCode(err)
			if code == itx.EInternal {
				code = storage.ErrorCode(err)
			}
			if !errors.As(err, new(streamLimitError)) { // the project's stream limit refused a client: no commit failed
				m.CommitFailures.WithLabelValues(string(code)).Inc()
				a.failedCommits++
			}
			a.reloadAfter(in.appends, fmt.Errorf("commit: %w", err))
			a.answerSettles(in.settles)
			answerWritten(in.written)
			return
		}
		if a.failedCommits > 0 && !a.failLoggedAt.IsZero() {
			a.srv.log.Info().Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Int("failedInARow", a.failedCommits).
				Msg("the stream's commits succeed again")
		}
		a.failedCommits, a.failLoggedAt = 0, time.Time{}
		if a.trimmableKnown || a.sizeScan != nil {
			for i := range eff.commit.Events {
				if e := &eff.commit.Events[i]; storage.Trimmable(e) {
					a.trimmable += storage.EventSize(e)
				}
			}
		}
		if eff.born {
			a.noteHead = true
		}
		if a.noteHead && a.st.born {
			// The stream's first commit: the directory lists it from now on (its summary is
			// written at unload, which a full disk may refuse). Tried again at the next commit.
			if err := a.srv.dir.NoteStreamHead(ctx, a.st.streamID, a.st.head, a.st.lastAppendAt); err == nil {
				a.noteHead = false
			}
		}
		a.ephBytes += ephAdded - ephFreed
		if eff.coreChanged {
			// After the commit: a secret the catalog no longer references (its subscription
			// removed, or reconfigured without it) loses this stream's row, and is deleted if no
			// other stream references it. A crash before this leaves the row, and the restarted
			// server rewrites this (stale) stream's rows from its catalog.
			if dropped := refDiff(a.secretRefs, refs); len(dropped) > 0 {
				if err := a.srv.dir.RemoveSecretUses(ctx, a.st.streamID, dropped); err != nil {
					a.srv.log.Warn().Err(err).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg("webhook secret uses not removed")
				} else {
					a.srv.collectSecrets(ctx, a.ref.ProjectID, dropped)
				}
			}
			a.secretRefs = refs
		}
		if n := len(eff.commit.Events); n > 0 {
			m.CommitLatency.Observe(time.Since(start).Seconds())
			m.CommitEvents.Observe(float64(n))
			m.CommitCalls.Observe(float64(len(in.appends)))
			m.AppendedEvents.Add(float64(n))
			bytes := 0
			for i := range eff.commit.Events {
				e := &eff.commit.Events[i]
				bytes += len(e.Type) + len(e.Payload) + len(e.Metadata) + len(e.IdempotencyKey)
			}
			m.AppendedBytes.Add(float64(bytes))
			a.srv.disk.wrote(2 * int64(bytes)) // the log's frame, then the database's page
			a.noteSize(int64(bytes), false)
		}
	}

	a.failedReaders, a.failedProc, a.failedSchedules = nil, nil, nil
	if len(in.procOps) > 0 || eff.coreChanged {
		a.st.forgetRemovedProcs() // after the commit: what is forgotten is on disk
	}
	if eff.recountProcKV && a.store != nil {
		if keys, bytes, err := a.store.KVUsage(ctx, procKVPrefix); err == nil {
			a.st.procKVKeys, a.st.procKVBytes = keys, bytes
		}
	}
	if len(eff.commit.KVDeletePrefixes) > 0 {
		a.vacuumSoon() // a processor's records deleted with it: maybe many pages
	}
	a.reportLadder(eff.ladder)
	// 3. Publish (and wake connections and live state). 4. Replies.
	prevHead := a.view().head
	if len(eff.commit.Events) > 0 {
		a.recent = eff.commit.Events
	}
	a.publish(eff.rowsChanged || len(in.outcomes) > 0 || len(in.mounted) > 0 || firedIn(in.procOps)) // a fire's end wakes Settle
	for _, name := range eff.forgetProcs {
		a.retireProcessor(name)
	}
	if a.st.head != prevHead {
		a.notifyConnections()
	}
	a.liveDirty()
	for _, rb := range eff.replies {
		a.reply(rb.group, rb.plan.Replies, nil)
	}
	for _, rr := range eff.readerReplies {
		rr.op.reply <- rr.err
	}
	for _, sa := range eff.scheduleAnswers {
		sa.op.reply <- sa.reply
	}
	for _, pa := range eff.procAnswers {
		if pa.op.reply != nil {
			pa.op.reply <- pa.reply
		}
	}

	// 5. Deliverers, then pushes.
	for _, name := range eff.rebuild {
		a.rebuild(name)
	}
	for _, job := range eff.pushes {
		a.startPush(job)
	}

	// 6. Timers.
	a.armWake(eff.wakeAt)
	if eff.stepAgain {
		a.post0()
	}
	if eff.flushAfter > 0 && !a.flushArmed {
		a.flushArmed = true
		a.srv.clock.AfterFunc(a.flushDelay(eff.flushAfter), func() { a.post(actorMsg{flush: true}) })
	}
	for _, owner := range eff.fireProcAlarms {
		a.fireProcessorAlarm(owner)
	}
	waiting := a.alarmsWaiting // still firing, so no step plans them again: only tried here
	a.alarmsWaiting = nil
	for owner := range waiting {
		a.fireProcessorAlarm(owner)
	}
	a.answerSettles(in.settles)
	answerWritten(in.written)
}

// answerWritten tells the callers waiting for the cursor rows that the step flushing them is
// over (what a failed commit means for them is writeRows' to say).
func answerWritten(written []chan<- struct{}) {
	for _, ch := range written {
		ch <- struct{}{}
	}
}

// writeRows returns once every cursor row as the last step left it is on disk (or the disk
// refused it): what a barrier answers must survive a crash (seed 000: the confirmed cursor is
// what the far side durably claims), while delivery progress alone is written lazily
// (CursorFlushDelay). Nothing dirty: no commit.
func (a *actor) writeRows(ctx context.Context, expired <-chan struct{}) error {
	ch := make(chan struct{}, 1)
	select {
	case a.inbox <- &actorMsg{written: ch}:
	case <-a.done:
		return a.ended()
	case <-ctx.Done():
		return itx.Errorf(itx.ECancelled, "waitUntilProcessed: %v", ctx.Err())
	}
	select {
	case <-ch:
		// A disk refusing the write (full or failing) leaves the
		// progress in memory, written by the flush's retries once it takes writes again: the
		// barrier answers anyway, as it did before it asked for the write (the receiver did
		// process it; a crash meanwhile only redelivers, the README's full-disk rule).
		return nil
	case <-expired:
		return itx.Errorf(itx.EDeadlineExceeded, "the cursor reached the offset, but was not written in time")
	case <-ctx.Done():
		return itx.Errorf(itx.ECancelled, "waitUntilProcessed: %v", ctx.Err())
	case <-a.dctx.Done():
		return a.ended()
	}
}

// reportLadder logs and counts the retry ladder's loud decisions of a committed step: a halt
// stops a subscription until someone resumes it, so the operator must hear of it without reading
// the stream (where the step also recorded it).
func (a *actor) reportLadder(notes []ladderNote) {
	m := a.srv.metrics
	for _, n := range notes {
		var ev *zerolog.Event
		var msg string
		switch n.decision {
		case decideHalt:
			m.SubscriptionHalts.Inc()
			ev, msg = a.srv.log.Warn().Int64("confirmedOffset", n.offset), "subscription halted: delivery stops until resumeSubscription"
		case decideSkip:
			m.SkippedEvents.Inc()
			ev, msg = a.srv.log.Warn().Int64("skippedOffset", n.offset), "subscription skipped a failing event (onFailingEvent: skip)"
		case decidePark:
			m.SubscriptionParks.Inc()
			ev, msg = a.srv.log.Info().Int64("confirmedOffset", n.offset), "subscription parked: its receiver is absent; delivery resumes when it returns"
		default:
			continue
		}
		if n.deadLetter != "" {
			ev = ev.Str("deadLetterPath", n.deadLetter)
		}
		ev.Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Str("subscription", n.name).Int("attempts", n.attempts).Str("error", n.msg).Msg(msg)
	}
}

// answerSettles tells Settle callers how many pushes (and processor alarm fires) are still in
// flight.
func (a *actor) answerSettles(settles []chan<- int) {
	if len(settles) == 0 {
		return
	}
	n := len(a.pending) + len(a.st.procFiring)
	for _, rt := range a.st.subs {
		if rt.inFlight {
			n++
		}
	}
	for _, ch := range settles {
		ch <- n
	}
}

// maxFlushBackoff bounds how long the cursor flush waits after commits that failed in a row.
const maxFlushBackoff = 5 * time.Second

// flushDelay is when dirty cursor rows are written if nothing else writes them: after d, doubled
// for each commit that failed in a row (a full disk), up to maxFlushBackoff. Without it a stream
// whose delivery progress cannot be written retried (and reloaded its state, and logged an
// error) every 200 ms for as long as the disk stayed full. An append still commits at once, with
// the rows; once one commit succeeds the delay is d again.
func (a *actor) flushDelay(d time.Duration) time.Duration {
	for i := 0; i < a.failedCommits && d < maxFlushBackoff; i++ {
		d *= 2
	}
	return min(d, maxFlushBackoff)
}

// reloadAfter answers a step whose commit failed: every append of it fails, and the state is read
// back from storage, so nothing the failed commit held is published or delivered.
func (a *actor) reloadAfter(group []*appendReq, cause error) {
	a.trimmableKnown, a.sizeScan = false, nil // a commit that failed may be on disk after all: measure again when needed
	failure := itx.AsError(cause)
	if failure.Code == itx.EInternal || failure.Code == "" {
		// A full disk or a failing one says so (storage.ErrorCode); anything else that failed to
		// commit is internal.
		switch code := storage.ErrorCode(cause); code {
		case itx.EUnavailable:
			// The disk failed to write or sync the commit: SQLite rolled it back, but what it
			// wrote may be read back after a crash (its pages may have reached the disk; the
			// next commit overwrites them). Like a lost acknowledgement: a retry under the same
			// idempotency key is answered the original offsets if it did land.
			failure = itx.Errorf(code, "append not acknowledged: the disk failed (%v); it may still be in the log after a restart: retry with the same idempotency key", cause)
		default:
			failure = itx.Errorf(code, "append not committed: %v", cause)
		}
	}
	if errors.As(cause, new(streamLimitError)) {
		// A bound a client reached (the project's streams, --max-streams-per-project), not a
		// fault: it was logged as a failed step at warn, once per refused append. Said at info
		// the first time the stream is refused while loaded, then at debug.
		logged := a.srv.log.Debug()
		if !a.limitLogged {
			a.limitLogged = true
			logged = a.srv.log.Info()
		}
		logged.Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Int("limit", a.srv.cfg.MaxStreamsPerProject).
			Str("refusal", failure.Message).
			Msg("append or reader registration refused: the project holds its most streams (--max-streams-per-project); the stream is not created")
	} else {
		logged := a.srv.log.Error()
		// Commits failing in a row (a full or failing disk, with clients retrying) are logged
		// once a minute with how many failed, and their end once: it logged an error line per
		// refused append, thousands a second, onto a disk that may be the full one.
		now := a.srv.clock.Now()
		if a.failedCommits > 1 && !a.failLoggedAt.IsZero() && now.Sub(a.failLoggedAt) < time.Minute {
			logged = a.srv.log.Debug()
		} else if a.failedCommits > 0 {
			a.failLoggedAt = now
		}
		logged.Err(cause).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Int("failedInARow", a.failedCommits).
			Msg("step failed; reloading the stream's state from storage")
	}
	a.reply(group, nil, failure)
	for _, op := range a.failedReaders {
		op.reply <- failure
	}
	for _, op := range a.failedSchedules {
		op.reply <- scheduleReply{err: failure}
	}
	for _, op := range a.failedProc {
		if op.reply != nil {
			op.reply <- procReply{err: failure}
		}
	}
	a.failedReaders, a.failedProc, a.failedSchedules = nil, nil, nil
	if a.store == nil {
		a.st = newStreamState(a.st.bucket)
		if a.unmade != nil {
			a.st.streamID = a.unmade.StreamID // the identity the directory holds already
		}
		return
	}
	if err := a.restore(context.Background()); err != nil {
		a.srv.log.Error().Err(err).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg("reloading the stream's state failed")
		return
	}
	a.keepPublishedProgress()
	for name := range a.deliverers {
		a.rebuild(name)
	}
	for name := range a.st.core.Subscriptions {
		if a.deliverers[name] == nil {
			a.rebuild(name)
		}
	}
	a.publish(true)
	a.armWake(0)
	a.post0()
}

// keepPublishedProgress puts back, after a refused step's reload, the cursor rows readers were
// shown that storage does not hold yet: delivery progress is written lazily (a crash only
// redelivers), so the rows read back may stand behind the published ones, and a cursor a reader
// saw (a confirmed offset waitUntilProcessed answered) would go back without any crash. A
// published row comes from a committed step plus that progress, so it is kept where the stored
// row carries the same epochs and is not ahead of it, and written with the next commit.
func (a *actor) keepPublishedProgress() {
	pub := a.view().rows
	for name, r := range a.st.rows {
		p, ok := pub[name]
		if !ok || p == *r || p.ConfiguredAtOffset != r.ConfiguredAtOffset || p.CursorChangedAtOffset != r.CursorChangedAtOffset ||
			p.ConfirmedOffset < r.ConfirmedOffset {
			continue
		}
		p.InFlightDeadlineAt, p.InFlightConnectionGeneration = 0, 0 // no push survives the reload
		a.st.rows[name] = &p
		a.st.dirty[name] = true
	}
}

// post0 asks for a step soon without blocking the actor goroutine on its own inbox.
func (a *actor) post0() {
	select {
	case a.inbox <- &actorMsg{tick: true}:
	default:
	}
}

// reply answers a group: from replies, or every request with failure when failure is set.
func (a *actor) reply(group []*appendReq, replies []appendReply, failure error) {
	m := a.srv.metrics
	for i, r := range group {
		if r.reply == nil {
			continue
		}
		reply := appendReply{err: failure}
		if failure == nil {
			reply = replies[i]
		}
		if reply.err == nil {
			m.AppendCalls.WithLabelValues("ok").Inc()
		} else {
			m.AppendCalls.WithLabelValues(string(itx.ErrorCode(reply.err))).Inc()
		}
		m.AppendLatency.Observe(time.Since(r.queued).Seconds())
		r.reply <- reply
	}
}

// rebuild replaces the deliverer of name to match the catalog (none if removed). The old one's
// context ends, so its push stops; its outcome is fenced by generation anyway.
func (a *actor) rebuild(name string) {
	entry := a.st.core.Subscriptions[name]
	if old := a.deliverers[name]; old != nil {
		old.cancel()
		old.condition.release()
		old.transform.release()
		delete(a.deliverers, name)
		if c := old.remoteContract; c != "" && (entry == nil || isInProcess(entry) || entry.Config.ProcessorContract() != c || entry.mountScope() != old.remoteScope) {
			a.stopRemote(old.remoteScope, c, name)
		}
	}
	if entry == nil {
		a.setProcSeek(name, 0) // a subscription created anew under the name has no rewind to honor
	}
	if entry == nil || entry.Kind() != itx.KindProcessorWake {
		a.pruneProcessorLive(name)
	}
	if !isInProcess(entry) {
		a.stopRunner(name)
	}
	if entry == nil || a.dctx.Err() != nil {
		return
	}
	d := newDeliverer(a.dctx, a.srv, a.ref, entry)
	d.actor = a
	a.deliverers[name] = d
}

// retireProcessor ends what this incarnation keeps of the processor of a subscription the step
// removed, also when the same step configured one anew under the name (a raw append of
// subscriptionRemoved and subscriptionConfigured, or both verbs in one group commit): that is a
// new processor starting from its own records (forgetProc), not a reconfigure, so rebuild, which
// compares only the catalog before and after, would leave the old one's live engine projecting
// the new records to views that asked for the old, and its in-process runner registered. The
// live views hear subscriptionRemoved, the rewind epoch goes, the runner is stopped (a Start that
// finds it before the stop lands replaces it: startRunner's generation check; rebuild stops it
// when the name is gone or placed elsewhere). After the publish and before the replies: a view
// asked for once the step answered gets a fresh engine.
func (a *actor) retireProcessor(name string) {
	a.pruneProcessorLive(name)
	a.setProcSeek(name, 0)
	if isInProcess(a.st.core.Subscriptions[name]) {
		a.stopRunner(name)
	}
}

// startPush runs a delivery try on its own goroutine; it holds a reference on the actor, so the
// stream stays loaded while a try is in flight. A try that cannot start reports at once.
func (a *actor) startPush(job pushJob) {
	d := a.deliverers[job.name]
	if d == nil {
		a.rebuild(job.name)
		d = a.deliverers[job.name]
	}
	// Not started (the stream unloading, or its project at its share of the held streams: the
	// stream steps again once the project holds fewer), the try ends at the next step, which
	// starts it again if it is still owed.
	ok, full := d != nil, false
	if ok {
		ok, full = a.srv.pinDelivery(a)
	}
	if !ok {
		a.pending = append(a.pending, deliveryOutcome{name: job.name, gen: job.gen,
			birth: job.row.ConfiguredAtOffset, seek: job.row.CursorChangedAtOffset, notStarted: full})
		return
	}
	store, streamID := a.store, a.st.streamID
	job.recent = a.recent
	a.pushes.Add(1)
	go func() {
		defer a.pushes.Done()
		out := d.push(job, store, streamID)
		a.post(actorMsg{outcome: &out})
		a.srv.release(a)
	}()
}

// armWake makes sure a step runs when the earliest retry comes due, and within alarmSleep: the
// timer runs on the monotonic clock, and the times it serves are wall times (a scheduled append,
// a processor's alarm), which a step of the wall clock makes due sooner than it fires.
func (a *actor) armWake(at int64) {
	if at == a.wakeAt && (at == 0 || a.wakeFired.Load() != a.wakeSeq) {
		return // armed for it, not fired yet
	}
	if a.wakeT != nil {
		a.wakeT.Stop()
		a.wakeT = nil
	}
	a.wakeAt = at
	if at == 0 {
		return
	}
	// An instant, not a delay from the step's now: the clock may have moved while the step ran.
	a.wakeSeq++
	seq := a.wakeSeq
	a.wakeT = itx.AfterFuncAt(a.srv.clock, time.UnixMilli(min(at, itx.UnixMilli(a.srv.clock.Now().Add(alarmSleep)))), func() {
		a.wakeFired.Store(seq)
		a.post(actorMsg{tick: true})
	})
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

// streamLimitError is ensureCreated's refusal for the project's stream limit: a client's, not a
// failed commit.
type streamLimitError struct{ error }

func (e streamLimitError) Unwrap() error { return e.error }

// ensureCreated creates the stream on its first commit (events, or a reader's registration: see
// step's bornNow): the directory entry first, then the database (see
// storage.Directory.CreateStream for the crash window). A project at Config.MaxStreamsPerProject
// gets neither: the directory refuses the entry before any file exists.
func (a *actor) ensureCreated(ctx context.Context, create bool) error {
	if a.store != nil {
		return nil
	}
	if !create {
		return errors.New("no stream database to write cursor state to")
	}
	entry := a.unmade
	if entry == nil {
		// Created at its first commit's time, the time its first events carry (the step stamped
		// them and lastAppendAt before this runs): describe never shows a last append before
		// the stream's creation.
		created := a.st.lastAppendAt
		if created <= 0 {
			created = itx.UnixMilli(a.srv.clock.Now())
		}
		entry = &storage.StreamEntry{StreamID: a.st.streamID, ProjectID: a.ref.ProjectID, Path: a.ref.Path, CreatedAt: created}
		if err := a.srv.dir.CreateStream(ctx, *entry, a.srv.cfg.MaxStreamsPerProject); err != nil {
			if itx.ErrorCode(err) == itx.ELimitExceeded {
				return streamLimitError{itx.Errorf(itx.ELimitExceeded, "%s (--max-streams-per-project): %s is not created", itx.ErrorMessage(err), a.ref.Path)}
			}
			return err
		}
	}
	store, err := a.srv.backend.Create(ctx, storage.StreamMeta{
		StreamID: entry.StreamID, ProjectID: a.ref.ProjectID, Path: a.ref.Path, CreatedAt: entry.CreatedAt,
	})
	if err != nil {
		// The entry is dropped with whatever file was begun, so the path holding nothing does
		// not count toward the project's streams; if the drop fails too (the disk still full),
		// it stays and the next creation makes the store under it (a CreateStream file left
		// unfinished is finished then), or unloading drops it, or a restart does.
		a.unmade = entry
		a.dropUnmade(ctx)
		return fmt.Errorf("create stream database: %w", err)
	}
	a.unmade, a.noteHead = nil, true
	a.store, a.st.created, a.st.createdAt, a.st.summaryOld = store, true, entry.CreatedAt, true // created stale
	return nil
}

// dropUnmade deletes the directory entry a creation left when its store could not be made,
// and the file it began (nothing was ever committed under it). A failure keeps it for the next
// creation or the unload.
func (a *actor) dropUnmade(ctx context.Context) {
	if a.unmade == nil {
		return
	}
	if err := a.srv.dropStreamEntry(ctx, *a.unmade); err != nil {
		// The disk is still full (a delete writes too): try again later, backing off to 30 s.
		a.dropWait = min(max(2*a.dropWait, time.Second), 30*time.Second)
		a.srv.log.Warn().Err(err).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Dur("retry_in", a.dropWait).Msg("the entry of a stream whose database could not be made is kept for now")
		if a.dropT == nil {
			a.dropT = a.srv.clock.AfterFunc(a.dropWait, func() { a.post(actorMsg{dropUnmade: true}) })
		}
		return
	}
	a.unmade, a.dropWait = nil, 0
}

func (a *actor) close() {
	store := a.store
	if store == nil {
		a.dropUnmade(context.Background())
		return
	}
	a.sweepEphemeral()
	a.forgetDeferredAudits()
	retentionDue, err := a.retentionDue()
	if err != nil {
		a.srv.log.Warn().Err(err).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg("the stream's retention policy: its oldest event not read (applied at its next load)")
	}
	a.mu.Lock()
	a.pub.store = nil
	a.mu.Unlock()
	a.store = nil
	ctx := context.Background()
	if !a.st.born {
		// Its database was made but its first commit never landed (a full disk refused it):
		// nothing was committed, so the stream does not exist. Its file and entry go, as a
		// restart drops a creation cut short; its entry, created stale and left so, is dropped
		// by the next start if the drop fails here. Kept, it took a place in the project's
		// stream bound until then.
		a.closeStore(store)
		e := storage.StreamEntry{StreamID: a.st.streamID, ProjectID: a.ref.ProjectID, Path: a.ref.Path}
		if err := a.srv.dropStreamEntry(ctx, e); err != nil {
			a.srv.log.Warn().Err(err).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg("a stream whose first commit failed is kept until the next start drops it")
		}
		return
	}
	// The secret uses are made exact before the summary clears the stream's stale mark: while
	// it is marked, a restart rewrites them from the catalog.
	sum := summaryOf(a.st.head, a.st.lastAppendAt, a.st.core, pointerRow(a.st.rows), a.st.readers)
	sum.Born = true // an unborn stream left above
	// Both in one commit (they were two, each an fsync of the directory, which every unload
	// shares): the uses and the summary, or neither and the stale mark stays.
	if err := a.srv.dir.RefreshSummaries(ctx, []storage.SummaryRefresh{{ProjectID: a.ref.ProjectID, StreamID: a.st.streamID,
		SecretRefs: refList(secretRefsOf(a.st.core)), Summary: sum}}); err != nil {
		a.srv.log.Warn().Err(err).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg("stream summary and webhook secret uses not refreshed: the summary stays stale")
	}
	// A parked subscription waits for a mount, not a time: record what it waits for, so the
	// mount can load this stream. Only streams with itx-call subscriptions pay for the write.
	var parked []string
	calls := false
	for name, entry := range a.st.core.Subscriptions {
		token := waitsFor(entry)
		if token == "" {
			continue
		}
		calls = true
		if r := a.st.rows[name]; r != nil && r.Status == storage.StatusParked {
			parked = append(parked, token)
		} else if entry.Kind() == itx.KindProcessorWake && a.st.procAlarms[name] > 0 {
			// Backing off, its alarm slice armed: a mount of its contract (maybe a new build)
			// loads the stream and fires the slice early.
			parked = append(parked, token)
		}
	}
	if calls {
		if err := a.srv.dir.SetParked(ctx, a.st.streamID, parked); err != nil {
			a.srv.log.Error().Err(err).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg("parked subscriptions not recorded")
		}
	}
	if a.st.alarmSet {
		due := a.nextAlarm(retentionDue)
		if err := a.srv.dir.SetAlarm(ctx, a.st.streamID, due); err != nil {
			a.srv.log.Error().Err(err).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg("stream alarm not recorded")
		} else if due > 0 {
			a.srv.alarmChanged(due)
		}
	}
	a.closeStore(store)
}

// closeStore closes the stream's database at unload.
func (a *actor) closeStore(store streamStore) {
	if err := store.Close(); err != nil {
		a.srv.log.Warn().Err(err).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Msg("closing stream database")
	}
	a.noteSize(0, true) // its write-ahead log went with it
}

// nextAlarm is when this unloaded stream must be loaded again to deliver: now if an active
// subscription is behind with no retry pending, its earliest retry otherwise, 0 for never. A
// parked subscription waits for its receiver, not for a time. retentionDue is when its
// retention policy has an event to trim (retentionDue): a load applies it.
func (a *actor) nextAlarm(retentionDue int64) int64 {
	now := itx.UnixMilli(a.srv.clock.Now())
	due := int64(0)
	if len(a.pendingAudits) > 0 {
		// An audit record of the stream's own (a trim, a retention policy) is not in /audit yet:
		// a shutdown cut its append short, or /audit refused it. The next start loads the stream
		// and appends it (load), instead of waiting for something to touch the stream.
		return now
	}
	if retentionDue > 0 {
		// Not sooner than a minute on: a load that could not trim (a failing disk) is not
		// repeated back to back.
		due = max(retentionDue, now+retentionEvery.Milliseconds())
	}
	for name, r := range a.st.rows {
		if r.Status != storage.StatusActive || r.ConfirmedOffset >= a.st.head || a.st.core.Subscriptions[name] == nil {
			continue
		}
		at := max(r.NextAttemptAt, now)
		if at > retryHorizon(now) {
			at = now // set before the wall clock went back (see retryHorizon)
		}
		if due == 0 || at < due {
			due = at
		}
	}
	for _, at := range a.st.procAlarms {
		if at > 0 && (due == 0 || at < due) {
			due = at // the processors owe work (keepalive, revival): load the stream for them
		}
	}
	if pending, next := a.st.dueScheduled(now); len(pending) > 0 {
		due = now // a scheduled append is due (the breaker held it back)
	} else if next > 0 && (due == 0 || next < due) {
		due = next
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

// view is what the actor last published: a consistent, immutable snapshot for readers.
type view struct {
	store    streamStore
	streamID string
	head     int64
	info     streamTimes
	core     *coreState
	rows     map[string]storage.CursorRow
	readers  map[string]storage.Reader
	// scheduled is how many scheduled appends are pending (their list is read from the store:
	// copying up to 10,000 keys on every publish would make each delivery pay for them).
	scheduled int
	// recent is the last commit's events (ephemeral ones included), so connections at the tail
	// take them from memory instead of reading back what was just written. Immutable.
	recent []itx.Event
	// procs is the processor records this incarnation has read or written (immutable values).
	procs   map[string]*procRecord
	changed <-chan struct{}
}

// streamTimes is what describe shows of a stream beside its head (trimmed: Stream.trim's reach).
type streamTimes struct {
	createdAt, lastAppendAt, trimmed int64
	retention                        retentionPolicy
}

// publish makes the state after a step visible to readers and wakes whoever waits on a change.
// Rows are copied only when they may have changed.
func (a *actor) publish(rowsChanged bool) {
	st := a.st
	a.mu.Lock()
	defer a.mu.Unlock()
	v := a.pub
	if st.procsDirty {
		procs := make(map[string]*procRecord, len(st.procs))
		for name, r := range st.procs {
			procs[name] = r
		}
		v.procs, st.procsDirty = procs, false
		rowsChanged = true // wake waiters: a processor's record changed
	}
	info := streamTimes{st.createdAt, st.lastAppendAt, st.trimmed, st.retention}
	if !rowsChanged && v.rows != nil && v.head == st.head && v.core == st.core && v.store == a.store && v.info == info {
		return // nothing a reader can see changed: waiters stay asleep
	}
	v.store, v.head, v.core, v.recent = a.store, st.head, st.core, a.recent
	v.streamID = ""
	if st.born && a.store != nil {
		// A planned id is not an identity until the first commit lands: a store made by a
		// creation whose first commit failed (or that a crash cut short) holds no stream yet.
		v.streamID = st.streamID
	}
	v.info = info
	if rowsChanged || v.rows == nil {
		rows := make(map[string]storage.CursorRow, len(st.rows))
		for name, r := range st.rows {
			rows[name] = *r
		}
		v.rows = rows
		readers := make(map[string]storage.Reader, len(st.readers))
		for name, r := range st.readers {
			readers[name] = r
		}
		v.readers = readers
		v.scheduled = len(st.scheduled)
	}
	close(a.changed)
	a.changed = make(chan struct{})
	v.changed = a.changed
	a.pub = v
}

// firedIn reports whether a processor alarm fire's handling ended in ops.
func firedIn(ops []procOp) bool {
	for _, op := range ops {
		if op.fired {
			return true
		}
	}
	return false
}

func (a *actor) view() view {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pub
}

// deletedReason is what a deleted stream's connections and live views are told.
func (a *actor) deletedReason() string {
	if a.deletedWhy != "" {
		return a.deletedWhy
	}
	return "the stream was deleted with its project"
}
