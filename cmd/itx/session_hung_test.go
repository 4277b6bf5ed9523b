package main

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/cmd/itx/internal/repl"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// stoppedState is the state letter /proc gives pid ('T' once stopped by a signal).
func stoppedState(t *testing.T, pid int) byte {
	st, err := itxtest.ProcessState(pid)
	require.NoError(t, err)
	return st
}

// itxd stops answering (SIGSTOP) while the prompt calls it: each call, those that end what the
// prompt made (a connection's close, a mount's unmount) too, returns once its evaluation's
// context ends (Ctrl-C), code cancelled, as README says a cancelled call prints.
func TestSession_CallsToAHungItxdEndWithCtrlC(t *testing.T) {
	data := t.TempDir()
	itxd, addr := runItxdOnLoopback(t, data)
	creds, err := server.ReadCredentials(data)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := repl.Connect(ctx, repl.Config{Addr: addr, Token: creds.ProjectToken, Out: newSyncBuffer(), Err: newSyncBuffer(), Format: repl.FormatJSON})
	require.NoError(t, err)
	defer s.Close()
	for _, src := range []string{`var s = project.streams.get("/hung")`, `s.append({type: "x"})`,
		`var c = s.openConnection({})`, `var m = project.capabilities.mount("inbox")`, `var caps = project.capabilities`} {
		_, err := s.Eval(ctx, "<test>", src)
		require.NoError(t, err, src)
	}
	require.NoError(t, itxd.cmd.Process.Signal(syscall.SIGSTOP))
	require.Eventually(t, func() bool { return stoppedState(t, itxd.cmd.Process.Pid) == 'T' }, 20*time.Second, time.Millisecond, "itxd stopped")
	defer itxd.cmd.Process.Signal(syscall.SIGCONT)
	for _, src := range []string{`s.describe()`, `s.append({type: "y"})`, `s.waitForEvent({types: ["never"], timeoutMs: 20000})`,
		`s.openConnection({})`, `s.liveState()`, `caps.mount("other")`, `c.ping()`, `c.key()`, `c.close()`, `m.unmount()`} {
		got := make(chan error, 1)
		go func() {
			cctx, cancel := context.WithCancel(ctx) // Ctrl-C, 200 ms into the call
			defer time.AfterFunc(200*time.Millisecond, cancel).Stop()
			defer cancel()
			_, err := s.Eval(cctx, "<test>", src)
			got <- err
		}()
		select {
		case err := <-got:
			require.Error(t, err, src)
			require.Equal(t, string(itx.ECancelled), repl.Describe(err).Code, "%s: %v", src, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: still waiting 10 s after Ctrl-C", src)
		}
	}
}
