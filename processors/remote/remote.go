// Package remote runs processors in a program of their own: it dials itxd, logs in, and mounts a
// ProcessorHost announcing the contracts of a processors.Host. itxd wakes it for processor-wake
// subscriptions placed "remote" whose name is one of those contracts; the host pages the stream
// itself (prefetching the next page while the runner works on one), runs the same runner as
// in-process hosting, and keeps each processor's progress, keepalive records and alarm on the
// stream through the ports itxd serves with every wake. A host that dies or loses its connection
// is an eviction: its subscriptions park, and the next mount of the contract (this program
// reconnecting, or another one anywhere) resumes them from the committed cursor, reviving
// obligations the dead incarnation owed.
package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/wire"
)

// Config says where to mount and what.
type Config struct {
	Addr  string           // itxd's host:port
	Token string           // a project token
	Name  string           // the mount name, shown by ProcessorHosts.list
	Host  *processors.Host // the contracts to run
	// WakeBudget bounds one wake's catch-up, checked between frames, and each frame's run (a
	// frame past it commits through the event it is at and leaves the rest to the next frame,
	// processors.RunnerConfig.FrameBudget); the host reports its committed cursor then, and itxd
	// wakes it again while it is behind. Keep it well under itxd's bound on a wake (twice its
	// delivery timeout, 40 s). Default 10 s.
	WakeBudget time.Duration
	// MountTimeout bounds logging in and mounting over a fresh connection: a connection that
	// accepted but does not answer (a stalled proxy in front of itxd) is given up and dialed
	// again. Default 10 s.
	MountTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait between reconnection attempts (doubling, with
	// jitter). Defaults 100 ms and 5 s.
	MinBackoff, MaxBackoff time.Duration
	// PingEvery is how often the host's connection pings itxd, and PingTimeout how long it
	// waits for the answer before it takes the connection for lost and the host dials again
	// (client.Options.PingEvery; defaults 15 s and 10 s; PingEvery < 0: never). TCP keepalive
	// learns of a peer that vanished, not of one that holds the connection open and answers
	// nothing (a stalled proxy between them, a hung itxd): the host stayed "mounted" there for
	// good while itxd, hearing nothing from it, had unmounted it.
	PingEvery, PingTimeout time.Duration
	// Clock is the processors' clock on this host (Args.Now, ScheduleAppend's times, keepalive
	// marks, frame budgets); nil is the system clock. Seed 002: a processor with expiry or
	// freshness logic takes now as an injected dependency, so a test that runs itxd on a
	// virtual clock runs the host on the same one, not on the host's wall clock.
	Clock itx.Clock
	Logf  func(format string, args ...any)
	// Mounted, if set, is told each time a mount succeeds (tests wait on it).
	Mounted func()
}

func (cfg *Config) defaults() {
	if cfg.Clock == nil {
		cfg.Clock = itx.SystemClock{}
	}
	if cfg.WakeBudget <= 0 {
		cfg.WakeBudget = 10 * time.Second
	}
	if cfg.MountTimeout <= 0 {
		cfg.MountTimeout = 10 * time.Second
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(5*time.Second, cfg.MinBackoff)
	}
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
}

// Run keeps the host mounted until ctx ends: it dials, logs in and mounts, serves wakes, and after
// losing the connection (itxd restarting, a network partition) dials again with backoff. It
// returns nil once ctx ends, and the refusal when itxd refuses the login or the mount for a
// reason no reconnection changes (an unknown, revoked or expired token: unauthenticated; a
// token without the rights to mount a host: permissionDenied; a bad name or contract:
// invalidArgument), rather than dial again forever.
func Run(ctx context.Context, cfg Config) error {
	cfg.defaults()
	if cfg.Host == nil || len(cfg.Host.Contracts()) == 0 {
		return itx.Errorf(itx.EInvalid, "remote: the host has no contracts to mount")
	}
	if cfg.Host.Version() == "" {
		// Refused here, not at every wake: a host without a version cannot open a processor
		// registry (the crash-loop budget's reset is keyed by it).
		return itx.Errorf(itx.EInvalid, "remote: the host has no version (processors.NewHost(version): the build's, a new one resets every crash-loop budget)")
	}
	backoff := client.NewBackoff(cfg.MinBackoff, cfg.MaxBackoff)
	for ctx.Err() == nil {
		started := time.Now()
		err := serveOnce(ctx, cfg)
		if ctx.Err() != nil {
			return nil
		}
		if refused, ok := errors.AsType[mountRefused](err); ok {
			cfg.Logf("remote host %q: %v; not reconnecting", cfg.Name, refused.err)
			return refused.err
		}
		wait := backoff.Next(time.Since(started))
		cfg.Logf("remote host %q: %v; reconnecting in %v", cfg.Name, err, wait.Round(time.Millisecond))
		if client.Sleep(ctx, wait) != nil {
			return nil
		}
	}
	return nil
}

// mountRefused is a refusal of the login or the mount that dialing again would not change.
type mountRefused struct{ err error }

func (e mountRefused) Error() string { return e.err.Error() }
func (e mountRefused) Unwrap() error { return e.err }

// serveOnce is one connection's life: mount, serve, and return why it ended.
func serveOnce(ctx context.Context, cfg Config) error {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	// The connection pings itxd (PingEvery) and closes itself once a ping goes unanswered: the
	// host learns of it below, as of any connection that ended.
	conn, err := client.DialWith(dctx, cfg.Addr, client.Options{PingEvery: cfg.PingEvery, PingTimeout: cfg.PingTimeout})
	cancel()
	if err != nil {
		return fmt.Errorf("dial %s: %w", cfg.Addr, err)
	}
	defer conn.Close()
	h := newHostServer(cfg)
	defer h.closeAll()
	// Bounded: a connection that accepted but never answers would otherwise hold this host
	// unmounted, and not reconnecting, for as long as it runs.
	mctx, cancel := context.WithTimeout(ctx, cfg.MountTimeout)
	project := conn.Login(mctx, cfg.Token)
	handle, err := Mount(mctx, project, cfg.Name, h)
	project.Release()
	cancel()
	if err != nil {
		switch itx.ErrorCode(err) {
		case itx.EUnauthenticated, itx.EPermissionDenied, itx.EInvalid:
			return mountRefused{err}
		}
		return err
	}
	defer handle.Release()
	cfg.Logf("remote host %q mounted on %s with %d contracts", cfg.Name, cfg.Addr, len(cfg.Host.Contracts()))
	if cfg.Mounted != nil {
		cfg.Mounted()
	}
	select {
	case <-conn.Done():
		if err := conn.Err(); err != nil {
			return fmt.Errorf("the connection to itxd ended: %w", err)
		}
		// Coded as a call on it would be: Run logs it, and reconnects.
		return itx.Errorf(itx.EDisconnected, "the connection to itxd was lost")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Mount mounts h on a project under name; keep the handle (releasing it unmounts).
func Mount(ctx context.Context, project schema.Project, name string, h *HostServer) (schema.Handle, error) {
	contracts := h.cfg.Host.Contracts()
	hosts, release := project.Processors(ctx, nil)
	defer release()
	fut, rel := hosts.Processors().Mount(ctx, func(p schema.ProcessorHosts_mount_Params) error {
		if err := p.SetName(name); err != nil {
			return err
		}
		list, err := p.NewContracts(int32(len(contracts)))
		if err != nil {
			return err
		}
		if err := wire.SetProcessorContracts(list, contracts); err != nil {
			return err
		}
		return p.SetHost(schema.ProcessorHost_ServerToClient(h))
	})
	defer client.ReleaseAfter(ctx, rel)
	res, err := client.Await(ctx, fut)
	if err != nil {
		return schema.Handle{}, fmt.Errorf("mount processor host %q: %w", name, err)
	}
	return res.Handle().AddRef(), nil
}

// HostServer serves ProcessorHost for one connection: a session per (stream, processor), each
// with its own registry over ports that reach the stream through itxd.
type HostServer struct {
	cfg Config

	// ctx ends when the host closes: wakes in progress give up their calls, so the connection
	// can close (go-capnp waits for them).
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	sessions map[sessionKey]*session
	closed   bool
}

type sessionKey struct{ streamID, name string }

// NewHostServer returns a host serving cfg.Host's contracts (for Mount; Run does this itself).
func NewHostServer(cfg Config) *HostServer { return newHostServer(cfg) }

func newHostServer(cfg Config) *HostServer {
	cfg.defaults()
	h := &HostServer{cfg: cfg, sessions: map[sessionKey]*session{}}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	return h
}

// closeAll ends every session: the eviction of this connection's processors.
func (h *HostServer) closeAll() {
	h.cancel()
	h.mu.Lock()
	sessions := h.sessions
	h.sessions, h.closed = map[sessionKey]*session{}, true
	h.mu.Unlock()
	for _, s := range sessions {
		s.close()
	}
}

// Shutdown runs when itxd drops the host (the connection ended or the mount was released).
func (h *HostServer) Shutdown() { h.closeAll() }

// session is one processor on one stream for this connection.
type session struct {
	streamID, path, name string
	ps                   itx.StreamProcessors
	hostCtx              context.Context // ends with the host

	mu     sync.Mutex
	gen    uint64
	stream schema.Stream
	ports  schema.ProcessorPorts
	log    *rpcLog
}

func (s *session) close() {
	s.ps.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stream.Release()
	s.ports.Release()
	// A wake still running (it stops at its next check of the host's end) gets null
	// capabilities, whose calls fail, not released ones, whose AddRef panics.
	s.stream, s.ports = schema.Stream{}, schema.ProcessorPorts{}
}

// refresh takes the capabilities of the latest wake (the ports carry its rewind, if any).
func (s *session) refresh(gen uint64, stream schema.Stream, ports schema.ProcessorPorts) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stream.Release()
	s.ports.Release()
	s.gen, s.stream, s.ports = gen, stream, ports
	s.log.reset()
}

// caps returns references to the latest wake's capabilities; the caller releases them (a later
// wake may replace the session's own meanwhile).
func (s *session) caps() (schema.Stream, schema.ProcessorPorts) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stream.AddRef(), s.ports.AddRef()
}

// streamCap and portsCap return one reference each, released by the caller.
func (s *session) streamCap() schema.Stream {
	st, p := s.caps()
	p.Release()
	return st
}

func (s *session) portsCap() schema.ProcessorPorts {
	st, p := s.caps()
	st.Release()
	return p
}

func (h *HostServer) session(ctx context.Context, key sessionKey, path string, gen uint64, stream schema.Stream, ports schema.ProcessorPorts) (*session, error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		stream.Release()
		ports.Release()
		return nil, itx.Errorf(itx.EUnavailable, "this host's connection is closing")
	}
	if s := h.sessions[key]; s != nil {
		h.mu.Unlock()
		s.refresh(gen, stream, ports)
		return s, nil
	}
	s := &session{streamID: key.streamID, path: path, name: key.name, gen: gen, stream: stream, ports: ports, hostCtx: h.ctx}
	s.log = &rpcLog{s: s}
	ps, err := h.cfg.Host.Open(ctx, itx.ProcessorPorts{
		Path: path, Log: s.log, Progress: rpcProgress{s}, KV: rpcKV{s}, Alarm: rpcAlarm{s},
		Clock: h.cfg.Clock, Logf: h.cfg.Logf,
		// A frame commits within the wake's budget too: itxd bounds the whole wake, and a page
		// slower than that bound, cut off whole, would be redelivered whole at every wake.
		FrameBudget: h.cfg.WakeBudget,
	})
	if err != nil {
		h.mu.Unlock()
		stream.Release()
		ports.Release()
		return nil, err
	}
	s.ps = ps
	h.sessions[key] = s
	h.mu.Unlock()
	return s, nil
}

// Wake catches the named processor up (or services its alarm) and reports its cursors.
func (h *HostServer) Wake(ctx context.Context, call schema.ProcessorHost_wake) error {
	req, err := call.Args().Request()
	if err != nil {
		return err
	}
	streamID, err := req.StreamId()
	if err != nil {
		return err
	}
	path, err := req.Path()
	if err != nil {
		return err
	}
	name, err := req.Name()
	if err != nil {
		return err
	}
	contract, err := req.Processor() // empty: the contract of the instance's own name
	if err != nil {
		return err
	}
	alarm, reprocessFrom := req.Alarm(), int64(req.ReprocessFrom())
	stream, ports := req.Stream().AddRef(), req.Ports().AddRef()
	call.Go()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(h.ctx, cancel)
	defer stop()
	s, err := h.session(ctx, sessionKey{streamID, name}, path, req.Generation(), stream, ports)
	if err != nil {
		return err
	}
	r, err := s.ps.Start(ctx, name, contract)
	if err != nil {
		return err
	}
	if pg := int64(req.ProgressGeneration()); pg > r.RuntimeState().Generation {
		// The record was claimed elsewhere since this runner claimed it (the instance ran
		// in-process, or on another host, meanwhile): this runner is fenced, though it has not
		// learned it yet. It ends before it runs anything, and a fresh one claims the record.
		s.ps.Stop(r)
		if r, err = s.ps.Start(ctx, name, contract); err != nil {
			return err
		}
	}
	if alarm {
		if err := s.ps.HandleAlarm(ctx); err != nil {
			return err
		}
	} else {
		if reprocessFrom > 0 {
			if err := r.ReprocessFrom(ctx, reprocessFrom); err != nil {
				return err
			}
		}
		if err := catchUpFor(ctx, s.log, r, h.cfg.WakeBudget); err != nil && ctx.Err() == nil {
			failing := itx.FailingEventOf(err)
			if failing <= 0 {
				return err
			}
			// A failure on an event: reported with the event's offset, which an exception
			// could not carry.
			report, rerr := newReport(call)
			if rerr != nil {
				return rerr
			}
			report.SetFailingEventOffset(uint64(failing))
			return report.SetFailure(err.Error())
		}
	}
	report, err := newReport(call)
	if err != nil {
		return err
	}
	reduced, _ := r.SnapshotJSON()
	report.SetProcessedOffset(uint64(max(r.ProcessedThrough(), 0)))
	report.SetReducedOffset(uint64(max(reduced, 0)))
	return nil
}

func newReport(call schema.ProcessorHost_wake) (schema.WakeReport, error) {
	res, err := call.AllocResults()
	if err != nil {
		return schema.WakeReport{}, err
	}
	return res.NewReport()
}

// catchUpFor delivers the stream to r from its processing cursor, frame by frame, through the
// head of its first read, and stops between frames once budget has passed: a frame in progress
// always finishes (cut, it would be redelivered whole at every wake, so a page slower than the
// budget would never commit). itxd bounds the whole wake anyway.
func catchUpFor(ctx context.Context, log itx.ProcessorLog, r itx.ProcessorRunner, budget time.Duration) error {
	deadline := time.Now().Add(budget)
	target := int64(-1)
	for {
		after := r.ProcessedThrough()
		if target >= 0 && (after >= target || time.Now().After(deadline)) {
			return nil
		}
		page, err := log.Read(ctx, after, processors.DefaultPageSize)
		if err != nil {
			return err
		}
		if target < 0 {
			target = page.Head
		}
		if page.ScannedThrough <= after {
			return nil
		}
		f := itx.ProcessorFrame{Events: page.Events, ScannedAfter: after, ScannedThrough: page.ScannedThrough, Head: page.Head, Continued: true, EphemeralOnly: page.EphemeralOnly}
		if err := r.Deliver(ctx, f); err != nil {
			return err
		}
	}
}

// Stop ends this connection's session of a processor whose subscription no longer runs here
// (removed, placed in-process, or running another contract): its runners' incarnation ends, as in
// an eviction, and its capabilities are released. A later wake opens a fresh session.
func (h *HostServer) Stop(ctx context.Context, call schema.ProcessorHost_stop) error {
	streamID, err := call.Args().StreamId()
	if err != nil {
		return err
	}
	name, err := call.Args().Name()
	if err != nil {
		return err
	}
	h.mu.Lock()
	s := h.sessions[sessionKey{streamID, name}]
	delete(h.sessions, sessionKey{streamID, name})
	h.mu.Unlock()
	if s != nil {
		s.close()
	}
	return nil
}

// Sessions is how many (stream, processor) sessions this connection holds.
func (h *HostServer) Sessions() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.sessions)
}

// GetRuntimeState answers for a processor this connection runs.
func (h *HostServer) GetRuntimeState(ctx context.Context, call schema.ProcessorHost_getRuntimeState) error {
	streamID, err := call.Args().StreamId()
	if err != nil {
		return err
	}
	name, err := call.Args().Name()
	if err != nil {
		return err
	}
	h.mu.Lock()
	s := h.sessions[sessionKey{streamID, name}]
	h.mu.Unlock()
	if s == nil {
		return itx.Errorf(itx.ENotFound, "processor %q has not been woken on this host yet", name)
	}
	r, ok := s.ps.Runner(name)
	if !ok {
		return itx.Errorf(itx.ENotFound, "processor %q is not running on this host", name)
	}
	b, err := json.Marshal(r.RuntimeState())
	if err != nil {
		return err
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return res.SetState(string(b))
}

// --- ports over RPC ------------------------------------------------------------------------

// rpcLog pages the stream through its capability, keeping the next page in flight while the
// runner works on the current one.
type rpcLog struct {
	s *session

	mu   sync.Mutex
	next *prefetch
}

type prefetch struct {
	after int64
	limit int
	done  chan struct{}
	page  itx.ProcessorPage
	err   error
}

func (l *rpcLog) reset() {
	l.mu.Lock()
	l.next = nil
	l.mu.Unlock()
}

func (l *rpcLog) fetch(ctx context.Context, after int64, limit int) (itx.ProcessorPage, error) {
	stream := l.s.streamCap()
	defer stream.Release()
	// Paged as the subscription is delivered: its filter composes with the contract's consumed
	// types (seed 000), and nextAfter passes what it drops, so a frame's scanned range is right.
	pg, err := client.GetEventPage(ctx, stream, itx.Query{After: after, Limit: limit, Subscription: l.s.name})
	if err != nil {
		return itx.ProcessorPage{}, err
	}
	page := itx.ProcessorPage{Events: pg.Events, ScannedThrough: pg.NextAfter, Head: pg.StreamMaxOffset}
	if len(page.Events) == 0 && page.ScannedThrough > after {
		// The filter hides durable events too: one unfiltered event (range reads are durable
		// unless asked) says whether the range holds only ephemeral offsets, which the runner
		// passes without a pass (seed 002: they never reach processor delivery).
		raw, err := client.GetEventPage(ctx, stream, itx.Query{After: after, Limit: 1})
		if err != nil {
			return itx.ProcessorPage{}, err
		}
		page.EphemeralOnly = len(raw.Events) == 0 || raw.Events[0].Offset > page.ScannedThrough
	}
	return page, nil
}

func (l *rpcLog) Read(ctx context.Context, after int64, limit int) (itx.ProcessorPage, error) {
	limit = min(max(limit, 1), itx.MaxPageLimit)
	l.mu.Lock()
	p := l.next
	l.next = nil
	l.mu.Unlock()
	var page itx.ProcessorPage
	var err error
	if p != nil && p.after == after && p.limit == limit {
		select {
		case <-p.done:
			page, err = p.page, p.err
		case <-ctx.Done():
			return itx.ProcessorPage{}, ctx.Err()
		}
	} else {
		page, err = l.fetch(ctx, after, limit)
	}
	if err == nil && page.ScannedThrough < page.Head && page.ScannedThrough > after {
		n := &prefetch{after: page.ScannedThrough, limit: limit, done: make(chan struct{})}
		l.mu.Lock()
		l.next = n
		l.mu.Unlock()
		go func() {
			defer close(n.done)
			fctx, cancel := context.WithTimeout(l.s.hostCtx, 30*time.Second)
			defer cancel()
			n.page, n.err = l.fetch(fctx, n.after, n.limit)
		}()
	}
	return page, err
}

// Schedule goes through the ports, as Append: refused once another host took the processor over.
func (l *rpcLog) Schedule(ctx context.Context, event itx.EventInput, at time.Time) error {
	ctx, done := l.s.bound(ctx)
	defer done()
	ports := l.s.portsCap()
	defer ports.Release()
	if err := client.NotSent(ctx, "schedule"); err != nil {
		return err
	}
	fut, release := ports.Schedule(ctx, func(p schema.ProcessorPorts_schedule_Params) error {
		ev, err := p.NewEvent()
		if err != nil {
			return err
		}
		p.SetDueAt(at.UnixMilli())
		return wire.SetEventInput(ev, &event)
	})
	defer client.ReleaseAfter(ctx, release)
	_, err := client.Await(ctx, fut)
	return err
}

// AppendTo forwards to another stream of the project through the ports (itx.ProcessorOutbox):
// itxd checks the mount, as for the processor's other records, and the subscription's scope.
func (l *rpcLog) AppendTo(ctx context.Context, path string, inputs []itx.EventInput) (itx.AppendResult, error) {
	return l.AppendToFrom(ctx, path, inputs, itx.EffectOrigin{})
}

// AppendToFrom is AppendTo saying which home event the forward comes from
// (itx.ProcessorEffectOutbox), so the receiving stream knows it again after a trim.
func (l *rpcLog) AppendToFrom(ctx context.Context, path string, inputs []itx.EventInput, origin itx.EffectOrigin) (itx.AppendResult, error) {
	if err := itx.CheckEffectOrigin(origin); err != nil {
		return itx.AppendResult{}, err
	}
	if err := client.CheckAppendSize(inputs); err != nil {
		return itx.AppendResult{}, err
	}
	ctx, done := l.s.bound(ctx)
	defer done()
	ports := l.s.portsCap()
	defer ports.Release()
	if err := client.NotSent(ctx, "appendTo"); err != nil {
		return itx.AppendResult{}, err
	}
	fut, release := ports.AppendTo(ctx, func(p schema.ProcessorPorts_appendTo_Params) error {
		if err := p.SetPath(path); err != nil {
			return err
		}
		p.SetSourceOffset(uint64(origin.Offset))
		p.SetProcessedThrough(uint64(origin.ProcessedThrough))
		return wire.SetEventInputs(p.NewEvents, inputs)
	})
	defer client.ReleaseAfter(ctx, release)
	res, err := client.Await(ctx, fut)
	if err != nil {
		return itx.AppendResult{}, err
	}
	r, err := res.Result()
	if err != nil {
		return itx.AppendResult{}, err
	}
	return wire.AppendResultFromSchema(r)
}

// Append commits through the ports, as AppendTo (itxd refuses it once another host took the
// processor over, where the plain stream capability would take it from a host frozen
// mid-frame), and reads the committed events back.
func (l *rpcLog) Append(ctx context.Context, inputs []itx.EventInput) ([]itx.Event, error) {
	res, err := l.AppendTo(ctx, l.s.path, inputs)
	if err != nil {
		return nil, err
	}
	ctx, done := l.s.bound(ctx)
	defer done()
	stream := l.s.streamCap()
	defer stream.Release()
	if len(res.Offsets) == 0 {
		return nil, nil
	}
	lo, hi := res.Offsets[0], res.Offsets[0]
	for _, o := range res.Offsets {
		lo, hi = min(lo, o), max(hi, o)
	}
	// The offsets up to itx.MaxPageLimit past lo (a duplicate's may lie far below the rest), page by
	// page: a page also ends at itx.MaxPageBytes, so an append of large events takes several.
	byOffset := make(map[int64]itx.Event, len(res.Offsets))
	for after, end := lo-1, min(hi, lo-1+itx.MaxPageLimit); after < end; {
		page, err := client.GetEventPage(ctx, stream, itx.Query{After: after, Before: end + 1, Limit: int(end - after), IncludeEphemeral: true})
		if err != nil {
			return nil, err
		}
		for _, e := range page.Events {
			byOffset[e.Offset] = e
		}
		if page.NextAfter <= after {
			break
		}
		after = page.NextAfter
	}
	out := make([]itx.Event, 0, len(res.Offsets))
	for i, o := range res.Offsets {
		e, ok := byOffset[o]
		if !ok { // beyond what was read: what was appended, at its offset
			e = itx.Event{Offset: o, Type: inputs[i].Type, Payload: inputs[i].Payload, Metadata: inputs[i].Metadata, IdempotencyKey: inputs[i].IdempotencyKey}
		}
		out = append(out, e)
	}
	return out, nil
}

type rpcProgress struct{ s *session }

func (p rpcProgress) Claim(ctx context.Context, name string) (*itx.ProcessorProgress, int64, error) {
	ctx, done := p.s.bound(ctx)
	defer done()
	ports := p.s.portsCap()
	defer ports.Release()
	if err := client.NotSent(ctx, "claim"); err != nil {
		return nil, 0, err
	}
	fut, release := ports.Claim(ctx, func(a schema.ProcessorPorts_claim_Params) error { return a.SetName(name) })
	defer client.ReleaseAfter(ctx, release)
	res, err := client.Await(ctx, fut)
	if err != nil {
		return nil, 0, err
	}
	raw, err := res.Progress()
	if err != nil {
		return nil, 0, err
	}
	var out *itx.ProcessorProgress
	if raw != "" {
		out = &itx.ProcessorProgress{}
		if err := json.Unmarshal([]byte(raw), out); err != nil {
			return nil, 0, fmt.Errorf("claim %q: progress does not decode: %w", name, err)
		}
	}
	return out, int64(res.Generation()), nil
}

func (p rpcProgress) Commit(ctx context.Context, name string, generation int64, pr itx.ProcessorProgress) error {
	ctx, done := p.s.bound(ctx)
	defer done()
	raw, err := json.Marshal(pr)
	if err != nil {
		return err
	}
	ports := p.s.portsCap()
	defer ports.Release()
	if err := client.NotSent(ctx, "commit"); err != nil {
		return err
	}
	fut, release := ports.Commit(ctx, func(a schema.ProcessorPorts_commit_Params) error {
		a.SetGeneration(uint64(generation))
		if err := a.SetName(name); err != nil {
			return err
		}
		return a.SetProgress(string(raw))
	})
	defer client.ReleaseAfter(ctx, release)
	_, err = client.Await(ctx, fut)
	if err != nil && itx.ErrorCode(err) == itx.EFailedPrecondition {
		return itx.AsError(err) // fenced: the runner retires
	}
	return err
}

// bound ends ctx with the host as well: a call to itxd made from the keepalive (which has no
// context of its own) or from a wake must not outlive the host, whose connection's close waits
// for the calls it serves.
func (s *session) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.hostCtx, cancel)
	return ctx, func() { stop(); cancel() }
}

func (p rpcProgress) Check(ctx context.Context, name string, generation int64) error {
	ctx, done := p.s.bound(ctx)
	defer done()
	ports := p.s.portsCap()
	defer ports.Release()
	if err := client.NotSent(ctx, "check"); err != nil {
		return err
	}
	fut, release := ports.Check(ctx, func(a schema.ProcessorPorts_check_Params) error {
		a.SetGeneration(uint64(generation))
		return a.SetName(name)
	})
	defer client.ReleaseAfter(ctx, release)
	_, err := client.Await(ctx, fut)
	if err != nil && itx.ErrorCode(err) == itx.EFailedPrecondition {
		return itx.AsError(err) // fenced: the runner retires
	}
	return err
}

type rpcKV struct{ s *session }

func (k rpcKV) Delete(ctx context.Context, key string) error {
	ctx, done := k.s.bound(ctx)
	defer done()
	ports := k.s.portsCap()
	defer ports.Release()
	if err := client.NotSent(ctx, "kvDelete"); err != nil {
		return err
	}
	fut, release := ports.KvDelete(ctx, func(a schema.ProcessorPorts_kvDelete_Params) error { return a.SetKey(key) })
	defer client.ReleaseAfter(ctx, release)
	_, err := client.Await(ctx, fut)
	return err
}

func (k rpcKV) Get(ctx context.Context, key string) ([]byte, bool, error) {
	ctx, done := k.s.bound(ctx)
	defer done()
	ports := k.s.portsCap()
	defer ports.Release()
	if err := client.NotSent(ctx, "kvGet"); err != nil {
		return nil, false, err
	}
	fut, release := ports.KvGet(ctx, func(a schema.ProcessorPorts_kvGet_Params) error { return a.SetKey(key) })
	defer client.ReleaseAfter(ctx, release)
	res, err := client.Await(ctx, fut)
	if err != nil {
		return nil, false, err
	}
	v, err := res.Value()
	return append([]byte(nil), v...), res.Found(), err
}

func (k rpcKV) Put(ctx context.Context, key string, value []byte) error {
	ctx, done := k.s.bound(ctx)
	defer done()
	ports := k.s.portsCap()
	defer ports.Release()
	if err := client.NotSent(ctx, "kvPut"); err != nil {
		return err
	}
	fut, release := ports.KvPut(ctx, func(a schema.ProcessorPorts_kvPut_Params) error {
		if err := a.SetKey(key); err != nil {
			return err
		}
		return a.SetValue(value)
	})
	defer client.ReleaseAfter(ctx, release)
	_, err := client.Await(ctx, fut)
	return err
}

type rpcAlarm struct{ s *session }

func (a rpcAlarm) SetAlarm(ctx context.Context, at time.Time) error {
	ctx, done := a.s.bound(ctx)
	defer done()
	ms := int64(0)
	if !at.IsZero() {
		ms = max(at.UnixMilli(), 1)
	}
	ports := a.s.portsCap()
	defer ports.Release()
	if err := client.NotSent(ctx, "setAlarm"); err != nil {
		return err
	}
	fut, release := ports.SetAlarm(ctx, func(p schema.ProcessorPorts_setAlarm_Params) error {
		p.SetAt(ms)
		return nil
	})
	defer client.ReleaseAfter(ctx, release)
	_, err := client.Await(ctx, fut)
	return err
}
