package server

import (
	"context"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

// streamStore is all a stream actor asks of its log: the narrow seam that the simulation's
// fault-injecting wrapper implements, and that a second backend (a replicated log) would. Nothing
// above it assumes the log is a local file.
type streamStore interface {
	Meta(ctx context.Context) (storage.StreamMeta, error)
	KV(ctx context.Context, key string) ([]byte, error)
	CursorRows(ctx context.Context) ([]storage.CursorRow, error)
	EventsByKeys(ctx context.Context, keys []string) (map[string]*itx.Event, error)
	Events(ctx context.Context, q storage.Query) ([]itx.Event, error)
	// Commit writes c in one transaction and returns once it is durable.
	Commit(ctx context.Context, c storage.Commit) error
	EphemeralBytes(ctx context.Context) (int64, error)
	EphemeralCutoff(ctx context.Context, need int64) (through, freed int64, err error)
	DeleteEphemeral(ctx context.Context, through, before int64) (int64, error)
	Close() error
}

var _ streamStore = (*storage.Stream)(nil)
