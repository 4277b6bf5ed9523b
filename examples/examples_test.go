// Package examples holds clients of itxd written in other languages from schema/itx.capnp alone;
// the test here builds each one and runs it against a real itxd over TCP.
package examples

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// need checks that each tool is on PATH, or skips the test when one is missing, except in CI
// (CI=true), where .ci/run installs them and a missing one is a failure.
func need(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is missing; .ci/run installs it", tool)
			}
			t.Skipf("%s is not installed (CI=true makes this a failure)", tool)
		}
	}
}

// run runs a command in dir and returns its standard output; it fails the test on a non-zero exit.
func run(t *testing.T, ctx context.Context, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var out, errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errs
	err := cmd.Run()
	require.NoError(t, err, "%s %s\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), out.String(), errs.String())
	return out.String()
}

// wantOutput is what every example prints against a fresh itxd: its events were appended in one
// pipelined chain, read back two a page, a bad append was matched by its itx code, and the
// mounted Receiver got the event its subscription delivered (and no stream/* record, since the
// subscription starts now).
func wantOutput(path string) string {
	return "appended 3 events, head 3\n" +
		"paged 3 events in 2 pages\n" +
		"error code invalidArgument\n" +
		"receiver got example/ping at offset 5 from " + path + "\n"
}

func TestExamples_CPlusPlus(t *testing.T) {
	need(t, "capnp", "g++", "pkg-config")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	out := t.TempDir()
	flags := strings.Fields(run(t, ctx, root, "pkg-config", "--cflags", "--libs", "capnp-rpc", "kj-tls"))
	// The README's two lines: the schema compiles with nothing but schema/include.
	run(t, ctx, root, "capnp", "compile", "-I", "schema/include", "-oc++:"+out, "--src-prefix=schema", "schema/itx.capnp")
	bin := filepath.Join(out, "itx-example")
	run(t, ctx, root, "g++", append([]string{"-std=c++17", "-I" + out, "examples/cpp/client.c++",
		filepath.Join(out, "itx.capnp.c++"), "-o", bin}, flags...)...)

	srv := itxtest.Start(t, server.Config{})
	got := run(t, ctx, root, bin, srv.Addr, srv.Creds.ProjectToken)
	require.Equal(t, wantOutput("/examples/cpp"), got)

	t.Run("over TLS", func(t *testing.T) {
		ca, cfg := itxtest.SelfSigned(t, t.TempDir())
		srv := itxtest.StartTLS(t, server.Config{}, cfg)
		got := run(t, ctx, root, bin, srv.Addr, srv.Creds.ProjectToken, ca, "localhost")
		require.Equal(t, wantOutput("/examples/cpp"), got)
	})
}

func TestExamples_JavaScript(t *testing.T) {
	need(t, "capnp", "node", "npm")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir, err := filepath.Abs("js")
	require.NoError(t, err)
	// node_modules and gen/ stay in examples/js (ignored by git), so a second run installs nothing.
	run(t, ctx, dir, "npm", "install", "--no-audit", "--no-fund", "--loglevel=error")
	run(t, ctx, dir, "npm", "run", "--silent", "generate")

	srv := itxtest.Start(t, server.Config{})
	got := run(t, ctx, dir, "node", "client.mjs", srv.Addr, srv.Creds.ProjectToken)
	require.Equal(t, wantOutput("/examples/js"), got)

	t.Run("over TLS", func(t *testing.T) {
		ca, cfg := itxtest.SelfSigned(t, t.TempDir())
		srv := itxtest.StartTLS(t, server.Config{}, cfg)
		other, _ := itxtest.SelfSigned(t, t.TempDir())
		cmd := exec.CommandContext(ctx, "node", "client.mjs", srv.Addr, srv.Creds.ProjectToken, other)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		require.Error(t, err, "a certificate from another CA is refused: %s", out)
		got := run(t, ctx, dir, "node", "client.mjs", srv.Addr, srv.Creds.ProjectToken, ca)
		require.Equal(t, wantOutput("/examples/js"), got)
	})
}
