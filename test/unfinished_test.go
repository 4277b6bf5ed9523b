package test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/storage"
	"github.com/stretchr/testify/require"
)

// A kill -9 can cut a stream's creation short at three points before its first commit: after the
// directory entry (no database file), after the file was made (no stream_meta row), and after the
// stream_meta row (no event). Nothing was acknowledged on such a stream, so it does not exist:
// it is not listed, describe reads it as a stream that never had an append, it does not count
// toward --max-streams-per-project (nor in listProjects), and its path takes a first append.
func TestCrash_UnfinishedCreationsDoNotExist(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	const bound = "3"
	proc := startItxd(t, dataDir, "--max-streams-per-project", bound)
	ctx := ctxT(t)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	s := client.Stream(ctx, p, "/real")
	mustAppend(t, s, ev("x", `{}`))
	s.Release()
	p.Release()
	proc.kill9(t)

	// The three windows, recreated with itxd down exactly as the creation leaves them.
	d, err := storage.OpenDirectory(ctx, filepath.Join(dataDir, "directory.db"))
	require.NoError(t, err)
	streams := filepath.Join(dataDir, "streams")
	cut := map[string]string{"/cut/entry-only": "s-entry", "/cut/empty-file": "s-empty", "/cut/no-event": "s-noevent"}
	for path, id := range cut {
		require.NoError(t, d.CreateStream(ctx, storage.StreamEntry{StreamID: id, ProjectID: proc.creds.ProjectID, Path: path, CreatedAt: 1}, 0))
	}
	require.NoError(t, os.WriteFile(filepath.Join(streams, "s-empty.db"), nil, 0o600))
	st, err := storage.CreateStream(ctx, filepath.Join(streams, "s-noevent.db"), storage.StreamMeta{StreamID: "s-noevent", ProjectID: proc.creds.ProjectID, Path: "/cut/no-event", CreatedAt: 1})
	require.NoError(t, err)
	require.NoError(t, st.Close())
	require.NoError(t, d.Close())

	proc = startItxd(t, dataDir, "--max-streams-per-project", bound)
	conn := dial(t, proc.addr)
	p = conn.Login(ctx, proc.creds.ProjectToken)
	defer p.Release()
	listed, err := client.ListStreams(ctx, p, "")
	require.NoError(t, err)
	var paths []string
	for _, info := range listed {
		paths = append(paths, info.Path)
	}
	require.Equal(t, []string{"/real"}, paths, "only the stream whose first commit landed is listed")

	root := dial(t, proc.addr).Login(ctx, proc.creds.DeploymentToken)
	defer root.Release()
	admin := client.Admin(ctx, root)
	defer admin.Release()
	projects, err := client.ListProjects(ctx, admin)
	require.NoError(t, err)
	for _, ps := range projects {
		if ps.Info.ID == proc.creds.ProjectID {
			require.Equal(t, 1, ps.StreamCount, "listProjects counts the streams that exist")
		}
	}

	for path := range cut {
		s := client.Stream(ctx, p, path)
		info, err := client.Describe(ctx, s)
		require.NoError(t, err)
		require.Empty(t, info.StreamID, "%s: describe reads a stream that never had an append", path)
		require.Zero(t, info.HeadOffset, path)
		s.Release()
	}
	// The bound counts /real alone: two more streams fit, then the third is refused.
	for _, path := range []string{"/cut/no-event", "/new"} {
		s := client.Stream(ctx, p, path)
		res, err := client.Append(ctx, s, []itx.EventInput{ev("x", `{}`)}, itx.AppendOptions{})
		require.NoError(t, err, path)
		require.Equal(t, []int64{1}, res.Offsets, path)
		info, err := client.Describe(ctx, s)
		require.NoError(t, err)
		require.NotEmpty(t, info.StreamID, path)
		s.Release()
	}
	s = client.Stream(ctx, p, "/one-too-many")
	defer s.Release()
	_, err = client.Append(ctx, s, []itx.EventInput{ev("x", `{}`)}, itx.AppendOptions{})
	requireCode(t, err, itx.ELimitExceeded)
}
