// Package test holds end-to-end tests: a real itxd (in-process or as a separate process) on real
// TCP with real SQLite files, driven by Go capnp clients.
package test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// testServer is an in-process server listening on a real loopback TCP port.
type testServer struct {
	srv   *server.Server
	addr  string
	creds server.Credentials
	dir   string
}

// startServer opens a server on a fresh data directory (or cfg.DataDir) and serves it on TCP.
// Everything is closed when the test ends.
func startServer(t testing.TB, cfg server.Config) *testServer {
	t.Helper()
	s := itxtest.Start(t, cfg)
	return &testServer{srv: s.Srv, addr: s.Addr, creds: s.Creds, dir: s.Dir}
}

// dial opens a client connection, closed when the test ends.
func dial(t testing.TB, addr string) *client.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// project logs into the default project over a new connection.
func (ts *testServer) project(t testing.TB) schema.Project {
	t.Helper()
	p := dial(t, ts.addr).Login(context.Background(), ts.creds.ProjectToken)
	t.Cleanup(p.Release)
	return p
}

// stream returns project.streams().get(path), pipelined.
func stream(t testing.TB, p schema.Project, path string) schema.Stream {
	t.Helper()
	s := client.Stream(context.Background(), p, path)
	t.Cleanup(s.Release)
	return s
}

func ev(typ string, payload string) itx.EventInput {
	return itx.EventInput{Type: typ, Payload: json.RawMessage(payload)}
}

func keyed(typ, payload, key string) itx.EventInput {
	e := ev(typ, payload)
	e.IdempotencyKey = key
	return e
}

// mustAppend appends and fails the test on error.
func mustAppend(t testing.TB, s schema.Stream, events ...itx.EventInput) itx.AppendResult {
	t.Helper()
	res, err := client.Append(context.Background(), s, events, itx.AppendOptions{})
	require.NoError(t, err)
	return res
}

// requireCode asserts that err carries the typed code want, as a client sees it.
func requireCode(t testing.TB, err error, want itx.Code) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, want, itx.ErrorCode(err), "error: %v", err)
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// ctxLong is ctxT for a test whose work takes a good part of 30 s on a loaded 2-vCPU machine
// (megabytes of events through a processor: 7-14 s there, over 30 s under -race).
func ctxLong(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// verifyNoLeak fails the test if goroutines opts do not ignore are still running once they had
// the time waitUntil gives a condition to end. goleak.VerifyNone alone looks for about half a
// second, and the goroutines of what a test just closed (an RPC connection's, a connection's
// pusher after its gauge fell) can take longer on a loaded machine; one that never ends still
// fails, with VerifyNone's list of them.
func verifyNoLeak(t *testing.T, opts ...goleak.Option) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for goleak.Find(opts...) != nil && time.Now().Before(deadline) {
		// Find waits and looks again itself (about half a second) before it answers.
	}
	goleak.VerifyNone(t, opts...)
}
