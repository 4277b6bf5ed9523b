package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"

	"github.com/itx-dev/itx"
	sqlite3 "github.com/mattn/go-sqlite3"
)

// snapshotDriver opens a stream database as SQLite's immutable file: read only, no locks, no
// -wal or -shm file made or read. The itx driver's pragmas are left out (journal_mode=WAL would
// try to write).
const snapshotDriver = "sqlite3_itx_snapshot"

func init() {
	sql.Register(snapshotDriver, &sqlite3.SQLiteDriver{
		ConnectHook: func(c *sqlite3.SQLiteConn) error {
			_, err := c.Exec("PRAGMA cache_size=-512", nil)
			return err
		},
	})
}

// ErrWALPending: the stream's write-ahead log holds commits its database file does not, so the
// file alone is not the stream.
var ErrWALPending = errors.New("the stream's write-ahead log is not empty")

// OpenSnapshot opens the stream database at file for reads only, without the -wal and -shm
// files an ordinary open needs (on a full disk SQLite cannot make the -shm file, so an ordinary
// open fails). The file alone is the stream only when no write-ahead log holds commits: a
// non-empty -wal is refused with ErrWALPending (a stream closed cleanly leaves none). Nothing
// may open the stream to write while the snapshot is open (the caller holds its loads back).
// Close it after the read.
func OpenSnapshot(ctx context.Context, file string) (*Snapshot, error) {
	if err := walEmpty(file); err != nil {
		return nil, err
	}
	db, err := sql.Open(snapshotDriver, fileURI(file)+"?mode=ro&immutable=1&_mutex=no")
	if err != nil {
		return nil, fmt.Errorf("open stream snapshot %s: %w", file, err)
	}
	db.SetMaxOpenConns(1)
	// One pool reads everything (Close closes it twice, which database/sql allows).
	s := &Stream{file: file, w: db, r: db}
	steps, err := migrationSteps("stream")
	if err != nil {
		s.Close()
		return nil, err
	}
	var version int
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		s.Close()
		return nil, fmt.Errorf("open stream snapshot %s: %w", file, err)
	}
	if n := len(steps); n > 0 && version != steps[n-1].version {
		s.Close()
		return nil, fmt.Errorf("open stream snapshot %s: its schema is version %d, this itxd reads %d (an ordinary open migrates it)", file, version, steps[n-1].version)
	}
	return &Snapshot{s: s}, nil
}

// Snapshot is a stream's database file opened for reads only (OpenSnapshot).
type Snapshot struct{ s *Stream }

// Meta reads the stream's identity and head.
func (n *Snapshot) Meta(ctx context.Context) (StreamMeta, error) { return n.s.Meta(ctx) }

// Events reads a page, as Stream.Events does.
func (n *Snapshot) Events(ctx context.Context, q Query) ([]itx.Event, error) {
	return n.s.Events(ctx, q)
}

// KV, CursorRows and Readers read what Stream's methods of those names do.
func (n *Snapshot) KV(ctx context.Context, key string) ([]byte, error) { return n.s.KV(ctx, key) }

func (n *Snapshot) CursorRows(ctx context.Context) ([]CursorRow, error) { return n.s.CursorRows(ctx) }

func (n *Snapshot) Readers(ctx context.Context) ([]Reader, error) { return n.s.Readers(ctx) }

// Close closes the file.
func (n *Snapshot) Close() error { return n.s.Close() }

// walEmpty is nil when file's -wal is absent or empty.
func walEmpty(file string) error {
	st, err := os.Stat(file + "-wal")
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return err
	case st.Size() > 0:
		return ErrWALPending
	}
	return nil
}
