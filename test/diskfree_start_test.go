package test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// itx_disk_free_bytes holds a reading from the start: it said 0 until the first append, so an
// operator's alert on the free space nearing the reserve fired after every restart of a quiet
// server.
func TestDiskReserve_FreeBytesReadAtStart(t *testing.T) {
	metrics := freeAddr(t)
	startItxd(t, t.TempDir(), "--min-free-disk-bytes", "4096", "--metrics", metrics)
	require.Greater(t, scrapeMetric(t, metrics, "itx_disk_free_bytes"), float64(4096))

	// Without a reserve too (it said 0 for good).
	metrics = freeAddr(t)
	startItxd(t, t.TempDir(), "--min-free-disk-bytes", "-1", "--metrics", metrics)
	require.Greater(t, scrapeMetric(t, metrics, "itx_disk_free_bytes"), float64(4096))
	require.Zero(t, scrapeMetric(t, metrics, "itx_disk_reserve_bytes"))
}
