package server

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/itx-dev/itx"
)

// Remote processors: a separate program runs the processor SDK and mounts a host under a name,
// announcing its contracts (Project.processors().mount). A processor-wake subscription placed
// remote is woken on the host that announced its name; the host pages the stream itself and keeps
// the processor's progress, KV and alarm on the stream through ProcessorPorts, which write through
// the stream's single writer, exactly as in-process processors do. So a host that restarts, on
// this machine or another, resumes from the committed cursor.

// RemoteProcessorHost is a mounted host (the capability layer adapts a ProcessorHost capability).
type RemoteProcessorHost interface {
	// Wake asks the host to catch the processor up to w.Head (or, with w.Alarm, to service its
	// keepalive) and returns its committed cursors. A host that is gone fails with
	// ECapabilityOffline.
	Wake(ctx context.Context, w RemoteWake) (processed, reduced int64, err error)
	// RuntimeState is the processor's runtime state on the host (JSON).
	RuntimeState(ctx context.Context, streamID, path, name string) (json.RawMessage, error)
	// Stop tells the host the processor no longer runs there (its subscription was removed,
	// placed in-process, or set to run another contract): the host ends its session of it.
	Stop(ctx context.Context, streamID, name string) error
}

// RemoteWake is one wake of a remote processor.
type RemoteWake struct {
	Ref      StreamRef
	StreamID string
	Name     string // the subscription's name: the processor instance
	// Processor is the contract the instance runs (the subscription's name unless its config
	// names another).
	Processor string
	Head      int64
	Alarm     bool
	// ReprocessFrom asks for the operator's rewind first (0: none).
	ReprocessFrom int64
	// ProgressGeneration is the generation of the processor's progress record when the wake
	// was sent: a runner on the host holding an older one was fenced since (the record was
	// claimed elsewhere), and must claim it again before it runs anything.
	ProgressGeneration int64
	Ports              *ProcessorPorts // the processor's records on its stream, fenced by the mount
}

// Generation is the mount generation the wake's ports are fenced by.
func (w RemoteWake) Generation() uint64 { return w.Ports.gen }

// procMount is one mounted processor host.
type procMount struct {
	projectID string
	scope     string // the mounting session's (see mountKey): it holds contracts in that scope only
	name      string
	host      RemoteProcessorHost
	gen       uint64
	at        int64
	owner     string // the id of the token that mounted it ("": in-process)
	contracts []itx.ProcessorInfo
	// held ends, per contract, once the mount no longer holds it (another host took it over,
	// or the mount ended): a wake under way for it is cancelled then, so the new holder is
	// woken at once rather than after the old one's wake times out. Made at the mount, not
	// changed after (read without the lock).
	held map[string]contractHold

	// stops are the Stop calls sent to the host and not yet answered, by processor: a wake of
	// the same processor waits for them (pendingStops), so a stop meant for a removed
	// subscription never lands after the wake of one created anew under its name, ending the
	// new one's session (the host tells sessions apart by stream and name only).
	stopMu sync.Mutex
	stops  map[stopKey]map[*stopCall]struct{}

	// ref is what the mount's unmount function holds of it, emptied (under procHosts.mu) once
	// the mount is dropped: a client may keep the Handle of a mount replaced under its name for
	// as long as it likes, and what the mount announced (up to MaxHostContractBytes, and a hold
	// per contract) is then nobody's to keep.
	ref *procMountRef
}

// procMountRef is a procMount while it is mounted, nil after.
type procMountRef struct{ m *procMount }

type stopKey struct{ streamID, name string }

// stopCall is one Stop in flight; done is closed once it was answered (or gave up).
type stopCall struct{ done chan struct{} }

// beginStop records a Stop of k about to be sent; finish forgets it once answered.
func (m *procMount) beginStop(k stopKey) (finish func()) {
	c := &stopCall{done: make(chan struct{})}
	m.stopMu.Lock()
	if m.stops == nil {
		m.stops = map[stopKey]map[*stopCall]struct{}{}
	}
	if m.stops[k] == nil {
		m.stops[k] = map[*stopCall]struct{}{}
	}
	m.stops[k][c] = struct{}{}
	m.stopMu.Unlock()
	return func() {
		m.stopMu.Lock()
		delete(m.stops[k], c)
		if len(m.stops[k]) == 0 {
			delete(m.stops, k)
		}
		m.stopMu.Unlock()
		close(c.done)
	}
}

// awaitStops waits until every Stop of k sent to the host before now was answered (each is
// bounded by the delivery timeout), or ctx ends.
func (m *procMount) awaitStops(ctx context.Context, k stopKey) error {
	m.stopMu.Lock()
	var pending []*stopCall
	for c := range m.stops[k] {
		pending = append(pending, c)
	}
	m.stopMu.Unlock()
	for _, c := range pending {
		select {
		case <-c.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// procHosts is the per-project registry of mounted processor hosts.
type procHosts struct {
	mu        sync.Mutex
	gen       uint64
	byName    map[mountKey]*procMount // the host mounted under a name in a scope
	contract  map[mountKey]*procMount // the host that announced a contract in a scope, last mount wins
	byProject projectCounts           // hosts per project, for Config.MaxMountsPerProject
}

// MaxContractsPerHost and DefaultMaxHostContractBytes (Config.MaxHostContractBytes) bound what
// one mount may announce: it is kept for the mount's life, and a project holds up to
// Config.MaxMountsPerProject hosts. The bytes count every contract's name, reducer version and
// consumed types, each with HostContractEntryBytes more.
const (
	MaxContractsPerHost         = 1000
	DefaultMaxHostContractBytes = 256 << 10
	// HostContractEntryBytes is what keeping one name, version or consumed type costs beyond
	// its bytes (a string header in a slice, and its allocation's rounding). Counting the
	// bytes alone let a host announcing 64,000 types of 3 bytes keep 1.8 MiB under the
	// 256 KiB bound (1,000 such hosts: 1.9 GiB of RSS).
	HostContractEntryBytes = 24
)

// presenceToken is what a remote processor-wake subscription waits for: the mount of a host
// announcing its contract. (itx-call subscriptions wait for a capability's name.)
func presenceToken(contract string) string { return "processor:" + contract }

// presence is the token a subscription of scope waits for when it waits for what (a capability's
// name, or a presenceToken): the mount of it in that scope's namespace (see mountKey). The whole
// project's tokens are what itxd recorded before mounts had scopes; a scope is joined with a unit
// separator, which neither a scope (a path) nor a name may hold.
func presence(scope, what string) string {
	if scope == "" {
		return what
	}
	return scope + "\x1f" + what
}

// waitsFor is the presence a parked subscription waits for, "" if it waits for none.
func waitsFor(entry *catalogEntry) string {
	switch {
	case entry.Kind() == itx.KindITXCall:
		return presence(entry.mountScope(), entry.Config.Receiver.Capability)
	case entry.Kind() == itx.KindProcessorWake && !isInProcess(entry):
		return presence(entry.mountScope(), presenceToken(entry.Config.ProcessorContract()))
	}
	return ""
}

// MountProcessorHost mounts a remote host under name in a project's scope (see mountKey),
// announcing contracts in that scope: only processor-wake subscriptions configured under the
// same scope are woken on it. A host mounted earlier under the same name in the scope is
// replaced, and an earlier host of the scope announcing one of the same contracts loses it
// (takeover: its ports refuse every write from now on, and its runners' progress commits are
// fenced by the new incarnation's claim). The returned function unmounts it if it is still
// mounted. Mounting is the presence signal: parked subscriptions resume at once. The project's
// bound counts its hosts of every scope.
func (s *Server) MountProcessorHost(projectID, scope, name string, host RemoteProcessorHost, contracts []itx.ProcessorInfo) (func(), error) {
	return s.MountProcessorHostAs("", projectID, scope, name, host, contracts)
}

// MountProcessorHostAs is MountProcessorHost on behalf of the token tokenID ("": in-process). A
// host mounted with another token keeps its name and its contracts: taking over a contract (its
// progress record, its KV, the wakes of its subscriptions) is a failover of one's own hosts,
// never a way for another token of the scope to run, or stop, someone else's processor; such a
// mount is refused with EPermissionDenied.
func (s *Server) MountProcessorHostAs(tokenID, projectID, scope, name string, host RemoteProcessorHost, contracts []itx.ProcessorInfo) (func(), error) {
	if err := itx.ValidateMountName(name); err != nil {
		return nil, err
	}
	if len(contracts) == 0 {
		return nil, itx.Errorf(itx.EInvalid, "a processor host must announce at least one contract")
	}
	if len(contracts) > MaxContractsPerHost {
		return nil, itx.Errorf(itx.ETooLarge, "a processor host announces at most %d contracts", MaxContractsPerHost)
	}
	size := 0
	for _, c := range contracts {
		size += len(c.Name) + len(c.ReducerVersion) + len(c.InitialState) + 2*HostContractEntryBytes
		for _, t := range c.ConsumedTypes {
			size += len(t) + HostContractEntryBytes
		}
	}
	if size > s.cfg.MaxHostContractBytes {
		return nil, itx.Errorf(itx.ETooLarge, "a processor host announces at most %d bytes of contracts (names, versions, initial states, consumed types, each counted with %d bytes more; --max-host-contract-bytes), this one %d", s.cfg.MaxHostContractBytes, HostContractEntryBytes, size)
	}
	seen := map[string]bool{}
	for _, c := range contracts {
		if err := itx.ValidateSubscriptionName(c.Name); err != nil {
			return nil, itx.Errorf(itx.EInvalid, "contract name: %s", itx.ErrorMessage(err))
		}
		if seen[c.Name] {
			return nil, itx.Errorf(itx.EInvalid, "contract %q is announced twice", c.Name)
		}
		seen[c.Name] = true
		if c.ReducerVersion == "" || len(c.ConsumedTypes) == 0 {
			return nil, itx.Errorf(itx.EInvalid, "contract %q needs a reducer version and consumed types", c.Name)
		}
		if len(c.ReducerVersion) > itx.MaxSubscriptionNameLength {
			return nil, itx.Errorf(itx.EInvalid, "contract %q: reducerVersion is at most %d bytes", c.Name, itx.MaxSubscriptionNameLength)
		}
		if err := itx.ValidateTypeFilter(fmt.Sprintf("contract %q consumedTypes", c.Name), c.ConsumedTypes); err != nil {
			return nil, err // kept for the mount's life
		}
		if len(c.InitialState) > 0 && (!utf8.Valid(c.InitialState) || !json.Valid(c.InitialState)) {
			return nil, itx.Errorf(itx.EInvalid, "contract %q: initialState is not valid JSON", c.Name)
		}
	}
	ph := &s.procHosts
	ph.mu.Lock()
	if ph.byName == nil {
		ph.byName, ph.contract = map[mountKey]*procMount{}, map[mountKey]*procMount{}
	}
	if ph.byName[mountKey{projectID, scope, name}] == nil && ph.byProject[projectID] >= s.cfg.MaxMountsPerProject {
		ph.mu.Unlock()
		return nil, itx.Errorf(itx.ELimitExceeded, "a project holds at most %d processor hosts (--max-mounts-per-project)", s.cfg.MaxMountsPerProject)
	}
	if old := ph.byName[mountKey{projectID, scope, name}]; old != nil && old.owner != tokenID {
		ph.mu.Unlock()
		return nil, itx.Errorf(itx.EPermissionDenied, "a processor host another token mounted holds the name %q: only a login with that token (or one made with its label and scope) replaces it", name)
	}
	for _, c := range contracts {
		if prev := ph.contract[mountKey{projectID, scope, c.Name}]; prev != nil && prev.owner != tokenID {
			ph.mu.Unlock()
			return nil, itx.Errorf(itx.EPermissionDenied, "contract %q is held by a processor host another token mounted (%q): only a login with that token (or one made with its label and scope) takes it over", c.Name, prev.name)
		}
	}
	ph.gen++
	m := &procMount{projectID: projectID, scope: scope, name: name, host: host, gen: ph.gen, at: itx.UnixMilli(s.clock.Now()), owner: tokenID,
		contracts: append([]itx.ProcessorInfo(nil), contracts...),
		held:      make(map[string]contractHold, len(contracts))}
	for _, c := range contracts {
		ctx, cancel := context.WithCancel(context.Background())
		m.held[c.Name] = contractHold{lost: ctx, lose: cancel}
	}
	ref := &procMountRef{m: m}
	m.ref = ref
	if old := ph.byName[mountKey{projectID, scope, name}]; old != nil {
		ph.dropLocked(old)
	}
	ph.byName[mountKey{projectID, scope, name}] = m
	ph.byProject.add(projectID)
	for _, c := range contracts {
		if prev := ph.contract[mountKey{projectID, scope, c.Name}]; prev != nil && prev != m {
			prev.held[c.Name].lose() // taken over
		}
		ph.contract[mountKey{projectID, scope, c.Name}] = m
	}
	ph.mu.Unlock()
	s.log.Info().Str("project", projectID).Str("host", name).Str("scope", scope).Int("contracts", len(contracts)).Uint64("generation", m.gen).Msg("processor host mounted")
	for _, c := range contracts {
		s.schedulePoke(projectID, scope, presenceToken(c.Name))
	}
	gen := m.gen // for the unmount's log line, which must not keep m
	return func() {
		ph.mu.Lock()
		var gone []string // the contracts no other host of the scope took over
		// nil once the mount was dropped: the closure holds only ref, not the mount.
		cur := ref.m
		current := cur != nil && ph.byName[mountKey{projectID, scope, name}] == cur
		if current {
			for _, c := range cur.contracts {
				if ph.contract[mountKey{projectID, scope, c.Name}] == cur {
					gone = append(gone, c.Name)
				}
			}
			ph.dropLocked(cur)
		}
		ph.mu.Unlock()
		if current {
			// The mount's line has its end: the operator reading why a remote processor
			// parked finds the host that went, and which contracts went with it.
			s.log.Info().Str("project", projectID).Str("host", name).Str("scope", scope).Strs("contracts", gone).Uint64("generation", gen).Msg("processor host unmounted")
		}
		for _, c := range gone {
			s.scheduleUnmounted(projectID, scope, presenceToken(c))
		}
	}, nil
}

// contractHold is a mount's hold on one contract: lost ends when lose is called.
type contractHold struct {
	lost context.Context
	lose context.CancelFunc
}

func (ph *procHosts) dropLocked(m *procMount) {
	if ph.byName[mountKey{m.projectID, m.scope, m.name}] == m {
		delete(ph.byName, mountKey{m.projectID, m.scope, m.name})
		ph.byProject.remove(m.projectID)
	}
	for _, c := range m.contracts {
		if ph.contract[mountKey{m.projectID, m.scope, c.Name}] == m {
			delete(ph.contract, mountKey{m.projectID, m.scope, c.Name})
		}
		m.held[c.Name].lose()
	}
	m.ref.m = nil
}

// ProcessorHostMounts lists a project's mounted processor hosts of every scope with the contracts
// each holds and its scope (a caller limited to a prefix is shown only its own: see MountsIn).
func (s *Server) ProcessorHostMounts(projectID string) []itx.MountInfo {
	ph := &s.procHosts
	ph.mu.Lock()
	defer ph.mu.Unlock()
	var out []itx.MountInfo
	for k, m := range ph.byName {
		if k.projectID != projectID {
			continue
		}
		info := itx.MountInfo{Name: m.name, MountedAt: m.at, Scope: m.scope}
		for _, c := range m.contracts {
			if ph.contract[mountKey{projectID, m.scope, c.Name}] == m {
				// Still its (not taken over). The initial state is the snapshot's to answer, not
				// the listing's.
				c.InitialState = nil
				info.Contracts = append(info.Contracts, c)
			}
		}
		out = append(out, info)
	}
	sortMounts(out)
	return out
}

// remoteHost is the mount holding a contract in a project's scope, nil when none does.
func (s *Server) remoteHost(projectID, scope, contract string) *procMount {
	ph := &s.procHosts
	ph.mu.Lock()
	defer ph.mu.Unlock()
	return ph.contract[mountKey{projectID, scope, contract}]
}

// processorPresence lists the presence tokens of every contract mounted in a project, each in
// its scope: what a loading stream learns, as it learns the mounted capabilities.
func (s *Server) processorPresence(projectID string) []string {
	ph := &s.procHosts
	ph.mu.Lock()
	defer ph.mu.Unlock()
	var out []string
	for k := range ph.contract {
		if k.projectID == projectID {
			out = append(out, presence(k.scope, presenceToken(k.name)))
		}
	}
	return out
}

// --- ports ---------------------------------------------------------------------------------

// ProcessorPorts is one remote processor's records on its stream, for the host that holds the
// contract: served to it as a capability with every wake. Every call checks the mount first, so
// a host that lost the contract (another mounted it, or it disconnected) writes nothing.
type ProcessorPorts struct {
	srv      *Server
	ref      StreamRef
	name     string // the instance: its records are keyed by it
	scope    string // the instance's subscription's: the namespace its host is mounted in
	contract string // the contract the instance runs: its host's mount fences the ports
	gen      uint64
	seek     int64        // the seek epoch this wake's rewind honors (commits carry it)
	wakeGen  int64        // the progress record's generation at the wake
	claimed  atomic.Int64 // the generation a claim through these ports took (0: none yet)
}

// kvGen is the generation the ports' runner holds: KV writes are fenced by it, as commits are.
func (p *ProcessorPorts) kvGen() int64 {
	if g := p.claimed.Load(); g != 0 {
		return g
	}
	return p.wakeGen
}

// CheckFence fails unless this host's mount still holds the contract: what a remote processor
// writes through its ports is refused once another host took it over.
func (p *ProcessorPorts) CheckFence() error { return p.fenced() }

// CheckHomeAppend is CheckFence for the processor's own append to its home stream, which the
// ports also hold to their processor: a stream/processor-revived naming another one is refused
// (permissionDenied), its whole batch with it. A revival is the keepalive's fact for the
// processor that owed work, and a host is woken (and handed these ports) per processor, so its
// keepalive only ever revives the processor whose ports it holds; naming another would move
// that one's subscription (active, delivered to at once, un-halted) on the authority of a host
// that does not run it. The mounting token's own Stream.append is not narrowed.
func (p *ProcessorPorts) CheckHomeAppend(inputs []itx.EventInput) error {
	if err := p.fenced(); err != nil {
		return err
	}
	for i, in := range inputs {
		if in.Type != itx.TypeProcessorRevived {
			continue
		}
		slug, err := revivedProcessor(in.Payload)
		if err != nil {
			continue // refused by the append's validation, with its reason
		}
		if slug != p.name {
			return itx.Errorf(itx.EPermissionDenied, "event %d: these ports are processor %q's: a %s naming %q is not theirs to append",
				i, p.name, in.Type, slug)
		}
	}
	return nil
}

func (p *ProcessorPorts) fenced() error {
	m := p.srv.remoteHost(p.ref.ProjectID, p.scope, p.contract)
	if m == nil || m.gen != p.gen {
		return itx.Errorf(itx.EFailedPrecondition, "processor %q: this host's mount (generation %d) no longer holds the contract", p.name, p.gen)
	}
	return nil
}

func (p *ProcessorPorts) do(ctx context.Context, op procOp) procReply {
	if err := p.fenced(); err != nil {
		return procReply{err: err}
	}
	a, err := p.srv.acquire(ctx, p.ref)
	if err != nil {
		return procReply{err: err}
	}
	defer p.srv.release(a)
	return a.ask(ctx, op)
}

func (p *ProcessorPorts) own(name string) error {
	if name != p.name {
		return itx.Errorf(itx.EInvalid, "these ports are processor %q's, not %q's", p.name, name)
	}
	return nil
}

// Claim bumps the processor's record generation and returns its progress (nil: none).
func (p *ProcessorPorts) Claim(ctx context.Context, name string) (*itx.ProcessorProgress, int64, error) {
	if err := p.own(name); err != nil {
		return nil, 0, err
	}
	r := p.do(ctx, procOp{claim: name})
	if r.err == nil {
		p.claimed.Store(r.generation)
	}
	return r.progress, r.generation, r.err
}

// Commit replaces the processor's progress if generation is still current.
func (p *ProcessorPorts) Commit(ctx context.Context, name string, generation int64, pr itx.ProcessorProgress) error {
	if err := p.own(name); err != nil {
		return err
	}
	return p.do(ctx, procOp{commit: &procCommit{name: name, generation: generation, seek: p.seek, progress: pr}}).err
}

// KVGet reads the processors' KV.
func (p *ProcessorPorts) KVGet(ctx context.Context, key string) ([]byte, bool, error) {
	if err := p.fenced(); err != nil {
		return nil, false, err
	}
	a, err := p.srv.acquire(ctx, p.ref)
	if err != nil {
		return nil, false, err
	}
	defer p.srv.release(a)
	return procKV{a}.Get(ctx, key)
}

// Bounds of the processors' KV: one key and one value a remote host writes, and one stream's KV
// in all (Config.MaxProcessorKVKeys, Config.MaxProcessorKVBytes: keys and values counted
// together). The SDK keeps one keepalive record per processor there, so the stream bounds are
// far above any use but a host writing keys without end.
const (
	MaxProcessorKVKeyBytes     = 1 << 10
	MaxProcessorKVValueBytes   = 64 << 10
	DefaultMaxProcessorKVKeys  = 10_000
	DefaultMaxProcessorKVBytes = 64 << 20
)

// KVPut writes the processors' KV.
func (p *ProcessorPorts) KVPut(ctx context.Context, key string, value []byte) error {
	if key == "" || len(key) > MaxProcessorKVKeyBytes || len(value) > MaxProcessorKVValueBytes {
		return itx.Errorf(itx.EInvalid, "processor KV: a key of 1 to 1,024 bytes and a value of at most 64 KiB")
	}
	return p.do(ctx, procOp{kvKey: key, kvVal: value, kvFor: p.name, kvGen: p.kvGen()}).err
}

// Check fails as a commit of generation would (the mount lost the contract, or another
// incarnation claimed the record), writing nothing.
func (p *ProcessorPorts) Check(ctx context.Context, name string, generation int64) error {
	if err := p.own(name); err != nil {
		return err
	}
	return p.do(ctx, procOp{check: &procCommit{name: name, generation: generation}}).err
}

// KVDelete deletes a key of the processors' KV.
// AppendTo is the remote processor's forward to another stream (itx.ProcessorOutbox), under
// its subscription's scope.
func (p *ProcessorPorts) AppendTo(ctx context.Context, path string, inputs []itx.EventInput) (itx.AppendResult, error) {
	if err := p.fenced(); err != nil {
		return itx.AppendResult{}, err
	}
	return p.srv.processorAppendTo(ctx, p.ref, p.scope, path, inputs, nil)
}

// AppendToFrom is AppendTo saying which event of the home stream the forward comes from
// (itx.ProcessorEffectOutbox): the receiving stream fences it as this instance's effect.
func (p *ProcessorPorts) AppendToFrom(ctx context.Context, path string, inputs []itx.EventInput, origin itx.EffectOrigin) (itx.AppendResult, error) {
	if err := p.fenced(); err != nil {
		return itx.AppendResult{}, err
	}
	if err := itx.CheckEffectOrigin(origin); err != nil {
		return itx.AppendResult{}, err
	}
	var stamp *effectStamp
	if origin.Offset > origin.ProcessedThrough {
		a, err := p.srv.acquire(ctx, p.ref)
		if err != nil {
			return itx.AppendResult{}, err
		}
		stamp, err = newEffectStamp(p.ref.Path, p.name, a.view().streamID, origin)
		p.srv.release(a)
		if err != nil {
			return itx.AppendResult{}, err
		}
	}
	return p.srv.processorAppendTo(ctx, p.ref, p.scope, path, inputs, stamp)
}

func (p *ProcessorPorts) KVDelete(ctx context.Context, key string) error {
	if key == "" || len(key) > MaxProcessorKVKeyBytes {
		return itx.Errorf(itx.EInvalid, "processor KV: a key of 1 to 1,024 bytes")
	}
	return p.do(ctx, procOp{kvKey: key, kvDel: true, kvFor: p.name, kvGen: p.kvGen()}).err
}

// SetAlarm arms the processor's own alarm slice (0 disarms).
func (p *ProcessorPorts) SetAlarm(ctx context.Context, at int64) error {
	at = max(at, 0)
	return p.do(ctx, procOp{alarm: &at, owner: p.name}).err
}

// --- the wake ------------------------------------------------------------------------------

// wakeRemote is a processor-wake push placed remote: the host that holds the contract catches up
// to the head and reports its committed cursor. No host is an absence (the subscription parks
// until one mounts); a host that vanishes mid-wake likewise.
func (d *deliverer) wakeRemote(job pushJob, out deliveryOutcome) deliveryOutcome {
	fail := func(class failureClass, err error) deliveryOutcome {
		out.failure = &deliveryFailure{class: class, msg: err.Error()}
		return out
	}
	scope, contract := d.actor.remoteOf(d.name)
	m := d.srv.remoteHost(d.ref.ProjectID, scope, contract)
	if m == nil {
		return fail(classAbsent, itx.Errorf(itx.ECapabilityOffline, "no processor host announcing %q is mounted", contract))
	}
	streamID := d.actor.view().streamID
	ports := &ProcessorPorts{srv: d.srv, ref: d.ref, name: d.name, scope: scope, contract: contract, gen: m.gen}
	w := RemoteWake{Ref: d.ref, StreamID: streamID, Name: d.name, Processor: contract, Head: job.head, Ports: ports}
	if row := job.row; row.CursorChangedAtOffset != row.ConfiguredAtOffset && job.procSeek != row.CursorChangedAtOffset {
		w.ReprocessFrom, ports.seek = row.ConfirmedOffset+1, row.CursorChangedAtOffset
	}
	before, err := d.actor.procRecord(d.ctx, d.name)
	if err != nil {
		return fail(classOutage, err)
	}
	gen := before.generation()
	w.ProgressGeneration, ports.wakeGen = gen, gen
	// refolding marks an outage of a wake during which the host committed its reduction further
	// (the refold of a rewind or a new reducer version, lagging the processing cursor): the
	// processor is progressing, so the ladder starts over rather than climbing.
	refolding := func(out deliveryOutcome) deliveryOutcome {
		if after, err := d.actor.procRecord(d.ctx, d.name); err == nil && after.reducedThrough() > before.reducedThrough() {
			out.failure.refolded = true
		}
		return out
	}
	ctx, cancel := context.WithCancel(d.ctx)
	defer cancel()
	t := d.srv.clock.AfterFunc(2*d.srv.cfg.DeliveryTimeout, cancel)
	defer t.Stop()
	var lost atomic.Bool
	defer context.AfterFunc(m.held[contract].lost, func() { lost.Store(true); cancel() })()
	// A stop sent for a removed subscription of this name lands first (see beginStop).
	var processed int64
	if err = m.awaitStops(ctx, stopKey{streamID, d.name}); err == nil {
		processed, _, err = m.host.Wake(ctx, w)
	}
	switch {
	case d.ctx.Err() != nil:
		return out
	case lost.Load():
		// The mount lost the contract while this wake ran (another host took it over, or it
		// ended): its answer no longer counts, as a late report's below; the new holder is woken
		// next, or the subscription parks with nothing mounted.
		d.srv.metrics.LateAcks.Inc()
		return out
	case err != nil && ctx.Err() != nil:
		return refolding(fail(classOutage, itx.Errorf(itx.EDeadlineExceeded, "processor host %q did not answer the wake within %s", m.name, 2*d.srv.cfg.DeliveryTimeout)))
	case err != nil && itx.FailingEventOf(err) > 0:
		// The processor failed on an event: retried along the ladder as an in-process
		// processor's failure is (a processor never skips an event), naming the event.
		out = fail(classOutage, fmt.Errorf("processor host %q: %w", m.name, err))
		out.failure.eventOffset, out.failure.processorEvent = itx.FailingEventOf(err), true
		return out
	case err != nil:
		err = vanished(m.gen, err)
		out = fail(classify(err), fmt.Errorf("processor host %q: %w", m.name, err))
		out.failure.mount = vanishedMount(err)
		return out
	}
	if cur := d.srv.remoteHost(d.ref.ProjectID, scope, contract); cur == nil || cur.gen != m.gen {
		// A late report from a mount that lost the contract meanwhile: refused. What it committed
		// through its ports before then stands (the row followed those commits); the new holder
		// is woken next.
		d.srv.metrics.LateAcks.Inc()
		return out
	}
	if processed <= job.row.ConfirmedOffset {
		// A host that answers without moving past the cursor would be woken again at once,
		// forever: it is an outage, and backs off along the ladder.
		return refolding(fail(classOutage, itx.Errorf(itx.EUnavailable, "processor host %q reported processed through %d, no progress past the cursor at %d (head %d)",
			m.name, processed, job.row.ConfirmedOffset, job.head)))
	}
	out.through, out.delivered = min(processed, job.head), true
	return out
}

// fireRemoteAlarm runs a remote processor's alarm slice: the host that holds the contract
// services its keepalive (and revives what its dead incarnation owed). With no host mounted the
// slice is re-armed a little later; the next mount wakes the processor anyway.
func (a *actor) fireRemoteAlarm(name string) {
	if !a.pinAlarm(name) {
		return
	}
	ref := a.ref
	streamID := a.st.streamID
	entry := a.st.core.Subscriptions[name]
	if entry == nil || entry.Kind() != itx.KindProcessorWake || isInProcess(entry) {
		// The processor is gone from here (removed, or placed in-process): nothing remote owes
		// it a revival, and re-arming would fire for it forever.
		go func() {
			defer a.srv.release(a)
			zero := int64(0)
			a.ask(a.dctx, procOp{alarm: &zero, owner: name})
			a.ask(a.dctx, procOp{fired: true, owner: name})
		}()
		return
	}
	scope, contract := entry.mountScope(), entry.Config.ProcessorContract()
	// An early fire (a mount of the contract) that cannot reach a host leaves the slice where
	// the keepalive armed it, rather than moving a long backoff to the retry.
	early := a.st.procAlarms[name] > itx.UnixMilli(a.srv.clock.Now())
	go func() {
		defer a.srv.release(a)
		ctx := a.dctx
		var err error = itx.Errorf(itx.ECapabilityOffline, "no processor host announcing %q is mounted", contract)
		if m := a.srv.remoteHost(ref.ProjectID, scope, contract); m != nil {
			wctx, cancel := context.WithTimeout(ctx, 2*a.srv.cfg.DeliveryTimeout)
			var gen int64
			if err = m.awaitStops(wctx, stopKey{streamID, name}); err == nil {
				gen, err = a.procGeneration(wctx, name)
			}
			if err == nil {
				_, _, err = m.host.Wake(wctx, RemoteWake{Ref: ref, StreamID: streamID, Name: name, Processor: contract, Alarm: true,
					ProgressGeneration: gen, Ports: &ProcessorPorts{srv: a.srv, ref: ref, name: name, scope: scope, contract: contract, gen: m.gen, wakeGen: gen}})
			}
			cancel()
		}
		if err != nil && ctx.Err() == nil && !early {
			// The host's error text is the peer's: logged within the bound of a cursor's error.
			a.srv.log.Warn().Str("error", truncate(err.Error(), itx.MaxCursorErrorLength)).Str("project", ref.ProjectID).Str("path", ref.Path).Str("processor", name).Msg("remote processor alarm: retrying later")
			later := itx.UnixMilli(a.srv.clock.Now().Add(remoteAlarmRetry))
			a.ask(ctx, procOp{alarm: &later, owner: name})
		}
		a.ask(ctx, procOp{fired: true, owner: name})
	}()
}

// generation is the record's generation (0: no record, never claimed).
func (r *procRecord) generation() int64 {
	if r == nil {
		return 0
	}
	return r.Generation
}

// reducedThrough is the offset the record's committed state is folded through (0: none).
func (r *procRecord) reducedThrough() int64 {
	if r == nil || r.Progress == nil {
		return 0
	}
	return r.Progress.ReducedThrough
}

// procGeneration is the generation of name's progress record (0: never claimed).
func (a *actor) procGeneration(ctx context.Context, name string) (int64, error) {
	rec, err := a.procRecord(ctx, name)
	return rec.generation(), err
}

// procRecord is name's committed progress record (nil: none): the published one, else the stored
// one (the state reads records on demand, and forgets those of removed subscriptions).
func (a *actor) procRecord(ctx context.Context, name string) (*procRecord, error) {
	v := a.view()
	if rec := v.procs[name]; rec != nil {
		return rec, nil
	}
	if v.store == nil {
		return nil, a.gone()
	}
	raw, err := v.store.KV(ctx, procProgressPrefix+name)
	if err != nil || raw == nil {
		if err != nil {
			err = itx.Errorf(itx.EUnavailable, "read processor record: %v", err)
		}
		return nil, err
	}
	var rec procRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return nil, itx.Errorf(itx.EInternal, "processor %q: record does not decode: %v", name, err)
	}
	return &rec, nil
}

// stopRemote tells the host holding contract in scope that the processor name of this stream no
// longer runs there, so the host ends its session of it now rather than when its connection ends.
// Best effort, off the actor's goroutine, within the delivery timeout: a host that misses it is
// fenced anyway (the ports refuse a removed processor's writes once its record moved on).
func (a *actor) stopRemote(scope, contract, name string) {
	m := a.srv.remoteHost(a.ref.ProjectID, scope, contract)
	if m == nil || a.st.streamID == "" {
		return
	}
	streamID, log := a.st.streamID, a.srv.log
	// Recorded here, on the actor, before any later step can wake a subscription created anew
	// under the name: that wake waits for this stop's answer (procMount.awaitStops).
	finish := m.beginStop(stopKey{streamID, name})
	go func() {
		defer finish()
		ctx, cancel := context.WithTimeout(a.srv.base, a.srv.cfg.DeliveryTimeout)
		defer cancel()
		if err := m.host.Stop(ctx, streamID, name); err != nil {
			log.Debug().Err(err).Str("project", a.ref.ProjectID).Str("path", a.ref.Path).Str("processor", name).Str("host", m.name).Msg("stopping a remote processor's session")
		}
	}()
}

// remoteAlarmRetry is how long a remote alarm slice waits when its host could not be reached.
const remoteAlarmRetry = 30 * time.Second

// --- inspection ----------------------------------------------------------------------------

// remoteSnapshot reads a processor's committed record from its stream.
func (s *Server) remoteSnapshot(ctx context.Context, a *actor, name string) (json.RawMessage, int64, int64, error) {
	v := a.view()
	if v.store == nil {
		return nil, 0, 0, a.gone()
	}
	raw, err := v.store.KV(ctx, procProgressPrefix+name)
	if err != nil {
		return nil, 0, 0, itx.Errorf(itx.EUnavailable, "read processor record: %v", err)
	}
	var rec procRecord
	if raw != nil {
		if err := json.Unmarshal(raw, &rec); err != nil {
			return nil, 0, 0, itx.Errorf(itx.EInternal, "processor %q: record does not decode: %v", name, err)
		}
	}
	if rec.Progress == nil {
		return a.initialState(name), 0, 0, nil
	}
	state := rec.Progress.State
	if len(state) == 0 {
		state = json.RawMessage("null")
	}
	return state, rec.Progress.ReducedThrough, rec.Progress.ProcessedThrough, nil
}

// awaitRemoteRewind is read-your-writes for a remote processor's snapshot and getRuntimeState
// after setSubscriptionCursor: itxd cannot take the rewind itself (the contract's Reduce runs on
// the host), so while the committed record does not yet honor the latest cursor-set and the wake
// lane is about to send it (the row active and not backing off, something after the cursor to
// deliver, a host holding the contract), it waits for the host's rewind commit, within the
// delivery timeout. Otherwise (halted, parked, backing off, nothing past the cursor, no host, or
// the bound passed) the answer is the committed record as it stands.
func (s *Server) awaitRemoteRewind(ctx context.Context, a *actor, name string) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t := s.clock.AfterFunc(s.cfg.DeliveryTimeout, cancel)
	defer t.Stop()
	for {
		v := a.view()
		row, ok := v.rows[name]
		entry := v.core.Subscriptions[name]
		if !ok || entry == nil || isInProcess(entry) || row.CursorChangedAtOffset == row.ConfiguredAtOffset {
			return nil
		}
		rec, err := a.procRecord(ctx, name)
		if err != nil {
			return err
		}
		if rec != nil && rec.Seek == row.CursorChangedAtOffset {
			return nil
		}
		due := row.NextAttemptAt == 0 || row.NextAttemptAt <= itx.UnixMilli(s.clock.Now())
		if row.Status != itx.StatusActive || !due || row.ConfirmedOffset >= v.head ||
			s.remoteHost(a.ref.ProjectID, entry.mountScope(), entry.Config.ProcessorContract()) == nil {
			return nil
		}
		select {
		case <-v.changed:
		case <-a.dctx.Done():
			return a.ended()
		case <-wctx.Done():
			if ctx.Err() != nil {
				return itx.Errorf(itx.ECancelled, "processor %q: %v", name, ctx.Err())
			}
			return nil // the bound: what is committed
		}
	}
}

// MaxRemoteRuntimeStateBytes bounds the runtime state a host answers (its cursors and
// observations; the reduced state is read from the committed record): it is decoded to add
// itxd's fields, and a host answering megabytes of small members would make every call build
// them all.
const MaxRemoteRuntimeStateBytes = 64 << 10

// remoteRuntimeState asks the host holding the contract, within the delivery timeout (a host
// that never answers must not hold the call, and the stream, for as long as the caller waits);
// without a host it says so, with the committed cursors.
func (s *Server) remoteRuntimeState(ctx context.Context, a *actor, name string) (json.RawMessage, error) {
	scope, contract := a.remoteOf(name)
	if m := s.remoteHost(a.ref.ProjectID, scope, contract); m != nil {
		hctx, cancel := context.WithCancel(ctx)
		t := s.clock.AfterFunc(s.cfg.DeliveryTimeout, cancel)
		st, err := m.host.RuntimeState(hctx, a.view().streamID, a.ref.Path, name)
		t.Stop()
		// Read before cancel below: only the watchdog (or the caller) ends hctx before then.
		expired := hctx.Err() != nil
		cancel()
		if err != nil && ctx.Err() == nil && expired {
			return nil, itx.Errorf(itx.EDeadlineExceeded, "processor host %q did not answer getRuntimeState within %s", m.name, s.cfg.DeliveryTimeout)
		}
		if err == nil && len(st) > MaxRemoteRuntimeStateBytes {
			return nil, itx.Errorf(itx.ETooLarge, "processor host %q answered a runtime state of %d bytes, at most %d", m.name, len(st), MaxRemoteRuntimeStateBytes)
		}
		if err == nil {
			var fields map[string]any
			if json.Unmarshal(st, &fields) == nil {
				fields["placement"], fields["host"], fields["mountGeneration"] = "remote", m.name, m.gen
				// A host publishes a commit to its runner's memory once itxd answered it: just
				// after a rewind's commit (awaitRemoteRewind returns on it) its answer may still
				// show the cursors from before. The committed record is what the runner is about
				// to show: its cursors stand in for ones of an older cursor revision.
				if rec, err := a.procRecord(ctx, name); err == nil && rec != nil && rec.Progress != nil {
					if rev, _ := fields["cursorRevision"].(float64); int64(rev) < rec.Progress.CursorRevision {
						fields["cursorRevision"] = rec.Progress.CursorRevision
						fields["reducedThrough"] = rec.Progress.ReducedThrough
						fields["processedThrough"] = rec.Progress.ProcessedThrough
					}
				}
				return json.Marshal(fields)
			}
			return st, nil
		}
		switch itx.ErrorCode(err) {
		case itx.ENotFound:
			// The host holds the contract but has not run this instance since it mounted (no
			// wake reached it yet): what there is to say is the committed record.
			return s.remoteCommittedState(ctx, a, name, map[string]any{"mounted": true, "host": m.name, "mountGeneration": m.gen})
		case itx.ECapabilityOffline:
		default:
			return nil, err
		}
	}
	return s.remoteCommittedState(ctx, a, name, map[string]any{"mounted": false})
}

// remoteCommittedState is a remote processor's runtime state from its committed record alone,
// with extra fields.
func (s *Server) remoteCommittedState(ctx context.Context, a *actor, name string, extra map[string]any) (json.RawMessage, error) {
	_, reduced, processed, err := s.remoteSnapshot(ctx, a, name)
	if err != nil {
		return nil, err
	}
	out := map[string]any{"name": name, "placement": "remote", "reducedThrough": reduced, "processedThrough": processed}
	for k, v := range extra {
		out[k] = v
	}
	return json.Marshal(out)
}

// --- live state ----------------------------------------------------------------------------

// ProcessorLiveState is a processor's live state: its committed reduced state and cursors.
type ProcessorLiveState struct {
	Name            string          `json:"name"`
	ReducedOffset   int64           `json:"reducedOffset"`
	ProcessedOffset int64           `json:"processedOffset"`
	State           json.RawMessage `json:"state"`
}

// processorLiveEngine returns the live engine of a processor-wake subscription's committed
// record, starting it on first use. Its document changes with every progress commit, wherever the
// processor runs. The catalog is read under procLiveMu: the actor publishes a removal before it
// prunes the engine (pruneProcessorLive, under the same lock), so no engine is started for a
// subscription already pruned.
func (a *actor) processorLiveEngine(name string) (*liveEngine, error) {
	a.procLiveMu.Lock()
	defer a.procLiveMu.Unlock()
	entry := a.view().core.Subscriptions[name]
	switch {
	case entry == nil:
		return nil, itx.Errorf(itx.ENotFound, "subscription %q does not exist", name)
	case entry.Kind() != itx.KindProcessorWake:
		return nil, itx.Errorf(itx.EFailedPrecondition, "subscription %q is a %s subscription: only processor-wake subscriptions have a processor", name, entry.Kind())
	}
	old := map[string]*liveEngine{}
	if m := a.procLiveP.Load(); m != nil {
		old = *m
	}
	if e := old[name]; e != nil {
		return e, nil
	}
	e := newLiveEngine(a, func() any { return a.processorLiveState(name) })
	next := make(map[string]*liveEngine, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[name] = e
	a.procLiveP.Store(&next)
	go e.run()
	e.poke()
	return e, nil
}

// pruneProcessorLive ends the live engine of a subscription that no longer has a processor (it
// was removed, or reconfigured to another kind): its goroutine exits and its subscribers are
// detached, as when the stream closes. Engines otherwise live as long as the stream's load, so a
// client creating, watching and removing subscriptions under new names would grow goroutines
// without bound. Actor goroutine, after the publish that removed the subscription.
func (a *actor) pruneProcessorLive(name string) {
	a.procLiveMu.Lock()
	defer a.procLiveMu.Unlock()
	m := a.procLiveP.Load()
	if m == nil || (*m)[name] == nil {
		return
	}
	e := (*m)[name]
	next := make(map[string]*liveEngine, len(*m)-1)
	for k, v := range *m {
		if k != name {
			next[k] = v
		}
	}
	a.procLiveP.Store(&next)
	e.ended.Store(&liveEnd{CloseSubscriptionRemoved, fmt.Sprintf("subscription %q no longer runs a processor", name)})
	e.stop()
}

// initialState is the initial state of the contract the processor instance name runs, as its
// host announces it, for an instance with nothing committed yet: the in-process host's, or the
// mounted remote host's holding the contract (the contract runs there); null when no host
// announces one (a remote contract no mounted host holds).
func (a *actor) initialState(name string) json.RawMessage {
	entry := a.catalogEntry(name)
	if entry == nil {
		return json.RawMessage("null")
	}
	contract := entry.Config.ProcessorContract()
	var contracts []itx.ProcessorInfo
	if isInProcess(entry) {
		if a.srv.cfg.Processors != nil {
			contracts = a.srv.cfg.Processors.Contracts()
		}
	} else if m := a.srv.remoteHost(a.ref.ProjectID, entry.mountScope(), contract); m != nil {
		contracts = m.contracts
	}
	for _, c := range contracts {
		if c.Name == contract && len(c.InitialState) > 0 {
			return c.InitialState
		}
	}
	return json.RawMessage("null")
}

func (a *actor) processorLiveState(name string) ProcessorLiveState {
	out := ProcessorLiveState{Name: name, State: a.initialState(name)}
	v := a.view()
	rec := v.procs[name]
	if rec == nil && v.store != nil {
		if raw, err := v.store.KV(context.Background(), procProgressPrefix+name); err == nil && raw != nil {
			rec = &procRecord{}
			if json.Unmarshal(raw, rec) != nil {
				rec = nil
			}
		}
	}
	if rec != nil && rec.Progress != nil {
		out.ReducedOffset, out.ProcessedOffset = rec.Progress.ReducedThrough, rec.Progress.ProcessedThrough
		if len(rec.Progress.State) > 0 {
			out.State = rec.Progress.State
		}
	}
	return out
}

// SubscribeProcessorLive attaches a sink to a processor's live state (a processor-wake
// subscription's, in-process or remote): a snapshot of its committed record, then a patch per
// commit. It counts against the stream's live-state subscribers.
func (s *Server) SubscribeProcessorLive(ctx context.Context, ref StreamRef, name string, sink LiveSink) (cancel func(), err error) {
	return s.attachLive(ctx, ref, sink, true, func(a *actor) (*liveEngine, error) {
		return a.processorLiveEngine(name)
	})
}
