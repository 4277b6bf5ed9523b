package capability

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// capturingListener hands every accepted connection to the test as well.
type capturingListener struct {
	net.Listener
	accepted chan net.Conn
}

func (l capturingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted <- c
	}
	return c, err
}

// An accepted RPC connection carries the keepalive and user timeout --rpc-keepalive asks for, as
// the server's kernel sees them: a peer that vanishes behind a silent partition ends its
// connection, and with it its mounts, within 4x the keepalive instead of never.
func TestListener_AcceptedConnectionsKeepAlive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv, err := server.Open(ctx, server.Config{DataDir: t.TempDir()})
	require.NoError(t, err)
	defer srv.Close(ctx)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cl := capturingListener{Listener: ln, accepted: make(chan net.Conn, 1)}
	l := NewListener(srv)
	l.SetKeepAlive(7 * time.Second)
	go l.Serve(cl)
	defer func() { ln.Close(); l.CloseConnections(ctx) }()

	c, err := client.Dial(ctx, ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	// The bootstrap answered: the server set the options before it served the connection.
	require.NoError(t, c.Gateway().Resolve(ctx))
	accepted := (<-cl.accepted).(*net.TCPConn)

	raw, err := accepted.SyscallConn()
	require.NoError(t, err)
	got := map[string]int{}
	require.NoError(t, raw.Control(func(fd uintptr) {
		for name, opt := range map[string][2]int{
			"SO_KEEPALIVE": {unix.SOL_SOCKET, unix.SO_KEEPALIVE}, "TCP_KEEPIDLE": {unix.IPPROTO_TCP, unix.TCP_KEEPIDLE},
			"TCP_KEEPINTVL": {unix.IPPROTO_TCP, unix.TCP_KEEPINTVL}, "TCP_KEEPCNT": {unix.IPPROTO_TCP, unix.TCP_KEEPCNT},
			"TCP_USER_TIMEOUT": {unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT}, "TCP_NODELAY": {unix.IPPROTO_TCP, unix.TCP_NODELAY},
		} {
			v, err := unix.GetsockoptInt(int(fd), opt[0], opt[1])
			require.NoError(t, err, name)
			got[name] = v
		}
	}))
	require.Equal(t, map[string]int{"SO_KEEPALIVE": 1, "TCP_KEEPIDLE": 7, "TCP_KEEPINTVL": 7, "TCP_KEEPCNT": 3,
		"TCP_USER_TIMEOUT": 28000, "TCP_NODELAY": 1}, got)
}
