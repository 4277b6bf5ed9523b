package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/stretchr/testify/require"
)

// itxd refuses a flag value it cannot honor before it starts anything: a clear message naming
// the flag, exit status 2 (as for a flag that does not parse), and no data directory made. A
// bound given as 0 or less used to be replaced by its default in silence, and an unknown
// --log-format by the console format.
func TestItxd_RefusesBadFlagValues(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--idle-timeout", "abc"}, "-idle-timeout"}, // does not parse (the flag package)
		{[]string{"--log-format", "xml"}, "--log-format"},
		{[]string{"--log-level", "loud"}, "--log-level"},
		{[]string{"--log-level", "trace"}, "--log-level"},    // zerolog's, not one the help names
		{[]string{"--log-level", "disabled"}, "--log-level"}, // would silence every log line
		{[]string{"--log-level", ""}, "--log-level"},         // zerolog's "no level": everything
		{[]string{"--processors", "bogus"}, "--processors"},
		{[]string{"--idle-timeout", "-1s"}, "--idle-timeout"},
		{[]string{"--idle-timeout", "0"}, "--idle-timeout"},
		{[]string{"--max-loaded-streams", "-5"}, "--max-loaded-streams"},
		{[]string{"--max-loaded-streams", "0"}, "--max-loaded-streams"},
		{[]string{"--webhook-max-in-flight", "0"}, "--webhook-max-in-flight"},
		{[]string{"--rpc-max-calls", "-1"}, "--rpc-max-calls"},
		{[]string{"--rpc-max-reply-bytes", "0"}, "--rpc-max-reply-bytes"},
		{[]string{"--rpc-login-timeout", "0s"}, "--rpc-login-timeout"},
		{[]string{"--rpc-keepalive", "0"}, "--rpc-keepalive"},
		{[]string{"--rpc-max-logins-per-connection", "0"}, "--rpc-max-logins-per-connection"},
		{[]string{"--rpc-max-push-bytes", "-1"}, "--rpc-max-push-bytes"},
		{[]string{"--rpc-keepalive", "-15s"}, "--rpc-keepalive"},
		{[]string{"--rpc-keepalive", "500ms"}, "--rpc-keepalive"},
		{[]string{"--rpc-max-message-bytes", "0"}, "--rpc-max-message-bytes"},
		{[]string{"--rpc-max-call-bytes", "-1"}, "--rpc-max-call-bytes"},
		{[]string{"--max-subscription-config-bytes", "0"}, "--max-subscription-config-bytes"},
		{[]string{"--max-host-contract-bytes", "-1"}, "--max-host-contract-bytes"},
		{[]string{"--max-readers-per-stream", "-1"}, "--max-readers-per-stream"},
		{[]string{"--max-subscriptions-per-stream", "0"}, "--max-subscriptions-per-stream"},
		{[]string{"--max-ephemeral-bytes-per-stream", "-1"}, "--max-ephemeral-bytes-per-stream"},
		{[]string{"--max-project-bytes", "-1"}, "--max-project-bytes -1 is out of range: want 0 (no quota) or 1 or more"},
		{[]string{"--min-free-disk-bytes", "-2"}, "--min-free-disk-bytes -2 is out of range: want -1 (none), 0 (the default)"},
		{[]string{"--max-processor-kv-keys", "0"}, "--max-processor-kv-keys"},
		{[]string{"--max-processor-kv-bytes", "0"}, "--max-processor-kv-bytes"},
		{[]string{"--breaker-burst", "-1"}, "--breaker-burst"},
		{[]string{"--jsonata-max-items", "0"}, "--jsonata-max-items"},
		{[]string{"--jsonata-max-steps", "0"}, "--jsonata-max-steps"},
		{[]string{"--jsonata-timeout", "0s"}, "--jsonata-timeout"},
		{[]string{"--jsonata-concurrency", "-2"}, "--jsonata-concurrency"},
		{[]string{"--shutdown-timeout", "-1s"}, "--shutdown-timeout"},
		{[]string{"--shutdown-timeout", "0s"}, "--shutdown-timeout"},
		{[]string{"--pprof"}, "--metrics"},
		{[]string{"--backup-every", "1h"}, "without a folder"},
		{[]string{"--backup-every", "1h", "--backup-dir", "rel"}, "absolute"},
		{[]string{"--backup-every", "500ms", "--backup-dir", "/tmp"}, "--backup-every 500ms is out of range: want 0 (never) or 1m0s or more"},
		{[]string{"--backup-every", "30s", "--backup-dir", "/tmp"}, "--backup-every 30s is out of range: want 0 (never) or 1m0s or more"},
		{[]string{"--backup-every", "1h", "--backup-dir", "/tmp", "--backup-keep", "0"}, "--backup-keep 0 is out of range: want 1 to 1000"},
		{[]string{"--backup-every", "1h", "--backup-dir", "/tmp", "--backup-keep", "1001"}, "--backup-keep 1001 is out of range: want 1 to 1000"},
		// Above 0 and still unworkable: each names the flag, the value and the range.
		{[]string{"--idle-timeout", "1ns"}, "--idle-timeout 1ns is out of range: want 1ms or more"},
		{[]string{"--jsonata-timeout", "1ns"}, "--jsonata-timeout 1ns is out of range: want 1ms or more"},
		{[]string{"--rpc-max-message-bytes", "10"}, "--rpc-max-message-bytes 10 is out of range: want 1024 or more"},
		{[]string{"--rpc-preauth-max-message-bytes", "100"}, "--rpc-preauth-max-message-bytes 100 is out of range: want 1024 or more"},
		{[]string{"--rpc-max-unfinished-reply-bytes", "100"}, "--rpc-max-unfinished-reply-bytes 100 is out of range"},
		{[]string{"--rpc-preauth-max-unfinished-reply-bytes", "100"}, "--rpc-preauth-max-unfinished-reply-bytes 100 is out of range"},
		{[]string{"--rpc-max-unfinished-replies", "2"}, "--rpc-max-unfinished-replies 2 is out of range: want 8 or more"},
		{[]string{"--rpc-max-capabilities", "1"}, "--rpc-max-capabilities 1 is out of range: want 8 or more"},
		{[]string{"--rpc-global-max-capabilities", "2"}, "--rpc-global-max-capabilities 2 is out of range"},
		{[]string{"--rpc-login-timeout", "1ms"}, "--rpc-login-timeout 1ms is out of range: want 10ms or more"},
		{[]string{"--rpc-keepalive", "10h"}, "--rpc-keepalive 10h0m0s is out of range: want 1s to 9h6m7s"},
		{[]string{"--shutdown-timeout", "1ns"}, "--shutdown-timeout 1ns is out of range: want 100ms or more"},
		{[]string{"--jsonata-concurrency", "1000000000000"}, "--jsonata-concurrency 1000000000000 is out of range: want 0 (one per core) or 1 to 65536"},
		{[]string{"--max-held-streams", "-1"}, "--max-held-streams -1 is out of range: want 0 (from the open-file limit) or 1 or more"},
		{[]string{"--agent-hesitation", "-1s"}, "--agent-hesitation -1s is out of range: want 0s or more"},
		{[]string{"--max-loaded-streams", "500", "--max-held-streams", "100"}, "--max-loaded-streams 500 is above --max-held-streams 100"},
		{[]string{"--metrics-max-connections", "0"}, "--metrics-max-connections 0 is out of range: want 1 or more"},
		{[]string{"--backup-dir", "/tmp"}, "without an interval"},
		{[]string{"--backup-keep", "30"}, "--backup-keep needs --backup-dir"},
		{[]string{"--tls-cert", "x.pem"}, "--tls-key"},
		{[]string{"serve"}, `"serve"`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			data := filepath.Join(t.TempDir(), "data")
			// A value accepted by mistake starts a server: the context ends it.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, itxdBin, append([]string{"--listen", "127.0.0.1:0", "--data", data}, tc.args...)...)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			require.True(t, errors.As(err, &exit), "itxd must refuse %v; it ran: %v\n%s", tc.args, err, out)
			require.Equal(t, 2, exit.ExitCode(), "output:\n%s", out)
			require.Contains(t, string(out), tc.want)
			_, err = os.Stat(data)
			require.True(t, errors.Is(err, os.ErrNotExist), "nothing is written: %v", err)
		})
	}
}

// The README's rule for itxd's numbers and durations: 0 is refused (exit status 2) unless the
// flag's help names what 0 means. --agent-hesitation took 0 ("do not wait") while its help said
// nothing of it.
func TestItxd_ZeroIsRefusedUnlessTheHelpNamesIt(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	help, _ := exec.Command(itxdBin, "--help").CombinedOutput()
	var name, kind, usage string
	check := func() {
		if name == "" || (kind != "int" && kind != "duration") || strings.Contains(usage, "(0") || strings.Contains(usage, "0:") {
			return
		}
		flag := "--" + name
		t.Run(flag, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			data := filepath.Join(t.TempDir(), "data")
			out, err := exec.CommandContext(ctx, itxdBin, "--listen", "127.0.0.1:0", "--data", data, flag, "0").CombinedOutput()
			var exit *exec.ExitError
			require.True(t, errors.As(err, &exit), "itxd took %s 0, whose help names no meaning for 0 (%s): %v\n%s", flag, usage, err, out)
			require.Equal(t, 2, exit.ExitCode(), "output:\n%s", out)
		})
	}
	for _, line := range strings.Split(string(help), "\n") {
		if f, ok := strings.CutPrefix(line, "  -"); ok {
			check()
			name, kind, _ = strings.Cut(f, " ")
			usage = ""
		} else {
			usage += line
		}
	}
	check()
}

// A --metrics address itxd cannot listen on is refused before the data directory is opened:
// it used to initialize a new one (and leave its databases unclosed) before failing.
func TestItxd_UnusableMetricsAddressWritesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	for _, addr := range []string{"bad:addr:x", taken.Addr().String()} {
		t.Run(addr, func(t *testing.T) {
			data := filepath.Join(t.TempDir(), "data")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, itxdBin, "--listen", "127.0.0.1:0", "--data", data, "--metrics", addr).CombinedOutput()
			var exit *exec.ExitError
			require.True(t, errors.As(err, &exit), "itxd must refuse --metrics %s; it ran: %v\n%s", addr, err, out)
			require.Contains(t, string(out), "--metrics")
			_, err = os.Stat(data)
			require.True(t, errors.Is(err, os.ErrNotExist), "nothing is written: %v\n%s", err, out)
		})
	}
}

// A --listen address itxd cannot listen on is refused naming the flag, before the data
// directory is opened: --listen 127.0.0.1:99999 initialized a new data directory (tokens and
// all), then failed with "listen tcp: address 99999: invalid port", naming no flag.
func TestItxd_UnusableListenAddressWritesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	for _, addr := range []string{"127.0.0.1:99999", taken.Addr().String()} {
		t.Run(addr, func(t *testing.T) {
			data := filepath.Join(t.TempDir(), "data")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, itxdBin, "--listen", addr, "--data", data).CombinedOutput()
			var exit *exec.ExitError
			require.True(t, errors.As(err, &exit), "itxd must refuse --listen %s; it ran: %v\n%s", addr, err, out)
			require.Contains(t, string(out), "itxd: --listen: listen tcp")
			_, err = os.Stat(data)
			require.True(t, errors.Is(err, os.ErrNotExist), "nothing is written: %v\n%s", err, out)
		})
	}
}

// With --log-format json every line itxd writes to stderr is a JSON record, the connect hint
// too: it was printed as plain text among the JSON lines (an operator's log shipper choked on
// them), at every start.
func TestItxd_JSONLogsParse(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	data := filepath.Join(t.TempDir(), "data")
	addrFile := filepath.Join(t.TempDir(), "addr")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, itxdBin, "--listen", "127.0.0.1:0", "--data", data, "--addr-file", addrFile, "--log-format", "json")
	logs, exited := startUntilListening(t, cmd, addrFile)
	// A failure after the flags, a second itxd on the same data directory, is a JSON record too
	// (it was a plain "itxd: open server: ... is in use" line).
	second := exec.CommandContext(ctx, itxdBin, "--listen", "127.0.0.1:0", "--data", data, "--log-format", "json")
	var secondLogs syncBuffer
	second.Stderr = &secondLogs
	var exit *exec.ExitError
	require.True(t, errors.As(second.Run(), &exit), "a second itxd on the data directory must fail:\n%s", secondLogs.String())
	require.Equal(t, 1, exit.ExitCode())
	var failure map[string]any
	for _, line := range strings.Split(strings.TrimSpace(secondLogs.String()), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "a line that is not JSON: %q", line)
		if rec["level"] == "error" {
			failure = rec
		}
	}
	require.NotNil(t, failure, "the failure is logged at error:\n%s", secondLogs.String())
	require.Contains(t, failure["error"], "in use")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, <-exited, logs.String())
	var messages []string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "a line that is not JSON: %q", line)
		messages = append(messages, fmt.Sprint(rec["message"]))
	}
	require.Contains(t, messages, "itxd listening")
	require.Contains(t, messages, "connect with the itx REPL")
	require.Contains(t, messages, "stopped")
}

// Each floor itxd takes is one a client can work under: an itxd with its RPC bounds, login
// timeout and idle timeout at their least serves a login, appends, reads, a JSONata barrier and
// a second stream, and stops cleanly within the least --shutdown-timeout. The floors are what
// TestItxd_RefusesBadFlagValues refuses below. (Bounds that only refuse requests, such as the
// JSONata budget or the project quota, take any value from 1.)
func TestItxd_LeastValuesWork(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	p := startItxd(t, t.TempDir(),
		"--rpc-max-message-bytes", "1024", "--rpc-preauth-max-message-bytes", "1024",
		"--rpc-max-unfinished-reply-bytes", "1024", "--rpc-preauth-max-unfinished-reply-bytes", "1024",
		"--rpc-max-unfinished-replies", "16", "--rpc-preauth-max-unfinished-replies", "1", // 8, the floor, serves a client that sends its Finish at once; Go clients send it 250 ms after the reply
		"--rpc-max-capabilities", "8", "--rpc-global-max-capabilities", "8",
		"--rpc-max-calls", "1", "--rpc-preauth-max-calls", "1", "--rpc-max-unreturned-calls", "1",
		"--rpc-max-reply-bytes", "1", "--rpc-preauth-max-reply-bytes", "1", "--rpc-max-call-bytes", "1",
		"--rpc-max-connections", "1", "--rpc-max-logins-per-connection", "1",
		"--idle-timeout", "1ms", "--shutdown-timeout", "100ms", "--rpc-login-timeout", "10ms")
	ctx := ctxT(t)
	// The login deadline is 10 ms from itxd's accept: on a loaded machine a client's login may
	// well reach itxd later, and itxd then rightly aborts the connection saying so (11 of 20 runs
	// on a loaded 2-vCPU machine). What the floor promises is that a login made in time is
	// served: dial again after such an abort (and after the one-connection bound's refusal of a
	// dial that came before the aborted connection was let go), up to 20 times.
	var proj schema.Project
	var s schema.Stream
	for attempt := 1; ; attempt++ {
		conn := dial(t, p.addr)
		proj = conn.Login(ctx, p.creds.ProjectToken)
		s = stream(t, proj, "/a")
		_, err := client.Append(ctx, s, []itx.EventInput{ev("note", `{"n":1}`)}, itx.AppendOptions{})
		if err == nil {
			break
		}
		<-conn.Done()
		why := conn.Err()
		late := why != nil && (strings.Contains(why.Error(), "no login within 10ms") || strings.Contains(why.Error(), "at most 1 connections"))
		require.True(t, late && attempt < 20, "append %v; the connection: %v", err, why)
		t.Logf("attempt %d: %v", attempt, why)
	}
	mustAppend(t, s, ev("note", `{"n":2}`))
	all, err := client.ReadAll(ctx, s, itx.Query{})
	require.NoError(t, err)
	require.Len(t, all, 2)
	e, err := client.WaitForEvent(ctx, s, itx.Predicate{Where: "payload.n = 2"}, 0, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, int64(2), e.Offset)
	mustAppend(t, stream(t, proj, "/b"), ev("note", `{}`))
	require.NoError(t, p.stop(t))
}

// --max-held-streams bounds every loaded stream, idle ones too, so a --max-loaded-streams above
// it did nothing, in silence. Given above the held bound the open-file limit derives (256 under
// ulimit -n 4096), it is refused naming both flags and the limit; left at its default of 1,024
// it is lowered to the held bound, which the start-up line shows.
func TestItxd_MaxLoadedStreamsWithinTheHeldBound(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	underLimit := func(ctx context.Context, args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, "sh", append([]string{"-c", `ulimit -n 4096 && exec "$0" "$@"`, itxdBin}, args...)...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	data := filepath.Join(t.TempDir(), "data")
	out, err := underLimit(ctx, "--listen", "127.0.0.1:0", "--data", data, "--max-loaded-streams", "1000").CombinedOutput()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "itxd must refuse; it ran: %v\n%s", err, out)
	require.Equal(t, 2, exit.ExitCode(), "output:\n%s", out)
	require.Contains(t, string(out), "--max-loaded-streams 1000 is above --max-held-streams, which the open-file limit of 4096 makes 256 here")
	_, err = os.Stat(data)
	require.True(t, errors.Is(err, os.ErrNotExist), "nothing is written: %v", err)

	addrFile := filepath.Join(t.TempDir(), "addr")
	cmd := underLimit(ctx, "--listen", "127.0.0.1:0", "--data", data, "--addr-file", addrFile, "--log-format", "json")
	logs, exited := startUntilListening(t, cmd, addrFile)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, <-exited, logs.String())
	require.Contains(t, logs.String(), `"maxLoadedStreams":256,"maxHeldStreams":256`)
	require.NotContains(t, logs.String(), "open-file limit leaves room for")

	// A --max-held-streams the limit has no room for is taken, and said at once.
	data2 := filepath.Join(t.TempDir(), "data")
	addrFile2 := filepath.Join(t.TempDir(), "addr")
	cmd = underLimit(ctx, "--listen", "127.0.0.1:0", "--data", data2, "--addr-file", addrFile2, "--log-format", "json", "--max-held-streams", "3000")
	logs, exited = startUntilListening(t, cmd, addrFile2)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, <-exited, logs.String())
	require.Contains(t, logs.String(), "--max-held-streams is above what the open-file limit leaves room for")
	require.Contains(t, logs.String(), `"maxHeldStreams":3000,"openFileLimit":4096`)
}

// itxd --help says what itxd is, how it stops and what its exit statuses mean before the flags,
// and exits 0; a flag that does not parse is one error line and a hint, exit 2: it was followed
// by the whole help, 150 lines with the error at their top.
func TestItxd_HelpAndAFlagThatDoesNotParse(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	help, err := exec.Command(itxdBin, "--help").CombinedOutput()
	require.NoError(t, err, "--help exits 0:\n%s", help)
	require.True(t, strings.HasPrefix(string(help), "Usage: itxd [flags]\n"), "%s", help)
	for _, want := range []string{"SIGTERM or SIGINT", "exit status 2", "/healthz", "-webhook-allow-host host", "[takes 10ms or more]"} {
		require.Contains(t, string(help), want)
	}
	data := filepath.Join(t.TempDir(), "data")
	out, err := exec.Command(itxdBin, "--data", data, "--idle-timeout", "abc").CombinedOutput()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "%v\n%s", err, out)
	require.Equal(t, 2, exit.ExitCode())
	require.Equal(t, "itxd: invalid value \"abc\" for flag -idle-timeout: parse error\nrun itxd --help for the flags\n", string(out))
}

// When the --addr-file appears, credentials.json already names that address: a supervisor that
// waits for the file and then runs `itx --data DIR` (which reads the address from the
// credentials) reaches this itxd. The file was written first, and until the credentials were
// rewritten a moment later they named the previous run's address (with --listen :0, a port
// nothing listens on, or that something else took since).
func TestItxd_AddrFileComesAfterTheCredentialsNameIt(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	data := filepath.Join(t.TempDir(), "data")
	for run := range 5 {
		addrFile := filepath.Join(t.TempDir(), "addr")
		cmd := exec.Command(itxdBin, "--listen", "127.0.0.1:0", "--data", data, "--addr-file", addrFile, "--log-level", "warn", "--processors", "")
		var logs syncBuffer
		cmd.Stderr = &logs
		require.NoError(t, cmd.Start())
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		var addr string
		for addr == "" { // no pause: read the credentials the moment the file says itxd listens
			if b, err := os.ReadFile(addrFile); err == nil {
				addr = string(b)
			}
			select {
			case err := <-exited:
				t.Fatalf("itxd exited before listening: %v\n%s", err, logs.String())
			default:
			}
		}
		b, err := os.ReadFile(filepath.Join(data, "credentials.json"))
		require.NoError(t, err)
		var creds struct{ Addr string }
		require.NoError(t, json.Unmarshal(b, &creds))
		require.Equal(t, addr, creds.Addr, "run %d: credentials.json names the address the address file gives", run)
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		require.NoError(t, <-exited, logs.String())
	}
}

// startUntilListening starts an itxd command given --addr-file addrFile and waits until the file
// says it listens; it returns the command's stderr and a channel of its exit.
func startUntilListening(t *testing.T, cmd *exec.Cmd, addrFile string) (*syncBuffer, chan error) {
	t.Helper()
	logs := &syncBuffer{}
	cmd.Stderr = logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for {
		if b, err := os.ReadFile(addrFile); err == nil && len(b) > 0 {
			return logs, exited
		}
		select {
		case err := <-exited:
			t.Fatalf("itxd exited before listening: %v\n%s", err, logs.String())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// A console log written to a file or a pipe (not a terminal) has no color escape codes: each
// key=value stays whole for grep (they split "addr=" from its value).
func TestItxd_ConsoleLogOffATerminalIsUncolored(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	data, addrFile := t.TempDir(), filepath.Join(t.TempDir(), "addr")
	cmd := exec.Command(itxdBin, "--listen", "127.0.0.1:0", "--data", data, "--addr-file", addrFile)
	cmd.Env = append(os.Environ(), "NO_COLOR=") // colors go off here for not being a terminal alone
	logs, exited := startUntilListening(t, cmd, addrFile)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, <-exited, logs.String())
	addr, err := os.ReadFile(addrFile)
	require.NoError(t, err)
	require.NotContains(t, logs.String(), "\x1b[", "escape codes in a log that is not on a terminal")
	require.Contains(t, logs.String(), "addr="+string(addr), logs.String())
}
