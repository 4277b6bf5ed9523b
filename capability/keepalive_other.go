//go:build !linux

package capability

import (
	"net"
	"time"
)

// setUserTimeout is Linux's TCP_USER_TIMEOUT; elsewhere keepalive alone detects a dead peer.
func setUserTimeout(*net.TCPConn, time.Duration) error { return nil }
