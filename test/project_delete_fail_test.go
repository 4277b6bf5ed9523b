package test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/stretchr/testify/require"
)

// A project delete whose directory commit fails (every fsync answering EIO: a failing disk) is
// refused with a typed error saying nothing was deleted, and the project is usable again once
// the disk works: its token logs in, its streams take appends, with every event acknowledged
// before kept. It stayed refused (notFound, "the project was deleted") until the delete was
// retried or itxd restarted. What it acknowledged after the failed delete survives a kill -9 (the
// failed commit's pages, left in the write-ahead log, never come back as a delete), and a retried
// delete then deletes it.
func TestProjectDelete_FailedCommitLeavesTheProjectUsable(t *testing.T) {
	mnt, f := mountFaulty(t)
	data := filepath.Join(mnt, "data")
	p := startItxdNoReserve(t, data)
	ctx := ctxT(t)
	admin := func(p *itxdProcess) schema.Admin {
		a := client.Admin(ctx, dial(t, p.addr).Login(ctx, p.creds.DeploymentToken))
		t.Cleanup(a.Release)
		return a
	}
	root := admin(p)
	info, tok, _, err := client.CreateProject(ctx, root, "doomed")
	require.NoError(t, err)
	l := newAckLog(t, dial(t, p.addr).Login(ctx, tok))
	require.True(t, l.append("/a", 2))

	f.fsync.Store(true)
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = client.DeleteProject(dctx, root, info.ID, true)
	cancel()
	requireCode(t, err, itx.EUnavailable)
	require.Contains(t, itx.ErrorMessage(err), "not deleted")
	f.fsync.Store(false)

	// Usable again: a fresh login (the delete ended the project's sessions) and an append.
	var proj schema.Project
	require.Eventually(t, func() bool {
		proj = dial(t, p.addr).Login(ctx, tok)
		_, err := client.Describe(ctx, stream(t, proj, "/a"))
		return err == nil
	}, 20*time.Second, 50*time.Millisecond, "the project stays refused after its failed delete")
	l.proj, l.streams = proj, map[string]schema.Stream{}
	require.True(t, l.append("/a", 3))
	require.True(t, l.append("/b", 1))
	l.check()

	// Acknowledged after the failed delete: kept across a kill -9.
	p.kill9(t)
	p = startItxdNoReserve(t, data)
	l.proj, l.streams = dial(t, p.addr).Login(ctx, tok), map[string]schema.Stream{}
	l.check()

	require.NoError(t, client.DeleteProject(ctx, admin(p), info.ID, true), "the delete, retried, deletes")
	_, err = client.Describe(ctx, stream(t, dial(t, p.addr).Login(ctx, p.creds.ProjectToken), "/a"))
	require.NoError(t, err, "the default project is untouched")
}
