package capability

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/rpc"
	"github.com/itx-dev/itx/internal/flowconn"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/rs/zerolog"
)

// Listener serves the capability graph on accepted connections, one Gateway per connection.
type Listener struct {
	srv       *server.Server
	log       zerolog.Logger
	flow      *flowconn.Pool
	keepAlive time.Duration // see tuneTCP
	maxLogins int           // distinct tokens per connection; 0: DefaultMaxLoginsPerConnection

	mu    sync.Mutex
	conns map[*rpc.Conn]struct{}
	wg    sync.WaitGroup

	refusals, evictions rateLimitedWarn // see warnRefused
}

// NewListener returns a Listener for srv with the default connection limits.
func NewListener(srv *server.Server) *Listener {
	return NewListenerWithLimits(srv, flowconn.Limits{})
}

// NewListenerWithLimits returns a Listener for srv whose connections are flow-controlled with
// limits (zero fields take flowconn's defaults).
func NewListenerWithLimits(srv *server.Server, limits flowconn.Limits) *Listener {
	l := &Listener{srv: srv, log: srv.Log(), flow: flowconn.NewPool(limits), keepAlive: DefaultKeepAlive,
		conns: map[*rpc.Conn]struct{}{}}
	l.flow.OnEvict(func(remote net.Addr, err error) {
		l.evictions.log(l.log, remote, err, "rpc connection not logged in yet closed for a newer one (--rpc-preauth-max-connections)")
	})
	return l
}

// SetKeepAlive sets the TCP keepalive of the connections accepted from now on (itxd
// --rpc-keepalive; see tuneTCP). Call it before Serve.
func (l *Listener) SetKeepAlive(d time.Duration) { l.keepAlive = d }

// SetMaxLoginsPerConnection bounds the distinct tokens one connection accepted from now on logs
// in with (itxd --rpc-max-logins-per-connection; default DefaultMaxLoginsPerConnection). Call it
// before Serve.
func (l *Listener) SetMaxLoginsPerConnection(n int) { l.maxLogins = n }

// Flow returns the accounting shared by the listener's connections.
func (l *Listener) Flow() *flowconn.Pool { return l.flow }

// Serve accepts connections on ln until it is closed. An accept the system refuses for want of
// a resource (out of file descriptors: clients' connections, a scraper's slow peers and the
// streams' files share them) is retried after a pause, growing from 5 ms to 1 s as net/http's
// does: the connections holding the descriptors end (or a stream unloads) and accepting
// resumes. Returning it stopped itxd for every client.
func (l *Listener) Serve(ln net.Listener) error {
	var pause time.Duration
	failed := 0
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			if !acceptRetryable(err) {
				return fmt.Errorf("accept: %w", err)
			}
			l.srv.Metrics().RPCAcceptErrors.Inc()
			if failed == 0 {
				l.log.Warn().Err(err).Msg("rpc listener: accepting a connection failed; retrying until it succeeds (raise the open-file limit, or lower --rpc-max-connections or --max-held-streams)")
			}
			failed++
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			time.Sleep(pause)
			continue
		}
		if failed > 0 {
			l.log.Info().Int("failedAccepts", failed).Msg("rpc listener: accepting connections again")
			failed, pause = 0, 0
		}
		l.serveConn(c)
	}
}

// acceptRetryable reports whether an accept failed for want of a resource that connections
// ending give back, not because the listener is broken.
func acceptRetryable(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.EINTR} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (l *Listener) serveConn(c net.Conn) {
	nc := c
	if tc, ok := c.(*tls.Conn); ok { // the handshake runs on the RPC connection's first read
		nc = tc.NetConn()
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		if err := tuneTCP(tc, l.keepAlive); err != nil {
			l.log.Warn().Str("remote", c.RemoteAddr().String()).Err(err).Msg("rpc connection: setting TCP keepalive failed")
		}
	}
	// Every connection is flow-controlled: past its bounds the server stops reading it (see
	// internal/flowconn). A login lifts it from the pre-authentication bounds. Past the pool's
	// connection count it is refused with an Abort saying so.
	t, err := l.flow.Open(c)
	if err != nil {
		l.warnRefused(c.RemoteAddr(), err)
		return
	}
	gw := &gateway{srv: l.srv, authenticated: t.Authenticate, reserveReply: t.ReserveReply, whenAnswered: t.WhenAnswered, maxSessions: l.maxLogins}
	boot := schema.Gateway(guarded(guardOf(l.srv), access{rights: rAll}, schema.Gateway_Methods(nil, gw), gw))
	conn := rpc.NewConn(t, &rpc.Options{
		BootstrapClient: capnp.Client(boot),
		Logger:          rpcLogger{l.log},
		// go-capnp sends the Abort only once the connection's calls have ended and what the
		// client held is released, and closes the transport after AbortTimeout whatever
		// happened: with its 100 ms, a client aborted for holding 16,384 replies or 20,000
		// capabilities heard only the connection's end (releasing them takes longer; with 2 s,
		// one did so on the loaded 2-vCPU machine). The transport itself bounds how long the
		// Abort may then take to write (DrainTimeout).
		AbortTimeout: 5 * time.Second,
	})
	gw.setConn(conn)
	t.CountCapabilities(conn.ExportCount)
	m := l.srv.Metrics()
	m.RPCConnections.Inc()
	l.mu.Lock()
	l.conns[conn] = struct{}{}
	l.wg.Add(1)
	l.mu.Unlock()
	l.log.Debug().Str("remote", c.RemoteAddr().String()).Msg("rpc connection opened")
	go func() {
		defer l.wg.Done()
		<-conn.Done()
		gw.endSessions()
		m.RPCConnections.Dec()
		l.mu.Lock()
		delete(l.conns, conn)
		l.mu.Unlock()
		l.log.Debug().Str("remote", c.RemoteAddr().String()).Msg("rpc connection closed")
	}()
}

// refusalWarnEvery is how often at most a refused connection is logged at warn: a peer opening
// connection after connection past a bound would otherwise write a line for each.
const refusalWarnEvery = 10 * time.Second

// warnRefused tells the operator that connections are refused at accept, naming the peer's
// address and the bound: at most one warning per refusalWarnEvery, counting the refusals since
// the last one (each is counted in /metrics too); the others go to debug.
func (l *Listener) warnRefused(remote net.Addr, err error) {
	l.refusals.log(l.log, remote, err, "rpc connection refused at accept")
}

// rateLimitedWarn logs one kind of event at warn at most once per refusalWarnEvery, with how
// many there were since the last warning; the others go to debug.
type rateLimitedWarn struct {
	mu   sync.Mutex
	n    int
	last time.Time
}

func (w *rateLimitedWarn) log(log zerolog.Logger, remote net.Addr, err error, msg string) {
	now := time.Now()
	w.mu.Lock()
	w.n++
	n := w.n
	warn := w.last.IsZero() || now.Sub(w.last) >= refusalWarnEvery
	if warn {
		w.n, w.last = 0, now
	}
	w.mu.Unlock()
	ev := log.Debug()
	if warn {
		ev = log.Warn().Int("sinceLastWarning", n)
	}
	ev.Str("remote", remote.String()).Err(err).Msg(msg)
}

// CloseConnections closes every open RPC connection and waits for them to finish.
func (l *Listener) CloseConnections(ctx context.Context) {
	l.mu.Lock()
	conns := make([]*rpc.Conn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// rpcLogger routes go-capnp's logs into zerolog at debug level: connection aborts are routine
// for a server (clients disconnect) and must not flood its log.
type rpcLogger struct{ log zerolog.Logger }

func (r rpcLogger) Debug(msg string, args ...any) { r.log.Debug().Fields(args).Msg(msg) }
func (r rpcLogger) Info(msg string, args ...any)  { r.log.Debug().Fields(args).Msg(msg) }
func (r rpcLogger) Warn(msg string, args ...any)  { r.log.Debug().Fields(args).Msg(msg) }
func (r rpcLogger) Error(msg string, args ...any) { r.log.Debug().Fields(args).Msg(msg) }
