package test

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/remote"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// tally records every ProcessEvent call of the tally contract by offset, wherever it runs: the
// side effects of a processor, counted.
type tally struct {
	mu  sync.Mutex
	ran map[int64]int
}

func (ty *tally) contract() processors.Contract[int] {
	return processors.Contract[int]{
		Name: "tally", ConsumedTypes: []string{"tally/x"}, ReducerVersion: "1",
		InitialState: func() int { return 0 },
		Reduce:       func(n int, e itx.Event) int { return n + 1 },
		ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
			if a.Event != nil {
				ty.mu.Lock()
				ty.ran[a.Event.Offset]++
				ty.mu.Unlock()
			}
			return nil
		},
	}
}

func (ty *tally) host(t testing.TB) *processors.Host {
	h := processors.NewHost("test")
	require.NoError(t, processors.Add(h, ty.contract))
	return h
}

func (ty *tally) count(offset int64) int {
	ty.mu.Lock()
	defer ty.mu.Unlock()
	return ty.ran[offset]
}

// twice lists the offsets whose effects ran more than once.
func (ty *tally) twice() []int64 {
	ty.mu.Lock()
	defer ty.mu.Unlock()
	var out []int64
	for o, n := range ty.ran {
		if n > 1 {
			out = append(out, o)
		}
	}
	slices.Sort(out)
	return out
}

// deafHost is a remote host that never hears itxd's stop (an older host, or a stop lost with a
// call that failed): its session of a processor outlives the processor's placement there.
type deafHost struct{ *remote.HostServer }

func (deafHost) Stop(context.Context, schema.ProcessorHost_stop) error { return nil }

// A remote runner fenced while it sat idle (the instance ran in-process meanwhile, claiming its
// record) runs nothing when it is woken again: the wake carries the record's generation, the host
// sees its runner is older, and a fresh runner claims the record before any effect. Before, the
// stale runner ran the frame's effects (the events the in-process runner had already processed
// among them) and learned it was fenced only when its commit was refused.
func TestRemote_StaleRunnerRunsNoEffects(t *testing.T) {
	ty := &tally{ran: map[int64]int{}}
	ts := startServer(t, server.Config{Processors: ty.host(t)})
	ctx := ctxT(t)
	p := ts.project(t)
	hs := remote.NewHostServer(remote.Config{Host: ty.host(t), Logf: t.Logf})
	handle, err := mountHostServing(ctx, ts.project(t), "deaf", deafHost{hs}, ty.host(t).Contracts())
	require.NoError(t, err)
	defer handle.Release()
	s := stream(t, p, "/remote/stale-runner")
	sub, _ := processorOf(t, s, "tally")
	run := func(placement string) {
		configureInstance(t, s, "tally", "", placement)
		head := mustAppend(t, s, ev("tally/x", `{}`)).HeadOffset
		_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
		require.NoError(t, err, placement)
	}
	run("remote")
	run("in-process")
	run("remote")
	require.Empty(t, ty.twice(), "effects ran twice at these offsets")
	d, err := client.DescribeSubscription(ctx, sub)
	require.NoError(t, err)
	require.Empty(t, d.LastError, "the wake to the stale runner failed")
	require.Len(t, ty.ran, 3)
}

// removeSubscription removes the subscription name of s.
func removeSubscription(t testing.TB, s schema.Stream, name string) {
	t.Helper()
	ctx := ctxT(t)
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, err := client.RemoveSubscription(ctx, subs, name)
	require.NoError(t, err)
}

// A processor-wake subscription created anew under a removed one's name is a new subscriber: it
// starts from its start position with a fresh processor (state, processing cursor), so it
// processes the stream from the beginning, as any new subscriber does, instead of resuming the
// removed one's progress record (before, its runner found the old record at the head and skipped
// every event the removed subscription had processed).
func TestProcessors_RecreatedSubscriptionStartsFresh(t *testing.T) {
	for _, placement := range []string{"in-process", "remote"} {
		t.Run(placement, func(t *testing.T) {
			ty := &tally{ran: map[int64]int{}}
			ts := startServer(t, server.Config{Processors: ty.host(t)})
			ctx := ctxT(t)
			if placement == "remote" {
				awaitMount(t, runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "worker", ty.host(t)))
			}
			s := stream(t, ts.project(t), "/processors/recreated")
			configureInstance(t, s, "tally", "", placement)
			first := mustAppend(t, s, ev("tally/x", `{}`), ev("tally/x", `{}`)).HeadOffset
			sub, proc := processorOf(t, s, "tally")
			_, err := client.WaitUntilProcessed(ctx, sub, first, 0)
			require.NoError(t, err)

			removeSubscription(t, s, "tally")
			configureInstance(t, s, "tally", "", placement)
			head := mustAppend(t, s, ev("tally/x", `{}`)).HeadOffset
			_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
			require.NoError(t, err)
			for _, o := range []int64{first - 1, first} {
				require.Equal(t, 2, ty.count(o), "offset %d: processed by the removed subscription and again by the new one", o)
			}
			require.Equal(t, 1, ty.count(head))
			snap, err := client.Snapshot(ctx, proc)
			require.NoError(t, err)
			require.Equal(t, "3", snap.State, "the new processor folded the whole stream once")
		})
	}
}

// The crash-loop breaker of a removed processor does not carry over to a subscription created anew
// under its name: the new processor's first revival is its first (revivals 1), not the removed
// one's count plus one with the removed one's backoff.
func TestProcessors_RecreatedSubscriptionHasAFreshBreaker(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	var broken atomic.Bool
	broken.Store(true)
	host := processors.NewHost("v1")
	require.NoError(t, processors.Add(host, func() processors.Contract[int] { return poisonContract(&broken) }))
	ts := startServer(t, server.Config{Clock: clock, Processors: host})
	ctx := ctxT(t)
	ref := server.StreamRef{ProjectID: "default", Path: "/processors/recreated-breaker"}
	s := stream(t, ts.project(t), ref.Path)
	configureProcessor(t, s, "poison")
	mustAppend(t, s, ev("crash/poison", `{}`))
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
	for i := 0; len(revivals()) < 3; i++ {
		require.Less(t, i, 1000, "the breaker never revived three times")
		step(10 * time.Second)
	}
	before := len(revivals())
	removeSubscription(t, s, "poison")
	configureProcessor(t, s, "poison")
	for i := 0; len(revivals()) == before; i++ {
		require.Less(t, i, 100, "the new processor was never revived")
		step(10 * time.Second)
	}
	require.Equal(t, 1, revivals()[before], "the new processor's first revival counts from the removed one's (revivals %v)", revivals())
}

// startWithTallyHost starts a server hosting the tally contract and mounts a remote host of it
// ("worker") for the test's length.
func startWithTallyHost(t *testing.T) (*testServer, *remote.HostServer) {
	t.Helper()
	ty := &tally{ran: map[int64]int{}}
	ts := startServer(t, server.Config{Processors: ty.host(t)})
	hs := remote.NewHostServer(remote.Config{Host: ty.host(t), Logf: t.Logf})
	handle, err := mountHostServing(ctxT(t), ts.project(t), "worker", hs, ty.host(t).Contracts())
	require.NoError(t, err)
	t.Cleanup(handle.Release)
	return ts, hs
}

// A remote host's session of a processor ends when its subscription stops running there (removed,
// or placed in-process): itxd tells the host, so the host's sessions (a registry, runners,
// capabilities to the stream) are bounded by the subscriptions it serves, not by every
// subscription it ever served while its connection lasts.
func TestRemote_RemovedSubscriptionEndsTheHostSession(t *testing.T) {
	ts, hs := startWithTallyHost(t)
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/remote/removed-session")
	for _, name := range []string{"a", "b"} {
		configureInstance(t, s, name, "tally", "remote")
	}
	head := mustAppend(t, s, ev("tally/x", `{}`)).HeadOffset
	for _, name := range []string{"a", "b"} {
		sub, _ := processorOf(t, s, name)
		_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
		require.NoError(t, err, name)
	}
	require.Equal(t, 2, hs.Sessions())

	removeSubscription(t, s, "a")
	waitUntil(t, "the removed subscription's session ended", func() bool { return hs.Sessions() == 1 })
	configureInstance(t, s, "b", "tally", "in-process")
	waitUntil(t, "the session of the subscription placed in-process ended", func() bool { return hs.Sessions() == 0 })
}

// Deleting a stream ends the host's sessions of its remote processors too, and spares the
// sessions of another stream's.
func TestRemote_DeletedStreamEndsTheHostSessions(t *testing.T) {
	ts, hs := startWithTallyHost(t)
	ctx := ctxT(t)
	for _, path := range []string{"/remote/doomed", "/remote/kept"} {
		s := stream(t, ts.project(t), path)
		configureInstance(t, s, "a", "tally", "remote")
		head := mustAppend(t, s, ev("tally/x", `{}`)).HeadOffset
		sub, _ := processorOf(t, s, "a")
		_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
		require.NoError(t, err, path)
	}
	require.Equal(t, 2, hs.Sessions())
	_, err := client.DeleteStream(ctx, ts.project(t), "/remote/doomed", true)
	require.NoError(t, err)
	waitUntil(t, "the deleted stream's session ended", func() bool { return hs.Sessions() == 1 })
	kept := stream(t, ts.project(t), "/remote/kept")
	head := mustAppend(t, kept, ev("tally/x", `{}`)).HeadOffset
	sub, _ := processorOf(t, kept, "a")
	_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err, "the other stream's processor runs on")
	require.Equal(t, 1, hs.Sessions())
}

// lateStopHost serves a HostServer whose stop calls take a while to land (a slow link, a busy
// host): each is let through delay after it arrived, while later calls go on (call.Go).
type lateStopHost struct {
	*remote.HostServer
	delay  time.Duration
	landed chan struct{} // one send per stop, once it reached the HostServer
}

func (h *lateStopHost) Stop(ctx context.Context, call schema.ProcessorHost_stop) error {
	call.Go()
	time.Sleep(h.delay)
	err := h.HostServer.Stop(ctx, call)
	h.landed <- struct{}{}
	return err
}

// The stop itxd sends a host for a removed processor-wake subscription ends only the removed
// one's session: a subscription created anew at once under the name is woken after the stop
// landed, so its session stands. Before, the stop went out on a goroutine of its own and the new
// subscription's wake did not wait for it: a stop landing after that wake ended the new session.
func TestRemote_StopOfARemovedSubscriptionSparesTheRecreatedOne(t *testing.T) {
	ty := &tally{ran: map[int64]int{}}
	ts := startServer(t, server.Config{Processors: ty.host(t)})
	ctx := ctxT(t)
	hs := &lateStopHost{HostServer: remote.NewHostServer(remote.Config{Host: ty.host(t), Logf: t.Logf}),
		delay: 500 * time.Millisecond, landed: make(chan struct{}, 4)}
	handle, err := mountHostServing(ctx, ts.project(t), "worker", hs, ty.host(t).Contracts())
	require.NoError(t, err)
	defer handle.Release()
	s := stream(t, ts.project(t), "/remote/late-stop")
	configureInstance(t, s, "tally", "", "remote")
	first := mustAppend(t, s, ev("tally/x", `{}`)).HeadOffset
	sub, _ := processorOf(t, s, "tally")
	_, err = client.WaitUntilProcessed(ctx, sub, first, 0)
	require.NoError(t, err)
	require.Equal(t, 1, hs.Sessions())

	removeSubscription(t, s, "tally")
	configureInstance(t, s, "tally", "", "remote")
	head := mustAppend(t, s, ev("tally/x", `{}`)).HeadOffset
	_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	select {
	case <-hs.landed:
	case <-ctx.Done():
		t.Fatal("the removed subscription's stop never reached the host")
	}
	require.Equal(t, 1, hs.Sessions(), "the recreated subscription's session stands after the removed one's stop")
	require.Equal(t, 2, ty.count(first), "processed by the removed subscription and again by the new one")
	require.Equal(t, 1, ty.count(head))
}

// A waitUntilProcessed in progress follows the processor's progress, not the runner it found:
// the subscription placed elsewhere (its in-process runner ends, a remote host's runner takes
// over the record), or set to run another contract (a new runner), resolves the barrier once the
// new runner processed the offset. Before, it waited on the replaced runner, whose cursor never
// moved again, and timed out.
func TestProcessors_WaitFollowsTheCurrentRunner(t *testing.T) {
	for _, change := range []string{"placed remote", "another contract"} {
		t.Run(change, func(t *testing.T) {
			ty := &tally{ran: map[int64]int{}}
			host := ty.host(t)
			require.NoError(t, processors.Add(host, func() processors.Contract[int] {
				c := ty.contract()
				c.Name = "tally2"
				return c
			}))
			ts := startServer(t, server.Config{Processors: host})
			ctx := ctxT(t)
			awaitMount(t, runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "worker", ty.host(t)))
			s := stream(t, ts.project(t), "/processors/wait-follows")
			configureInstance(t, s, "tally", "tally", "in-process")
			head := mustAppend(t, s, ev("tally/x", `{}`)).HeadOffset
			sub, _ := processorOf(t, s, "tally")
			_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
			require.NoError(t, err)

			// The barrier is asked first (it finds the in-process runner at once), then the
			// subscription changes, then the offset it waits for is appended.
			fut, release := sub.WaitUntilProcessed(ctx, func(p schema.Subscription_waitUntilProcessed_Params) error {
				p.SetOffset(uint64(head + 2))
				p.SetTimeoutMs(uint32((5 * time.Second).Milliseconds()))
				return nil
			})
			defer release()
			if change == "placed remote" {
				configureInstance(t, s, "tally", "tally", "remote")
			} else {
				configureInstance(t, s, "tally", "tally2", "in-process")
			}
			want := mustAppend(t, s, ev("tally/x", `{}`)).HeadOffset
			require.Equal(t, head+2, want)
			res, err := fut.Struct()
			require.NoError(t, err, "the barrier waited on the replaced runner")
			require.GreaterOrEqual(t, int64(res.ConfirmedOffset()), want)
			require.Equal(t, 1, ty.count(want))
		})
	}
}
