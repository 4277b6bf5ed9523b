package server

import (
	"context"

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
	inParallel(entries, func(e storage.StreamEntry) {
		if err := s.refreshSummary(ctx, e); err != nil {
			s.log.Warn().Err(err).Str("path", e.Path).Msg("stream summary not refreshed")
		}
	})
	if len(entries) > 0 {
		s.log.Info().Int("streams", len(entries)).Msg("refreshed the summaries of streams written before an unclean stop")
	}
}

func (s *Server) refreshSummary(ctx context.Context, e storage.StreamEntry) error {
	store, err := s.backend.Open(ctx, e.StreamID)
	if err != nil {
		return err
	}
	if store == nil {
		return s.dir.UpdateStreamSummary(ctx, e.StreamID, 0, 0, 0) // created, never committed
	}
	defer store.Close()
	meta, err := store.Meta(ctx)
	if err != nil {
		return err
	}
	subscriptions := e.SubscriptionCount
	raw, err := store.KV(ctx, coreStateKey)
	if err != nil {
		return err
	}
	if st, ok := decodeCoreState(raw); ok {
		subscriptions = len(st.Subscriptions)
	}
	return s.dir.UpdateStreamSummary(ctx, e.StreamID, meta.HeadOffset, meta.LastAppendAt, subscriptions)
}
