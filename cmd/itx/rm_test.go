package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// itx rm deletes a stream (refused while consumed unless --force), and the prompt's
// project.streams.remove does the same; a missing or bad path is a usage error before
// connecting.
func TestRun_Rm(t *testing.T) {
	srv := itxtest.Start(t, server.Config{})
	ts := &testServer{addr: srv.Addr, token: srv.Creds.ProjectToken, dir: srv.Dir}
	for _, p := range []string{"/tmp/a", "/tmp/b", "/keep"} {
		ts.appendDirect(t, p, itx.EventInput{Type: "e", Payload: json.RawMessage(`{}`)}, itx.EventInput{Type: "e", Payload: json.RawMessage(`{}`)})
	}
	c := newCLI(t)
	conn := []string{"--addr", ts.addr, "--token", ts.token}
	code, _, errs := c.run("", append(conn, "-e", `project.streams.get("/tmp/a").readers.register("mirror", 0)`)...)
	require.Equal(t, exitOK, code, errs)

	code, _, errs = c.run("", append(conn, "--json", "rm", "/tmp/a")...)
	require.Equal(t, exitError, code)
	require.Contains(t, errs, "failedPrecondition")
	require.Contains(t, errs, "1 registered reader")
	require.Contains(t, errs, "by forcing (--force)", "from a shell, the refusal names the flag that forces it")

	code, out, errs := c.run("", append(conn, "--json", "rm", "/tmp/a", "--force")...)
	require.Equal(t, exitOK, code, errs)
	var gone struct {
		Path       string
		StreamID   string
		HeadOffset int64
	}
	require.NoError(t, json.Unmarshal([]byte(out), &gone), out)
	require.Equal(t, "/tmp/a", gone.Path)
	require.NotEmpty(t, gone.StreamID)
	require.Equal(t, int64(2), gone.HeadOffset)

	code, out, errs = c.run("", append(conn, "--json", "-e", `project.streams.remove({path: "/tmp/b"}).headOffset`)...)
	require.Equal(t, exitOK, code, errs)
	require.JSONEq(t, `2`, out)
	code, out, errs = c.run("", append(conn, "--json", "-e", `project.streams.list().map(s => s.path)`)...)
	require.Equal(t, exitOK, code, errs)
	require.JSONEq(t, `["/keep"]`, out)

	code, _, errs = c.run("", append(conn, "rm", "/tmp/a")...)
	require.Equal(t, exitError, code)
	require.Contains(t, errs, "notFound")
	// --recursive: the path and every stream below it, not a sibling sharing its prefix; one
	// refused (a reader) is named, the rest go.
	for _, p := range []string{"/job", "/job/1", "/job/1/log", "/job/2", "/jobs", "/job-x"} {
		ts.appendDirect(t, p, itx.EventInput{Type: "e", Payload: json.RawMessage(`{}`)})
	}
	code, _, errs = c.run("", append(conn, "-e", `project.streams.get("/job/2").readers.register("mirror", 0)`)...)
	require.Equal(t, exitOK, code, errs)
	code, out, errs = c.run("", append(conn, "--json", "rm", "-r", "/job")...)
	require.Equal(t, exitError, code)
	require.Contains(t, errs, "1 stream not deleted: /job/2: ")
	require.Contains(t, errs, "by forcing (--force)")
	var rows []struct{ Path string }
	require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
	require.Equal(t, []struct{ Path string }{{"/job/1/log"}, {"/job/1"}, {"/job"}}, rows)
	code, out, errs = c.run("", append(conn, "--json", "rm", "/job", "--recursive", "--force")...)
	require.Equal(t, exitOK, code, errs)
	require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
	require.Equal(t, []struct{ Path string }{{"/job/2"}}, rows)
	code, out, errs = c.run("", append(conn, "--json", "-e", `project.streams.list().map(s => s.path)`)...)
	require.Equal(t, exitOK, code, errs)
	require.JSONEq(t, `["/job-x", "/jobs", "/keep"]`, out)
	code, _, errs = c.run("", append(conn, "rm", "-r", "/job")...)
	require.Equal(t, exitError, code)
	require.Contains(t, errs, "notFound")

	for _, args := range [][]string{{"rm"}, {"rm", "tmp"}, {"rm", "/a", "/b"}, {"rm", "/a", "--all"}, {"rm", "-r", "/"}} {
		code, _, errs := c.run("", append([]string{"--addr", "127.0.0.1:1", "--token", "x"}, args...)...)
		require.Equal(t, exitUsage, code, "%v: %s", args, errs)
	}
}

// At the prompt, stream.trim takes an offset or {throughOffset, createdBefore}, createdBefore
// also as a duration ago ("30d"); describe shows how far the stream is trimmed.
func TestRun_Trim(t *testing.T) {
	srv := itxtest.Start(t, server.Config{})
	ts := &testServer{addr: srv.Addr, token: srv.Creds.ProjectToken, dir: srv.Dir}
	for range 6 {
		ts.appendDirect(t, "/log", itx.EventInput{Type: "e", Payload: json.RawMessage(`{}`)})
	}
	c := newCLI(t)
	conn := []string{"--addr", ts.addr, "--token", ts.token}
	for _, step := range []struct{ expr, want string }{
		{`project.streams.get("/log").trim(2)`, `{"trimmedThrough": 2, "deleted": 2}`},
		{`project.streams.get("/log").trim({createdBefore: "30d"})`, `{"trimmedThrough": 2, "deleted": 0}`},
		{`project.streams.get("/log").trim({throughOffset: 4, createdBefore: new Date(Date.now() + 60000)})`, `{"trimmedThrough": 4, "deleted": 2}`},
		{`project.streams.get("/log").trim({createdBefore: new Date(Date.now() + 60000)})`, `{"trimmedThrough": 6, "deleted": 2}`},
		{`project.streams.get("/log").describe().trimmedThrough`, `6`},
		{`project.streams.get("/log").setRetention({maxAge: "30d", maxEvents: 100}); let d = project.streams.get("/log").describe(); [d.retentionMaxAgeMs, d.retentionMaxEvents]`,
			`[2592000000, 100]`},
		{`project.streams.get("/log").setRetention({maxBytes: "10MiB"}); project.streams.get("/log").describe().retentionMaxBytes`, `10485760`},
		{`project.streams.get("/log").setRetention({maxBytes: "2GB"}); project.streams.get("/log").describe().retentionMaxBytes`, `2000000000`},
		{`project.streams.get("/log").setRetention({maxBytes: 4096}); project.streams.get("/log").describe().retentionMaxBytes`, `4096`},
	} {
		code, out, errs := c.run("", append(conn, "--json", "-e", step.expr)...)
		require.Equal(t, exitOK, code, "%s: %s", step.expr, errs)
		require.JSONEq(t, step.want, out, step.expr)
	}
	for _, bad := range []string{`trim()`, `trim({createdBefore: "soon"})`, `trim(-1)`, `setRetention({maxAge: "10s"})`, `setRetention({maxAge: "soon"})`,
		`setRetention({maxBytes: "10 parsecs"})`, `setRetention({maxBytes: -5})`, `setRetention({maxBytes: "99999999999TiB"})`} {
		code, _, errs := c.run("", append(conn, "--json", "-e", `project.streams.get("/log").`+bad)...)
		require.Equal(t, exitError, code, bad)
		require.Contains(t, errs, "invalidArgument", bad)
	}
}

// itx rm on a stream whose database is lost (deleted while the stream was unloaded): refused,
// naming --force; with --force deleted unread, the row saying so with the head the directory
// last recorded.
func TestRun_RmDamagedStream(t *testing.T) {
	srv := itxtest.Start(t, server.Config{IdleTimeout: 20 * time.Millisecond})
	ts := &testServer{addr: srv.Addr, token: srv.Creds.ProjectToken, dir: srv.Dir}
	res := ts.appendDirect(t, "/lost", itx.EventInput{Type: "e", Payload: json.RawMessage(`{}`)}, itx.EventInput{Type: "e", Payload: json.RawMessage(`{}`)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	file := filepath.Join(srv.Dir, "streams", res.StreamID+".db")
	conn0, err := client.Dial(ctx, ts.addr)
	require.NoError(t, err)
	defer conn0.Close()
	proj := conn0.Login(ctx, ts.token)
	defer proj.Release()
	require.Eventually(t, func() bool {
		list, err := client.ListStreams(ctx, proj, "/lost")
		require.NoError(t, err)
		_, statErr := os.Stat(file + "-wal")
		return len(list) == 1 && !list[0].Loaded && os.IsNotExist(statErr)
	}, 20*time.Second, 10*time.Millisecond, "/lost unloads")
	require.NoError(t, os.Remove(file))

	c := newCLI(t)
	conn := []string{"--addr", ts.addr, "--token", ts.token}
	code, _, errs := c.run("", append(conn, "--json", "rm", "/lost")...)
	require.Equal(t, exitError, code)
	require.Contains(t, errs, "failedPrecondition")
	require.Contains(t, errs, res.StreamID+".db")
	require.Contains(t, errs, "by forcing (--force)", "the refusal names the flag that deletes it unread")

	code, out, errs := c.run("", append(conn, "--json", "rm", "/lost", "--force")...)
	require.Equal(t, exitOK, code, errs)
	require.JSONEq(t, `{"path": "/lost", "streamId": "`+res.StreamID+`", "headOffset": 2, "unread": true}`, out)
	code, out, errs = c.run("", append(conn, "--json", "-e", `project.streams.list().map(s => s.path)`)...)
	require.Equal(t, exitOK, code, errs)
	require.JSONEq(t, `[]`, out)
}
