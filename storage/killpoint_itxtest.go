//go:build itxtest

package storage

import (
	"os"
	"syscall"
)

// A test build of itxd (go build -tags itxtest; never a release) kills itself at
// ITXD_TEST_KILL_AT=vacuum-mid-transaction inside a vacuum's transaction, before its commit: at
// its 127th page, the last but one of a 512 KiB turn (server's vacuumChunkBytes), by when the
// connection's page cache (512 KiB) has spilled uncommitted pages into the WAL (23 frames, seen
// once), which recovery must ignore. The points outside storage are in
// server/killpoint_itxtest.go.
func init() {
	if os.Getenv("ITXD_TEST_KILL_AT") == "vacuum-mid-transaction" {
		vacuumPageHook = func(pages int64) {
			if pages == 127 {
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // nothing after the point runs while the signal lands
			}
		}
	}
}
