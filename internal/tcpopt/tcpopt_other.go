//go:build !linux

package tcpopt

import (
	"net"
	"time"
)

// SetUserTimeout is Linux's TCP_USER_TIMEOUT; elsewhere keepalive alone detects a dead peer.
func SetUserTimeout(*net.TCPConn, time.Duration) error { return nil }

// PeerClosed is Linux's POLLRDHUP check; elsewhere a held-back connection sees its peer's close
// when it reads again.
func PeerClosed(net.Conn) bool { return false }

// Unsent is Linux's SIOCOUTQ; elsewhere it is not known.
func Unsent(*net.TCPConn) (int, bool) { return 0, false }
