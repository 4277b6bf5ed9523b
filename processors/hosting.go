package processors

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"

	"github.com/itx-dev/itx"
)

// Host is a set of contracts a host process (itxd, or a remote program) runs on any stream. It
// implements itx.ProcessorHost: the host opens it once per stream incarnation with that
// stream's ports, and starts the contract a processor-wake subscription names.
type Host struct {
	version string

	mu      sync.Mutex
	entries map[string]hostEntry
}

type hostEntry struct {
	info itx.ProcessorInfo
	// start registers a fresh copy of the contract on reg as the instance name.
	start func(ctx context.Context, reg *Registry, store ProgressStore, name string) (Hosted, error)
}

var _ itx.ProcessorHost = (*Host)(nil)

// NewHost returns an empty host. version is the host's build: a new one resets every crash-loop
// budget (see RegistryConfig.Version).
func NewHost(version string) *Host {
	return &Host{version: version, entries: map[string]hostEntry{}}
}

// Add registers a contract. build returns a fresh contract for each stream incarnation: a
// contract's closures may keep incarnation memory (the attempts it drives), which must die with
// the incarnation. Add calls it once at once, to read the name, reducer version, consumed types
// and initial state (that contract never runs), then once per processor instance (subscription
// name) each stream incarnation starts.
func Add[S any](h *Host, build func() Contract[S]) error {
	if build == nil {
		return itx.Errorf(itx.EInvalid, "processors.Add: build is nil (it returns a fresh contract per stream incarnation)")
	}
	c := build()
	if err := c.validate(); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.entries[c.Name]; ok {
		return itx.Errorf(itx.EInvalid, "processor %q is already registered", c.Name)
	}
	// Announced to itxd, which answers it as the snapshot of a remote instance that has not
	// committed yet (the contract runs here, not there).
	initial, err := json.Marshal(c.InitialState())
	if err != nil {
		return itx.Errorf(itx.EInvalid, "processor %q: its initial state does not encode as JSON: %v", c.Name, err)
	}
	h.entries[c.Name] = hostEntry{
		info: itx.ProcessorInfo{Name: c.Name, ReducerVersion: c.ReducerVersion, ConsumedTypes: append([]string(nil), c.ConsumedTypes...),
			InitialState: initial},
		start: func(ctx context.Context, reg *Registry, store ProgressStore, name string) (Hosted, error) {
			c := build()
			// The instance: one contract may run under several subscription names.
			c.contract, c.Name = c.Name, name
			return Register(ctx, reg, c, store)
		},
	}
	return nil
}

// Version is the host's build, as given to NewHost.
func (h *Host) Version() string { return h.version }

// Contracts lists the registered contracts by name.
func (h *Host) Contracts() []itx.ProcessorInfo {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]itx.ProcessorInfo, 0, len(h.entries))
	for _, e := range h.entries {
		out = append(out, e.info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Open returns the processors of one stream incarnation. Nothing is claimed until Start.
func (h *Host) Open(ctx context.Context, ports itx.ProcessorPorts) (itx.StreamProcessors, error) {
	if ports.Progress == nil {
		return nil, itx.Errorf(itx.EInvalid, "processor host needs a progress store")
	}
	reg, err := NewRegistry(RegistryConfig{
		Path: ports.Path, Log: ports.Log, KV: ports.KV, Alarm: ports.Alarm, Clock: ports.Clock,
		Version: h.version, Logf: ports.Logf, FrameBudget: ports.FrameBudget,
	})
	if err != nil {
		return nil, err
	}
	return &hostedStream{host: h, reg: reg, store: ports.Progress, contracts: map[string]string{}, busy: map[string]chan struct{}{}}, nil
}

// hostedStream is one stream incarnation's processors.
type hostedStream struct {
	host  *Host
	reg   *Registry
	store ProgressStore

	mu        sync.Mutex               // guards contracts and busy, never held across a Start
	contracts map[string]string        // instance name -> the contract it runs
	busy      map[string]chan struct{} // instance name -> closed when its Start or Stop ends
}

// hold serializes the Starts and Stops of one instance, so it is registered once, and a Stop
// waits for a Start in progress. Each instance has its own turn: a Start that refolds a long
// history under a new ReducerVersion (Open) holds up no other processor of the stream, whose
// wakes each Start to find their runner. release must be called once.
func (s *hostedStream) hold(ctx context.Context, name string) (release func(), err error) {
	for {
		s.mu.Lock()
		turn, taken := s.busy[name]
		if !taken {
			mine := make(chan struct{})
			s.busy[name] = mine
			s.mu.Unlock()
			return func() {
				s.mu.Lock()
				delete(s.busy, name)
				s.mu.Unlock()
				close(mine)
			}, nil
		}
		s.mu.Unlock()
		select {
		case <-turn:
		case <-ctx.Done():
			return nil, itx.Errorf(itx.ECancelled, "processor %q: waiting for its start in progress: %v", name, ctx.Err())
		}
	}
}

func (s *hostedStream) Start(ctx context.Context, name, contract string) (Hosted, error) {
	if contract == "" {
		contract = name
	}
	release, err := s.hold(ctx, name)
	if err != nil {
		return nil, err
	}
	defer release()
	s.host.mu.Lock()
	e, ok := s.host.entries[contract]
	s.host.mu.Unlock()
	if !ok {
		return nil, itx.Errorf(itx.ENotFound, "no processor is registered under the name %q", contract)
	}
	if r, ok := s.reg.Runner(name); ok {
		s.mu.Lock()
		same := s.contracts[name] == contract
		s.mu.Unlock()
		if same && r.RuntimeState().Fenced == "" {
			return r, nil
		}
		// The subscription was reconfigured to run another contract, or a newer incarnation
		// elsewhere fenced this runner (its commits are refused for good): the old runner's
		// incarnation ends here (as in an eviction), and a fresh one starts from the
		// instance's records.
		s.reg.Remove(name)
	}
	r, err := e.start(ctx, s.reg, s.store, name)
	if err != nil {
		return nil, fmt.Errorf("start processor %q: %w", name, err)
	}
	s.mu.Lock()
	s.contracts[name] = contract
	s.mu.Unlock()
	return r, nil
}

func (s *hostedStream) Runner(name string) (Hosted, bool) { return s.reg.Runner(name) }

func (s *hostedStream) Stop(r Hosted) {
	release, _ := s.hold(context.Background(), r.Name()) // after a Start of it in progress
	defer release()
	if cur, ok := s.reg.Runner(r.Name()); ok && cur == r {
		s.reg.Remove(r.Name())
		s.mu.Lock()
		delete(s.contracts, r.Name())
		s.mu.Unlock()
	}
}

func (s *hostedStream) HandleAlarm(ctx context.Context) error {
	outcomes, err := s.reg.HandleAlarm(ctx)
	for _, o := range outcomes {
		s.reg.cfg.Logf("processor %q on %s: alarm %s", o.Name, s.reg.cfg.Path, o.Action)
	}
	return err
}

func (s *hostedStream) Close() { s.reg.Close() }
