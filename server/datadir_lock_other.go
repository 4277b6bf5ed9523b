//go:build !unix

package server

// DataDirLockFile is the lock file of a data directory (unix only: elsewhere nothing is locked).
const DataDirLockFile = "itxd.lock"

// lockDataDir does nothing where flock is not available.
func lockDataDir(dir string) (unlock func(), err error) { return func() {}, nil }
