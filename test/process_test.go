package test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// itxdBin is the itxd binary built once for every test that needs a separate process.
var itxdBin string

// itxdRace: with ITXD_RACE set (make race), itxd and the remotehost are built with the race
// detector, so the black-box tests look for data races in the server as well as in the client,
// and each process's log is checked for the detector's reports when its test ends (raceReported).
var itxdRace = os.Getenv("ITXD_RACE") != ""

// goBuild is `go build` with the tests' flags: -race under ITXD_RACE.
func goBuild(args ...string) *exec.Cmd {
	if itxdRace {
		args = append([]string{"-race"}, args...)
	}
	return exec.Command("go", append([]string{"build"}, args...)...)
}

// skipRSSUnderRace skips a test that bounds itxd's resident memory when itxd is built with the
// race detector, whose shadow memory is several times the program's own.
func skipRSSUnderRace(t testing.TB) {
	t.Helper()
	if itxdRace {
		t.Skip("itxd's memory bound does not hold for a race-built itxd (ITXD_RACE)")
	}
}

// raceReported fails t when a process's log holds a report of the race detector.
func raceReported(t testing.TB, what, log string) {
	t.Helper()
	if i := strings.Index(log, "WARNING: DATA RACE"); i >= 0 {
		t.Errorf("%s reported a data race:\n%s", what, log[i:])
	}
}

func TestMain(m *testing.M) {
	if role := os.Getenv(sdkAuthorRoleEnv); role != "" { // a process of the sdk-author tests
		os.Exit(sdkAuthorChild(role))
	}
	if os.Getenv(residueEnvClient) != "" { // a client process of TestItxd_ClientResidue: no itxd
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "itxd-bin")
	if err != nil {
		panic(err)
	}
	itxdBin = filepath.Join(dir, "itxd")
	build := goBuild("-o", itxdBin, "../cmd/itxd")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building itxd:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// itxdProcess is a real itxd process on a loopback port.
type itxdProcess struct {
	cmd    *exec.Cmd
	addr   string
	creds  server.Credentials
	exited chan error
	logs   *syncBuffer // what it wrote to stderr
}

// startItxd starts itxd on dataDir and waits until it listens.
func startItxd(t testing.TB, dataDir string, extra ...string) *itxdProcess {
	t.Helper()
	return startItxdBin(t, itxdBin, nil, dataDir, extra...)
}

// itxdKillPointBin is itxd built with the itxtest tag, which kills itself at the point named by
// ITXD_TEST_KILL_AT (server/killpoint_itxtest.go). Only the tests that ask build it.
var itxdKillPointBin = sync.OnceValues(func() (string, error) {
	bin := filepath.Join(filepath.Dir(itxdBin), "itxd-killpoint")
	if out, err := goBuild("-tags", "itxtest", "-o", bin, "../cmd/itxd").CombinedOutput(); err != nil {
		return "", fmt.Errorf("building itxd -tags itxtest: %w\n%s", err, out)
	}
	return bin, nil
})

// startItxdKilledAt starts an itxd on dataDir that kills itself (SIGKILL) when it reaches point.
func startItxdKilledAt(t testing.TB, dataDir, point string, extra ...string) *itxdProcess {
	t.Helper()
	bin, err := itxdKillPointBin()
	require.NoError(t, err)
	return startItxdBin(t, bin, []string{"ITXD_TEST_KILL_AT=" + point}, dataDir, extra...)
}

func startItxdBin(t testing.TB, bin string, env []string, dataDir string, extra ...string) *itxdProcess {
	t.Helper()
	addrFile := filepath.Join(t.TempDir(), "addr")
	args := append([]string{"--listen", "127.0.0.1:0", "--data", dataDir, "--addr-file", addrFile, "--log-level", "warn"}, extra...)
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	var logs syncBuffer // exec's copying goroutine writes it while the test may read it
	cmd.Stderr = &logs
	require.NoError(t, cmd.Start())
	p := &itxdProcess{cmd: cmd, exited: make(chan error, 1), logs: &logs}
	waited := make(chan struct{}) // closed once Wait returned, whoever takes its error
	go func() {
		p.exited <- cmd.Wait()
		close(waited)
	}()
	t.Cleanup(func() {
		select {
		case <-waited: // it ended: killed by the test, or on its own
		default:
			cmd.Process.Kill()
			<-waited
		}
		raceReported(t, "itxd", logs.String())
		if t.Failed() {
			t.Logf("itxd log:\n%s", logs.String())
		}
	})
	// Wait for the address file, the process's "listening" signal (or for it to die).
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(addrFile); err == nil && len(b) > 0 {
			p.addr = string(b)
			break
		}
		select {
		case err := <-p.exited:
			t.Fatalf("itxd exited before listening: %v\n%s", err, logs.String())
		case <-time.After(5 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "itxd did not start")
	}
	creds, err := server.ReadCredentials(dataDir)
	require.NoError(t, err)
	p.creds = creds
	return p
}

// kill9 kills the process without warning and waits for it to be gone.
func (p *itxdProcess) kill9(t testing.TB) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	<-p.exited
}

// stop sends SIGTERM and returns the exit error.
func (p *itxdProcess) stop(t testing.TB) error {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-p.exited:
		return err
	case <-time.After(60 * time.Second):
		t.Fatal("itxd did not stop on SIGTERM")
		return nil
	}
}

// requireKilledAtThePoint waits for an itxd built with a kill point (-tags itxtest) to have
// killed itself there (SIGKILL), within 30 s.
func (p *itxdProcess) requireKilledAtThePoint(t testing.TB) {
	t.Helper()
	select {
	case err := <-p.exited:
		var exit *exec.ExitError
		require.True(t, errors.As(err, &exit), "itxd exited: %v", err)
		require.Equal(t, syscall.SIGKILL, exit.Sys().(syscall.WaitStatus).Signal(), "itxd killed at the point")
	case <-time.After(30 * time.Second):
		t.Fatal("itxd did not die at the kill point")
	}
}
