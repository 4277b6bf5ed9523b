//go:build !cgo

package storage

func configureSQLite() int { return 0 }
