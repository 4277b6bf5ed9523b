package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"

	sqlite3 "github.com/mattn/go-sqlite3"
)

// BackupSource is a database held as it stood at one instant, for a backup: a read transaction
// on a connection of its own. In WAL mode it waits for no writer and holds none back; what
// commits after it began is not in what it copies.
type BackupSource struct {
	conn *sql.Conn
	own  *sql.DB // the pool opened for it, for a database nothing else has open
}

// HoldForBackup begins a BackupSource on one of the stream's read connections: call it between
// commits (the stream's writer calls it), so the source holds every commit so far and no part of
// a later one.
func (s *Stream) HoldForBackup(ctx context.Context) (*BackupSource, error) {
	return holdSource(ctx, s.r, nil)
}

// HoldForBackup begins a BackupSource of the directory.
func (d *Directory) HoldForBackup(ctx context.Context) (*BackupSource, error) {
	return holdSource(ctx, d.db, nil)
}

// OpenBackupSource opens the database at file on a connection of its own and begins a
// BackupSource there; nil, nil when no file is there.
func OpenBackupSource(ctx context.Context, file string) (*BackupSource, error) {
	if _, err := os.Stat(file); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	db, err := openPool(file, false, 1, nil)
	if err != nil {
		return nil, fmt.Errorf("open %s for a backup: %w", file, err)
	}
	return holdSource(ctx, db, db)
}

func holdSource(ctx context.Context, db *sql.DB, own *sql.DB) (*BackupSource, error) {
	c, err := db.Conn(ctx)
	if err == nil {
		// A deferred BEGIN takes its snapshot at its first read.
		if _, err = c.ExecContext(ctx, "BEGIN"); err == nil {
			var n int
			if err = c.QueryRowContext(ctx, "select count(*) from sqlite_master").Scan(&n); err != nil {
				c.ExecContext(context.Background(), "ROLLBACK")
			}
		}
		if err != nil {
			c.Close()
		}
	}
	if err != nil {
		if own != nil {
			own.Close()
		}
		return nil, fmt.Errorf("hold a database for a backup: %w", err)
	}
	return &BackupSource{conn: c, own: own}, nil
}

// CopyTo writes the held database to a new file at dest (mode FileMode) with SQLite's online
// backup, in one step under the held read transaction, checks it with SQLite's quick_check, and
// returns the file's size. The copy is a WAL database like its source (its header says so), on
// disk when CopyTo returns; its folder entry is the caller's to sync.
func (b *BackupSource) CopyTo(ctx context.Context, dest string) (int64, error) {
	if _, err := os.Lstat(dest); err == nil {
		return 0, fmt.Errorf("backup to %s: the file exists", dest)
	}
	if err := createPrivate(dest); err != nil {
		return 0, fmt.Errorf("backup to %s: %w", dest, err)
	}
	db, err := sql.Open(backupDriver, fileURI(dest)+"?mode=rw&_mutex=no")
	if err != nil {
		return 0, fmt.Errorf("backup to %s: %w", dest, err)
	}
	db.SetMaxOpenConns(1)
	err = copyInto(ctx, db, b.conn)
	if cerr := db.Close(); err == nil && cerr != nil {
		err = cerr
	}
	var size int64
	if err == nil {
		size, err = syncFile(dest)
	}
	if err != nil {
		return 0, fmt.Errorf("backup to %s: %w", dest, err)
	}
	return size, nil
}

// backupDriver writes a backup's copy: a new file nothing else reads until the backup is done,
// so without a journal and without syncs; CopyTo syncs the whole file once at the end (a crash
// before that leaves the backup's temporary folder, never the copy).
const backupDriver = "sqlite3_itx_backup_copy"

func init() {
	sql.Register(backupDriver, &sqlite3.SQLiteDriver{
		ConnectHook: func(c *sqlite3.SQLiteConn) error {
			for _, p := range []string{"PRAGMA journal_mode=OFF", "PRAGMA synchronous=OFF"} {
				if _, err := c.Exec(p, nil); err != nil {
					return fmt.Errorf("%s: %w", p, err)
				}
			}
			return nil
		},
	})
}

// syncFile fsyncs the file at name and returns its size.
func syncFile(name string) (int64, error) {
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return 0, err
	}
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

func copyInto(ctx context.Context, db *sql.DB, src *sql.Conn) error {
	dc, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer dc.Close()
	err = src.Raw(func(s any) error {
		return dc.Raw(func(d any) error {
			sc, ok1 := s.(*sqlite3.SQLiteConn)
			dconn, ok2 := d.(*sqlite3.SQLiteConn)
			if !ok1 || !ok2 {
				return errors.New("not a SQLite connection")
			}
			bk, err := dconn.Backup("main", sc, "main")
			if err != nil {
				return err
			}
			done, err := bk.Step(-1)
			if ferr := bk.Finish(); err == nil {
				err = ferr
			}
			if err == nil && !done {
				err = errors.New("the backup did not copy every page in one step")
			}
			return err
		})
	})
	if err != nil {
		return err
	}
	// The copy checked as a database before it counts: a page the source's disk corrupted is
	// found now, not at the restore.
	var check string
	if err := dc.QueryRowContext(ctx, "PRAGMA quick_check(1)").Scan(&check); err != nil {
		return fmt.Errorf("check the copy: %w", err)
	}
	if check != "ok" {
		return fmt.Errorf("the copy fails SQLite's quick_check: %s", check)
	}
	return nil
}

// Close ends the read transaction and returns (or closes) its connection.
func (b *BackupSource) Close() error {
	_, rerr := b.conn.ExecContext(context.Background(), "ROLLBACK")
	err := errors.Join(rerr, b.conn.Close())
	if b.own != nil {
		err = errors.Join(err, b.own.Close())
	}
	return err
}

// StreamIDs lists the streams of a held directory, as it stood when it was held, and those of
// them whose first commit landed (StreamEntry.Born: their store must be there).
func (b *BackupSource) StreamIDs(ctx context.Context) (ids []string, born map[string]bool, err error) {
	rows, err := b.conn.QueryContext(ctx, `select stream_id, born from streams`)
	if err != nil {
		return nil, nil, fmt.Errorf("list streams for a backup: %w", err)
	}
	defer rows.Close()
	born = map[string]bool{}
	for rows.Next() {
		var id string
		var isBorn bool
		if err := rows.Scan(&id, &isBorn); err != nil {
			return nil, nil, fmt.Errorf("list streams for a backup: %w", err)
		}
		ids = append(ids, id)
		if isBorn {
			born[id] = true
		}
	}
	return ids, born, rows.Err()
}
