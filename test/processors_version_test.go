package test

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// The antidote deploy retries immediately (seed 002): a processor crash-looping at the breaker's
// 6 h plateau under one version (its wake halted by the retry ladder, so only the breaker would
// try again) is revived within moments of itxd restarting on a new version, with a fresh budget
// (revivals 1), not when the old version's backoff comes due.
func TestProcessors_NewVersionRetriesAtOnce(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	var broken atomic.Bool
	broken.Store(true)
	host := func(version string) *processors.Host {
		h := processors.NewHost(version)
		require.NoError(t, processors.Add(h, func() processors.Contract[int] { return poisonContract(&broken) }))
		return h
	}
	cfg := server.Config{DataDir: t.TempDir(), Clock: clock, Processors: host("v1")}
	ts := startServer(t, cfg)
	ctx := ctxT(t)
	ref := server.StreamRef{ProjectID: "default", Path: "/processors/antidote"}
	s := stream(t, ts.project(t), ref.Path)
	configureProcessor(t, s, "poison")
	poison := mustAppend(t, s, ev("crash/poison", `{}`)).HeadOffset
	step := func(d time.Duration) {
		clock.Advance(d)
		require.NoError(t, ts.srv.Settle(ctx, ref))
	}
	revivals := func() []int {
		evs, err := client.ReadAll(ctx, s, itx.Query{Types: []string{itx.TypeProcessorRevived}})
		require.NoError(t, err)
		var out []int
		for _, e := range evs {
			var p struct{ Revivals int }
			require.NoError(t, json.Unmarshal(e.Payload, &p))
			out = append(out, p.Revivals)
		}
		return out
	}
	// Up to the plateau: after the 5th revival the next one is 6 h away.
	for i := 0; len(revivals()) < 5; i++ {
		require.Less(t, i, 1000, "the breaker never reached its plateau")
		step(10 * time.Second)
	}
	// The retry ladder then halts the wake (about 2 h): from here only the breaker's plateau
	// would try again, 6 h after the last revival.
	sub0 := client.Subscription(ctx, s, "poison")
	defer sub0.Release()
	for i := 0; ; i++ {
		d, err := client.DescribeSubscription(ctx, sub0)
		require.NoError(t, err)
		if d.Status == itx.StatusHalted {
			break
		}
		require.Less(t, i, 300, "the ladder never halted the poisoned wake")
		step(time.Minute)
	}
	for range 3 { // the fire after the last attempt: the breaker waits for its plateau
		step(time.Minute)
	}
	before := len(revivals())
	require.Equal(t, 5, before, "no revival came due before the plateau")

	broken.Store(false)
	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, ts.srv.Close(closeCtx))
	cfg.Processors = host("v2")
	ts = startServer(t, cfg)
	s = stream(t, ts.project(t), ref.Path)
	sub := client.Subscription(ctx, s, "poison")
	defer sub.Release()
	var d itx.SubscriptionDescription
	for range 6 { // one minute
		step(10 * time.Second)
		var err error
		d, err = client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		if d.ConfirmedOffset >= poison {
			break
		}
	}
	require.GreaterOrEqual(t, d.ConfirmedOffset, poison, "a minute after the antidote deploy the processor still waits out the old version's backoff (status %s)", d.Status)
	require.Greater(t, len(revivals()), before)
	require.Equal(t, 1, revivals()[before], "the new version's first revival starts a fresh budget")
}

// alarmSpy is a ProcessorHost that, at its first wake, arms its processor's alarm slice far
// ahead (a breaker backing off) through the wake's ports, and reports every alarm wake.
type alarmSpy struct {
	armAt   int64 // epoch ms; 0: arm nothing
	mu      sync.Mutex
	armed   bool
	alarmed chan struct{}
	ready   chan struct{}
}

func (h *alarmSpy) Wake(ctx context.Context, call schema.ProcessorHost_wake) error {
	req, err := call.Args().Request()
	if err != nil {
		return err
	}
	if req.Alarm() {
		select {
		case h.alarmed <- struct{}{}:
		default:
		}
	}
	h.mu.Lock()
	arm := h.armAt != 0 && !h.armed
	h.armed = h.armed || arm
	h.mu.Unlock()
	if arm {
		ports := req.Ports().AddRef()
		call.Go()
		defer ports.Release()
		fut, release := ports.SetAlarm(ctx, func(p schema.ProcessorPorts_setAlarm_Params) error {
			p.SetAt(h.armAt)
			return nil
		})
		defer release()
		if _, err := client.Await(ctx, fut); err != nil {
			return err
		}
		close(h.ready)
	}
	_, err = call.AllocResults()
	return err
}

func (h *alarmSpy) GetRuntimeState(ctx context.Context, call schema.ProcessorHost_getRuntimeState) error {
	return nil
}

func (h *alarmSpy) Stop(context.Context, schema.ProcessorHost_stop) error { return nil }

// A remote processor backing off (its alarm slice armed hours ahead) is woken for its alarm as
// soon as a host announcing its contract mounts, also after itxd restarted: a new build there
// resets the breaker's budget and revives it at once (the SDK's registry does, on its first
// wake under another version), instead of waiting out the old build's backoff.
func TestRemote_MountWakesABackingOffProcessor(t *testing.T) {
	cfg := server.Config{DataDir: t.TempDir()}
	ts := startServer(t, cfg)
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/remote/antidote")
	configureRemote(t, s, "spied")
	contracts := []itx.ProcessorInfo{{Name: "spied", ReducerVersion: "1", ConsumedTypes: []string{"t"}}}
	first := &alarmSpy{armAt: time.Now().Add(6 * time.Hour).UnixMilli(), alarmed: make(chan struct{}, 1), ready: make(chan struct{})}
	h, err := mountHostServing(ctx, dial(t, ts.addr).Login(ctx, ts.creds.ProjectToken), "old-build", first, contracts)
	require.NoError(t, err)
	mustAppend(t, s, ev("t", `{}`))
	select {
	case <-first.ready:
	case <-ctx.Done():
		t.Fatal("the first host was never woken")
	}
	h.Release()

	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, ts.srv.Close(closeCtx))
	ts = startServer(t, cfg)
	next := &alarmSpy{alarmed: make(chan struct{}, 1)}
	h2, err := mountHostServing(ctx, dial(t, ts.addr).Login(ctx, ts.creds.ProjectToken), "new-build", next, contracts)
	require.NoError(t, err)
	defer h2.Release()
	select {
	case <-next.alarmed:
	case <-time.After(10 * time.Second):
		t.Fatal("the mount of the contract did not wake the processor for its alarm: it waits out the backoff armed hours ahead")
	}
}
