package server

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

// streamStore is all a stream actor asks of its log: the narrow seam that the simulation's
// fault-injecting wrapper implements, and that a second backend (a replicated log) would. Nothing
// above it assumes the log is a local file.
type streamStore interface {
	Meta(ctx context.Context) (storage.StreamMeta, error)
	KV(ctx context.Context, key string) ([]byte, error)
	// KVUsage counts the kv rows under a key prefix and their bytes (keys after the prefix, values).
	KVUsage(ctx context.Context, prefix string) (keys int, bytes int64, err error)
	CursorRows(ctx context.Context) ([]storage.CursorRow, error)
	Readers(ctx context.Context) ([]storage.Reader, error)
	// Scheduled appends: keys and times (what memory keeps), events by key, a bounded listing.
	ScheduledDue(ctx context.Context) ([]storage.Scheduled, error)
	ScheduledByKeys(ctx context.Context, keys []string) (map[string][]byte, error)
	ScheduledEvents(ctx context.Context, limit, maxBytes int) ([]storage.Scheduled, error)
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

// streamBackend makes and opens the stores of streams: the seam a second backend (a replicated
// log) implements. Nothing above it knows a stream is a local SQLite file.
type streamBackend interface {
	// Create makes the store of a new stream; it fails if one exists.
	Create(ctx context.Context, meta storage.StreamMeta) (streamStore, error)
	// Open opens a stream's store. It returns nil, nil when the stream's directory entry
	// committed but its store was never made, or never finished (a crash in between: nothing
	// was acknowledged); Create then makes it.
	Open(ctx context.Context, streamID string) (streamStore, error)
}

// sqliteBackend keeps each stream in its own SQLite file under dir.
type sqliteBackend struct{ dir string }

func (b sqliteBackend) file(streamID string) string { return filepath.Join(b.dir, streamID+".db") }

func (b sqliteBackend) Create(ctx context.Context, meta storage.StreamMeta) (streamStore, error) {
	return storage.CreateStream(ctx, b.file(meta.StreamID), meta)
}

func (b sqliteBackend) Open(ctx context.Context, streamID string) (streamStore, error) {
	file := b.file(streamID)
	if _, err := os.Stat(file); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	s, err := storage.OpenStream(ctx, file)
	if err != nil {
		if errors.Is(err, storage.ErrNotCreated) {
			return nil, nil
		}
		return nil, err
	}
	return s, nil
}
