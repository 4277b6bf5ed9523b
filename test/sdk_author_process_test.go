package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/capability"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors/remote"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// sdkAuthorRoleEnv makes the test binary one of the processes of the sdk-author tests:
// "itxd" (a server hosting the three processors in-process, as README's "Host it in a server of
// your own" does) or "host" (a remote host of them, remote.Run). Their settings come in
// ITX_SDK_* variables.
const sdkAuthorRoleEnv = "ITX_SDK_AUTHOR_ROLE"

// sdkAuthorChild runs the process role names until it is killed.
func sdkAuthorChild(role string) int {
	host, err := sdkAuthorHost("sdk-author-1", httpQAVendor(os.Getenv("ITX_SDK_VENDOR")))
	if err != nil {
		log.Print(err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	switch role {
	case "itxd":
		ln, err := net.Listen("tcp", os.Getenv("ITX_SDK_ADDR"))
		if err != nil {
			log.Print(err)
			return 1
		}
		srv, err := server.Open(ctx, server.Config{DataDir: os.Getenv("ITX_SDK_DATA"), Processors: host})
		if err != nil {
			log.Print(err)
			return 1
		}
		go capability.NewListener(srv).Serve(ln)
		fmt.Println("ready")
		<-ctx.Done()
		return 0
	case "host":
		fmt.Println("ready")
		err := remote.Run(ctx, remote.Config{Addr: os.Getenv("ITX_SDK_ADDR"), Token: os.Getenv("ITX_SDK_TOKEN"),
			Name: "sdk-author", Host: host, Logf: log.Printf})
		if err != nil {
			log.Print(err)
			return 1
		}
		return 0
	}
	log.Printf("unknown role %q", role)
	return 1
}

// httpQAVendor asks the vendor at url: POST {"question"} with the Idempotency-Key header,
// answered by {"text"}.
func httpQAVendor(url string) qaVendor {
	return func(ctx context.Context, key, question string) (string, error) {
		body, _ := json.Marshal(map[string]string{"question": question})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return "", err
		}
		req.Header.Set("Idempotency-Key", key)
		req.GetBody = nil // one call is one attempt: no replay by the transport
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			return "", err
		}
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("vendor answered %s: %s", resp.Status, raw)
		}
		var out struct{ Text string }
		if err := json.Unmarshal(raw, &out); err != nil {
			return "", err
		}
		return out.Text, nil
	}
}

// qaVendorServer is a real HTTP vendor honouring idempotency keys: it acts on a key's first
// request (executions) and answers every later one from what it kept. While holding, a key's
// first request is not answered until release (or its client goes away).
type qaVendorServer struct {
	url         string
	mu          sync.Mutex
	kept        map[string]string
	keys        []string // every request's key, in order
	execs       int
	holding     chan struct{} // closed by release
	releaseOnce sync.Once
	received    chan string // each key's first request, as it arrives
}

func newQAVendorServer(t *testing.T) *qaVendorServer {
	v := &qaVendorServer{kept: map[string]string{}, holding: make(chan struct{}), received: make(chan string, 64)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct{ Question string }
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		key := r.Header.Get("Idempotency-Key")
		v.mu.Lock()
		v.keys = append(v.keys, key)
		text, seen := v.kept[key]
		if !seen {
			v.execs++
			text = "A: " + in.Question
			v.kept[key] = text
		}
		v.mu.Unlock()
		if !seen {
			select {
			case v.received <- key:
			default:
			}
			select {
			case <-v.holding:
			case <-r.Context().Done():
				return
			}
		}
		json.NewEncoder(w).Encode(map[string]string{"text": text})
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(v.release)
	v.url = srv.URL
	return v
}

// release answers the held requests, and every later one at once.
func (v *qaVendorServer) release() { v.releaseOnce.Do(func() { close(v.holding) }) }

func (v *qaVendorServer) counts() (requests, executions int, distinct []string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	d := slices.Clone(v.keys)
	slices.Sort(d)
	return len(v.keys), v.execs, slices.Compact(d)
}

// sdkChild is a process running sdkAuthorChild.
type sdkChild struct {
	cmd    *exec.Cmd
	exited chan error
}

// startSDKChild starts the test binary in role with env, and waits until it says it is ready.
func startSDKChild(t *testing.T, role string, env ...string) *sdkChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), append([]string{sdkAuthorRoleEnv + "=" + role}, env...)...)
	var logs syncBuffer
	cmd.Stderr = &logs
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	c := &sdkChild{cmd: cmd, exited: make(chan error, 1)}
	ready := make(chan bool, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		ready <- line == "ready\n"
		io.Copy(io.Discard, out)
		c.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-c.exited
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", role, logs.String())
		}
	})
	select {
	case ok := <-ready:
		require.True(t, ok, "%s did not start:\n%s", role, logs.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not start within a minute:\n%s", role, logs.String())
	}
	return c
}

func (c *sdkChild) kill9(t *testing.T) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Kill())
	<-c.exited
}

// sdkStreams are the three processors' streams.
type sdkStreams struct {
	qa, metrics, reminders schema.Stream
}

func openSDKStreams(t *testing.T, p schema.Project) sdkStreams {
	ctx := context.Background()
	s := sdkStreams{client.Stream(ctx, p, "/sdk/qa"), client.Stream(ctx, p, "/sdk/metrics"), client.Stream(ctx, p, "/sdk/reminders")}
	t.Cleanup(func() { s.qa.Release(); s.metrics.Release(); s.reminders.Release() })
	return s
}

func (s sdkStreams) configure(t *testing.T, placement string) {
	t.Helper()
	ctx := ctxLong(t)
	for name, st := range map[string]schema.Stream{"answerer": s.qa, "summarizer": s.metrics, "reminders": s.reminders} {
		subs := client.Subscriptions(ctx, st)
		_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{
			Name: name, Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Placement: placement}})
		subs.Release()
		require.NoError(t, err, "configure %s", name)
	}
}

// keyedInput is in with a client idempotency key, so a resend after a crash is safe.
func keyedInput(in itx.EventInput, key string) itx.EventInput {
	in.IdempotencyKey = key
	return in
}

// firstHalf appends the first half of every processor's input: two questions, seven samples,
// three reminders (one cancelled).
func (s sdkStreams) firstHalf(t *testing.T) {
	t.Helper()
	mustAppend(t, s.qa, keyedInput(question("one"), "q1"), keyedInput(question("two"), "q2"))
	for i := range 7 {
		mustAppend(t, s.metrics, keyedInput(sdkSample(i), fmt.Sprintf("s%d", i)))
	}
	mustAppend(t, s.reminders,
		keyedInput(setReminder("r1", "first", 1500*time.Millisecond), "set-r1"),
		keyedInput(setReminder("r2", "cancelled", 1500*time.Millisecond), "set-r2"))
	mustAppend(t, s.reminders, keyedInput(cancelReminder("r2"), "cancel-r2"),
		keyedInput(setReminder("r3", "third", 4*time.Second), "set-r3"))
}

// secondHalf appends the rest: a third question, five samples, a fourth reminder.
func (s sdkStreams) secondHalf(t *testing.T) {
	t.Helper()
	mustAppend(t, s.qa, keyedInput(question("three"), "q3"))
	for i := 7; i < 12; i++ {
		mustAppend(t, s.metrics, keyedInput(sdkSample(i), fmt.Sprintf("s%d", i)))
	}
	mustAppend(t, s.reminders, keyedInput(setReminder("r4", "fourth", 500*time.Millisecond), "set-r4"))
}

func sdkSample(i int) itx.EventInput {
	return sample([]string{"cpu", "mem", "disk"}[i%3], int64(i*7%11))
}

// verify waits for every outcome the input owes and checks that none is missing or doubled.
func (s sdkStreams) verify(t *testing.T, v *qaVendorServer) {
	t.Helper()
	ctx := ctxLong(t)
	wait := func(st schema.Stream, typ, where string) {
		t.Helper()
		_, err := client.WaitForEvent(ctx, st, itx.Predicate{Types: []string{typ}, Where: where}, 0, 45*time.Second)
		require.NoError(t, err, "waiting for %s where %s", typ, where)
	}
	asked, err := client.ReadAll(ctx, s.qa, itx.Query{Types: []string{string(QAAsked)}})
	require.NoError(t, err)
	require.Len(t, asked, 3)
	for _, q := range asked {
		wait(s.qa, string(QAAnswered), fmt.Sprintf("payload.askedOffset = %d", q.Offset))
	}
	wait(s.metrics, string(MetricSummary), "payload.total = 12")
	for _, id := range []string{"r1", "r3", "r4"} {
		wait(s.reminders, string(ReminderFired), fmt.Sprintf(`payload.id = "%s"`, id))
	}
	wait(s.reminders, string(ReminderDue), `payload.id = "r2"`)
	// Every processor past its stream's head: whatever it would append has been appended.
	for name, st := range map[string]schema.Stream{"answerer": s.qa, "summarizer": s.metrics, "reminders": s.reminders} {
		head := mustAppend(t, st, ev("sdk/marker", `{}`)).HeadOffset
		sub := client.Subscription(ctx, st, name)
		_, err := client.WaitUntilProcessed(ctx, sub, head, 60*time.Second)
		sub.Release()
		require.NoError(t, err, "%s processing through %d", name, head)
	}
	pending, err := client.ListScheduled(ctx, s.reminders)
	require.NoError(t, err)
	require.Empty(t, pending, "reminder timers still pending")
	pending, err = client.ListScheduled(ctx, s.metrics)
	require.NoError(t, err)
	require.Empty(t, pending, "flush timers still pending")

	all := func(st schema.Stream) []itx.Event {
		events, err := client.ReadAll(ctx, st, itx.Query{})
		require.NoError(t, err)
		return events
	}
	qa := all(s.qa)
	answers := payloadsOf(t, QAAnswered, qa)
	require.Len(t, answers, 3, "answers: %+v", answers)
	for _, a := range answers {
		require.Contains(t, []string{"A: one", "A: two", "A: three"}, a.Text)
	}
	requests, execs, keys := v.counts()
	require.Equal(t, 3, execs, "the vendor acted %d times for 3 questions (%d requests, keys %q)", execs, requests, keys)
	require.Len(t, keys, 3)
	t.Logf("vendor: %d requests for 3 questions", requests)

	metrics := all(s.metrics)
	var samples []MetricSampleP
	var totals []int
	summaries := 0
	for _, e := range metrics {
		switch e.Type {
		case string(MetricSample):
			m, _ := MetricSample.Decode(e)
			samples = append(samples, m)
		case string(MetricSummary):
			sum, _ := MetricSummary.Decode(e)
			summaries++
			totals = append(totals, sum.Total)
			// Each summary is the fold of the first Total samples.
			want := map[string]MetricAgg{}
			for _, m := range samples[:min(sum.Total, len(samples))] {
				g, seen := want[m.Key]
				if !seen || m.Value < g.Min {
					g.Min = m.Value
				}
				if !seen || m.Value > g.Max {
					g.Max = m.Value
				}
				g.Count++
				g.Sum += m.Value
				want[m.Key] = g
			}
			require.Equal(t, want, sum.Aggs, "summary at %d (total %d)", e.Offset, sum.Total)
		}
	}
	require.True(t, slices.IsSorted(totals) && len(slices.Compact(slices.Clone(totals))) == len(totals), "summary totals %v: increasing, none twice", totals)
	require.Subset(t, totals, []int{5, 10, 12}, "summary totals %v", totals)

	rem := all(s.reminders)
	require.Equal(t, []string{"r1", "r3", "r4"}, sortedStrings(firedIDs(t, rem)), "reminders fired")
	require.Len(t, payloadsOf(t, ReminderDue, rem), 4)

	// The operator's rewind to the start is a replay in the real server: every processor runs
	// its whole history again, and nothing is appended but the cursor-set itself, nothing
	// scheduled, and the vendor is not dialed.
	requestsBefore, _, _ := v.counts()
	for name, st := range map[string]schema.Stream{"answerer": s.qa, "summarizer": s.metrics, "reminders": s.reminders} {
		before := all(st)
		set, err := client.SetSubscriptionCursor(ctx, st, name, 0)
		require.NoError(t, err)
		sub := client.Subscription(ctx, st, name)
		_, err = client.WaitUntilProcessed(ctx, sub, set, 60*time.Second)
		sub.Release()
		require.NoError(t, err, "%s replaying through %d", name, set)
		after := all(st)
		require.Len(t, after, len(before)+1, "%s: the replay appended %v", name, after[len(before):])
		pending, err := client.ListScheduled(ctx, st)
		require.NoError(t, err)
		require.Empty(t, pending, "%s: the replay scheduled", name)
	}
	requests, _, _ = v.counts()
	require.Equal(t, requestsBefore, requests, "the replay dialed the vendor")
}

func sortedStrings(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// waitVendorCalled waits until the answerer has dialed the vendor (its call is held there).
func waitVendorCalled(t *testing.T, v *qaVendorServer) {
	t.Helper()
	select {
	case <-v.received:
	case <-time.After(60 * time.Second):
		t.Fatal("the answerer never dialed the vendor")
	}
}

// The three processors in-process, in a server of one's own (the test binary as itxd), killed
// with kill -9 while the answerer's vendor call is in flight and the other two have work
// pending (flush timers, reminders not due yet): after the restart every question is answered
// once with the vendor acting once each, every summary is the fold it names, and every reminder
// not cancelled fires once.
func TestSDKAuthor_InProcessKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	v := newQAVendorServer(t)
	dir, addr := t.TempDir(), freeAddr(t)
	env := []string{"ITX_SDK_DATA=" + dir, "ITX_SDK_ADDR=" + addr, "ITX_SDK_VENDOR=" + v.url}
	proc := startSDKChild(t, "itxd", env...)
	creds, err := server.ReadCredentials(dir)
	require.NoError(t, err)
	s := openSDKStreams(t, dial(t, addr).Login(context.Background(), creds.ProjectToken))
	s.configure(t, "")
	s.firstHalf(t)
	waitVendorCalled(t, v)
	proc.kill9(t)
	v.release()

	startSDKChild(t, "itxd", env...)
	s = openSDKStreams(t, dial(t, addr).Login(context.Background(), creds.ProjectToken))
	s.secondHalf(t)
	s.verify(t, v)
}

// The three processors on a remote host (the test binary as the host) against a real itxd: the
// host killed with kill -9 while the answerer's vendor call is in flight, then itxd killed with
// kill -9 right after the second half of the input: the same outcomes, exactly once.
func TestSDKAuthor_RemoteKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	v := newQAVendorServer(t)
	dir, addr := t.TempDir(), freeAddr(t)
	proc := startItxd(t, dir, "--listen", addr, "--processors", "")
	hostEnv := []string{"ITX_SDK_ADDR=" + addr, "ITX_SDK_TOKEN=" + proc.creds.ProjectToken, "ITX_SDK_VENDOR=" + v.url}
	host := startSDKChild(t, "host", hostEnv...)
	p := dial(t, addr).Login(context.Background(), proc.creds.ProjectToken)
	for _, c := range []string{"answerer", "summarizer", "reminders"} {
		awaitContract(t, p, c)
	}
	s := openSDKStreams(t, p)
	s.configure(t, "remote")
	s.firstHalf(t)
	waitVendorCalled(t, v)
	host.kill9(t)
	v.release()

	startSDKChild(t, "host", hostEnv...)
	s.secondHalf(t)
	proc.kill9(t)

	proc = startItxd(t, dir, "--listen", addr, "--processors", "")
	p = dial(t, addr).Login(context.Background(), proc.creds.ProjectToken)
	s = openSDKStreams(t, p)
	s.verify(t, v)
}
