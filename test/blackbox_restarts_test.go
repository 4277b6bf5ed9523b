package test

// Black-box probes of what must hold across a kill -9 and a clean SIGTERM of a real itxd, checked
// over real RPC against the built binary restarted on the same data directory. Of the probes of
// the seeds', the issues' and README's restart statements, these are the ones no other test
// makes; the rest (the log, keys, cursors, halts, readers, retries, scheduled appends, tokens,
// deletions, quotas, backups, copies, dead letters, Follow, processors' progress, stream/woken)
// passed and repeat existing tests.

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
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/processors/remote"
	"github.com/itx-dev/itx/schema"
	"github.com/stretchr/testify/require"
)

// bbrSession is one logged-in RPC session to an itxd process.
type bbrSession struct {
	conn    *client.Conn
	project schema.Project
}

func bbrLogin(t *testing.T, ctx context.Context, addr, token string) *bbrSession {
	t.Helper()
	conn, err := client.Dial(ctx, addr)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return &bbrSession{conn: conn, project: conn.Login(ctx, token)}
}

func (s *bbrSession) stream(ctx context.Context, path string) schema.Stream {
	return client.Stream(ctx, s.project, path)
}

// bbrRestart ends p the way named ("kill9" or "sigterm") and starts itxd again on dataDir.
func bbrRestart(t *testing.T, p *itxdProcess, how, dataDir string, extra ...string) *itxdProcess {
	t.Helper()
	switch how {
	case "kill9":
		p.kill9(t)
	case "sigterm":
		require.NoError(t, p.stop(t), "a clean SIGTERM exits 0")
	default:
		t.Fatalf("unknown way to stop: %s", how)
	}
	return startItxd(t, dataDir, extra...)
}

var bbrWays = []string{"kill9", "sigterm"}

func bbrEvents(t *testing.T, ctx context.Context, s schema.Stream, q itx.Query) []itx.Event {
	t.Helper()
	evs, err := client.GetEvents(ctx, s, q)
	require.NoError(t, err)
	return evs
}

func bbrCount(evs []itx.Event, typ string) int {
	n := 0
	for _, e := range evs {
		if e.Type == typ {
			n++
		}
	}
	return n
}

func bbrSummary(t *testing.T, ctx context.Context, s schema.Stream, name string) itx.SubscriptionSummary {
	t.Helper()
	rows, err := client.ListSubscriptions(ctx, client.Subscriptions(ctx, s))
	require.NoError(t, err)
	for _, r := range rows {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no subscription %q in %+v", name, rows)
	return itx.SubscriptionSummary{}
}

// After a restart, the stream's live state (its first snapshot) shows what was left: a halted
// subscription with its last error, a parked one, a rewound cursor, a registered reader; and the
// listing of the stream, read before anything loads it, counts them as the stream does.
func TestBBRestart_LiveStateAfterRestart(t *testing.T) {
	for _, how := range bbrWays {
		t.Run(how, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			dir := t.TempDir()
			p := startItxd(t, dir)
			s1 := bbrLogin(t, ctx, p.addr, p.creds.ProjectToken)
			st := s1.stream(ctx, "/live")
			subs := client.Subscriptions(ctx, st)
			_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "nosuch", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}})
			require.NoError(t, err)
			_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "seek", Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "never-mounted"}})
			require.NoError(t, err)
			var halted itx.SubscriptionSummary
			require.Eventually(t, func() bool { // an unknown processor halts at once
				halted = bbrSummary(t, ctx, st, "nosuch")
				return halted.Status == itx.StatusHalted
			}, 5*time.Second, 10*time.Millisecond)
			require.Contains(t, halted.LastError, "no processor is registered")
			res, err := client.Append(ctx, st, []itx.EventInput{{Type: "x"}, {Type: "x"}, {Type: "x"}}, itx.AppendOptions{})
			require.NoError(t, err)
			require.Eventually(t, func() bool { return bbrSummary(t, ctx, st, "seek").Status == itx.StatusParked }, 5*time.Second, 10*time.Millisecond)
			_, err = client.SetSubscriptionCursor(ctx, st, "seek", 2)
			require.NoError(t, err)
			require.NoError(t, client.RegisterReader(ctx, client.Readers(ctx, st), "mirror", 3))
			head := res.HeadOffset + 1 // the cursor-set

			p = bbrRestart(t, p, how, dir)
			s2 := bbrLogin(t, ctx, p.addr, p.creds.ProjectToken)
			list, err := client.ListStreams(ctx, s2.project, "/live")
			require.NoError(t, err)
			require.Len(t, list, 1)
			require.Equal(t, head, list[0].HeadOffset)
			require.Equal(t, 2, list[0].SubscriptionCount)
			require.Equal(t, 1, list[0].HaltedSubscriptions)
			require.Equal(t, 1, list[0].ParkedSubscriptions)
			require.Equal(t, 1, list[0].Readers)
			require.Equal(t, head, list[0].MaxLag, "nosuch halted before anything")

			view, err := client.WatchStream(ctx, s2.stream(ctx, "/live"))
			require.NoError(t, err)
			live, err := view.StreamState(ctx, func(itx.LiveStreamState) bool { return true })
			require.NoError(t, err)
			require.Equal(t, head, live.Head)
			require.Equal(t, itx.StatusHalted, live.Subscriptions["nosuch"].Status)
			require.Equal(t, halted.LastError, live.Subscriptions["nosuch"].LastError)
			require.Equal(t, itx.StatusParked, live.Subscriptions["seek"].Status)
			require.Equal(t, int64(2), live.Subscriptions["seek"].Confirmed)
			require.Equal(t, head-2, live.Subscriptions["seek"].Lag)
			require.Equal(t, int64(3), live.Readers["mirror"].Checkpoint)
			require.Equal(t, head-3, live.Readers["mirror"].Lag)
			require.NoError(t, view.Cancel(ctx))
		})
	}
}

// A delivery in flight when SIGTERM stops itxd (cut short by the shutdown) is made again by the
// restarted itxd on its own: no append, no call loads the stream. (kill -9 mid-delivery:
// TestCrash_Kill9MidDelivery.)
func TestBBRestart_InFlightDeliveryResumes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var hang atomic.Bool
	hang.Store(true)
	arrived := make(chan int64, 64)
	release := make(chan struct{})
	var seenMu sync.Mutex
	var seen []string // every request, for the failure message
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body itx.WebhookBody
		err := json.NewDecoder(r.Body).Decode(&body)
		// Read before the arrival is reported: the test clears hang as soon as it hears of the
		// first request, and reading it after would let that very request be acknowledged
		// (confirmed before the stop, so nothing was left to resume).
		h := hang.Load()
		seenMu.Lock()
		seen = append(seen, fmt.Sprintf("%s offset %d id %s hang %v decode %v", time.Now().Format("15:04:05.000"), body.Event.Offset, r.Header.Get("webhook-id"), h, err))
		seenMu.Unlock()
		arrived <- body.Event.Offset
		if h {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	defer close(release)
	dir := t.TempDir()
	p := startItxd(t, dir)
	s1 := bbrLogin(t, ctx, p.addr, p.creds.ProjectToken)
	st := s1.stream(ctx, "/inflight")
	_, _, err := client.ConfigureSubscription(ctx, client.Subscriptions(ctx, st), client.SubscriptionConfig{Name: "hook", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: srv.URL}})
	require.NoError(t, err)
	res, err := client.Append(ctx, st, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
	require.NoError(t, err)
	select {
	case o := <-arrived:
		require.Equal(t, res.Offsets[0], o)
	case <-ctx.Done():
		t.Fatal("no delivery")
	}
	hang.Store(false)
	require.NoError(t, p.stop(t))
	p = startItxd(t, dir)
	for {
		select {
		case o := <-arrived:
			if o == res.Offsets[0] {
				return
			}
		case <-time.After(8 * time.Second):
			s := bbrLogin(t, ctx, p.addr, p.creds.ProjectToken)
			d, err := client.DescribeSubscription(ctx, client.Subscription(ctx, s.stream(ctx, "/inflight"), "hook"))
			seenMu.Lock()
			defer seenMu.Unlock()
			t.Fatalf("the event in flight at the stop was never delivered after the restart (now %d): %+v %v; the receiver saw:\n%s", time.Now().UnixMilli(), d.CursorState, err, strings.Join(seen, "\n"))
		}
	}
}

// A remote processor parked with no host stays parked through a restart (its stream unloaded)
// and resumes when a host mounts its contract after it; a host connected through the next restart
// reconnects and goes on; every message is forwarded once.
func TestBBRestart_RemoteProcessor(t *testing.T) {
	for _, how := range bbrWays {
		t.Run(how, func(t *testing.T) { bbrRemoteProcessor(t, how) })
	}
}
func bbrRemoteProcessor(t *testing.T, how string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := t.TempDir()
	p := startItxd(t, dir)
	addr := p.addr
	s1 := bbrLogin(t, ctx, addr, p.creds.ProjectToken)
	st := s1.stream(ctx, "/remote")
	_, _, err := client.ConfigureSubscription(ctx, client.Subscriptions(ctx, st), client.SubscriptionConfig{Name: "forwarder",
		Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Placement: "remote"}})
	require.NoError(t, err)
	_, err = client.Append(ctx, st, []itx.EventInput{{Type: "inbox/message", Payload: json.RawMessage(`{"n":1}`)}, {Type: "inbox/message", Payload: json.RawMessage(`{"n":2}`)}}, itx.AppendOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return bbrSummary(t, ctx, st, "forwarder").Status == itx.StatusParked }, 5*time.Second, 10*time.Millisecond)

	p = bbrRestart(t, p, how, dir, "--listen", addr)
	host := processors.NewHost("bb-1")
	require.NoError(t, examples.AddTo(host, []string{"forwarder"}, examples.HostOptions{}))
	hctx, hcancel := context.WithCancel(ctx)
	hostDone := make(chan error, 1)
	go func() {
		hostDone <- remote.Run(hctx, remote.Config{Addr: addr, Token: p.creds.ProjectToken, Name: "bb-host", Host: host,
			MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	}()
	defer func() { hcancel(); <-hostDone }()
	// The mount alone brings the stream back: nothing else loads it (a listing does not).
	s2 := bbrLogin(t, ctx, addr, p.creds.ProjectToken)
	require.Eventually(t, func() bool {
		l, err := client.ListStreams(ctx, s2.project, "/remote")
		require.NoError(t, err)
		return len(l) == 1 && l[0].ParkedSubscriptions == 0 && l[0].MaxLag == 0
	}, 8*time.Second, 20*time.Millisecond, "the host's mount resumes the parked processor")
	waitForwarded := func(n int) {
		t.Helper()
		s := bbrLogin(t, ctx, addr, p.creds.ProjectToken)
		st := s.stream(ctx, "/remote")
		head, err := client.Describe(ctx, st)
		require.NoError(t, err)
		_, err = client.WaitUntilProcessed(ctx, client.Subscription(ctx, st, "forwarder"), head.HeadOffset, 8*time.Second)
		require.NoError(t, err)
		require.Equal(t, n, bbrCount(bbrEvents(t, ctx, st, itx.Query{Limit: 500}), "outbox/forwarded"))
	}
	waitForwarded(2)

	p = bbrRestart(t, p, how, dir, "--listen", addr)
	s3 := bbrLogin(t, ctx, addr, p.creds.ProjectToken)
	_, err = client.Append(ctx, s3.stream(ctx, "/remote"), []itx.EventInput{{Type: "inbox/message", Payload: json.RawMessage(`{"n":3}`)}}, itx.AppendOptions{})
	require.NoError(t, err)
	waitForwarded(3)
}

// SIGTERM in the middle of an obligation (the vendor call in flight) is an eviction like a kill
// -9: after the restart the obligation is settled exactly once, as orphaned.
func TestBBRestart_SigtermMidObligation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	called := make(chan struct{}, 16)
	quit := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		called <- struct{}{}
		select { // never answers: the call ends with its caller (or the test)
		case <-r.Context().Done():
		case <-quit:
		}
	}))
	defer srv.Close()
	defer close(quit)
	dir := t.TempDir()
	args := []string{"--processors", "agent", "--agent-vendor-url", srv.URL, "--agent-hesitation", "0s"}
	p := startItxd(t, dir, args...)
	s1 := bbrLogin(t, ctx, p.addr, p.creds.ProjectToken)
	st := s1.stream(ctx, "/agent")
	_, _, err := client.ConfigureSubscription(ctx, client.Subscriptions(ctx, st), client.SubscriptionConfig{Name: "agent",
		Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}})
	require.NoError(t, err)
	_, err = client.Append(ctx, st, []itx.EventInput{{Type: string(examples.MessageAdded), Payload: json.RawMessage(`{"text":"hello"}`)}}, itx.AppendOptions{})
	require.NoError(t, err)
	select {
	case <-called:
	case <-ctx.Done():
		t.Fatal("the agent never dialed the vendor")
	}
	require.NoError(t, p.stop(t))
	p = startItxd(t, dir, args...)
	s2 := bbrLogin(t, ctx, p.addr, p.creds.ProjectToken)
	st = s2.stream(ctx, "/agent")
	settled, err := client.WaitForEvent(ctx, st, itx.Predicate{Types: []string{string(examples.LLMSettled)}}, 0, 9*time.Second)
	require.NoError(t, err, "the obligation is settled after the restart")
	var settlement examples.LLMSettlement
	require.NoError(t, json.Unmarshal(settled.Payload, &settlement))
	require.Equal(t, examples.ResultFailure, settlement.Result.Kind)
	require.Equal(t, examples.ReasonOrphaned, settlement.Result.Reason, "the attempt died with its incarnation")
	res, err := client.Append(ctx, st, []itx.EventInput{{Type: "agent/marker"}}, itx.AppendOptions{})
	require.NoError(t, err)
	_, err = client.WaitUntilProcessed(ctx, client.Subscription(ctx, st, "agent"), res.HeadOffset, 8*time.Second)
	require.NoError(t, err)
	evs := bbrEvents(t, ctx, st, itx.Query{Limit: 500})
	require.Equal(t, 1, bbrCount(evs, string(examples.LLMSettled)), "settled once")
	require.Equal(t, 1, bbrCount(evs, string(examples.LLMStarted)))
}

// A stream trimmed through its head keeps its head across a restart, though the last row left
// (an ephemeral one) stands below it: no offset is reissued, and its listing says so.
func TestBBRestart_TrimmedToTheHeadKeepsTheHead(t *testing.T) {
	for _, how := range bbrWays {
		t.Run(how, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			dir := t.TempDir()
			p := startItxd(t, dir)
			s1 := bbrLogin(t, ctx, p.addr, p.creds.ProjectToken)
			st := s1.stream(ctx, "/empty")
			res, err := client.Append(ctx, st, []itx.EventInput{{Type: "a"}, {Type: "b", Ephemeral: true}, {Type: "c"}}, itx.AppendOptions{})
			require.NoError(t, err)
			tr, err := client.Trim(ctx, st, res.HeadOffset)
			require.NoError(t, err)
			require.Equal(t, res.HeadOffset, tr.TrimmedThrough)
			p = bbrRestart(t, p, how, dir)
			s2 := bbrLogin(t, ctx, p.addr, p.creds.ProjectToken)
			st = s2.stream(ctx, "/empty")
			list, err := client.ListStreams(ctx, s2.project, "/empty")
			require.NoError(t, err)
			require.Len(t, list, 1)
			require.Equal(t, res.HeadOffset, list[0].HeadOffset, "listed head")
			info, err := client.Describe(ctx, st)
			require.NoError(t, err)
			require.Equal(t, res.HeadOffset, info.HeadOffset)
			require.Equal(t, res.HeadOffset, info.TrimmedThrough)
			next, err := client.Append(ctx, st, []itx.EventInput{{Type: "d"}}, itx.AppendOptions{})
			require.NoError(t, err)
			require.Equal(t, []int64{res.HeadOffset + 1}, next.Offsets, "no offset is reissued")
		})
	}
}
