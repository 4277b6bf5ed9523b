//go:build linux && cgo

package server

// #include <malloc.h>
import "C"

// releaseFreedMemory hands memory that SQLite freed (unloaded streams' page caches and
// lookaside) back to the operating system: glibc otherwise keeps it, and a server that once held
// many streams would keep their peak RSS forever.
func releaseFreedMemory() { C.malloc_trim(0) }
