package storage

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/itx-dev/itx"
	sqlite3 "github.com/mattn/go-sqlite3"
)

// Damaged says whether err is SQLite finding a database file damaged: not a database at all
// (SQLITE_NOTADB: its header overwritten) or corrupt (SQLITE_CORRUPT: a page overwritten, or the
// file cut short). No retry mends it: the file must be restored from a backup.
func Damaged(err error) bool {
	var se sqlite3.Error
	return errors.As(err, &se) && (se.Code == sqlite3.ErrCorrupt || se.Code == sqlite3.ErrNotADB)
}

// ErrorCode maps a storage error to the domain code a caller can act on: a full disk (SQLite's
// SQLITE_FULL, which it reports for ENOSPC in a database or WAL write; an SQLITE_IOERR or other
// SQLite error whose system errno is ENOSPC, as when creating a database or its WAL; or ENOSPC
// itself) is EResourceExhausted, since the same call succeeds once space returns; a disk that
// failed a read, write or fsync (SQLITE_IOERR, EIO) is EUnavailable: nothing was committed, and
// the call may succeed once the disk works again; a damaged database file (Damaged) is
// EUnavailable too: the stream cannot be served until its file is restored; anything else is
// EInternal. This is the one place storage failures get a code.
func ErrorCode(err error) itx.Code {
	var se sqlite3.Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &se) && (se.Code == sqlite3.ErrFull || se.SystemErrno == syscall.ENOSPC),
		errors.Is(err, syscall.ENOSPC):
		return itx.EResourceExhausted
	case errors.As(err, &se) && se.Code == sqlite3.ErrIoErr, errors.Is(err, syscall.EIO), Damaged(err):
		return itx.EUnavailable
	}
	return itx.EInternal
}

// LimitPages bounds the stream database to n pages (PRAGMA max_page_count; 0 lifts the bound to
// SQLite's maximum). Past it a commit fails exactly as on a full disk, with SQLITE_FULL, and is
// rolled back: tests use it to fill the disk deterministically and to give the space back.
func (s *Stream) LimitPages(ctx context.Context, n int64) error {
	if n <= 0 {
		n = 4294967294
	}
	_, err := s.w.ExecContext(ctx, fmt.Sprintf("PRAGMA max_page_count=%d", n))
	return err
}

// PageCount returns the database's current size in pages.
func (s *Stream) PageCount(ctx context.Context) (int64, error) {
	var n int64
	err := s.w.QueryRowContext(ctx, "PRAGMA page_count").Scan(&n)
	return n, err
}
