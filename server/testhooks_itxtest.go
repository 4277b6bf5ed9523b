//go:build itxtest

package server

import (
	"os"
	"runtime"
	"strconv"
	"time"
)

// A test build of itxd (go build -tags itxtest; never a release) takes the delivery timeout from
// ITXD_TEST_DELIVERY_TIMEOUT (a Go duration): a test of a peer that never answers itxd's calls
// sees each of them end within seconds instead of 20 s. ITXD_TEST_MEM_PROFILE_RATE sets
// runtime.MemProfileRate (1: every allocation in /debug/pprof/heap), to find what a test saw grow.
func init() {
	if d, err := time.ParseDuration(os.Getenv("ITXD_TEST_DELIVERY_TIMEOUT")); err == nil && d > 0 {
		defaultDeliveryTimeout = d
	}
	if r, err := strconv.Atoi(os.Getenv("ITXD_TEST_MEM_PROFILE_RATE")); err == nil && r > 0 {
		runtime.MemProfileRate = r
	}
}
