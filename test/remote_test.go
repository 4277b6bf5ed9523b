package test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/processors/remote"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

func configureRemote(t testing.TB, s schema.Stream, name string) {
	t.Helper()
	ctx := ctxT(t)
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{
		Name: name, Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Placement: "remote"},
	})
	require.NoError(t, err)
}

// runRemoteHost runs a remote host in this process (its own RPC connection to addr) until the
// test ends; mounted receives a value at each mount.
func runRemoteHost(t testing.TB, addr, token, name string, host *processors.Host) <-chan struct{} {
	t.Helper()
	mounted, _ := goRemoteHost(t, remote.Config{Addr: addr, Token: token, Name: name, Host: host})
	return mounted
}

// mountedRemoteHost runs a remote host as runRemoteHost does and waits for its first mount; stop
// ends it and waits until remote.Run returned (the test's end stops it too).
func mountedRemoteHost(t testing.TB, cfg remote.Config) (stop func()) {
	t.Helper()
	mounted, stop := goRemoteHost(t, cfg)
	awaitMount(t, mounted)
	return stop
}

// goRemoteHost runs remote.Run(cfg) on a goroutine of its own, with the tests' backoff (20-200
// ms) where cfg has none, logging to t; mounted receives a value at each mount. stop may be
// called more than once.
func goRemoteHost(t testing.TB, cfg remote.Config) (mounted <-chan struct{}, stop func()) {
	t.Helper()
	m := make(chan struct{}, 16)
	cfg.MinBackoff = cmp.Or(cfg.MinBackoff, 20*time.Millisecond)
	cfg.MaxBackoff = cmp.Or(cfg.MaxBackoff, 200*time.Millisecond)
	cfg.Logf = func(f string, a ...any) { t.Logf(f, a...) }
	cfg.Mounted = func() {
		select {
		case m <- struct{}{}:
		default: // nobody waits for more than the first few
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = remote.Run(ctx, cfg)
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return m, stop
}

func awaitMount(t testing.TB, mounted <-chan struct{}) {
	t.Helper()
	select {
	case <-mounted:
	case <-time.After(20 * time.Second):
		t.Fatal("the remote host never mounted")
	}
}

func listHosts(t testing.TB, p schema.Project) []itx.MountInfo {
	t.Helper()
	ctx := ctxT(t)
	hosts, release := p.Processors(ctx, nil)
	defer release()
	list, err := client.ListProcessorHosts(ctx, hosts.Processors())
	require.NoError(t, err)
	return list
}

// A guestbook in a remote host over real TCP: placed remote with no host mounted, the
// subscription parks; the host's mount resumes it at once; the host pages the stream, keeps its
// progress on the stream through itxd, and the snapshot (read from that record) is Reduce folded
// over the stream. ProcessorHosts.list shows the host with its contract.
func TestRemote_GuestbookParksThenRuns(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	s := stream(t, p, "/remote/guestbook")
	configureRemote(t, s, "guestbook")
	var head int64
	for i := range 40 {
		head = mustAppend(t, s, examples.GuestbookSigned.Input(examples.Signed{Name: fmt.Sprintf("guest-%d", i), Message: "remote"}, "")).HeadOffset
	}
	sub, proc := processorOf(t, s, "guestbook")
	waitUntil(t, "parked without a host", func() bool {
		d, err := client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		return d.Status == itx.StatusParked
	})

	awaitMount(t, runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "worker-1", referenceHost(t, "guestbook")))
	processed, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	require.GreaterOrEqual(t, processed, head)

	snap, err := client.Snapshot(ctx, proc)
	require.NoError(t, err)
	require.Equal(t, head, snap.ProcessedOffset)
	require.JSONEq(t, guestbookFold(t, s), snap.State)

	hosts := listHosts(t, p)
	require.Len(t, hosts, 1)
	require.Equal(t, "worker-1", hosts[0].Name)
	require.Len(t, hosts[0].Contracts, 1)
	require.Equal(t, "guestbook", hosts[0].Contracts[0].Name)
	require.Equal(t, []string{string(examples.GuestbookSigned)}, hosts[0].Contracts[0].ConsumedTypes)

	// Live state: the committed record, then a patch per commit (the remote host's included).
	view := &liveView{}
	fut, release := proc.LiveState(ctx, func(p schema.Processor_liveState_Params) error {
		return p.SetSubscriber(schema.LiveSubscriber_ServerToClient(view))
	})
	res, err := fut.Struct()
	require.NoError(t, err)
	handle := res.Handle().AddRef()
	release()
	defer handle.Release()
	waitUntil(t, "the live snapshot", func() bool {
		_, doc := view.state()
		return doc != nil && doc["processedOffset"] == float64(head)
	})
	head = mustAppend(t, s, examples.GuestbookSigned.Input(examples.Signed{Name: "late", Message: "live"}, "")).HeadOffset
	waitUntil(t, "a patch for the next commit", func() bool {
		_, doc := view.state()
		st, _ := doc["state"].(map[string]any)
		return doc["processedOffset"] == float64(head) && st != nil && st["count"] == float64(41)
	})
	require.Zero(t, view.gaps)

	// The host's runner publishes its cursor once its commit through the ports returned, a moment
	// after the record itself committed.
	var runtime map[string]any
	waitUntil(t, "the host's runtime state at the head", func() bool {
		rs, err := client.RuntimeState(ctx, proc)
		require.NoError(t, err)
		runtime = nil
		require.NoError(t, json.Unmarshal([]byte(rs), &runtime))
		return runtime["processedThrough"] == float64(head)
	})
	require.Equal(t, "remote", runtime["placement"])
	require.Equal(t, "worker-1", runtime["host"])
}

// spyHost is a ProcessorHost that keeps the ports of its first wake and reports nothing done.
type spyHost struct {
	mu    sync.Mutex
	ports schema.ProcessorPorts
	woken chan struct{}
	// hold, if set, keeps the first wake until closed, then reports processed = its headOffset.
	hold chan struct{}
}

func (h *spyHost) Wake(ctx context.Context, call schema.ProcessorHost_wake) error {
	req, err := call.Args().Request()
	if err != nil {
		return err
	}
	h.mu.Lock()
	first := !h.ports.IsValid()
	if first {
		h.ports = req.Ports().AddRef()
		close(h.woken)
	}
	h.mu.Unlock()
	head := req.HeadOffset()
	if first && h.hold != nil {
		call.Go()
		<-h.hold
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	report, err := res.NewReport()
	if first && h.hold != nil {
		report.SetProcessedOffset(head) // a claim it never committed
	}
	return err
}

func (h *spyHost) GetRuntimeState(ctx context.Context, call schema.ProcessorHost_getRuntimeState) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return res.SetState(`{}`)
}

// Two hosts announcing one contract: the later mount takes it over. The earlier host's ports are
// fenced at once (every write fails failedPrecondition), and the new host processes the stream.
func TestRemote_SecondMountTakesOverAndFencesTheFirst(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	s := stream(t, p, "/remote/takeover")
	configureRemote(t, s, "forwarder")

	spy := &spyHost{woken: make(chan struct{})}
	mountSpy(t, ts, spy)
	mustAppend(t, s, examples.InboxMessage.Input(json.RawMessage(`{"n":0}`), ""))
	select {
	case <-spy.woken:
	case <-ctx.Done():
		t.Fatal("the first host was never woken")
	}
	defer spy.ports.Release()
	claim := func() error {
		f, r := spy.ports.Claim(ctx, func(a schema.ProcessorPorts_claim_Params) error { return a.SetName("forwarder") })
		defer r()
		_, err := f.Struct()
		return err
	}
	require.NoError(t, claim(), "the first host holds the contract")

	awaitMount(t, runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "worker-2", referenceHost(t, "forwarder")))
	requireCode(t, claim(), itx.EFailedPrecondition)
	list := listHosts(t, p)
	require.Len(t, list, 2)
	for _, h := range list {
		if h.Name == "spy" {
			require.Empty(t, h.Contracts, "taken over")
		} else {
			require.Len(t, h.Contracts, 1)
		}
	}
	head := mustAppend(t, s, examples.InboxMessage.Input(json.RawMessage(`{"n":1}`), "")).HeadOffset
	sub := client.Subscription(ctx, s, "forwarder")
	defer sub.Release()
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	require.Equal(t, 2, countType(t, s, string(examples.OutboxForwarded)))
}

// A wake report that arrives after its host lost the contract is refused: the spy claims the
// whole stream processed without committing anything, after a second host took the contract;
// the cursor does not take its word (the wake is cancelled at the takeover, and counted as a
// late ack), and the new holder forwards every message.
func TestRemote_LateReportFromALostMountIsRefused(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	s := stream(t, p, "/remote/late")
	configureRemote(t, s, "forwarder")
	spy := &spyHost{woken: make(chan struct{}), hold: make(chan struct{})}
	mountSpy(t, ts, spy)
	head := mustAppend(t, s, examples.InboxMessage.Input(json.RawMessage(`{"n":0}`), "")).HeadOffset
	select {
	case <-spy.woken:
	case <-ctx.Done():
		t.Fatal("the first host was never woken")
	}
	defer spy.ports.Release()
	late := testutil.ToFloat64(ts.srv.Metrics().LateAcks)
	awaitMount(t, runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "worker-2", referenceHost(t, "forwarder")))
	close(spy.hold)
	waitUntil(t, "the late report refused", func() bool { return testutil.ToFloat64(ts.srv.Metrics().LateAcks) > late })
	sub := client.Subscription(ctx, s, "forwarder")
	defer sub.Release()
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	require.Equal(t, 1, countType(t, s, string(examples.OutboxForwarded)), "the new holder did the work the spy claimed")
}

// mountSpy mounts a spy host announcing the forwarder over its own connection.
func mountSpy(t *testing.T, ts *testServer, spy *spyHost) {
	t.Helper()
	ctx := ctxT(t)
	first := dial(t, ts.addr).Login(ctx, ts.creds.ProjectToken)
	h, err := mountHostServing(ctx, first, "spy", spy, []itx.ProcessorInfo{{Name: "forwarder", ReducerVersion: "1", ConsumedTypes: []string{string(examples.InboxMessage)}}})
	require.NoError(t, err)
	t.Cleanup(h.Release)
}

// processorsHost hosts the agent with a vendor of the test's own.
func processorsHost(t testing.TB, vendor examples.Vendor, cfg examples.AgentConfig) *processors.Host {
	t.Helper()
	h := processors.NewHost("test")
	require.NoError(t, examples.AddTo(h, []string{"agent"}, examples.HostOptions{Vendor: vendor, Agent: cfg}))
	return h
}

// A remote processor's runtime state, asked of a mounted host that has not run the instance yet
// (it holds the contract, but no wake reached it since it mounted): the host's notFound is not a
// timeout, and the answer is the committed cursors with the host named.
func TestRemote_RuntimeStateBeforeTheHostRanIt(t *testing.T) {
	ts := startServer(t, server.Config{})
	awaitMount(t, runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "worker", referenceHost(t, "guestbook")))
	s := stream(t, ts.project(t), "/remote/runtime-before-wake")
	mustAppend(t, s, ev("unrelated", `{}`))
	configureInstance(t, s, "guestbook", "", "remote")
	_, proc := processorOf(t, s, "guestbook")
	rs, err := client.RuntimeState(ctxT(t), proc)
	require.NoError(t, err)
	var runtime map[string]any
	require.NoError(t, json.Unmarshal([]byte(rs), &runtime))
	require.Equal(t, "remote", runtime["placement"])
	require.Equal(t, "worker", runtime["host"])
	require.Equal(t, "guestbook", runtime["name"])
}

func (h *spyHost) Stop(context.Context, schema.ProcessorHost_stop) error { return nil }

// A remote processor that has not committed anything yet (its host holds the contract but no wake
// of it succeeded) answers snapshot() with the contract's initial state, as the host announced it
// at its mount (the contract runs there), not null; offsets 0.
func TestRemote_SnapshotBeforeTheHostRanIt(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	contracts := referenceHost(t, "guestbook").Contracts() // what remote.Run announces
	want, err := json.Marshal(examples.Guestbook().InitialState())
	require.NoError(t, err)
	require.JSONEq(t, string(want), string(contracts[0].InitialState), "the SDK announces the initial state")
	h, err := mountHostServing(ctx, p, "never-runs", idleHost{}, contracts) // every wake fails
	require.NoError(t, err)
	defer h.Release()

	s := stream(t, p, "/remote/snapshot-before-run")
	mustAppend(t, s, examples.GuestbookSigned.Input(examples.Signed{Name: "a", Message: "b"}, ""))
	configureRemote(t, s, "guestbook")
	_, proc := processorOf(t, s, "guestbook")
	snap, err := client.Snapshot(ctx, proc)
	require.NoError(t, err)
	require.JSONEq(t, string(want), snap.State)
	require.Zero(t, snap.ReducedOffset)
	require.Zero(t, snap.ProcessedOffset)

	// Live state starts from the same document.
	view := &liveView{}
	fut, release := proc.LiveState(ctx, func(p schema.Processor_liveState_Params) error {
		return p.SetSubscriber(schema.LiveSubscriber_ServerToClient(view))
	})
	res, err := fut.Struct()
	require.NoError(t, err)
	handle := res.Handle().AddRef()
	release()
	defer handle.Release()
	waitUntil(t, "the live snapshot", func() bool {
		_, doc := view.state()
		return doc != nil
	})
	_, doc := view.state()
	gotState, err := json.Marshal(doc["state"])
	require.NoError(t, err)
	require.JSONEq(t, string(want), string(gotState), "the live snapshot's state")

	// A mount announcing an initial state that is not JSON is refused.
	bad := []itx.ProcessorInfo{{Name: "broken", ReducerVersion: "1", ConsumedTypes: []string{"t"}, InitialState: json.RawMessage(`{"a":`)}}
	_, err = mountHostServing(ctx, p, "bad-state", idleHost{}, bad)
	requireCode(t, err, itx.EInvalid)
}
