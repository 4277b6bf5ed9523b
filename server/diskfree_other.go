//go:build !linux

package server

// freeBytes is unknown here: a backup then runs without the check, and a full disk fails it.
func freeBytes(string) (int64, bool) { return 0, false }

// diskSize is unknown here: no default disk reserve.
func diskSize(string) (int64, bool) { return 0, false }

// sameFileSystem is unknown here: false.
func sameFileSystem(string, string) bool { return false }
