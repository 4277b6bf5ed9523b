package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// itxd --new-deployment-token gives the deployment root a new token when its credentials file
// is lost (a token is kept only as its hash): without it the deployment could never be
// administered again. It refuses while an itxd serves the directory, records the token in
// credentials.json, and the token is audited in /audit.
func TestItxd_NewDeploymentToken(t *testing.T) {
	dir := t.TempDir()
	p := startItxd(t, dir)
	mint := func() (string, error) {
		cmd := exec.Command(itxdBin, "--data", dir, "--new-deployment-token")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return stderr.String(), err
		}
		return strings.TrimSpace(string(out)), nil
	}
	msg, err := mint()
	require.Error(t, err, "refused while itxd serves the directory")
	require.Contains(t, msg, "itxd.lock")
	require.NoError(t, p.stop(t))

	old := p.creds.DeploymentToken
	require.NoError(t, os.Remove(filepath.Join(dir, server.CredentialsFile)), "the credentials file is lost")
	token, err := mint()
	require.NoError(t, err, token)
	require.True(t, strings.HasPrefix(token, "itx_"), token)
	creds, err := server.ReadCredentials(dir)
	require.NoError(t, err)
	require.Equal(t, token, creds.DeploymentToken)

	p = startItxd(t, dir)
	ctx := ctxT(t)
	root := dial(t, p.addr).Login(ctx, token)
	info, err := client.DescribeProject(ctx, root)
	require.NoError(t, err)
	require.True(t, info.Deployment)
	audit, err := client.ReadAll(ctx, stream(t, root, server.AuditPath), itx.Query{})
	require.NoError(t, err)
	last := audit[len(audit)-1]
	require.Equal(t, server.AuditTokenCreated, last.Type)
	require.Contains(t, string(last.Payload), "itxd --new-deployment-token")
	_, err = client.DescribeProject(ctx, dial(t, p.addr).Login(ctx, old))
	require.NoError(t, err, "the root's other tokens stay as they were")
}
