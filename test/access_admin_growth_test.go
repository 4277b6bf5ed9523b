package test

import (
	"path/filepath"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A holder of a project's admin right repeating one retention policy records it once: each set
// was an admin/stream-retention-set record in the deployment's /audit, so a loop of the same
// call grew a stream the project's admin can neither read nor trim. A change is recorded again.
func TestSetRetention_AnUnchangedPolicyIsNotAuditedAgain(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	tok, _ := ts.token(t, itx.Scope{Prefix: "/team", Rights: []itx.Right{itx.RightRead, itx.RightAppend, itx.RightAdmin}})
	team := dial(t, ts.addr).Login(ctx, tok)
	s := stream(t, team, "/team/orders")
	mustAppend(t, s, ev("order", `{}`))

	for range 20 {
		require.NoError(t, client.SetRetention(ctx, s, client.Retention{MaxEvents: 1000}))
	}
	root := ts.deployment(t)
	require.Len(t, audited(t, root, server.AuditRetentionSet), 1, "the same policy twenty times is one change")
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.EqualValues(t, 1000, info.RetentionMaxEvents)

	require.NoError(t, client.SetRetention(ctx, s, client.Retention{MaxEvents: 500}))
	require.NoError(t, client.SetRetention(ctx, s, client.Retention{}))
	require.NoError(t, client.SetRetention(ctx, s, client.Retention{}))
	set := audited(t, root, server.AuditRetentionSet)
	require.Len(t, set, 3, "each change is recorded")
	require.EqualValues(t, 500, set[1]["maxEvents"])
	require.EqualValues(t, 0, set[2]["maxEvents"])
}

// Below the disk reserve a retention change is refused (resourceExhausted, nothing written):
// its /audit record may use the reserve, so a project admin alternating two policies took the
// disk to its last byte. Trim, which frees space, still runs there.
func TestDiskReserve_RetentionChangesNeedRoom(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real itxd on a tmpfs")
	}
	fs := mountTmpfs(t, "24m")
	data := filepath.Join(fs, "data")
	p := startItxd(t, data, "--min-free-disk-bytes", "8388608")
	ctx := ctxT(t)
	s := stream(t, dial(t, p.addr).Login(ctx, p.creds.ProjectToken), "/kept")
	for i := range 3 {
		_, err := client.Append(ctx, s, kibEvents(20, i*20), itx.AppendOptions{})
		require.NoError(t, err)
	}
	require.NoError(t, client.SetRetention(ctx, s, client.Retention{MaxEvents: 1000}))
	require.NoError(t, p.stop(t))

	// Started again on the disk filled below its reserve: its first reading sees so.
	fillDisk(t, fs, 4<<20)
	p = startItxd(t, data, "--min-free-disk-bytes", "8388608")
	s = stream(t, dial(t, p.addr).Login(ctx, p.creds.ProjectToken), "/kept")
	_, err := client.Append(ctx, s, kibEvents(1, 100), itx.AppendOptions{})
	requireCode(t, err, itx.EResourceExhausted)
	require.Contains(t, err.Error(), "--min-free-disk-bytes")

	root := dial(t, p.addr).Login(ctx, p.creds.DeploymentToken)
	for _, r := range []client.Retention{{MaxEvents: 2000}, {}, {MaxEvents: 500}} {
		err := client.SetRetention(ctx, s, r)
		requireCode(t, err, itx.EResourceExhausted)
		require.Contains(t, err.Error(), "--min-free-disk-bytes")
	}
	require.NoError(t, client.SetRetention(ctx, s, client.Retention{MaxEvents: 1000}), "the policy it has: nothing to write")
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.EqualValues(t, 1000, info.RetentionMaxEvents, "the refused changes left the policy")
	require.Len(t, audited(t, root, server.AuditRetentionSet), 1, "nothing recorded for the refused changes")

	_, err = client.Trim(ctx, s, 10)
	require.NoError(t, err, "trimming below the reserve")
}

// A deployment token with the admin right but not read administers (a backup written on the
// server's disk) but cannot download one: a download hands over every project's events and the
// directory with the webhook secrets, which no read through RPC ever shows. Before, the admin
// right alone downloaded it all.
func TestAccess_DownloadNeedsRead(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	mustAppend(t, stream(t, ts.project(t), "/private"), ev("note", `{"secret":true}`))
	root := client.Admin(ctx, ts.deployment(t))
	defer root.Release()
	adminOnly, _, err := client.CreateToken(ctx, root, server.DeploymentProjectID, client.TokenOptions{Label: "ops",
		Scope: itx.Scope{Rights: []itx.Right{itx.RightAdmin}}})
	require.NoError(t, err)
	ops := client.Admin(ctx, ts.login(t, adminOnly))
	defer ops.Release()
	_, err = client.DownloadBackup(ctx, ops, filepath.Join(t.TempDir(), "copy"))
	requireCode(t, err, itx.EPermissionDenied)
	require.Contains(t, err.Error(), "read")
	_, err = client.Backup(ctx, ops, filepath.Join(t.TempDir(), "on-server"))
	require.NoError(t, err, "a backup on the server's disk needs the admin right only")

	both, _, err := client.CreateToken(ctx, root, server.DeploymentProjectID, client.TokenOptions{Label: "ops-read",
		Scope: itx.Scope{Rights: []itx.Right{itx.RightAdmin, itx.RightRead}}})
	require.NoError(t, err)
	withRead := client.Admin(ctx, ts.login(t, both))
	defer withRead.Release()
	_, err = client.DownloadBackup(ctx, withRead, filepath.Join(t.TempDir(), "copy"))
	require.NoError(t, err)
}
