package test

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
	// What itxd holds of the peers: its sockets connected on the metrics port. (Counting all its
	// descriptors against a baseline also counted whatever else it opened meanwhile: a
	// database connection, a file being rewritten.)
	_, portStr, err := net.SplitHostPort(metricsAddr)
	require.NoError(t, err)
	port, err := strconv.Atoi(portStr)
	require.NoError(t, err)
	pid := p.cmd.Process.Pid
	accepted := func() int {
		peers := map[string]bool{} // socket inodes on the metrics port, not listening
		for _, f := range []string{"tcp", "tcp6"} {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
			for _, line := range strings.Split(string(b), "\n")[1:] {
				// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
				fs := strings.Fields(line)
				if len(fs) < 10 || fs[3] == "0A" { // 0A: LISTEN
					continue
				}
				i := strings.LastIndexByte(fs[1], ':')
				if lp, err := strconv.ParseUint(fs[1][i+1:], 16, 16); err == nil && int(lp) == port {
					peers[fs[9]] = true
				}
			}
		}
		n := 0
		fdDir := fmt.Sprintf("/proc/%d/fd", pid)
		ents, _ := os.ReadDir(fdDir)
		for _, e := range ents {
			l, err := os.Readlink(filepath.Join(fdDir, e.Name()))
			if err == nil && strings.HasPrefix(l, "socket:[") && peers[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] {
				n++
			}
		}
		return n
	}

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
	most := 0
	waitUntil(t, "itxd closes a peer whose request header never came", func() bool {
		most = max(most, accepted())
		select {
		case <-closed:
			return true
		default:
			return false
		}
	})
	require.Equal(t, limit, most, "at most --metrics-max-connections peers are accepted at once")
}
