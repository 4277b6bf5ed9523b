// Command compare runs the same workloads against itxd and NATS JetStream (each its own
// process, on the same disk), a raw append+fdatasync loop and a raw SQLite loop, interleaved over
// several rounds, and prints one table of medians and ratios. Run it with `make compare`.
//
// Both systems are durable: itxd acknowledges an append after its group commit is fsynced;
// JetStream runs with sync_interval: always (a second JetStream in its default mode, fsync every
// two minutes, is measured for reference).
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"capnproto.org/go/capnp/v3/rpc"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	_ "github.com/mattn/go-sqlite3"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

var (
	rounds   = flag.Int("rounds", 3, "interleaved rounds; the table shows medians")
	duration = flag.Duration("duration", 3*time.Second, "how long each throughput workload runs")
	samples  = flag.Int("samples", 2000, "latency samples per round")
	spread   = flag.Bool("spread", false, "also print each latency workload's p90, p95, p99.5 and max (stderr)")
	workDir  = flag.String("dir", "", "working directory for data and binaries (default: a temp dir on the same disk)")
	only     = flag.String("only", "", "run only workloads whose name contains this (or one of these, comma-separated: raw,append)")
	itxdFlag = flag.String("itxd", "", "an itxd binary to measure instead of building one from the main module (to compare two builds)")
	itxdB    = flag.String("itxd-b", "", "with -only ab: a second itxd binary, measured sample by sample against the first")
	abSplit  = flag.Bool("ab-split", false, "with -only ab: the consumer on an RPC connection of its own")
)

// payload is the ~85-byte JSON event both systems carry.
func payload(i int) []byte {
	return []byte(fmt.Sprintf(`{"seq":%d,"user":"u-%04d","action":"clicked","target":"button-checkout","ok":true}`, i, i%1000))
}

type result struct {
	workload, system, unit string
	value                  float64
	lowerIsBetter          bool
}

func main() {
	flag.Parse()
	dir := *workDir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "itx-compare"); err != nil {
			fail(err)
		}
		defer os.RemoveAll(dir)
	}
	itxdBin, natsBin := filepath.Join(dir, "itxd"), filepath.Join(dir, "nats-server")
	if *itxdFlag != "" {
		itxdBin = *itxdFlag
	} else {
		run("go", "-C", "..", "build", "-o", itxdBin, "./cmd/itxd") // from the main module, as users build it
	}
	run("go", "build", "-o", natsBin, "github.com/nats-io/nats-server/v2")

	var all []result
	for r := 1; r <= *rounds; r++ {
		fmt.Fprintf(os.Stderr, "round %d of %d\n", r, *rounds)
		for _, w := range workloads {
			if w.name == "ab" && *only != "ab" || *only != "" && !slices.ContainsFunc(strings.Split(*only, ","), func(o string) bool { return strings.Contains(w.name, o) }) {
				continue
			}
			all = append(all, w.run(dir, itxdBin, natsBin)...)
		}
	}
	printTable(all)
}

type workload struct {
	name string
	run  func(dir, itxdBin, natsBin string) []result
}

var workloads = []workload{
	{"raw", runRaw},
	{"append", runAppend},
	{"latency", runLatency},
	{"catch-up", runCatchUp},
	{"ab", runAB},
}

// --- processes -------------------------------------------------------------------------------

type proc struct {
	cmd  *exec.Cmd
	addr string
	dir  string
}

func (p *proc) stop() {
	running.Delete(p)
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
	os.RemoveAll(p.dir)
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func startItxd(bin, parent string) (*proc, string) {
	data, err := os.MkdirTemp(parent, "itxd-data")
	if err != nil {
		fail(err)
	}
	addrFile := filepath.Join(data, "addr")
	cmd := exec.Command(bin, "--listen", "127.0.0.1:0", "--data", data, "--addr-file", addrFile, "--log-level", "error",
		"--breaker-burst", "1000000000", "--breaker-refill-per-minute", "1000000000")
	if err := cmd.Start(); err != nil {
		fail(err)
	}
	p := &proc{cmd: cmd, dir: data}
	track(p)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if b, err := os.ReadFile(addrFile); err == nil && len(b) > 0 {
			p.addr = string(b)
			break
		}
	}
	if p.addr == "" {
		fail(fmt.Errorf("itxd did not start"))
	}
	var creds struct {
		ProjectToken string `json:"projectToken"`
	}
	b, err := os.ReadFile(filepath.Join(data, "credentials.json"))
	if err != nil {
		fail(err)
	}
	if err := json.Unmarshal(b, &creds); err != nil {
		fail(err)
	}
	return p, creds.ProjectToken
}

// startNATS starts nats-server with JetStream; syncAlways sets sync_interval: always.
func startNATS(bin, parent string, syncAlways bool) *proc {
	data, err := os.MkdirTemp(parent, "nats-data")
	if err != nil {
		fail(err)
	}
	addr := freeAddr()
	host, port, _ := net.SplitHostPort(addr)
	conf := fmt.Sprintf("listen: %s:%s\njetstream {\n  store_dir: %q\n", host, port, data)
	if syncAlways {
		conf += "  sync_interval: always\n"
	}
	conf += "}\n"
	confFile := filepath.Join(data, "nats.conf")
	if err := os.WriteFile(confFile, []byte(conf), 0o600); err != nil {
		fail(err)
	}
	cmd := exec.Command(bin, "-c", confFile)
	if err := cmd.Start(); err != nil {
		fail(err)
	}
	p := &proc{cmd: cmd, addr: addr, dir: data}
	track(p)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return p
		}
	}
	fail(fmt.Errorf("nats-server did not start"))
	return nil
}

// --- itx client ------------------------------------------------------------------------------

type itxConn struct {
	conn    *rpc.Conn
	gateway schema.Gateway
	project schema.Project
}

func dialItx(addr, token string) *itxConn {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		fail(err)
	}
	nc.(*net.TCPConn).SetNoDelay(true)
	conn := rpc.NewConn(rpc.NewStreamTransport(nc), nil)
	g := schema.Gateway(conn.Bootstrap(context.Background()))
	fut, _ := g.Login(context.Background(), func(p schema.Gateway_login_Params) error { return p.SetToken(token) })
	return &itxConn{conn: conn, gateway: g, project: fut.Project()}
}

func (c *itxConn) close() { c.project.Release(); c.gateway.Release(); c.conn.Close() }

func (c *itxConn) stream(path string) schema.Stream {
	sf, _ := c.project.Streams(context.Background(), nil)
	gf, _ := sf.Streams().Get(context.Background(), func(p schema.Streams_get_Params) error { return p.SetPath(path) })
	return gf.Stream()
}

func itxAppend(s schema.Stream, n, base int) (int64, error) {
	fut, release := s.Append(context.Background(), func(p schema.Stream_append_Params) error {
		list, err := p.NewEvents(int32(n))
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			e := list.At(i)
			if err := e.SetType("bench.event"); err != nil {
				return err
			}
			if err := e.SetPayload(string(payload(base + i))); err != nil {
				return err
			}
		}
		return nil
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return 0, err
	}
	r, err := res.Result()
	if err != nil {
		return 0, err
	}
	return int64(r.HeadOffset()), nil
}

// --- workloads -------------------------------------------------------------------------------

// timed runs op from workers goroutines for the configured duration; it returns ops/s.
func timed(workers int, op func(w, i int) error) float64 {
	var n atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	time.AfterFunc(*duration, func() { stop.Store(true) })
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				if err := op(w, i); err != nil {
					fail(err)
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	return float64(n.Load()) / time.Since(start).Seconds()
}

func runRaw(dir, _, _ string) []result {
	// Raw append + fdatasync of 4 KiB, sequential.
	f, err := os.CreateTemp(dir, "raw")
	if err != nil {
		fail(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	block := make([]byte, 4096)
	var lat []time.Duration
	rate := timed(1, func(_, _ int) error {
		t0 := time.Now()
		if _, err := f.Write(block); err != nil {
			return err
		}
		err := syscall.Fdatasync(int(f.Fd()))
		lat = append(lat, time.Since(t0))
		return err
	})
	out := []result{{"raw append 4 KiB + fdatasync", "disk", "ops/s", rate, false},
		{"raw append 4 KiB + fdatasync p50", "disk", "us", pct(lat, 0.5), true}}

	// Raw SQLite: 100 events per synchronous=FULL WAL transaction.
	db, err := sql.Open("sqlite3", filepath.Join(dir, "raw.db")+"?_journal_mode=WAL&_synchronous=FULL")
	if err != nil {
		fail(err)
	}
	defer func() { db.Close(); os.Remove(filepath.Join(dir, "raw.db")) }()
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(`create table if not exists events (offset integer primary key, type text, payload text, created_at integer)`); err != nil {
		fail(err)
	}
	seq := 0
	rate = timed(1, func(_, _ int) error {
		tx, err := db.Begin()
		if err != nil {
			return err
		}
		stmt, err := tx.Prepare(`insert into events (offset, type, payload, created_at) values (?, ?, ?, ?)`)
		if err != nil {
			return err
		}
		for i := 0; i < 100; i++ {
			seq++
			if _, err := stmt.Exec(seq, "bench.event", string(payload(seq)), time.Now().UnixMilli()); err != nil {
				return err
			}
		}
		stmt.Close()
		return tx.Commit()
	})
	out = append(out, result{"100-event batches", "raw SQLite (FULL)", "events/s", rate * 100, false})
	return out
}

func runAppend(dir, itxdBin, natsBin string) []result {
	var out []result
	p, token := startItxd(itxdBin, dir)
	defer p.stop()
	c := dialItx(p.addr, token)
	defer c.close()

	s := c.stream("/compare/seq")
	var lat []time.Duration
	rate := timed(1, func(_, i int) error {
		t0 := time.Now()
		_, err := itxAppend(s, 1, i)
		lat = append(lat, time.Since(t0))
		return err
	})
	out = append(out, result{"sequential append, 1 event", "itx", "events/s", rate, false},
		result{"sequential append, 1 event p50", "itx", "us", pct(lat, 0.5), true})

	conns := make([]*itxConn, 64)
	streams := make([]schema.Stream, 64)
	for i := range conns {
		conns[i] = dialItx(p.addr, token)
		streams[i] = conns[i].stream("/compare/concurrent")
	}
	rate = timed(64, func(w, i int) error { _, err := itxAppend(streams[w], 1, i); return err })
	for _, cc := range conns {
		cc.close()
	}
	out = append(out, result{"64 concurrent appenders", "itx", "events/s", rate, false})

	// One producer with up to 256 appends unanswered on one capability (client.Appender), in
	// bursts of 256 then a flush: the same shape as JetStream's async publish below.
	pl := client.NewAppender(c.stream("/compare/pipelined"), 256)
	var seq int
	rate = timed(1, func(_, _ int) error {
		ctx := context.Background()
		for k := 0; k < 256; k++ {
			seq++
			if _, err := pl.Append(ctx, []itx.EventInput{{Type: "bench.event", Payload: payload(seq)}}, itx.AppendOptions{}); err != nil {
				return err
			}
		}
		return pl.Flush(ctx)
	})
	out = append(out, result{"1 producer, 256 in flight", "itx", "events/s", rate * 256, false})

	b := c.stream("/compare/batch")
	rate = timed(1, func(_, i int) error { _, err := itxAppend(b, 100, i*100); return err })
	out = append(out, result{"100-event batches", "itx", "events/s", rate * 100, false})

	// The same batches from one producer with up to 8 unanswered (client.Appender), in bursts of
	// 8 then a flush: each batch is still acknowledged only once its commit is on disk, and
	// batches in flight together share a commit.
	pb := client.NewAppender(c.stream("/compare/batch-pipelined"), 8)
	var bseq int
	rate = timed(1, func(_, _ int) error {
		ctx := context.Background()
		for k := 0; k < 8; k++ {
			events := make([]itx.EventInput, 100)
			for j := range events {
				bseq++
				events[j] = itx.EventInput{Type: "bench.event", Payload: payload(bseq)}
			}
			if _, err := pb.Append(ctx, events, itx.AppendOptions{}); err != nil {
				return err
			}
		}
		return pb.Flush(ctx)
	})
	out = append(out, result{"100-event batches", "itx, 8 in flight", "events/s", rate * 800, false})

	for _, always := range []bool{true, false} {
		sys := "JetStream sync_always"
		if !always {
			sys = "JetStream default"
		}
		n := startNATS(natsBin, dir, always)
		nc, js := natsJS(n.addr)
		ctx := context.Background()
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench.>"}}); err != nil {
			fail(err)
		}
		lat = lat[:0]
		rate = timed(1, func(_, i int) error {
			t0 := time.Now()
			_, err := js.Publish(ctx, "bench.seq", payload(i))
			lat = append(lat, time.Since(t0))
			return err
		})
		out = append(out, result{"sequential append, 1 event", sys, "events/s", rate, false},
			result{"sequential append, 1 event p50", sys, "us", pct(lat, 0.5), true})
		// Async publishes with at most 256 outstanding: JetStream's way to many appenders.
		var i int
		rate = timed(1, func(_, _ int) error { return publishBurst(js, "bench.async", 256, &i) })
		out = append(out, result{"64 concurrent appenders", sys + " (async, 256 pending)", "events/s", rate * 256, false},
			result{"1 producer, 256 in flight", sys + " (async, 256 pending)", "events/s", rate * 256, false})
		rate = timed(1, func(_, _ int) error { return publishBurst(js, "bench.batch", 100, &i) })
		out = append(out, result{"100-event batches", sys + " (100 async)", "events/s", rate * 100, false})
		nc.Close()
		n.stop()
	}
	return out
}

// publishBurst publishes n messages asynchronously and waits until JetStream acknowledged all.
func publishBurst(js jetstream.JetStream, subject string, n int, seq *int) error {
	for k := 0; k < n; k++ {
		*seq++
		if _, err := js.PublishAsync(subject, payload(*seq)); err != nil {
			return err
		}
	}
	select {
	case <-js.PublishAsyncComplete():
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("async publishes not acknowledged")
	}
}

func natsJS(addr string) (*nats.Conn, jetstream.JetStream) {
	nc, err := nats.Connect("nats://"+addr, nats.MaxReconnects(0))
	if err != nil {
		fail(err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(256))
	if err != nil {
		fail(err)
	}
	return nc, js
}

// latencySink is an EventSink that reports arrivals.
type latencySink struct{ arrivals chan arrivalAt }

type arrivalAt struct {
	offset int64
	at     time.Time
}

func (k *latencySink) Deliver(ctx context.Context, call schema.EventSink_deliver) error {
	return report(k.arrivals, time.Now(), call.Args().Batch)
}
func (k *latencySink) Closed(context.Context, schema.EventSink_closed) error { return nil }
func (k *latencySink) State(context.Context, schema.EventSink_state) error   { return nil }

// latencyReceiver is an itx-call Receiver that reports arrivals.
type latencyReceiver struct{ arrivals chan arrivalAt }

func (r *latencyReceiver) Receive(ctx context.Context, call schema.Receiver_receive) error {
	return report(r.arrivals, time.Now(), call.Args().Batch)
}

// report sends a batch's last offset and its arrival time, dropping it if nobody is waiting.
func report(arrivals chan arrivalAt, at time.Time, batch func() (schema.DeliveryBatch, error)) error {
	b, err := batch()
	if err != nil {
		return err
	}
	list, err := b.Events()
	if err != nil {
		return err
	}
	select {
	case arrivals <- arrivalAt{int64(list.At(list.Len() - 1).Offset()), at}:
	default:
	}
	return nil
}

func runLatency(dir, itxdBin, natsBin string) []result {
	var out []result
	p, token := startItxd(itxdBin, dir)
	defer p.stop()
	c := dialItx(p.addr, token)
	defer c.close()
	ctx := context.Background()

	measure := func(s schema.Stream, arrivals chan arrivalAt) []time.Duration {
		var lat []time.Duration
		for i := 0; i < *samples+20; i++ {
			t0 := time.Now()
			head, err := itxAppend(s, 1, i)
			if err != nil {
				fail(err)
			}
			for a := range arrivals {
				if a.offset >= head {
					if i >= 20 {
						lat = append(lat, a.at.Sub(t0))
					}
					break
				}
			}
		}
		return lat
	}

	// A live connection.
	s := c.stream("/compare/latency-conn")
	sink := &latencySink{arrivals: make(chan arrivalAt, 64)}
	cf, release := s.OpenConnection(ctx, func(p schema.Stream_openConnection_Params) error {
		o, err := p.NewOptions()
		if err != nil {
			return err
		}
		o.SetNoState(true)
		return p.SetSink(schema.EventSink_ServerToClient(sink))
	})
	if _, err := cf.Struct(); err != nil {
		fail(err)
	}
	lat := measure(s, sink.arrivals)
	release()
	printSpread("itx connection", lat)
	out = append(out, result{"append -> consumer p50", "itx connection", "us", pct(lat, 0.5), true},
		result{"append -> consumer p99", "itx connection", "us", pct(lat, 0.99), true})

	// An itx-call subscription to a mounted Receiver (durable cursor).
	recv := &latencyReceiver{arrivals: make(chan arrivalAt, 64)}
	capsF, _ := c.project.Capabilities(ctx, nil)
	mf, _ := capsF.Capabilities().Mount(ctx, func(p schema.Capabilities_mount_Params) error {
		if err := p.SetName("compare-inbox"); err != nil {
			return err
		}
		return p.SetReceiver(schema.Receiver_ServerToClient(recv))
	})
	if _, err := mf.Struct(); err != nil {
		fail(err)
	}
	s2 := c.stream("/compare/latency-call")
	subscribeLatency(ctx, s2, client.Receiver{Kind: client.ReceiverItxCall, Capability: "compare-inbox"})
	lat = measure(s2, recv.arrivals)
	printSpread("itx itx-call subscription", lat)
	out = append(out, result{"append -> consumer p50", "itx itx-call subscription", "us", pct(lat, 0.5), true},
		result{"append -> consumer p99", "itx itx-call subscription", "us", pct(lat, 0.99), true})

	// A webhook subscription to an HTTP receiver in this process (durable cursor; a 2xx acks).
	hooks := make(chan arrivalAt, 64)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	hookSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		var body itx.WebhookBody
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		select {
		case hooks <- arrivalAt{body.Event.Offset, at}:
		default:
		}
		w.WriteHeader(http.StatusNoContent)
	})}
	go hookSrv.Serve(ln)
	defer hookSrv.Close()
	s3 := c.stream("/compare/latency-hook")
	subscribeLatency(ctx, s3, client.Receiver{Kind: client.ReceiverWebhookPost, URL: "http://" + ln.Addr().String() + "/hook"})
	lat = measure(s3, hooks)
	printSpread("itx webhook subscription", lat)
	out = append(out, result{"append -> consumer p50", "itx webhook subscription", "us", pct(lat, 0.5), true},
		result{"append -> consumer p99", "itx webhook subscription", "us", pct(lat, 0.99), true})

	// JetStream: publish -> push consumer (ordered, ack none) with sync_always.
	n := startNATS(natsBin, dir, true)
	defer n.stop()
	nc, js := natsJS(n.addr)
	defer nc.Close()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LAT", Subjects: []string{"lat.>"}}); err != nil {
		fail(err)
	}
	arrivals := make(chan arrivalAt, 64)
	sub, err := nc.Subscribe("deliver.lat", func(m *nats.Msg) {
		meta, err := m.Metadata()
		if err == nil {
			select {
			case arrivals <- arrivalAt{int64(meta.Sequence.Stream), time.Now()}:
			default:
			}
		}
		m.Ack()
	})
	if err != nil {
		fail(err)
	}
	defer sub.Unsubscribe()
	if _, err := js.CreateOrUpdateConsumer(ctx, "LAT", jetstream.ConsumerConfig{Durable: "push", DeliverSubject: "deliver.lat",
		AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: "lat.events"}); err != nil {
		fail(fmt.Errorf("push consumer: %w", err))
	}
	lat = lat[:0]
	for i := 0; i < *samples+20; i++ {
		t0 := time.Now()
		ack, err := js.Publish(ctx, "lat.events", payload(i))
		if err != nil {
			fail(err)
		}
		for a := range arrivals {
			if a.offset >= int64(ack.Sequence) {
				if i >= 20 {
					lat = append(lat, a.at.Sub(t0))
				}
				break
			}
		}
	}
	printSpread("JetStream push consumer", lat)
	out = append(out, result{"append -> consumer p50", "JetStream sync_always push consumer", "us", pct(lat, 0.5), true},
		result{"append -> consumer p99", "JetStream sync_always push consumer", "us", pct(lat, 0.99), true})
	return out
}

// subscribeLatency configures the subscription "latency" on s, from now on, delivering to r.
func subscribeLatency(ctx context.Context, s schema.Stream, r client.Receiver) {
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	if _, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "latency", Start: "now", Receiver: r}); err != nil {
		fail(err)
	}
}

// runAB measures append -> connection latency on two itxd builds at once (-itxd and -itxd-b),
// alternating sample by sample, so that the machine's drift between rounds falls on both alike.
func runAB(dir, itxdBin, natsBin string) []result {
	if *itxdB == "" {
		fail(fmt.Errorf("-only ab needs -itxd-b"))
	}
	ctx := context.Background()
	type side struct {
		name    string
		s       schema.Stream
		sink    *latencySink
		lat     []time.Duration
		ret     []time.Duration // the append's own round trip
		after   []time.Duration // arrival after the append returned (0 if before)
		release func()
	}
	var sides []*side
	for _, bin := range []string{itxdBin, *itxdB} {
		p, token := startItxd(bin, dir)
		defer p.stop()
		c := dialItx(p.addr, token)
		defer c.close()
		sd := &side{name: bin, s: c.stream("/compare/ab"), sink: &latencySink{arrivals: make(chan arrivalAt, 64)}}
		consumer := sd.s
		if *abSplit {
			// The consumer on an RPC connection of its own, as a separate process would be.
			c2 := dialItx(p.addr, token)
			defer c2.close()
			consumer = c2.stream("/compare/ab")
		}
		cf, release := consumer.OpenConnection(ctx, func(p schema.Stream_openConnection_Params) error {
			o, err := p.NewOptions()
			if err != nil {
				return err
			}
			o.SetNoState(true)
			return p.SetSink(schema.EventSink_ServerToClient(sd.sink))
		})
		if _, err := cf.Struct(); err != nil {
			fail(err)
		}
		defer release()
		sides = append(sides, sd)
	}
	for i := 0; i < *samples+20; i++ {
		for k := range sides {
			sd := sides[(i+k)%2]
			t0 := time.Now()
			head, err := itxAppend(sd.s, 1, i)
			if err != nil {
				fail(err)
			}
			t1 := time.Now()
			for a := range sd.sink.arrivals {
				if a.offset >= head {
					if i >= 20 {
						sd.lat = append(sd.lat, a.at.Sub(t0))
						sd.ret = append(sd.ret, t1.Sub(t0))
						sd.after = append(sd.after, max(0, a.at.Sub(t1)))
					}
					break
				}
			}
		}
	}
	var out []result
	for k, sd := range sides {
		name := fmt.Sprintf("itx connection, %c (%s)", 'A'+k, filepath.Base(sd.name))
		printSpread(name, sd.lat)
		printSpread(name+", append returned", sd.ret)
		printSpread(name+", arrival after the return", sd.after)
		out = append(out, result{"append -> consumer p50", name, "us", pct(sd.lat, 0.5), true},
			result{"append -> consumer p99", name, "us", pct(sd.lat, 0.99), true})
	}
	return out
}

func runCatchUp(dir, itxdBin, natsBin string) []result {
	const total = 200_000
	var out []result
	p, token := startItxd(itxdBin, dir)
	defer p.stop()
	c := dialItx(p.addr, token)
	defer c.close()
	ctx := context.Background()
	s := c.stream("/compare/backlog")
	for i := 0; i < total/1000; i++ {
		if _, err := itxAppend(s, 1000, i*1000); err != nil {
			fail(err)
		}
	}
	// 100-event pages, one reader.
	start := time.Now()
	for after := uint64(0); after < total; {
		fut, release := s.GetEventPage(ctx, func(p schema.Stream_getEventPage_Params) error {
			q, err := p.NewQuery()
			if err != nil {
				return err
			}
			q.SetAfter(after)
			q.SetLimit(100)
			return nil
		})
		res, err := fut.Struct()
		if err != nil {
			fail(err)
		}
		pg, _ := res.Page()
		after = pg.NextAfter()
		release()
	}
	out = append(out, result{"catch-up, 100-event pages", "itx getEventPage", "events/s", total / time.Since(start).Seconds(), false})

	// One connection from offset 0.
	done := make(chan struct{})
	var once sync.Once
	sink := &countSink{target: total, done: func() { once.Do(func() { close(done) }) }}
	start = time.Now()
	cf, release := s.OpenConnection(ctx, func(p schema.Stream_openConnection_Params) error {
		o, err := p.NewOptions()
		if err != nil {
			return err
		}
		o.SetNoState(true)
		return p.SetSink(schema.EventSink_ServerToClient(sink))
	})
	if _, err := cf.Struct(); err != nil {
		fail(err)
	}
	<-done
	out = append(out, result{"catch-up, one connection", "itx connection", "events/s", total / time.Since(start).Seconds(), false})
	release()

	n := startNATS(natsBin, dir, true)
	defer n.stop()
	nc, js := natsJS(n.addr)
	defer nc.Close()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BACKLOG", Subjects: []string{"backlog"}}); err != nil {
		fail(err)
	}
	for i := 0; i < total; i++ {
		if _, err := js.PublishAsync("backlog", payload(i)); err != nil {
			fail(err)
		}
		if i%256 == 255 {
			<-js.PublishAsyncComplete()
		}
	}
	<-js.PublishAsyncComplete()
	cons, err := js.CreateOrUpdateConsumer(ctx, "BACKLOG", jetstream.ConsumerConfig{Durable: "reader", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		fail(err)
	}
	start = time.Now()
	for got := 0; got < total; {
		batch, err := cons.Fetch(100)
		if err != nil {
			fail(err)
		}
		for m := range batch.Messages() {
			m.Ack()
			got++
		}
	}
	out = append(out, result{"catch-up, 100-event pages", "JetStream pull fetch(100) + ack", "events/s", total / time.Since(start).Seconds(), false})
	return out
}

type countSink struct {
	got    atomic.Int64
	target int64
	done   func()
}

func (k *countSink) Deliver(ctx context.Context, call schema.EventSink_deliver) error {
	b, err := call.Args().Batch()
	if err != nil {
		return err
	}
	list, err := b.Events()
	if err != nil {
		return err
	}
	if k.got.Add(int64(list.Len())) >= k.target {
		k.done()
	}
	return nil
}
func (k *countSink) Closed(context.Context, schema.EventSink_closed) error { return nil }
func (k *countSink) State(context.Context, schema.EventSink_state) error   { return nil }

// --- output ----------------------------------------------------------------------------------

// printSpread prints a latency workload's tail to stderr (-spread).
func printSpread(name string, lat []time.Duration) {
	if *spread {
		fmt.Fprintf(os.Stderr, "%s: p50 %.0f p90 %.0f p95 %.0f p99 %.0f p99.5 %.0f max %.0f us\n", name,
			pct(lat, .5), pct(lat, .9), pct(lat, .95), pct(lat, .99), pct(lat, .995), pct(lat, 1))
	}
}

func pct(lat []time.Duration, p float64) float64 {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	return float64(s[min(len(s)-1, int(float64(len(s))*p))].Microseconds())
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	sort.Float64s(s)
	return s[len(s)/2]
}

// printTable prints the medians per (workload, system) and, per workload, each system's ratio to
// itx (>1: itx is better).
func printTable(all []result) {
	type key struct{ workload, system string }
	values := map[key][]float64{}
	units := map[string]string{}
	lower := map[string]bool{}
	var order []key
	for _, r := range all {
		k := key{r.workload, r.system}
		if _, ok := values[k]; !ok {
			order = append(order, k)
		}
		values[k] = append(values[k], r.value)
		units[r.workload], lower[r.workload] = r.unit, r.lowerIsBetter
	}
	itx := map[string]float64{}
	for _, k := range order {
		if strings.HasPrefix(k.system, "itx") && itx[k.workload] == 0 {
			itx[k.workload] = median(values[k])
		}
	}
	fmt.Printf("| workload | system | median | unit | rounds | itx vs this |\n|---|---|---|---|---|---|\n")
	for _, k := range order {
		m := median(values[k])
		ratio := "-"
		if base := itx[k.workload]; base > 0 && !strings.HasPrefix(k.system, "itx") && m > 0 {
			if lower[k.workload] {
				ratio = fmt.Sprintf("%.2fx", m/base)
			} else {
				ratio = fmt.Sprintf("%.2fx", base/m)
			}
		}
		fmt.Printf("| %s | %s | %.0f | %s | %d | %s |\n", k.workload, k.system, m, units[k.workload], len(values[k]), ratio)
	}
}

func run(name string, args ...string) {
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fail(fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err))
	}
}

// running is every server process started, so a failure never leaves one behind.
var running sync.Map

func track(p *proc) { running.Store(p, true) }

func fail(err error) {
	fmt.Fprintln(os.Stderr, "compare:", err)
	running.Range(func(k, _ any) bool {
		k.(*proc).cmd.Process.Kill()
		return true
	})
	os.Exit(1)
}
