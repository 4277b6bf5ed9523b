package test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// spyClaim is what a spy host's wake holds of its processor: the ports, the instance, the
// generation its claim took and the progress the claim handed it.
type spyClaim struct {
	ports    schema.ProcessorPorts
	name     string
	gen      uint64
	raw      string // the claimed progress as JSON ("" if none)
	progress itx.ProcessorProgress
}

// claimWake claims the record of the processor req wakes, as a runner starting does.
func claimWake(ctx context.Context, req schema.WakeRequest) (*spyClaim, error) {
	name, err := req.Name()
	if err != nil {
		return nil, err
	}
	c := &spyClaim{ports: req.Ports(), name: name}
	cf, release := c.ports.Claim(ctx, func(a schema.ProcessorPorts_claim_Params) error { return a.SetName(name) })
	defer release()
	claimed, err := client.Await(ctx, cf)
	if err != nil {
		return nil, err
	}
	c.gen = claimed.Generation()
	if c.raw, err = claimed.Progress(); err != nil {
		return nil, err
	}
	if c.raw != "" {
		if err := json.Unmarshal([]byte(c.raw), &c.progress); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// commit commits the progress, processed and reduced through through, under the claim.
func (c *spyClaim) commit(ctx context.Context, through int64) error {
	c.progress.ReducerVersion, c.progress.ReducedThrough, c.progress.ProcessedThrough = "1", through, through
	c.progress.State = json.RawMessage(fmt.Sprintf(`{"through":%d}`, through))
	b, err := json.Marshal(c.progress)
	if err != nil {
		return err
	}
	mf, release := c.ports.Commit(ctx, func(a schema.ProcessorPorts_commit_Params) error {
		a.SetGeneration(c.gen)
		if err := a.SetName(c.name); err != nil {
			return err
		}
		return a.SetProgress(string(b))
	})
	defer release()
	_, err = client.Await(ctx, mf)
	return err
}

// reportThrough answers a wake with the processor processed and reduced through head.
func reportThrough(call schema.ProcessorHost_wake, head int64) error {
	return reportAt(call, head, head)
}

// reportAt answers a wake with the processor processed through processed and reduced through
// reduced.
func reportAt(call schema.ProcessorHost_wake, processed, reduced int64) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	rep, err := res.NewReport()
	if err != nil {
		return err
	}
	rep.SetProcessedOffset(uint64(processed))
	rep.SetReducedOffset(uint64(reduced))
	return nil
}

// quietHost is the part of a spy host that keeps no runtime state and ignores stops.
type quietHost struct{}

func (quietHost) Stop(context.Context, schema.ProcessorHost_stop) error { return nil }

func (quietHost) GetRuntimeState(context.Context, schema.ProcessorHost_getRuntimeState) error {
	return fmt.Errorf("not kept")
}

// recordSpy is a remote processor host that, at each wake, claims the instance's record and
// notes what the claim handed it (the progress found) and whether its KV record from an earlier
// wake is there, then writes that KV record and commits the instance processed through the head.
type recordSpy struct {
	quietHost
	mu    sync.Mutex
	wakes []spiedWake
}

type spiedWake struct {
	progress string // the claimed record's progress ("" if none)
	kvFound  bool   // the instance's KV record was there
}

func (h *recordSpy) Wake(ctx context.Context, call schema.ProcessorHost_wake) error {
	req, err := call.Args().Request()
	if err != nil {
		return err
	}
	c, err := claimWake(ctx, req)
	if err != nil {
		return err
	}
	key := itx.ProcessorKVPrefix(c.name) + "breaker"
	gf, release := c.ports.KvGet(ctx, func(a schema.ProcessorPorts_kvGet_Params) error { return a.SetKey(key) })
	defer release()
	got, err := client.Await(ctx, gf)
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.wakes = append(h.wakes, spiedWake{progress: c.raw, kvFound: got.Found()})
	h.mu.Unlock()
	pf, release2 := c.ports.KvPut(ctx, func(a schema.ProcessorPorts_kvPut_Params) error {
		if err := a.SetKey(key); err != nil {
			return err
		}
		return a.SetValue([]byte("a crash-loop counter"))
	})
	defer release2()
	if _, err := client.Await(ctx, pf); err != nil {
		return err
	}
	head := int64(req.HeadOffset())
	if err := c.commit(ctx, head); err != nil {
		return err
	}
	return reportThrough(call, head)
}

func (h *recordSpy) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.wakes)
}

// at is the i-th wake (0 is the first).
func (h *recordSpy) at(i int) spiedWake {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.wakes[i]
}

// configureCopy reconfigures name as a copy-to-stream subscription into path.
func configureCopy(t testing.TB, s schema.Stream, name, path string) int64 {
	t.Helper()
	ctx := ctxT(t)
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, at, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{
		Name: name, Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: path},
	})
	require.NoError(t, err)
	return at
}

// A processor whose subscription is reconfigured as another kind ends as at a removal: configured
// as a processor again later, it is a new processor, claiming a record with no progress and
// finding none of the old one's KV (keepalive, crash-loop counter), not the old processor's
// cursor and state, which missed every event the copy delivered meanwhile. A change of placement
// alone keeps the kind, and the records (TestProcessors_InstanceMovesToARemoteHostAndBack).
func TestProcessors_KindChangedAwayAndBackStartsAnew(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	spy := &recordSpy{}
	h, err := mountHostServing(ctx, p, "spy", spy, []itx.ProcessorInfo{{Name: "c", ReducerVersion: "1", ConsumedTypes: []string{"*"}}})
	require.NoError(t, err)
	defer h.Release()
	s := stream(t, p, "/kind/away-and-back")
	sub := client.Subscription(ctx, s, "a")
	defer sub.Release()
	processed := func(at int64) {
		t.Helper()
		_, err := client.WaitUntilProcessed(ctx, sub, at, 0)
		require.NoError(t, err)
	}

	configureInstance(t, s, "a", "c", "remote")
	processed(mustAppend(t, s, ev("x", `{}`)).HeadOffset)
	require.Equal(t, spiedWake{}, spy.at(0), "the first processor starts from nothing")
	require.True(t, spy.at(spy.count()-1).kvFound, "a later wake of one processor finds its records")

	configureCopy(t, s, "a", "/kind/elsewhere")
	processed(mustAppend(t, s, ev("x", `{}`)).HeadOffset)

	again := spy.count()
	configureInstance(t, s, "a", "c", "remote")
	processed(mustAppend(t, s, ev("x", `{}`)).HeadOffset)
	require.Equal(t, spiedWake{}, spy.at(again), "the processor configured again resumed the old one's records")
}

// The same kind change in one commit (a raw append of the configure as another kind and the
// configure as a processor again): the processor the commit replaced ends, and its live view
// hears subscriptionRemoved; the new one starts from offset 1 in a new incarnation.
func TestProcessorView_KindChangedAwayAndBackInOneCommitEndsTheView(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "guestbook")})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/procview/kind-one-commit")
	configureProcessor(t, s, "guestbook")
	head := signGuestbook(t, s, 3)
	sub, proc := processorOf(t, s, "guestbook")
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	old := watchProcessor(t, proc)
	gen := runtimeOf(t, proc).Generation

	res := mustAppend(t, s,
		itx.EventInput{Type: itx.TypeSubscriptionConfigured, Payload: []byte(`{"name":"guestbook","receiver":{"action":"copy-to-stream","receivingStreamPath":"/procview/elsewhere"}}`)},
		itx.EventInput{Type: itx.TypeSubscriptionConfigured, Payload: []byte(`{"name":"guestbook","receiver":{"action":"processor-wake"}}`)})
	sub2, proc2 := processorOf(t, s, "guestbook")
	_, err = client.WaitUntilProcessed(ctx, sub2, res.HeadOffset, 0)
	require.NoError(t, err)
	waitUntil(t, "the old view ended, or went on to show the new processor caught up", func() bool {
		_, ended := old.endedWith()
		_, doc := old.state()
		return ended || doc["processedOffset"] == float64(res.HeadOffset)
	})
	why, ended := old.endedWith()
	require.True(t, ended, "the view of the replaced processor was not told it ended: it went on showing the new one (%s)", old.doc)
	require.Equal(t, schema.CloseReason_subscriptionRemoved, why)
	require.Greater(t, runtimeOf(t, proc2).Generation, gen+1, "the replaced processor's runner still runs the name")
}

// A single configure that changes a processor's kind ends the processor before it answers: its
// live view hears subscriptionRemoved, with the remove-and-configure of one commit as the other
// spelling of the same replace.
func TestProcessorView_KindChangedEndsTheView(t *testing.T) {
	for _, tc := range []struct {
		name   string
		events []itx.EventInput
	}{
		{"configure", []itx.EventInput{
			{Type: itx.TypeSubscriptionConfigured, Payload: []byte(`{"name":"guestbook","receiver":{"action":"copy-to-stream","receivingStreamPath":"/procview/elsewhere"}}`)}}},
		{"remove and configure", []itx.EventInput{
			{Type: itx.TypeSubscriptionRemoved, Payload: []byte(`{"name":"guestbook","reason":"requested"}`)},
			{Type: itx.TypeSubscriptionConfigured, Payload: []byte(`{"name":"guestbook","receiver":{"action":"copy-to-stream","receivingStreamPath":"/procview/elsewhere"}}`)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, server.Config{Processors: referenceHost(t, "guestbook")})
			ctx := ctxT(t)
			s := stream(t, ts.project(t), "/procview/kind")
			configureProcessor(t, s, "guestbook")
			head := signGuestbook(t, s, 2)
			sub, proc := processorOf(t, s, "guestbook")
			_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
			require.NoError(t, err)
			view := watchProcessor(t, proc)
			mustAppend(t, s, tc.events...)
			waitUntil(t, "the view ended", func() bool { _, ended := view.endedWith(); return ended })
			why, _ := view.endedWith()
			require.Equal(t, schema.CloseReason_subscriptionRemoved, why)
			_, err = client.Snapshot(ctx, proc)
			requireCode(t, err, itx.EFailedPrecondition)
		})
	}
}

// rewindSpy is a remote processor host that notes each wake's reprocessFrom and does what the
// SDK's runner does with it: the rewind's own commit (a new cursor revision, processed through
// reprocessFrom-1), then the catch-up to the head. The first wake with a rewind fails after its
// catch-up committed (a host that died before it answered, a report lost on the way).
type rewindSpy struct {
	quietHost
	mu        sync.Mutex
	reprocess []int64
	failed    bool
}

func (h *rewindSpy) Wake(ctx context.Context, call schema.ProcessorHost_wake) error {
	req, err := call.Args().Request()
	if err != nil {
		return err
	}
	from := int64(req.ReprocessFrom())
	h.mu.Lock()
	h.reprocess = append(h.reprocess, from)
	fail := from > 0 && !h.failed
	h.failed = h.failed || fail
	h.mu.Unlock()
	c, err := claimWake(ctx, req)
	if err != nil {
		return err
	}
	if from > 0 {
		c.progress.CursorRevision++
		if err := c.commit(ctx, from-1); err != nil {
			return err
		}
	}
	head := int64(req.HeadOffset())
	if err := c.commit(ctx, head); err != nil {
		return err
	}
	if fail {
		return itx.Errorf(itx.EUnavailable, "the host went away before it answered")
	}
	return reportThrough(call, head)
}

func (h *rewindSpy) rewinds() []int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []int64
	for _, from := range h.reprocess {
		if from > 0 {
			out = append(out, from)
		}
	}
	return out
}

// An operator's rewind of a remote processor is sent once per cursor-set: the host took it (its
// rewind commit honors the cursor-set) in a wake that then failed, and neither the retry nor a
// later wake asks for it again. Asked again, a host reprocesses from the cursor once more,
// running ProcessEvent a second time over every event the failed wake processed (the retry), or
// re-reducing the whole stream at every wake after it (each later wake asked from its cursor).
func TestRemote_RewindIsSentOncePerCursorSet(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	ts := startServer(t, server.Config{Clock: clock, Random: func() float64 { return 0.5 }})
	ctx := ctxT(t)
	p := ts.project(t)
	spy := &rewindSpy{}
	h, err := mountHostServing(ctx, p, "spy", spy, []itx.ProcessorInfo{{Name: "c", ReducerVersion: "1", ConsumedTypes: []string{"*"}}})
	require.NoError(t, err)
	defer h.Release()
	s := stream(t, p, "/remote/rewind-once")
	sub := client.Subscription(ctx, s, "c")
	defer sub.Release()
	processed := func(at int64) {
		t.Helper()
		_, err := client.WaitUntilProcessed(ctx, sub, at, 0)
		require.NoError(t, err)
	}
	configureInstance(t, s, "c", "", "remote")
	processed(mustAppend(t, s, ev("x", `{}`), ev("x", `{}`), ev("x", `{}`)).HeadOffset)

	_, err = client.SetSubscriptionCursor(ctx, s, "c", 1)
	require.NoError(t, err)
	waitUntil(t, "the wake that took the rewind failed", func() bool {
		d, err := client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		return d.LastError != ""
	})
	clock.Advance(time.Minute) // the retry comes due
	head := mustAppend(t, s, ev("x", `{}`)).HeadOffset
	processed(head)
	processed(mustAppend(t, s, ev("x", `{}`)).HeadOffset)
	require.Equal(t, []int64{2}, spy.rewinds(), "the rewind was asked again after the host took it")
}

// heldRewindSpy is a remote processor host whose wake with a rewind waits for before, then
// takes the rewind (its commit, processed through reprocessFrom-1), then waits for after
// (until the test ends) before catching up. Wakes without a rewind commit through the head.
type heldRewindSpy struct {
	entered     chan struct{} // closed when the wake with the rewind arrived
	finished    chan struct{} // closed when the wake with the rewind returned
	before      chan struct{}
	after       chan struct{}
	enteredOnce sync.Once
	beforeOnce  sync.Once
	mu          sync.Mutex
	processed   int64
}

func (h *heldRewindSpy) Wake(ctx context.Context, call schema.ProcessorHost_wake) error {
	req, err := call.Args().Request()
	if err != nil {
		return err
	}
	from := int64(req.ReprocessFrom())
	call.Go()
	c, err := claimWake(ctx, req)
	if err != nil {
		return err
	}
	commit := func(through int64) error {
		if err := c.commit(ctx, through); err != nil {
			return err
		}
		h.mu.Lock()
		h.processed = through
		h.mu.Unlock()
		return nil
	}
	if from > 0 {
		first := false
		h.enteredOnce.Do(func() { close(h.entered); first = true })
		if first {
			defer close(h.finished)
		}
		select {
		case <-h.before:
		case <-ctx.Done():
			return ctx.Err()
		}
		c.progress.CursorRevision++
		if err := commit(from - 1); err != nil {
			return err
		}
		select {
		case <-h.after:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	head := int64(req.HeadOffset())
	if err := commit(head); err != nil {
		return err
	}
	return reportThrough(call, head)
}

// release lets the held wake take the rewind (once).
func (h *heldRewindSpy) release() { h.beforeOnce.Do(func() { close(h.before) }) }

func (*heldRewindSpy) Stop(context.Context, schema.ProcessorHost_stop) error { return nil }

// GetRuntimeState answers what this host's runner has committed.
func (h *heldRewindSpy) GetRuntimeState(ctx context.Context, call schema.ProcessorHost_getRuntimeState) error {
	h.mu.Lock()
	processed := h.processed
	h.mu.Unlock()
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return res.SetState(fmt.Sprintf(`{"processedThrough":%d,"reducedThrough":%d}`, processed, processed))
}

// setSubscriptionCursor on a remote processor is read-your-writes for its processor too: a
// snapshot or getRuntimeState asked once it answered shows the rewind taken (processed and
// reduced through the cursor set), not the progress from before it, while the host has yet to
// take it: the answer waits for the host's rewind commit, which the wake lane sends at once.
func TestRemote_ProcessorViewAfterSetCursorShowsTheRewind(t *testing.T) {
	for _, verb := range []string{"snapshot", "getRuntimeState"} {
		t.Run(verb, func(t *testing.T) {
			ts := startServer(t, server.Config{})
			ctx := ctxT(t)
			p := ts.project(t)
			spy := &heldRewindSpy{entered: make(chan struct{}), finished: make(chan struct{}), before: make(chan struct{}), after: make(chan struct{})}
			h, err := mountHostServing(ctx, p, "spy", spy, []itx.ProcessorInfo{{Name: "c", ReducerVersion: "1", ConsumedTypes: []string{"*"}}})
			require.NoError(t, err)
			t.Cleanup(h.Release)
			t.Cleanup(func() {
				// First: the held wake ends (its commits answered) before its connection closes,
				// which would wait for the wake while the wake waits for the connection.
				spy.release()
				close(spy.after)
				<-spy.finished
			})
			s := stream(t, p, "/remote/rewind-read")
			configureInstance(t, s, "c", "", "remote")
			head := mustAppend(t, s, ev("x", `{}`), ev("x", `{}`), ev("x", `{}`)).HeadOffset
			sub, proc := processorOf(t, s, "c")
			_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
			require.NoError(t, err)

			first := head - 2
			_, err = client.SetSubscriptionCursor(ctx, s, "c", first)
			require.NoError(t, err)
			select {
			case <-spy.entered: // the lane's wake carries the rewind; the host holds it
			case <-ctx.Done():
				t.Fatal("no wake carried the rewind")
			}
			got := make(chan int64, 1)
			go func() {
				if verb == "snapshot" {
					snap, err := client.Snapshot(ctx, proc)
					if err != nil {
						t.Error(err)
					}
					got <- snap.ProcessedOffset
					return
				}
				rs, err := client.RuntimeState(ctx, proc)
				if err != nil {
					t.Error(err)
				}
				var r itx.ProcessorRuntimeState
				if err := json.Unmarshal([]byte(rs), &r); err != nil {
					t.Error(err)
				}
				got <- r.ProcessedThrough
			}()
			spy.release() // the host takes the rewind now; the read was asked before
			require.Equal(t, first, <-got, "%s after setSubscriptionCursor answered", verb)
		})
	}
}
