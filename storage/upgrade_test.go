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

// A directory from before migration 007 kept no consumer standing (halted subscriptions, max
// lag) for its streams; 007 gave every stream 0 and 0, so Streams.list showed an unloaded
// stream with halted subscriptions and lagging consumers as healthy until it was next loaded
// and unloaded. Migration 011 marks such streams stale, so the next start refreshes them from
// their own databases.
func TestDirectory_MigratesConsumerStanding(t *testing.T) {
	ctx := context.Background()
	db, err := openDB(filepath.Join(t.TempDir(), "dir.db"), true, 1)
	require.NoError(t, err)
	defer db.Close()
	for _, name := range []string{"001_init.sql", "002_subscription_count.sql", "003_summary_stale.sql", "004_parked.sql", "005_access.sql", "006_stream_counts.sql"} {
		body, err := migrations.ReadFile("migrations/directory/" + name)
		require.NoError(t, err)
		_, err = db.ExecContext(ctx, string(body))
		require.NoError(t, err)
	}
	_, err = db.ExecContext(ctx, `PRAGMA user_version = 6`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `insert into projects (id, name, token_hash, created_at) values ('p', 'p', 'h', 1)`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `insert into streams (stream_id, project_id, path, created_at, head_offset, subscription_count) values ('s1', 'p', '/a', 1, 10, 2)`)
	require.NoError(t, err)

	from, to, err := migrate(ctx, db, "directory")
	require.NoError(t, err)
	last, err := latestVersion("directory")
	require.NoError(t, err)
	require.Equal(t, []int{6, last}, []int{from, to}, "the versions found and left, for the start-up's log")
	d := &Directory{db: db}
	stale, err := d.StaleStreams(ctx)
	require.NoError(t, err)
	var ids []string
	for _, e := range stale {
		ids = append(ids, e.StreamID)
	}
	require.Equal(t, []string{"s1"}, ids, "a summary without its consumer standing is refreshed at the next start")
}
