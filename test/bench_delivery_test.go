package test

// Delivery benchmarks recorded in docs/benchmarks.md ("Subscription delivery"): durable
// subscriptions of a SEPARATE itxd process pushing to receivers that live in this test process
// on loopback (an HTTP webhook receiver, a Receiver capability mounted over its own RPC
// connection), and copy-to-stream between two streams of the server.
//
//	go test -run '^$' -bench 'Delivery' -benchtime 5s ./test/
//
// Throughput (BenchmarkDelivery): b.N events are appended to a fresh stream first (not timed),
// then the subscription is configured (start: beginning) and the clock runs until the receiver
// has seen all b.N events (webhook, itx-call) or the copy subscription has confirmed them all,
// which means every copy is committed in the receiving stream. The timed section includes the
// configure call (one append, under a millisecond). ns/op is per delivered event.
//
// Latency (BenchmarkDeliveryLatency): one event at a time on an idle server: append, wait until
// the receiver has it, repeat. The latency runs from just before the append call to the
// receiver's arrival; b.N counts events.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/stretchr/testify/require"
)

// deliveryRun numbers the streams, subscriptions and mounts of successive runs, so every run of
// a sub-benchmark (the framework calls it with growing b.N) starts from nothing.
var deliveryRun atomic.Int64

// benchSecret signs the webhook deliveries (Standard Webhooks HMAC), as a production setup would.
const benchSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// deliveryProbe counts the distinct offsets a receiver has seen and records when each one
// arrived. Offsets outside [first, last] (not ours) are ignored.
type deliveryProbe struct {
	mu          sync.Mutex
	first, last int64
	seen        []bool
	distinct    int64
	duplicates  int64
	calls       int64
	all         chan struct{} // closed once every offset in [first, last] has arrived
	arrivals    chan arrival  // latency mode only (nil otherwise)
}

type arrival struct {
	offset int64
	at     time.Time
}

func newDeliveryProbe(first, last int64, latency bool) *deliveryProbe {
	p := &deliveryProbe{first: first, last: last, all: make(chan struct{})}
	if last >= first {
		p.seen = make([]bool, last-first+1)
	}
	if latency {
		p.arrivals = make(chan arrival, 1024)
	}
	return p
}

// record notes the arrival of offsets at the receiver.
func (p *deliveryProbe) record(at time.Time, offsets ...int64) {
	p.mu.Lock()
	p.calls++
	for _, o := range offsets {
		if o < p.first || o > p.last {
			continue
		}
		if p.seen[o-p.first] {
			p.duplicates++
			continue
		}
		p.seen[o-p.first] = true
		p.distinct++
		if p.distinct == int64(len(p.seen)) {
			close(p.all)
		}
	}
	p.mu.Unlock()
	if p.arrivals != nil {
		for _, o := range offsets {
			p.arrivals <- arrival{o, at}
		}
	}
}

func (p *deliveryProbe) stats() (calls, duplicates int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls, p.duplicates
}

// await waits until every expected offset arrived.
func (p *deliveryProbe) await(b *testing.B, timeout time.Duration) {
	b.Helper()
	select {
	case <-p.all:
	case <-time.After(timeout):
		p.mu.Lock()
		defer p.mu.Unlock()
		b.Fatalf("receiver saw %d of %d events after %s", p.distinct, len(p.seen), timeout)
	}
}

// newBenchHook is a webhook receiver on loopback in this process: it reads and decodes each POST
// (one event) and answers 200.
func newBenchHook(b *testing.B, p *deliveryProbe) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, err := io.ReadAll(r.Body)
		at := time.Now()
		var body struct {
			Event struct {
				Offset int64 `json:"offset"`
			} `json:"event"`
		}
		if err != nil || json.Unmarshal(raw, &body) != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		p.record(at, body.Event.Offset)
		w.WriteHeader(http.StatusOK)
	}))
	b.Cleanup(srv.Close)
	return srv.URL + "/hook"
}

// benchReceiver is a Receiver capability served by this process: it decodes each batch into Go
// events (as an application would) and confirms the whole batch.
type benchReceiver struct{ p *deliveryProbe }

func (r *benchReceiver) receive(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
	at := time.Now()
	offsets := make([]int64, len(b.Events))
	for i := range b.Events {
		offsets[i] = b.Events[i].Offset
	}
	r.p.record(at, offsets...)
	return 0, nil
}

// mountBenchReceiver mounts a Receiver under name on a connection of its own (not the
// appender's), as a separate application would, and keeps it mounted until b ends.
func (s *benchItxd) mountBenchReceiver(b *testing.B, name string, r *benchReceiver) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, s.addr)
	require.NoError(b, err)
	p := conn.Login(context.Background(), s.creds.ProjectToken)
	handle, err := client.MountReceiver(ctx, p, name, client.ServeReceiver(r.receive))
	require.NoError(b, err)
	b.Cleanup(func() {
		handle.Release()
		p.Release()
		conn.Close()
	})
}

// prefill appends n bench events to s, 1,000 per call (the most one append takes), and returns
// the offsets of the first and last.
func prefill(b *testing.B, s schema.Stream, n int) (first, last int64) {
	b.Helper()
	for done := 0; done < n; {
		k := min(itx.MaxAppendEvents, n-done)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		res, err := client.Append(ctx, s, benchEvents(k, done), itx.AppendOptions{})
		cancel()
		require.NoError(b, err)
		if done == 0 {
			first = res.Offsets[0]
		}
		last = res.Offsets[len(res.Offsets)-1]
		done += k
	}
	return first, last
}

// configure adds a subscription on s that takes only the bench events (so the receiver sees
// exactly what was appended) and returns its name and birth offset.
func configure(b *testing.B, s schema.Stream, cfg client.SubscriptionConfig) (string, int64) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	cfg.FilterTypes = []string{"bench.event"}
	name, birth, err := client.ConfigureSubscription(ctx, subs, cfg)
	require.NoError(b, err)
	return name, birth
}

// awaitProcessed waits until subscription name on s has confirmed offset.
func awaitProcessed(b *testing.B, s schema.Stream, name string, offset int64, timeout time.Duration) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout+10*time.Second)
	defer cancel()
	sub := client.Subscription(ctx, s, name)
	defer sub.Release()
	confirmed, err := client.WaitUntilProcessed(ctx, sub, offset, timeout)
	require.NoError(b, err)
	require.GreaterOrEqual(b, confirmed, offset)
}

// perf records the itxd process with `perf record --call-graph fp` while a timed section runs, when
// ITX_BENCH_PERF names a directory (diagnosis only: perf's own overhead skews that run's figures).
// It returns the function that stops the recording.
func (s *benchItxd) perf(b *testing.B) (stop func()) {
	dir := os.Getenv("ITX_BENCH_PERF")
	if dir == "" {
		return func() {}
	}
	out := filepath.Join(dir, fmt.Sprintf("%s-%d.data", strings.ReplaceAll(b.Name(), "/", "_"), b.N))
	graph := "fp" // Go's frame pointers; ITX_BENCH_PERF_CALLGRAPH=dwarf also unwinds SQLite's C frames
	if g := os.Getenv("ITX_BENCH_PERF_CALLGRAPH"); g != "" {
		graph = g
	}
	cmd := exec.Command("perf", "record", "--call-graph", graph, "-q", "-o", out, "-p", strconv.Itoa(s.cmd.Process.Pid))
	cmd.Stderr = os.Stderr
	require.NoError(b, cmd.Start())
	time.Sleep(300 * time.Millisecond) // let perf attach
	return func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
		b.Logf("perf data: %s", out)
	}
}

// deliveryTimeout bounds one throughput run (b.N events; 5 s of benchtime at the targets).
const deliveryTimeout = 5 * time.Minute

// BenchmarkDelivery measures how fast one subscription drains a backlog of b.N events to its
// receiver. The circuit breaker is lifted (the prefill and the copies go above its refill rate).
func BenchmarkDelivery(b *testing.B) {
	srv := startBenchItxd(b, noBreaker...)

	// One POST per event to an HTTP server in this process; signed.
	b.Run("webhook/backlog", func(b *testing.B) {
		b.StopTimer()
		run := deliveryRun.Add(1)
		src := srv.stream(b, fmt.Sprintf("/delivery/webhook-%d", run))
		first, last := prefill(b, src, b.N)
		probe := newDeliveryProbe(first, last, false)
		url := newBenchHook(b, probe)
		stopPerf := srv.perf(b)
		cpu := srv.cpuMeter(b)
		b.StartTimer()
		start := time.Now()
		name, birth := configure(b, src, client.SubscriptionConfig{Name: "hook",
			Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: url, Secret: benchSecret}})
		probe.await(b, deliveryTimeout)
		elapsed := time.Since(start)
		b.StopTimer()
		cpu.report(b)
		stopPerf()
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
		reportProbe(b, probe)
		awaitProcessed(b, src, name, birth, time.Minute) // the acks landed too
	})

	// copy-to-stream into a fresh receiving stream: done when the copy subscription has confirmed
	// every event, i.e. every copy is committed (fsynced) in the receiving stream. The second
	// variant reshapes every event with a JSONata transform on the way.
	copyBench := func(transform string) func(b *testing.B) {
		return func(b *testing.B) {
			b.StopTimer()
			run := deliveryRun.Add(1)
			srcPath, dstPath := fmt.Sprintf("/delivery/copy-%d", run), fmt.Sprintf("/delivery/copy-%d-dst", run)
			src := srv.stream(b, srcPath)
			prefill(b, src, b.N)
			stopPerf := srv.perf(b)
			before, cpu := srv.commitStats(b), srv.cpuMeter(b)
			b.StartTimer()
			start := time.Now()
			name, birth := configure(b, src, client.SubscriptionConfig{Name: "copy", Transform: transform,
				Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: dstPath}})
			awaitProcessed(b, src, name, birth, deliveryTimeout)
			elapsed := time.Since(start)
			b.StopTimer()
			cpu.report(b)
			stopPerf()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
			reportCommits(b, before, srv.commitStats(b)) // the receiving stream's commits (and the configure)
			info, err := client.Describe(context.Background(), srv.stream(b, dstPath))
			require.NoError(b, err)
			require.Equal(b, int64(b.N), info.HeadOffset, "the receiving stream holds one copy per event")
		}
	}
	b.Run("copy-to-stream/backlog", copyBench(""))
	b.Run("copy-to-stream/transform/backlog", copyBench(
		`{"type": "copied/" & type, "payload": {"seq": payload.seq, "who": $uppercase(payload.user), "checkout": payload.target = "button-checkout" and payload.ok}}`))

	// A Receiver capability mounted by a client on its own connection; batches of up to 1,000.
	b.Run("itx-call/backlog", func(b *testing.B) {
		b.StopTimer()
		run := deliveryRun.Add(1)
		src := srv.stream(b, fmt.Sprintf("/delivery/call-%d", run))
		first, last := prefill(b, src, b.N)
		probe := newDeliveryProbe(first, last, false)
		inbox := fmt.Sprintf("bench-inbox-%d", run)
		srv.mountBenchReceiver(b, inbox, &benchReceiver{p: probe})
		stopPerf := srv.perf(b)
		cpu := srv.cpuMeter(b)
		b.StartTimer()
		start := time.Now()
		name, birth := configure(b, src, client.SubscriptionConfig{Name: "call",
			Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: inbox}})
		probe.await(b, deliveryTimeout)
		elapsed := time.Since(start)
		b.StopTimer()
		cpu.report(b)
		stopPerf()
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
		reportProbe(b, probe)
		awaitProcessed(b, src, name, birth, time.Minute)
	})
}

// reportProbe reports events per receiver call (batch size) and fails on lost events.
func reportProbe(b *testing.B, p *deliveryProbe) {
	calls, dups := p.stats()
	if calls > 0 {
		b.ReportMetric(float64(b.N)/float64(calls), "events/call")
	}
	if dups > 0 {
		b.Logf("%d redeliveries", dups)
	}
}

// BenchmarkDeliveryLatency measures append-to-receiver latency on an idle server (default
// flags): one event at a time, from just before the append call to its arrival at the receiver.
// append-p50-us and append-p99-us are the append call alone (its acknowledgement), for comparison.
func BenchmarkDeliveryLatency(b *testing.B) {
	srv := startBenchItxd(b)

	b.Run("webhook", func(b *testing.B) {
		benchDeliveryLatency(b, srv, func(run int64, p *deliveryProbe) client.Receiver {
			return client.Receiver{Kind: client.ReceiverWebhookPost, URL: newBenchHook(b, p), Secret: benchSecret}
		})
	})
	b.Run("itx-call", func(b *testing.B) {
		benchDeliveryLatency(b, srv, func(run int64, p *deliveryProbe) client.Receiver {
			inbox := fmt.Sprintf("latency-inbox-%d", run)
			srv.mountBenchReceiver(b, inbox, &benchReceiver{p: p})
			return client.Receiver{Kind: client.ReceiverItxCall, Capability: inbox}
		})
	})
}

func benchDeliveryLatency(b *testing.B, srv *benchItxd, receiver func(run int64, p *deliveryProbe) client.Receiver) {
	run := deliveryRun.Add(1)
	s := srv.stream(b, fmt.Sprintf("/delivery/latency-%d", run))
	probe := newDeliveryProbe(1, 0, true) // counts nothing; reports every arrival
	configure(b, s, client.SubscriptionConfig{Name: "latency", Start: itx.StartNow, Receiver: receiver(run, probe)})
	events := benchEvents(1, 0)
	lat, acks := make([]time.Duration, b.N), make([]time.Duration, b.N)
	deliver := func(i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		t0 := time.Now()
		res, err := client.Append(ctx, s, events, itx.AppendOptions{})
		if err != nil {
			return err
		}
		if i >= 0 {
			acks[i] = time.Since(t0)
		}
		for {
			select {
			case a := <-probe.arrivals:
				if a.offset != res.Offsets[0] {
					continue // an older event delivered again
				}
				if i >= 0 {
					lat[i] = a.at.Sub(t0)
				}
				return nil
			case <-ctx.Done():
				return fmt.Errorf("offset %d never arrived", res.Offsets[0])
			}
		}
	}
	for i := 0; i < 20; i++ { // warm up: connections, statements, pools
		require.NoError(b, deliver(-1))
	}
	stopPerf := srv.perf(b)
	cpu := srv.cpuMeter(b)
	runWorkers(b, 1, func(_, i int) error { return deliver(i) })
	cpu.report(b)
	stopPerf()
	reportLatency(b, lat)
	reportLatencyAs(b, acks, "append-p50-us", 0.50)
	reportLatencyAs(b, acks, "append-p99-us", 0.99)
}

// reportLatencyAs reports one percentile of a latency sample under a unit of its own.
func reportLatencyAs(b *testing.B, lat []time.Duration, unit string, p float64) {
	sorted := append([]time.Duration(nil), lat...)
	slices.Sort(sorted)
	b.ReportMetric(float64(percentile(sorted, p).Microseconds()), unit)
}
