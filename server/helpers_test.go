package server

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// mustOpen opens a server on cfg.DataDir, closed when the test ends (or earlier by the test),
// and logs into its project.
func mustOpen(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { mustClose(t, s) })
	creds, err := ReadCredentials(cfg.DataDir)
	require.NoError(t, err)
	proj, err := s.Login(ctx, creds.ProjectToken)
	require.NoError(t, err)
	return s, proj.ID
}

func mustClose(t *testing.T, s *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.Close(ctx))
}
