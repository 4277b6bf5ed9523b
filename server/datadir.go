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

// checkDirectoryKept refuses a data directory whose directory database is gone (missing, or
// empty with no write-ahead log holding it) while stream files remain: opened, it would be made
// anew, empty, and itxd would start as on a fresh directory, with new tokens written over
// credentials.json and every stream unreachable. A first start cut short leaves no stream file
// (streams are made once the directory has its projects), so it is never refused.
func checkDirectoryKept(dir string) error {
	file := filepath.Join(dir, "directory.db")
	if nonEmpty(file) || nonEmpty(file+"-wal") {
		return nil
	}
	streams, err := filepath.Glob(filepath.Join(dir, "streams", "*.db"))
	if err != nil || len(streams) == 0 {
		return nil
	}
	return fmt.Errorf("data directory %s holds %d stream files but its directory database %s is missing or empty: it was lost or damaged, and started on, itxd would begin an empty data directory beside them; restore the data directory from a backup (README, Damaged storage)",
		dir, len(streams), file)
}

func nonEmpty(file string) bool {
	fi, err := os.Stat(file)
	return err == nil && fi.Size() > 0
}
