package main

import (
	"bytes"
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
	// marker, when set, is looked for in what the target sends: the first read holding it
	// closes seen and holds the gate before it is let through, so a test can act between the
	// target's answer to a call and the client's receiving it.
	marker []byte
	seen   chan struct{}
}

// holdAt holds the gate at the first bytes from the target that hold marker; the returned
// channel is closed then.
func (p *gatedProxy) holdAt(marker string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker, p.seen = []byte(marker), make(chan struct{})
	return p.seen
}

// sawMarker holds the gate if chunk holds the marker watched for (see holdAt).
func (p *gatedProxy) sawMarker(chunk []byte) {
	p.mu.Lock()
	found := p.marker != nil && bytes.Contains(chunk, p.marker)
	if found {
		close(p.seen)
		p.marker = nil
	}
	p.mu.Unlock()
	if found {
		p.hold()
	}
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
						p.sawMarker(buf[:n])
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
