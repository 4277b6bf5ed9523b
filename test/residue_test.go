package test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/rpc"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/storage"
	"github.com/stretchr/testify/require"
)

// Residue audit: what a client leaves behind in a real itxd process. Each cycle a client on a
// connection of its own takes one of every capability itxd hands out (its login's project, the
// streams and a stream, subscriptions and a subscription, a stream connection with its sink, a
// registered reader, live-state subscribers (the stream's, a processor's), a mounted Receiver and a mounted processor host
// whose wakes it holds (their ports and home stream kept), a scheduled append, admin, barriers
// waiting) and ends its use of them one way of seven: releasing each explicitly; releasing
// promises it never awaited; pipelined chains released mid-flight; closing its socket with no
// Abort; its mounts unmounted by name from another connection before it leaves; its names
// mounted again by another connection before it leaves; or, every so often, a client process
// holding all of it killed with SIGKILL. Afterwards itxd must be back at the baseline taken after
// a warm-up: its gauges (RPC connections, sessions, calls in flight, unfinished replies,
// unreturned calls, queued bytes, capabilities held, stream connections, live subscribers,
// webhooks in flight, loaded streams), the mounts it lists, its open file descriptors (SQLite's
// among them), its goroutines and its live heap. What stays by design (the readers, the
// scheduled appends: durable rows) is kept under names reused every few cycles, and checked to be
// exactly those; at the end, unused, every stream unloads and no SQLite handle on a stream's
// files stays open. ITX_RESIDUE_CYCLES (default 480) and ITX_RESIDUE_KILLS (default 3) run
// longer; ITX_RESIDUE_MODE=cut (say) ends every cycle one way.

// residueEnvClient names the child process mode: the test binary run as a client that takes
// everything a cycle takes, says "ready" and waits to be killed.
const residueEnvClient = "ITX_RESIDUE_CLIENT"

// residuePath is the stream every cycle uses; residueHook's webhook and the copy deliver from it.
const residuePath = "/residue/a"

var residueContracts = []itx.ProcessorInfo{{Name: "fwd", ReducerVersion: "1", ConsumedTypes: []string{"residue/tick"}}}

// residueHost is a ProcessorHost that keeps every wake's ports and home stream (as a host
// running a processor does while it works) and answers a wake only when its connection ends.
type residueHost struct {
	mu    sync.Mutex
	kept  []capnp.Client
	woken atomic.Int64
}

func (h *residueHost) Wake(ctx context.Context, call schema.ProcessorHost_wake) error {
	call.Go()
	req, err := call.Args().Request()
	if err == nil {
		h.mu.Lock()
		h.kept = append(h.kept, capnp.Client(req.Ports()).AddRef(), capnp.Client(req.Stream()).AddRef())
		h.mu.Unlock()
	}
	h.woken.Add(1)
	<-ctx.Done()
	return ctx.Err()
}

func (h *residueHost) GetRuntimeState(context.Context, schema.ProcessorHost_getRuntimeState) error {
	return nil
}

func (h *residueHost) Stop(context.Context, schema.ProcessorHost_stop) error { return nil }

func (h *residueHost) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.kept {
		c.Release()
	}
	h.kept = nil
}

// residueSession is one client connection of a cycle and everything it took.
type residueSession struct {
	nc       net.Conn
	rc       *rpc.Conn
	gw       schema.Gateway
	p        schema.Project
	relP     capnp.ReleaseFunc
	st       schema.Stream
	sub      schema.Subscription
	subs     schema.Subscriptions
	conn     schema.Connection
	live     schema.Handle
	relLv    capnp.ReleaseFunc
	proc     schema.Processor
	procLive schema.Handle
	relPl    capnp.ReleaseFunc
	rdrs     schema.Readers
	mount    schema.Handle
	hostH    schema.Handle
	host     *residueHost
	admin    schema.Admin
	cancel   context.CancelFunc
	waits    chan error // the barriers' ends
}

// residueDial connects over TCP and logs in (pipelined), on a socket the session may cut.
func residueDial(ctx context.Context, addr, token string) (*residueSession, error) {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	rc := rpc.NewConn(rpc.NewStreamTransport(nc), nil)
	gw := schema.Gateway(rc.Bootstrap(context.Background()))
	lf, rel := gw.Login(ctx, func(a schema.Gateway_login_Params) error { return a.SetToken(token) })
	return &residueSession{nc: nc, rc: rc, gw: gw, p: lf.Project(), relP: rel}, nil
}

// take takes one of everything; cycle i picks the reader's and scheduled append's reused names.
func (s *residueSession) take(ctx context.Context, i int) error {
	s.st = client.Stream(ctx, s.p, residuePath)
	if _, err := client.Describe(ctx, s.st); err != nil {
		return fmt.Errorf("describe: %w", err)
	}
	s.subs = client.Subscriptions(ctx, s.st)
	s.sub = client.Subscription(ctx, s.st, "inbox")
	if _, err := client.DescribeSubscription(ctx, s.sub); err != nil {
		return fmt.Errorf("describe subscription: %w", err)
	}
	var err error
	if s.conn, err = churnOpenConn(ctx, s.st, newTestSink()); err != nil {
		return fmt.Errorf("openConnection: %w", err)
	}
	lf, relLv := s.st.LiveState(ctx, func(a schema.Stream_liveState_Params) error {
		return a.SetSubscriber(schema.LiveSubscriber_ServerToClient(&liveView{}))
	})
	s.relLv = relLv
	if _, err := lf.Struct(); err != nil {
		return fmt.Errorf("liveState: %w", err)
	}
	s.live = lf.Handle().AddRef()
	// The remote processor's live state too (its reduced state, as the stream holds it).
	s.proc = client.Processor(ctx, client.Subscription(ctx, s.st, "fwd"))
	pf, relPl := s.proc.LiveState(ctx, func(a schema.Processor_liveState_Params) error {
		return a.SetSubscriber(schema.LiveSubscriber_ServerToClient(&liveView{}))
	})
	s.relPl = relPl
	if _, err := pf.Struct(); err != nil {
		return fmt.Errorf("processor liveState: %w", err)
	}
	s.procLive = pf.Handle().AddRef()
	s.rdrs = client.Readers(ctx, s.st)
	if err := client.RegisterReader(ctx, s.rdrs, fmt.Sprintf("reader-%d", i%4), 1); err != nil {
		return fmt.Errorf("register reader: %w", err)
	}
	if s.mount, err = client.MountReceiver(ctx, s.p, "inbox", client.ServeReceiver(func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
		if i%2 == 0 && len(b.Events) > 0 { // every other cycle confirms; the others hold the call
			return b.Events[len(b.Events)-1].Offset, nil
		}
		<-ctx.Done()
		return 0, ctx.Err()
	})); err != nil {
		return fmt.Errorf("mount: %w", err)
	}
	s.host = &residueHost{}
	if s.hostH, err = mountHostServing(ctx, s.p, "host", s.host, residueContracts); err != nil {
		return fmt.Errorf("mount host: %w", err)
	}
	if _, _, err := client.Schedule(ctx, s.st, keyed("residue/later", fmt.Sprintf(`{"i":%d}`, i), fmt.Sprintf("later-%d", i%4)), time.Now().Add(time.Hour)); err != nil {
		return fmt.Errorf("schedule: %w", err)
	}
	s.admin = client.Admin(ctx, s.p)
	if _, err := client.ListTokens(ctx, s.admin, ""); err != nil {
		return fmt.Errorf("listTokens: %w", err)
	}
	bctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.waits = cancel, make(chan error, 2)
	go func() {
		_, err := client.WaitForEvent(bctx, s.st, itx.Predicate{Types: []string{"never"}}, 0, 9*time.Minute)
		s.waits <- err
	}()
	go func() {
		_, err := client.WaitUntilProcessed(bctx, s.sub, 1<<40, 9*time.Minute)
		s.waits <- err
	}()
	// An event every receiver is given (the Receiver, the host, the webhook, the copy, the
	// connection and the live view), so that each has something in flight as the cycle ends.
	if _, err := client.Append(ctx, s.st, []itx.EventInput{ev("residue/tick", fmt.Sprintf(`{"i":%d}`, i))}, itx.AppendOptions{}); err != nil {
		return fmt.Errorf("append: %w", err)
	}
	return nil
}

// releaseAll releases everything the session took, barriers first.
func (s *residueSession) releaseAll() {
	if s.cancel != nil {
		s.cancel()
		<-s.waits
		<-s.waits
	}
	for _, c := range []capnp.Client{capnp.Client(s.admin), capnp.Client(s.hostH), capnp.Client(s.mount), capnp.Client(s.rdrs),
		capnp.Client(s.live), capnp.Client(s.procLive), capnp.Client(s.proc), capnp.Client(s.conn), capnp.Client(s.sub),
		capnp.Client(s.subs), capnp.Client(s.st)} {
		c.Release()
	}
	for _, r := range []capnp.ReleaseFunc{s.relLv, s.relPl} {
		if r != nil {
			r()
		}
	}
	if s.host != nil {
		s.host.release()
	}
	s.relP()
}

// close ends the connection with an Abort (the library's graceful close) and waits for it.
func (s *residueSession) close() {
	s.gw.Release()
	s.rc.Close()
	s.nc.Close()
	if s.cancel != nil {
		s.cancel()
	}
}

// cut closes the socket with no Abort, as a client whose process vanished does.
func (s *residueSession) cut() {
	s.nc.Close()
	<-s.rc.Done()
	s.close()
}

// residueModes are the ways a cycle ends its use of what it took (the SIGKILL of a client
// process is apart: it costs a process start).
var residueModes = []string{"release", "unawaited", "pipelined", "cut", "unmountByName", "remount"}

// TestItxd_ClientResidue: see the comment at the top of this file.
func TestItxd_ClientResidue(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real itxd process")
	}
	cycles := 480
	if v, err := strconv.Atoi(os.Getenv("ITX_RESIDUE_CYCLES")); err == nil && v > 0 {
		cycles = v
	}
	kills := 3
	if v, err := strconv.Atoi(os.Getenv("ITX_RESIDUE_KILLS")); err == nil && v >= 0 {
		kills = v
	}
	// Streams unload 5 s after their last use, so that at the end every stream's SQLite
	// handles must be gone (none of the cycles' streams is used then).
	srv := startLongItxd(t, time.Second, "--idle-timeout", "5s")
	token := srv.creds.ProjectToken
	// Not ctxLong's 2 minutes: a long run takes longer. Each cycle has a minute of its own.
	ctx, cancelAll := context.WithCancel(context.Background())
	defer cancelAll()

	var hooked atomic.Int64
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hooked.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer hook.Close()

	// The watcher: a connection that lives through the test (in the baseline), configures the
	// stream's subscriptions and reads what is mounted.
	wc, err := client.Dial(ctx, srv.addr)
	require.NoError(t, err)
	defer wc.Close()
	watcher := wc.Login(ctx, token)
	defer watcher.Release()
	wst := client.Stream(ctx, watcher, residuePath)
	defer wst.Release()
	mustAppend(t, wst, ev("residue/tick", `{"i":-1}`))
	wsubs := client.Subscriptions(ctx, wst)
	defer wsubs.Release()
	for _, cfg := range []client.SubscriptionConfig{
		{Name: "inbox", Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}},
		{Name: "hook", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: hook.URL}},
		{Name: "copy", Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/residue/copy"}},
		{Name: "fwd", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Placement: "remote"}},
	} {
		_, _, err := client.ConfigureSubscription(ctx, wsubs, cfg)
		require.NoError(t, err, cfg.Name)
	}
	caps := capsOf(ctx, watcher)
	defer caps.Release()
	hosts := client.ProcessorHosts(ctx, watcher)
	defer hosts.Release()

	bin, err := os.Executable()
	require.NoError(t, err)
	killAt := map[int]bool{}
	for k := range kills {
		killAt[(k+1)*cycles/(kills+1)] = true
	}
	var modeCount [7]int
	cycle := func(i int) {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if killAt[i] {
			residueKillClient(t, bin, srv.addr, token, i)
			modeCount[6]++
			return
		}
		mode := i % len(residueModes)
		if only := os.Getenv("ITX_RESIDUE_MODE"); only != "" { // one way of ending alone
			for mode = 0; residueModes[mode] != only; mode++ {
			}
		}
		modeCount[mode]++
		s, err := residueDial(ctx, srv.addr, token)
		require.NoError(t, err)
		require.NoError(t, s.take(ctx, i), "cycle %d (%s)", i, residueModes[mode])
		switch residueModes[mode] {
		case "release":
			fut, rel := s.conn.Close(ctx, func(a schema.Connection_close_Params) error { return a.SetReason("done") })
			_, err := fut.Struct()
			require.NoError(t, err)
			rel()
			cf, crel := s.mount.Cancel(ctx, nil)
			_, err = cf.Struct()
			require.NoError(t, err)
			crel()
			s.releaseAll()
			// Everything released, the connection still up: itxd holds none of it for the
			// client any more (the capabilities, the stream connection, the view, the mounts).
			s.close()
		case "unawaited":
			// Calls sent and their promises released unawaited (the answers, and the
			// capabilities in them, are the server's to drop), the rest held as the client
			// closes.
			_, r1 := s.st.OpenConnection(ctx, func(a schema.Stream_openConnection_Params) error {
				if _, err := a.NewOptions(); err != nil {
					return err
				}
				return a.SetSink(schema.EventSink_ServerToClient(newTestSink()))
			})
			_, r2 := s.st.LiveState(ctx, func(a schema.Stream_liveState_Params) error {
				return a.SetSubscriber(schema.LiveSubscriber_ServerToClient(&liveView{}))
			})
			cf, r3 := s.p.Capabilities(ctx, nil)
			_, r4 := cf.Capabilities().Mount(ctx, func(a schema.Capabilities_mount_Params) error {
				if err := a.SetName(fmt.Sprintf("unawaited-%d", i)); err != nil {
					return err
				}
				return a.SetReceiver(client.ServeReceiver(func(context.Context, itx.DeliveryBatch) (int64, error) { return 0, nil }))
			})
			_, r5 := s.st.GetEventPage(ctx, nil)
			_, r6 := s.st.WaitForEvent(ctx, func(a schema.Stream_waitForEvent_Params) error { a.SetTimeoutMs(60_000); return nil })
			for _, r := range []capnp.ReleaseFunc{r6, r5, r4, r3, r2, r1} {
				r()
			}
			s.close()
		case "pipelined":
			sf, r1 := s.p.Streams(ctx, nil)
			gf, r2 := sf.Streams().Get(ctx, func(a schema.Streams_get_Params) error { return a.SetPath(residuePath) })
			pst := gf.Stream()
			uf, r3 := pst.Subscriptions(ctx, nil)
			nf, r4 := uf.Subscriptions().Get(ctx, func(a schema.Subscriptions_get_Params) error { return a.SetName("fwd") })
			pf, r5 := nf.Subscription().Processor(ctx, nil)
			_, r6 := pf.Processor().Snapshot(ctx, nil)
			_, r7 := pst.OpenConnection(ctx, func(a schema.Stream_openConnection_Params) error {
				if _, err := a.NewOptions(); err != nil {
					return err
				}
				return a.SetSink(schema.EventSink_ServerToClient(newTestSink()))
			})
			_, r8 := pst.ReadOnly(ctx, nil)
			for _, r := range []capnp.ReleaseFunc{r8, r7, r6, r5, r4, r3, r2, r1} {
				r()
			}
			if i%2 == 0 {
				s.cut()
			} else {
				s.releaseAll()
				s.close()
			}
		case "cut":
			s.cut()
		case "unmountByName":
			require.NoError(t, client.Unmount(ctx, caps, "inbox"))
			// The mounter holds its Handle a moment longer, then leaves.
			s.releaseAll()
			s.close()
		case "remount":
			o, err := residueDial(ctx, srv.addr, token)
			require.NoError(t, err)
			h, err := client.MountReceiver(ctx, o.p, "inbox", client.ServeReceiver(func(context.Context, itx.DeliveryBatch) (int64, error) { return 0, nil }))
			require.NoError(t, err)
			hh, err := mountHostServing(ctx, o.p, "host", &residueHost{}, residueContracts)
			require.NoError(t, err)
			// The replaced session leaves holding its Handles; then the one that replaced it.
			s.cut()
			h.Release()
			hh.Release()
			o.relP()
			o.close()
		}
	}

	warm := max(len(residueModes)*3, cycles/5)
	start := time.Now()
	for i := range warm {
		cycle(1_000_000 + i) // past the kills' cycles
	}
	base := residueSettle(t, srv, caps, hosts, nil)
	t.Logf("baseline after %d warm-up cycles: %s", warm, base)
	for i := range cycles {
		cycle(i)
	}
	end := residueSettle(t, srv, caps, hosts, &base)
	t.Logf("after %d cycles (%v) in %v: %s; webhook deliveries %d", cycles, modeCount, time.Since(start).Round(time.Millisecond), end, hooked.Load())

	// Unused, every stream unloads (--idle-timeout): no SQLite handle on a stream's files is
	// left open, and no other file descriptor than at the baseline.
	if !residueWait(20*time.Second, func() bool {
		fds, sqlite, streams := itxdFDs(t, srv.cmd.Process.Pid)
		return streams == 0 && fds-sqlite == base.fds-base.sqlFD
	}) {
		saveProfiles(t, srv, "residue-loaded")
		list, err := client.ListSubscriptions(ctx, wsubs)
		t.Fatalf("20 s after the cycles, unused, itxd holds %v streams loaded (non-SQLite fds at the baseline: %d), fds %v; subscriptions %+v (%v)",
			srv.scrape(t, "itx_loaded_streams"), base.fds-base.sqlFD, itxdFDList(srv.cmd.Process.Pid), list, err)
	}

	// What stays by design: the reused names' reader registrations and scheduled appends.
	readers, err := client.ListReaders(ctx, client.Readers(ctx, wst))
	require.NoError(t, err)
	require.Len(t, readers, 4, "the readers are the four reused names")
	sched, err := client.ListScheduled(ctx, wst)
	require.NoError(t, err)
	require.Len(t, sched, 4, "the scheduled appends are the four reused keys")
}

// capsOf is project.capabilities(), resolved.
func capsOf(ctx context.Context, p schema.Project) schema.Capabilities {
	f, rel := p.Capabilities(ctx, nil)
	defer rel()
	return f.Capabilities().AddRef()
}

// residueState is what itxd holds at rest.
type residueState struct {
	gauges     map[string]float64
	mounts     int
	hosts      int
	fds, sqlFD int
	goroutines float64
	heap       float64
}

func (r residueState) String() string {
	return fmt.Sprintf("gauges %v, mounts %d, hosts %d, fds %d (on SQLite files %d), goroutines %v, live heap %.2f MiB",
		r.gauges, r.mounts, r.hosts, r.fds, r.sqlFD, r.goroutines, r.heap/(1<<20))
}

// residueGauges are itxd's gauges that must be back where they were.
var residueGauges = []string{"itx_rpc_connections", "itx_sessions", "itx_rpc_calls_in_flight",
	"itx_rpc_unfinished_replies", "itx_rpc_unreturned_calls", "itx_rpc_unwritten_bytes",
	"itx_rpc_call_bytes_in_flight", "itx_rpc_replies_waiting", "itx_rpc_capabilities",
	"itx_open_connections", "itx_live_subscribers", "itx_webhooks_in_flight"}

// residueSettle waits until itxd is back at base (nil: until it is quiet, and measures it): the
// gauges and mounts exactly, the file descriptors exactly, goroutines within 2 and the live heap
// within 256 KiB. It returns what it measured.
func residueSettle(t *testing.T, srv *benchItxd, caps schema.Capabilities, hosts schema.ProcessorHosts, base *residueState) residueState {
	t.Helper()
	read := func() residueState {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r := residueState{gauges: map[string]float64{"itx_loaded_streams": srv.scrape(t, "itx_loaded_streams")}}
		for _, g := range residueGauges {
			r.gauges[g] = srv.scrape(t, g)
		}
		m, err := client.ListMounts(ctx, caps)
		require.NoError(t, err)
		h, err := client.ListProcessorHosts(ctx, hosts)
		require.NoError(t, err)
		r.mounts, r.hosts = len(m), len(h)
		r.fds, r.sqlFD, _ = itxdFDs(t, srv.cmd.Process.Pid)
		r.heap, r.goroutines = itxdMemory(t, srv)
		return r
	}
	// Settled: nothing in flight, no mount of a cycle left (the watcher mounts none), the
	// cycles' connections gone (the watcher's is the one left).
	quiet := func(r residueState) bool {
		return r.mounts == 0 && r.hosts == 0 && r.gauges["itx_rpc_connections"] == 1 && r.gauges["itx_rpc_calls_in_flight"] <= 1 &&
			r.gauges["itx_rpc_unreturned_calls"] == 0 && r.gauges["itx_webhooks_in_flight"] == 0 && r.gauges["itx_open_connections"] == 0 &&
			r.gauges["itx_live_subscribers"] == 0
	}
	deadline := time.Now().Add(30 * time.Second)
	var r residueState
	for {
		r = read()
		ok := quiet(r)
		if ok && base != nil {
			for _, g := range residueGauges {
				if g == "itx_rpc_calls_in_flight" { // the scrape's own call, or none
					continue
				}
				ok = ok && r.gauges[g] == base.gauges[g]
			}
			// SQLite's read connections open on demand and close after a short idle spell (a
			// stream's after 2 s, at most storage.ReaderConns of each kind; the directory's
			// pool): bounded, not exact. The rest (sockets, pipes) exactly.
			ok = ok && r.fds-r.sqlFD == base.fds-base.sqlFD && r.sqlFD <= base.sqlFD+int(r.gauges["itx_loaded_streams"])*2*storage.ReaderConns+4 &&
				r.goroutines <= base.goroutines+2 && r.heap <= base.heap+256<<10
		}
		if ok {
			return r
		}
		if time.Now().After(deadline) {
			if base != nil {
				saveProfiles(t, srv, "residue-after")
				t.Fatalf("30 s after the cycles itxd holds\n %s\nbaseline\n %s\nfds now: %v", r, *base, itxdFDList(srv.cmd.Process.Pid))
			}
			t.Fatalf("itxd did not settle: %s", r)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// itxdFDs counts the process's open file descriptors, those on SQLite's files (a database, its
// write-ahead log and shared memory: the directory's and the streams') and those on the
// streams' alone.
func itxdFDs(t *testing.T, pid int) (all, sqlite, streams int) {
	t.Helper()
	for _, target := range itxdFDList(pid) {
		all++
		if strings.HasSuffix(target, ".db") || strings.HasSuffix(target, "-wal") || strings.HasSuffix(target, "-shm") || strings.HasSuffix(target, "-journal") {
			sqlite++
			if strings.Contains(target, "/streams/") {
				streams++
			}
		}
	}
	return all, sqlite, streams
}

func itxdFDList(pid int) []string {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err == nil {
			out = append(out, target)
		}
	}
	return out
}

// residueKillClient runs this test binary as a client process that takes everything a cycle
// takes and waits; once it says so, it is killed with SIGKILL.
func residueKillClient(t *testing.T, bin, addr, token string, i int) {
	t.Helper()
	cmd := exec.Command(bin, "-test.run=^TestItxd_ResidueClientProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), residueEnvClient+"=1", "ITX_RESIDUE_ADDR="+addr, "ITX_RESIDUE_TOKEN="+token, "ITX_RESIDUE_I="+strconv.Itoa(i))
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var logs syncBuffer
	cmd.Stderr = &logs
	require.NoError(t, cmd.Start())
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if line := sc.Text(); line == "residue: ready" {
				ready <- nil
				return
			} else if strings.HasPrefix(line, "residue: ") {
				ready <- errors.New(line)
				return
			}
		}
		ready <- fmt.Errorf("client process ended: %v", sc.Err())
	}()
	select {
	case err := <-ready:
		require.NoError(t, err, "client process: %s", logs.String())
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("client process not ready in 60 s: %s", logs.String())
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	err = cmd.Wait()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "client process: %v", err)
}

// TestItxd_ResidueClientProcess is the client process residueKillClient starts; run otherwise,
// it does nothing.
func TestItxd_ResidueClientProcess(t *testing.T) {
	if os.Getenv(residueEnvClient) == "" {
		t.Skip("the client process of TestItxd_ClientResidue")
	}
	i, _ := strconv.Atoi(os.Getenv("ITX_RESIDUE_I"))
	ctx := context.Background()
	s, err := residueDial(ctx, os.Getenv("ITX_RESIDUE_ADDR"), os.Getenv("ITX_RESIDUE_TOKEN"))
	if err == nil {
		err = s.take(ctx, i)
	}
	if err != nil {
		fmt.Printf("residue: %v\n", err)
		os.Exit(1)
	}
	// Held in flight as the process dies: a call on the project's admin and a delivery to the
	// Receiver (every other cycle) besides the barriers.
	fmt.Println("residue: ready")
	select {}
}

// residueWait waits up to d for cond, and says whether it came.
func residueWait(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// A processor host mounted again under its name replaces the earlier mount, whose Handle the
// client may keep (it released nothing). What the earlier mount announced (up to
// --max-host-contract-bytes, 256 KiB, and a hold per contract) is of no use once replaced: kept
// until the Handle goes, a client mounting one name again and again while keeping the Handles
// grew itxd by what each announced, up to --rpc-max-capabilities Handles a connection (65,536
// of 256 KiB: 16 GiB), past every bound --max-mounts-per-project and --max-host-contract-bytes
// promise. A replaced mount now keeps only what its Handle needs to end.
func TestItxd_ReplacedHostMountsHoldLittle(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real itxd process")
	}
	srv := startLongItxd(t, time.Second)
	ctx := ctxLong(t)
	c, err := client.Dial(ctx, srv.addr)
	require.NoError(t, err)
	defer c.Close()
	p := c.Login(ctx, srv.creds.ProjectToken)
	defer p.Release()
	hosts := client.ProcessorHosts(ctx, p)
	defer hosts.Release()
	// Nearly the bound's worth: 1,000 contracts of three 40-byte types each.
	contracts := make([]itx.ProcessorInfo, 1000)
	for i := range contracts {
		types := make([]string, 3)
		for j := range types {
			types[j] = fmt.Sprintf("t%d/%s", j, strings.Repeat("x", 37))
		}
		contracts[i] = itx.ProcessorInfo{Name: fmt.Sprintf("c-%04d", i), ReducerVersion: "1", ConsumedTypes: types}
	}
	mount := func() schema.Handle {
		h, err := mountHostServing(ctx, p, "big", &residueHost{}, contracts)
		require.NoError(t, err)
		return h
	}
	// One mount is what the bound allows to stay: the baseline holds it.
	first := mount()
	baseHeap, _ := itxdMemory(t, srv)
	const n = 100
	kept := []schema.Handle{first}
	for range n {
		kept = append(kept, mount())
	}
	heap, _ := itxdMemory(t, srv)
	list, err := client.ListProcessorHosts(ctx, hosts)
	require.NoError(t, err)
	require.Len(t, list, 1, "one host is mounted under the name")
	t.Logf("live heap with one mount %.2f MiB, with %d replaced mounts' Handles kept %.2f MiB (%.1f KiB each)",
		baseHeap/(1<<20), n, heap/(1<<20), (heap-baseHeap)/n/1024)
	// A Handle (the capability, its end, the host's reference) costs a few KiB; the contracts
	// it announced, about 250 KiB.
	require.Less(t, heap-baseHeap, float64(n*32<<10), "itxd's live heap grew by %.1f KiB per replaced mount kept", (heap-baseHeap)/n/1024)
	for _, h := range kept {
		h.Release()
	}
	waitUntil(t, "no host mounted", func() bool {
		list, err := client.ListProcessorHosts(ctx, hosts)
		return err == nil && len(list) == 0
	})
}

// A Receiver mounted again under its name, or unmounted by name, stays with itxd until its
// client releases the Handle (itxd cannot take back a capability it handed out). What it keeps
// is small and counted: each kept Handle is a capability of the client's connection, so past
// --rpc-max-capabilities the connection is aborted with limitExceeded naming the flag, and
// everything it held goes with it.
func TestItxd_ReplacedReceiverMountsAreBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real itxd process")
	}
	const bound = 600
	srv := startLongItxd(t, time.Second, "--rpc-max-capabilities", strconv.Itoa(bound))
	ctx := ctxLong(t)
	watch, err := client.Dial(ctx, srv.addr)
	require.NoError(t, err)
	defer watch.Close()
	wp := watch.Login(ctx, srv.creds.ProjectToken)
	defer wp.Release()
	caps := capsOf(ctx, wp)
	defer caps.Release()
	_, err = client.ListMounts(ctx, caps)
	require.NoError(t, err)
	baseHeap, baseG := itxdMemory(t, srv)
	baseCaps := srv.scrape(t, "itx_rpc_capabilities")

	c, err := client.Dial(ctx, srv.addr)
	require.NoError(t, err)
	defer c.Close()
	p := c.Login(ctx, srv.creds.ProjectToken)
	pcaps := capsOf(ctx, p)
	const n = 500 // under the bound: the Handles, the project and what came with them
	var kept []schema.Handle
	for i := range n {
		h, err := client.MountReceiver(ctx, p, "inbox", client.ServeReceiver(func(context.Context, itx.DeliveryBatch) (int64, error) { return 0, nil }))
		require.NoError(t, err)
		kept = append(kept, h)
		if i%2 == 1 {
			require.NoError(t, client.Unmount(ctx, pcaps, "inbox"))
		}
	}
	heap, _ := itxdMemory(t, srv)
	perHandle := (heap - baseHeap) / n
	t.Logf("live heap %.2f MiB at the baseline, %.2f MiB with %d replaced or unmounted Receivers' Handles kept (%.1f KiB each)",
		baseHeap/(1<<20), heap/(1<<20), n, perHandle/1024)
	// README's estimate of a held capability (14 KiB of RSS) is what --rpc-max-capabilities and
	// its global bound are sized by: a kept mount must cost no more.
	require.Less(t, perHandle, float64(14<<10), "a kept Receiver mount's Handle costs itxd %.1f KiB", perHandle/1024)

	// Past the bound the connection is aborted, naming the flag.
	for i := 0; ; i++ {
		h, err := client.MountReceiver(ctx, p, "inbox", client.ServeReceiver(func(context.Context, itx.DeliveryBatch) (int64, error) { return 0, nil }))
		if err != nil {
			break
		}
		kept = append(kept, h)
		require.Less(t, i, bound, "the connection outlived its capabilities bound")
	}
	select {
	case <-c.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the connection was not aborted")
	}
	require.ErrorContains(t, c.Err(), "--rpc-max-capabilities")
	requireCode(t, c.Err(), itx.ELimitExceeded)
	waitUntil(t, "itxd back at its baseline", func() bool {
		m, err := client.ListMounts(ctx, caps)
		return err == nil && len(m) == 0 && srv.scrape(t, "itx_rpc_capabilities") == baseCaps && srv.scrape(t, "itx_rpc_connections") == 1
	})
	// The Go runtime keeps the descriptor of every goroutine it ran at once (runtime.malg, about
	// 470 bytes each; go-capnp runs one per capability server, so one per Handle here, and the
	// connection held at most bound capabilities): that and 512 KiB may stay.
	heap, g := itxdMemory(t, srv)
	require.Less(t, heap-baseHeap, float64(512<<10+512*bound), "itxd's live heap once the connection ended")
	require.LessOrEqual(t, g, baseG+2, "itxd's goroutines once the connection ended")
	for _, h := range kept {
		h.Release()
	}
	pcaps.Release()
	p.Release()
}
