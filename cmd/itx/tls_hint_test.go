package main

import (
	"testing"
	"time"

	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// itx without --tls against an itxd serving TLS says so at once (not a broken connection
// retried for half a minute), and with --ca it connects.
func TestRun_PlaintextToATLSServerSaysSo(t *testing.T) {
	caFile, cfg := itxtest.SelfSigned(t, t.TempDir())
	srv := itxtest.StartTLS(t, server.Config{}, cfg)
	c := newCLI(t)
	start := time.Now()
	code, _, errs := c.run("", "--addr", srv.Addr, "--token", srv.Creds.ProjectToken, "-e", `project.describe()`)
	require.Equal(t, exitError, code)
	require.Contains(t, errs, "serves TLS: connect with --tls")
	require.Less(t, time.Since(start), 20*time.Second, "refused, not retried")
	code, _, errs = c.run("", "--addr", srv.Addr, "--token", srv.Creds.ProjectToken, "--ca", caFile, "-e", `project.describe()`)
	require.Equal(t, exitOK, code, errs)
}
