package storage

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A data directory whose path holds a '#', a '?' or a '%' keeps its databases in it. They were
// opened by a "file:" URI written as it stood, which SQLite reads up to a '#' or '?' (and
// decodes %HH in): a directory database under /srv/itx#2 was opened at /srv/itx, beside the data
// directory, shared by every data directory named so, and a second one made there found the
// first one's deployment (a t.TempDir of a subtest named twice, "churn#01", did).
func TestFileURI_SpecialCharactersInThePath(t *testing.T) {
	ctx := context.Background()
	parent := t.TempDir()
	dir := filepath.Join(parent, "itx#2?mode=ro&x=%41")
	require.NoError(t, os.Mkdir(dir, 0o700))

	d, err := OpenDirectory(ctx, filepath.Join(dir, "directory.db"))
	require.NoError(t, err)
	require.NoError(t, d.Close())

	file := filepath.Join(dir, "s.db")
	s, err := CreateStream(ctx, file, StreamMeta{StreamID: "sid", ProjectID: "p", Path: "/a", CreatedAt: 1})
	require.NoError(t, err)
	require.NoError(t, s.Commit(ctx, Commit{Events: events(1, 3, 0), HeadOffset: 3, LastAppendAt: 2}))
	src, err := s.HoldForBackup(ctx)
	require.NoError(t, err)
	_, err = src.CopyTo(ctx, filepath.Join(dir, "copy.db"))
	require.NoError(t, err)
	require.NoError(t, src.Close())
	require.NoError(t, s.Close())

	snap, err := OpenSnapshot(ctx, file)
	require.NoError(t, err)
	meta, err := snap.Meta(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), meta.HeadOffset)
	require.NoError(t, snap.Close())
	s, err = OpenStream(ctx, file)
	require.NoError(t, err)
	require.NoError(t, s.Close())

	entries, err := os.ReadDir(parent)
	require.NoError(t, err)
	require.Len(t, entries, 1, "nothing made beside the data directory: %v", entries)
	for _, name := range []string{"directory.db", "s.db", "copy.db"} {
		st, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err, name)
		require.Greater(t, st.Size(), int64(0), name)
	}
	copied, err := OpenSnapshot(ctx, filepath.Join(dir, "copy.db"))
	require.NoError(t, err)
	meta, err = copied.Meta(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), meta.HeadOffset)
	require.NoError(t, copied.Close())
}
