package server

import (
	"context"
	"sort"
	"strings"

	"github.com/itx-dev/itx"
)

// RegisterReader registers a reader under name with a declared checkpoint (at most the head), or
// moves the checkpoint of one already registered. Written through the stream's actor, with the
// stream's other state, so it survives restarts. A reader has no delivery obligation: registering
// makes its lag visible.
func (s *Server) RegisterReader(ctx context.Context, ref StreamRef, name string, checkpoint int64) error {
	return s.readerOp(ctx, ref, readerOp{name: strings.TrimSpace(name), checkpoint: checkpoint})
}

// RemoveReader removes a registered reader; ENotFound if there is none of that name.
func (s *Server) RemoveReader(ctx context.Context, ref StreamRef, name string) error {
	return s.readerOp(ctx, ref, readerOp{name: strings.TrimSpace(name), remove: true})
}

func (s *Server) readerOp(ctx context.Context, ref StreamRef, op readerOp) error {
	if err := itx.ValidatePath(ref.Path); err != nil {
		return err
	}
	a, err := s.acquire(ctx, ref)
	if err != nil {
		return err
	}
	defer s.release(a)
	op.reply = make(chan error, 1)
	select {
	case a.inbox <- &actorMsg{reader: &op}:
	case <-ctx.Done():
		return itx.Errorf(itx.ECancelled, "reader: %v", ctx.Err())
	}
	select {
	case err := <-op.reply:
		return err
	case <-ctx.Done():
		return itx.Errorf(itx.ECancelled, "reader: %v", ctx.Err())
	}
}

// ListReaders lists a stream's registered readers by name.
func (s *Server) ListReaders(ctx context.Context, ref StreamRef) ([]itx.ReaderInfo, error) {
	var out []itx.ReaderInfo
	err := s.withSubscriptions(ctx, ref, func(v view) error {
		out = readerInfos(v)
		return nil
	})
	return out, err
}

func readerInfos(v view) []itx.ReaderInfo {
	out := make([]itx.ReaderInfo, 0, len(v.readers))
	for _, r := range v.readers {
		out = append(out, itx.ReaderInfo{Name: r.Name, Checkpoint: r.Checkpoint, Lag: max(0, v.head-r.Checkpoint), UpdatedAt: r.UpdatedAt})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
