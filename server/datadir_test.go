package server

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/rs/zerolog"
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
