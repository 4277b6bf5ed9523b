package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/itx-dev/itx/internal/itxtest"
)

// runItxdOnLoopback starts itxd (runItxd) on a freshly drawn loopback address, drawing again when
// itxd cannot listen on one, and returns it with the address: a restart on that address (runItxd
// with it) finds it free.
func runItxdOnLoopback(t *testing.T, data string) (*itxdProcess, string) {
	t.Helper()
	var err error
	for range itxtest.LoopbackTries {
		var p *itxdProcess
		var addr string
		if p, addr, err = tryRunItxd(t, data, itxtest.RandomLoopbackAddr()); err == nil {
			return p, addr
		}
	}
	require.NoError(t, err, "itxd found no free loopback address in %d draws", itxtest.LoopbackTries)
	return nil, ""
}
