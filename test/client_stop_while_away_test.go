package test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors/remote"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// acceptedConnections counts the established TCP connections whose local port is port (in
// hexadecimal in /proc/net/tcp): those a stopped itxd's kernel accepted for it.
func acceptedConnections(t *testing.T, port string) int {
	b, err := os.ReadFile("/proc/net/tcp")
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	local := fmt.Sprintf(":%04X ", p)
	n := 0
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 3 && strings.HasSuffix(f[1]+" ", local) && f[3] == "01" {
			n++
		}
	}
	return n
}

// A remote processor host and a client.Follow stopped (their context cancelled) while itxd is
// away: hung (SIGSTOP: connections accepted by the kernel, nothing answered, so both wait on a
// login or a mount), then gone (SIGKILL: dials refused, both in their backoff). Each time both
// return at once, and nothing of theirs is left running.
func TestClient_SDKStopsWhileItxdIsAway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	proc := startItxd(t, t.TempDir(), "--processors", "")
	opts := append(clientLeakOptions(), goleak.IgnoreAnyFunction("github.com/itx-dev/itx/test.startItxdBin.func1"))

	run := func(what string, waiting func(hostLogs, followLogs int) bool) {
		t.Helper()
		var mu sync.Mutex
		hostLogs, followLogs := 0, 0
		logTo := func(n *int) func(string, ...any) {
			return func(f string, a ...any) {
				mu.Lock()
				*n++
				mu.Unlock()
				t.Logf(f, a...)
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		hostDone := make(chan error, 1)
		go func() {
			hostDone <- remote.Run(ctx, remote.Config{Addr: proc.addr, Token: proc.creds.ProjectToken, Name: "away",
				Host: referenceHost(t, "forwarder"), MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
				Logf: logTo(&hostLogs)})
		}()
		followDone := make(chan error, 1)
		go func() {
			_, err := client.Follow(ctx, client.FollowConfig{Addr: proc.addr, Token: proc.creds.ProjectToken, Path: "/away",
				MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Logf: logTo(&followLogs)},
				func(context.Context, itx.DeliveryBatch) error { return nil })
			followDone <- err
		}()
		waitUntil(t, "both waiting on itxd ("+what+")", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return waiting(hostLogs, followLogs)
		})
		cancel()
		for name, done := range map[string]chan error{"remote.Run": hostDone, "Follow": followDone} {
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatalf("%s (%s) still runs 5 s after its context ended", name, what)
			}
		}
	}
	require.NoError(t, proc.cmd.Process.Signal(syscall.SIGSTOP))
	waitUntil(t, "itxd stopped", func() bool { return processState(t, proc.cmd.Process.Pid) == 'T' })
	_, port, err := net.SplitHostPort(proc.addr)
	require.NoError(t, err)
	before := acceptedConnections(t, port)
	// Hung: both connections accepted by the kernel (established at itxd's port), their logins
	// never answered.
	run("itxd hung", func(int, int) bool { return acceptedConnections(t, port) >= before+2 })
	proc.kill9(t)
	// Gone: each said its dial failed, and waits to dial again.
	run("itxd gone", func(host, follow int) bool { return host > 0 && follow > 0 })
	verifyNoLeak(t, opts...)
}
