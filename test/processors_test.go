package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// referenceHost hosts the named reference processors in-process.
func referenceHost(t testing.TB, names ...string) *processors.Host {
	t.Helper()
	h := processors.NewHost("test")
	require.NoError(t, examples.AddTo(h, names, examples.HostOptions{}))
	return h
}

func configureProcessor(t testing.TB, s schema.Stream, name string) {
	t.Helper()
	ctx := ctxT(t)
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{
		Name: name, Receiver: client.Receiver{Kind: client.ReceiverProcessorWake},
	})
	require.NoError(t, err)
}

func processorOf(t testing.TB, s schema.Stream, name string) (schema.Subscription, schema.Processor) {
	t.Helper()
	ctx := ctxT(t)
	sub := client.Subscription(ctx, s, name)
	t.Cleanup(sub.Release)
	// client.Processor keeps the answer until p is released: released at once, a call on p
	// that set out before the answer arrived could find its results freed.
	p := client.Processor(ctx, sub)
	t.Cleanup(p.Release)
	return sub, p
}

// guestbookFold is the guestbook contract's Reduce folded over the stream's events, read back
// over RPC, as JSON: what a guestbook processor's snapshot must equal.
func guestbookFold(t testing.TB, s schema.Stream) string {
	t.Helper()
	events, err := client.ReadAll(ctxT(t), s, itx.Query{})
	require.NoError(t, err)
	c := examples.Guestbook()
	want := c.InitialState()
	for _, e := range events {
		if e.Type == string(examples.GuestbookSigned) {
			want = c.Reduce(want, e)
		}
	}
	b, err := json.Marshal(want)
	require.NoError(t, err)
	return string(b)
}

func countType(t testing.TB, s schema.Stream, typ string) int {
	t.Helper()
	events, err := client.ReadAll(ctxT(t), s, itx.Query{Types: []string{typ}})
	require.NoError(t, err)
	return len(events)
}

// A guestbook hosted in itxd, woken over real TCP: waitUntilProcessed is the runner's barrier, and
// the snapshot is exactly Reduce folded over the stream's consumed events; the subscription's
// cursor row mirrors the processing cursor, so list and describe show it like any other kind.
func TestProcessors_InProcessGuestbook(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "guestbook")})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/processors/guestbook")
	configureProcessor(t, s, "guestbook")
	var head int64
	for i := range 30 {
		res := mustAppend(t, s,
			examples.GuestbookSigned.Input(examples.Signed{Name: fmt.Sprintf("guest-%d", i), Message: "hello"}, ""),
			ev("unrelated/noise", `{}`))
		head = res.HeadOffset
	}
	sub, proc := processorOf(t, s, "guestbook")
	processed, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	require.GreaterOrEqual(t, processed, head)

	snap, err := client.Snapshot(ctx, proc)
	require.NoError(t, err)
	require.Equal(t, head, snap.ProcessedOffset)
	require.Equal(t, head, snap.ReducedOffset)

	require.JSONEq(t, guestbookFold(t, s), snap.State)

	d, err := client.DescribeSubscription(ctx, sub)
	require.NoError(t, err)
	require.Equal(t, head, d.ConfirmedOffset, "the cursor row mirrors the processing cursor")
	require.Equal(t, itx.StatusActive, d.Status)

	rs, err := client.RuntimeState(ctx, proc)
	require.NoError(t, err)
	var runtime struct {
		Name             string `json:"name"`
		ProcessedThrough int64  `json:"processedThrough"`
		Generation       int64  `json:"generation"`
		Placement        string `json:"placement"`
	}
	require.NoError(t, json.Unmarshal([]byte(rs), &runtime))
	require.Equal(t, "guestbook", runtime.Name)
	require.Equal(t, head, runtime.ProcessedThrough)
	require.Equal(t, int64(1), runtime.Generation)
	require.Equal(t, "in-process", runtime.Placement)
}

// A processor-wake subscription naming no registered contract halts at its first wake with the
// registry's exact error, and its processor says the same.
func TestProcessors_UnknownNameHalts(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "guestbook")})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/processors/unknown")
	mustAppend(t, s, ev("a", `{}`))
	configureProcessor(t, s, "no-such-contract")
	sub, proc := processorOf(t, s, "no-such-contract")
	var d itx.SubscriptionDescription
	waitUntil(t, "halted", func() bool {
		var err error
		d, err = client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		return d.Status == itx.StatusHalted
	})
	require.Equal(t, `itx.notFound: no processor is registered under the name "no-such-contract"`, d.LastError)
	_, err := client.Snapshot(ctx, proc)
	requireCode(t, err, itx.ENotFound)
}

// The forwarder's forwards are keyed by the source event: a rewind through the subscription's
// cursor-set reprocesses from the start (the runner's reprocessFrom) and the stream dedupes every
// forward; a restart records stream/woken once and resumes from the committed cursor, with
// nothing forwarded twice.
func TestProcessors_ForwarderRewindAndRestart(t *testing.T) {
	dir := t.TempDir()
	host := referenceHost(t, "forwarder")
	ts := startServer(t, server.Config{DataDir: dir, Processors: host})
	ctx := ctxT(t)
	const path = "/processors/forwarder"
	s := stream(t, ts.project(t), path)
	configureProcessor(t, s, "forwarder")
	var head int64
	for i := range 5 {
		head = mustAppend(t, s, examples.InboxMessage.Input(json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)), "")).HeadOffset
	}
	sub, proc := processorOf(t, s, "forwarder")
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	require.Equal(t, 5, countType(t, s, string(examples.OutboxForwarded)))

	// Rewind: reprocess everything from offset 1.
	at, err := client.SetSubscriptionCursor(ctx, s, "forwarder", 0)
	require.NoError(t, err)
	waitRewound(t, ctx, proc, at)
	require.Equal(t, 5, countType(t, s, string(examples.OutboxForwarded)), "replayed forwards dedupe on their keys")
	snap, err := client.Snapshot(ctx, proc)
	require.NoError(t, err)
	require.JSONEq(t, `{"forwarded":5}`, snap.State)

	// Restart on the same data directory.
	closeCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, ts.srv.Close(closeCtx))
	ts = startServer(t, server.Config{DataDir: dir, Processors: host})
	s = stream(t, ts.project(t), path)
	head = mustAppend(t, s, examples.InboxMessage.Input(json.RawMessage(`{"n":5}`), "")).HeadOffset
	sub, proc = processorOf(t, s, "forwarder")
	_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	require.Equal(t, 6, countType(t, s, string(examples.OutboxForwarded)))
	require.Equal(t, 1, countType(t, s, itx.TypeWoken), "one stream/woken for the one restart")
	snap, err = client.Snapshot(ctx, proc)
	require.NoError(t, err)
	require.JSONEq(t, `{"forwarded":6}`, snap.State)
	rs, err := client.RuntimeState(ctx, proc)
	require.NoError(t, err)
	var r itx.ProcessorRuntimeState
	require.NoError(t, json.Unmarshal([]byte(rs), &r))
	require.Equal(t, int64(2), r.Generation, "the new incarnation claimed the record")
}

// blockingVendor is an LLM endpoint that records each call and answers only when released.
type blockingVendor struct {
	calls   atomic.Int64
	called  chan string
	release chan struct{}
	once    sync.Once
}

func newBlockingVendor(t *testing.T) (*blockingVendor, string) {
	v := &blockingVendor{called: make(chan string, 16), release: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			RequestID string `json:"requestId"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		v.calls.Add(1)
		v.called <- req.RequestID
		select {
		case <-v.release:
			_ = json.NewEncoder(w).Encode(map[string]string{"text": "late answer"})
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { v.once.Do(func() { close(v.release) }); srv.Close() })
	return v, srv.URL
}

// kill -9 in the middle of an obligation: the agent has marked its LLM request started and the
// vendor call is in flight. After the restart the new incarnation finds the started request that
// nobody drives and settles it, once: the stream shows exactly one settlement, and the vendor was
// dialed once.
func TestProcessors_Kill9MidObligationSettlesOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	vendor, url := newBlockingVendor(t)
	dataDir := t.TempDir()
	args := []string{"--processors", "agent", "--agent-vendor-url", url, "--agent-hesitation", "0s"}
	proc := startItxd(t, dataDir, args...)
	ctx := ctxT(t)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	const path = "/processors/agent"
	s := client.Stream(ctx, p, path)
	configureProcessor(t, s, "agent")
	mustAppend(t, s, examples.MessageAdded.Input(examples.Message{Text: "hello"}, ""))
	select {
	case id := <-vendor.called:
		require.True(t, strings.HasPrefix(id, "msg-"), id)
	case <-ctx.Done():
		t.Fatal("the agent never dialed the vendor")
	}
	require.Equal(t, 1, countType(t, s, string(examples.LLMStarted)))
	proc.kill9(t)

	proc = startItxd(t, dataDir, args...)
	p = dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	s = client.Stream(ctx, p, path)
	fut, release := s.WaitForEvent(ctx, func(w schema.Stream_waitForEvent_Params) error {
		pred, err := w.NewPredicate()
		if err != nil {
			return err
		}
		types, err := pred.NewTypes(1)
		if err != nil {
			return err
		}
		return types.Set(0, string(examples.LLMSettled))
	})
	defer release()
	res, err := fut.Struct()
	require.NoError(t, err, "the revived agent settles the orphaned obligation")
	settledEv, err := res.Event()
	require.NoError(t, err)
	payload, err := settledEv.Payload()
	require.NoError(t, err)
	var settled examples.LLMSettlement
	require.NoError(t, json.Unmarshal([]byte(payload), &settled))
	require.Equal(t, examples.ResultFailure, settled.Result.Kind)
	require.Equal(t, examples.ReasonOrphaned, settled.Result.Reason)

	// Everything after it processed: still one settlement, one vendor call.
	head := mustAppend(t, s, ev("agent/marker", `{}`)).HeadOffset
	sub := client.Subscription(ctx, s, "agent")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	require.Equal(t, 1, countType(t, s, string(examples.LLMSettled)))
	require.Equal(t, int64(1), vendor.calls.Load())
	require.Equal(t, 1, countType(t, s, itx.TypeWoken))
}

// chanVendor is an in-process LLM fake: each call is announced, then blocks until its context
// ends (an eviction cancels it).
type chanVendor struct {
	calls  atomic.Int64
	called chan string
}

func (v *chanVendor) Complete(ctx context.Context, requestID, prompt string) (string, error) {
	v.calls.Add(1)
	v.called <- requestID
	<-ctx.Done()
	return "", ctx.Err()
}

// An eviction mid-obligation (the idle sweep unloads the stream while the vendor call is in
// flight) is revived by the processors' alarm alone: the keepalive armed it about 10 s ahead of
// the work, the unload recorded it as the stream's alarm, and its fire loads the stream, appends
// one stream/processor-revived, and the revived agent settles the orphaned request once.
func TestProcessors_EvictionRevivedByAlarm(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	vendor := &chanVendor{called: make(chan string, 4)}
	agentCfg := examples.DefaultAgentConfig
	agentCfg.HesitationMs = 0
	host := processors.NewHost("test")
	require.NoError(t, examples.AddTo(host, []string{"agent"}, examples.HostOptions{Clock: clock, Vendor: vendor, Agent: agentCfg}))
	dir := t.TempDir()
	cfg := server.Config{DataDir: dir, Clock: clock, Processors: host, IdleTimeout: time.Second}
	ts := startServer(t, cfg)
	ctx := ctxT(t)
	configureProcessor(t, stream(t, ts.project(t), "/processors/evicted"), "agent")
	// A restart: this process records its stream/woken on the first load, so the reload after
	// the eviction below is woken by nothing but the alarm.
	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, ts.srv.Close(closeCtx))
	ts = startServer(t, cfg)
	p := ts.project(t)
	s := stream(t, p, "/processors/evicted")
	mustAppend(t, s, examples.MessageAdded.Input(examples.Message{Text: "hello"}, ""))
	select {
	case <-vendor.called:
	case <-ctx.Done():
		t.Fatal("the agent never dialed the vendor")
	}
	// Everything appended so far (the request, its started mark) is processed: on a reload
	// nothing is left to deliver, so only the alarm can bring the agent back.
	head := mustAppend(t, s, ev("agent/marker", `{}`)).HeadOffset
	sub := client.Subscription(ctx, s, "agent")
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	sub.Release()
	s.Release()
	waitUntil(t, "unloaded", func() bool {
		clock.Advance(1500 * time.Millisecond)
		ts.srv.Sweep()
		return ts.srv.LoadedStreams() == 0
	})

	clock.Advance(15 * time.Second) // past the keepalive's alarm: only it can wake the stream
	s = stream(t, p, "/processors/evicted")
	waitUntil(t, "settled", func() bool { return countType(t, s, string(examples.LLMSettled)) == 1 })
	require.Equal(t, 1, countType(t, s, itx.TypeProcessorRevived))
	require.Equal(t, 1, countType(t, s, itx.TypeWoken), "one per process")
	events, err := client.ReadAll(ctx, s, itx.Query{Types: []string{string(examples.LLMSettled)}})
	require.NoError(t, err)
	var settled examples.LLMSettlement
	require.NoError(t, json.Unmarshal(events[0].Payload, &settled))
	require.Equal(t, examples.ReasonOrphaned, settled.Result.Reason)
	require.Equal(t, int64(1), vendor.calls.Load())
}

// waitRewound waits until a processor has taken its first rewind and processed through at.
func waitRewound(t *testing.T, ctx context.Context, proc schema.Processor, at int64) {
	t.Helper()
	waitUntil(t, "the rewind is reprocessed", func() bool {
		rs, err := client.RuntimeState(ctx, proc)
		require.NoError(t, err)
		var r itx.ProcessorRuntimeState
		require.NoError(t, json.Unmarshal([]byte(rs), &r))
		return r.CursorRevision == 1 && r.ProcessedThrough >= at
	})
}

// A revival (stream/processor-revived naming a processor, what its keepalive appends) is an
// attempt of the keepalive's: it clears a halt of the processor's wake subscription and delivers
// to it at once, so the crash-loop breaker, not the retry ladder, owns the long backoff, and a
// fix deployed after a halt is still reached. Other subscriptions of the name are not touched.
func TestProcessors_RevivalResumesAHaltedWake(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "guestbook")})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/processors/revive")
	configureProcessor(t, s, "ghost") // no such contract: its first wake halts it
	sub := client.Subscription(ctx, s, "ghost")
	defer sub.Release()
	describe := func() itx.SubscriptionDescription {
		d, err := client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		return d
	}
	waitUntil(t, "halted", func() bool { return describe().Status == itx.StatusHalted })
	halts := countType(t, s, itx.TypeSubscriptionHalted)
	require.Equal(t, 1, halts)

	mustAppend(t, s, itx.EventInput{Type: itx.TypeProcessorRevived, Payload: []byte(`{"processorSlug":"ghost","revivals":1}`)})
	waitUntil(t, "tried again at once, and halted again", func() bool {
		return countType(t, s, itx.TypeSubscriptionHalted) == halts+1
	})
	require.Equal(t, itx.StatusHalted, describe().Status)
}

// A processor author's Go reaches a subscription's processor and the project's remote hosts
// through the client's helpers, pipelined, as it reaches a stream or a subscription: the
// snapshot is the guestbook's committed state, a webhook subscription has no processor, and
// ProcessorHosts lists a mounted host with its contract.
func TestClient_ProcessorAndProcessorHosts(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "guestbook")})
	ctx := ctxT(t)
	p := ts.project(t)
	s := stream(t, p, "/client/helpers")
	configureProcessor(t, s, "guestbook")
	head := mustAppend(t, s, examples.GuestbookSigned.Input(examples.Signed{Name: "ada", Message: "hi"}, "")).HeadOffset
	sub := client.Subscription(ctx, s, "guestbook")
	defer sub.Release()
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	proc := client.Processor(ctx, sub)
	defer proc.Release()
	snap, err := client.Snapshot(ctx, proc)
	require.NoError(t, err)
	require.Equal(t, head, snap.ProcessedOffset)
	require.JSONEq(t, guestbookFold(t, s), snap.State)

	hook := client.Subscription(ctx, s, "hook")
	defer hook.Release()
	_, _, err = client.ConfigureSubscription(ctx, client.Subscriptions(ctx, s), client.SubscriptionConfig{Name: "hook",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: "http://127.0.0.1:1/"}})
	require.NoError(t, err)
	none := client.Processor(ctx, hook)
	defer none.Release()
	_, err = client.Snapshot(ctx, none)
	require.Error(t, err, "a webhook subscription has no processor")

	awaitMount(t, runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "worker-1", referenceHost(t, "forwarder")))
	hosts := client.ProcessorHosts(ctx, p)
	defer hosts.Release()
	list, err := client.ListProcessorHosts(ctx, hosts)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "worker-1", list[0].Name)
	require.Len(t, list[0].Contracts, 1)
	require.Equal(t, "forwarder", list[0].Contracts[0].Name)
}
