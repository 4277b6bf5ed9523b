//go:build unix

package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// DataDirLockFile is the file in the data directory whose lock one itxd holds while it serves
// the directory: two processes writing one stream's database would each number its events.
const DataDirLockFile = "itxd.lock"

// lockDataDir takes an exclusive, non-blocking flock on dir's lock file for as long as the
// server is open (the kernel drops it when the process dies, kill -9 included), and records the
// holder's pid in it for the refusal of a second one.
func lockDataDir(dir string) (unlock func(), err error) {
	path := filepath.Join(dir, DataDirLockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, dataDirError(dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			who := strings.TrimSpace(string(holder))
			if who == "" {
				who = "a process"
			}
			return nil, fmt.Errorf("data directory %s is in use by another itxd (%s holds %s): a data directory is served by one process at a time", dir, who, path)
		}
		return nil, fmt.Errorf("lock data directory %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(fmt.Sprintf("pid %d\n", os.Getpid())), 0)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
