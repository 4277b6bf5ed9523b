//go:build !(linux && cgo)

package server

func releaseFreedMemory() {}
