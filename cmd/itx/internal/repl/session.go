// Package repl is the engine of the itx client: a JavaScript runtime (goja) whose `project`
// global is the itx capability graph, a printer for results and errors, the dot-command
// registry and the interactive terminal.
//
// Navigation (project.streams.get("/a").subscriptions.get("agent")) sends pipelined calls and
// never waits; only a terminal method (append, getEvents, describe...) waits for its answer, so
// a whole chain costs one round trip. From JavaScript every call is synchronous.
package repl

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"capnproto.org/go/capnp/v3"
	"github.com/dop251/goja"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
)

// Format selects how results are printed.
type Format int

const (
	// FormatAuto prints pretty JSON, and lists of flat records as tables when Config.TTY is set.
	FormatAuto Format = iota
	// FormatPretty prints indented JSON.
	FormatPretty
	// FormatJSON prints one compact JSON document per result, for machines.
	FormatJSON
	// FormatTable prints lists of flat records as aligned tables, everything else as FormatPretty.
	FormatTable
)

// ParseFormat parses a --output value.
func ParseFormat(s string) (Format, error) {
	switch s {
	case "auto", "":
		return FormatAuto, nil
	case "pretty":
		return FormatPretty, nil
	case "json":
		return FormatJSON, nil
	case "table":
		return FormatTable, nil
	}
	return 0, fmt.Errorf("unknown output format %q (auto, pretty, json, table)", s)
}

func (f Format) String() string {
	return [...]string{"auto", "pretty", "json", "table"}[f]
}

// Config says where to connect and how to print.
type Config struct {
	Addr  string
	Token string
	// TLS, when set, connects over TLS with this configuration.
	TLS *tls.Config
	Out io.Writer // results
	Err io.Writer // errors
	// Format is the output format; FormatAuto uses tables only when TTY is set.
	Format Format
	TTY    bool // Out is a terminal
	Color  bool // Err is a terminal: errors in red
	// Size reports the terminal's columns and rows (0 when unknown): tables are fitted to the
	// width, and results taller than the screen go through Pager.
	Size func() (cols, rows int)
	// Wide prints tables at their full width, never cutting a column.
	Wide bool
	// Pager is a shell command a result taller than the screen is piped through on a terminal
	// (empty: none); its output goes to PagerOut, the terminal itself.
	Pager    string
	PagerOut io.Writer
	// ReconnectTimeout bounds how long a call waits for a lost connection to come back
	// (default 30 s).
	ReconnectTimeout time.Duration
	// In is what `itx import <path>` reads when given no file (standard input); nil: none.
	In io.Reader
	// TokenHint, when set, is added to an unauthenticated error: where the token came from and
	// what to do (a token read from a data directory's credentials.json may have been revoked).
	TokenHint string
}

// Session is one connection to itxd, logged into one project, with its JavaScript runtime.
// It is not safe for concurrent use: one evaluation at a time.
type Session struct {
	cfg  Config
	ifcs map[string]*Interface

	// linkMu guards conn and project, which a reconnect replaces: the terminal's watcher reads
	// them from its own goroutine. They are replaced only while vmMu is held too, so code that
	// runs under vmMu (every evaluation and command) reads them without linkMu.
	linkMu  sync.Mutex
	conn    *client.Conn
	project schema.Project
	// lossSaid is the Done channel of the connection whose loss the terminal's watcher has
	// announced, so that a call waiting for the same reconnect does not announce it again.
	lossSaid <-chan struct{}

	vm     *goja.Runtime
	capSym *goja.Symbol
	// labelSym marks the objects the prompt makes for what is not a capability path (a
	// connection, a live view, a mounted receiver) with the label they print as.
	labelSym *goja.Symbol

	caps *capCache
	// callCtx is the context of the evaluation in progress: every terminal call uses it, so
	// cancelling it (Ctrl-C) cancels the call that is waiting.
	callCtx context.Context
	// sessionCtx outlives evaluations: navigation calls use it, since cancelling the context of
	// a pipelined call would break the capability it returns for every later use.
	sessionCtx    context.Context
	cancelSession context.CancelFunc

	declared []string // top-level names scripts declared, for completion
	// relativeTimes shows times as "5m ago" in tables (.time relative).
	relativeTimes bool
	// vmMu is held while the runtime runs. readline processes keys typed ahead during a call
	// on its own goroutine, so completion must not touch the runtime then.
	vmMu sync.Mutex
	// evaluating is set while a program runs: a capability's missing member throws only then
	// (strictMembers).
	evaluating atomic.Bool

	liveMu sync.Mutex
	live   map[liveHandle]struct{} // open connections and live-state registrations
}

// Connect dials cfg.Addr and logs in with cfg.Token. The login is pipelined: a bad token fails
// the first call, not Connect (Session.Describe checks it).
func Connect(ctx context.Context, cfg Config) (*Session, error) {
	ifcs, err := Interfaces()
	if err != nil {
		return nil, err
	}
	conn, err := client.DialWith(ctx, cfg.Addr, client.Options{TLS: cfg.TLS})
	if err != nil {
		return nil, itx.Errorf(itx.EUnavailable, "%v", err)
	}
	if cfg.ReconnectTimeout == 0 {
		cfg.ReconnectTimeout = 30 * time.Second
	}
	sctx, cancel := context.WithCancel(context.Background())
	s := &Session{
		cfg: cfg, conn: conn, ifcs: ifcs,
		caps:       newCapCache(256),
		sessionCtx: sctx, cancelSession: cancel,
		live: make(map[liveHandle]struct{}),
	}
	s.project = conn.Login(sctx, cfg.Token)
	if err := s.initVM(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Close ends open connections and live views, releases every capability and closes the
// connection.
func (s *Session) Close() error {
	s.vmMu.Lock() // not during an evaluation, nor while the watcher adopts a new connection
	defer s.vmMu.Unlock()
	s.dropCapabilities()
	s.cancelSession()
	s.linkMu.Lock()
	defer s.linkMu.Unlock()
	s.project.Release()
	return s.conn.Close()
}

// dropCapabilities ends open connections and live views and releases every cached capability:
// at the session's end, or when the connection they lived on is replaced.
func (s *Session) dropCapabilities() {
	s.liveMu.Lock()
	live := s.live
	s.live = map[liveHandle]struct{}{}
	s.liveMu.Unlock()
	for h := range live {
		h.release()
	}
	s.caps.releaseAll()
}

// Done is closed when the current connection ends.
func (s *Session) Done() <-chan struct{} {
	s.linkMu.Lock()
	defer s.linkMu.Unlock()
	return s.conn.Done()
}

// lostBecause is " (itxd aborted the connection: <reason>)" when the server ended the current
// connection with a reason (a bound the session crossed), or "".
func (s *Session) lostBecause() string {
	s.linkMu.Lock()
	defer s.linkMu.Unlock()
	if err := s.conn.Err(); err != nil {
		return " (" + err.Error() + ")"
	}
	return ""
}

// connected reports whether the current connection is up.
func (s *Session) connected() bool {
	select {
	case <-s.Done():
		return false
	default:
		return true
	}
}

// dial opens a new connection and checks the login on it (so a reconnect reports a bad token
// instead of retrying it).
func (s *Session) dial(ctx context.Context) (*client.Conn, schema.Project, error) {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := client.DialWith(dctx, s.cfg.Addr, client.Options{TLS: s.cfg.TLS})
	if err != nil {
		return nil, schema.Project{}, itx.Errorf(itx.EUnavailable, "%v", err)
	}
	project := conn.Login(s.sessionCtx, s.cfg.Token)
	if _, err := client.DescribeProject(dctx, project); err != nil {
		project.Release()
		conn.Close()
		if code := itx.ErrorCode(err); code != itx.EUnauthenticated && code != itx.EPermissionDenied {
			if s.cfg.TLS == nil && speaksTLS(ctx, s.cfg.Addr) {
				// Plain Cap'n Proto to a TLS listener: it answers with an alert and closes, which
				// reads as a broken connection. Not worth retrying: say what to do.
				return nil, schema.Project{}, s.servesTLS()
			}
			// Not a refused login: the connection broke under it. An itxd that is going away
			// (killed, say) can complete a dial from its listen backlog and then reset it.
			return nil, schema.Project{}, itx.Errorf(itx.EUnavailable, "%s", itx.ErrorMessage(err))
		}
		return nil, schema.Project{}, err
	}
	return conn, project, nil
}

// adopt makes conn the session's connection. The caller holds vmMu. Variables keep working:
// a capability in JavaScript is a path from the project, reached again on its next use.
func (s *Session) adopt(conn *client.Conn, project schema.Project) {
	s.dropCapabilities()
	s.linkMu.Lock()
	oldConn, oldProject := s.conn, s.project
	s.conn, s.project = conn, project
	s.linkMu.Unlock()
	oldProject.Release()
	oldConn.Close()
	fmt.Fprintf(s.cfg.Err, "itx: reconnected to %s\n", s.cfg.Addr)
}

// tlsHint is the error to show instead of err when the connection broke because itxd serves
// TLS and this session spoke plain Cap'n Proto to it (the server answers with an alert and
// closes: a "disconnected" or a write error, which says nothing of the cause); nil otherwise.
func (s *Session) tlsHint(ctx context.Context, err error) error {
	s.linkMu.Lock()
	noConn := s.conn == nil
	s.linkMu.Unlock()
	if s.cfg.TLS != nil || noConn {
		return nil
	}
	switch f := Describe(err); f.Code {
	case "disconnected":
		select { // its end may be noted a moment after the call failed
		case <-s.Done():
		case <-time.After(time.Second):
			return nil
		}
	case string(itx.EInternal), string(itx.EUnavailable): // a write that failed, say
		// The connection's end may be noted a moment after its write failed: go-capnp's own
		// error ("rpc: send message: ...", "rpc: connection closed") is checked as such whether
		// or not it is noted yet (speaksTLS decides).
		if s.connected() && !strings.Contains(err.Error(), "rpc: ") {
			return nil
		}
	default:
		return nil
	}
	if !speaksTLS(ctx, s.cfg.Addr) {
		return nil
	}
	return s.servesTLS()
}

// servesTLS is the error for a plain connection to an itxd that serves TLS.
func (s *Session) servesTLS() error {
	return itx.Errorf(itx.EFailedPrecondition, "itxd at %s serves TLS: connect with --tls (and --ca FILE when its certificate comes from your own CA)", s.cfg.Addr)
}

// speaksTLS reports whether addr completes a TLS handshake (any certificate: only the protocol
// is in question), within a second.
func speaksTLS(ctx context.Context, addr string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // a probe, nothing is sent
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// Reconnect backoff (client.Backoff): the first retry soon, then doubling up to a ceiling.
const (
	reconnectFirstDelay = 100 * time.Millisecond
	reconnectMaxDelay   = 5 * time.Second
)

// redial dials until it gets a connection, backing off between attempts, until ctx ends. Only
// an unreachable server is retried; a refused login is returned at once.
func (s *Session) redial(ctx context.Context) (*client.Conn, schema.Project, error) {
	backoff := client.NewBackoff(reconnectFirstDelay, reconnectMaxDelay)
	for {
		conn, project, err := s.dial(ctx)
		if err == nil {
			return conn, project, nil
		}
		if code := itx.ErrorCode(err); code != itx.EUnavailable && !capnp.IsDisconnected(err) {
			return nil, schema.Project{}, err
		}
		if client.Sleep(ctx, backoff.Next(0)) != nil {
			if errors.Is(ctx.Err(), context.Canceled) {
				// Ctrl-C while a call waited for the reconnect: the call was cancelled (and never
				// sent), whatever the last dial said.
				return nil, schema.Project{}, itx.Errorf(itx.ECancelled, "cancelled while reconnecting to itxd at %s (the call was not sent): %v", s.cfg.Addr, itx.ErrorMessage(err))
			}
			return nil, schema.Project{}, itx.Errorf(itx.EUnavailable, "cannot reach itxd at %s: %v", s.cfg.Addr, itx.ErrorMessage(err))
		}
	}
}

// ensureConnected reconnects before a call if the connection was lost, waiting up to
// Config.ReconnectTimeout (or until ctx ends: Ctrl-C). The caller holds vmMu.
func (s *Session) ensureConnected(ctx context.Context) error {
	if s.connected() {
		return nil
	}
	s.linkMu.Lock()
	said := s.lossSaid == s.conn.Done()
	s.linkMu.Unlock()
	if !said {
		fmt.Fprintf(s.cfg.Err, "itx: the connection to %s was lost%s; reconnecting (variables are kept)\n", s.cfg.Addr, s.lostBecause())
	}
	return s.reconnect(ctx)
}

func (s *Session) reconnect(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ReconnectTimeout)
	defer cancel()
	conn, project, err := s.redial(ctx)
	if err != nil {
		return err
	}
	s.adopt(conn, project)
	return nil
}

// watchConnection reconnects in the background when the connection drops while the session
// waits at the prompt, saying so on a line of its own, until stop is closed.
func (s *Session) watchConnection(stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-stop
		cancel()
	}()
	for {
		select {
		case <-s.Done():
		case <-stop:
			return
		}
		if s.connected() {
			// The connection that ended was already replaced: .reconnect (which closes the old
			// one after adopting the new) or an evaluation that reconnected first. Nothing is
			// lost, and dialing again would only open a connection to throw away.
			continue
		}
		s.linkMu.Lock()
		s.lossSaid = s.conn.Done()
		s.linkMu.Unlock()
		fmt.Fprintf(s.cfg.Err, "itx: lost the connection to %s%s; reconnecting (variables are kept)\n", s.cfg.Addr, s.lostBecause())
		for !s.connectedAfterRedial(ctx) {
			if ctx.Err() != nil {
				return
			}
		}
	}
}

// connectedAfterRedial redials once (with backoff inside) and adopts the new connection unless
// an evaluation reconnected first. It reports whether the session is connected.
func (s *Session) connectedAfterRedial(ctx context.Context) bool {
	conn, project, err := s.redial(ctx)
	if err != nil {
		if ctx.Err() == nil {
			fmt.Fprintf(s.cfg.Err, "itx: reconnect failed: %s\n", Describe(err))
			t := time.NewTimer(reconnectMaxDelay)
			defer t.Stop()
			select {
			case <-ctx.Done():
			case <-t.C:
			}
		}
		return false
	}
	s.vmMu.Lock()
	defer s.vmMu.Unlock()
	if s.connected() || ctx.Err() != nil {
		// An evaluation reconnected first, or the session is ending.
		project.Release()
		conn.Close()
		return true
	}
	s.adopt(conn, project)
	return true
}

// Format returns the output format.
func (s *Session) Format() Format { return s.cfg.Format }

// CachedCapabilities reports how many pipelined capabilities the session keeps alive.
func (s *Session) CachedCapabilities() int { return s.caps.len() }

// Describe checks the login: it answers project.describe().
func (s *Session) Describe(ctx context.Context) (itx.ProjectInfo, error) {
	return client.DescribeProject(ctx, s.project)
}

// maxCallStackSize bounds JavaScript's call depth (node's default stack holds about 11,000
// frames of a small function).
const maxCallStackSize = 10_000

func (s *Session) initVM() error {
	vm := goja.New()
	// A recursion without end throws a RangeError (as node does, near the same depth) instead
	// of growing the call stack until memory runs out.
	vm.SetMaxCallStackSize(maxCallStackSize)
	s.vm = vm
	s.capSym = goja.NewSymbol("itx.capability")
	s.labelSym = goja.NewSymbol("itx.label")
	if err := vm.Set("project", s.proxy(capPath{iface: "Project"})); err != nil {
		return err
	}
	if err := vm.Set("agent", s.method("agent", s.agent)); err != nil {
		return err
	}
	printFn := func(call goja.FunctionCall) goja.Value {
		s.printValues(call.Arguments)
		return goja.Undefined()
	}
	if err := vm.Set("print", printFn); err != nil {
		return err
	}
	console := vm.NewObject()
	for _, name := range []string{"log", "info", "debug"} {
		console.Set(name, printFn)
	}
	for _, name := range []string{"error", "warn"} {
		console.Set(name, func(call goja.FunctionCall) goja.Value {
			parts := make([]string, len(call.Arguments))
			for i, v := range call.Arguments {
				parts[i] = s.format(v, false)
			}
			fmt.Fprintln(s.cfg.Err, strings.Join(parts, " "))
			return goja.Undefined()
		})
	}
	return vm.Set("console", console)
}

// agent is agent(path): the agent of the stream at path, whose processor is the seed's sugar
// agent.processor for project.streams.get(path).subscriptions.get("agent").processor (the
// processor-wake subscription named after the contract), subscription the subscription, and
// liveState() the seed's per-domain facade (agent.liveState) for processor.liveState().
func (s *Session) agent(call goja.FunctionCall) goja.Value {
	path, err := s.stringArg("agent", call.Arguments, 0, "path")
	if err == nil {
		err = itx.ValidatePath(path)
	}
	if err != nil {
		panic(s.throw(err))
	}
	sub := streamPath(path).child("Subscriptions", "subscriptions", "").child("Subscription", "get", "agent")
	vm := s.vm
	obj := vm.NewObject()
	obj.DefineDataProperty("path", vm.ToValue(path), goja.FLAG_FALSE, goja.FLAG_FALSE, goja.FLAG_TRUE)
	getter := func(p capPath) goja.Value {
		return vm.ToValue(func(goja.FunctionCall) goja.Value { return s.navigate(p) })
	}
	processor := sub.child("Processor", "processor", "")
	obj.DefineAccessorProperty("processor", getter(processor), nil, goja.FLAG_FALSE, goja.FLAG_TRUE)
	obj.DefineAccessorProperty("subscription", getter(sub), nil, goja.FLAG_FALSE, goja.FLAG_TRUE)
	obj.DefineDataProperty("liveState", s.method("liveState", func(call goja.FunctionCall) goja.Value {
		return s.invoke(processor, bindings["Processor"]["liveState"], call.Arguments)
	}), goja.FLAG_FALSE, goja.FLAG_FALSE, goja.FLAG_TRUE)
	return obj
}

// SetArgs exposes a script's command-line arguments as the `args` global.
func (s *Session) SetArgs(args []string) error {
	if args == nil {
		args = []string{}
	}
	return s.vm.Set("args", args)
}

// errInterrupted is what an interrupted evaluation reports.
var errInterrupted = errors.New("interrupted")

// EvalInput evaluates one input typed or piped at the prompt, as Eval does, except that its
// top-level let and const may name a variable an earlier input declared (see redeclarable).
func (s *Session) EvalInput(ctx context.Context, name, src string) (goja.Value, error) {
	return s.Eval(ctx, name, redeclarable(src))
}

// Eval evaluates src (a REPL line, an -e expression or a whole script) and returns its
// completion value. Cancelling ctx cancels the call in flight and interrupts the script.
func (s *Session) Eval(ctx context.Context, name, src string) (goja.Value, error) {
	prg, err := compile(name, src)
	if err != nil {
		return nil, err
	}
	s.vmMu.Lock()
	defer s.vmMu.Unlock()
	s.callCtx = ctx
	defer func() { s.callCtx = nil }()
	stop := make(chan struct{})
	watcher := make(chan struct{})
	go func() {
		defer close(watcher)
		select {
		case <-ctx.Done():
			s.vm.Interrupt(errInterrupted)
		case <-stop:
		}
	}()
	v, err := s.runProgram(prg)
	close(stop)
	<-watcher
	// The watcher has exited, so no Interrupt can land after this and poison the next run.
	s.vm.ClearInterrupt()
	if err != nil {
		if hint := s.tlsHint(ctx, err); hint != nil {
			return nil, hint
		}
		return nil, err
	}
	s.noteDeclarations(src)
	// An async function's promise has settled by now unless it waits on something that never
	// comes (goja drains its job queue at the end of a run): show what it settled to.
	if p, ok := v.Export().(*goja.Promise); ok {
		switch p.State() {
		case goja.PromiseStateFulfilled:
			return p.Result(), nil
		case goja.PromiseStateRejected:
			return nil, &rejection{value: p.Result()}
		default:
			// It printed as {}. Nothing can settle it later: itx runs no event loop.
			return nil, itx.Errorf(itx.EFailedPrecondition, "the promise is still pending, and nothing would settle it: itx has no timers or event loop, and its calls return their results")
		}
	}
	return v, nil
}

// runProgram runs prg. A Go panic that escapes the runtime (a bug in a binding, not a thrown
// JavaScript value: goja turns those into errors) is answered as an internal error, so the
// session survives it.
func (s *Session) runProgram(prg *goja.Program) (v goja.Value, err error) {
	s.evaluating.Store(true)
	defer s.evaluating.Store(false)
	defer func() {
		if x := recover(); x != nil {
			v, err = nil, panicError(x)
		}
	}()
	return s.vm.RunProgram(prg)
}

// panicError describes a recovered Go panic as an internal error.
func panicError(x any) error {
	return itx.Errorf(itx.EInternal, "itx bug: %v (the session goes on)", x)
}

// ctx is the context a terminal call runs under.
func (s *Session) ctx() context.Context {
	if s.callCtx != nil {
		return s.callCtx
	}
	return s.sessionCtx
}

// capPath names a capability by how it is reached from the project: the steps of a pipelined
// chain. It is plain data, so a JavaScript value may hold it for as long as it likes; the live
// client behind it is owned by the session's capCache.
type capPath struct {
	iface string
	steps []step
}

type step struct {
	method string
	arg    string // the path or name of a get; empty for properties
}

func (p capPath) key() string {
	var b strings.Builder
	for _, st := range p.steps {
		b.WriteString(st.method)
		b.WriteByte(0)
		b.WriteString(st.arg)
		b.WriteByte(0)
	}
	return b.String()
}

func (p capPath) child(iface, method, arg string) capPath {
	steps := make([]step, len(p.steps), len(p.steps)+1)
	copy(steps, p.steps)
	return capPath{iface: iface, steps: append(steps, step{method: method, arg: arg})}
}

func (p capPath) parent(ifcs map[string]*Interface) capPath {
	// The parent's interface is found by walking the steps from the project.
	iface := "Project"
	for _, st := range p.steps[:len(p.steps)-1] {
		m, _ := ifcs[iface].Method(st.method)
		iface = m.Returns
	}
	return capPath{iface: iface, steps: p.steps[:len(p.steps)-1]}
}

// label is how a capability prints: [Stream /a], [Subscription /a agent].
func (p capPath) label() string {
	parts := []string{p.iface}
	for _, st := range p.steps {
		if st.arg != "" {
			parts = append(parts, st.arg)
		}
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// client returns a reference to the capability p names, sending the pipelined calls that reach
// it if they were not sent already. The caller releases the reference.
func (s *Session) client(p capPath) capnp.Client {
	if len(p.steps) == 0 {
		return capnp.Client(s.project).AddRef()
	}
	key := p.key()
	if c, ok := s.caps.get(key); ok {
		return c
	}
	parent := s.client(p.parent(s.ifcs))
	defer parent.Release()
	last := p.steps[len(p.steps)-1]
	nav := navigators[p.parent(s.ifcs).iface+"."+last.method]
	c, release := nav(s.sessionCtx, parent, last.arg)
	s.caps.put(key, c, release)
	return c.AddRef()
}

// navigator sends one pipelined navigation call and returns the promised capability, with the
// release of the call's answer. Each future's accessor is called exactly once (go-capnp
// deadlocks on a second call). The answer is released only when the capability is let go (the
// cache does it): go-capnp's release of an answer not yet returned waits until it returns, so
// releasing it at once made every step of a chain wait a round trip before the next was sent
// (project.streams.get("/a").subscriptions.get("m").describe() took five instead of one), and
// a promised capability still reads the answer's message until it resolves.
type navigator func(ctx context.Context, parent capnp.Client, arg string) (capnp.Client, capnp.ReleaseFunc)

var navigators = map[string]navigator{
	"Project.streams": func(ctx context.Context, c capnp.Client, _ string) (capnp.Client, capnp.ReleaseFunc) {
		f, release := schema.Project(c).Streams(ctx, nil)
		return capnp.Client(f.Streams()).AddRef(), release
	},
	"Project.capabilities": func(ctx context.Context, c capnp.Client, _ string) (capnp.Client, capnp.ReleaseFunc) {
		f, release := schema.Project(c).Capabilities(ctx, nil)
		return capnp.Client(f.Capabilities()).AddRef(), release
	},
	"Project.processors": func(ctx context.Context, c capnp.Client, _ string) (capnp.Client, capnp.ReleaseFunc) {
		f, release := schema.Project(c).Processors(ctx, nil)
		return capnp.Client(f.Processors()).AddRef(), release
	},
	"Streams.get": func(ctx context.Context, c capnp.Client, path string) (capnp.Client, capnp.ReleaseFunc) {
		f, release := schema.Streams(c).Get(ctx, func(p schema.Streams_get_Params) error { return p.SetPath(path) })
		return capnp.Client(f.Stream()).AddRef(), release
	},
	"Stream.subscriptions": func(ctx context.Context, c capnp.Client, _ string) (capnp.Client, capnp.ReleaseFunc) {
		f, release := schema.Stream(c).Subscriptions(ctx, nil)
		return capnp.Client(f.Subscriptions()).AddRef(), release
	},
	"Stream.readers": func(ctx context.Context, c capnp.Client, _ string) (capnp.Client, capnp.ReleaseFunc) {
		f, release := schema.Stream(c).Readers(ctx, nil)
		return capnp.Client(f.Readers()).AddRef(), release
	},
	"Subscriptions.get": func(ctx context.Context, c capnp.Client, name string) (capnp.Client, capnp.ReleaseFunc) {
		f, release := schema.Subscriptions(c).Get(ctx, func(p schema.Subscriptions_get_Params) error { return p.SetName(name) })
		return capnp.Client(f.Subscription()).AddRef(), release
	},
	"Subscription.processor": func(ctx context.Context, c capnp.Client, _ string) (capnp.Client, capnp.ReleaseFunc) {
		f, release := schema.Subscription(c).Processor(ctx, nil)
		return capnp.Client(f.Processor()).AddRef(), release
	},
}
