// Package client dials an itxd server and logs in: the Go entry point to the capability graph
// for applications, remote processors, the itx REPL and tests.
package client

import (
	"context"
	"fmt"
	"net"
	"time"

	"capnproto.org/go/capnp/v3/rpc"
	"github.com/itx-dev/itx/schema"
)

// Conn is one RPC connection to itxd.
type Conn struct {
	rpc     *rpc.Conn
	gateway schema.Gateway
}

// Dial connects to addr (host:port) over TCP.
func Dial(ctx context.Context, addr string) (*Conn, error) {
	d := net.Dialer{KeepAlive: 15 * time.Second}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial itxd at %s: %w", addr, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	conn := rpc.NewConn(rpc.NewStreamTransport(nc), nil)
	// The bootstrap capability lives as long as the connection, not as long as the dial's ctx:
	// cancelling the context of a Bootstrap call breaks the capability it returns.
	return &Conn{rpc: conn, gateway: schema.Gateway(conn.Bootstrap(context.Background()))}, nil
}

// Gateway is the bootstrap capability.
func (c *Conn) Gateway() schema.Gateway { return c.gateway }

// Login returns the project a token logs into, as a promise: calls on it are pipelined behind
// the login, so no round trip is spent waiting for it. A bad token fails those calls.
func (c *Conn) Login(ctx context.Context, token string) schema.Project {
	fut, _ := c.gateway.Login(ctx, func(p schema.Gateway_login_Params) error { return p.SetToken(token) })
	return fut.Project()
}

// Done is closed when the connection ends.
func (c *Conn) Done() <-chan struct{} { return c.rpc.Done() }

// Close releases the bootstrap capability and closes the connection.
func (c *Conn) Close() error {
	c.gateway.Release()
	return c.rpc.Close()
}
