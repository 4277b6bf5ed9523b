package test

import (
	"fmt"
	"io"
	"net"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// Peers that connect to the --metrics address and never finish a request held a goroutine and a
// file descriptor each in itxd, for ever and without limit (3,000 such peers: 3,000 goroutines;
// 20,000 took every descriptor, and the RPC listener's accept failed with EMFILE). itxd now
// serves at most --metrics-max-connections at once (the others wait, unaccepted, in the
// kernel's backlog) and closes one whose request header has not arrived within 10 s.
func TestItxd_MetricsConnectionsAreBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	if _, err := os.Stat("/proc/self/fd"); err != nil {
		t.Skip("needs /proc to see itxd's open files")
	}
	const limit = 4
	metricsAddr := freeAddr(t)
	p := startItxd(t, t.TempDir(), "--metrics", metricsAddr, "--metrics-max-connections", fmt.Sprint(limit))
	fdDir := fmt.Sprintf("/proc/%d/fd", p.cmd.Process.Pid)
	openFiles := func() int {
		ents, _ := os.ReadDir(fdDir)
		return len(ents)
	}
	base := openFiles()

	slow := make([]net.Conn, 0, 4*limit)
	t.Cleanup(func() {
		for _, c := range slow {
			c.Close()
		}
	})
	for range 4 * limit {
		c, err := net.Dial("tcp", metricsAddr)
		require.NoError(t, err)
		_, err = c.Write([]byte("GET /metrics HTTP/1.1\r\nHost: x\r\n")) // and never the blank line
		require.NoError(t, err)
		slow = append(slow, c)
	}
	closed := make(chan struct{})
	go func() {
		io.Copy(io.Discard, slow[0]) // returns once itxd closes it
		close(closed)
	}()
	most := base
	waitUntil(t, "itxd closes a peer whose request header never came", func() bool {
		most = max(most, openFiles())
		select {
		case <-closed:
			return true
		default:
			return false
		}
	})
	require.LessOrEqual(t, most, base+limit, "at most --metrics-max-connections peers are accepted at once")
}
