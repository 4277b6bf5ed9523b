package test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/remote"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Tests written as a user whose processor sends emails: each consumed email/requested is one POST
// to a mail API, under an idempotency key, inside BlockProcessorWhile (at-least-once).

type mailRequest struct {
	ID string `json:"id"`
}

const mailRequested = processors.EventType[mailRequest]("mail/requested")

// mailAPI is a real HTTP receiver that records each send's idempotency key; each send takes delay.
type mailAPI struct {
	mu    sync.Mutex
	sends map[string]int
	total int
	url   string
}

func newMailAPI(t *testing.T, delay time.Duration) *mailAPI {
	m := &mailAPI{sends: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
		m.mu.Lock()
		m.sends[r.Header.Get("Idempotency-Key")]++
		m.total++
		m.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	m.url = srv.URL
	return m
}

func (m *mailAPI) counts() (distinct, total int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.sends), m.total
}

func mailerContract(api *mailAPI) func() processors.Contract[int] {
	return func() processors.Contract[int] {
		return processors.Contract[int]{
			Name: "mailer", ConsumedTypes: []string{string(mailRequested)}, ReducerVersion: "1",
			InitialState: func() int { return 0 },
			Reduce:       func(n int, _ itx.Event) int { return n + 1 },
			ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
				if a.Event == nil {
					return nil
				}
				key := a.IdempotencyKey("send", a.Event)
				// Blocking: the email is this event's whole consequence.
				a.BlockProcessorWhile("send", func(ctx context.Context) error {
					req, err := http.NewRequestWithContext(ctx, http.MethodPost, api.url, nil)
					if err != nil {
						return err
					}
					req.Header.Set("Idempotency-Key", key)
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						return err
					}
					return resp.Body.Close()
				})
				return nil
			},
		}
	}
}

// A remote mailer mounted over a backlog: the page it reads (500 events) takes longer to send
// than itxd's bound on one wake (twice the delivery timeout). The host commits within its wake
// budget, frame by frame, so the backlog drains; it used to run the whole page at every wake, be
// cut off by the bound, commit nothing, and send the same emails again at the next wake, forever.
func TestProcessors_RemoteSlowBacklogDrains(t *testing.T) {
	if testing.Short() {
		t.Skip("sends a backlog through a slow receiver")
	}
	api := newMailAPI(t, 10*time.Millisecond)
	ts := startServer(t, server.Config{DeliveryTimeout: 500 * time.Millisecond}) // a wake is bound at 1 s
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/mail/backlog")
	const n = 300 // about 3 s of sends in one page
	var head int64
	for i := 0; i < n; i += 100 {
		var batch []itx.EventInput
		for j := i; j < i+100; j++ {
			batch = append(batch, mailRequested.Input(mailRequest{ID: fmt.Sprint(j)}, ""))
		}
		head = mustAppend(t, s, batch...).HeadOffset
	}
	configureRemote(t, s, "mailer")
	host := processors.NewHost("mail-1")
	require.NoError(t, processors.Add(host, mailerContract(api)))
	mountedRemoteHost(t, remote.Config{Addr: ts.addr, Token: ts.creds.ProjectToken, Name: "mail-host", Host: host, WakeBudget: 200 * time.Millisecond})

	sub := client.Subscription(ctx, s, "mailer")
	defer sub.Release()
	processed, err := client.WaitUntilProcessed(ctx, sub, head, 25*time.Second)
	require.NoError(t, err, "the backlog never drained")
	require.GreaterOrEqual(t, processed, head)
	distinct, total := api.counts()
	require.Equal(t, n, distinct, "every email sent")
	require.Less(t, total, 2*n, "sends repeated wake after wake: %d sends for %d emails", total, n)
}

// An in-process mailer whose send hangs, ignoring its context: the wake is bound as a remote
// host's is (twice the delivery timeout), so the subscription shows the stall (lastError, attempt)
// and backs off instead of sitting silently "active" with an in-flight deadline long past. Once
// the send returns the mailer moves on.
func TestProcessors_InProcessHungFrameIsSeen(t *testing.T) {
	release := make(chan struct{})
	var sends sync.Map
	build := func() processors.Contract[int] {
		return processors.Contract[int]{
			Name: "mailer", ConsumedTypes: []string{string(mailRequested)}, ReducerVersion: "1",
			InitialState: func() int { return 0 },
			Reduce:       func(n int, _ itx.Event) int { return n + 1 },
			ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
				if a.Event == nil {
					return nil
				}
				key := a.IdempotencyKey("send", a.Event)
				// Blocking: the email is this event's whole consequence.
				a.BlockProcessorWhile("send", func(context.Context) error {
					<-release // a vendor SDK call that takes no context
					n, _ := sends.LoadOrStore(key, new(atomic.Int64))
					n.(*atomic.Int64).Add(1)
					return nil
				})
				return nil
			},
		}
	}
	host := processors.NewHost("mail-1")
	require.NoError(t, processors.Add(host, build))
	ts := startServer(t, server.Config{Processors: host, DeliveryTimeout: 250 * time.Millisecond})
	var once sync.Once
	unhang := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unhang) // before the server closes
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/mail/hung")
	configureProcessor(t, s, "mailer")
	sub := client.Subscription(ctx, s, "mailer")
	defer sub.Release()
	_, err := client.WaitUntilProcessed(ctx, sub, 1, 10*time.Second) // nothing in flight
	require.NoError(t, err)
	before := time.Now().UnixMilli()
	head := mustAppend(t, s, mailRequested.Input(mailRequest{ID: "1"}, "")).HeadOffset
	var inFlight itx.SubscriptionDescription
	require.Eventually(t, func() bool {
		inFlight, err = client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		return inFlight.InFlightDeadlineAt >= before
	}, 10*time.Second, 5*time.Millisecond, "the wake never showed in flight")
	require.GreaterOrEqual(t, inFlight.InFlightDeadlineAt, before+500, "the deadline describe shows is the wake's bound")

	var d itx.SubscriptionDescription
	require.Eventually(t, func() bool {
		var err error
		d, err = client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		return d.LastError != ""
	}, 20*time.Second, 20*time.Millisecond, "the hung frame never showed: %+v", d)
	require.Contains(t, d.LastError, "mailer")
	require.Contains(t, d.LastError, "did not finish")
	require.GreaterOrEqual(t, d.Attempt, 1)
	require.Less(t, d.ConfirmedOffset, head)

	unhang()
	_, err = client.WaitUntilProcessed(ctx, sub, head, 20*time.Second)
	require.NoError(t, err)
	n := 0
	sends.Range(func(_, v any) bool { n += int(v.(*atomic.Int64).Load()); return true })
	// At least once: the frame that overran the bound was cancelled (its late commit refused), so
	// the retry sends again, under the same idempotency key, as after a crash; never more.
	require.GreaterOrEqual(t, n, 1)
	require.LessOrEqual(t, n, 2)
}

// countingMailer is a mailer whose reducer counts requests; reduceDelay slows its Reduce (a big
// state, a long history: what a new reducer version has to refold).
func countingMailer(version string, reduceDelay time.Duration) func() processors.Contract[int] {
	return func() processors.Contract[int] {
		return processors.Contract[int]{
			Name: "mailer", ConsumedTypes: []string{string(mailRequested)}, ReducerVersion: version,
			InitialState: func() int { return 0 },
			Reduce: func(n int, _ itx.Event) int {
				time.Sleep(reduceDelay)
				return n + 1
			},
			ProcessEvent: func(context.Context, *processors.Args[int]) error { return nil },
		}
	}
}

// A remote processor deployed with a new reducer version over a history whose refold takes
// longer than itxd's bound on one wake: the refold commits as it goes (a reduction lagging the
// processing cursor, which the next wake extends), so the processor comes back. It used to refold
// from offset 1 inside every wake, be cut off by the bound, commit nothing and start over: the
// processor never processed another event.
func TestProcessors_RemoteSlowRefoldResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("refolds a history through a slow reducer")
	}
	ts := startServer(t, server.Config{DeliveryTimeout: 250 * time.Millisecond}) // a wake is bound at 500 ms
	// A refold through a slow reducer: seconds longer on a loaded machine.
	ctx := ctxLong(t)
	s := stream(t, ts.project(t), "/mail/refold")
	const n = 1500
	for i := 0; i < n; i += 500 {
		var batch []itx.EventInput
		for j := i; j < i+500; j++ {
			batch = append(batch, mailRequested.Input(mailRequest{ID: fmt.Sprint(j)}, ""))
		}
		mustAppend(t, s, batch...)
	}
	configureRemote(t, s, "mailer")
	sub := client.Subscription(ctx, s, "mailer")
	defer sub.Release()
	_, proc := processorOf(t, s, "mailer")

	run := func(version string, delay time.Duration) func() {
		host := processors.NewHost("mail-" + version)
		require.NoError(t, processors.Add(host, countingMailer(version, delay)))
		return mountedRemoteHost(t, remote.Config{Addr: ts.addr, Token: ts.creds.ProjectToken, Name: "mail-host", Host: host, WakeBudget: 100 * time.Millisecond})
	}
	stop := run("1", 0)
	head := mustAppend(t, s, mailRequested.Input(mailRequest{ID: "v1"}, "")).HeadOffset
	_, err := client.WaitUntilProcessed(ctx, sub, head, 20*time.Second)
	require.NoError(t, err)
	stop()

	stop = run("2", 500*time.Microsecond) // about 0.75 s to refold, past the bound
	t.Cleanup(stop)
	head = mustAppend(t, s, mailRequested.Input(mailRequest{ID: "v2"}, "")).HeadOffset
	_, err = client.WaitUntilProcessed(ctx, sub, head, 90*time.Second)
	require.NoError(t, err, "the new reducer never came back")
	snap, err := client.Snapshot(ctx, proc)
	require.NoError(t, err)
	require.Equal(t, fmt.Sprint(n+2), snap.State)
	require.GreaterOrEqual(t, snap.ReducedOffset, head)
}

// Closing a server (itxd's SIGTERM) while an in-process blocker hangs, ignoring its context:
// Close returns within its context, as with any other wake in flight. It used to wait for the
// frame forever, whatever the shutdown timeout.
func TestProcessors_CloseWithHungBlockerReturns(t *testing.T) {
	entered := make(chan struct{}, 1)
	build := func() processors.Contract[int] {
		return processors.Contract[int]{
			Name: "mailer", ConsumedTypes: []string{string(mailRequested)}, ReducerVersion: "1",
			InitialState: func() int { return 0 },
			Reduce:       func(n int, _ itx.Event) int { return n + 1 },
			ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
				if a.Event != nil {
					a.BlockProcessorWhile("send", func(context.Context) error { entered <- struct{}{}; select {} })
				}
				return nil
			},
		}
	}
	host := processors.NewHost("x")
	require.NoError(t, processors.Add(host, build))
	ts := startServer(t, server.Config{Processors: host})
	s := stream(t, ts.project(t), "/mail/close")
	configureProcessor(t, s, "mailer")
	mustAppend(t, s, mailRequested.Input(mailRequest{ID: "1"}, ""))
	<-entered
	done := make(chan struct{})
	start := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		ts.srv.Close(ctx)
		close(done)
	}()
	select {
	case <-done:
		t.Logf("closed in %v", time.Since(start))
	case <-time.After(8 * time.Second):
		t.Fatal("Close(3s) hung with a hung blocker")
	}
}

// A remote processor rewound (setSubscriptionCursor) deep into a history whose refold takes
// longer than itxd's bound on one wake: the rewind's refold commits as it goes and the next wake
// extends it, so the processor reprocesses from the cursor and catches up. It used to refold
// from offset 1 inside every wake, be cut off, and never process again.
func TestProcessors_RemoteSlowRewindResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("refolds a history through a slow reducer")
	}
	ts := startServer(t, server.Config{DeliveryTimeout: 250 * time.Millisecond}) // a wake is bound at 500 ms
	// Each wake the bound cuts off is an outage the ladder backs off from (1 s, 2 s, ...).
	ctx, cancelCtx := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancelCtx()
	s := stream(t, ts.project(t), "/mail/rewind")
	const n = 1500
	for i := 0; i < n; i += 500 {
		var batch []itx.EventInput
		for j := i; j < i+500; j++ {
			batch = append(batch, mailRequested.Input(mailRequest{ID: fmt.Sprint(j)}, ""))
		}
		mustAppend(t, s, batch...)
	}
	configureRemote(t, s, "mailer")
	sub := client.Subscription(ctx, s, "mailer")
	defer sub.Release()
	_, proc := processorOf(t, s, "mailer")
	host := processors.NewHost("mail-1")
	require.NoError(t, processors.Add(host, countingMailer("1", 500*time.Microsecond)))
	mountedRemoteHost(t, remote.Config{Addr: ts.addr, Token: ts.creds.ProjectToken, Name: "mail-host", Host: host, WakeBudget: 100 * time.Millisecond})
	head := mustAppend(t, s, mailRequested.Input(mailRequest{ID: "caught-up"}, "")).HeadOffset
	_, err := client.WaitUntilProcessed(ctx, sub, head, 20*time.Second)
	require.NoError(t, err)

	_, err = client.SetSubscriptionCursor(ctx, s, "mailer", n) // refold ~1,500 events: ~0.75 s
	require.NoError(t, err)
	head = mustAppend(t, s, mailRequested.Input(mailRequest{ID: "after"}, "")).HeadOffset
	_, err = client.WaitUntilProcessed(ctx, sub, head, 60*time.Second)
	require.NoError(t, err, "the rewound processor never came back")
	snap, err := client.Snapshot(ctx, proc)
	require.NoError(t, err)
	require.Equal(t, fmt.Sprint(n+2), snap.State)
	require.GreaterOrEqual(t, snap.ReducedOffset, head)
}
