package storage

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A database written by a newer itxd (user_version above every migration this build knows) is
// refused with ErrSchemaTooNew, naming both versions, and left exactly as it was: reading it as
// if it were this build's format could misread or rewrite what the newer build stored.
func TestMigrate_RefusesNewerSchema(t *testing.T) {
	ctx := context.Background()
	for _, set := range []string{"directory", "stream"} {
		t.Run(set, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "x.db")
			if set == "directory" {
				d, err := OpenDirectory(ctx, file)
				require.NoError(t, err)
				require.NoError(t, d.Close())
			} else {
				s, err := CreateStream(ctx, file, StreamMeta{StreamID: "sid", ProjectID: "p", Path: "/a", CreatedAt: 5})
				require.NoError(t, err)
				require.NoError(t, s.Close())
			}
			known, err := latestVersion(set)
			require.NoError(t, err)
			db, err := openDB(file, false, 1)
			require.NoError(t, err)
			_, err = db.ExecContext(ctx, "PRAGMA user_version = 999")
			require.NoError(t, err)
			require.NoError(t, db.Close())

			if set == "directory" {
				_, err = OpenDirectory(ctx, file)
			} else {
				_, err = OpenStream(ctx, file)
			}
			require.Error(t, err)
			require.True(t, errors.Is(err, ErrSchemaTooNew), "got %v", err)
			require.Contains(t, err.Error(), "999")
			require.Contains(t, err.Error(), itoa(int64(known)))

			db, err = openDB(file, false, 1)
			require.NoError(t, err)
			defer db.Close()
			var v int
			require.NoError(t, db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v))
			require.Equal(t, 999, v, "the newer database is left as it was")
		})
	}
}
