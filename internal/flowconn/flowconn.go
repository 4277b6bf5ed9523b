// Package flowconn is connection-level flow control for go-capnp RPC: a transport wrapper that
// stops reading a connection's socket while that connection (or the server as a whole) holds too
// many calls in flight or too many reply bytes waiting to be written, so TCP pushes back on the
// client instead of the server buffering without bound.
//
// go-capnp v3 has none of its own (upstream #571, #194, #222); #298 plans it as a Transport
// wrapper with exactly this shape: a soft limit on unanswered incoming calls and on queued
// outgoing bytes, enforced by not reading. The wrapper sees every message: a Call or Bootstrap
// read from the peer opens a call, the Return written for it closes the call, and every
// outgoing message counts its encoded size until the socket has taken it.
package flowconn

import (
	"errors"
	"net"
	"sync"
	"time"

	"capnproto.org/go/capnp/v3/rpc/transport"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
)

// Limits are the bounds of a Pool. Zero fields take the defaults below.
type Limits struct {
	// Calls and Bytes bound one authenticated connection: calls read and not yet answered on
	// the wire, and encoded bytes handed to the transport and not yet written to the socket.
	Calls int
	Bytes int64
	// PreAuthCalls and PreAuthBytes bound a connection until Authenticate is called.
	PreAuthCalls int
	PreAuthBytes int64
	// GlobalCalls and GlobalBytes bound the sum over every connection of the pool. A connection
	// with fewer than ReserveCalls calls in flight may read whatever the global use, so clients
	// that stopped reading cannot starve a well-behaved one of its next call.
	GlobalCalls  int
	GlobalBytes  int64
	ReserveCalls int
	// DrainTimeout bounds how long Close waits for queued messages (an Abort, last returns) to
	// reach a peer that may have stopped reading.
	DrainTimeout time.Duration
}

// The defaults: about 128 unanswered calls per client, 16 MiB of unwritten replies (a
// getEventPage of 500 events of 1 KiB is about 0.5 MiB), 16 calls and 64 KiB before login,
// and 8,192 calls and 256 MiB over all connections.
const (
	DefaultCalls        = 128
	DefaultBytes        = 16 << 20
	DefaultPreAuthCalls = 16
	DefaultPreAuthBytes = 64 << 10
	DefaultGlobalCalls  = 8192
	DefaultGlobalBytes  = 256 << 20
	DefaultReserveCalls = 4
	DefaultDrainTimeout = time.Second
)

func (l Limits) withDefaults() Limits {
	set := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	set64 := func(v *int64, d int64) {
		if *v <= 0 {
			*v = d
		}
	}
	set(&l.Calls, DefaultCalls)
	set64(&l.Bytes, DefaultBytes)
	set(&l.PreAuthCalls, DefaultPreAuthCalls)
	set64(&l.PreAuthBytes, DefaultPreAuthBytes)
	set(&l.GlobalCalls, DefaultGlobalCalls)
	set64(&l.GlobalBytes, DefaultGlobalBytes)
	set(&l.ReserveCalls, DefaultReserveCalls)
	if l.DrainTimeout <= 0 {
		l.DrainTimeout = DefaultDrainTimeout
	}
	return l
}

// Pool is the accounting shared by every connection of one server.
type Pool struct {
	limits Limits

	mu     sync.Mutex
	cond   *sync.Cond // readers paused on a bound wait here; every release broadcasts
	calls  int
	bytes  int64
	pauses uint64
}

// NewPool returns a Pool with limits (zero fields take the defaults).
func NewPool(limits Limits) *Pool {
	p := &Pool{limits: limits.withDefaults()}
	p.cond = sync.NewCond(&p.mu)
	return p
}

// Limits returns the pool's bounds with the defaults filled in.
func (p *Pool) Limits() Limits { return p.limits }

// Stats is a snapshot of a pool's use.
type Stats struct {
	Calls  int    // calls read and not yet answered on the wire, over every connection
	Bytes  int64  // encoded bytes queued and not yet written, over every connection
	Pauses uint64 // times a connection stopped reading because of a bound
}

// Stats returns the pool's current use.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{Calls: p.calls, Bytes: p.bytes, Pauses: p.pauses}
}

// WaitFor blocks until cond holds for the pool's use or done is closed, and reports whether cond
// held. The pool wakes its waiters on every change, so tests wait on a condition, not a poll.
func (p *Pool) WaitFor(done <-chan struct{}, cond func(Stats) bool) bool {
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-done:
			p.mu.Lock()
			p.cond.Broadcast()
			p.mu.Unlock()
		case <-stop:
		}
	}()
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if cond(Stats{Calls: p.calls, Bytes: p.bytes, Pauses: p.pauses}) {
			return true
		}
		select {
		case <-done:
			return false
		default:
		}
		p.cond.Wait()
	}
}

// Transport is a flow-controlled go-capnp transport over one connection. Messages are written
// by one writer goroutine of its own, so that go-capnp's send loop never blocks on a slow peer
// and every queued message is counted with its size.
type Transport struct {
	pool  *Pool
	inner transport.Transport
	conn  net.Conn

	// guarded by pool.mu
	wcond     *sync.Cond // the writer waits here for work
	queue     []*outgoing
	calls     int
	bytes     int64
	authed    bool
	closed    bool // Close was called: read no more, write what is queued, then stop
	torndown  bool // the writer has stopped and returned this connection's use to the pool
	writeErr  error
	wasPaused bool

	writerDone chan struct{}
}

// New wraps conn in a go-capnp stream transport whose use is counted against pool.
func New(conn net.Conn, pool *Pool) *Transport {
	t := &Transport{pool: pool, inner: transport.NewStream(conn), conn: conn, writerDone: make(chan struct{})}
	t.wcond = sync.NewCond(&pool.mu)
	go t.write()
	return t
}

// Authenticate raises the connection's bounds from the pre-authentication ones.
func (t *Transport) Authenticate() {
	t.pool.mu.Lock()
	t.authed = true
	t.pool.cond.Broadcast()
	t.pool.mu.Unlock()
}

// mayRead reports whether the connection may read another message. Called with pool.mu held.
func (t *Transport) mayRead() bool {
	l := t.pool.limits
	calls, bytes := l.PreAuthCalls, l.PreAuthBytes
	if t.authed {
		calls, bytes = l.Calls, l.Bytes
	}
	if t.calls >= calls || t.bytes >= bytes {
		return false
	}
	if t.calls < l.ReserveCalls {
		return true
	}
	return t.pool.calls < l.GlobalCalls && t.pool.bytes < l.GlobalBytes
}

// RecvMessage reads the next message once the connection is within its bounds. While it waits,
// nothing reads the socket, so the peer's sends back up into its own TCP buffers.
func (t *Transport) RecvMessage() (transport.IncomingMessage, error) {
	p := t.pool
	p.mu.Lock()
	for !t.closed && !t.mayRead() {
		if !t.wasPaused {
			t.wasPaused = true
			p.pauses++
			p.cond.Broadcast() // for WaitFor
		}
		p.cond.Wait()
	}
	t.wasPaused = false
	p.mu.Unlock()

	in, err := t.inner.RecvMessage()
	if err != nil {
		return nil, err
	}
	switch in.Message().Which() {
	case rpccp.Message_Which_call, rpccp.Message_Which_bootstrap:
		// Each is answered by exactly one Return; the call is open until that is written.
		p.mu.Lock()
		if !t.torndown {
			t.calls++
			p.calls++
			p.cond.Broadcast()
		}
		p.mu.Unlock()
	}
	return in, nil
}

// NewMessage returns a message that, once sent, is counted until the socket has taken it.
func (t *Transport) NewMessage() (transport.OutgoingMessage, error) {
	m, err := t.inner.NewMessage()
	if err != nil {
		return nil, err
	}
	return &outgoing{t: t, inner: m}, nil
}

// Close stops reading, lets the writer flush what is queued (bounded by DrainTimeout, since
// the peer may be the one not reading), and closes the connection.
func (t *Transport) Close() error {
	p := t.pool
	p.mu.Lock()
	if t.closed {
		p.mu.Unlock()
		return errors.New("flowconn: already closed")
	}
	t.closed = true
	t.wcond.Signal()
	p.cond.Broadcast()
	p.mu.Unlock()
	// A write deadline is wall-clock time by nature: the kernel compares it to the real clock.
	t.conn.SetWriteDeadline(time.Now().Add(p.limits.DrainTimeout))
	<-t.writerDone
	return t.inner.Close()
}

// write is the writer goroutine: it writes queued messages in order and returns their bytes
// (and, for a Return, its call) to the connection's and the pool's budget once written.
func (t *Transport) write() {
	p := t.pool
	defer close(t.writerDone)
	for {
		p.mu.Lock()
		for len(t.queue) == 0 && !t.closed && t.writeErr == nil {
			t.wcond.Wait()
		}
		if len(t.queue) == 0 || t.writeErr != nil {
			t.teardown()
			p.mu.Unlock()
			return
		}
		m := t.queue[0]
		t.queue[0] = nil
		t.queue = t.queue[1:]
		p.mu.Unlock()

		err := m.inner.Send()

		p.mu.Lock()
		t.bytes -= m.size
		p.bytes -= m.size
		if m.isReturn {
			t.calls--
			p.calls--
		}
		m.written = true
		release := m.released
		if err != nil && t.writeErr == nil {
			t.writeErr = err
		}
		p.cond.Broadcast()
		p.mu.Unlock()
		if release {
			m.inner.Release()
		}
		if err != nil {
			// The socket is broken: closing it ends the read side, and go-capnp shuts the
			// connection down (and calls Close) from there.
			t.conn.Close()
		}
	}
}

// teardown returns what the connection still holds to the pool and releases messages that will
// never be written. Called by the writer with pool.mu held.
func (t *Transport) teardown() {
	p := t.pool
	p.calls -= t.calls
	p.bytes -= t.bytes
	t.calls, t.bytes = 0, 0
	t.torndown = true
	for _, m := range t.queue {
		m.written = true
		if m.released {
			m.inner.Release()
		}
	}
	t.queue = nil
	p.cond.Broadcast()
}

// outgoing is a message of a flow-controlled transport.
type outgoing struct {
	t     *Transport
	inner transport.OutgoingMessage

	// guarded by pool.mu
	size     int64
	isReturn bool
	queued   bool
	written  bool
	released bool
}

func (m *outgoing) Message() rpccp.Message { return m.inner.Message() }

// Send queues the message for the writer and returns at once. The message is complete by now
// (go-capnp builds it before queueing it for its send loop), so its size is final.
func (m *outgoing) Send() error {
	msg := m.inner.Message()
	size, err := msg.Message().TotalSize()
	if err != nil {
		return err
	}
	t, p := m.t, m.t.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if t.torndown || t.writeErr != nil {
		return errors.New("flowconn: connection closed")
	}
	m.size = int64(size)
	m.isReturn = msg.Which() == rpccp.Message_Which_return
	m.queued = true
	t.queue = append(t.queue, m)
	t.bytes += m.size
	p.bytes += m.size
	t.wcond.Signal()
	return nil
}

// Release frees the message, or, while it waits in the queue, lets the writer free it once
// written: go-capnp releases a message as soon as Send returns.
func (m *outgoing) Release() {
	p := m.t.pool
	p.mu.Lock()
	if m.released {
		p.mu.Unlock()
		return
	}
	m.released = true
	now := !m.queued || m.written
	p.mu.Unlock()
	if now {
		m.inner.Release()
	}
}
