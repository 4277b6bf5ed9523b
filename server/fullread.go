package server

import (
	"context"
	"errors"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

// snapshotter is a backend that can open a stream's store for reads alone (sqliteBackend).
type snapshotter interface {
	Snapshot(ctx context.Context, streamID string) (*storage.Snapshot, error)
}

func (b sqliteBackend) Snapshot(ctx context.Context, streamID string) (*storage.Snapshot, error) {
	return storage.OpenSnapshot(ctx, b.file(streamID))
}

// fullRead counts the reads of one stream's database file alone (openWhileFull); done is closed
// when the last ends.
type fullRead struct {
	n    int
	done chan struct{}
}

// whileFull runs read over the database file of a stream whose load failed with loadErr because
// the disk is full (SQLite cannot make the -shm file an ordinary open needs): possible when its
// write-ahead log holds no commits (a stream unloaded cleanly leaves none). While read runs, the
// stream's loads wait, so nothing writes the file under it. A load of the stream under way
// decides instead: loaded runs on the stream if it loads; otherwise the file is tried again.
// Anything else (a WAL with commits, no such stream) answers loadErr.
func (s *Server) whileFull(ctx context.Context, ref StreamRef, loadErr error, read func(*storage.Snapshot, *storage.StreamEntry) error, loaded func(*actor) error) error {
	b, can := s.backend.(snapshotter)
	if !can {
		return loadErr
	}
	entry, err := s.dir.Stream(ctx, ref.ProjectID, ref.Path)
	if err != nil || entry == nil {
		return loadErr
	}
	// Each turn waits for a load or an unload another call started (never starting one, so
	// two readers cannot keep failing each other's turns with loads of their own). Readers
	// paging the same stream start a load at each page before they come here, so a reader may
	// join several of theirs, each failing at once, before it finds no load under way. Every
	// turn waits on another call, none spins: a failed load leaves the registry before its
	// failure is published (abandonLoad), so no turn joins the same failed load twice.
	for range 64 {
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			return loadErr
		}
		if a := s.actors[ref]; a != nil {
			// Another call is loading the stream (or it loaded meanwhile): its outcome decides.
			s.inflight.Add(1)
			a, err := s.join(ctx, a)
			if err == nil {
				defer s.release(a)
				return loaded(a)
			}
			if itx.ErrorCode(err) != itx.EResourceExhausted {
				return err
			}
			loadErr = err
			continue
		}
		if prev := s.unloading[ref]; prev != nil {
			s.mu.Unlock()
			select {
			case <-prev.done:
			case <-ctx.Done():
				return itx.Errorf(itx.ECancelled, "waiting for stream %s to unload: %v", ref.Path, ctx.Err())
			}
			continue
		}
		fr := s.fullReads[ref]
		if fr == nil {
			fr = &fullRead{done: make(chan struct{})}
			s.fullReads[ref] = fr
		}
		fr.n++
		s.mu.Unlock()
		return s.readFile(ctx, b, ref, entry, fr, loadErr, read)
	}
	return loadErr
}

// readFile runs read over the stream's database file alone, then lets its loads go on.
func (s *Server) readFile(ctx context.Context, b snapshotter, ref StreamRef, entry *storage.StreamEntry, fr *fullRead, loadErr error, read func(*storage.Snapshot, *storage.StreamEntry) error) error {
	defer func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if fr.n--; fr.n == 0 {
			delete(s.fullReads, ref)
			close(fr.done)
		}
	}()
	snap, err := b.Snapshot(ctx, entry.StreamID)
	if err != nil {
		if !errors.Is(err, storage.ErrWALPending) {
			s.log.Warn().Err(err).Str("project", ref.ProjectID).Str("path", ref.Path).Msg("reading a stream from its database file alone while the disk is full")
		}
		return loadErr
	}
	defer snap.Close()
	s.metrics.FullDiskReads.Inc()
	return read(snap, entry)
}

// readWhileFull serves a page of a stream whose load failed with loadErr because the disk is
// full, from its database file alone (whileFull); otherwise it answers loadErr.
func (s *Server) readWhileFull(ctx context.Context, ref StreamRef, q itx.Query, loadErr error) (page itx.Page, err error) {
	err = s.whileFull(ctx, ref, loadErr, func(snap *storage.Snapshot, _ *storage.StreamEntry) error {
		meta, err := snap.Meta(ctx)
		if err != nil {
			return loadErr
		}
		page, err = s.readRange(ctx, snap.Events, meta.StreamID, meta.HeadOffset, q)
		return err
	}, func(a *actor) error {
		page, err = s.readPage(ctx, ref.ProjectID, a.view(), q)
		return err
	})
	return page, err
}

// viewWhileFull runs f over the state of a stream whose load failed with loadErr because the
// disk is full, read from its database file alone (whileFull): its head, catalog, cursor rows and
// registered readers, as a load would find them. The view has no store (nothing else of the
// stream can be read through it). Otherwise it answers loadErr.
func (s *Server) viewWhileFull(ctx context.Context, ref StreamRef, loadErr error, f func(view) error) error {
	return s.whileFull(ctx, ref, loadErr, func(snap *storage.Snapshot, e *storage.StreamEntry) error {
		v, ok := snapshotView(ctx, snap, e)
		if !ok {
			return loadErr
		}
		return f(v)
	}, func(a *actor) error {
		return f(a.view())
	})
}

// snapshotView is the view a load of the stream would publish before any step, read from its
// database file: false when the file cannot say (a read failing, a catalog from another version
// that a load would re-reduce from the log).
func snapshotView(ctx context.Context, snap *storage.Snapshot, e *storage.StreamEntry) (view, bool) {
	meta, err := snap.Meta(ctx)
	if err != nil {
		return view{}, false
	}
	list, err := snap.Readers(ctx)
	if err != nil {
		return view{}, false
	}
	if born, err := bornIn(ctx, snap, meta.HeadOffset, len(list)); err != nil || !born {
		return view{}, false // no first commit: nothing a load would show either
	}
	raw, err := snap.KV(ctx, coreStateKey)
	if err != nil {
		return view{}, false
	}
	core, ok := decodeCoreState(raw)
	if !ok {
		if raw != nil {
			return view{}, false
		}
		core = newCoreState() // no subscription ever configured
	}
	cursors, err := snap.CursorRows(ctx)
	if err != nil {
		return view{}, false
	}
	v := view{streamID: meta.StreamID, head: meta.HeadOffset, info: streamTimes{createdAt: e.CreatedAt, lastAppendAt: meta.LastAppendAt, trimmed: meta.TrimmedThrough}, core: core,
		rows: make(map[string]storage.CursorRow, len(cursors)), readers: make(map[string]storage.Reader, len(list))}
	for _, r := range cursors {
		v.rows[r.Name] = r
	}
	for _, r := range list {
		v.readers[r.Name] = r
	}
	return v, true
}

// describeWhileFull describes a stream whose load failed with loadErr because the disk is full,
// from its database file (viewWhileFull); otherwise it answers loadErr.
func (s *Server) describeWhileFull(ctx context.Context, ref StreamRef, loadErr error) (info itx.StreamInfo, err error) {
	err = s.viewWhileFull(ctx, ref, loadErr, func(v view) error {
		info = describeView(ref, v, false)
		return nil
	})
	return info, err
}
