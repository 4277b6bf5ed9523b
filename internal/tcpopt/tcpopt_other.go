//go:build !linux

package tcpopt

import (
	"net"
	"time"
)

// SetUserTimeout is Linux's TCP_USER_TIMEOUT; elsewhere keepalive alone detects a dead peer.
func SetUserTimeout(*net.TCPConn, time.Duration) error { return nil }
