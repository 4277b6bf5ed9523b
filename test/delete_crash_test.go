package test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/storage"
	"github.com/stretchr/testify/require"
)

// kill -9 of itxd at the worst point of a project's delete: its directory entries deleted (the
// commit on disk), none of its streams' files removed yet. After the restart no file of the
// deleted project's streams is left (nothing else knows them: they were on disk for good), the
// project stays deleted and its deletion is audited once, and every other project's streams
// keep all their events.
func TestCrash_Kill9AfterDeleteProjectCommitLeavesNoStreamFiles(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	streamsDir := filepath.Join(dataDir, "streams")
	proc := startItxdKilledAt(t, dataDir, "delete-project-committed")
	ctx := ctxT(t)
	conn := dial(t, proc.addr)
	admin := client.Admin(ctx, conn.Login(ctx, proc.creds.DeploymentToken))
	doomed, doomedToken, _, err := client.CreateProject(ctx, admin, "doomed")
	require.NoError(t, err)
	other, otherToken, _, err := client.CreateProject(ctx, admin, "other")
	require.NoError(t, err)

	// fill appends n events to a stream and returns its ID and the events as read back.
	fill := func(token, path string, n int) (string, []itx.Event) {
		t.Helper()
		s := stream(t, conn.Login(ctx, token), path)
		for i := range n {
			mustAppend(t, s, ev("e", fmt.Sprintf(`{"path":%q,"i":%d}`, path, i)))
		}
		info, err := client.Describe(ctx, s)
		require.NoError(t, err)
		events, err := client.ReadAll(ctx, s, itx.Query{})
		require.NoError(t, err)
		require.Len(t, events, n)
		return info.StreamID, events
	}
	var doomedIDs []string
	for _, path := range []string{"/orders", "/a/b"} {
		id, _ := fill(doomedToken, path, 20)
		doomedIDs = append(doomedIDs, id)
	}
	kept := map[string][]itx.Event{} // by token and path
	for _, k := range []struct{ token, path string }{
		{proc.creds.ProjectToken, "/orders"}, {otherToken, "/orders"}, {otherToken, "/a/b"},
	} {
		_, kept[k.token+k.path] = fill(k.token, k.path, 30)
	}

	err = client.DeleteProject(ctx, admin, doomed.ID, true)
	require.Error(t, err, "itxd died before answering")
	proc.requireKilledAtThePoint(t)
	// The kill came where it should: the delete committed, the files still there.
	d, err := storage.OpenDirectory(ctx, filepath.Join(dataDir, "directory.db"))
	require.NoError(t, err)
	_, err = d.Project(ctx, doomed.ID)
	requireCode(t, err, itx.ENotFound)
	require.NoError(t, d.Close())
	for _, id := range doomedIDs {
		require.FileExists(t, filepath.Join(streamsDir, id+".db"), "killed before the files were removed")
	}

	proc = startItxd(t, dataDir)
	for _, id := range doomedIDs {
		for _, suffix := range []string{".db", ".db-wal", ".db-shm"} {
			require.NoFileExists(t, filepath.Join(streamsDir, id+suffix), "a file of the deleted project's stream")
		}
	}
	conn = dial(t, proc.addr)
	root := conn.Login(ctx, proc.creds.DeploymentToken)
	admin = client.Admin(ctx, root)
	projects, err := client.ListProjects(ctx, admin)
	require.NoError(t, err)
	var ids []string
	for _, p := range projects {
		ids = append(ids, p.Info.ID)
	}
	require.NotContains(t, ids, doomed.ID, "the project stays deleted")
	require.Contains(t, ids, other.ID)
	_, err = client.DescribeProject(ctx, conn.Login(ctx, doomedToken))
	requireCode(t, err, itx.EUnauthenticated)
	audited, err := client.ReadAll(ctx, stream(t, root, server.AuditPath), itx.Query{Types: []string{server.AuditProjectDeleted}})
	require.NoError(t, err)
	require.Len(t, audited, 1, "the deletion is audited once")

	for _, k := range []struct{ token, path string }{
		{proc.creds.ProjectToken, "/orders"}, {otherToken, "/orders"}, {otherToken, "/a/b"},
	} {
		s := stream(t, conn.Login(ctx, k.token), k.path)
		got, err := client.ReadAll(ctx, s, itx.Query{})
		require.NoError(t, err)
		require.Equal(t, kept[k.token+k.path], got, "%s of another project keeps every event", k.path)
		info, err := client.Describe(ctx, s)
		require.NoError(t, err)
		require.FileExists(t, filepath.Join(streamsDir, info.StreamID+".db"))
	}
}
