//go:build !cgo

package storage

import (
	"context"

	"github.com/itx-dev/itx"
)

// scanPool is scan_cgo.go's direct reader; without cgo there is none and reads use database/sql.
type scanPool struct{}

func newScanPool(string) *scanPool                                   { return nil }
func (*scanPool) events(context.Context, Query) ([]itx.Event, error) { return nil, nil }
func (*scanPool) close()                                             {}
