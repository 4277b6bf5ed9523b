package capability

import (
	"net"
	"time"

	"github.com/itx-dev/itx/internal/tcpopt"
)

// DefaultKeepAlive is how long an RPC connection may be silent before the kernel starts probing
// it, and the interval between probes (itxd --rpc-keepalive).
const DefaultKeepAlive = tcpopt.Default

// tuneTCP sets an accepted RPC connection's socket options. A peer whose machine vanished
// behind a silent partition (no FIN, no RST) would otherwise hold its mounts, and show them
// present, until a delivery to it timed out, or for ever while nothing is sent: the kernel's
// keepalive ends an idle connection after keepAlive + keepAliveProbes probes keepAlive apart,
// and its user timeout (Linux) ends one whose writes go unacknowledged for as long. Either way
// the read fails, the RPC connection ends, and its mounts end as with a closed connection.
func tuneTCP(tc *net.TCPConn, keepAlive time.Duration) error {
	if err := tc.SetNoDelay(true); err != nil {
		return err
	}
	if err := tc.SetKeepAliveConfig(tcpopt.KeepAlive(keepAlive)); err != nil {
		return err
	}
	return tcpopt.SetUserTimeout(tc, tcpopt.UserTimeout(keepAlive))
}
