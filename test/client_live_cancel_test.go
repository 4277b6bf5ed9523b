package test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// freezingProxy relays TCP to target until freeze, after which it holds every byte either way
// without closing anything: an itxd (or a network) that stopped answering.
type freezingProxy struct {
	ln     net.Listener
	once   sync.Once
	frozen chan struct{}
}

func newFreezingProxy(t *testing.T, target string) *freezingProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &freezingProxy{ln: ln, frozen: make(chan struct{})}
	var conns []net.Conn
	var mu sync.Mutex
	relay := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			select {
			case <-p.frozen:
				return // held: nothing more goes through, and nothing is closed
			default:
			}
			if n > 0 {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				dst.Close()
				return
			}
		}
	}
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
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			go relay(up, c)
			go relay(c, up)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return p
}

func (p *freezingProxy) addr() string { return p.ln.Addr().String() }
func (p *freezingProxy) freeze()      { p.once.Do(func() { close(p.frozen) }) }

// LiveView.Cancel with a context without a deadline gives up on a server that stopped
// answering after 10 s, as Connection.Close does, instead of waiting forever.
func TestClientLiveView_CancelDoesNotWaitForeverOnASilentServer(t *testing.T) {
	ts := startServer(t, server.Config{})
	mustAppend(t, stream(t, ts.project(t), "/client/silent"), ev("e", `{}`))
	px := newFreezingProxy(t, ts.addr)
	ctx := ctxT(t)
	conn, err := client.Dial(ctx, px.addr())
	require.NoError(t, err)
	t.Cleanup(func() { go conn.Close() })
	p := conn.Login(ctx, ts.creds.ProjectToken)
	s := client.Stream(ctx, p, "/client/silent")
	v, err := client.WatchStream(ctx, s)
	require.NoError(t, err)

	px.freeze()
	done := make(chan error, 1)
	started := time.Now()
	go func() { done <- v.Cancel(context.Background()) }()
	select {
	case err := <-done:
		require.Error(t, err, "the server never answered the cancel")
		require.Less(t, time.Since(started), 15*time.Second)
	case <-time.After(30 * time.Second):
		t.Fatal("LiveView.Cancel waited on a silent server past its 10 s bound")
	}
	select {
	case <-v.Done():
	default:
		t.Fatal("the view is not done after Cancel")
	}
}
