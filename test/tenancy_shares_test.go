package test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/stretchr/testify/require"
)

// requireShareSeen checks that the operator sees project at its share of flag: counted on
// /metrics under its project and flag (and other not), and a log line naming both.
func requireShareSeen(t *testing.T, p *itxdProcess, metrics, flag, project, other string) {
	t.Helper()
	require.Positive(t, scrapeMetric(t, metrics, fmt.Sprintf(`itx_project_share_full_total{flag="%s",project="%s"}`, flag, project)), flag)
	require.Zero(t, scrapeMetric(t, metrics, fmt.Sprintf(`itx_project_share_full_total{flag="%s",project="%s"}`, flag, other)), flag)
	require.True(t, slices.ContainsFunc(strings.Split(p.logs.String(), "\n"), func(line string) bool {
		return strings.Contains(line, `"project":"`+project+`"`) && strings.Contains(line, `"flag":"`+flag+`"`)
	}), "a log line names project %s and %s", project, flag)
}

// waitMetric waits until the metric reads want on /metrics.
func waitMetric(t *testing.T, metrics, name string, want float64) {
	t.Helper()
	require.Eventually(t, func() bool { return scrapeMetric(t, metrics, name) == want }, time.Minute, 5*time.Millisecond,
		"%s never read %v", name, want)
}

// One project's token holders may keep logged in at most its share of --rpc-max-connections
// (three quarters by default): past it their login is refused, naming the flag, and another
// project's client still connects and logs in. Without the share, project A's clients logged
// in on every connection itxd serves, and every other project's connection was refused at
// accept (--rpc-max-connections) until one of A's ended. A connection of A's that ends gives
// its place back.
func TestItxd_ConnectionShare(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	metrics := freeAddr(t)
	p := startItxd(t, t.TempDir(), "--metrics", metrics, "--log-format", "json", "--rpc-max-connections", "8") // A's share: 6
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	adminConn := dial(t, p.addr)
	adm := client.Admin(ctx, adminConn.Login(ctx, p.creds.DeploymentToken))
	bInfo, bToken, _, err := client.CreateProject(ctx, adm, "neighbour")
	require.NoError(t, err)
	adm.Release()
	adminConn.Close()
	waitMetric(t, metrics, "itx_rpc_connections", 0)

	aID := p.creds.ProjectID
	login := func(token string) (*client.Conn, error) {
		c := dial(t, p.addr)
		_, err := client.Append(ctx, stream(t, c.Login(ctx, token), "/s"), []itx.EventInput{ev("x", `{}`)}, itx.AppendOptions{})
		return c, err
	}
	var held []*client.Conn
	for i := 0; ; i++ {
		require.Less(t, i, 8, "A logged in on every connection itxd serves")
		c, err := login(p.creds.ProjectToken)
		if err != nil {
			requireCode(t, err, itx.ELimitExceeded)
			require.Contains(t, err.Error(), "--rpc-max-connections-per-project")
			c.Close()
			break
		}
		held = append(held, c)
	}
	require.Len(t, held, 6, "A's logged-in connections: its share of --rpc-max-connections 8")

	// B connects and logs in while A holds its share.
	c, err := login(bToken)
	require.NoError(t, err, "B's login while A holds its share of the connections")
	defer c.Close()
	requireShareSeen(t, p, metrics, "--rpc-max-connections-per-project", aID, bInfo.ID)

	// One of A's connections ends: A logs in on a new one.
	held[0].Close()
	waitMetric(t, metrics, "itx_rpc_connections", 6) // A's other 5 and B's
	c, err = login(p.creds.ProjectToken)
	require.NoError(t, err, "A's login once one of its connections ended")
	c.Close()
}
