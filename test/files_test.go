package test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/itx-dev/itx/server"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// TestDataDir_FilesArePrivate: whatever the umask, the data directory is 0700 and every
// database, WAL and SHM file and credentials.json 0600.
func TestDataDir_FilesArePrivate(t *testing.T) {
	old := syscall.Umask(0o022)
	t.Cleanup(func() { syscall.Umask(old) })
	dir := filepath.Join(t.TempDir(), "data")
	ts := startServer(t, server.Config{DataDir: dir})
	mustAppend(t, stream(t, ts.project(t), "/orders"), ev("order/placed", `{"id":1}`))

	modes := map[string]os.FileMode{}
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		require.NoError(t, err)
		rel, _ := filepath.Rel(dir, p)
		modes[rel] = fi.Mode().Perm()
		return nil
	})
	var dbs, wals int
	for name, mode := range modes {
		switch {
		case name == "." || name == "streams":
			require.Equal(t, os.FileMode(0o700), mode, "dir %s", name)
		default:
			require.Equal(t, os.FileMode(0o600), mode, "file %s", name)
		}
		if strings.HasSuffix(name, ".db") {
			dbs++
		}
		if strings.HasSuffix(name, "-wal") {
			wals++
		}
	}
	require.Contains(t, modes, "credentials.json")
	require.GreaterOrEqual(t, dbs, 2, "directory.db and the stream's database: %v", modes)
	require.GreaterOrEqual(t, wals, 2, "WAL files: %v", modes)
}

// TestDataDir_WideModeWarns: an existing directory open to other users is used, with a warning.
func TestDataDir_WideModeWarns(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	require.NoError(t, os.Mkdir(dir, 0o755))
	require.NoError(t, os.Chmod(dir, 0o755))
	var logs bytes.Buffer
	srv, err := server.Open(context.Background(), server.Config{DataDir: dir, Log: zerolog.New(&logs)})
	require.NoError(t, err)
	require.NoError(t, srv.Close(context.Background()))
	require.Contains(t, logs.String(), "readable by other users")
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o755), fi.Mode().Perm(), "the operator's mode is left alone")
}

// TestDataDir_ReadOnlySaysSo: an existing data directory this user cannot write is refused at
// open with "read-only", not SQLite's "unable to open database file".
func TestDataDir_ReadOnlySaysSo(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root writes through directory modes; TestDataDirError covers the classification")
	}
	dir := filepath.Join(t.TempDir(), "data")
	srv, err := server.Open(context.Background(), server.Config{DataDir: dir})
	require.NoError(t, err)
	require.NoError(t, srv.Close(context.Background()))
	require.NoError(t, os.Chmod(dir, 0o500))
	t.Cleanup(func() { os.Chmod(dir, 0o700) })
	_, err = server.Open(context.Background(), server.Config{DataDir: dir})
	require.ErrorContains(t, err, "read-only")
}
