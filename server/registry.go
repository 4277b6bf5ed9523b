package server

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/itx-dev/itx"
)

// acquire returns the loaded actor of ref, loading it if needed, with one reference held for
// the caller; the caller must call release. While any reference is held the actor stays loaded.
// join takes a reference on a, loaded or loading, once its load has ended: a, or its load's
// error. Called with s.mu held and inflight already counted for it; it unlocks s.mu.
func (s *Server) join(ctx context.Context, a *actor) (*actor, error) {
	s.holdLocked(a)
	s.mu.Unlock()
	select {
	case <-a.ready:
	case <-ctx.Done():
		s.release(a)
		return nil, itx.Errorf(itx.ECancelled, "waiting for stream %s to load: %v", a.ref.Path, ctx.Err())
	}
	if a.loadErr != nil {
		s.release(a)
		return nil, a.loadErr
	}
	return a, nil
}

func (s *Server) acquire(ctx context.Context, ref StreamRef) (*actor, error) {
	s.mu.Lock()
	for s.actors[ref] == nil {
		// Its database file is being read alone (the disk is full): no writer opens it
		// meanwhile. A page or a describe: a short wait. Or a backup is taking its instant
		// (backup.go): no stream loads until it has, a fraction of a millisecond per loaded stream.
		// Or it is being deleted: what needs it waits for the delete's end (a new stream then).
		var wait <-chan struct{}
		if read := s.fullReads[ref]; read != nil {
			wait = read.done
		} else if gate := s.deleting[ref]; gate != nil {
			wait = gate
		} else if wait = s.backupGateLocked(); wait == nil {
			break
		}
		s.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, itx.Errorf(itx.ECancelled, "waiting for stream %s to load: %v", ref.Path, ctx.Err())
		}
		s.mu.Lock()
	}
	if s.closing {
		s.mu.Unlock()
		return nil, itx.Errorf(itx.EUnavailable, "the server is shutting down")
	}
	if s.projectDeleted(ref.ProjectID) {
		s.mu.Unlock()
		return nil, itx.Errorf(itx.ENotFound, "the project of stream %s was deleted", ref.Path)
	}
	a := s.actors[ref]
	if (a == nil || a.refs == 0) && s.heldBy[ref.ProjectID] >= s.cfg.MaxHeldStreamsPerProject {
		// One more stream held by this project: past its share, refused, so that one project
		// holding streams in use (connections, live state, calls) leaves the rest of
		// MaxHeldStreams to the others.
		n := s.heldBy[ref.ProjectID]
		s.mu.Unlock()
		s.shareFull(ref.ProjectID, flagHeldShare, n)
		return nil, itx.Errorf(itx.ELimitExceeded, "the project holds %d streams in use, its share of the streams itxd holds loaded (%s), so %s cannot be loaded now: release connections, live-state handles or calls held on its other streams", n, flagHeldShare, ref.Path)
	}
	s.inflight.Add(1)
	if a != nil {
		return s.join(ctx, a)
	}
	if len(s.actors) >= s.cfg.MaxHeldStreams && !s.anyIdleLocked() {
		n := len(s.actors)
		s.mu.Unlock()
		s.inflight.Done()
		return nil, itx.Errorf(itx.ELimitExceeded, "itxd has %d streams loaded, every one in use (--max-held-streams), so %s cannot be loaded now: release connections, live-state handles or calls held on other streams", n, ref.Path)
	}
	a = newActor(s, ref)
	s.holdLocked(a)
	s.actors[ref] = a
	prev := s.unloading[ref]
	overCap := len(s.actors) > s.cfg.MaxLoadedStreams
	s.mu.Unlock()
	if overCap {
		go s.sweep()
	}

	// The previous incarnation must have closed its database before this one opens it: one
	// writer per stream, always.
	if prev != nil {
		select {
		case <-prev.done:
		case <-ctx.Done():
			return nil, s.abandonLoad(a, itx.Errorf(itx.ECancelled, "waiting for stream %s to unload: %v", ref.Path, ctx.Err()))
		}
	}
	if err := a.load(); err != nil {
		return nil, s.abandonLoad(a, err)
	}
	s.metrics.LoadedStreams.Inc()
	close(a.ready)
	go a.run()
	return a, nil
}

// anyIdleLocked reports whether a loaded stream is held by nobody (so a sweep can unload it).
// Called with s.mu held, only when a stream is to be loaded past MaxHeldStreams.
func (s *Server) anyIdleLocked() bool {
	for _, a := range s.actors {
		if a.refs == 0 {
			return true
		}
	}
	return false
}

// abandonLoad gives up on loading a: callers waiting on it see err, and the next acquire of
// the stream starts afresh. a leaves the registry before its failure is published: a call that
// finds a in the registry, joins it and sees it failed (whileFull) must not find it there again.
// The other order left a window, between ready closed and the registry's lock taken, in which
// whileFull's turns each joined this one failed load, at once, 64 times over when this goroutine
// was descheduled (a loaded machine), and answered a full disk's read with the load's error.
func (s *Server) abandonLoad(a *actor, err error) error {
	a.loadErr = err
	s.mu.Lock()
	if s.actors[a.ref] == a {
		delete(s.actors, a.ref)
	}
	s.mu.Unlock()
	close(a.ready)
	if loadAbandonedHook != nil {
		loadAbandonedHook(a.ref)
	}
	s.release(a)
	return err
}

// loadAbandonedHook, when set (tests), runs in abandonLoad once the failed load is published.
var loadAbandonedHook func(StreamRef)

// pin takes a reference on a loaded actor for work the stream itself owes (a deliverer with
// events due), keeping it loaded; release drops it. It fails once the actor has been chosen for
// unloading (its deliverers' context is cancelled under the same lock), so work never pins an
// actor that is on its way out.
func (s *Server) pin(a *actor) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a.dctx.Err() != nil {
		return false
	}
	s.holdLocked(a)
	s.inflight.Add(1)
	return true
}

// pinDelivery is pin for a delivery try (or a processor alarm fire: pinAlarm) a stream starts
// itself, within its project's share of the streams held in use: one that would take the
// project past Config.MaxHeldStreamsPerProject is refused (full), counted and logged as a call
// is, and the stream is told (a tick) once the project holds fewer, so it starts the try then.
// A loaded stream nobody holds counts nothing toward the share, and pin took it in use without
// looking: a project's loaded idle streams whose deliveries hung (a receiver that answers only
// at the delivery timeout) each held a stream, past its share up to every stream itxd may load,
// and the other projects could load none.
func (s *Server) pinDelivery(a *actor) (ok, full bool) {
	s.mu.Lock()
	if a.dctx.Err() != nil {
		s.mu.Unlock()
		return false, false
	}
	p := a.ref.ProjectID
	if a.refs == 0 && s.heldBy[p] >= s.cfg.MaxHeldStreamsPerProject {
		n := s.heldBy[p]
		w := s.heldWaiting[p]
		if w == nil {
			w = map[*actor]struct{}{}
			s.heldWaiting[p] = w
		}
		w[a] = struct{}{}
		s.mu.Unlock()
		s.shareFull(p, flagHeldShare, n)
		return false, true
	}
	s.holdLocked(a)
	s.inflight.Add(1)
	s.mu.Unlock()
	return true, false
}

// release drops a reference taken by acquire or pin.
func (s *Server) release(a *actor) {
	s.mu.Lock()
	a.refs--
	a.lastUsed = s.clock.Now()
	freed := false
	var waiting map[*actor]struct{}
	if a.refs == 0 {
		p := a.ref.ProjectID
		if s.heldBy[p]--; s.heldBy[p] <= 0 {
			delete(s.heldBy, p)
		}
		freed = s.heldBy[p] < s.cfg.MaxHeldStreamsPerProject/2+1
		if s.heldBy[p] < s.cfg.MaxHeldStreamsPerProject {
			if waiting = s.heldWaiting[p]; waiting != nil {
				delete(s.heldWaiting, p)
			}
		}
		if a.drained != nil {
			close(a.drained)
			a.drained = nil
		}
	}
	s.mu.Unlock()
	s.inflight.Done()
	// Every stream waiting steps again and tries its work: one takes the place, the others wait
	// again (they are a project's loaded streams, a bounded set).
	for w := range waiting {
		w.post0()
	}
	if freed {
		s.shareFree(a.ref.ProjectID, flagHeldShare)
	}
}

// holdLocked takes a reference on a, counting it toward its project's streams in use
// (Config.MaxHeldStreamsPerProject) when it is the first. Called with s.mu held.
func (s *Server) holdLocked(a *actor) {
	if a.refs == 0 {
		s.heldBy[a.ref.ProjectID]++
	}
	a.refs++
}

// scheduleSweep arms the next idle sweep on the injected clock.
func (s *Server) scheduleSweep() {
	interval := min(s.cfg.IdleTimeout/4, time.Minute)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return
	}
	s.sweepT = s.clock.AfterFunc(interval, func() {
		if s.enterInflight() != nil {
			return // closing: Close unloads every stream itself
		}
		s.sweep()
		s.inflight.Done()
		s.scheduleSweep()
	})
}

// sweep unloads streams nobody holds that have idled past IdleTimeout (not one whose
// offset-acking subscription holds events unconfirmed: it would deliver them again), then, while
// more than MaxLoadedStreams are loaded, the least recently used idle ones.
func (s *Server) sweep() {
	now := s.clock.Now()
	s.mu.Lock()
	var idle []*actor
	for _, a := range s.actors {
		if a.refs == 0 && a.loadErr == nil && isClosed(a.ready) {
			idle = append(idle, a)
		}
	}
	sort.Slice(idle, func(i, j int) bool { return idle[i].lastUsed.Before(idle[j].lastUsed) })
	excess := len(s.actors) - s.cfg.MaxLoadedStreams
	var victims []*actor
	for _, a := range idle {
		if (now.Sub(a.lastUsed) >= s.cfg.IdleTimeout && !a.holding.Load()) || excess > 0 {
			victims = append(victims, a)
			excess--
			delete(s.actors, a.ref)
			s.unloading[a.ref] = a
			delete(s.heldWaiting[a.ref.ProjectID], a)
			a.dcancel() // under s.mu: no deliverer can pin it from here on
		}
	}
	s.mu.Unlock()

	// Each unload writes the directory summary and checkpoints the stream's WAL: do several at
	// once, or a sweep of thousands of idle streams falls behind the streams being touched.
	inParallel(victims, func(a *actor) {
		a.unload()
		s.mu.Lock()
		if s.unloading[a.ref] == a {
			delete(s.unloading, a.ref)
		}
		s.mu.Unlock()
	})
	if len(victims) > 0 {
		s.trimMemory()
	}
}

// sweepWorkers is how many streams one sweep unloads (or a start refreshes) at a time.
const sweepWorkers = 8

// inParallel calls fn on every item, sweepWorkers at a time, and returns when all are done.
func inParallel[T any](items []T, fn func(T)) {
	work := make(chan T)
	var wg sync.WaitGroup
	for w := 0; w < min(len(items), sweepWorkers); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for item := range work {
				fn(item)
			}
		}()
	}
	for _, item := range items {
		work <- item
	}
	close(work)
	wg.Wait()
}

// trimMemory returns freed memory to the OS, at most once a second.
func (s *Server) trimMemory() {
	s.trimMu.Lock()
	defer s.trimMu.Unlock()
	if now := time.Now(); now.Sub(s.lastTrim) >= time.Second {
		s.lastTrim = now
		releaseFreedMemory()
	}
}

// LoadedStreams reports how many stream actors are loaded.
func (s *Server) LoadedStreams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.actors)
}

// Sweep runs one idle sweep now and returns once every unload under way (its own or a
// concurrent timed sweep's) has finished (tests and operators).
func (s *Server) Sweep() {
	s.sweep()
	s.mu.Lock()
	pending := make([]*actor, 0, len(s.unloading))
	for _, a := range s.unloading {
		pending = append(pending, a)
	}
	s.mu.Unlock()
	for _, a := range pending {
		<-a.done
	}
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Settle returns once the stream's actor has taken every input queued before the call (timer
// fires included) and no delivery try nor processor alarm fire is in flight: a barrier for tests and operators that must
// know delivery has nothing left to do right now, rather than guess with a sleep.
func (s *Server) Settle(ctx context.Context, ref StreamRef) error {
	a, err := s.acquire(ctx, ref)
	if err != nil {
		return err
	}
	defer s.release(a)
	for {
		v := a.view()
		answer := make(chan int, 1)
		a.post(actorMsg{settle: answer})
		select {
		case n := <-answer:
			if n == 0 {
				return nil
			}
		case <-a.done:
			return nil
		case <-ctx.Done():
			return itx.Errorf(itx.ECancelled, "settle: %v", ctx.Err())
		}
		select {
		case <-v.changed:
		case <-ctx.Done():
			return itx.Errorf(itx.ECancelled, "settle: %v", ctx.Err())
		}
	}
}
