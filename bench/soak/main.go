// Command soak runs a mixed workload against a separate itxd for a while and watches it: whether
// its memory, goroutines and file descriptors settle or keep growing, and whether every
// acknowledged event reached every consumer, optionally with itxd killed (SIGKILL) and restarted
// on the same data directory along the way. See docs/benchmarks.md, "Soak".
//
// The load, all at once, over real RPC and a real HTTP receiver:
//   - appenders on /soak/a, /soak/b and /soak/fwd (1-5 events per call, every 7th call under
//     idempotency keys, half of those sent twice so the server answers duplicates);
//   - /soak/a delivered to a webhook in batches of up to 100 (failing 0.5% of its requests, so the
//     retry ladder runs), to /soak/copy (copy-to-stream); inbox messages on /soak/fwd to the
//     in-process forwarder processor;
//   - a follower (client.Follow) on each of /soak/a and /soak/b from offset 0;
//   - churn: new RPC sessions that log in, open a connection at a random offset and check what
//     arrives, watch /soak/a's live state, register and move readers, then either close
//     everything or drop the TCP connection;
//   - ephemeral appends on /soak/eph, with a connection taking them;
//   - single appends to random streams of /soak/many/, more of them than itxd may keep loaded.
//
// With -crash-every, itxd is killed with SIGKILL at that interval and started again on the same
// data directory and address; the clients redial, and an append that failed under an
// idempotency key is sent again, so its answer says whether the killed itxd had committed it.
//
// With -remotehost (the processors/examples/remotehost binary), the reference processors also
// run in that separate program, placed remote (remote.go): prompts to -agents agent streams,
// some retracted, whose vendor is an HTTP server here that answers 503 to 5% of calls and hangs
// on 3% until the caller gives up; inbox messages to a remote forwarder, messages to a remote
// router with five threads, signatures to a remote guestbook. -host-crash-every kills that
// program with SIGKILL and starts it again, on its own schedule beside -crash-every's.
//
// At the end it stops the load, waits for the consumers to catch up and checks: every
// acknowledged event is in its stream once; the webhook saw every offset of /soak/a; /soak/copy
// holds one copy of each; the forwarder forwarded each inbox message exactly once; each follower
// saw every offset in order, once. With -remotehost, once every prompt has its outcome: each
// message requested once (a body that is a function of the message) and settled once (none for
// one retracted before its request; a cancellation only for a retracted one); the vendor called
// at most once per request, with the request id as its Idempotency-Key, after its started fact
// and before its expiry; a success carrying the vendor's answer; each remote forward and route
// landed once; every remote processor active, caught up, and its snapshot its contract's Reduce
// folded over its log. It exits 1 if any check fails.
//
//	cd bench && go build -o /tmp/itxd ../cmd/itxd && go run ./soak -itxd /tmp/itxd -duration 10m [-crash-every 1m]
//	  [-remotehost /tmp/remotehost -host-crash-every 25s]   # go build -o /tmp/remotehost ../processors/examples/remotehost
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/storage"
)

var failed atomic.Bool

// raceMarker starts each report of Go's race detector: a soak of binaries built with -race
// fails on one (itxd's stderr is watched, the remotehost's log read at the end).
const raceMarker = "WARNING: DATA RACE"

// raceWatch passes what it is given on to w, noting whether raceMarker went by.
type raceWatch struct {
	w    io.Writer
	mu   sync.Mutex
	tail []byte // the last bytes written, for a marker cut across two writes
	seen atomic.Bool
}

func (r *raceWatch) Write(p []byte) (int, error) {
	r.mu.Lock()
	buf := append(r.tail, p...)
	if bytes.Contains(buf, []byte(raceMarker)) {
		r.seen.Store(true)
	}
	r.tail = append([]byte(nil), buf[max(0, len(buf)-len(raceMarker)):]...)
	r.mu.Unlock()
	return r.w.Write(p)
}

// itxdStderr is every itxd process's stderr.
var itxdStderr = &raceWatch{w: os.Stderr}

func fail(format string, args ...any) {
	failed.Store(true)
	fmt.Printf("FAIL: "+format+"\n", args...)
}

func must(err error, what string) {
	if err != nil {
		fmt.Printf("fatal: %s: %v\n", what, err)
		exit(2)
	}
}

// atExit holds what exit undoes (the itxd it started, the data directory), newest first: a
// failed soak must not leave its server running.
var atExit []func()

func exit(code int) {
	for i := len(atExit) - 1; i >= 0; i-- {
		atExit[i]()
	}
	os.Exit(code)
}

// interruptions counts calls that failed while itxd was being killed (-crash-every), by message.
var interruptions = struct {
	sync.Mutex
	byMsg map[string]int
}{byMsg: map[string]int{}}

// lost is an error of a call made while itxd may have been killed: a failure without
// -crash-every, counted with -crash-every.
func lost(crashing bool, err error, format string, args ...any) {
	if !crashing {
		fail(format+": %v", append(args, err)...)
		return
	}
	msg := err.Error()
	if len(msg) > 80 {
		msg = msg[:80]
	}
	interruptions.Lock()
	interruptions.byMsg[msg]++
	interruptions.Unlock()
}

// metrics reads the values of the named metrics (without labels) from itxd's /metrics.
func metrics(addr string, names ...string) map[string]float64 {
	out := map[string]float64{}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && want[f[0]] {
			v, _ := strconv.ParseFloat(f[1], 64)
			out[f[0]] = v
		}
	}
	return out
}

type sample struct {
	at                time.Duration
	rssMB, goroutines float64
	fds               float64
	loaded, rpcConns  float64 // itx_loaded_streams, itx_rpc_connections
	streamConns       float64 // itx_open_connections
	appended          int64
	restarts          int64
}

func (s sample) String() string {
	if s.goroutines == 0 {
		return fmt.Sprintf("%6.0fs  (itxd's metrics did not answer: being restarted)  appended %d  restarts %d", s.at.Seconds(), s.appended, s.restarts)
	}
	return fmt.Sprintf("%6.0fs  rss %6.1f MB  goroutines %5.0f  fds %4.0f  loaded streams %3.0f  rpc conns %3.0f  stream conns %3.0f  appended %d  restarts %d",
		s.at.Seconds(), s.rssMB, s.goroutines, s.fds, s.loaded, s.rpcConns, s.streamConns, s.appended, s.restarts)
}

// itxd is the server under test: started, and with -crash-every killed and started again on
// the same data directory and address.
type itxd struct {
	bin, data, metrics string
	listen             string // "127.0.0.1:0" until the first start, then its address
	maxLoaded          int
	backups            string        // --backup-dir ("": none)
	backupEvery        time.Duration // --backup-every
	cmd                *exec.Cmd
	restarts           atomic.Int64
}

func (d *itxd) start() error {
	addrFile := filepath.Join(d.data, "addr")
	os.Remove(addrFile)
	cmd := exec.Command(d.bin, "--listen", d.listen, "--data", d.data, "--addr-file", addrFile,
		"--log-level", "error", "--metrics", d.metrics, "--processors", "forwarder", "--max-loaded-streams", strconv.Itoa(d.maxLoaded))
	if d.backups != "" {
		cmd.Args = append(cmd.Args, "--backup-dir", d.backups, "--backup-every", d.backupEvery.String(), "--backup-keep", "3")
	}
	if d.cmd == nil {
		cmd.Stdout = os.Stdout // the first start prints how to connect
	}
	cmd.Stderr = itxdStderr
	if err := cmd.Start(); err != nil {
		return err
	}
	d.cmd = cmd
	for start := time.Now(); ; {
		if b, _ := os.ReadFile(addrFile); len(b) > 0 {
			d.listen = string(b)
			return nil
		}
		if time.Since(start) > time.Minute {
			return fmt.Errorf("no address after a minute")
		}
		time.Sleep(10 * time.Millisecond) // polling a file another process writes
	}
}

func (d *itxd) kill() {
	if d.cmd == nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGKILL)
	d.cmd.Wait()
}

// ledger is what the load generator knows was acknowledged: per stream, the offsets the
// server gave events that were new (not duplicates).
type ledger struct {
	mu      sync.Mutex
	offsets map[string]map[int64]bool
	count   atomic.Int64
}

// add records an answer. recovered: the call is a retry of one whose answer was lost to a kill,
// so a duplicate may name an offset the ledger never saw (the killed itxd committed it).
func (l *ledger) add(path string, r itx.AppendResult, recovered bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.offsets[path]
	if m == nil {
		m = map[int64]bool{}
		l.offsets[path] = m
	}
	for i, off := range r.Offsets {
		if r.Duplicate[i] && m[off] {
			continue
		}
		if r.Duplicate[i] && !recovered {
			fail("%s: duplicate answered with offset %d, which no acknowledged append holds", path, off)
			continue
		}
		if m[off] {
			fail("%s: offset %d acknowledged twice as new", path, off)
		}
		m[off] = true
		l.count.Add(1)
	}
}

// seen tracks offsets a consumer received, and whether they came in order without gaps.
type seen struct {
	mu    sync.Mutex
	got   map[int64]int
	last  int64
	order bool // check strictly contiguous arrival
	name  string
}

func (s *seen) take(offs ...int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range offs {
		if s.order && o != s.last+1 {
			fail("%s: offset %d arrived after %d", s.name, o, s.last)
		}
		s.last = o
		s.got[o]++
	}
}

func (s *seen) lastOffset() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// session is one client's RPC connection and login, with the streams it opened.
type session struct {
	conn    *client.Conn
	project schema.Project
	streams map[string]schema.Stream
}

func (s *session) stream(ctx context.Context, path string) schema.Stream {
	if st, ok := s.streams[path]; ok {
		return st
	}
	st := client.Stream(ctx, s.project, path)
	s.streams[path] = st
	return st
}

func (s *session) close() {
	for _, st := range s.streams {
		st.Release()
	}
	s.conn.Close()
}

func main() {
	bin := flag.String("itxd", "/tmp/itxd", "the itxd binary to start")
	dir := flag.String("dir", os.TempDir(), "where the data directory goes")
	duration := flag.Duration("duration", 5*time.Minute, "how long the load runs")
	every := flag.Duration("sample", 15*time.Second, "how often itxd's footprint is printed")
	appenders := flag.Int("appenders", 4, "concurrent appenders")
	churners := flag.Int("churners", 2, "goroutines opening and dropping sessions, connections, live views and readers")
	crashEvery := flag.Duration("crash-every", 0, "kill itxd with SIGKILL and start it again at this interval (0: never)")
	many := flag.Int("many", 500, "streams /soak/many/0.. that one more appender writes to at random, more than -max-loaded so itxd keeps unloading and loading them (0: none)")
	maxLoaded := flag.Int("max-loaded", 50, "itxd's --max-loaded-streams")
	metricsAddr := flag.String("metrics", "127.0.0.1:7941", "itxd's metrics address")
	keep := flag.Bool("keep", false, "keep the data directory")
	backupEvery := flag.Duration("backup-every", 0, "have itxd write a scheduled backup this often (at least 1m; 0: none), and check the newest against the live streams at the end")
	listen := flag.String("listen", "127.0.0.1:0", "itxd's RPC address (port 0: one the system picks, kept across restarts)")
	hookListen := flag.String("webhook-listen", "127.0.0.1:0", "the webhook receiver's address")
	remoteBin := flag.String("remotehost", "", "the processors/examples/remotehost binary: run the reference processors (agent, forwarder, router, guestbook) in it, placed remote, and check their work (empty: none)")
	hostCrashEvery := flag.Duration("host-crash-every", 0, "with -remotehost, kill it with SIGKILL at about this interval and start it again (0: never)")
	vendorListen := flag.String("vendor-listen", "127.0.0.1:0", "with -remotehost, the address of the agent's vendor (an HTTP server in this program)")
	agents := flag.Int("agents", 4, "with -remotehost, agent streams to prompt")
	promptEvery := flag.Duration("prompt-every", 250*time.Millisecond, "with -remotehost, the pause between two prompts to one agent stream")
	agentHesitation := flag.Duration("agent-hesitation", 200*time.Millisecond, "with -remotehost, the agent's hesitation window (remotehost --agent-hesitation)")
	agentExpiry := flag.Duration("agent-expiry", 45*time.Second, "with -remotehost, a request's lifetime (remotehost --agent-expiry): a hung vendor call ends with it")
	flag.Parse()
	crashing := *crashEvery > 0

	data, err := os.MkdirTemp(*dir, "soak-data")
	must(err, "data directory")
	if !*keep {
		atExit = append(atExit, func() { os.RemoveAll(data) })
	} else {
		fmt.Println("data directory:", data)
	}
	srv := &itxd{bin: *bin, data: data, metrics: *metricsAddr, listen: *listen, maxLoaded: *maxLoaded}
	if *backupEvery > 0 {
		srv.backups, srv.backupEvery = data+"-backups", *backupEvery
		must(os.Mkdir(srv.backups, 0o700), "backup folder")
		if !*keep {
			atExit = append(atExit, func() { os.RemoveAll(srv.backups) })
		}
	}
	atExit = append(atExit, srv.kill)
	must(srv.start(), "start itxd")
	addr := srv.listen
	var creds struct{ ProjectToken, ProjectID string }
	b, err := os.ReadFile(filepath.Join(data, "credentials.json"))
	must(err, "credentials")
	must(json.Unmarshal(b, &creds), "credentials")

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	dial := func(ctx context.Context) (*session, error) {
		c, err := client.Dial(ctx, addr)
		if err != nil {
			return nil, err
		}
		return &session{conn: c, project: c.Login(ctx, creds.ProjectToken), streams: map[string]schema.Stream{}}, nil
	}
	// redial dials until it succeeds or ctx ends (nil then).
	redial := func(ctx context.Context) *session {
		bo := client.NewBackoff(20*time.Millisecond, time.Second)
		for ctx.Err() == nil {
			s, err := dial(ctx)
			if err == nil {
				return s
			}
			client.Sleep(ctx, bo.Next(0))
		}
		return nil
	}
	setup, err := dial(ctx)
	must(err, "dial")
	for _, p := range []string{"/soak/a", "/soak/b", "/soak/fwd", "/soak/eph"} {
		_, err := client.Append(ctx, setup.stream(ctx, p), []itx.EventInput{{Type: "soak/start"}}, itx.AppendOptions{})
		must(err, "create stream")
	}
	led := &ledger{offsets: map[string]map[int64]bool{}}

	// The webhook: every offset it is given, failing 0.5% of requests.
	hook := &seen{got: map[int64]int{}, name: "webhook"}
	ln, err := net.Listen("tcp", *hookListen)
	must(err, "webhook listener")
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if rand.IntN(200) == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		var wb itx.WebhookBatchBody
		if err := json.Unmarshal(body, &wb); err != nil || len(wb.Events) == 0 {
			fail("webhook body: %v (%d events)", err, len(wb.Events))
		}
		for _, e := range wb.Events {
			hook.take(e.Offset)
		}
	}))
	subsA := client.Subscriptions(ctx, setup.stream(ctx, "/soak/a"))
	_, _, err = client.ConfigureSubscription(ctx, subsA, client.SubscriptionConfig{Name: "hook", MaxDeliveryEvents: 100,
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: "http://" + ln.Addr().String() + "/"}})
	must(err, "configure webhook")
	_, _, err = client.ConfigureSubscription(ctx, subsA, client.SubscriptionConfig{Name: "copy",
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/soak/copy"}})
	must(err, "configure copy")
	_, _, err = client.ConfigureSubscription(ctx, client.Subscriptions(ctx, setup.stream(ctx, "/soak/fwd")), client.SubscriptionConfig{Name: "forwarder",
		Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}})
	must(err, "configure forwarder")
	var remote *remoteLoad
	if *remoteBin != "" {
		logPath := data + "-remotehost.log"
		atExit = append(atExit, func() {
			if !*keep { // read at exit: a data race the remotehost reported keeps it
				os.Remove(logPath)
			}
		})
		if *keep {
			fmt.Println("remotehost log:", logPath)
		}
		remote = startRemote(ctx, setup, addr, creds.ProjectToken, *remoteBin, *vendorListen, logPath, *agents, *agentHesitation, *agentExpiry)
		atExit = append(atExit, remote.host.kill)
	}
	setup.close()

	// Followers from 0: every offset, in order, once, across itxd's restarts. /soak/a and /soak/b
	// hold only durable events, so their offsets have no gaps.
	followers := map[string]*seen{
		"/soak/a": {got: map[int64]int{}, order: true, name: "follower of /soak/a"},
		"/soak/b": {got: map[int64]int{}, order: true, name: "follower of /soak/b"},
	}
	follow, endFollow := context.WithCancel(ctx)
	var followWG sync.WaitGroup
	for path, f := range followers {
		followWG.Go(func() {
			_, err := client.Follow(follow, client.FollowConfig{Addr: addr, Token: creds.ProjectToken, Path: path,
				MinBackoff: 20 * time.Millisecond, MaxBackoff: time.Second, Connection: client.ConnectionOptions{OpenedBy: "soak"}},
				func(_ context.Context, batch itx.DeliveryBatch) error {
					for _, e := range batch.Events {
						f.take(e.Offset)
					}
					return nil
				})
			if !errors.Is(err, context.Canceled) {
				fail("%s stopped: %v", f.name, err)
			}
		})
	}

	begin := time.Now()
	var samples []sample
	takeSample := func() sample {
		m := metrics(*metricsAddr, "process_resident_memory_bytes", "go_goroutines", "process_open_fds",
			"itx_loaded_streams", "itx_rpc_connections", "itx_open_connections")
		s := sample{at: time.Since(begin), rssMB: m["process_resident_memory_bytes"] / (1 << 20), goroutines: m["go_goroutines"],
			fds: m["process_open_fds"], loaded: m["itx_loaded_streams"], rpcConns: m["itx_rpc_connections"],
			streamConns: m["itx_open_connections"], appended: led.count.Load(), restarts: srv.restarts.Load()}
		samples = append(samples, s)
		return s
	}
	fmt.Println(takeSample())

	load, endLoad := context.WithTimeout(ctx, *duration)
	defer endLoad()
	var wg sync.WaitGroup
	if crashing {
		wg.Go(func() {
			for client.Sleep(load, *crashEvery) == nil {
				srv.kill()
				if err := srv.start(); err != nil {
					fail("restart itxd: %v", err)
					endLoad()
					return
				}
				srv.restarts.Add(1)
			}
		})
	}
	payload := `"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"`
	for w := 0; w < *appenders; w++ {
		wg.Go(func() { appender(load, redial, led, crashing, w, payload) })
	}
	if *many > 0 {
		wg.Go(func() { manyAppender(load, redial, led, crashing, *many) })
	}
	if remote != nil {
		for _, al := range remote.agents {
			wg.Go(func() { remote.promptLoop(load, redial, crashing, al, *promptEvery) })
		}
		wg.Go(func() { remote.feedLoop(load, redial, crashing) })
		if *hostCrashEvery > 0 {
			wg.Go(func() { remote.crashLoop(load, *hostCrashEvery) })
		}
	}
	// Ephemeral events, with a connection that takes them.
	wg.Go(func() {
		for load.Err() == nil {
			s := redial(load)
			if s == nil {
				return
			}
			st := s.stream(load, "/soak/eph")
			c, err := client.OpenConnection(load, st, client.ConnectionOptions{OpenedBy: "soak-ephemeral"}, client.ConnectionHandler{
				Deliver: func(context.Context, itx.DeliveryBatch) error { return nil }})
			if err != nil {
				lost(crashing, err, "open ephemeral connection")
			}
			for i := 0; err == nil && load.Err() == nil; i++ {
				_, err = client.Append(load, st, []itx.EventInput{{Type: "soak/chunk", Ephemeral: i%10 != 0,
					Payload: json.RawMessage(fmt.Sprintf(`{"i":%d,%s}`, i, payload))}}, itx.AppendOptions{})
				if err != nil && !over(load) {
					lost(crashing, err, "ephemeral append")
				}
			}
			if c != nil {
				c.Release()
			}
			s.close()
		}
	})
	var churned atomic.Int64
	for w := 0; w < *churners; w++ {
		wg.Go(func() {
			bo := client.NewBackoff(20*time.Millisecond, time.Second)
			for i := 0; load.Err() == nil; i++ {
				if churn(load, dial, crashing, w, i) {
					churned.Add(1)
					bo = client.NewBackoff(20*time.Millisecond, time.Second)
				} else {
					client.Sleep(load, bo.Next(0)) // itxd is down (-crash-every): no tight loop of refused dials
				}
			}
		})
	}
	tick := time.NewTicker(*every)
	for waiting := true; waiting; {
		select {
		case <-tick.C:
			fmt.Println(takeSample())
		case <-load.Done():
			waiting = false
		}
	}
	tick.Stop()
	wg.Wait()
	fmt.Printf("load stopped after %v: %d events acknowledged, %d churn rounds, %d restarts of itxd\n",
		time.Since(begin).Round(time.Second), led.count.Load(), churned.Load(), srv.restarts.Load())
	if crashing {
		interruptions.Lock()
		var msgs []string
		for m, n := range interruptions.byMsg {
			msgs = append(msgs, fmt.Sprintf("%6d  %s", n, m))
		}
		interruptions.Unlock()
		sort.Strings(msgs)
		fmt.Printf("calls failed by the kills:\n%s\n", strings.Join(msgs, "\n"))
	}
	verify(addr, creds.ProjectToken, led, hook, followers, *many)
	if remote != nil {
		fmt.Printf("remote processors' streams: %d events acknowledged\n", remote.appended.Load())
		remote.verify(addr, creds.ProjectToken, *agentExpiry)
	}
	if srv.backups != "" {
		verifyBackup(srv.backups, addr, creds.ProjectToken, creds.ProjectID)
	}
	endFollow()
	followWG.Wait()

	// The footprint once the churn is over, and again after a few idle seconds (itxd closes a
	// stream's idle SQLite readers after storage.ReaderIdleTime): what the load left behind.
	fmt.Println(takeSample())
	time.Sleep(5 * time.Second)
	final := takeSample()
	fmt.Println(final)
	first := samples[0]
	peak := first
	for _, s := range samples {
		if s.rssMB > peak.rssMB {
			peak = s
		}
	}
	fmt.Printf("footprint: goroutines %.0f at start, %.0f after the load and 5 s idle; fds %.0f -> %.0f; loaded streams %.0f -> %.0f; rss %.1f -> %.1f MB (peak %.1f at %.0fs)\n",
		first.goroutines, final.goroutines, first.fds, final.fds, first.loaded, final.loaded, first.rssMB, final.rssMB, peak.rssMB, peak.at.Seconds())
	if itxdStderr.seen.Load() {
		fail("itxd reported a data race (built with -race; see its report above)")
	}
	if remote != nil && remote.host.raceReported() {
		fail("the remotehost reported a data race (built with -race; its log: %s, kept)", remote.host.log.Name())
		*keep = true
	}
	if failed.Load() {
		fmt.Println("soak: FAILED")
		exit(1)
	}
	fmt.Println("soak: ok")
	exit(0)
}

// appender appends to /soak/a, /soak/b and /soak/fwd in turn until ctx ends. With crashing, a
// failed call is counted and, when its events carry idempotency keys, sent again on a new session:
// its answer says which of them the killed itxd had committed.
func appender(ctx context.Context, redial func(context.Context) *session, led *ledger, crashing bool, w int, payload string) {
	s := redial(ctx)
	if s == nil {
		return
	}
	defer func() {
		if s != nil {
			s.close()
		}
	}()
	var retry []itx.EventInput
	var retryPath string
	for i := 0; ctx.Err() == nil; i++ {
		path := []string{"/soak/a", "/soak/b", "/soak/fwd"}[i%3]
		var events []itx.EventInput
		recovered := retry != nil
		if recovered {
			path, events, retry = retryPath, retry, nil
		} else {
			events = make([]itx.EventInput, 1+rand.IntN(5))
			for j := range events {
				events[j] = itx.EventInput{Type: "soak/event", Payload: json.RawMessage(fmt.Sprintf(`{"w":%d,"i":%d,"j":%d,%s}`, w, i, j, payload))}
				if path == "/soak/fwd" {
					events[j].Type = "inbox/message"
				}
				if i%7 == 0 {
					events[j].IdempotencyKey = fmt.Sprintf("w%d-%d-%d", w, i, j)
				}
			}
		}
		r, err := client.Append(ctx, s.stream(ctx, path), events, itx.AppendOptions{})
		if err != nil {
			if over(ctx) {
				return
			}
			lost(crashing, err, "append to %s", path)
			if !crashing {
				return
			}
			if events[0].IdempotencyKey != "" {
				retry, retryPath = events, path
			}
			s.close()
			if s = redial(ctx); s == nil {
				return
			}
			continue
		}
		led.add(path, r, recovered)
		if events[0].IdempotencyKey != "" && i%2 == 0 { // the same call again: every event a duplicate
			r2, err := client.Append(ctx, s.stream(ctx, path), events, itx.AppendOptions{})
			if err == nil {
				for k, d := range r2.Duplicate {
					if !d || r2.Offsets[k] != r.Offsets[k] {
						fail("%s: retried key %s answered offset %d duplicate=%v, first %d", path, events[k].IdempotencyKey, r2.Offsets[k], d, r.Offsets[k])
					}
				}
				led.add(path, r2, false)
			}
		}
	}
}

// manyAppender appends one event at a time to a random stream of /soak/many/0..n-1, each on a
// stream handle of its own, so itxd (with fewer loaded streams allowed) keeps unloading idle
// streams and loading them again.
func manyAppender(ctx context.Context, redial func(context.Context) *session, led *ledger, crashing bool, n int) {
	s := redial(ctx)
	for i := 0; s != nil && ctx.Err() == nil; i++ {
		path := fmt.Sprintf("/soak/many/%d", rand.IntN(n))
		st := client.Stream(ctx, s.project, path)
		r, err := client.Append(ctx, st, []itx.EventInput{{Type: "soak/event", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}}, itx.AppendOptions{})
		st.Release()
		if err == nil {
			led.add(path, r, false)
			continue
		}
		if over(ctx) {
			break
		}
		lost(crashing, err, "append to %s", path)
		if !crashing {
			break
		}
		s.close()
		s = redial(ctx)
	}
	if s != nil {
		s.close()
	}
}

// readMissing reads the whole stream at path and counts the acknowledged offsets it does not
// hold. The stream's handle is released at once: held, itxd could not unload the stream.
func readMissing(ctx context.Context, project schema.Project, path string, acked map[int64]bool) (events []itx.Event, missing int) {
	st := client.Stream(ctx, project, path)
	events, err := client.ReadAll(ctx, st, itx.Query{})
	st.Release()
	must(err, "read "+path)
	stored := make(map[int64]bool, len(events))
	for _, e := range events {
		stored[e.Offset] = true
	}
	for off := range acked {
		if !stored[off] {
			missing++
		}
	}
	return events, missing
}

// verify waits for the consumers to catch up with the streams' heads and checks what each holds
// against the ledger.
func verify(addr, token string, led *ledger, hook *seen, followers map[string]*seen, many int) {
	ctx := context.Background()
	conn, err := client.Dial(ctx, addr)
	must(err, "dial to check")
	defer conn.Close()
	project := conn.Login(ctx, token)
	streamA, streamFwd := client.Stream(ctx, project, "/soak/a"), client.Stream(ctx, project, "/soak/fwd")
	headA, err := client.Describe(ctx, streamA)
	must(err, "describe /soak/a")
	for _, name := range []string{"hook", "copy"} {
		sub := client.Subscription(ctx, streamA, name)
		if _, err := client.WaitUntilProcessed(ctx, sub, headA.HeadOffset, 5*time.Minute); err != nil {
			fail("subscription %s did not reach %d: %v", name, headA.HeadOffset, err)
		}
		sub.Release()
	}
	headFwd, err := client.Describe(ctx, streamFwd)
	must(err, "describe /soak/fwd")
	fwdSub := client.Subscription(ctx, streamFwd, "forwarder")
	if _, err := client.WaitUntilProcessed(ctx, fwdSub, headFwd.HeadOffset, 5*time.Minute); err != nil {
		fail("forwarder did not reach %d: %v", headFwd.HeadOffset, err)
	}
	read := map[string][]itx.Event{}
	for _, path := range []string{"/soak/a", "/soak/b", "/soak/fwd", "/soak/copy"} {
		acked := led.offsets[path]
		events, missing := readMissing(ctx, project, path, acked)
		read[path] = events
		if acked == nil {
			continue
		}
		if missing > 0 {
			fail("%s: %d acknowledged events missing", path, missing)
		}
		fmt.Printf("%s: %d acknowledged, %d stored, %d missing\n", path, len(acked), len(events), missing)
	}
	manyAcked, manyMissing := 0, 0
	for i := range many {
		path := fmt.Sprintf("/soak/many/%d", i)
		acked := led.offsets[path]
		if len(acked) == 0 {
			continue
		}
		_, missing := readMissing(ctx, project, path, acked)
		manyAcked += len(acked)
		manyMissing += missing
	}
	if manyMissing > 0 {
		fail("/soak/many/*: %d acknowledged events missing", manyMissing)
	}
	if many > 0 {
		fmt.Printf("/soak/many/0..%d: %d acknowledged, %d missing\n", many-1, manyAcked, manyMissing)
	}
	aEvents := read["/soak/a"]
	hook.mu.Lock()
	deliveries := 0
	for _, e := range aEvents {
		if hook.got[e.Offset] == 0 {
			fail("webhook never got offset %d", e.Offset)
			break
		}
	}
	for _, n := range hook.got {
		deliveries += n
	}
	fmt.Printf("webhook: %d offsets of %d, %d deliveries\n", len(hook.got), len(aEvents), deliveries)
	hook.mu.Unlock()
	copied := map[int64]int{}
	for _, e := range read["/soak/copy"] {
		if len(e.Provenance) > 0 {
			copied[e.Provenance[len(e.Provenance)-1].Offset]++
		}
	}
	for _, e := range aEvents {
		if copied[e.Offset] != 1 {
			fail("/soak/copy holds %d copies of /soak/a's offset %d", copied[e.Offset], e.Offset)
			break
		}
	}
	fmt.Printf("/soak/copy: %d copies of %d events\n", len(read["/soak/copy"]), len(aEvents))
	forwards, inbox := map[int64]int{}, 0
	for _, e := range read["/soak/fwd"] {
		switch e.Type {
		case "inbox/message":
			inbox++
		case "outbox/forwarded":
			var f struct{ SourceOffset int64 }
			json.Unmarshal(e.Payload, &f)
			forwards[f.SourceOffset]++
		}
	}
	for _, e := range read["/soak/fwd"] {
		if e.Type == "inbox/message" && forwards[e.Offset] != 1 {
			fail("forwarder: offset %d forwarded %d times", e.Offset, forwards[e.Offset])
			break
		}
	}
	fmt.Printf("forwarder: %d inbox messages, %d forwarded\n", inbox, len(forwards))
	for path, f := range followers {
		head := read[path][len(read[path])-1].Offset
		for deadline := time.Now().Add(time.Minute); f.lastOffset() < head && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond) // polling a counter the follower's goroutine moves
		}
		f.mu.Lock()
		if f.last != head {
			fail("%s: reached %d of head %d", f.name, f.last, head)
		}
		fmt.Printf("%s: %d events in order through %d\n", f.name, len(f.got), f.last)
		f.mu.Unlock()
	}
}

// churn is one round of a client that comes and goes: a new RPC session, a connection at a
// random offset of /soak/b whose events are checked, a live view of /soak/a, a reader registered
// and moved; then either a clean close of each, or the TCP connection dropped with all of them
// open. It reports whether the dial succeeded.
func churn(ctx context.Context, dial func(context.Context) (*session, error), crashing bool, w, i int) bool {
	s, err := dial(ctx)
	if err != nil {
		if !over(ctx) {
			lost(crashing, err, "churn dial")
		}
		return false
	}
	defer s.close()
	b := s.stream(ctx, "/soak/b")
	info, err := client.Describe(ctx, b)
	if err != nil {
		if !over(ctx) {
			lost(crashing, err, "churn describe")
		}
		return true
	}
	after := rand.Int64N(info.HeadOffset + 1)
	var last atomic.Int64
	last.Store(after)
	got := make(chan struct{}, 1)
	c, err := client.OpenConnection(ctx, b, client.ConnectionOptions{After: after, OpenedBy: "soak-churn",
		Key: fmt.Sprintf("churn-%d", w), MaxDeliveryEvents: 1 + rand.IntN(50)}, client.ConnectionHandler{
		Deliver: func(_ context.Context, batch itx.DeliveryBatch) error {
			for _, e := range batch.Events {
				if prev := last.Swap(e.Offset); e.Offset != prev+1 {
					fail("churn connection after %d: offset %d after %d", after, e.Offset, prev)
				}
			}
			select {
			case got <- struct{}{}:
			default:
			}
			return nil
		}})
	if err != nil {
		if !over(ctx) {
			lost(crashing, err, "churn open connection after %d", after)
		}
		return true
	}
	defer c.Release()
	view, err := client.WatchStream(ctx, s.stream(ctx, "/soak/a"))
	if err != nil && !over(ctx) {
		lost(crashing, err, "churn watch")
	}
	readers := client.Readers(ctx, b)
	defer readers.Release()
	name := fmt.Sprintf("reader-%d-%d", w, i%5)
	if err := client.RegisterReader(ctx, readers, name, after); err != nil && !over(ctx) {
		lost(crashing, err, "churn register reader")
	}
	// Wait for a first batch (appends keep coming) or the load's end.
	select {
	case <-got:
	case <-ctx.Done():
		return true
	case <-c.Done():
		if !over(ctx) {
			lost(crashing, c.Err(), "churn connection closed")
		}
		return true
	}
	if err := client.RegisterReader(ctx, readers, name, last.Load()); err != nil && !over(ctx) {
		lost(crashing, err, "churn move reader")
	}
	if i%2 == 0 {
		return true // drop the TCP connection with everything open
	}
	if err := c.Close(ctx); err != nil && !over(ctx) {
		lost(crashing, err, "churn close connection")
	}
	if view != nil {
		view.Cancel(ctx)
	}
	if i%5 == 4 {
		if err := client.RemoveReader(ctx, readers, name); err != nil && !over(ctx) {
			lost(crashing, err, "churn remove reader")
		}
	}
	return true
}

// over reports whether ctx has ended or its deadline has passed. A call cut by the load's end
// can fail with the network's own deadline ("i/o timeout") an instant before ctx's timer marks
// it done, so ctx.Err() alone would count that failure as lost.
func over(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// verifyBackup reads the newest scheduled backup's files (without starting an itxd on it, whose
// processors and deliveries would go on writing) and checks that each fixed stream there is a
// prefix of the live one: the same events at the same offsets.
func verifyBackup(dir, liveAddr, token, projectID string) {
	entries, err := os.ReadDir(dir)
	must(err, "list the backups")
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "itx-backup-") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	if len(names) == 0 || len(names) > 3 {
		fmt.Printf("FAIL backups: %d in %s, want 1 to 3 (--backup-keep 3)\n", len(names), dir)
		failed.Store(true)
		return
	}
	name := names[len(names)-1]
	newest := filepath.Join(dir, name)
	ctx := context.Background()
	d, err := storage.OpenDirectory(ctx, filepath.Join(newest, "directory.db"))
	must(err, "open the backup's directory")
	defer d.Close()
	conn, err := client.Dial(ctx, liveAddr)
	must(err, "dial")
	defer conn.Close()
	p := conn.Login(ctx, token)
	defer p.Release()
	held := 0
	for _, path := range []string{"/soak/a", "/soak/b", "/soak/fwd"} {
		st := client.Stream(ctx, p, path)
		live, err := client.ReadAll(ctx, st, itx.Query{})
		st.Release()
		must(err, "read "+path)
		entry, err := d.Stream(ctx, projectID, path)
		must(err, "the backup's entry of "+path)
		if entry == nil {
			fmt.Printf("FAIL backup %s: no %s\n", name, path)
			failed.Store(true)
			continue
		}
		snap, err := storage.OpenSnapshot(ctx, filepath.Join(newest, "streams", entry.StreamID+".db"))
		must(err, "open the backup's "+path)
		var copied []itx.Event
		for after := int64(0); ; {
			page, err := snap.Events(ctx, storage.Query{After: after, UpTo: math.MaxInt64, Limit: 500})
			must(err, "read the backup's "+path)
			if len(page) == 0 {
				break
			}
			copied = append(copied, page...)
			after = page[len(page)-1].Offset
		}
		snap.Close()
		if len(copied) > len(live) {
			fmt.Printf("FAIL backup %s: %s holds %d events, the live stream %d\n", name, path, len(copied), len(live))
			failed.Store(true)
			continue
		}
		for i, e := range copied {
			if e.Offset != live[i].Offset || e.Type != live[i].Type || string(e.Payload) != string(live[i].Payload) {
				fmt.Printf("FAIL backup %s: %s offset %d differs from the live stream\n", name, path, e.Offset)
				failed.Store(true)
				break
			}
		}
		held += len(copied)
	}
	fmt.Printf("backups: %d kept; the newest (%s) holds %d events of the fixed streams, each a prefix of the live stream\n",
		len(names), name, held)
}
