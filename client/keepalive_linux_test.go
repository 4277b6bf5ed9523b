package client

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The client's end of an RPC connection carries keepalive and a user timeout (DialWith): a
// remote host or a Receiver's provider whose itxd vanished behind a silent partition learns it
// within 4x the keepalive, and can redial, instead of holding a dead connection for ever.
func TestDial_ConnectionKeepsAlive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	for _, tc := range []struct {
		keepAlive time.Duration
		want      int
	}{{0, int(DefaultKeepAlive / time.Second)}, {5 * time.Second, 5}} {
		c, err := dialTCP(ctx, ln.Addr().String(), tc.keepAlive)
		require.NoError(t, err)
		raw, err := c.SyscallConn()
		require.NoError(t, err)
		got := map[string]int{}
		require.NoError(t, raw.Control(func(fd uintptr) {
			for name, opt := range map[string][2]int{
				"SO_KEEPALIVE": {unix.SOL_SOCKET, unix.SO_KEEPALIVE}, "TCP_KEEPIDLE": {unix.IPPROTO_TCP, unix.TCP_KEEPIDLE},
				"TCP_KEEPINTVL": {unix.IPPROTO_TCP, unix.TCP_KEEPINTVL}, "TCP_KEEPCNT": {unix.IPPROTO_TCP, unix.TCP_KEEPCNT},
				"TCP_USER_TIMEOUT": {unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT}, "TCP_NODELAY": {unix.IPPROTO_TCP, unix.TCP_NODELAY},
			} {
				v, err := unix.GetsockoptInt(int(fd), opt[0], opt[1])
				require.NoError(t, err)
				got[name] = v
			}
		}))
		c.Close()
		require.Equal(t, map[string]int{"SO_KEEPALIVE": 1, "TCP_KEEPIDLE": tc.want, "TCP_KEEPINTVL": tc.want, "TCP_KEEPCNT": 3,
			"TCP_USER_TIMEOUT": 4 * tc.want * 1000, "TCP_NODELAY": 1}, got)
	}
}
