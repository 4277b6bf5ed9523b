package main

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
)

// buildItxd builds cmd/itxd once per test binary.
var buildItxd = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "itxd-bin")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "itxd")
	out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, "../itxd").CombinedOutput()
	if err != nil {
		return "", &buildError{out: string(out), err: err}
	}
	return bin, nil
})

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return e.err.Error() + ": " + e.out }

// startItxd runs the itxd binary as `make run` does, on a port of its choosing, and returns once
// it has announced how to connect (after recording its address).
func startItxd(t *testing.T, data string) *exec.Cmd {
	t.Helper()
	bin, err := buildItxd()
	require.NoError(t, err)
	cmd := exec.Command(bin, "--listen", "127.0.0.1:0", "--data", data)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	})
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "Connect with the itx REPL") {
			go func() {
				for sc.Scan() {
				}
			}()
			return cmd
		}
	}
	t.Fatalf("itxd ended before announcing itself: %v", sc.Err())
	return nil
}

// Point 7: itxd records where it listens, so --data alone connects, whatever the port.
func TestIssue12_DataDirConnects(t *testing.T) {
	data := t.TempDir()
	startItxd(t, data)
	b, err := os.ReadFile(filepath.Join(data, "credentials.json"))
	require.NoError(t, err)
	require.Contains(t, string(b), `"addr": "127.0.0.1:`)
	fi, err := os.Stat(filepath.Join(data, "credentials.json"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "the tokens stay private")

	c := newCLI(t)
	code, out, errs := c.run("", "--data", data, "--json", "-e", "project.describe().name")
	require.Equal(t, exitOK, code, errs)
	require.Equal(t, "\"default\"\n", out)
}

// Point 4: integers beyond 2^53 survive, in --json and pretty output, read and written.
func TestIssue12_BigIntegers(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/big", itx.EventInput{Type: "n", Payload: json.RawMessage(`{"n": 9007199254740993, "small": 7, "f": 1.5}`)})
	c := newCLI(t)
	conn := []string{"--addr", ts.addr, "--token", ts.token}

	code, out, errs := c.run("", append(conn, "--json", "-e", `project.streams.get("/big").getEvents()[0].payload`)...)
	require.Equal(t, exitOK, code, errs)
	require.Equal(t, `{"n":9007199254740993,"small":7,"f":1.5}`+"\n", out)

	code, out, errs = c.run("", append(conn, "-e", `project.streams.get("/big").getEvents()[0].payload`)...)
	require.Equal(t, exitOK, code, errs)
	require.Contains(t, out, `"n": 9007199254740993,`)

	code, out, errs = c.run("", append(conn, "-e", `typeof project.streams.get("/big").getEvents()[0].payload.n`)...)
	require.Equal(t, exitOK, code, errs)
	require.Equal(t, "\"bigint\"\n", out, "held as a BigInt, not rounded to a double")

	// A BigInt written by a script is sent as its exact digits, not refused with a Go error.
	code, _, errs = c.run("", append(conn, "-e", `project.streams.get("/big").append({type: "n", payload: {n: 9007199254740995n}})`)...)
	require.Equal(t, exitOK, code, errs)
	code, out, errs = c.run("", append(conn, "--json", "-e", `project.streams.get("/big").getEvents({after: 1})[0].payload`)...)
	require.Equal(t, exitOK, code, errs)
	require.Equal(t, `{"n":9007199254740995}`+"\n", out)
}
