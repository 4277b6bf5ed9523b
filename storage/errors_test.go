package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/itx-dev/itx"
	sqlite3 "github.com/mattn/go-sqlite3"
	"github.com/stretchr/testify/require"
)

func TestErrorCode(t *testing.T) {
	require.Equal(t, itx.Code(""), ErrorCode(nil))
	require.Equal(t, itx.EResourceExhausted, ErrorCode(fmt.Errorf("write: %w", syscall.ENOSPC)))
	require.Equal(t, itx.EInternal, ErrorCode(errors.New("disk on fire")))
	// Creating a database (or its WAL) on a full disk fails as a disk I/O error with errno
	// ENOSPC, not as SQLITE_FULL.
	require.Equal(t, itx.EResourceExhausted, ErrorCode(fmt.Errorf("open: %w",
		sqlite3.Error{Code: sqlite3.ErrIoErr, ExtendedCode: sqlite3.ErrIoErrWrite, SystemErrno: syscall.ENOSPC})))
	// A disk that failed a write or an fsync: nothing was committed, the call may succeed later.
	require.Equal(t, itx.EUnavailable, ErrorCode(sqlite3.Error{Code: sqlite3.ErrIoErr, SystemErrno: syscall.EIO}))
	require.Equal(t, itx.EUnavailable, ErrorCode(fmt.Errorf("sync: %w", syscall.EIO)))
}

// TestStream_CommitOnAFullDisk: a commit past the database's size bound fails with
// EResourceExhausted and writes nothing; once space returns the same commit succeeds.
func TestStream_CommitOnAFullDisk(t *testing.T) {
	ctx := context.Background()
	s, _ := mustCreateStream(t)
	require.NoError(t, s.Commit(ctx, Commit{Events: events(1, 1, 0), HeadOffset: 1, LastAppendAt: 101}))
	pages, err := s.PageCount(ctx)
	require.NoError(t, err)
	require.NoError(t, s.LimitPages(ctx, pages))

	big := events(2, 50, 0)
	for i := range big {
		big[i].Payload = json.RawMessage(fmt.Sprintf(`{"pad":%q}`, strings.Repeat("x", 4000)))
	}
	err = s.Commit(ctx, Commit{Events: big, HeadOffset: 51, LastAppendAt: 151})
	require.Error(t, err)
	require.Equal(t, itx.EResourceExhausted, ErrorCode(err), "%v", err)
	got, err := s.Events(ctx, Query{After: 0, UpTo: 100, Limit: 100})
	require.NoError(t, err)
	require.Len(t, got, 1, "the failed commit wrote nothing")
	m, err := s.Meta(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), m.HeadOffset)

	require.NoError(t, s.LimitPages(ctx, 0)) // space returns
	require.NoError(t, s.Commit(ctx, Commit{Events: big, HeadOffset: 51, LastAppendAt: 151}))
	got, err = s.Events(ctx, Query{After: 0, UpTo: 100, Limit: 100})
	require.NoError(t, err)
	require.Len(t, got, 51)
}
