package test

import (
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

var (
	remoteBinOnce sync.Once
	remoteBin     string
	remoteBinErr  error
)

// remoteHostBin builds processors/examples/remotehost once.
func remoteHostBin(t testing.TB) string {
	t.Helper()
	remoteBinOnce.Do(func() {
		remoteBin = filepath.Join(filepath.Dir(itxdBin), "remotehost")
		out, err := goBuild("-o", remoteBin, "../processors/examples/remotehost").CombinedOutput()
		if err != nil {
			remoteBinErr = fmt.Errorf("build remotehost: %v\n%s", err, out)
		}
	})
	require.NoError(t, remoteBinErr)
	return remoteBin
}

// remoteProcess is a real remotehost process.
type remoteProcess struct {
	cmd    *exec.Cmd
	exited chan error
}

func startRemoteHost(t testing.TB, addr, token string, args ...string) *remoteProcess {
	t.Helper()
	cmd := exec.Command(remoteHostBin(t), append([]string{"--addr", addr, "--token", token}, args...)...)
	var logs syncBuffer
	cmd.Stderr = &logs
	require.NoError(t, cmd.Start())
	p := &remoteProcess{cmd: cmd, exited: make(chan error, 1)}
	go func() { p.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-p.exited
		}
		raceReported(t, "remotehost", logs.String())
		if t.Failed() {
			t.Logf("remotehost log:\n%s", logs.String())
		}
	})
	return p
}

func (p *remoteProcess) kill9(t testing.TB) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Kill())
	<-p.exited
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// awaitContract waits until a mounted host holds contract.
func awaitContract(t *testing.T, p schema.Project, contract string) {
	t.Helper()
	waitUntil(t, "a host holds "+contract, func() bool {
		for _, h := range listHosts(t, p) {
			for _, c := range h.Contracts {
				if c.Name == contract {
					return true
				}
			}
		}
		return false
	})
}

func waitForType(t *testing.T, s schema.Stream, typ string) itx.Event {
	t.Helper()
	ctx := ctxT(t)
	e, err := client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{typ}}, 0, 25*time.Second)
	require.NoError(t, err, "waiting for %s", typ)
	return e
}

// kill -9 of a remote host in the middle of an obligation (the agent marked its request started;
// the vendor call hangs): the host's disconnect is an eviction. The restarted host mounts the
// contract again; the agent is revived there (by the keepalive's alarm, kept on the stream, or by
// the wake its mount resumes when a wake was cut short), and it settles the orphaned request
// once. The stream shows one settlement; the vendor was dialed once.
func TestRemote_Kill9HostMidObligationSettlesOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	vendor, url := newBlockingVendor(t)
	proc := startItxd(t, t.TempDir(), "--processors", "")
	ctx := ctxT(t)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	hostArgs := []string{"--name", "agents", "--processors", "agent", "--agent-vendor-url", url, "--agent-hesitation", "0s"}
	host := startRemoteHost(t, proc.addr, proc.creds.ProjectToken, hostArgs...)
	awaitContract(t, p, "agent")

	s := client.Stream(ctx, p, "/remote/agent")
	defer s.Release()
	configureRemote(t, s, "agent")
	mustAppend(t, s, examples.MessageAdded.Input(examples.Message{Text: "hello"}, ""))
	select {
	case <-vendor.called:
	case <-ctx.Done():
		t.Fatal("the remote agent never dialed the vendor")
	}
	require.Equal(t, 1, countType(t, s, string(examples.LLMStarted)))
	host.kill9(t)

	startRemoteHost(t, proc.addr, proc.creds.ProjectToken, hostArgs...)
	awaitContract(t, p, "agent")
	settledEv := waitForType(t, s, string(examples.LLMSettled))
	var settled examples.LLMSettlement
	require.NoError(t, json.Unmarshal(settledEv.Payload, &settled))
	require.Equal(t, examples.ReasonOrphaned, settled.Result.Reason)

	head := mustAppend(t, s, ev("agent/marker", `{}`)).HeadOffset
	sub := client.Subscription(ctx, s, "agent")
	defer sub.Release()
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	require.Equal(t, 1, countType(t, s, string(examples.LLMSettled)))
	require.Equal(t, int64(1), vendor.calls.Load())
}

// kill -9 of itxd while a remote host is connected: the host notices, reconnects on its own with
// backoff once itxd is back, and its processors continue from the committed cursor: every inbox
// message is forwarded exactly once across the crash.
func TestRemote_Kill9ItxdHostReconnects(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	dataDir, addr := t.TempDir(), freeAddr(t)
	proc := startItxd(t, dataDir, "--listen", addr, "--processors", "")
	ctx := ctxT(t)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	startRemoteHost(t, addr, proc.creds.ProjectToken, "--name", "forwarders", "--processors", "forwarder")
	awaitContract(t, p, "forwarder")
	s := client.Stream(ctx, p, "/remote/forwarder")
	configureRemote(t, s, "forwarder")
	var head int64
	for i := range 3 {
		head = mustAppend(t, s, examples.InboxMessage.Input(json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)), "")).HeadOffset
	}
	sub := client.Subscription(ctx, s, "forwarder")
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	require.Equal(t, 3, countType(t, s, string(examples.OutboxForwarded)))
	sub.Release()
	s.Release()
	proc.kill9(t)

	proc = startItxd(t, dataDir, "--listen", addr, "--processors", "")
	p = dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	awaitContract(t, p, "forwarder") // the host came back by itself
	s = client.Stream(ctx, p, "/remote/forwarder")
	defer s.Release()
	for i := 3; i < 5; i++ {
		head = mustAppend(t, s, examples.InboxMessage.Input(json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)), "")).HeadOffset
	}
	sub = client.Subscription(ctx, s, "forwarder")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	require.Equal(t, 5, countType(t, s, string(examples.OutboxForwarded)))
}

// proxy is a TCP relay whose connections the test can cut (a network partition) or freeze (a
// peer, or a network, that stopped answering without closing anything).
type proxy struct {
	ln     net.Listener
	mu     sync.Mutex
	conns  []net.Conn
	once   sync.Once
	frozen chan struct{}
	// stalled are the stall channels of the relayed connections not stalled yet.
	stalled []chan struct{}
	// slow, when above 0, is how many bytes it relays per 10 ms, either way: a slow link.
	slow atomic.Int64
	// small makes the connections accepted from then on take in little before relaying it, so
	// a slow link's bytes wait, unacknowledged, in the client's socket as on a real one, and the
	// client sees them acknowledged a little at a time. (A receiver's kernel reopens its window
	// only once about half its buffer is free: with 128 KiB asked, the client saw no byte
	// acknowledged for about 0.65 s at 200 KiB/s, and for over PingTimeout once the relay ran a
	// third slower on a loaded machine.)
	small atomic.Bool
}

func newProxy(t testing.TB, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	px := &proxy{ln: ln, frozen: make(chan struct{})}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			if px.small.Load() {
				c.(*net.TCPConn).SetReadBuffer(16 << 10)
			}
			stall := make(chan struct{})
			px.mu.Lock()
			px.conns = append(px.conns, c, up)
			px.stalled = append(px.stalled, stall)
			px.mu.Unlock()
			go px.relay(up, c, stall)
			go px.relay(c, up, stall)
		}
	}()
	t.Cleanup(func() { ln.Close(); px.cut() })
	return px
}

func (px *proxy) addr() string { return px.ln.Addr().String() }

// relay copies src to dst until either ends (then closes dst), or until freeze (or stall, for
// its connection): from then on it holds every byte and closes nothing.
func (px *proxy) relay(dst, src net.Conn, stall chan struct{}) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-px.frozen:
			return
		case <-stall:
			return
		default:
		}
		for sent := 0; sent < n; {
			end := n
			if slow := int(px.slow.Load()); slow > 0 {
				end = min(n, sent+slow)
				time.Sleep(10 * time.Millisecond) // the link's rate, not a wait for anything
			}
			if _, werr := dst.Write(buf[sent:end]); werr != nil {
				err = werr
				break
			}
			sent = end
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

// freeze stops every relayed byte, either way, without closing a connection.
func (px *proxy) freeze() { px.once.Do(func() { close(px.frozen) }) }

// stall freezes the connections relayed now; those accepted later relay as before.
func (px *proxy) stall() {
	px.mu.Lock()
	defer px.mu.Unlock()
	for _, c := range px.stalled {
		close(c)
	}
	px.stalled = nil
}

// cut closes every relayed connection; new ones are still accepted.
func (px *proxy) cut() {
	px.mu.Lock()
	defer px.mu.Unlock()
	for _, c := range px.conns {
		c.Close()
	}
	px.conns = nil
}

// A network partition mid-obligation: the host's connection is closed under it while the
// vendor call is in flight. itxd drops the mount (an eviction), the host reconnects on its own,
// and the revived agent settles the orphaned request exactly once.
func TestRemote_PartitionMidWakeSettlesOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a real keepalive alarm")
	}
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	vendor := &chanVendor{called: make(chan string, 4)}
	agentCfg := examples.DefaultAgentConfig
	agentCfg.HesitationMs = 0
	host := processorsHost(t, vendor, agentCfg)
	px := newProxy(t, ts.addr)
	mounted := runRemoteHost(t, px.addr(), ts.creds.ProjectToken, "partitioned", host)
	awaitMount(t, mounted)
	s := stream(t, p, "/remote/partition")
	configureRemote(t, s, "agent")
	mustAppend(t, s, examples.MessageAdded.Input(examples.Message{Text: "hello"}, ""))
	select {
	case <-vendor.called:
	case <-ctx.Done():
		t.Fatal("the agent never dialed the vendor")
	}
	px.cut()
	awaitMount(t, mounted) // reconnected through the proxy
	settledEv := waitForType(t, s, string(examples.LLMSettled))
	var settled examples.LLMSettlement
	require.NoError(t, json.Unmarshal(settledEv.Payload, &settled))
	require.Equal(t, examples.ReasonOrphaned, settled.Result.Reason)
	head := mustAppend(t, s, ev("agent/marker", `{}`)).HeadOffset
	sub := client.Subscription(ctx, s, "agent")
	defer sub.Release()
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	require.Equal(t, 1, countType(t, s, string(examples.LLMSettled)))
	require.Equal(t, int64(1), vendor.calls.Load())
}
