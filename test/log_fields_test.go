package test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// A stream's log lines name its project beside its path: every project has its own "/orders",
// and a line naming only the path left the operator to guess whose stream failed.
func TestLog_StreamLinesNameTheProject(t *testing.T) {
	var logs syncBuffer
	ts := startServer(t, server.Config{DataDir: t.TempDir(), MaxStreamsPerProject: 1, Log: zerolog.New(&logs)})
	ctx := ctxT(t)
	a := client.Admin(ctx, ts.deployment(t))
	defer a.Release()
	info, tok, _, err := client.CreateProject(ctx, a, "other")
	require.NoError(t, err)
	other := ts.login(t, tok)
	mustAppend(t, stream(t, ts.project(t), "/a"), ev("note", `{}`))
	mustAppend(t, stream(t, other, "/a"), ev("note", `{}`))
	_, err = client.Append(ctx, stream(t, other, "/b"), []itx.EventInput{ev("note", `{}`)}, itx.AppendOptions{})
	requireCode(t, err, itx.ELimitExceeded)
	require.Contains(t, logs.String(), `"project":"`+info.ID+`","path":"/b"`, "logs:\n%s", logs.String())
}

// Commits failing in a row (a full disk, a client retrying) are logged once, not once each: it
// logged an error line per refused append, as fast as the client retried, onto what may be the
// full disk; the end of the run is logged once, with how many failed.
func TestLog_FailingCommitsInARowLoggedOnce(t *testing.T) {
	fs := mountTmpfs(t, "16m")
	var logs syncBuffer
	ts := startServer(t, server.Config{DataDir: filepath.Join(fs, "data"), Log: zerolog.New(&logs).Level(zerolog.InfoLevel)})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/a")
	mustAppend(t, s, ev("note", `{}`))
	free := fillDisk(t, fs, 0)
	refused := 0
	for i := 0; i < 500 && refused < 30; i++ {
		if _, err := client.Append(ctx, s, kibEvents(200, i*200), itx.AppendOptions{}); err != nil {
			requireCode(t, err, itx.EResourceExhausted)
			refused++
		}
	}
	require.Equal(t, 30, refused)
	free()
	mustAppend(t, s, ev("note", `{}`))
	require.Equal(t, 1, strings.Count(logs.String(), "step failed; reloading"), "logs:\n%s", logs.String())
	require.Regexp(t, `"failedInARow":(3\d|[4-9]\d),"message":"the stream's commits succeed again"`, logs.String())
}

// A project at its stream limit refuses the append that would create one more: the client's
// refusal (limitExceeded naming the limit and the flag), logged at info with the project, the
// path and the limit the first time, at debug after; not as a failed step at warn, once per
// refused append, nor counted as a failed commit.
func TestLog_StreamLimitIsAClientsRefusal(t *testing.T) {
	var logs syncBuffer
	ts := startServer(t, server.Config{DataDir: t.TempDir(), MaxStreamsPerProject: 1, Log: zerolog.New(&logs)})
	ctx := ctxT(t)
	p := ts.project(t)
	mustAppend(t, stream(t, p, "/a"), ev("note", `{}`))
	for range 3 {
		_, err := client.Append(ctx, stream(t, p, "/b"), []itx.EventInput{ev("note", `{}`)}, itx.AppendOptions{})
		requireCode(t, err, itx.ELimitExceeded)
		require.Contains(t, itx.ErrorMessage(err), "the project holds 1 stream, its most (--max-streams-per-project)")
	}
	mustAppend(t, stream(t, p, "/a"), ev("note", `{}`))
	var lines []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `"path":"/b"`) {
			lines = append(lines, l)
		}
	}
	require.Len(t, lines, 3, "logs:\n%s", logs.String())
	require.Contains(t, lines[0], `"level":"info"`)
	require.Contains(t, lines[0], `"project":"`+ts.creds.ProjectID+`","path":"/b","limit":1`)
	require.Contains(t, lines[0], "--max-streams-per-project")
	for _, l := range lines[1:] {
		require.Contains(t, l, `"level":"debug"`)
	}
	require.NotContains(t, logs.String(), "step failed")
	require.NotContains(t, logs.String(), "commits succeed again", "no commit failed")
}
