package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/schema"
	"github.com/stretchr/testify/require"
)

// The bounds the noisy-neighbour test runs itxd with: small enough to reach in seconds. Each
// global one leaves the other projects a quarter (the per-project share's default).
var neighbourFlags = []string{
	"--webhook-max-in-flight", "8", // share 6
	"--max-held-streams", "16", "--max-loaded-streams", "8", // share 12
	"--max-live", "32", // share 24
	"--max-mounts-per-project", "16",
	"--max-readers-per-stream", "64",
	"--max-scheduled-per-stream", "200",
}

// One itxd serves two projects. Project A does, one after another and keeping what it took,
// the most its bounds allow: webhooks that hang until their timeout, streams cycled through
// the loaded-streams bound, streams held in use, live connections and views from several
// logins, mounts, readers, scheduled appends in bulk, a crash-looping remote processor and a
// flood of appends from several connections. After each, project B's ordinary work must go
// through: an append, its webhook delivery, its live connection, its mounted receiver
// (itx-call), its remote processor, a new stream and a new connection. Global bounds with no
// per-project share let A deny B some of these: A's hanging requests held every webhook slot
// (B's delivery waited out A's 20 s timeouts), and A's connections held every stream (B could
// load no stream) and every live slot (B could open no connection). The operator sees who: the
// refusals and waits are counted per project on /metrics and logged once, naming A's project
// and the flag. B's latencies are logged.
func TestItxd_NoisyNeighbour(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	metrics := freeAddr(t)
	p := startItxd(t, t.TempDir(), append([]string{"--metrics", metrics, "--log-format", "json"}, neighbourFlags...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	aToken, aID := p.creds.ProjectToken, p.creds.ProjectID
	adm := client.Admin(ctx, dial(t, p.addr).Login(ctx, p.creds.DeploymentToken))
	defer adm.Release()
	bInfo, bToken, _, err := client.CreateProject(ctx, adm, "neighbour")
	require.NoError(t, err)
	a := dial(t, p.addr).Login(ctx, aToken)
	defer a.Release()

	b := newTenantB(t, ctx, p.addr, bToken)
	b.check(t, "alone")

	// Webhooks that hang until the delivery timeout: A holds its share (6) of the 8 requests,
	// however many subscriptions want one; B's delivery takes one of the other two while every
	// one of A's still hangs.
	hang := newHangingReceiver(t)
	for i := range 2 {
		s := stream(t, a, fmt.Sprintf("/a/hook-%d", i))
		subs := client.Subscriptions(ctx, s)
		for j := range 8 {
			_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: fmt.Sprintf("h%d", j), Start: "now",
				Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: hang.srv.URL}})
			require.NoError(t, err)
		}
		subs.Release()
		mustAppend(t, s, ev("a/hook", `{}`))
	}
	hang.waitOpen(t, ctx, 6)
	b.check(t, "A's webhooks hang")
	require.Zero(t, hang.returned.Load(), "B's work went through only once one of A's hanging requests ended (itxd's 20 s delivery timeout)")
	require.Equal(t, int64(6), hang.most.Load(), "A's requests open at once: its share of --webhook-max-in-flight 8")

	// Streams cycled through --max-loaded-streams 8: A's appends to 24 streams unload the
	// idle streams of both projects; B's next calls load theirs again.
	for i := range 24 {
		mustAppend(t, stream(t, a, fmt.Sprintf("/a/cycle-%d", i)), ev("a/cycle", `{}`))
	}
	b.check(t, "A cycled 24 streams through 8 loaded")

	// Streams held in use: A's connections on stream after stream are refused at its share
	// (12 of 16, the two streams its hanging deliveries hold among them), naming the flag.
	var held int
	for i := 0; ; i++ {
		require.Less(t, i, 16, "A held every stream itxd may load")
		c, err := client.OpenConnection(ctx, stream(t, a, fmt.Sprintf("/a/held-%d", i)), client.ConnectionOptions{},
			client.ConnectionHandler{Deliver: func(context.Context, itx.DeliveryBatch) error { return nil }})
		if err != nil {
			requireCode(t, err, itx.ELimitExceeded)
			require.Contains(t, err.Error(), "--max-held-streams-per-project")
			break
		}
		t.Cleanup(c.Release)
		held++
	}
	t.Logf("A holds %d streams by connections, 2 by deliveries", held)
	b.check(t, "A holds its share of the streams")

	// Live connections and views from several logins, on a stream A holds: refused at its share
	// (24 of 32), naming the flag.
	var live int
	for i := 0; ; i++ {
		require.Less(t, i, 32, "A held every live slot")
		s := stream(t, dial(t, p.addr).Login(ctx, aToken), "/a/held-0")
		var err error
		if i%2 == 0 {
			var lv *client.LiveView
			if lv, err = client.WatchStream(ctx, s); err == nil {
				t.Cleanup(func() { lv.Cancel(context.Background()) })
			}
		} else {
			var c *client.Connection
			if c, err = client.OpenConnection(ctx, s, client.ConnectionOptions{},
				client.ConnectionHandler{Deliver: func(context.Context, itx.DeliveryBatch) error { return nil }}); err == nil {
				t.Cleanup(c.Release)
			}
		}
		if err != nil {
			requireCode(t, err, itx.ELimitExceeded)
			require.Contains(t, err.Error(), "--max-live-per-project")
			break
		}
		live++
	}
	t.Logf("A holds %d live connections and views, %d more with its held streams", live, held)
	b.check(t, "A holds its share of live connections and views")

	// Mounts, readers and scheduled appends at their per-project and per-stream bounds.
	for i := 0; ; i++ {
		require.Less(t, i, 17)
		h, err := client.MountReceiver(ctx, a, fmt.Sprintf("m%d", i), client.ServeReceiver(func(context.Context, itx.DeliveryBatch) (int64, error) {
			return 0, nil
		}))
		if err != nil {
			requireCode(t, err, itx.ELimitExceeded)
			break
		}
		t.Cleanup(h.Release)
	}
	held0 := stream(t, a, "/a/held-0")
	rs := client.Readers(ctx, held0)
	for i := range 64 {
		require.NoError(t, client.RegisterReader(ctx, rs, fmt.Sprintf("r%d", i), 0))
	}
	rs.Release()
	due := time.Now().Add(200 * time.Millisecond)
	for i := range 200 {
		_, _, err := client.Schedule(ctx, held0, keyed("a/due", `{}`, fmt.Sprintf("due-%d", i)), due)
		require.NoError(t, err)
	}
	b.check(t, "A at its mounts, readers and scheduled appends")

	// A processor that fails every frame, on 4 of the streams A holds: it crash-loops along
	// the ladder while B's processor runs.
	var broken atomic.Bool
	broken.Store(true)
	poisonHost := processors.NewHost("test")
	require.NoError(t, processors.Add(poisonHost, func() processors.Contract[int] { return poisonContract(&broken) }))
	awaitMount(t, runRemoteHost(t, p.addr, aToken, "a-worker", poisonHost))
	failed := poisonRuns.Load()
	for i := range 4 {
		s := stream(t, a, fmt.Sprintf("/a/held-%d", i))
		configureRemote(t, s, "poison")
		mustAppend(t, s, ev("crash/poison", `{}`))
	}
	waitUntil(t, "A's processor failing its frames", func() bool { return poisonRuns.Load() >= failed+4 })
	b.check(t, "A's processors crash-loop")

	// A flood of appends from 4 connections, 2 appenders each, into the streams A holds.
	stop := make(chan struct{})
	var flooders sync.WaitGroup
	var flooded atomic.Int64
	batch := make([]itx.EventInput, 100)
	for i := range batch {
		batch[i] = ev("a/flood", `{"pad":"`+strings.Repeat("x", 200)+`"}`)
	}
	for c := range 4 {
		conn := dial(t, p.addr).Login(ctx, aToken)
		for g := range 2 {
			s := stream(t, conn, fmt.Sprintf("/a/held-%d", (c*2+g)%max(held, 1)))
			flooders.Add(1)
			go func() {
				defer flooders.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := client.Append(ctx, s, batch, itx.AppendOptions{}); err != nil {
						return
					}
					flooded.Add(int64(len(batch)))
				}
			}()
		}
	}
	start := time.Now()
	b.check(t, "A floods appends")
	b.check(t, "A floods appends, again")
	close(stop)
	flooders.Wait()
	t.Logf("A appended %d events in %v meanwhile", flooded.Load(), time.Since(start).Round(time.Millisecond))
	require.LessOrEqual(t, hang.most.Load(), int64(6), "A's requests open at once")

	// The operator sees who: counted per project and flag, and logged once naming the project.
	for _, flag := range []string{"--webhook-max-in-flight-per-project", "--max-held-streams-per-project", "--max-live-per-project"} {
		require.Positive(t, scrapeMetric(t, metrics, fmt.Sprintf(`itx_project_share_full_total{flag="%s",project="%s"}`, flag, aID)), flag)
		require.Zero(t, scrapeMetric(t, metrics, fmt.Sprintf(`itx_project_share_full_total{flag="%s",project="%s"}`, flag, bInfo.ID)), flag)
		require.True(t, slices.ContainsFunc(strings.Split(p.logs.String(), "\n"), func(line string) bool {
			return strings.Contains(line, `"project":"`+aID+`"`) && strings.Contains(line, `"flag":"`+flag+`"`)
		}), "a log line names project %s and %s", aID, flag)
	}
}

// tenantB is the neighbour's ordinary work: a stream with a webhook subscription, an itx-call
// subscription to a receiver it mounted, and a live connection on it.
type tenantB struct {
	ctx     context.Context
	addr    string
	project schema.Project
	work    schema.Stream
	hooked  chan int64 // offsets its webhook received
	called  chan int64 // offsets its mounted receiver received
	tailed  chan int64 // offsets its connection received
	n       int
	// guest is a stream its remote processor (the guestbook) reduces.
	guest    schema.Stream
	guestSub schema.Subscription
}

func newTenantB(t *testing.T, ctx context.Context, addr, token string) *tenantB {
	b := &tenantB{ctx: ctx, addr: addr, hooked: make(chan int64, 1024), called: make(chan int64, 1024), tailed: make(chan int64, 1024)}
	b.project = dial(t, addr).Login(ctx, token)
	t.Cleanup(b.project.Release)
	b.work = stream(t, b.project, "/b/work")
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body itx.WebhookBody
		raw, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(raw, &body); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		b.hooked <- body.Event.Offset
	}))
	t.Cleanup(hook.Close)
	h, err := client.MountReceiver(ctx, b.project, "inbox", client.ServeReceiver(func(_ context.Context, batch itx.DeliveryBatch) (int64, error) {
		for _, e := range batch.Events {
			b.called <- e.Offset
		}
		return 0, nil
	}))
	require.NoError(t, err)
	t.Cleanup(h.Release)
	subs := client.Subscriptions(ctx, b.work)
	defer subs.Release()
	for _, cfg := range []client.SubscriptionConfig{
		{Name: "hook", Start: "now", FilterTypes: []string{"b/work"}, Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: hook.URL}},
		{Name: "call", Start: "now", FilterTypes: []string{"b/work"}, Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}},
	} {
		_, _, err := client.ConfigureSubscription(ctx, subs, cfg)
		require.NoError(t, err)
	}
	b.guest = stream(t, b.project, "/b/guest")
	configureRemote(t, b.guest, "guestbook")
	b.guestSub, _ = processorOf(t, b.guest, "guestbook")
	awaitMount(t, runRemoteHost(t, addr, token, "b-worker", referenceHost(t, "guestbook")))
	c, err := client.OpenConnection(ctx, b.work, client.ConnectionOptions{Types: []string{"b/work"}}, client.ConnectionHandler{
		Deliver: func(_ context.Context, batch itx.DeliveryBatch) error {
			for _, e := range batch.Events {
				b.tailed <- e.Offset
			}
			return nil
		}})
	require.NoError(t, err)
	t.Cleanup(c.Release)
	return b
}

// check does one round of B's work and waits (a minute at most) for each part to be done,
// logging how long each took.
func (b *tenantB) check(t *testing.T, when string) {
	t.Helper()
	b.n++
	start := time.Now()
	res, err := client.Append(b.ctx, b.work, []itx.EventInput{ev("b/work", fmt.Sprintf(`{"n":%d}`, b.n))}, itx.AppendOptions{})
	require.NoError(t, err, "%s: B's append", when)
	appended := time.Since(start)
	off := res.Offsets[0]
	wait := func(what string, got chan int64) time.Duration {
		deadline := time.After(time.Minute)
		for {
			select {
			case o := <-got:
				if o >= off {
					return time.Since(start)
				}
			case <-deadline:
				t.Fatalf("%s: B's %s did not receive offset %d within a minute", when, what, off)
			}
		}
	}
	hooked := wait("webhook", b.hooked)
	called := wait("mounted receiver", b.called)
	tailed := wait("connection", b.tailed)

	// Its remote processor's frame.
	t0 := time.Now()
	head := mustAppend(t, b.guest, examples.GuestbookSigned.Input(examples.Signed{Name: fmt.Sprintf("b-%d", b.n), Message: "hi"}, "")).HeadOffset
	processed, err := client.WaitUntilProcessed(b.ctx, b.guestSub, head, time.Minute)
	require.NoError(t, err, "%s: B's processor", when)
	require.GreaterOrEqual(t, processed, head)
	proc := time.Since(t0)

	// A stream B never used (a load, past the loaded and held bounds) and a second connection.
	t0 = time.Now()
	_, err = client.Append(b.ctx, stream(t, b.project, fmt.Sprintf("/b/fresh-%d", b.n)), []itx.EventInput{ev("b/fresh", `{}`)}, itx.AppendOptions{})
	require.NoError(t, err, "%s: B's append to a new stream", when)
	fresh := time.Since(t0)
	t0 = time.Now()
	c, err := client.OpenConnection(b.ctx, stream(t, b.project, "/b/work"), client.ConnectionOptions{After: off - 1}, client.ConnectionHandler{
		Deliver: func(context.Context, itx.DeliveryBatch) error { return nil }})
	require.NoError(t, err, "%s: B's new connection", when)
	require.NoError(t, c.Close(b.ctx))
	opened := time.Since(t0)
	t.Logf("B while %s: append %v, webhook %v, itx-call %v, connection %v; processor %v, new stream %v, new connection %v", when,
		appended.Round(time.Microsecond), hooked.Round(time.Microsecond), called.Round(time.Microsecond),
		tailed.Round(time.Microsecond), proc.Round(time.Microsecond), fresh.Round(time.Microsecond), opened.Round(time.Microsecond))
}

// hangingReceiver is A's webhook: it answers nothing until the request ends (itxd's delivery
// timeout), counting the requests open, the most at once, and those that returned.
type hangingReceiver struct {
	srv      *httptest.Server
	open     atomic.Int64
	most     atomic.Int64
	returned atomic.Int64
	opened   chan struct{}
}

func newHangingReceiver(t *testing.T) *hangingReceiver {
	h := &hangingReceiver{opened: make(chan struct{}, 64)}
	done := make(chan struct{})
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read whole, the request's context ends when itxd closes the connection (net/http
		// watches a connection for its close only once the body is read).
		io.Copy(io.Discard, r.Body)
		n := h.open.Add(1)
		for m := h.most.Load(); n > m && !h.most.CompareAndSwap(m, n); m = h.most.Load() {
		}
		select {
		case h.opened <- struct{}{}:
		default:
		}
		select {
		case <-r.Context().Done():
		case <-done:
		}
		h.open.Add(-1)
		h.returned.Add(1)
	}))
	t.Cleanup(func() {
		close(done) // before Close, which waits for the handlers
		h.srv.Close()
	})
	return h
}

func (h *hangingReceiver) waitOpen(t *testing.T, ctx context.Context, n int64) {
	t.Helper()
	for h.open.Load() < n {
		select {
		case <-h.opened:
		case <-ctx.Done():
			t.Fatalf("A's hanging requests open: %d, want %d", h.open.Load(), n)
		}
	}
}
