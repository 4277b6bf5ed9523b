package test

import (
	"fmt"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A real itxd with --max-streams-per-project 3: the append that would create a 4th stream fails
// with limitExceeded and creates no file, the 3 streams keep taking appends, another project is
// counted apart, and after a kill -9 and a restart on the same data directory the count is
// still 3 (it lives in the directory, not in memory). Started again without the flag, the
// default bound lets the 4th stream be created.
func TestStreams_BoundedPerProject(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	ctx := ctxT(t)
	bounded := []string{"--max-streams-per-project", "3"}
	proc := startItxd(t, dataDir, bounded...)
	login := func(token string) schema.Project {
		p := dial(t, proc.addr).Login(ctx, token)
		t.Cleanup(p.Release)
		return p
	}
	appendTo := func(p schema.Project, path string) error {
		s := client.Stream(ctx, p, path)
		defer s.Release()
		_, err := client.Append(ctx, s, []itx.EventInput{ev("e", `{}`)}, itx.AppendOptions{})
		return err
	}
	requireRefused := func(p schema.Project, path string) {
		t.Helper()
		err := appendTo(p, path)
		requireCode(t, err, itx.ELimitExceeded)
		require.Contains(t, itx.ErrorMessage(err), "holds 3 streams")
		require.Contains(t, itx.ErrorMessage(err), "--max-streams-per-project")
	}

	p := login(proc.creds.ProjectToken)
	for i := range 3 {
		require.NoError(t, appendTo(p, fmt.Sprintf("/s%d", i)))
	}
	files := itxtest.StreamDatabases(t, dataDir)
	requireRefused(p, "/s3")
	requireRefused(p, "/s3") // the refused stream's actor is healthy: the same answer again
	require.Equal(t, files, itxtest.StreamDatabases(t, dataDir), "the refused stream created no file")
	for i := range 3 {
		require.NoError(t, appendTo(p, fmt.Sprintf("/s%d", i)), "existing streams still take appends")
	}
	list, err := client.ListStreams(ctx, p, "")
	require.NoError(t, err)
	require.Len(t, list, 3)

	a := client.Admin(ctx, login(proc.creds.DeploymentToken))
	defer a.Release()
	_, otherToken, _, err := client.CreateProject(ctx, a, "other")
	require.NoError(t, err)
	other := login(otherToken)
	for i := range 3 {
		require.NoError(t, appendTo(other, fmt.Sprintf("/s%d", i)), "another project has its own 3 places")
	}
	requireRefused(other, "/s3")
	files = itxtest.StreamDatabases(t, dataDir)

	proc.kill9(t)
	proc = startItxd(t, dataDir, bounded...)
	p, other = login(proc.creds.ProjectToken), login(otherToken)
	requireRefused(p, "/s3")
	requireRefused(other, "/s3")
	require.Equal(t, files, itxtest.StreamDatabases(t, dataDir), "no file for either refused stream after the restart")
	require.NoError(t, appendTo(p, "/s0"))
	require.NoError(t, appendTo(other, "/s0"))

	require.NoError(t, proc.stop(t))
	proc = startItxd(t, dataDir) // the default bound, 100,000
	require.NoError(t, appendTo(login(proc.creds.ProjectToken), "/s3"))
	require.Len(t, itxtest.StreamDatabases(t, dataDir), len(files)+1)
}

// A copy-to-stream subscription whose receiving stream cannot be created (its project holds its
// most streams) is in an outage: the whole batch backs off along the retry ladder, with no event
// isolated or blamed, since no event is at fault.
func TestStreams_CopyIntoAFullProjectIsAnOutage(t *testing.T) {
	e := newSubEnv(t, server.Config{MaxStreamsPerProject: 1})
	src := stream(t, e.p, "/src") // configuring creates it: the project's one stream
	name, _ := e.configure(t, src, client.SubscriptionConfig{Name: "to-dst", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/dst"}})
	res := mustAppend(t, src, ev("order", `{"id":1}`), ev("order", `{"id":2}`))

	for attempt := 1; attempt <= 3; attempt++ {
		e.settle(t, "/src")
		d := e.describe(t, src, name)
		require.Equal(t, attempt, d.Attempt)
		require.Contains(t, d.LastError, "--max-streams-per-project")
		require.Zero(t, d.FailingEventOffset, "no event is blamed")
		require.Zero(t, d.FailingEventAttempt)
		require.Less(t, d.ConfirmedOffset, res.Offsets[0], "nothing copied")
		require.Equal(t, itx.StatusActive, d.Status)
		e.clock.Advance(itx.Backoff(attempt, 0.5))
	}
	dst := stream(t, e.p, "/dst")
	info, err := client.Describe(e.ctx, dst)
	require.NoError(t, err)
	require.Zero(t, info.HeadOffset, "/dst does not exist")
}
