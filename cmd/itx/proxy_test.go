package main

import (
	"io"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// gatedProxy forwards TCP connections to a target. While held, what the target sends waits in
// the proxy (the client sees nothing, the target sees its frames unanswered); release lets it
// through in order.
type gatedProxy struct {
	addr string
	mu   sync.Mutex
	gate chan struct{} // closed while frames flow
}

func newGatedProxy(t *testing.T, target string) *gatedProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &gatedProxy{addr: ln.Addr().String(), gate: make(chan struct{})}
	close(p.gate)
	var conns sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		p.release()
		conns.Wait()
	})
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
			conns.Add(2)
			go func() { // client -> target
				defer conns.Done()
				io.Copy(up, c)
				up.Close()
			}()
			go func() { // target -> client, through the gate
				defer conns.Done()
				defer c.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := up.Read(buf)
					if n > 0 {
						p.wait()
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return p
}

func (p *gatedProxy) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default:
	}
}

func (p *gatedProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

func (p *gatedProxy) wait() {
	p.mu.Lock()
	gate := p.gate
	p.mu.Unlock()
	<-gate
}
