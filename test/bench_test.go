package test

// Benchmarks recorded in docs/benchmarks.md. Every figure except the in-process latency one is
// measured over real Cap'n Proto RPC on loopback TCP against a SEPARATE itxd process (built by
// TestMain) whose databases are durable (WAL, synchronous=FULL: an append is acknowledged after
// its group commit is fsynced). The load generator runs in this test process on the same
// machine, so client and server share its cores.
//
//	go test -run '^$' -bench . -benchtime 5s -timeout 60m ./test/      (make bench)
//
// Appends and reads report events/s; b.N counts RPC calls (ns/op is per call), except
// BenchmarkManyStreams, whose op is "touch 10,000 fresh streams once" and which reports the
// server's RSS.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// benchPayload is an ~85-byte JSON object, a typical small event.
func benchPayload(i int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"seq":%d,"user":"u-%04d","action":"clicked","target":"button-checkout","ok":true}`, i, i%1000))
}

func benchEvents(n, base int) []itx.EventInput {
	out := make([]itx.EventInput, n)
	for i := range out {
		out[i] = itx.EventInput{Type: "bench.event", Payload: benchPayload(base + i)}
	}
	return out
}

// benchItxd is a separate itxd process with its Prometheus endpoint on, for group-commit figures.
type benchItxd struct {
	*itxdProcess
	metrics string
}

// noBreaker lifts the per-stream circuit breaker (default: 100,000 burst, 100,000/s refill) so a
// benchmark measures the server, not the rate limit.
var noBreaker = []string{"--breaker-burst", "1000000000", "--breaker-refill-per-minute", "1000000000"}

func startBenchItxd(b testing.TB, extra ...string) *benchItxd {
	b.Helper()
	metrics := freeAddr(b)
	p := startItxd(b, b.TempDir(), append([]string{"--metrics", metrics}, extra...)...)
	return &benchItxd{itxdProcess: p, metrics: metrics}
}

// freeAddr is an address nothing listens on, for an itxd (or its metrics) to listen on next,
// maybe again after a restart: on a drawn loopback IP, which a parallel test's sockets never take
// meanwhile (itxtest.FreeLoopbackAddr).
func freeAddr(b testing.TB) string { return itxtest.FreeLoopbackAddr(b) }

// project dials, logs in and returns the project; everything closes when b ends.
func (s *benchItxd) project(b *testing.B) schema.Project {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, s.addr)
	require.NoError(b, err)
	p := c.Login(context.Background(), s.creds.ProjectToken)
	b.Cleanup(func() { p.Release(); c.Close() })
	return p
}

// stream returns a resolved stream capability on a connection of its own.
func (s *benchItxd) stream(b *testing.B, path string) schema.Stream {
	b.Helper()
	st := client.Stream(context.Background(), s.project(b), path)
	b.Cleanup(st.Release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(b, st.Resolve(ctx))
	return st
}

// scrape returns the sum of the samples of a metric (all label sets) from /metrics.
func (s *benchItxd) scrape(b testing.TB, name string) float64 {
	req, err := http.NewRequest(http.MethodGet, "http://"+s.metrics+"/metrics", nil)
	require.NoError(b, err)
	// Uncompressed: gzip's writer would make each scrape allocate a megabyte in itxd, noise in
	// the heap figures read from the same endpoint.
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(b, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(b, err)
	var sum float64
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, name) || strings.HasPrefix(line, "#") {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		require.NoError(b, err)
		sum += v
	}
	return sum
}

// commitStats snapshots the group-commit counters, to report calls and events per commit.
type commitStats struct{ calls, commits, events float64 }

func (s *benchItxd) commitStats(b *testing.B) commitStats {
	return commitStats{
		calls:   s.scrape(b, "itx_commit_calls_sum"),
		commits: s.scrape(b, "itx_commit_calls_count"),
		events:  s.scrape(b, "itx_commit_events_sum"),
	}
}

func reportCommits(b *testing.B, before, after commitStats) {
	if n := after.commits - before.commits; n > 0 {
		b.ReportMetric((after.calls-before.calls)/n, "calls/commit")
		b.ReportMetric((after.events-before.events)/n, "events/commit")
	}
}

// cpuMeter measures the CPU time the itxd process and this (client) process spend during a
// benchmark, reported in cores: on this 2-core machine server-cores + client-cores near 2 means
// the run is CPU-bound, well below 2 that it waits (on fsync).
//
// other-cores is the CPU every other process used meanwhile (from /proc/stat): anything well
// above 0.05 means something else ran on the machine and the figures of that run are not clean.
type cpuMeter struct {
	pid                   int
	server, client, total time.Duration
	start                 time.Time
}

func (s *benchItxd) cpuMeter(b *testing.B) *cpuMeter {
	m := &cpuMeter{pid: s.cmd.Process.Pid}
	m.server, m.client, m.total, m.start = procCPU(b, m.pid), selfCPU(b), machineCPU(b), time.Now()
	return m
}

func (m *cpuMeter) report(b *testing.B) {
	wall := time.Since(m.start).Seconds()
	server, client := procCPU(b, m.pid)-m.server, selfCPU(b)-m.client
	b.ReportMetric(server.Seconds()/wall, "server-cores")
	b.ReportMetric(client.Seconds()/wall, "client-cores")
	b.ReportMetric(max(0, (machineCPU(b)-m.total-server-client).Seconds()/wall), "other-cores")
}

// machineCPU is the busy CPU time of the whole machine (every core), from /proc/stat: user,
// nice, system, irq, softirq and steal.
func machineCPU(b *testing.B) time.Duration {
	raw, err := os.ReadFile("/proc/stat")
	require.NoError(b, err)
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += v
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// procCPU is the user+system CPU time of a process, from /proc/<pid>/stat (clock ticks of 10 ms).
func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	require.NoError(b, err)
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

func selfCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runWorkers runs b.N operations spread over workers goroutines (op(w, i) for the i-th operation,
// worker w), timing only the operations, and returns the elapsed time.
func runWorkers(b *testing.B, workers int, op func(w, i int) error) time.Duration {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	b.ResetTimer()
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				if err := op(w, i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return elapsed
}

func appendOnce(s schema.Stream, events []itx.EventInput) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := client.Append(ctx, s, events, itx.AppendOptions{})
	if err != nil {
		return err
	}
	if len(res.Offsets) != len(events) {
		return fmt.Errorf("append: %d offsets for %d events", len(res.Offsets), len(events))
	}
	return nil
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(float64(len(sorted))*p))]
}

func reportLatency(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	b.ReportMetric(float64(percentile(lat, 0.50).Microseconds()), "p50-us")
	b.ReportMetric(float64(percentile(lat, 0.99).Microseconds()), "p99-us")
}

// BenchmarkAppend measures durable appends to one stream of a separate itxd process.
func BenchmarkAppend(b *testing.B) {
	srv := startBenchItxd(b, noBreaker...)

	// One appender, one event per call, waiting for each acknowledgement.
	b.Run("sequential/1-event", func(b *testing.B) {
		s := srv.stream(b, "/bench/sequential")
		events := benchEvents(1, 0)
		require.NoError(b, appendOnce(s, events)) // creates the stream
		lat := make([]time.Duration, b.N)
		before, cpu := srv.commitStats(b), srv.cpuMeter(b)
		elapsed := runWorkers(b, 1, func(_, i int) error {
			t0 := time.Now()
			err := appendOnce(s, events)
			lat[i] = time.Since(t0)
			return err
		})
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
		reportLatency(b, lat)
		cpu.report(b)
		reportCommits(b, before, srv.commitStats(b))
	})

	// One producer, one event per call, 64 calls in flight on one capability (client.Appender):
	// the calls share group commits and still land in order.
	b.Run("pipelined-64/1-event", func(b *testing.B) {
		s := srv.stream(b, "/bench/pipelined")
		events := benchEvents(1, 0)
		require.NoError(b, appendOnce(s, events))
		a := client.NewAppender(s, 64)
		ctx := context.Background()
		before, cpu := srv.commitStats(b), srv.cpuMeter(b)
		start := time.Now()
		runWorkers(b, 1, func(_, _ int) error {
			_, err := a.Append(ctx, events, itx.AppendOptions{})
			return err
		})
		require.NoError(b, a.Flush(ctx)) // the last answers are part of the run
		elapsed := time.Since(start)
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
		cpu.report(b)
		reportCommits(b, before, srv.commitStats(b))
	})

	// 64 independent appenders, one event per call: each has its own TCP connection, login and
	// stream capability, like 64 client processes or services writing to one stream.
	b.Run("concurrent-64-conns/1-event", func(b *testing.B) {
		benchConcurrentAppend(b, srv, "/bench/concurrent-conns", 64, 64)
	})

	// The same 64 appenders multiplexed on 4 connections (16 capabilities each), like a few
	// application servers each running many request handlers.
	b.Run("concurrent-64-on-4-conns/1-event", func(b *testing.B) {
		benchConcurrentAppend(b, srv, "/bench/concurrent-shared", 64, 4)
	})

	// One appender, 100 events per call (one atomic batch).
	b.Run("sequential/100-events", func(b *testing.B) {
		s := srv.stream(b, "/bench/batch")
		events := benchEvents(100, 0)
		require.NoError(b, appendOnce(s, events))
		before, cpu := srv.commitStats(b), srv.cpuMeter(b)
		elapsed := runWorkers(b, 1, func(_, _ int) error { return appendOnce(s, events) })
		b.ReportMetric(float64(b.N*100)/elapsed.Seconds(), "events/s")
		cpu.report(b)
		reportCommits(b, before, srv.commitStats(b))
	})

	// Four appenders on their own connections, 100 events per call.
	b.Run("concurrent-4-conns/100-events", func(b *testing.B) {
		streams := make([]schema.Stream, 4)
		for w := range streams {
			streams[w] = srv.stream(b, "/bench/batch-concurrent")
		}
		events := benchEvents(100, 0)
		require.NoError(b, appendOnce(streams[0], events))
		before, cpu := srv.commitStats(b), srv.cpuMeter(b)
		elapsed := runWorkers(b, len(streams), func(w, _ int) error { return appendOnce(streams[w], events) })
		b.ReportMetric(float64(b.N*100)/elapsed.Seconds(), "events/s")
		cpu.report(b)
		reportCommits(b, before, srv.commitStats(b))
	})
}

func benchConcurrentAppend(b *testing.B, srv *benchItxd, path string, workers, conns int) {
	projects := make([]schema.Project, conns)
	for c := range projects {
		projects[c] = srv.project(b)
	}
	streams := make([]schema.Stream, workers)
	for w := range streams {
		streams[w] = client.Stream(context.Background(), projects[w%conns], path)
		b.Cleanup(streams[w].Release)
	}
	events := benchEvents(1, 0)
	for _, s := range streams {
		require.NoError(b, appendOnce(s, events)) // resolves every capability, creates the stream
	}
	before, cpu := srv.commitStats(b), srv.cpuMeter(b)
	elapsed := runWorkers(b, workers, func(w, _ int) error { return appendOnce(streams[w], events) })
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
	cpu.report(b)
	reportCommits(b, before, srv.commitStats(b))
}

// readPrefill is how many events BenchmarkRead's stream holds.
const readPrefill = 100_000

// BenchmarkRead measures catch-up reads in 100-event pages (getEventPage, limit 100) over a
// pre-filled stream: each reader pages from the start to the head and starts over.
func BenchmarkRead(b *testing.B) {
	srv := startBenchItxd(b, noBreaker...)
	const path = "/bench/read"
	{
		s := srv.stream(b, path)
		for i := 0; i < readPrefill; i += 100 {
			require.NoError(b, appendOnce(s, benchEvents(100, i)))
		}
	}
	for _, readers := range []int{1, 4} {
		b.Run(fmt.Sprintf("readers-%d/page-100", readers), func(b *testing.B) {
			streams := make([]schema.Stream, readers)
			cursors := make([]int64, readers)
			for r := range streams {
				streams[r] = srv.stream(b, path)
				cursors[r] = int64(r * readPrefill / readers) // spread the readers over the stream
			}
			var events atomic.Int64
			cpu := srv.cpuMeter(b)
			elapsed := runWorkers(b, readers, func(r, _ int) error {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				page, err := client.GetEventPage(ctx, streams[r], itx.Query{After: cursors[r], Limit: 100})
				if err != nil {
					return err
				}
				if len(page.Events) != 100 && page.NextAfter != readPrefill {
					return fmt.Errorf("short page: %d events after %d", len(page.Events), cursors[r])
				}
				events.Add(int64(len(page.Events)))
				if cursors[r] = page.NextAfter; cursors[r] >= readPrefill {
					cursors[r] = 0
				}
				return nil
			})
			cpu.report(b)
			b.ReportMetric(float64(events.Load())/elapsed.Seconds(), "events/s")
		})
	}
}

// manyStreams is how many streams BenchmarkManyStreams touches per op (ITX_BENCH_STREAMS
// overrides it, for diagnosis only).
var manyStreams = func() int {
	if n, err := strconv.Atoi(os.Getenv("ITX_BENCH_STREAMS")); err == nil && n > 0 {
		return n
	}
	return 10_000
}()

// BenchmarkManyStreams appends one event to each of 10,000 fresh streams (one op) and reports the
// itxd process's RSS (VmRSS) after the run, and, with a short idle timeout, after the idle sweep
// unloaded every actor. Each op starts a fresh itxd.
func BenchmarkManyStreams(b *testing.B) {
	b.Run("default-flags", func(b *testing.B) { benchManyStreams(b, 0) })
	b.Run("idle-timeout-2s", func(b *testing.B) { benchManyStreams(b, 2*time.Second, "--idle-timeout", "2s") })
}

func benchManyStreams(b *testing.B, idle time.Duration, extra ...string) {
	const workers = 32
	b.StopTimer()
	var rssRun, rssSweep, peak, loadedRun, loadedSweep float64
	var touch time.Duration
	for op := 0; op < b.N; op++ {
		srv := startBenchItxd(b, extra...)
		projects := make([]schema.Project, workers)
		streamsCaps := make([]schema.Streams, workers)
		for w := range projects {
			projects[w] = srv.project(b)
			sf, release := projects[w].Streams(context.Background(), nil)
			streamsCaps[w] = sf.Streams().AddRef()
			release()
			b.Cleanup(streamsCaps[w].Release)
		}
		events := benchEvents(1, 0)
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		cpu := srv.cpuMeter(b)
		b.StartTimer()
		start := time.Now()
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1)) - 1
					if i >= manyStreams {
						return
					}
					if err := appendToFresh(streamsCaps[w], fmt.Sprintf("/many/s%05d", i), events); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		touch += time.Since(start)
		b.StopTimer()
		cpu.report(b)
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}

		pid := srv.cmd.Process.Pid
		rssRun = procStatusMB(b, pid, "VmRSS")
		loadedRun = srv.scrape(b, "itx_loaded_streams")
		rssSweep, loadedSweep = rssRun, loadedRun
		srv.logMemory(b, "after run")
		if idle > 0 {
			// Wait for the idle sweep (every idle/4) to unload every actor, then a little longer
			// for the Go runtime to hand freed memory back.
			deadline := time.Now().Add(idle + 30*time.Second)
			for srv.scrape(b, "itx_loaded_streams") > 0 && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
			time.Sleep(5 * time.Second)
			rssSweep = procStatusMB(b, pid, "VmRSS")
			loadedSweep = srv.scrape(b, "itx_loaded_streams")
			srv.logMemory(b, "after sweep")
		}
		peak = procStatusMB(b, pid, "VmHWM")
		// Diagnosis only: keep the process alive to inspect it (gdb -p, see docs/benchmarks.md).
		if hold, err := time.ParseDuration(os.Getenv("ITX_BENCH_HOLD")); err == nil {
			fmt.Fprintf(os.Stderr, "holding itxd pid %d for %s\n", pid, hold)
			time.Sleep(hold)
		}
		require.NoError(b, srv.stop(b))
	}
	b.ReportMetric(float64(manyStreams*b.N)/touch.Seconds(), "streams/s")
	b.ReportMetric(rssRun, "rss-after-run-MB")
	b.ReportMetric(loadedRun, "loaded-after-run")
	if idle > 0 {
		b.ReportMetric(rssSweep, "rss-after-sweep-MB")
		b.ReportMetric(loadedSweep, "loaded-after-sweep")
	}
	b.ReportMetric(peak, "peak-rss-MB")
}

// appendToFresh pipelines streams.get(path).append(event): two calls, one round trip.
func appendToFresh(streams schema.Streams, path string, events []itx.EventInput) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	gf, releaseGet := streams.Get(ctx, func(p schema.Streams_get_Params) error { return p.SetPath(path) })
	defer releaseGet()
	return appendOnce(gf.Stream(), events)
}

// logMemory logs where the server's memory is: Go heap and runtime versus the rest (SQLite's C
// heap, mappings), and the goroutine count.
func (s *benchItxd) logMemory(b *testing.B, when string) {
	pid := s.cmd.Process.Pid
	mb := func(name string) float64 { return s.scrape(b, name) / (1 << 20) }
	b.Logf("itxd %s: VmRSS %.0f MB (anon %.0f, file %.0f, shmem %.0f); Go: sys %.0f MB, heap in use %.0f MB, heap released %.0f MB; goroutines %.0f; open fds %.0f; loaded streams %.0f",
		when, procStatusMB(b, pid, "VmRSS"), procStatusMB(b, pid, "RssAnon"), procStatusMB(b, pid, "RssFile"),
		procStatusMB(b, pid, "RssShmem"), mb("go_memstats_sys_bytes"), mb("go_memstats_heap_inuse_bytes"),
		mb("go_memstats_heap_released_bytes"), s.scrape(b, "go_goroutines"), s.scrape(b, "process_open_fds"),
		s.scrape(b, "itx_loaded_streams"))
}

// procStatusMB reads a kB field of /proc/<pid>/status, in MB.
func procStatusMB(b *testing.B, pid int, field string) float64 {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	require.NoError(b, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			require.NoError(b, err)
			return kb / 1024
		}
	}
	b.Fatalf("%s not in /proc/%d/status", field, pid)
	return 0
}

// BenchmarkInProcessAppendLatency is one sequential appender, one event per call, against an
// in-process server on loopback TCP (RPC and fsync included, no second process).
func BenchmarkInProcessAppendLatency(b *testing.B) {
	ts := startServer(b, server.Config{})
	s := stream(b, ts.project(b), "/bench/latency")
	events := benchEvents(1, 0)
	require.NoError(b, appendOnce(s, events))
	lat := make([]time.Duration, b.N)
	elapsed := runWorkers(b, 1, func(_, i int) error {
		t0 := time.Now()
		err := appendOnce(s, events)
		lat[i] = time.Since(t0)
		return err
	})
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
	reportLatency(b, lat)
}
