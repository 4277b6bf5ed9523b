// Package itxtest starts an in-process itxd on a real loopback TCP port for tests: the same
// server, storage and capability graph as the binary, on a fresh (or given) data directory.
package itxtest

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"github.com/itx-dev/itx/capability"
	"github.com/itx-dev/itx/server"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// Server is a running in-process itxd.
type Server struct {
	Srv   *server.Server
	Addr  string // host:port of its RPC listener
	Creds server.Credentials
	Dir   string // data directory
}

// Start opens a server on cfg.DataDir (a fresh temporary one if empty) and serves it on TCP.
// Everything is closed when the test ends. ITX_TEST_LOG=1 routes its debug log to the test.
func Start(t testing.TB, cfg server.Config) *Server {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	if os.Getenv("ITX_TEST_LOG") != "" {
		cfg.Log = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel)
	}
	srv, err := server.Open(context.Background(), cfg)
	require.NoError(t, err)
	creds, err := server.ReadCredentials(cfg.DataDir)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l := capability.NewListener(srv)
	go l.Serve(ln)
	t.Cleanup(func() {
		ln.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Close(ctx)
		l.CloseConnections(ctx)
	})
	return &Server{Srv: srv, Addr: ln.Addr().String(), Creds: creds, Dir: cfg.DataDir}
}
