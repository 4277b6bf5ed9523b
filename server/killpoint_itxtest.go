//go:build itxtest

package server

import (
	"os"
	"syscall"
)

// A test build of itxd (go build -tags itxtest; never a release) can be killed at a point a
// crash test names in ITXD_TEST_KILL_AT: the process sends itself SIGKILL there, a kill -9 at
// exactly that point, which a kill from outside can only hit by chance. A point inside a storage
// transaction is storage's own (storage/killpoint_itxtest.go: vacuum-mid-transaction).
func init() {
	switch os.Getenv("ITXD_TEST_KILL_AT") {
	case "delete-project-committed":
		deleteProjectCommittedHook = killSelf
	case "trim-chunk-committed":
		trimChunkCommittedHook = killSelf
	case "trim-audited":
		trimAuditedHook = killSelf
	case "delete-stream-committed":
		deleteStreamCommittedHook = killSelf
	case "copy-committed":
		copyCommittedHook = killSelf
	case "dead-letter-committed":
		deadLetterCommittedHook = killSelf
	case "processor-forward-committed":
		processorForwardCommittedHook = killSelf
	case "backup-frozen":
		backupFrozenHook = killSelf
	case "backup-copied-one":
		backupCopiedHook = killSelf
	case "retention-set-committed":
		retentionSetCommittedHook = killSelf
	}
}

func killSelf() {
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // nothing after the point runs while the signal lands
}
