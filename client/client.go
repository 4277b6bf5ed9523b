// Package client dials an itxd server and logs in: the Go entry point to the capability graph
// for applications, remote processors, the itx REPL and tests.
//
// Dial, then Conn.Login and Stream return capabilities at once (their calls are pipelined);
// Append, NewAppender, GetEventPage, ReadAll, WaitForEvent, OpenConnection, WatchStream,
// Readers with RegisterReader, ConfigureSubscription and MountReceiver use them; Processor
// (a processor-wake subscription's instance) with Snapshot, RuntimeState and WatchProcessor,
// and ProcessorHosts with ListProcessorHosts. A remote processor host is package
// processors/remote.
//
// Every error has a code, itx.ErrorCode(err). A call whose connection was lost before its answer
// is itx.EDisconnected, and one whose context ended after it was sent is itx.ECancelled: both may
// or may not have taken effect, so dial again and resend only what carries an idempotency key.
// A call made with a context that had ended already is not sent: itx.ECancelled too, saying
// "... not sent" (NotSent), and it took no effect. A Conn pings itxd (Options.PingEvery) and
// closes itself once itxd stops answering (a hung itxd, a stalled proxy: TCP keepalive notices
// neither): the Connections and LiveViews on it then end with connectionLost.
// A module of its own builds this package with the patched go-capnp in the repository's
// third_party (README, "From a module of your own").
package client

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"capnproto.org/go/capnp/v3/rpc"
	"github.com/itx-dev/itx/internal/tcpopt"
	"github.com/itx-dev/itx/schema"
)

// Conn is one RPC connection to itxd.
type Conn struct {
	rpc     *rpc.Conn
	gateway schema.Gateway
	abort   *abortRecorder
	// silent is why the watchdog closed the connection (itxd answered no ping), once it did.
	silentMu sync.Mutex
	silent   error
	// tcp and traffic tell the watchdog whether the link still moves: a ping that goes
	// unanswered meanwhile waits behind a large answer or call on a slow link, and is not lost.
	tcp     *net.TCPConn
	traffic *traffic
}

// traffic is what a countingConn counted.
type traffic struct{ received, sent atomic.Int64 }

// countingConn counts the bytes read and written through it, writing a chunk at a time so that
// a large message's progress shows while it is written.
type countingConn struct {
	net.Conn
	t *traffic
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.t.received.Add(int64(n))
	return n, err
}

func (c countingConn) Write(p []byte) (int, error) {
	const chunk = 32 << 10
	written := 0
	for written < len(p) {
		n, err := c.Conn.Write(p[written:min(len(p), written+chunk)])
		written += n
		c.t.sent.Add(int64(n))
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

// pingSlack is how many bytes written during a ping's wait may be the ping itself and the calls
// a silent connection's socket takes in before it fills: more is a link still moving.
const pingSlack = 64 << 10

// moving is a snapshot of the link's progress.
type moving struct {
	received, sent int64
	unsent         int
	unsentKnown    bool
}

func (c *Conn) progress() moving {
	m := moving{received: c.traffic.received.Load(), sent: c.traffic.sent.Load()}
	m.unsent, m.unsentKnown = tcpopt.Unsent(c.tcp)
	return m
}

// movedSince says whether the link carried anything since was: itxd's bytes arrived, a large
// call's were written, or the peer acknowledged some of what waited in the socket.
func (c *Conn) movedSince(was moving) bool {
	now := c.progress()
	return now.received != was.received || now.sent-was.sent > pingSlack ||
		(was.unsentKnown && now.unsentKnown && now.unsent < was.unsent)
}

// abortRecorder keeps the reason of the Abort the server ended the connection with, which
// go-capnp only reports to its logger (its calls fail "connection closed").
type abortRecorder struct {
	mu     sync.Mutex
	reason string
}

const abortPrefix = "rpc: remote abort: "

func (a *abortRecorder) Error(msg string, args ...any) {
	if r, ok := strings.CutPrefix(msg, abortPrefix); ok {
		a.mu.Lock()
		if a.reason == "" {
			a.reason = r
		}
		a.mu.Unlock()
	}
}
func (a *abortRecorder) Debug(string, ...any) {}
func (a *abortRecorder) Info(string, ...any)  {}
func (a *abortRecorder) Warn(string, ...any)  {}

// Options configure DialWith.
type Options struct {
	// TLS, when set, runs the connection over TLS with this configuration (its ServerName
	// defaults to addr's host). Tokens cross the wire in the login call: use TLS off loopback.
	TLS *tls.Config
	// KeepAlive is how long the connection may be silent before the kernel probes itxd, and the
	// interval between probes (0: DefaultKeepAlive). After 3 unanswered probes, or writes
	// unacknowledged for 4x this (Linux), the connection ends: a host or Receiver whose itxd
	// vanished behind a silent partition learns it, and can redial, instead of waiting forever.
	KeepAlive time.Duration
	// PingEvery is how often the connection asks itxd for its version (Gateway.version, Ping),
	// and PingTimeout how long it waits for the answer before it takes the connection for lost
	// and closes it (defaults DefaultPingEvery and DefaultPingTimeout; PingEvery < 0: never). A
	// ping late while the link still moves (itxd's bytes arriving, this side's large call being
	// written or acknowledged: a slow link) is not taken for silence.
	// Keepalive learns of a peer that vanished, not of one that holds the connection open and
	// answers nothing (a hung or stopped itxd, whose kernel still acknowledges; a stalled proxy
	// between them): without it, the calls in flight, and the Connections and LiveViews on the
	// connection, waited for as long as it stayed so. Once closed so, Done is closed, Err says
	// why (code disconnected), calls fail disconnected, and the Connections and LiveViews on it
	// end with connectionLost. One watchdog per connection, however many views it carries.
	PingEvery, PingTimeout time.Duration
}

// DefaultPingEvery and DefaultPingTimeout are Options.PingEvery's and PingTimeout's defaults.
const (
	DefaultPingEvery   = 15 * time.Second
	DefaultPingTimeout = 10 * time.Second
)

// DefaultKeepAlive is Options.KeepAlive's default, itxd's --rpc-keepalive default too.
const DefaultKeepAlive = tcpopt.Default

// Dial connects to addr (host:port) over plain TCP.
func Dial(ctx context.Context, addr string) (*Conn, error) {
	return DialWith(ctx, addr, Options{})
}

// DialWith connects to addr (host:port) over TCP, or TLS when o.TLS is set.
func DialWith(ctx context.Context, addr string, o Options) (*Conn, error) {
	tcp, err := dialTCP(ctx, addr, o.KeepAlive)
	if err != nil {
		return nil, fmt.Errorf("dial itxd at %s: %w", addr, err)
	}
	counted := &traffic{}
	var nc net.Conn = countingConn{Conn: tcp, t: counted}
	if o.TLS != nil {
		cfg := o.TLS.Clone()
		if cfg.ServerName == "" {
			if host, _, err := net.SplitHostPort(addr); err == nil {
				cfg.ServerName = host
			}
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, fmt.Errorf("dial itxd at %s: TLS: %w", addr, err)
		}
		nc = tc
	}
	abort := &abortRecorder{}
	conn := rpc.NewConn(rpc.NewStreamTransport(nc), &rpc.Options{Logger: abort})
	// The bootstrap capability lives as long as the connection, not as long as the dial's ctx:
	// cancelling the context of a Bootstrap call breaks the capability it returns.
	c := &Conn{rpc: conn, gateway: schema.Gateway(conn.Bootstrap(context.Background())), abort: abort, tcp: tcp, traffic: counted}
	if o.PingEvery >= 0 {
		go c.watch(cmp.Or(o.PingEvery, DefaultPingEvery), cmp.Or(max(o.PingTimeout, 0), DefaultPingTimeout))
	}
	return c, nil
}

// watch pings itxd until the connection ends, and closes it once a ping goes unanswered.
func (c *Conn) watch(every, timeout time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-c.rpc.Done()
		cancel()
	}()
	ping := func(ctx context.Context) error {
		was := c.progress()
		err := c.Ping(ctx)
		if err != nil && ctx.Err() != nil && c.movedSince(was) {
			return nil // itxd is still sending: the answer waits behind what it sent first
		}
		return err
	}
	if err := UntilSilent(ctx, ping, every, timeout); err != nil {
		c.silentMu.Lock()
		c.silent = err
		c.silentMu.Unlock()
		c.rpc.Close()
	}
}

// dialTCP opens the TCP connection under an RPC connection, with no delay and the keepalive and
// user timeout of keepAlive (0: DefaultKeepAlive).
func dialTCP(ctx context.Context, addr string, keepAlive time.Duration) (*net.TCPConn, error) {
	if keepAlive <= 0 {
		keepAlive = DefaultKeepAlive
	}
	d := net.Dialer{KeepAliveConfig: tcpopt.KeepAlive(keepAlive)}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	tc := nc.(*net.TCPConn)
	if err := tc.SetNoDelay(true); err != nil {
		tc.Close()
		return nil, err
	}
	if err := tcpopt.SetUserTimeout(tc, tcpopt.UserTimeout(keepAlive)); err != nil {
		tc.Close()
		return nil, err
	}
	return tc, nil
}

// Gateway is the bootstrap capability.
func (c *Conn) Gateway() schema.Gateway { return c.gateway }

// Login returns the project a token logs into at once, without waiting for the answer: calls
// made on it are pipelined behind the login. A bad token fails the calls made on it. ctx gives
// the login its values only: the project lasts until released, though ctx ends first (as do
// the capabilities of Stream, Subscriptions, Subscription, Readers, Admin, ReadOnly and
// AppendOnly).
func (c *Conn) Login(ctx context.Context, token string) schema.Project {
	fut, release := c.gateway.Login(lasting(ctx), func(p schema.Gateway_login_Params) error { return p.SetToken(token) })
	return keepAnswers(fut.Project().AddRef(), release)
}

// Ping asks itxd for its version (Gateway.version, which needs no login): an answer says the
// connection carries calls both ways.
func (c *Conn) Ping(ctx context.Context) error {
	if err := NotSent(ctx, "Ping"); err != nil {
		return err
	}
	fut, release := c.gateway.Version(ctx, nil)
	defer ReleaseAfter(ctx, release)
	_, err := Await(ctx, fut)
	return err
}

// Done is closed when the connection ends.
func (c *Conn) Done() <-chan struct{} { return c.rpc.Done() }

// Err reports why the connection ended, once Done is closed and if it is known: the reason of
// the server's Abort, such as "itx.limitExceeded: ... (--rpc-max-capabilities) ..." for a
// client past one of its bounds (itx.ErrorCode reads the code from it), or, code disconnected,
// that itxd answered no ping for Options.PingTimeout. It is nil while the connection is open,
// and when it ended otherwise (closed by this side, or lost).
func (c *Conn) Err() error {
	// Set before the watchdog closes the connection: what ends with it (a Connection, a
	// LiveView) may ask before Done is closed.
	c.silentMu.Lock()
	silent := c.silent
	c.silentMu.Unlock()
	if silent != nil {
		return silent
	}
	select {
	case <-c.rpc.Done():
	default:
		return nil
	}
	c.abort.mu.Lock()
	defer c.abort.mu.Unlock()
	if c.abort.reason == "" {
		return nil
	}
	// itxd's bounds send their reason as it is; an itxd before that (go-capnp unpatched) put
	// "reader: " before it.
	return errors.New("itxd aborted the connection: " + strings.TrimPrefix(c.abort.reason, "reader: "))
}

// Close closes the connection and releases the bootstrap capability. In that order: releasing
// a bootstrap the server never answered (a peer that accepted and went silent) waits for its
// answer, which only the closed connection gives.
func (c *Conn) Close() error {
	err := c.rpc.Close()
	c.gateway.Release()
	return err
}

// TLSConfig is the client side of TLS to itxd: the server's certificate is checked against the
// system's roots, or only against the PEM certificates in caFile when it is given. certFile and
// keyFile (both or neither) present a client certificate, for a server that requires one.
func TLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s holds no PEM certificate", caFile)
		}
		cfg.RootCAs = pool
	}
	if certFile != "" || keyFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
