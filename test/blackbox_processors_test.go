package test

// Black-box probes of seed 002 over real RPC against a real itxd: the processor authoring
// surface (delivery.caughtUp, the eventless pass, event-time state, blockProcessorWhile,
// runInBackground) and revival, in-process and on a remote host, written from the seed and the
// public surface alone.

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/processors/remote"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// bbCall is one ProcessEvent call as the processor saw it.
type bbCall struct {
	Offset   int64 // 0: the eventless pass
	Type     string
	CaughtUp bool
	Prev     int
	State    int
}

// bbCallOf records what one ProcessEvent call saw.
func bbCallOf(a *processors.Args[int]) bbCall {
	c := bbCall{CaughtUp: a.Delivery.CaughtUp, Prev: a.PreviousState, State: a.State}
	if a.Event != nil {
		c.Offset, c.Type = a.Event.Offset, a.Event.Type
	}
	return c
}

type bbRecorder struct {
	mu    sync.Mutex
	calls []bbCall
}

func (r *bbRecorder) add(c bbCall) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, c)
}

func (r *bbRecorder) take() []bbCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.calls
	r.calls = nil
	return c
}

// bbCounter counts bb/item events and records every ProcessEvent call.
func bbCounter(rec *bbRecorder) func() processors.Contract[int] {
	return func() processors.Contract[int] {
		return processors.Contract[int]{
			Name:           "counter",
			ConsumedTypes:  []string{"bb/item"},
			ReducerVersion: "1",
			InitialState:   func() int { return 0 },
			Reduce:         func(n int, e itx.Event) int { return n + 1 },
			ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
				rec.add(bbCallOf(a))
				return nil
			},
		}
	}
}

func bbWait(t *testing.T, s schema.Stream, name string, offset int64) {
	t.Helper()
	ctx := ctxT(t)
	sub := client.Subscription(ctx, s, name)
	defer sub.Release()
	_, err := client.WaitUntilProcessed(ctx, sub, offset, 25*time.Second)
	require.NoError(t, err)
}

// Seed 002: caughtUp is true on the last consumed event of a scan that reaches the observed raw
// head (filter-aware: not "the last event of the batch"), a scan with no consumed event gets one
// processEvent(event: null, final state, caughtUp: true), and at each event the state is the
// fold through that event. Batches are transport: a subscription that delivers one event at a
// time must give the same calls. Probed in-process and on a remote host.
func TestBBProc_CaughtUpIsFilterAwareInEveryPlacement(t *testing.T) {
	for _, tc := range []struct {
		name      string
		placement string
		maxEvents int
	}{
		{"in-process", "", 0},
		{"remote", "remote", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &bbRecorder{}
			host := processors.NewHost("bb")
			require.NoError(t, processors.Add(host, bbCounter(rec)))
			cfg := server.Config{}
			if tc.placement == "" {
				cfg.Processors = host
			}
			ts := startServer(t, cfg)
			p := ts.project(t)
			if tc.placement == "remote" {
				runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "bb-host", host)
			}
			s := stream(t, p, "/bb/caughtup")
			ctx := ctxT(t)
			subs := client.Subscriptions(ctx, s)
			defer subs.Release()
			_, off, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{
				Name:              "counter",
				Receiver:          client.Receiver{Kind: client.ReceiverProcessorWake, Placement: tc.placement},
				MaxDeliveryEvents: tc.maxEvents,
			})
			require.NoError(t, err)
			bbWait(t, s, "counter", off)
			// The birth event is not consumed: the scan that reached it ran the eventless pass.
			require.Equal(t, []bbCall{{CaughtUp: true}}, rec.take(), "after the birth")

			head := mustAppend(t, s, ev("bb/item", `{}`), ev("bb/item", `{}`), ev("bb/other", `{}`)).HeadOffset
			bbWait(t, s, "counter", head)
			require.Equal(t, []bbCall{
				{Offset: head - 2, Type: "bb/item", CaughtUp: false, Prev: 0, State: 1},
				{Offset: head - 1, Type: "bb/item", CaughtUp: true, Prev: 1, State: 2},
			}, rec.take(), "an unconsumed tail up to the head: the last consumed event is caught up, no eventless pass")

			head = mustAppend(t, s, ev("bb/other", `{}`), ev("bb/other", `{}`)).HeadOffset
			bbWait(t, s, "counter", head)
			require.Equal(t, []bbCall{{CaughtUp: true, Prev: 2, State: 2}}, rec.take(), "nothing consumed: one eventless pass with the final state")

			head = mustAppend(t, s, ev("bb/item", `{}`)).HeadOffset
			bbWait(t, s, "counter", head)
			require.Equal(t, []bbCall{{Offset: head, Type: "bb/item", CaughtUp: true, Prev: 2, State: 3}}, rec.take())

			// Ephemeral events never reach a processor, nor make it pass again.
			res, err := client.Append(ctx, s, []itx.EventInput{{Type: "bb/item", Payload: json.RawMessage(`{}`), Ephemeral: true}}, itx.AppendOptions{})
			require.NoError(t, err)
			bbWait(t, s, "counter", res.HeadOffset)
			require.Empty(t, rec.take(), "an ephemeral consumed type")
			proc := client.Processor(ctx, client.Subscription(ctx, s, "counter"))
			defer proc.Release()
			snap, err := client.Snapshot(ctx, proc)
			require.NoError(t, err)
			require.JSONEq(t, `3`, snap.State)
		})
	}
}

// Seed 002, eviction mid-attempt over RPC with the reference agent: itxd stops (a deploy) while
// the vendor has not answered; after the restart the stream is read at once (which loads it);
// the revived agent settles the orphaned request once, and the stream records the revival.
func TestBBProc_RestartMidAttemptRecordsTheRevival(t *testing.T) {
	clock := clocktest.New(time.Unix(1_800_000_000, 0))
	vendor := &chanVendor{called: make(chan string, 4)}
	agentCfg := examples.DefaultAgentConfig
	agentCfg.HesitationMs = 0
	host := processors.NewHost("test")
	require.NoError(t, examples.AddTo(host, []string{"agent"}, examples.HostOptions{Clock: clock, Vendor: vendor, Agent: agentCfg}))
	cfg := server.Config{DataDir: t.TempDir(), Clock: clock, Processors: host}
	ts := startServer(t, cfg)
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/bb/agent")
	subs := client.Subscriptions(ctx, s)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{
		Name: "agent", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake},
	})
	subs.Release()
	require.NoError(t, err)
	mustAppend(t, s, examples.MessageAdded.Input(examples.Message{Text: "hello"}, ""))
	select {
	case <-vendor.called:
	case <-ctx.Done():
		t.Fatal("the agent never dialed the vendor")
	}
	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, ts.srv.Close(closeCtx))
	ts = startServer(t, cfg)
	s = stream(t, ts.project(t), "/bb/agent")
	requireSettledAndRevivedOnce(t, s, clock, vendor)
}

// The same with the subscription's own filter (a JSONata condition) narrowing what the contract
// consumes: an event the condition drops is not "consumable ahead", so the last delivered
// event before it is caught up, and a scan that delivers nothing gets the eventless pass.
func TestBBProc_CaughtUpUnderASubscriptionCondition(t *testing.T) {
	for _, placement := range []string{"", "remote"} {
		t.Run("placement="+placement, func(t *testing.T) {
			rec := &bbRecorder{}
			host := processors.NewHost("bb")
			require.NoError(t, processors.Add(host, bbCounter(rec)))
			cfg := server.Config{}
			if placement == "" {
				cfg.Processors = host
			}
			ts := startServer(t, cfg)
			p := ts.project(t)
			if placement == "remote" {
				runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "bb-host", host)
			}
			s := stream(t, p, "/bb/cond")
			ctx := ctxT(t)
			subs := client.Subscriptions(ctx, s)
			defer subs.Release()
			_, off, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{
				Name:            "counter",
				Receiver:        client.Receiver{Kind: client.ReceiverProcessorWake, Placement: placement},
				FilterCondition: `type != "bb/item" or payload.n > 1`,
			})
			require.NoError(t, err)
			bbWait(t, s, "counter", off)
			rec.take()
			head := mustAppend(t, s, ev("bb/item", `{"n":2}`), ev("bb/item", `{"n":5}`), ev("bb/item", `{"n":1}`)).HeadOffset
			bbWait(t, s, "counter", head)
			require.Equal(t, []bbCall{
				{Offset: head - 2, Type: "bb/item", CaughtUp: false, Prev: 0, State: 1},
				{Offset: head - 1, Type: "bb/item", CaughtUp: true, Prev: 1, State: 2},
			}, rec.take())
			head = mustAppend(t, s, ev("bb/item", `{"n":0}`)).HeadOffset
			bbWait(t, s, "counter", head)
			require.Equal(t, []bbCall{{CaughtUp: true, Prev: 2, State: 2}}, rec.take(), "only a dropped event: the eventless pass")
		})
	}
}

// The same on a remote host: the host dies mid-attempt (its program ends), another mounts the
// contract; the successor settles the orphaned request once and the stream records the revival.
func TestBBProc_RemoteHostLostMidAttemptRecordsTheRevival(t *testing.T) {
	clock := clocktest.New(time.Unix(1_800_000_000, 0))
	vendor := &chanVendor{called: make(chan string, 4)}
	agentCfg := examples.DefaultAgentConfig
	agentCfg.HesitationMs = 0
	newHost := func() *processors.Host {
		h := processors.NewHost("test")
		require.NoError(t, examples.AddTo(h, []string{"agent"}, examples.HostOptions{Clock: clock, Vendor: vendor, Agent: agentCfg}))
		return h
	}
	ts := startServer(t, server.Config{Clock: clock})
	runHost := func() (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		mounted := make(chan struct{}, 1)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = remote.Run(ctx, remote.Config{Addr: ts.addr, Token: ts.creds.ProjectToken, Name: "agents", Host: newHost(), Clock: clock,
				Mounted: func() { mounted <- struct{}{} }})
		}()
		<-mounted
		return func() { cancel(); <-done }
	}
	stop := runHost()
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/bb/remote-agent")
	subs := client.Subscriptions(ctx, s)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{
		Name: "agent", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Placement: "remote"},
	})
	subs.Release()
	require.NoError(t, err)
	mustAppend(t, s, examples.MessageAdded.Input(examples.Message{Text: "hello"}, ""))
	select {
	case <-vendor.called:
	case <-ctx.Done():
		t.Fatal("the agent never dialed the vendor")
	}
	stop()
	stop = runHost()
	defer stop()
	requireSettledAndRevivedOnce(t, s, clock, vendor)
}

// requireSettledAndRevivedOnce advances clock until the agent on s settled its request and the
// revival is on the stream, each once, with one vendor call; on failure it logs the stream.
func requireSettledAndRevivedOnce(t *testing.T, s schema.Stream, clock *clocktest.Clock, vendor *chanVendor) {
	t.Helper()
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		all, _ := client.ReadAll(context.Background(), s, itx.Query{})
		for _, e := range all {
			t.Logf("%d %s %s", e.Offset, e.Type, e.Payload)
		}
	})
	waitUntil(t, "settled and revived", func() bool {
		clock.Advance(time.Second)
		return countType(t, s, string(examples.LLMSettled)) == 1 && countType(t, s, itx.TypeProcessorRevived) == 1
	})
	require.Equal(t, int64(1), vendor.calls.Load())
}
