package storage

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A held stream copies as it stood when it was held: commits after that are not in the copy,
// and the copy opens as an itx stream of its own with every event held.
func TestBackupSource_CopiesTheHeldInstant(t *testing.T) {
	ctx := context.Background()
	s, _ := mustCreateStream(t)
	require.NoError(t, s.Commit(ctx, Commit{Events: events(1, 300, 7), HeadOffset: 300, LastAppendAt: 400}))

	src, err := s.HoldForBackup(ctx)
	require.NoError(t, err)
	// Commits after the hold, and many of them: the WAL grows past what the held reader sees.
	for i := int64(0); i < 20; i++ {
		from := 301 + i*50
		require.NoError(t, s.Commit(ctx, Commit{Events: events(from, 50, 0), HeadOffset: from + 49, LastAppendAt: 500}))
	}

	dest := filepath.Join(t.TempDir(), "copy.db")
	size, err := src.CopyTo(ctx, dest)
	require.NoError(t, err)
	require.NoError(t, src.Close())
	st, err := os.Stat(dest)
	require.NoError(t, err)
	require.Equal(t, st.Size(), size)
	require.Equal(t, os.FileMode(FileMode), st.Mode().Perm())

	c, err := OpenStream(ctx, dest)
	require.NoError(t, err)
	defer c.Close()
	meta, err := c.Meta(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(300), meta.HeadOffset)
	require.Equal(t, "sid", meta.StreamID)
	got, err := c.Events(ctx, Query{After: 0, UpTo: 10_000, Limit: 1000, IncludeEphemeral: true})
	require.NoError(t, err)
	require.Len(t, got, 300)
	for i, e := range got {
		require.Equal(t, int64(i+1), e.Offset)
	}

	// The source goes on as before.
	meta, err = s.Meta(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1300), meta.HeadOffset)
}

func TestBackupSource_RefusesAnExistingFileAndAMissingSource(t *testing.T) {
	ctx := context.Background()
	s, file := mustCreateStream(t)
	src, err := s.HoldForBackup(ctx)
	require.NoError(t, err)
	defer src.Close()
	_, err = src.CopyTo(ctx, file)
	require.ErrorContains(t, err, "exists")

	none, err := OpenBackupSource(ctx, filepath.Join(t.TempDir(), "none.db"))
	require.NoError(t, err)
	require.Nil(t, none)

	// A stream nothing has open: the source opens its own connection.
	other, err := OpenBackupSource(ctx, file)
	require.NoError(t, err)
	dest := filepath.Join(t.TempDir(), "c.db")
	_, err = other.CopyTo(ctx, dest)
	require.NoError(t, err)
	require.NoError(t, other.Close())
	c, err := OpenStream(ctx, dest)
	require.NoError(t, err)
	require.NoError(t, c.Close())
}

// A source whose pages the disk corrupted makes a copy that fails quick_check: the backup says
// so instead of keeping it.
func TestBackupSource_RefusesACorruptCopy(t *testing.T) {
	ctx := context.Background()
	s, file := mustCreateStream(t)
	require.NoError(t, s.Commit(ctx, Commit{Events: events(1, 2000, 0), HeadOffset: 2000, LastAppendAt: 1}))
	require.NoError(t, s.Close())

	b, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Greater(t, len(b), 8*4096)
	for i := 5 * 4096; i < 6*4096; i++ { // a page in the middle of the events' b-tree
		b[i] = 0xA5
	}
	bad := filepath.Join(t.TempDir(), "bad.db")
	require.NoError(t, os.WriteFile(bad, b, FileMode))
	src, err := OpenBackupSource(ctx, bad)
	require.NoError(t, err)
	defer src.Close()
	_, err = src.CopyTo(ctx, filepath.Join(t.TempDir(), "copy.db"))
	require.ErrorContains(t, err, "quick_check")
}
