package server

import (
	"context"
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
// queued append into one group commit, so concurrent appenders share one fsync. Readers use the
// store's reader pool beside it and read the head from the actor under mu.
type actor struct {
	srv *Server
	ref StreamRef

	reqs chan *appendReq
	quit chan struct{}
	done chan struct{}

	ready   chan struct{} // closed once load finished
	loadErr error

	// Registry fields, guarded by srv.mu.
	refs     int
	lastUsed time.Time

	// Owned by the run goroutine.
	bucket *tokenBucket

	mu           sync.Mutex // guards the fields below for readers
	store        *storage.Stream
	streamID     string
	createdAt    int64
	head         int64
	lastAppendAt int64
	changed      chan struct{} // closed and replaced after every commit
}

func newActor(s *Server, ref StreamRef) *actor {
	return &actor{
		srv: s, ref: ref,
		reqs:    make(chan *appendReq, 1024),
		quit:    make(chan struct{}),
		done:    make(chan struct{}),
		ready:   make(chan struct{}),
		changed: make(chan struct{}),
	}
}

// load opens the stream's database if the stream exists.
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
	meta, err := store.Meta(ctx)
	if err != nil {
		store.Close()
		return itx.Errorf(itx.EUnavailable, "load stream %s: %v", a.ref.Path, err)
	}
	a.store, a.streamID, a.createdAt, a.head, a.lastAppendAt = store, meta.StreamID, meta.CreatedAt, meta.HeadOffset, meta.LastAppendAt
	a.sweepEphemeral(store)
	return nil
}

// sweepEphemeral deletes ephemeral rows past their retention, on load and on unload. Offsets are
// not reissued: the head lives in stream_meta.
func (a *actor) sweepEphemeral(store *storage.Stream) {
	before := itx.UnixMilli(a.srv.clock.Now().Add(-a.srv.cfg.EphemeralRetention))
	if n, err := store.DeleteEphemeral(context.Background(), a.head, before); err != nil {
		a.srv.log.Warn().Err(err).Str("path", a.ref.Path).Msg("ephemeral sweep failed")
	} else if n > 0 {
		a.srv.log.Debug().Int64("deleted", n).Str("path", a.ref.Path).Msg("swept ephemeral events")
	}
}

// unload stops the goroutine and closes the database. Only called with no references held, so
// no request can be queued.
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
			a.commitGroup(group)
			clear(group)
		case <-a.quit:
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
	if err := a.srv.dir.UpdateStreamSummary(ctx, a.streamID, a.head, a.lastAppendAt); err != nil {
		a.srv.log.Warn().Err(err).Str("path", a.ref.Path).Msg("stream summary not refreshed")
	}
	if err := store.Close(); err != nil {
		a.srv.log.Warn().Err(err).Str("path", a.ref.Path).Msg("closing stream database")
	}
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

// commitGroup plans, commits and answers one group of append requests.
//
// Ordering: the commit (fsync) completes before any reply is sent and before readers and
// barriers can see the new head; a failed commit answers every accepted request with the failure.
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
	plan := planGroup(a.head, a.streamID, a.bucket, group, committed, now)

	if len(plan.Events) > 0 {
		start := time.Now()
		err := a.ensureCreated(ctx, now)
		if err == nil {
			err = a.store.Commit(ctx, storage.Commit{Events: plan.Events, HeadOffset: plan.Head, LastAppendAt: itx.UnixMilli(now)})
		}
		if err != nil {
			a.srv.log.Error().Err(err).Str("path", a.ref.Path).Msg("group commit failed")
			failure := itx.Errorf(itx.EInternal, "append not committed: %v", err)
			for i := range plan.Replies {
				if plan.Replies[i].err == nil {
					plan.Replies[i] = appendReply{err: failure}
				}
			}
		} else {
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
			a.mu.Lock()
			a.head, a.lastAppendAt = plan.Head, itx.UnixMilli(now)
			close(a.changed)
			a.changed = make(chan struct{})
			a.mu.Unlock()
		}
	}
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
	var found map[string]*itx.Event
	for _, r := range group {
		for i := range r.inputs {
			key := r.inputs[i].IdempotencyKey
			if key == "" {
				continue
			}
			if _, seen := found[key]; seen {
				continue
			}
			e, err := a.store.EventByKey(ctx, key)
			if err != nil {
				return nil, itx.Errorf(itx.EInternal, "append: %v", err)
			}
			if found == nil {
				found = map[string]*itx.Event{}
			}
			found[key] = e // nil records "looked up, absent"
		}
	}
	for k, e := range found {
		if e == nil {
			delete(found, k)
		}
	}
	return found, nil
}

// ensureCreated creates the stream on its first commit: the directory entry first, then the
// database (see storage.Directory.CreateStream for the crash window).
func (a *actor) ensureCreated(ctx context.Context, now time.Time) error {
	if a.store != nil {
		return nil
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
	return nil
}

func (a *actor) failAll(group []*appendReq, err error) {
	for _, r := range group {
		a.srv.metrics.AppendCalls.WithLabelValues(string(itx.ErrorCode(err))).Inc()
		r.reply <- appendReply{err: err}
	}
}

// view is a consistent snapshot of what readers need.
type view struct {
	store    *storage.Stream
	streamID string
	head     int64
	changed  <-chan struct{}
	info     streamTimes
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
		info: streamTimes{a.createdAt, a.lastAppendAt}}
}
