package server

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/rs/zerolog"
)

// DataDirMode is the mode itxd creates its data directory (and its streams/ folder) with: the
// databases hold every event and the token hashes, so no other local user may read them.
const DataDirMode = 0o700

// prepareDataDir creates dir and dir/streams with DataDirMode, warns when an existing directory
// is open to other users (its mode is the operator's to change, not ours), and checks that dir
// is writable so a read-only directory says so instead of failing later in SQLite with "unable
// to open database file".
func prepareDataDir(dir string, log zerolog.Logger) error {
	for _, d := range []string{dir, filepath.Join(dir, "streams")} {
		if err := os.MkdirAll(d, DataDirMode); err != nil {
			return dataDirError(dir, err)
		}
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o077 != 0 {
			log.Warn().Str("dir", d).Str("mode", fmt.Sprintf("%04o", fi.Mode().Perm())).
				Msg("data directory is readable by other users; chmod 700 it")
		}
	}
	// Files an older build made with wider modes: said, as for the directories (SQLite keeps a
	// database's mode for its WAL and SHM files).
	for _, name := range []string{"directory.db", "directory.db-wal", "directory.db-shm", "credentials.json"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err == nil && fi.Mode().Perm()&0o077 != 0 {
			log.Warn().Str("file", filepath.Join(dir, name)).Str("mode", fmt.Sprintf("%04o", fi.Mode().Perm())).
				Msg("data file is readable by other users; chmod 600 it")
		}
	}
	probe := filepath.Join(dir, ".itx-write-probe")
	f, err := os.OpenFile(probe, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return dataDirError(dir, err)
	}
	f.Close()
	if err := os.Remove(probe); err != nil {
		return dataDirError(dir, err)
	}
	return nil
}

// dataDirError names the cause an operator can act on: a read-only file system or a directory
// this user may not write.
func dataDirError(dir string, err error) error {
	switch {
	case errors.Is(err, syscall.EROFS):
		return fmt.Errorf("data directory %s is on a read-only file system: %w", dir, err)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("data directory %s is read-only for this user (uid %d): %w", dir, os.Getuid(), err)
	}
	return fmt.Errorf("data directory %s: %w", dir, err)
}
