package test

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// itxd serves /healthz and /readyz beside /metrics for supervisors and load balancers.
func TestItxd_HealthAndReadiness(t *testing.T) {
	metrics := freeAddr(t)
	startItxd(t, t.TempDir(), "--metrics", metrics)
	for _, path := range []string{"/healthz", "/readyz"} {
		var code int
		var body []byte
		waitUntil(t, path+" served", func() bool {
			resp, err := http.Get("http://" + metrics + path)
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			code = resp.StatusCode
			body, _ = io.ReadAll(resp.Body)
			return true
		})
		require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
	}
}

// Server.Ready, behind /readyz, fails once the server is shutting down.
func TestServer_Ready(t *testing.T) {
	srv, err := server.Open(context.Background(), server.Config{DataDir: t.TempDir()})
	require.NoError(t, err)
	require.NoError(t, srv.Ready(context.Background()))
	require.NoError(t, srv.Close(context.Background()))
	require.ErrorContains(t, srv.Ready(context.Background()), "shutting down")
}
