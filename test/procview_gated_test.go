package test

import (
	"context"
	"sync"
	"testing"

	"github.com/itx-dev/itx"
)

// gatedHost wraps a processor host so a test can hold the hosting's moves where the server
// leaves them to run on their own: a Start refused (the contract missing for a while), Stops
// held until the test lets them go, every Deliver held while armed.
type gatedHost struct {
	itx.ProcessorHost

	mu          sync.Mutex
	refuse      bool
	stopHeld    chan struct{} // Stops called while set wait for it to be closed
	stopEntered chan struct{} // closed when the first held Stop was called
	enteredOnce sync.Once
	deliverHeld chan struct{} // every Deliver waits for it while set
}

func newGatedHost(inner itx.ProcessorHost) *gatedHost { return &gatedHost{ProcessorHost: inner} }

func (h *gatedHost) Open(ctx context.Context, ports itx.ProcessorPorts) (itx.StreamProcessors, error) {
	ps, err := h.ProcessorHost.Open(ctx, ports)
	if err != nil {
		return nil, err
	}
	return &gatedStream{StreamProcessors: ps, h: h}, nil
}

func (h *gatedHost) setRefuse(on bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refuse = on
}

// holdStops holds every Stop called until disarm (and then every one held) until release, and
// returns a channel closed once one was called.
func (h *gatedHost) holdStops(t *testing.T) (entered <-chan struct{}, disarm, release func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	gate, in := make(chan struct{}), make(chan struct{})
	h.stopHeld, h.stopEntered = gate, in
	disarm = func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.stopHeld = nil
	}
	var once sync.Once
	release = func() { disarm(); once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	return in, disarm, release
}

// holdDelivers holds every Deliver until the test ends (or release is called).
func (h *gatedHost) holdDelivers(t *testing.T) (release func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	gate := make(chan struct{})
	h.deliverHeld = gate
	var once sync.Once
	release = func() {
		once.Do(func() {
			h.mu.Lock()
			h.deliverHeld = nil
			h.mu.Unlock()
			close(gate)
		})
	}
	t.Cleanup(release)
	return release
}

type gatedStream struct {
	itx.StreamProcessors
	h *gatedHost
}

type gatedRunner struct {
	itx.ProcessorRunner
	h *gatedHost
}

func unwrapRunner(r itx.ProcessorRunner) itx.ProcessorRunner {
	if g, ok := r.(*gatedRunner); ok {
		return g.ProcessorRunner
	}
	return r
}

func (s *gatedStream) Start(ctx context.Context, name, contract string) (itx.ProcessorRunner, error) {
	s.h.mu.Lock()
	refuse := s.h.refuse
	s.h.mu.Unlock()
	if refuse {
		return nil, itx.Errorf(itx.ENotFound, "no processor is registered under the name %q (refused by the test)", contract)
	}
	r, err := s.StreamProcessors.Start(ctx, name, contract)
	if err != nil {
		return nil, err
	}
	return &gatedRunner{ProcessorRunner: r, h: s.h}, nil
}

func (s *gatedStream) Runner(name string) (itx.ProcessorRunner, bool) {
	r, ok := s.StreamProcessors.Runner(name)
	if !ok {
		return nil, false
	}
	return &gatedRunner{ProcessorRunner: r, h: s.h}, true
}

func (s *gatedStream) Stop(r itx.ProcessorRunner) {
	s.h.mu.Lock()
	gate, in := s.h.stopHeld, s.h.stopEntered
	s.h.mu.Unlock()
	if gate != nil {
		s.h.enteredOnce.Do(func() { close(in) })
		<-gate
	}
	s.StreamProcessors.Stop(unwrapRunner(r))
}

func (r *gatedRunner) Deliver(ctx context.Context, f itx.ProcessorFrame) error {
	r.h.mu.Lock()
	gate := r.h.deliverHeld
	r.h.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return r.ProcessorRunner.Deliver(ctx, f)
}
