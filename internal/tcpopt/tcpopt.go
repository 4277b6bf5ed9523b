// Package tcpopt sets the socket options both ends of an itx RPC connection use to notice a peer
// that vanished behind a silent partition (no FIN, no RST).
package tcpopt

import (
	"net"
	"time"
)

// Default is the keepalive both ends use unless told otherwise (itxd --rpc-keepalive).
const Default = 15 * time.Second

// Probes is how many keepalive probes may go unanswered before the kernel ends a connection.
const Probes = 3

// KeepAlive is the keepalive configuration for a silence of d: probes after d, then every d.
func KeepAlive(d time.Duration) net.KeepAliveConfig {
	return net.KeepAliveConfig{Enable: true, Idle: d, Interval: d, Count: Probes}
}

// UserTimeout is the TCP user timeout that goes with a keepalive of d: as long as the probing.
func UserTimeout(d time.Duration) time.Duration { return (1 + Probes) * d }
