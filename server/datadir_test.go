package server

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

func TestDataDirError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&fs.PathError{Op: "open", Path: "d/x", Err: syscall.EROFS}, "data directory d is on a read-only file system: open d/x: read-only file system"},
		{&fs.PathError{Op: "open", Path: "d/x", Err: syscall.EACCES}, fmt.Sprintf("data directory d is read-only for this user (uid %d): open d/x: permission denied", os.Getuid())},
		{&fs.PathError{Op: "open", Path: "d/x", Err: syscall.ENOSPC}, "data directory d: open d/x: no space left on device"},
	} {
		if got := dataDirError("d", tc.err).Error(); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
}

// TestPrepareDataDir_NotADirectory: a data directory path that is a file is refused before SQLite.
func TestPrepareDataDir_NotADirectory(t *testing.T) {
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := prepareDataDir(f, zerolog.Nop()); err == nil {
		t.Fatal("got nil, want an error")
	}
}

func TestWriteFileDurably_ReplacesWholeAndLeavesNoTemporary(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, CredentialsFile)
	require.NoError(t, WriteFileDurably(name, []byte("old\n"), 0o600))
	require.NoError(t, WriteFileDurably(name, []byte("new\n"), 0o600))
	b, err := os.ReadFile(name)
	require.NoError(t, err)
	require.Equal(t, "new\n", string(b))
	st, err := os.Stat(name)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "the temporary file is renamed away")

	// A directory that cannot take the temporary file: an error, the old file untouched.
	require.NoError(t, os.Mkdir(name+".tmp", 0o700))
	require.Error(t, WriteFileDurably(name, []byte("newer\n"), 0o600))
	b, err = os.ReadFile(name)
	require.NoError(t, err)
	require.Equal(t, "new\n", string(b))
}

// One server at a time on a data directory: a second Open is refused naming the holder, and the
// directory is free again once the first closes.
func TestOpen_DataDirectoryIsLocked(t *testing.T) {
	dir := t.TempDir()
	first, err := Open(context.Background(), Config{DataDir: dir})
	require.NoError(t, err)
	_, err = Open(context.Background(), Config{DataDir: dir})
	require.Error(t, err)
	require.Contains(t, err.Error(), "in use by another itxd")
	require.Contains(t, err.Error(), fmt.Sprintf("pid %d", os.Getpid()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, first.Close(ctx))
	again, err := Open(context.Background(), Config{DataDir: dir})
	require.NoError(t, err)
	require.NoError(t, again.Close(ctx))
}

// A data directory or data file open to other users is used, with a warning naming it.
func TestPrepareDataDir_WarnsOfWideModes(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "directory.db"), nil, 0o644))
	require.NoError(t, os.Chmod(filepath.Join(dir, "directory.db"), 0o644))
	var buf bytes.Buffer
	require.NoError(t, prepareDataDir(dir, zerolog.New(&buf)))
	out := buf.String()
	require.Contains(t, out, "data directory is readable by other users")
	require.Contains(t, out, "data file is readable by other users")
	require.Contains(t, out, filepath.Join(dir, "directory.db"))
}
