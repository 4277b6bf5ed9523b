package test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/wire"
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

// hangingSink is a Receiver that takes every call at once (each on its own goroutine) and
// answers none until let go (or until itxd gives the call up): the open calls, the most at
// once, and the source streams it was called for.
type hangingSink struct {
	open, most atomic.Int64
	letGo      chan struct{}
	mu         sync.Mutex
	paths      map[string]bool
}

func (h *hangingSink) Receive(ctx context.Context, call schema.Receiver_receive) error {
	call.Go()
	raw, err := call.Args().Batch()
	if err != nil {
		return err
	}
	batch, err := wire.DeliveryBatchFromSchema(raw)
	if err != nil {
		return err
	}
	n := h.open.Add(1)
	defer h.open.Add(-1)
	for m := h.most.Load(); n > m && !h.most.CompareAndSwap(m, n); m = h.most.Load() {
	}
	select {
	case <-h.letGo:
	case <-ctx.Done():
		return ctx.Err()
	}
	h.mu.Lock()
	h.paths[batch.Path] = true
	h.mu.Unlock()
	_, err = call.AllocResults()
	return err
}

func (h *hangingSink) delivered() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.paths)
}

// A project's subscription deliveries take its streams in use within its share of
// --max-held-streams, as its calls do. A loaded stream nobody holds counted nothing toward the
// share, and a delivery took it in use without looking: project A's 20 loaded streams, each
// with a delivery to a receiver that answers only at the delivery timeout, held all 20 streams
// itxd may load, and project B could load no stream (limitExceeded, --max-held-streams). Now
// A's deliveries hold 15 (its share), B's append to a new stream goes through, and A's other
// deliveries start as soon as A holds fewer.
func TestItxd_DeliveriesWithinHeldStreamsShare(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	metrics := freeAddr(t)
	p := startItxd(t, t.TempDir(), "--metrics", metrics, "--log-format", "json",
		"--max-held-streams", "20", "--max-loaded-streams", "20") // A's share: 15
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	adm := client.Admin(ctx, dial(t, p.addr).Login(ctx, p.creds.DeploymentToken))
	bInfo, bToken, _, err := client.CreateProject(ctx, adm, "neighbour")
	require.NoError(t, err)
	adm.Release()
	aID := p.creds.ProjectID
	a := dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
	defer a.Release()
	b := dial(t, p.addr).Login(ctx, bToken)
	defer b.Release()

	// A's 20 streams, loaded and idle: each one's subscription parked, its receiver not mounted.
	const streams = 20
	for i := range streams {
		s := stream(t, a, fmt.Sprintf("/a/%d", i))
		subs := client.Subscriptions(ctx, s)
		_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "sink", Start: "now",
			Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "sink"}})
		subs.Release()
		require.NoError(t, err)
		mustAppend(t, s, ev("a/x", `{}`))
	}
	// The mount resumes every one of them at once: their deliveries hang.
	sink := &hangingSink{letGo: make(chan struct{}), paths: map[string]bool{}}
	h, err := client.MountReceiver(ctx, a, "sink", schema.Receiver_ServerToClient(sink))
	require.NoError(t, err)
	defer h.Release()
	share := fmt.Sprintf(`itx_project_share_full_total{flag="--max-held-streams-per-project",project="%s"}`, aID)
	require.Eventually(t, func() bool {
		return sink.most.Load() == streams || (sink.most.Load() >= 15 && scrapeMetric(t, metrics, share) > 0)
	}, time.Minute, 5*time.Millisecond, "A's deliveries open: %d", sink.most.Load())

	_, err = client.Append(ctx, stream(t, b, "/b/fresh"), []itx.EventInput{ev("b/x", `{}`)}, itx.AppendOptions{})
	require.NoError(t, err, "B's append to a new stream while A's deliveries hang")
	require.Equal(t, int64(15), sink.most.Load(), "A's deliveries in flight at once: its share of --max-held-streams 20")
	requireShareSeen(t, p, metrics, "--max-held-streams-per-project", aID, bInfo.ID)

	// Answered, A's deliveries give their streams back and the waiting ones start.
	close(sink.letGo)
	letGo := time.Now()
	require.Eventually(t, func() bool { return sink.delivered() == streams }, time.Minute, 5*time.Millisecond,
		"A's streams delivered: %d", sink.delivered())
	t.Logf("A's waiting deliveries done %v after the others were answered", time.Since(letGo))
}
