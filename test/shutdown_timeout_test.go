package test

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/stretchr/testify/require"
)

// A SIGTERM whose in-flight calls outlast --shutdown-timeout (here an append whose commit is
// stuck in an fsync the disk does not answer) is logged when the timeout passes, naming the
// flag and the stream the calls still held, and itxd exits 1 with a last line naming the flag
// and its value. It said only "close: in-flight calls did not finish: context deadline
// exceeded", naming neither the flag nor what was running. Logged once, in the log's format (a
// plain "itxd: ..." line among --log-format json records did not parse).
func TestItxd_ShutdownTimeoutNamesTheFlagAndWhatRan(t *testing.T) {
	mnt, f := mountFaulty(t)
	p := startItxdNoReserve(t, filepath.Join(mnt, "data"), "--shutdown-timeout", "1s")
	ctx := ctxT(t)
	s := stream(t, dial(t, p.addr).Login(ctx, p.creds.ProjectToken), "/orders")
	mustAppend(t, s, ev("note", `{}`))

	release := make(chan struct{})
	f.hang.Store(&release)
	defer func() {
		if f.hang.Swap(nil) != nil {
			close(release)
		}
	}()
	stuck := make(chan error, 1)
	go func() {
		actx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := client.Append(actx, s, []itx.EventInput{ev("note", `{}`)}, itx.AppendOptions{})
		stuck <- err
	}()
	require.Eventually(t, func() bool { return f.hung.Load() > 0 }, 10*time.Second, 5*time.Millisecond, "the append's commit reached the fsync")

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool { return strings.Contains(p.logs.String(), "--shutdown-timeout") }, 20*time.Second, 10*time.Millisecond,
		"the timeout is logged when it passes, while the commit is still stuck")
	logged := p.logs.String()
	require.Contains(t, logged, "/orders in project "+p.creds.ProjectID, "the stream the calls held: %s", logged)
	f.hang.Store(nil)
	close(release)

	var exit *exec.ExitError
	err := <-p.exited
	require.True(t, errors.As(err, &exit), "itxd exits non-zero: %v", err)
	require.Equal(t, 1, exit.ExitCode())
	require.Equal(t, 1, strings.Count(p.logs.String(), "stopped after --shutdown-timeout (1s), before the in-flight calls finished"), p.logs.String())
	<-stuck
}

// A second SIGTERM or SIGINT during the drain ends itxd at once (exit 1, saying so), as an
// operator pressing Ctrl-C again expects; it was ignored, leaving --shutdown-timeout to run out.
// What it acknowledged before is there at the next start.
func TestItxd_SecondSignalExitsAtOnce(t *testing.T) {
	mnt, f := mountFaulty(t)
	data := filepath.Join(mnt, "data")
	p := startItxdNoReserve(t, data, "--shutdown-timeout", "10m", "--log-level", "info")
	ctx := ctxT(t)
	s := stream(t, dial(t, p.addr).Login(ctx, p.creds.ProjectToken), "/orders")
	mustAppend(t, s, ev("note", `{}`))

	release := make(chan struct{})
	f.hang.Store(&release)
	defer func() {
		if f.hang.Swap(nil) != nil {
			close(release)
		}
	}()
	go func() {
		actx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		client.Append(actx, s, []itx.EventInput{ev("note", `{}`)}, itx.AppendOptions{})
	}()
	require.Eventually(t, func() bool { return f.hung.Load() > 0 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool { return strings.Contains(p.logs.String(), "shutting down: finishing in-flight calls") }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
	require.Eventually(t, func() bool { return strings.Contains(p.logs.String(), "second signal: exiting now") }, 10*time.Second, 5*time.Millisecond,
		"the second signal is heard: %s", p.logs.String())
	f.hang.Store(nil)
	close(release)
	var exit *exec.ExitError
	select {
	case err := <-p.exited:
		require.True(t, errors.As(err, &exit), "%v", err)
		require.Equal(t, 1, exit.ExitCode())
	case <-time.After(30 * time.Second):
		t.Fatal("itxd did not exit on the second signal")
	}
	p = startItxdNoReserve(t, data)
	all, err := client.ReadAll(ctx, stream(t, dial(t, p.addr).Login(ctx, p.creds.ProjectToken), "/orders"), itx.Query{})
	require.NoError(t, err)
	require.NotEmpty(t, all, "the acknowledged append")
	require.Equal(t, "note", all[0].Type)
}
