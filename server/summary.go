package server

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/itx-dev/itx/storage"
)

// refreshStaleSummaries brings every directory summary marked stale up to date from its stream's
// own database. Summaries are refreshed when a stream unloads, so after a kill -9 these are the
// streams that were loaded and written; after a clean shutdown there are none. Streams.list then
// shows true heads without loading every stream.
func (s *Server) refreshStaleSummaries(ctx context.Context) {
	entries, err := s.dir.StaleStreams(ctx)
	if err != nil {
		s.log.Warn().Err(err).Msg("stale stream summaries not refreshed")
		return
	}
	// A project one of whose stale streams could not be read keeps its unused secrets: that
	// stream's catalog may reference them.
	var mu sync.Mutex
	unsure := map[string]bool{}
	var refreshed []storage.SummaryRefresh
	inParallel(entries, func(e storage.StreamEntry) {
		r, err := s.refreshSummary(ctx, e)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			s.log.Warn().Err(err).Str("project", e.ProjectID).Str("path", e.Path).Msg("stream summary not refreshed")
			unsure[e.ProjectID] = true
		} else if r != nil {
			refreshed = append(refreshed, *r)
		}
	})
	// Written refreshBatch streams to a commit: at two commits (two fsyncs) per stream, a start
	// after a kill -9 with 1,024 streams loaded spent about 5 s on them alone (see
	// docs/benchmarks.md, Counts).
	for batch := range slices.Chunk(refreshed, refreshBatch) {
		if err := s.dir.RefreshSummaries(ctx, batch); err != nil {
			// They stay marked stale: the next start reads them again.
			s.log.Warn().Err(err).Int("streams", len(batch)).Msg("stream summaries not refreshed")
			for _, r := range batch {
				unsure[r.ProjectID] = true
			}
		}
	}
	if len(entries) > 0 {
		why := "written before an unclean stop"
		if s.dir.MigratedFrom > 0 && s.dir.MigratedFrom != s.dir.MigratedTo {
			why = "after the directory's upgrade (or written before an unclean stop)" // migrations 011-013 mark streams stale
		}
		s.log.Info().Int("streams", len(entries)).Msg("refreshed the summaries of streams " + why)
	}
	s.sweepSecrets(ctx, unsure)
}

// refreshBatch is how many streams' summaries a start writes in one directory commit.
const refreshBatch = 1000

// refreshSummary reads a stream's summary from its own database, for refreshStaleSummaries to
// write (nil: nothing to write, the stream was dropped or its summary written here).
func (s *Server) refreshSummary(ctx context.Context, e storage.StreamEntry) (*storage.SummaryRefresh, error) {
	store, err := s.backend.Open(ctx, e.StreamID)
	if err != nil {
		return nil, err
	}
	if store == nil {
		if e.Born {
			return nil, s.storeLost(e) // never dropped: its entry is all that says it existed
		}
		return nil, s.dropUnfinished(e)
	}
	s.noteOpened(store, e.ProjectID, e.Path, e.StreamID)
	meta, err := store.Meta(ctx)
	var list []storage.Reader
	if err == nil {
		list, err = store.Readers(ctx)
	}
	born := false
	if err == nil {
		born, err = bornIn(ctx, store, meta.HeadOffset, len(list))
	}
	if err != nil || !born {
		store.Close() // before its file is removed
		if err != nil {
			return nil, err
		}
		if e.Born {
			return nil, s.storeLost(e)
		}
		return nil, s.dropUnfinished(e)
	}
	defer store.Close()
	raw, err := store.KV(ctx, coreStateKey)
	if err != nil {
		return nil, err
	}
	st, ok := decodeCoreState(raw)
	cursors, err := store.CursorRows(ctx)
	if err != nil {
		return nil, err
	}
	rows := make(map[string]storage.CursorRow, len(cursors))
	for _, r := range cursors {
		rows[r.Name] = r
	}
	readers := make(map[string]storage.Reader, len(list))
	for _, r := range list {
		readers[r.Name] = r
	}
	sum := summaryOf(meta.HeadOffset, meta.LastAppendAt, st, valueRow(rows), readers)
	sum.Born = true
	if !ok && raw != nil {
		// A catalog this server cannot read: keep the subscription counts the directory had,
		// and the stream's secret uses (an error: its project's secrets are not swept).
		sum.Subscriptions, sum.HaltedSubscriptions = e.SubscriptionCount, e.HaltedSubscriptions
		sum.MaxLag = max(sum.MaxLag, e.MaxLag)
		// It stays marked stale, so every start reads it again until a load checkpoints a
		// catalog this server reads (and its unload rewrites the uses).
		if err := s.dir.UpdateStreamSummary(ctx, e.StreamID, sum); err != nil {
			return nil, err
		}
		if err := s.dir.MarkSummaryStale(ctx, e.StreamID); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("the catalog of %s is from another version: its webhook secret uses are kept as they are", e.Path)
	}
	return &storage.SummaryRefresh{ProjectID: e.ProjectID, StreamID: e.StreamID,
		SecretRefs: refList(secretRefsOf(st)), Summary: sum}, nil
}

// bornIn says whether a stream's database holds its first commit: an event (head > 0), bornKey
// (a first commit that registered a reader), or a registered reader (one that a build before
// bornKey registered at head 0 on a database whose first commit had failed). A database holding
// none of them was never committed to: its creation was cut short, or failed.
func bornIn(ctx context.Context, kv interface {
	KV(context.Context, string) ([]byte, error)
}, head int64, readers int) (bool, error) {
	if head > 0 || readers > 0 {
		return true, nil
	}
	raw, err := kv.KV(ctx, bornKey)
	return raw != nil, err
}

// dropUnfinished deletes a stream whose creation a crash cut short before its first commit
// (its database missing, unfinished or holding no commit, see bornIn): nothing was ever
// acknowledged on it, so it does not exist. Its file goes first, durably: a crash (or a power
// cut) before the entry's delete leaves the entry, whose missing database the next start drops
// again, never a file no entry names.
func (s *Server) dropUnfinished(e storage.StreamEntry) error {
	if err := s.dropStreamEntry(context.Background(), e); err != nil {
		return err
	}
	s.log.Info().Str("project", e.ProjectID).Str("path", e.Path).Msg("dropped a stream whose creation an unclean stop cut short (nothing was committed to it)")
	return nil
}

// dropStreamEntry deletes a stream nothing was committed to: its file first, durably, then its
// directory entry (it no longer counts toward its project's streams).
func (s *Server) dropStreamEntry(ctx context.Context, e storage.StreamEntry) error {
	s.backupClaim(e.StreamID)
	if _, err := s.backend.Remove(ctx, []string{e.StreamID}); err != nil {
		return fmt.Errorf("drop the unfinished stream %s: %w", e.Path, err)
	}
	s.quota.forget([]string{e.StreamID})
	return s.dir.DeleteUnfinishedStream(ctx, e.StreamID)
}

// standing is where a stream's consumers stand, for its summary: subscriptions (halted, parked),
// registered readers, and the largest lag (head - confirmed) of a subscription or a registered
// reader, as their own lists compute it. A subscription without a cursor row yet counts as
// active at offset 0.
func standing(head int64, subs map[string]*catalogEntry, row func(name string) (storage.CursorRow, bool), readers map[string]storage.Reader) (st consumerStanding) {
	for name := range subs {
		var confirmed int64
		if r, ok := row(name); ok {
			confirmed = r.ConfirmedOffset
			switch r.Status {
			case storage.StatusHalted:
				st.halted++
			case storage.StatusParked:
				st.parked++
			}
		}
		st.maxLag = max(st.maxLag, head-confirmed)
	}
	for _, r := range readers {
		st.maxLag = max(st.maxLag, head-r.Checkpoint)
	}
	st.subscriptions, st.readers = len(subs), len(readers)
	return st
}

// summaryOf is the directory summary of a stream's state.
func summaryOf(head, lastAppendAt int64, core *coreState, row func(name string) (storage.CursorRow, bool), readers map[string]storage.Reader) storage.StreamSummary {
	sum := storage.StreamSummary{HeadOffset: head, LastAppendAt: lastAppendAt}
	var subs map[string]*catalogEntry // no catalog stored: no subscriptions
	if core != nil {
		subs = core.Subscriptions
	}
	st := standing(head, subs, row, readers)
	sum.Subscriptions, sum.HaltedSubscriptions, sum.ParkedSubscriptions = st.subscriptions, st.halted, st.parked
	sum.MaxLag, sum.Readers = st.maxLag, st.readers
	return sum
}

// valueRow and pointerRow look a cursor row up in the view's copy and in the actor's own state.
func valueRow(rows map[string]storage.CursorRow) func(string) (storage.CursorRow, bool) {
	return func(name string) (storage.CursorRow, bool) { r, ok := rows[name]; return r, ok }
}

func pointerRow(rows map[string]*storage.CursorRow) func(string) (storage.CursorRow, bool) {
	return func(name string) (storage.CursorRow, bool) {
		if r := rows[name]; r != nil {
			return *r, true
		}
		return storage.CursorRow{}, false
	}
}
