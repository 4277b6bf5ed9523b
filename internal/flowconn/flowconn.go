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
//
// Some of what a client holds cannot be bounded by not reading, because what frees it arrives
// behind the next calls: a Return whose results hold a capability stays in go-capnp's answer
// table (results and all) until the client's Finish, and an exported capability until the client's Release. A connection whose
// client holds more than its bound of either is aborted with limitExceeded, as is one that has
// not logged in within LoginTimeout, and the pool refuses connections past its count.
package flowconn

import (
	"bufio"
	"container/list"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/rpc/transport"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/tcpopt"
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
	// MaxMessage bounds one message read from a logged-in connection (PreAuthMaxMessage before
	// login): a larger one aborts the connection with limitExceeded before its body is read.
	// CallBytes bounds the encoded bytes of the calls one logged-in connection has in flight
	// (read, not yet answered on the wire: go-capnp holds each call's message until then), and
	// GlobalCallBytes their sum over every connection (with the ReserveCalls exemption).
	MaxMessage        int64
	PreAuthMaxMessage int64
	CallBytes         int64
	GlobalCallBytes   int64
	// DrainTimeout bounds how long Close waits for queued messages (an Abort, last returns) to
	// reach a peer that may have stopped reading.
	DrainTimeout time.Duration

	// Unfinished and UnfinishedBytes bound the replies a connection's client has not finished
	// (count, and their encoded bytes): go-capnp keeps each Return whose results hold a
	// capability until the client's Finish (the others say noFinishNeeded and are not held),
	// and Go clients send it 250 ms after the Return, so a fast legitimate client holds its
	// last quarter second of such replies. PreAuthUnfinished(Bytes) apply before login.
	Unfinished             int
	UnfinishedBytes        int64
	PreAuthUnfinished      int
	PreAuthUnfinishedBytes int64
	// Capabilities bounds the capabilities one connection has handed its client and the client
	// has not released (go-capnp's export table), checked before each message is read.
	Capabilities int
	// Unreturned bounds the calls the server made on a connection's capabilities (an
	// EventSink, a LiveSubscriber, a Receiver, a processor host) that its client has not
	// returned: go-capnp keeps each question until its Return, also once the call was
	// cancelled (its ID cannot be reused before), so a client that never returns grew the
	// server by each call for the connection's life.
	Unreturned int
	// GlobalCapabilities and GlobalUnreturned bound the sums of the two above over every
	// connection of the pool: past one, the connection holding the most of it (among those not
	// already ending) is aborted with limitExceeded, so clients under their own bounds on many
	// connections cannot grow the server by connections times the per-connection bound.
	GlobalCapabilities int
	GlobalUnreturned   int
	// Connections bounds the pool's open connections; Open refuses one past it.
	Connections int
	// PreAuthConnsPerAddress bounds the connections from one remote address (AddressKey: an
	// IPv4 address, an IPv6 /64; loopback not counted) that have not logged in yet; Open
	// refuses one past it. Without it a peer with no token held every Connections slot for the
	// login window and nobody could connect.
	PreAuthConnsPerAddress int
	// PreAuthConnections bounds the connections not logged in yet over every address: one
	// more closes the oldest of them (with an Abort saying so), so peers on many addresses
	// holding connections open without logging in cannot keep a client out whose login comes
	// before PreAuthConnections newer connections do. 0: a quarter of Connections, at least 64
	// (or Connections, if fewer), so that clients dialing together under a small Connections
	// do not close each other.
	PreAuthConnections int
	// LoginTimeout is how long a connection may stay unauthenticated before it is aborted,
	// on Clock (nil: the system clock).
	LoginTimeout time.Duration
	Clock        itx.Clock
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
	// ReserveMessageBytes is the largest message a connection within its reserve (fewer than
	// ReserveCalls calls in flight) reads whatever the calls' bytes over all connections: a
	// small call always goes, a larger one waits for room in GlobalCallBytes.
	ReserveMessageBytes = 64 << 10
	DefaultDrainTimeout = time.Second

	// One append is at most 8 MiB of events (itx.MaxAppendBytes) plus its encoding; a login is
	// a token. 64 MiB of calls in flight is 128 calls of 512 KiB, or 4 of the largest appends.
	DefaultMaxMessage        = 16 << 20
	DefaultPreAuthMaxMessage = 64 << 10
	DefaultCallBytes         = 64 << 20
	DefaultGlobalCallBytes   = 1 << 30

	DefaultUnfinished             = 16384
	DefaultUnfinishedBytes        = 256 << 20
	DefaultPreAuthUnfinished      = 64
	DefaultPreAuthUnfinishedBytes = 1 << 20
	DefaultCapabilities           = 65536
	DefaultUnreturned             = 65536
	DefaultGlobalCapabilities     = 131072
	DefaultGlobalUnreturned       = 262144
	DefaultConnections            = 4096
	// A client's connection is not logged in for one round trip (the Go client pipelines its
	// login behind the bootstrap), so 64 at once from one address is a fleet behind one NAT
	// reconnecting together; one peer holding 64 idle connections takes 1/64 of Connections.
	DefaultPreAuthConnsPerAddress = 64
	DefaultLoginTimeout           = 30 * time.Second
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
	set64(&l.MaxMessage, DefaultMaxMessage)
	set64(&l.PreAuthMaxMessage, DefaultPreAuthMaxMessage)
	set64(&l.CallBytes, DefaultCallBytes)
	set64(&l.GlobalCallBytes, DefaultGlobalCallBytes)
	if l.DrainTimeout <= 0 {
		l.DrainTimeout = DefaultDrainTimeout
	}
	set(&l.Unfinished, DefaultUnfinished)
	set64(&l.UnfinishedBytes, DefaultUnfinishedBytes)
	set(&l.PreAuthUnfinished, DefaultPreAuthUnfinished)
	set64(&l.PreAuthUnfinishedBytes, DefaultPreAuthUnfinishedBytes)
	set(&l.Capabilities, DefaultCapabilities)
	set(&l.Unreturned, DefaultUnreturned)
	set(&l.GlobalCapabilities, DefaultGlobalCapabilities)
	set(&l.GlobalUnreturned, DefaultGlobalUnreturned)
	set(&l.Connections, DefaultConnections)
	set(&l.PreAuthConnsPerAddress, DefaultPreAuthConnsPerAddress)
	set(&l.PreAuthConnections, max(l.Connections/4, min(l.Connections, 64)))
	if l.LoginTimeout <= 0 {
		l.LoginTimeout = DefaultLoginTimeout
	}
	if l.Clock == nil {
		l.Clock = itx.SystemClock{}
	}
	return l
}

// Pool is the accounting shared by every connection of one server.
type Pool struct {
	limits Limits

	mu        sync.Mutex
	cond      *sync.Cond // readers paused on a bound wait here; every release broadcasts
	calls     int
	bytes     int64
	callBytes int64
	pauses    uint64
	conns     int
	aborts    uint64
	refused   uint64
	refusing  int
	// preAuth counts the connections of each address (AddressKey) not logged in yet;
	// refusedByAddress the connections Open refused for PreAuthConnsPerAddress.
	preAuth          map[string]int
	refusedByAddress uint64
	// waiting: the connections not logged in yet, oldest first; evicted counts those closed
	// for PreAuthConnections.
	waiting *list.List
	evicted uint64
	onEvict func(remote net.Addr, err error) // see OnEvict
	// reading: the bytes of the messages whose bodies are being read (their header taken),
	// counted against GlobalCallBytes with callBytes so that connections reading at once
	// cannot each pass the bound by a message.
	reading int64

	unfinished      int
	unfinishedBytes int64
	unreturned      int
	reserved        int64                   // reply bytes reserved by calls building them (ReserveReply)
	replyWaits      int                     // callers of ReserveReply waiting for room
	exports         int                     // the sum of the connections' exportsSeen
	all             map[*Transport]struct{} // the connections not torn down, for shedLocked
}

// NewPool returns a Pool with limits (zero fields take the defaults).
func NewPool(limits Limits) *Pool {
	p := &Pool{limits: limits.withDefaults(), all: map[*Transport]struct{}{}, preAuth: map[string]int{}, waiting: list.New()}
	p.cond = sync.NewCond(&p.mu)
	return p
}

// Limits returns the pool's bounds with the defaults filled in.
func (p *Pool) Limits() Limits { return p.limits }

// Stats is a snapshot of a pool's use.
type Stats struct {
	Calls     int    // calls read and not yet answered on the wire, over every connection
	Bytes     int64  // encoded bytes queued and not yet written, over every connection
	CallBytes int64  // encoded bytes of the calls read and not yet answered, over every connection
	Pauses    uint64 // times a connection stopped reading because of a bound
	Conns     int    // open connections
	Aborts    uint64 // connections aborted for a bound (unfinished replies, capabilities, login)
	Refused   uint64 // connections refused because Connections were open
	// RefusedByAddress: connections refused because their address had PreAuthConnsPerAddress
	// connections not logged in yet.
	RefusedByAddress uint64
	// PreAuthEvicted: connections not logged in yet closed to make room for a newer one
	// (PreAuthConnections).
	PreAuthEvicted  uint64
	PreAuth         int   // connections not logged in yet
	Unfinished      int   // replies written whose Finish has not arrived, over every connection
	UnfinishedBytes int64 // their encoded bytes
	Unreturned      int   // calls sent to clients that have not returned them, over every connection
	Capabilities    int   // capabilities clients hold, over every connection (as last counted before a read)
	ReplyWaits      int   // calls waiting for room for their reply (ReserveReply): clients not reading theirs
}

// Stats returns the pool's current use.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats()
}

func (p *Pool) stats() Stats {
	return Stats{Calls: p.calls, Bytes: p.bytes, CallBytes: p.callBytes, Pauses: p.pauses, Conns: p.conns, Aborts: p.aborts,
		Refused: p.refused, RefusedByAddress: p.refusedByAddress,
		PreAuthEvicted: p.evicted, PreAuth: p.waiting.Len(), Unfinished: p.unfinished, UnfinishedBytes: p.unfinishedBytes, Unreturned: p.unreturned,
		Capabilities: p.exports, ReplyWaits: p.replyWaits}
}

// errTooMany is Open's refusal.
func (p *Pool) errTooMany() error {
	return itx.Errorf(itx.ELimitExceeded, "itxd serves at most %d connections at once (--rpc-max-connections)", p.limits.Connections)
}

// Open wraps conn in a flow-controlled transport, or, with Connections already open or
// PreAuthConnsPerAddress of conn's address not logged in yet, writes an Abort saying so to conn
// (within DrainTimeout), closes it and returns the refusal (a *RefusedError).
func (p *Pool) Open(conn net.Conn) (*Transport, error) {
	key := AddressKey(conn.RemoteAddr())
	p.mu.Lock()
	var err error
	switch {
	case p.conns >= p.limits.Connections:
		p.refused++
		err = &RefusedError{Address: key, err: p.errTooMany()}
	case key != "" && p.preAuth[key] >= p.limits.PreAuthConnsPerAddress:
		p.refusedByAddress++
		err = &RefusedError{Address: key, PerAddress: true, err: itx.Errorf(itx.ELimitExceeded,
			"itxd serves at most %d connections not logged in yet from one address (--rpc-preauth-max-connections-per-address): log in on the ones open first",
			p.limits.PreAuthConnsPerAddress)}
	}
	if err != nil {
		p.cond.Broadcast()
		p.mu.Unlock()
		p.refuse(conn, err)
		return nil, err
	}
	p.conns++
	p.cond.Broadcast()
	p.mu.Unlock()
	var oldest *Transport
	var cut bool
	var why error
	t := newTransport(conn, p, func(t *Transport) {
		// Counted as it is registered, under the same lock as its teardown's release.
		t.addrKey = key
		if key != "" {
			p.preAuth[key]++
		}
		t.waiting = p.waiting.PushBack(t)
		if p.waiting.Len() > p.limits.PreAuthConnections {
			oldest = p.waiting.Front().Value.(*Transport)
			oldest.leavePreAuthLocked()
			p.evicted++
			why = itx.Errorf(itx.ELimitExceeded,
				"itxd keeps at most %d connections not logged in yet (--rpc-preauth-max-connections): the oldest is closed for a newer one; log in sooner after connecting",
				p.limits.PreAuthConnections)
			cut = oldest.abortLocked(why)
		}
	})
	if oldest != nil {
		if cut {
			oldest.cutRead()
		}
		if f := p.onEvict; f != nil {
			f(oldest.conn.RemoteAddr(), why)
		}
	}
	return t, nil
}

// OnEvict sets f to be told of each connection Open closes for PreAuthConnections, with its
// peer's address and the reason it was sent. Call it before the first Open.
func (p *Pool) OnEvict(f func(remote net.Addr, err error)) { p.onEvict = f }

// RefusedError is Open's refusal: which bound, and the address (AddressKey) refused.
type RefusedError struct {
	Address    string // AddressKey of the peer; "" for loopback
	PerAddress bool   // refused for PreAuthConnsPerAddress, not Connections
	err        error
}

func (e *RefusedError) Error() string { return e.err.Error() }
func (e *RefusedError) Unwrap() error { return e.err }

// AddressKey is what PreAuthConnsPerAddress counts a peer under: its IPv4 address, or the /64
// of its IPv6 address (one host is routinely given a whole /64, so counting single IPv6
// addresses bounded nobody; a link-local address is counted whole). Loopback peers give "": they are processes of this machine,
// which reach its resources without itxd's help, and every local client (processor hosts,
// the itx REPL, a TLS-terminating proxy in front of itxd, tests) shares the one address.
func AddressKey(a net.Addr) string {
	var ip netip.Addr
	switch a := a.(type) {
	case *net.TCPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	default:
		if a == nil {
			return ""
		}
		ap, err := netip.ParseAddrPort(a.String())
		if err != nil {
			return ""
		}
		ip = ap.Addr()
	}
	ip = ip.Unmap()
	switch {
	case !ip.IsValid() || ip.IsLoopback():
		return ""
	case ip.Is4():
		return ip.String()
	case ip.IsLinkLocalUnicast():
		return ip.WithZone("").String() // every link's is fe80::/64: the prefix tells no host apart
	}
	pfx, _ := ip.WithZone("").Prefix(64)
	return pfx.String()
}

// leavePreAuthLocked gives back t's place among its address's connections not logged in
// (at login, or when it ends before). Called with pool.mu held.
func (t *Transport) leavePreAuthLocked() {
	if t.waiting == nil {
		return
	}
	p := t.pool
	p.waiting.Remove(t.waiting)
	t.waiting = nil
	if t.addrKey == "" {
		return
	}
	if p.preAuth[t.addrKey] <= 1 {
		delete(p.preAuth, t.addrKey)
	} else {
		p.preAuth[t.addrKey]--
	}
}

// maxRefusing bounds the refused connections whose Abort is still being delivered; past it a
// refused connection is closed at once.
const maxRefusing = 64

// refuse writes an Abort carrying err to a connection that is not served and closes it, in a
// goroutine of its own (at most maxRefusing at once, each for at most DrainTimeout).
func (p *Pool) refuse(conn net.Conn, err error) {
	p.mu.Lock()
	if p.refusing >= maxRefusing {
		p.mu.Unlock()
		conn.Close()
		return
	}
	p.refusing++
	p.mu.Unlock()
	go func() {
		refuse(conn, err, p.limits.DrainTimeout)
		p.mu.Lock()
		p.refusing--
		p.mu.Unlock()
	}()
}

func refuse(conn net.Conn, err error, timeout time.Duration) {
	defer conn.Close()
	tr := transport.NewStream(conn)
	m, merr := tr.NewMessage()
	if merr != nil {
		return
	}
	defer m.Release()
	a, merr := m.Message().NewAbort()
	if merr != nil || a.SetReason(err.Error()) != nil {
		return
	}
	a.SetType(rpccp.Exception_Type_overloaded)
	conn.SetWriteDeadline(time.Now().Add(timeout)) // a wall-clock deadline: the kernel's clock
	if m.Send() == nil {
		linger(conn, timeout)
	}
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
		if cond(p.stats()) {
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
	dec   *capnp.Decoder // inner's: its MaxMessageSize is set before each read
	hr    *headerReader  // dec's source: before login, RecvMessage reads the header first

	// guarded by pool.mu
	wcond     *sync.Cond // the writer waits here for work
	queue     []*outgoing
	calls     int
	bytes     int64
	callBytes int64 // of the calls in open
	reserved  int64 // reply bytes reserved by calls building them (ReserveReply)
	// handoff: reservations their calls released, still counted in reserved until a reply is
	// queued (see ReserveReply's release), oldest first; never more than the calls in flight
	// whose reply is not queued yet (calls - closesQueued).
	handoff      []int64
	handoffBytes int64 // the sum of handoff
	replyWaits   int   // this connection's callers of ReserveReply waiting for room
	closesQueued int   // queued messages that end a call (closesCall), not written yet
	authed       bool
	addrKey      string        // AddressKey of the peer, counted in pool.preAuth while waiting
	waiting      *list.Element // in pool.waiting until logged in, evicted or torn down
	closed       bool          // Close was called: read no more, write what is queued, then stop
	torndown     bool          // the writer has stopped and returned this connection's use to the pool
	writeErr     error
	wasPaused    bool
	// hangupArmed: a checkHangup is scheduled; hungUp: it found the client gone while the
	// connection was held back.
	hangupArmed bool
	hungUp      bool
	abortErr    error // set by abort: RecvMessage returns it, and go-capnp aborts with it

	// Answers the client has not finished. open holds the ids of calls (and bootstraps) read
	// and not yet returned with their message's encoded size, finishedEarly those of them the
	// client finished before their Return, unfinished the returned ones with their Return's
	// encoded size.
	open            map[uint32]int64
	finishedEarly   map[uint32]struct{}
	unfinished      map[uint32]int64
	unfinishedBytes int64

	exports     func() int // the capabilities the client holds (go-capnp's export table)
	exportsSeen int        // exports() as last counted, in pool.exports
	// questions are the ids of the calls this side sent that the client has not returned.
	questions  map[uint32]struct{}
	loginTimer itx.Timer

	writerDone chan struct{}
	// answered are the functions WhenAnswered holds until no call is in flight.
	answered []func()
}

// New wraps conn in a go-capnp stream transport whose use is counted against pool, whatever
// the pool's connection count (Open is New with the count checked).
func New(conn net.Conn, pool *Pool) *Transport {
	pool.mu.Lock()
	pool.conns++
	pool.mu.Unlock()
	return newTransport(conn, pool, nil)
}

// newTransport builds the transport of conn; register, if not nil, runs with pool.mu held as
// the transport joins the pool.
func newTransport(conn net.Conn, pool *Pool, register func(*Transport)) *Transport {
	// Buffered: a small message's header and body take one read, not two (at most 4 KiB are
	// read ahead of the message being decoded while the connection is held back).
	hr := &headerReader{conn: bufio.NewReaderSize(conn, 4096)}
	codec := &streamCodec{Decoder: capnp.NewDecoder(hr), Encoder: capnp.NewEncoder(conn), Closer: conn}
	t := &Transport{pool: pool, inner: transport.New(codec), conn: conn, hr: hr, dec: codec.Decoder, writerDone: make(chan struct{}),
		open: map[uint32]int64{}, finishedEarly: map[uint32]struct{}{}, unfinished: map[uint32]int64{},
		questions: map[uint32]struct{}{}}
	t.wcond = sync.NewCond(&pool.mu)
	pool.mu.Lock()
	pool.all[t] = struct{}{}
	if register != nil {
		register(t)
	}
	pool.mu.Unlock()
	d := pool.limits.LoginTimeout
	t.loginTimer = pool.limits.Clock.AfterFunc(d, func() {
		t.abort(itx.Errorf(itx.EDeadlineExceeded, "no login within %s (--rpc-login-timeout)", d), true)
	})
	go t.write()
	return t
}

// Authenticate raises the connection's bounds from the pre-authentication ones and ends its
// login deadline.
func (t *Transport) Authenticate() {
	t.loginTimer.Stop()
	t.pool.mu.Lock()
	t.leavePreAuthLocked()
	t.authed = true
	t.pool.cond.Broadcast()
	t.pool.mu.Unlock()
}

// WhenAnswered runs f, once and on its own goroutine, when every call read from the connection
// has its answer written (at once if none is in flight), when the connection ends, or after max,
// whichever comes first. A connection closed from inside a call's handler (a login revoking its
// own token) closes this way, so the caller reads that call's answer before the Abort: go-capnp's
// Close drops the replies it has not handed to the transport yet. max bounds a client that keeps
// calls in flight.
func (t *Transport) WhenAnswered(max time.Duration, f func()) {
	var once sync.Once
	run := func() { once.Do(func() { go f() }) }
	p := t.pool
	p.mu.Lock()
	if t.calls == 0 || t.torndown {
		p.mu.Unlock()
		run()
		return
	}
	t.answered = append(t.answered, run)
	p.mu.Unlock()
	p.limits.Clock.AfterFunc(max, run)
}

// takeAnswered returns the functions WhenAnswered holds once no call is in flight (or the
// connection is torn down), for the caller to run after it lets go of pool.mu.
func (t *Transport) takeAnswered() []func() {
	if t.calls > 0 && !t.torndown {
		return nil
	}
	fs := t.answered
	t.answered = nil
	return fs
}

// CountCapabilities installs how to count the capabilities the client holds (rpc.Conn's
// ExportCount, for the Conn built on this transport). Before each message is read, a count
// above Limits.Capabilities aborts the connection: every capability it exports comes from a
// call the client sent.
func (t *Transport) CountCapabilities(count func() int) {
	t.pool.mu.Lock()
	t.exports = count
	t.pool.mu.Unlock()
}

// abort ends the connection with err: the reader stops (a blocked read is cut short by a past
// deadline), RecvMessage returns err, and go-capnp sends it to the client as an Abort. With
// onlyUnauthed, a connection that has logged in meanwhile is left alone.
func (t *Transport) abort(err error, onlyUnauthed bool) {
	p := t.pool
	p.mu.Lock()
	if onlyUnauthed && t.authed {
		p.mu.Unlock()
		return
	}
	cut := t.abortLocked(err)
	p.mu.Unlock()
	if cut {
		t.cutRead()
	}
}

// abortLocked records err as the reason the connection ends, so that RecvMessage reads nothing
// more, and reports whether the caller must then cut a blocked read short (cutRead, without
// pool.mu). Called with pool.mu held.
func (t *Transport) abortLocked(err error) bool {
	if t.abortErr != nil || t.closed {
		return false
	}
	t.abortErr = verbatimAbort{err}
	t.pool.aborts++
	t.pool.cond.Broadcast()
	return true
}

// shedLocked keeps a resource the connections hold within global over the whole pool: once the
// connections not already ending hold more than global of it (total counts every connection, so
// the scan runs only past the bound), the one holding the most (held) is aborted with why(its
// count), and returned for the caller to cut its read short once pool.mu is released. A
// well-behaved client holding little is never the one aborted while another holds more.
// Called with pool.mu held.
func (p *Pool) shedLocked(total, global int, held func(*Transport) int, why func(n int) error) *Transport {
	if total <= global {
		return nil
	}
	var victim *Transport
	live, most := 0, -1
	for t := range p.all {
		if t.abortErr != nil || t.closed || t.torndown {
			continue
		}
		n := held(t)
		live += n
		if n > most {
			victim, most = t, n
		}
	}
	if live <= global || victim == nil || !victim.abortLocked(why(most)) {
		return nil
	}
	return victim
}

// verbatimAbort marks a session bound's error: go-capnp (patched) sends it as the Abort's reason
// as it is, without the "reader: " it puts before other errors from reading the connection.
type verbatimAbort struct{ error }

func (verbatimAbort) AbortVerbatim()  {}
func (e verbatimAbort) Unwrap() error { return e.error }

// cutRead ends a read in progress with a past deadline (the kernel's clock).
func (t *Transport) cutRead() { t.conn.SetReadDeadline(time.Now()) }

// unfinishedBounds returns the connection's bounds on unfinished replies. pool.mu held.
func (t *Transport) unfinishedBounds() (int, int64) {
	if t.authed {
		return t.pool.limits.Unfinished, t.pool.limits.UnfinishedBytes
	}
	return t.pool.limits.PreAuthUnfinished, t.pool.limits.PreAuthUnfinishedBytes
}

// ReserveReply waits until the connection may build a reply of up to n bytes, and reserves them
// until release (call it once the reply is built and handed on). Not reading a connection only
// stops new calls: the calls already read (up to the calls bound) would each still build its
// reply, and a client that pipelined a hundred 4 MiB reads and stopped reading had itxd queue
// 400 MiB for it, whatever the reply-bytes bound. A call that may answer with a large reply
// reserves it first, and waits while the connection's unwritten and reserved bytes would pass
// its bound, or the pool's would pass the global one; a connection with nothing unwritten or
// reserved always gets its reservation, so one reply at a time is never refused, and clients
// that stopped reading cannot starve another. onWait, when set, runs once (with the pool's lock
// held) before the first wait: the caller lets go of what it need not hold meanwhile. It fails
// once ctx is done or the connection ends. Call it from a call's handler and release before the
// handler returns: the room stays counted after the release until a reply is queued.
func (t *Transport) ReserveReply(ctx context.Context, n int64, onWait func()) (release func(), err error) {
	p := t.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	var stop func() bool // set once it waits: the caller's ctx ending wakes it too
	defer func() {
		if stop != nil {
			stop() // runs before the unlock; a callback under way takes the lock after it
			p.replyWaits--
			t.replyWaits--
		}
	}()
	for {
		if t.closed || t.torndown || t.abortErr != nil {
			return nil, errors.New("flowconn: connection closed")
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		held := t.bytes + t.reserved
		// Released reservations whose replies are on their way (handoff) count against the
		// bound, and go as a call's reply is queued. With nothing else held, a reservation
		// waits on them only while some call may still queue one: one whose reply is not queued
		// yet and that is not itself waiting here (a release after its reply, which no handler
		// does, would otherwise leave the waiters waiting on each other).
		handsOn := t.calls - t.closesQueued - t.replyWaits
		if stop == nil {
			handsOn-- // this caller, not counted yet as waiting, is one of the calls
		}
		if held == 0 || (held == t.handoffBytes && handsOn <= 0) ||
			(held+n <= p.limits.Bytes && p.bytes+p.reserved+n <= p.limits.GlobalBytes) {
			break
		}
		if stop == nil { // no goroutine nor callback for the reads that do not wait
			if onWait != nil {
				onWait()
			}
			p.replyWaits++
			t.replyWaits++
			if held == t.handoffBytes && t.replyWaits > 1 {
				p.cond.Broadcast() // one call fewer may hand on: another waiter may go (above)
			}
			stop = context.AfterFunc(ctx, func() {
				p.mu.Lock()
				p.cond.Broadcast()
				p.mu.Unlock()
			})
		}
		p.cond.Wait()
	}
	t.reserved += n
	p.reserved += n
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			if !t.torndown {
				// The room stays reserved until a reply is queued (outgoing.Send): the caller
				// releases it as its handler returns, and go-capnp queues the reply after that, so
				// letting it go now let another read reserve before those bytes counted (with many
				// handlers between the two under load, the bound was passed by a page each).
				t.handoff = append(t.handoff, n)
				t.handoffBytes += n
				t.trimHandoff()
			}
			if p.replyWaits > 0 { // a wait may end on what is no longer held live (see the loop)
				p.cond.Broadcast()
			}
			p.mu.Unlock()
		})
	}, nil
}

// trimHandoff lets go of the released reservations no reply can still come for: more than the
// calls in flight whose reply is not queued yet (a reservation made outside a call, or a call
// that ended without one). Called with pool.mu held.
func (t *Transport) trimHandoff() {
	if k := len(t.handoff) - max(t.calls-t.closesQueued, 0); k > 0 {
		t.letGo(k)
	}
}

// letGo releases the k oldest reservations of handoff; the caller wakes the waiting
// reservations. Called with pool.mu held.
func (t *Transport) letGo(k int) {
	for _, n := range t.handoff[:k] {
		t.reserved -= n
		t.handoffBytes -= n
		t.pool.reserved -= n
	}
	clear(t.handoff[:k])
	t.handoff = t.handoff[k:]
}

// mayRead reports whether the connection may read another message. Called with pool.mu held.
func (t *Transport) mayRead() bool {
	l := t.pool.limits
	calls, bytes := l.PreAuthCalls, l.PreAuthBytes
	if t.authed {
		calls, bytes = l.Calls, l.Bytes
	}
	if t.calls >= calls || t.bytes >= bytes || (t.authed && t.callBytes >= l.CallBytes) {
		return false
	}
	if t.calls < l.ReserveCalls {
		return true
	}
	return t.pool.calls < l.GlobalCalls && t.pool.bytes < l.GlobalBytes && t.pool.callBytes < l.GlobalCallBytes
}

// callRoomLocked reports whether the next message, of n bytes, may be read: the calls' bytes
// over all connections and the messages being read stay within GlobalCallBytes with it, or
// nothing at all is in flight (a message larger than the bound still goes alone), or the
// connection is within its reserve and the message small. Called with pool.mu held.
func (t *Transport) callRoomLocked(n int64) bool {
	p, l := t.pool, t.pool.limits
	held := p.callBytes + p.reading
	return held == 0 || held+n <= l.GlobalCallBytes || (t.calls < l.ReserveCalls && n <= ReserveMessageBytes)
}

// maxMessage is the largest message the connection may read next, with the flag naming it.
// Called with pool.mu held.
func (t *Transport) maxMessage() (int64, string) {
	if t.authed {
		return t.pool.limits.MaxMessage, "--rpc-max-message-bytes"
	}
	return t.pool.limits.PreAuthMaxMessage, "--rpc-preauth-max-message-bytes"
}

// HangupPoll is how often a connection held back by a bound checks whether its client closed
// it: while held back nothing reads the socket, so the close would otherwise be seen only once a
// call ends (a waitForEvent may run for minutes), and everything the connection holds with it.
const HangupPoll = time.Second

// errPeerClosed ends a held-back connection whose client closed it: as reading its end would.
var errPeerClosed = fmt.Errorf("the client closed the connection while it was held back: %w", io.EOF)

// checkHangup runs every HangupPoll while the connection is held back, and ends it once its
// client has closed it (tcpopt.PeerClosed reads nothing).
func (t *Transport) checkHangup() {
	p := t.pool
	p.mu.Lock()
	if !t.wasPaused || t.closed || t.abortErr != nil {
		t.hangupArmed = false // the next pause arms it again
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	closed := tcpopt.PeerClosed(t.conn)
	p.mu.Lock()
	defer p.mu.Unlock()
	if closed {
		t.hungUp = true
		t.hangupArmed = false
		p.cond.Broadcast()
		return
	}
	p.limits.Clock.AfterFunc(HangupPoll, t.checkHangup)
}

// peekSize reads the next message's declared size (headerReader.peek); a read the connection's
// abort interrupted fails with the abort's error.
func (t *Transport) peekSize() (int64, error) {
	size, err := t.hr.peek()
	if err != nil {
		t.pool.mu.Lock()
		abortErr := t.abortErr
		t.pool.mu.Unlock()
		if abortErr != nil {
			return 0, abortErr
		}
		return 0, err
	}
	return size, nil
}

// RecvMessage reads the next message once the connection is within its bounds. While it waits,
// nothing reads the socket, so the peer's sends back up into its own TCP buffers.
func (t *Transport) RecvMessage() (transport.IncomingMessage, error) {
	p := t.pool
	p.mu.Lock()
	for !t.closed && t.abortErr == nil && !t.hungUp && !t.mayRead() {
		if !t.wasPaused {
			t.wasPaused = true
			p.pauses++
			p.cond.Broadcast() // for WaitFor
			if !t.hangupArmed {
				t.hangupArmed = true
				p.limits.Clock.AfterFunc(HangupPoll, t.checkHangup)
			}
		}
		p.cond.Wait()
	}
	t.wasPaused = false
	if t.hungUp && !t.closed && t.abortErr == nil {
		p.mu.Unlock()
		return nil, errPeerClosed
	}
	exports, abortErr := t.exports, t.abortErr
	maxMsg, maxFlag := t.maxMessage()
	p.mu.Unlock()
	if abortErr != nil {
		return nil, abortErr
	}
	if exports != nil {
		n, max := exports(), p.limits.Capabilities
		if n > max {
			err := itx.Errorf(itx.ELimitExceeded, "the client holds %d capabilities of this connection, above its bound of %d (--rpc-max-capabilities): release the ones it no longer uses", n, max)
			t.abort(err, false)
			// Verbatim, as abortLocked records it: go-capnp put "reader: " before a plain
			// error, and the client read "reader: itx.limitExceeded: ...", unlike every other
			// bound's Abort.
			return nil, verbatimAbort{err}
		}
		p.mu.Lock()
		// Not once the writer tore the connection down (a write failed, the client gone): it
		// returned exportsSeen to the pool then, and what is counted after it would stay there
		// for good, against every other connection's global bound.
		if !t.torndown {
			p.exports += n - t.exportsSeen
			t.exportsSeen = n
		}
		victim := p.shedLocked(p.exports, p.limits.GlobalCapabilities, func(u *Transport) int { return u.exportsSeen }, func(n int) error {
			return itx.Errorf(itx.ELimitExceeded, "clients hold %d capabilities over all connections, above itxd's bound of %d (--rpc-global-max-capabilities), and this one holds the most (%d): release the ones it no longer uses",
				p.exports, p.limits.GlobalCapabilities, n)
		})
		abortErr := t.abortErr
		p.mu.Unlock()
		if victim != nil {
			victim.cutRead()
		}
		if abortErr != nil {
			return nil, abortErr
		}
	}

	peeked := int64(-1) // the next message's declared size, once its header is read
	if maxMsg < p.limits.MaxMessage {
		// Before login: a client may pipeline a large call behind its login (login ->
		// streams -> get -> append, sent at once), which is read before the login is
		// answered. A message above the pre-login bound waits, unread, while a call it may
		// follow is open; once the connection logs in, the logged-in bound applies.
		size, err := t.peekSize()
		if err != nil {
			return nil, err
		}
		peeked = size
		if size > maxMsg {
			p.mu.Lock()
			for !t.authed && t.calls > 0 && !t.closed && t.abortErr == nil {
				p.cond.Wait()
			}
			maxMsg, maxFlag = t.maxMessage()
			abortErr := t.abortErr
			p.mu.Unlock()
			if abortErr != nil {
				return nil, abortErr
			}
		}
	}

	// The calls' bytes over all connections (GlobalCallBytes): the message takes its room
	// before its body is read, and waits for it unless it is small and the connection within
	// its reserve. The reserve alone (fewer than ReserveCalls calls always read) let every
	// connection hold ReserveCalls calls of up to MaxMessage each, whatever the global bound:
	// waitForEvent calls padded to 16 MiB, 4 on each of 16 connections, held 1 GiB under a
	// bound of 64 MiB. Only what a logged-in connection sends can be large.
	var taken int64
	if maxMsg > ReserveMessageBytes {
		size := peeked
		if size < 0 {
			var err error
			if size, err = t.peekSize(); err != nil {
				return nil, err
			}
		}
		if size <= 0 || size > maxMsg {
			size = maxMsg // not declared in a header peek reads: the most it may be
		}
		p.mu.Lock()
		for paused := false; !t.closed && t.abortErr == nil && !t.callRoomLocked(size); {
			if !paused { // held back: counted as the other bounds' pauses are
				paused = true
				p.pauses++
				p.cond.Broadcast() // for WaitFor
			}
			p.cond.Wait()
		}
		abortErr := t.abortErr
		if abortErr == nil {
			taken = size
			p.reading += taken
		}
		p.mu.Unlock()
		if abortErr != nil {
			return nil, abortErr
		}
		defer func() {
			p.mu.Lock()
			p.reading -= taken
			p.cond.Broadcast()
			p.mu.Unlock()
		}()
	}

	// The decoder refuses a message whose header says it is larger before it reads the body,
	// so a client cannot make the server hold more than the bound by declaring it. Only this
	// goroutine reads, so setting the bound here is not racy.
	t.dec.MaxMessageSize = uint64(maxMsg)
	in, err := t.inner.RecvMessage()
	if err != nil {
		p.mu.Lock()
		if t.abortErr == nil && !t.closed && strings.Contains(err.Error(), "message too large") {
			t.abortLocked(itx.Errorf(itx.ELimitExceeded, "the client sent a message larger than this connection's bound of %d bytes (%s)", maxMsg, maxFlag))
		}
		abortErr := t.abortErr
		p.mu.Unlock()
		if abortErr != nil {
			return nil, abortErr
		}
		return nil, err
	}
	msg := in.Message()
	switch msg.Which() {
	case rpccp.Message_Which_call, rpccp.Message_Which_bootstrap:
		// Each is answered by exactly one Return; the call is open until that is written. One
		// whose struct cannot be read (its pointer out of the message, say) go-capnp reports
		// and drops, answering nothing: counted, it stayed open for the connection's life,
		// against its calls bound and the pool's, and a connection waiting for its open calls
		// to end (a large message before login) waited until its login deadline.
		var id uint32
		var readErr error
		if msg.Which() == rpccp.Message_Which_call {
			c, err := msg.Call()
			id, readErr = c.QuestionId(), err
		} else {
			b, err := msg.Bootstrap()
			id, readErr = b.QuestionId(), err
		}
		size, _ := msg.Message().TotalSize()
		p.mu.Lock()
		if !t.torndown && readErr == nil {
			t.calls++
			p.calls++
			if old, dup := t.open[id]; dup { // a reused id: go-capnp aborts the connection for it
				t.callBytes -= old
				p.callBytes -= old
			}
			t.open[id] = int64(size)
			t.callBytes += int64(size)
			p.callBytes += int64(size)
			p.cond.Broadcast()
		}
		p.mu.Unlock()
	case rpccp.Message_Which_finish:
		f, _ := msg.Finish()
		id := f.QuestionId()
		p.mu.Lock()
		if size, ok := t.unfinished[id]; ok {
			delete(t.unfinished, id)
			t.unfinishedBytes -= size
			p.unfinished--
			p.unfinishedBytes -= size
			p.cond.Broadcast()
		} else if _, ok := t.open[id]; ok {
			t.finishedEarly[id] = struct{}{}
		} // an unknown id, or a reply that needed no Finish: go-capnp ignores it
		p.mu.Unlock()
	case rpccp.Message_Which_return:
		r, _ := msg.Return()
		p.mu.Lock()
		if _, ok := t.questions[r.AnswerId()]; ok {
			delete(t.questions, r.AnswerId())
			p.unreturned--
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
	p.mu.Lock()
	aborted := t.abortErr != nil
	p.mu.Unlock()
	if aborted {
		// Nothing reads this socket any more: closing it with the client's calls unread would
		// reset it, and the client's kernel could drop the Abort saying why before it is read.
		linger(t.conn, p.limits.DrainTimeout)
	}
	return t.inner.Close()
}

// linger half-closes conn after what was written and discards what the peer still sends, until
// it closes too, d passes or 1 MiB was discarded, so that the last message written (an Abort)
// reaches the peer instead of a reset.
func linger(conn net.Conn, d time.Duration) {
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	conn.SetReadDeadline(time.Now().Add(d)) // the kernel's clock
	io.CopyN(io.Discard, conn, 1<<20)
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
			answered := t.takeAnswered()
			p.mu.Unlock()
			for _, f := range answered {
				f()
			}
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
		if m.closesCall {
			t.calls--
			p.calls--
			t.closesQueued--
		}
		m.written = true
		release := m.released
		if err != nil && t.writeErr == nil {
			t.writeErr = err
		}
		var answered []func()
		if m.closesCall {
			answered = t.takeAnswered()
		}
		p.cond.Broadcast()
		p.mu.Unlock()
		for _, f := range answered {
			f()
		}
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
	p.callBytes -= t.callBytes
	t.calls, t.bytes, t.callBytes = 0, 0, 0
	t.leavePreAuthLocked()
	t.torndown = true
	p.conns--
	t.loginTimer.Stop()
	p.unfinished -= len(t.unfinished)
	p.unfinishedBytes -= t.unfinishedBytes
	p.unreturned -= len(t.questions)
	p.reserved -= t.reserved
	t.reserved, t.handoff, t.handoffBytes, t.closesQueued = 0, nil, 0, 0
	p.exports -= t.exportsSeen
	t.exportsSeen = 0
	delete(p.all, t)
	t.open, t.finishedEarly, t.unfinished, t.unfinishedBytes, t.questions = nil, nil, nil, 0, nil
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
	size       int64
	isReturn   bool
	closesCall bool // a Return, or an Unimplemented echoing a call: the call ends once written
	queued     bool
	written    bool
	released   bool
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
	cut := false
	var victim *Transport // another connection aborted for a global bound
	defer func() {
		if cut {
			t.cutRead()
		}
		if victim != nil {
			victim.cutRead()
		}
	}()
	p.mu.Lock()
	defer p.mu.Unlock()
	if t.torndown || t.writeErr != nil {
		return errors.New("flowconn: connection closed")
	}
	m.size = int64(size)
	m.isReturn = msg.Which() == rpccp.Message_Which_return
	m.closesCall = m.isReturn
	if msg.Which() == rpccp.Message_Which_unimplemented {
		// go-capnp answers a Call it does not serve (results sent elsewhere than to the
		// caller) by echoing it in an Unimplemented, without a Return: the call ends there,
		// and no Finish is awaited. Counted in flight for good, such calls stopped their
		// connection being read once they were as many as its calls bound.
		if u, err := msg.Unimplemented(); err == nil && u.Which() == rpccp.Message_Which_call {
			if c, err := u.Call(); err == nil {
				if size, ok := t.open[c.QuestionId()]; ok {
					m.closesCall = true
					t.callBytes -= size
					p.callBytes -= size
					delete(t.open, c.QuestionId())
					delete(t.finishedEarly, c.QuestionId())
				}
			}
		}
	}
	m.queued = true
	t.queue = append(t.queue, m)
	t.bytes += m.size
	p.bytes += m.size
	if m.closesCall {
		// The oldest released reservation goes as a reply is queued: its bytes count as
		// unwritten from now. Each reservation's own reply comes after its release, so none is
		// held past it (another call's reply may take it first: released a little early).
		t.closesQueued++
		if len(t.handoff) > 0 {
			t.letGo(1)
			if p.replyWaits > 0 { // only reservations wait on what is reserved
				p.cond.Broadcast()
			}
		}
	}
	t.wcond.Signal()
	if msg.Which() == rpccp.Message_Which_call {
		c, _ := msg.Call()
		if _, ok := t.questions[c.QuestionId()]; !ok {
			t.questions[c.QuestionId()] = struct{}{}
			p.unreturned++
		}
		if n := len(t.questions); n > p.limits.Unreturned {
			cut = t.abortLocked(itx.Errorf(itx.ELimitExceeded, "the client has not returned %d of the calls itxd made on its capabilities, above this connection's bound of %d (--rpc-max-unreturned-calls): a Cap'n Proto peer returns every call, also one the caller cancelled",
				n, p.limits.Unreturned))
		}
		if !cut {
			victim = p.shedLocked(p.unreturned, p.limits.GlobalUnreturned, func(u *Transport) int { return len(u.questions) }, func(n int) error {
				return itx.Errorf(itx.ELimitExceeded, "clients have not returned %d of the calls itxd made on their capabilities over all connections, above itxd's bound of %d (--rpc-global-max-unreturned-calls), and this connection's client holds the most (%d): a Cap'n Proto peer returns every call, also one the caller cancelled",
					p.unreturned, p.limits.GlobalUnreturned, n)
			})
		}
	}
	if m.isReturn {
		// go-capnp keeps the answer (this message) until the client's Finish.
		r, _ := msg.Return()
		id := r.AnswerId()
		if size, ok := t.open[id]; ok {
			// go-capnp released the call's message (its arguments) when the method returned.
			t.callBytes -= size
			p.callBytes -= size
			delete(t.open, id)
		}
		if _, ok := t.finishedEarly[id]; ok {
			delete(t.finishedEarly, id)
		} else if r.NoFinishNeeded() {
			// go-capnp forgot the answer as it sent it (results without capabilities; see
			// third_party/go-capnp/PATCHES.md): nothing is held, no Finish is awaited.
		} else if _, ok := t.unfinished[id]; !ok {
			t.unfinished[id] = m.size
			t.unfinishedBytes += m.size
			p.unfinished++
			p.unfinishedBytes += m.size
			if n, b := t.unfinishedBounds(); len(t.unfinished) > n || t.unfinishedBytes > b {
				flags := "--rpc-max-unfinished-replies, --rpc-max-unfinished-reply-bytes"
				if !t.authed {
					flags = "before login: --rpc-preauth-max-unfinished-replies, --rpc-preauth-max-unfinished-reply-bytes"
				}
				err := itx.Errorf(itx.ELimitExceeded, "the client holds %d replies (%d bytes) it has not finished, above this connection's bound of %d replies or %d bytes (%s): a Cap'n Proto client sends Finish for every Return once it is done with the results",
					len(t.unfinished), t.unfinishedBytes, n, b, flags)
				cut = t.abortLocked(err) // from now on nothing more is read
			}
		}
	}
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

// headerReader is the decoder's source: the socket, after any header bytes peek has read.
type headerReader struct {
	conn io.Reader
	pre  []byte // read by peek, not yet by the decoder
	buf  [8 + 4*maxPeekSegments]byte
}

// maxPeekSegments bounds the segment table peek reads; a message with more segments is left to
// the decoder (which refuses what it must) with its size taken as unknown (0).
const maxPeekSegments = 64

func (h *headerReader) Read(b []byte) (int, error) {
	if len(h.pre) > 0 {
		n := copy(b, h.pre)
		h.pre = h.pre[n:]
		return n, nil
	}
	return h.conn.Read(b)
}

// peek reads the next message's stream header (the segment count and sizes) and returns the
// size it declares, keeping the bytes for the decoder.
func (h *headerReader) peek() (int64, error) {
	if len(h.pre) > 0 {
		return 0, nil // already peeked (cannot happen: each peek is followed by a decode)
	}
	if _, err := io.ReadFull(h.conn, h.buf[:4]); err != nil {
		return 0, err
	}
	segs := int64(binary.LittleEndian.Uint32(h.buf[:4])) + 1
	if segs > maxPeekSegments {
		h.pre = h.buf[:4]
		return 0, nil
	}
	n := 4 + 4*int(segs)
	n += n % 8 // padded to a word
	if _, err := io.ReadFull(h.conn, h.buf[4:n]); err != nil {
		return 0, err
	}
	size := int64(n)
	for i := range int(segs) {
		size += 8 * int64(binary.LittleEndian.Uint32(h.buf[4+4*i:]))
	}
	h.pre = h.buf[:n]
	return size, nil
}

// streamCodec is go-capnp's stream codec (transport.NewStream's) with its decoder in reach, so
// the transport can bound the size of the next message it reads.
type streamCodec struct {
	*capnp.Decoder
	*capnp.Encoder
	io.Closer
}
