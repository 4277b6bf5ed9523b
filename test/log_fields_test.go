package test

import (
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
