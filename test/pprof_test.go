package test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// --pprof serves Go's profiler on the --metrics address; without it the path is not served.
func TestItxd_PprofOnlyWhenAsked(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	status := func(addr string) int {
		resp, err := http.Get("http://" + addr + "/debug/pprof/")
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	plain := freeAddr(t)
	startItxd(t, t.TempDir(), "--metrics", plain)
	require.Equal(t, http.StatusNotFound, status(plain))

	profiled := freeAddr(t)
	startItxd(t, t.TempDir(), "--metrics", profiled, "--pprof")
	require.Equal(t, http.StatusOK, status(profiled))
}
