//go:build !cgo

package storage

import "github.com/itx-dev/itx"

// scanPool is scan_cgo.go's direct reader; without cgo there is none and reads use database/sql.
type scanPool struct{}

func newScanPool(string) *scanPool                  { return nil }
func (*scanPool) events(Query) ([]itx.Event, error) { return nil, nil }
func (*scanPool) close()                            {}
