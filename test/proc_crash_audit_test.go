package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

var routerThreads = []string{"a", "b", "c"}

// appendRouted appends n router/message events to s, spread over routerThreads, in batches.
func appendRouted(t *testing.T, s schema.Stream, n int) {
	t.Helper()
	ctx := ctxT(t)
	const per = 50
	for i := 0; i < n; i += per {
		batch := make([]itx.EventInput, per)
		for j := range batch {
			batch[j] = examples.RouterMessage.Input(examples.Routed{Thread: routerThreads[(i+j)%len(routerThreads)], Text: fmt.Sprint(i + j)}, "")
		}
		_, err := client.Append(ctx, s, batch, itx.AppendOptions{})
		require.NoError(t, err)
	}
}

// routedCount is the number of thread/message events on every thread stream under base.
func routedCount(t *testing.T, p schema.Project, base string) int {
	t.Helper()
	n := 0
	for _, th := range routerThreads {
		n += countType(t, stream(t, p, examples.ThreadPath(base, th)), string(examples.ThreadMessage))
	}
	return n
}

// requireRoutedOnce asserts that every router/message of src landed exactly once, on its thread's
// stream, and nothing else did.
func requireRoutedOnce(t *testing.T, p schema.Project, src schema.Stream, base string) {
	t.Helper()
	ctx := ctxT(t)
	sources, err := client.ReadAll(ctx, src, itx.Query{Types: []string{string(examples.RouterMessage)}})
	require.NoError(t, err)
	want := map[int64]string{}
	for _, e := range sources {
		m, err := examples.RouterMessage.Decode(e)
		require.NoError(t, err)
		want[e.Offset] = m.Thread
	}
	seen := map[int64]int{}
	for _, th := range routerThreads {
		events, err := client.ReadAll(ctx, stream(t, p, examples.ThreadPath(base, th)), itx.Query{Types: []string{string(examples.ThreadMessage)}})
		require.NoError(t, err)
		for _, e := range events {
			f, err := examples.ThreadMessage.Decode(e)
			require.NoError(t, err)
			require.Equal(t, th, want[f.SourceOffset], "source %d forwarded to thread %s", f.SourceOffset, th)
			seen[f.SourceOffset]++
		}
	}
	var doubled, missing []int64
	for off := range want {
		switch seen[off] {
		case 1:
		case 0:
			missing = append(missing, off)
		default:
			doubled = append(doubled, off)
		}
	}
	require.Empty(t, doubled, "sources forwarded more than once")
	require.Empty(t, missing, "sources never forwarded")
	require.Len(t, seen, len(want))
}

// waitProcessedThroughHead waits until the processor-wake subscription name has processed s
// through its head.
func waitProcessedThroughHead(t *testing.T, s schema.Stream, name string) {
	t.Helper()
	ctx := ctxT(t)
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	sub := client.Subscription(ctx, s, name)
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, info.HeadOffset, 25*time.Second)
	require.NoError(t, err)
}

// The router (Args.AppendTo: a side effect on another stream, whose SQLite is not the one its
// progress commits to) killed with kill -9 twice mid-bulk: after the restarts every message is on
// its thread's stream exactly once (the redelivered frames' forwards dedupe by their keys on the
// target streams) and the snapshot counts each once, reduced and processed through one offset.
func TestCrash_Kill9RouterForwardsOnceAcrossStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	rng := crashSeed(t)
	dataDir := t.TempDir()
	args := []string{"--processors", "router"}
	proc := startItxd(t, dataDir, args...)
	p := loginItxd(t, proc)
	s := stream(t, p, "/rt")
	configureProcessor(t, s, "router")
	const n = 600
	appendRouted(t, s, n)
	for _, at := range []int{1 + rng.IntN(n/4), n/4 + rng.IntN(n/4)} {
		waitUntil(t, "routing under way", func() bool { return routedCount(t, p, "/rt") >= at })
		proc.kill9(t)
		proc = startItxd(t, dataDir, args...)
		p = loginItxd(t, proc)
		s = stream(t, p, "/rt")
	}

	waitProcessedThroughHead(t, s, "router")
	requireRoutedOnce(t, p, s, "/rt")
	_, pr := processorOf(t, s, "router")
	snap, err := client.Snapshot(ctxT(t), pr)
	require.NoError(t, err)
	require.JSONEq(t, fmt.Sprintf(`{"routed":%d,"unroutable":0}`, n), snap.State)
	require.Equal(t, snap.ReducedOffset, snap.ProcessedOffset)
}

// A remote router (its AppendTo forwards go over RPC through itxd) whose host is killed with
// kill -9 mid-bulk, twice, each time another host (a new name) mounting the contract: the stream
// parks, the new host resumes from the committed cursor, and every message is on its thread's
// stream exactly once; the snapshot counts each once.
func TestRemote_Kill9HostMidBulkRoutesOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	rng := crashSeed(t)
	dataDir, addr := t.TempDir(), freeAddr(t)
	proc := startItxd(t, dataDir, "--listen", addr, "--processors", "")
	p := loginItxd(t, proc)
	host := startRemoteHost(t, addr, proc.creds.ProjectToken, "--name", "worker-0", "--processors", "router")
	awaitContract(t, p, "router")
	s := stream(t, p, "/remote/rt")
	configureRemote(t, s, "router")
	const n = 600
	appendRouted(t, s, n)
	for i, at := range []int{1 + rng.IntN(n/4), n/4 + rng.IntN(n/4)} {
		waitUntil(t, "routing under way", func() bool { return routedCount(t, p, "/remote/rt") >= at })
		host.kill9(t)
		host = startRemoteHost(t, addr, proc.creds.ProjectToken, "--name", fmt.Sprintf("worker-%d", i+1), "--processors", "router")
	}

	waitProcessedThroughHead(t, s, "router")
	requireRoutedOnce(t, p, s, "/remote/rt")
	_, pr := processorOf(t, s, "router")
	snap, err := client.Snapshot(ctxT(t), pr)
	require.NoError(t, err)
	require.JSONEq(t, fmt.Sprintf(`{"routed":%d,"unroutable":0}`, n), snap.State)
	require.Equal(t, snap.ReducedOffset, snap.ProcessedOffset)
}

// A remote guestbook whose host is killed with kill -9 under a stream of appends, then itxd
// killed with kill -9 under the restarted host: the host reconnects, and the snapshot is Reduce
// folded over the durable log (no reduce step lost or doubled across either crash), reduced and
// processed through one offset.
func TestRemote_Kill9GuestbookSnapshotIsTheFold(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	dataDir, addr := t.TempDir(), freeAddr(t)
	proc := startItxd(t, dataDir, "--listen", addr, "--processors", "")
	p := loginItxd(t, proc)
	host := startRemoteHost(t, addr, proc.creds.ProjectToken, "--name", "gb-0", "--processors", "guestbook")
	awaitContract(t, p, "guestbook")
	s := stream(t, p, "/remote/gb")
	configureRemote(t, s, "guestbook")
	load := func(s schema.Stream, from int) <-chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := from; ; i++ {
				batch := []itx.EventInput{examples.GuestbookSigned.Input(examples.Signed{Name: fmt.Sprintf("g%d", i%7), Message: "hi"}, "")}
				if _, err := client.Append(ctxT(t), s, batch, itx.AppendOptions{}); err != nil {
					return
				}
			}
		}()
		return done
	}
	done := load(s, 0)
	_, pr := processorOf(t, s, "guestbook")
	processed := func(pr schema.Processor, min int64) func() bool {
		return func() bool {
			snap, err := client.Snapshot(ctxT(t), pr)
			return err == nil && snap.ProcessedOffset >= min
		}
	}
	waitUntil(t, "processing under way", processed(pr, 100))
	host.kill9(t)
	startRemoteHost(t, addr, proc.creds.ProjectToken, "--name", "gb-1", "--processors", "guestbook")
	waitUntil(t, "processing resumed", processed(pr, 300))
	proc.kill9(t)
	<-done

	proc = startItxd(t, dataDir, "--listen", addr, "--processors", "")
	p = loginItxd(t, proc)
	awaitContract(t, p, "guestbook")
	s = stream(t, p, "/remote/gb")
	mustAppend(t, s, examples.GuestbookSigned.Input(examples.Signed{Name: "last", Message: "hi"}, ""))
	waitProcessedThroughHead(t, s, "guestbook")
	_, pr = processorOf(t, s, "guestbook")
	snap, err := client.Snapshot(ctxT(t), pr)
	require.NoError(t, err)
	require.JSONEq(t, guestbookFold(t, s), snap.State)
	require.Equal(t, snap.ReducedOffset, snap.ProcessedOffset)
}

// lateHost hosts "late": each late/x event schedules a late/timer an hour ahead (keyed by the
// host) and appends one late/effect naming the host, unkeyed (effects a dead incarnation must not
// land: the seed's stray closure hitting the fence); errs gets the schedule's error, then the
// append's. With
// hold set, the effect first waits for hold: a host frozen mid-frame (a stopped process, a long
// pause) whose connection stays up.
func lateHost(t testing.TB, name string, started chan<- struct{}, hold <-chan struct{}, errs chan<- error) *processors.Host {
	h := processors.NewHost("test")
	require.NoError(t, processors.Add(h, func() processors.Contract[int] {
		return processors.Contract[int]{
			Name: "late", ConsumedTypes: []string{"late/x"}, ReducerVersion: "1",
			InitialState: func() int { return 0 },
			Reduce:       func(n int, e itx.Event) int { return n + 1 },
			ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
				if a.Event == nil {
					return nil
				}
				// Blocking: the effect is the event's whole consequence.
				a.BlockProcessorWhile("effect", func(ctx context.Context) error {
					if hold != nil {
						select {
						case started <- struct{}{}:
						default:
						}
						<-hold
					}
					serr := a.ScheduleAppend(ctx, time.Now().Add(time.Hour), itx.EventInput{Type: "late/timer",
						IdempotencyKey: "timer-" + name, Payload: json.RawMessage(fmt.Sprintf(`{"host":%q}`, name))})
					_, err := a.Append(ctx, itx.EventInput{Type: "late/effect", Payload: json.RawMessage(fmt.Sprintf(`{"host":%q}`, name))})
					if errs != nil {
						select {
						case errs <- serr: // the first attempt's: later retries are not the probe's
							errs <- err
						default:
						}
					}
					return errors.Join(serr, err)
				})
				return nil
			},
		}
	}))
	return h
}

// A remote host frozen mid-frame (its connection up) while a second host takes the contract over
// and processes the stream: once it thaws, its effect of the frame it was running must be refused
// by the fence (the mount's ports refuse its writes from the takeover on), not land beside its
// successor's. The successor's effect lands; the frozen host's does not.
// (A remote runner's Args.Append went through the plain stream capability, which nothing
// fenced: the thawed host's unkeyed effect landed after its successor's takeover. It goes
// through the ports now, as AppendTo does.)
func TestRemote_TakenOverHostLandsNoLateAppend(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	s := stream(t, p, "/remote/late-append")
	started, hold, errs := make(chan struct{}, 1), make(chan struct{}), make(chan error, 2)
	var thaw sync.Once
	awaitMount(t, runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "frozen", lateHost(t, "frozen", started, hold, errs)))
	t.Cleanup(func() { thaw.Do(func() { close(hold) }) }) // registered after the host's: runs before it
	configureRemote(t, s, "late")
	mustAppend(t, s, ev("late/x", `{}`))
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the first host never ran the frame")
	}
	awaitMount(t, runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "successor", lateHost(t, "successor", nil, nil, nil)))
	// The takeover cancels the wake the frozen host holds: the successor runs the frame at once,
	// not once that wake times out (40 s).
	waitUntil(t, "the successor's effect, the first host still frozen", func() bool {
		events, err := client.ReadAll(ctx, s, itx.Query{Types: []string{"late/effect"}})
		return err == nil && len(events) == 1 && string(events[0].Payload) == `{"host":"successor"}`
	})
	thaw.Do(func() { close(hold) })
	var serr, err error
	select {
	case serr = <-errs:
		err = <-errs
	case <-ctx.Done():
		t.Fatal("the frozen host's effect never returned")
	}
	events, rerr := client.ReadAll(ctx, s, itx.Query{Types: []string{"late/effect"}})
	require.NoError(t, rerr)
	var hosts []string
	for _, e := range events {
		hosts = append(hosts, string(e.Payload))
	}
	require.NotContains(t, hosts, `{"host":"frozen"}`, "late/effect events on the stream")
	require.Error(t, err, "the frozen host's late append was accepted")
	require.Error(t, serr, "the frozen host's late schedule was accepted")
	timers, lerr := client.ListScheduled(ctx, s)
	require.NoError(t, lerr)
	for _, sc := range timers {
		require.NotEqual(t, "timer-frozen", sc.Event.IdempotencyKey, "the frozen host's timer is scheduled")
	}
}

// kill -9 of itxd just after a processor's forward committed on another stream, before the
// processor's frame committed its progress, and the forward's stream trimmed (the forward and its
// idempotency key with it) before the event is redelivered: the forward made again is the one the
// stream took, not a second one. The target keeps, per source processor, the keys of the forwards
// it took from events the processor may still redeliver (above its committed cursor); without
// that the message landed on its thread a second time. In-process and from a remote host.
func TestCrash_ForwardRedeliveredAfterTheTargetTrimmedItIsNotForwardedAgain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	t.Run("in-process", func(t *testing.T) { forwardRedeliveredAfterATrim(t, false) })
	t.Run("remote host", func(t *testing.T) { forwardRedeliveredAfterATrim(t, true) })
}

func forwardRedeliveredAfterATrim(t *testing.T, remote bool) {
	dataDir, addr := t.TempDir(), freeAddr(t)
	hosted := []string{"--listen", addr, "--processors", "router"}
	if remote {
		hosted = []string{"--listen", addr, "--processors", ""}
	}
	proc := startItxdKilledAt(t, dataDir, "processor-forward-committed", hosted...)
	p := loginItxd(t, proc)
	var host *remoteProcess
	if remote {
		host = startRemoteHost(t, addr, proc.creds.ProjectToken, "--name", "worker-0", "--processors", "router")
		awaitContract(t, p, "router")
	}
	s := stream(t, p, "/rt")
	if remote {
		configureRemote(t, s, "router")
	} else {
		configureProcessor(t, s, "router")
	}
	batch := make([]itx.EventInput, len(routerThreads))
	for i, th := range routerThreads {
		batch[i] = examples.RouterMessage.Input(examples.Routed{Thread: th, Text: th}, "")
	}
	// Made now, not before the start: the first start may build itxd with the kill points,
	// which under load can take most of 30 s.
	ctx := ctxT(t)
	_, err := client.Append(ctx, s, batch, itx.AppendOptions{})
	require.NoError(t, err)
	proc.requireKilledAtThePoint(t) // the first forward (to thread a) committed, the frame did not
	if remote {
		host.kill9(t)
	}

	// Nothing hosts the router now: the trim of thread a comes before the redelivery.
	proc = startItxd(t, dataDir, "--listen", addr, "--processors", "")
	p = loginItxd(t, proc)
	first := stream(t, p, examples.ThreadPath("/rt", routerThreads[0]))
	require.Equal(t, 1, countType(t, first, string(examples.ThreadMessage)), "the forward landed before the kill")
	info, err := client.Describe(ctx, first)
	require.NoError(t, err)
	trimmed, err := client.Trim(ctx, first, info.HeadOffset)
	require.NoError(t, err)
	require.Equal(t, int64(1), trimmed.Deleted, "the forward, trimmed")
	proc.kill9(t)

	proc = startItxd(t, dataDir, hosted...)
	p = loginItxd(t, proc)
	if remote {
		startRemoteHost(t, addr, proc.creds.ProjectToken, "--name", "worker-1", "--processors", "router")
		awaitContract(t, p, "router")
	}
	s = stream(t, p, "/rt")
	waitProcessedThroughHead(t, s, "router")
	first = stream(t, p, examples.ThreadPath("/rt", routerThreads[0]))
	require.Zero(t, countType(t, first, string(examples.ThreadMessage)), "the trimmed forward is not made again")
	require.Equal(t, len(routerThreads)-1, routedCount(t, p, "/rt"), "the other threads' forwards land once")
}

// The router killed with kill -9 twice mid-bulk, its thread streams keeping their last 5 events
// (a retention policy, applied again as each loads for the redelivered forwards): every message is
// forwarded once, the thread streams' heads adding up to the messages. The redelivered frames'
// forwards whose first copies retention deleted (their keys with them) landed again without the
// receiving streams' effect fence: 760 to 872 forwards for 600.
func TestCrash_Kill9RouterForwardsOnceIntoRetainingStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	rng := crashSeed(t)
	dataDir := t.TempDir()
	args := []string{"--processors", "router"}
	proc := startItxd(t, dataDir, args...)
	p := loginItxd(t, proc)
	for _, th := range routerThreads {
		ts := stream(t, p, examples.ThreadPath("/rt", th))
		mustAppend(t, ts, ev("seed", `{}`)) // a stream holds a policy once it exists
		require.NoError(t, client.SetRetention(ctxT(t), ts, client.Retention{MaxEvents: 5}))
	}
	s := stream(t, p, "/rt")
	configureProcessor(t, s, "router")
	const n = 600
	appendRouted(t, s, n)
	forwarded := func() int64 { // the thread streams' heads, less their seed events
		var sum int64
		for _, th := range routerThreads {
			info, err := client.Describe(ctxT(t), stream(t, p, examples.ThreadPath("/rt", th)))
			require.NoError(t, err)
			sum += info.HeadOffset - 1
		}
		return sum
	}
	for _, at := range []int64{1 + rng.Int64N(n/4), n/4 + rng.Int64N(n/4)} {
		waitUntil(t, "routing under way", func() bool { return forwarded() >= at })
		proc.kill9(t)
		proc = startItxd(t, dataDir, args...)
		p = loginItxd(t, proc)
		s = stream(t, p, "/rt")
	}
	waitProcessedThroughHead(t, s, "router")
	require.Equal(t, int64(n), forwarded(), "each message forwarded once")
}
