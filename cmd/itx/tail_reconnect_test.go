package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/cmd/itx/internal/repl"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// itxdProcess is a real itxd process (the binary buildItxd makes) on a data directory.
type itxdProcess struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// runItxd starts itxd on data listening at listen ("127.0.0.1:0": a port of its choosing) and
// returns once it has announced how to connect, with the address it listens on (the one it
// records in credentials.json). The process is killed when the test ends, if it still runs. An
// itxd to be restarted on its address starts with runItxdOnLoopback.
func runItxd(t *testing.T, data, listen string) (*itxdProcess, string) {
	t.Helper()
	p, addr, err := tryRunItxd(t, data, listen)
	require.NoError(t, err)
	return p, addr
}

// tryRunItxd is runItxd, with an itxd that ends before announcing itself (it could not listen
// at listen, say) an error.
func tryRunItxd(t *testing.T, data, listen string) (*itxdProcess, string, error) {
	t.Helper()
	bin, err := buildItxd()
	require.NoError(t, err)
	cmd := exec.Command(bin, "--listen", listen, "--data", data)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &itxdProcess{cmd: cmd, exited: make(chan struct{})}
	announced := false
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "Connect with the itx REPL") {
			announced = true
			break
		}
	}
	scanErr := sc.Err() // read before the goroutine below scans on
	go func() {
		for sc.Scan() {
		}
		cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() { p.kill9(t) })
	if !announced {
		<-p.exited
		return nil, "", fmt.Errorf("itxd on %s ended before announcing itself: %v", listen, scanErr)
	}
	b, err := os.ReadFile(filepath.Join(data, server.CredentialsFile))
	require.NoError(t, err)
	var rec struct {
		Addr string `json:"addr"`
	}
	require.NoError(t, json.Unmarshal(b, &rec))
	require.NotEmpty(t, rec.Addr)
	return p, rec.Addr, nil
}

// stop sends SIGTERM (a deploy: itxd closes its connections with serverShuttingDown) and waits
// for the process to end.
func (p *itxdProcess) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	<-p.exited
}

// kill9 kills the process without warning, if it still runs, and waits for it to end.
func (p *itxdProcess) kill9(t *testing.T) {
	select {
	case <-p.exited:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// itxCommand is `itx <args>` run as a separate process, its output readable while it runs.
type itxCommand struct {
	cmd          *exec.Cmd
	out, errs    *syncBuffer
	exited       chan struct{}
	exitErr      error
	interruptOne sync.Once
}

func startItxCommand(t *testing.T, addr, token string, args ...string) *itxCommand {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "ITX_TEST_MAIN=1", "HOME="+t.TempDir(), "ITX_ADDR="+addr,
		"ITX_TOKEN="+token, "NO_COLOR=1", "TERM=xterm")
	c := &itxCommand{cmd: cmd, out: newSyncBuffer(), errs: newSyncBuffer(), exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.out, c.errs
	require.NoError(t, cmd.Start())
	go func() {
		c.exitErr = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			cmd.Process.Kill()
			<-c.exited
		}
	})
	return c
}

// wait waits until buf holds s, failing at once if itx exits first.
func (c *itxCommand) wait(t *testing.T, buf *syncBuffer, s string) {
	t.Helper()
	c.waitUntil(t, buf, s, func(out string) bool { return strings.Contains(out, s) })
}

// waitUntil waits until cond holds for what buf holds (on each write, not on a timer),
// failing at once if itx exits first, or after 30 s.
func (c *itxCommand) waitUntil(t *testing.T, buf *syncBuffer, what string, cond func(string) bool) {
	t.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		buf.mu.Lock()
		ok, changed := cond(buf.buf.String()), buf.changed
		buf.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-c.exited:
			if !cond(buf.String()) {
				t.Fatalf("itx exited (%v) before %s; stdout %q, stderr %q", c.exitErr, what, c.out.String(), c.errs.String())
			}
			return
		case <-deadline.C:
			t.Fatalf("no %s after 30 s; stdout %q, stderr %q", what, c.out.String(), c.errs.String())
		}
	}
}

// interrupt sends SIGINT (Ctrl-C) and requires exit status 130.
func (c *itxCommand) interrupt(t *testing.T) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(os.Interrupt))
	<-c.exited
	var exit *exec.ExitError
	require.True(t, errors.As(c.exitErr, &exit), "want exit status 130, got %v; stderr %q", c.exitErr, c.errs.String())
	require.Equal(t, exitInterrupted, exit.ExitCode(), "stderr %q", c.errs.String())
}

// tailedEvent is one line itx tail printed: its offset and type.
type tailedEvent struct {
	Offset int64  `json:"offset"`
	Type   string `json:"type"`
}

// tailedEvents reads itx tail's output, in the JSON format or as text lines
// ("offset  time  type  payload").
func tailedEvents(t *testing.T, out string, asJSON bool) []tailedEvent {
	t.Helper()
	var got []tailedEvent
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var e tailedEvent
		if asJSON {
			require.NoError(t, json.Unmarshal([]byte(line), &e), "line %q", line)
		} else {
			f := strings.Split(line, "  ")
			require.GreaterOrEqual(t, len(f), 3, "line %q", line)
			n, err := strconv.ParseInt(strings.TrimSuffix(f[0], "~"), 10, 64)
			require.NoError(t, err, "line %q", line)
			e = tailedEvent{Offset: n, Type: f[2]}
		}
		got = append(got, e)
	}
	return got
}

// appendTypes appends one event of each type to the stream at path, through the Go client.
func appendTypes(t *testing.T, addr, token, path string, types ...string) {
	t.Helper()
	events := make([]itx.EventInput, len(types))
	for i, typ := range types {
		events[i] = itx.EventInput{Type: typ, Payload: json.RawMessage(`{}`)}
	}
	(&testServer{addr: addr, token: token}).appendDirect(t, path, events...)
}

// itx tail goes on across an itxd restart, as tail -F does across a rotated file: it says once
// on stderr that itxd went away, reconnects, and opens its connection again after the last
// offset it printed, so the events appended before, while itxd was down (through another
// itxd on the same data directory, which the tail cannot reach) and after it came back each
// print once, in offset order. It ended with exit status 1 ("serverShuttingDown", "the
// connection to itxd ended"). Both ways itxd goes away (a deploy's SIGTERM, a kill -9), and
// both output formats.
func TestMain_TailGoesOnAcrossAnItxdRestart(t *testing.T) {
	for _, tc := range []struct {
		name   string
		asJSON bool
		kill   bool
	}{
		{"text stop", false, false},
		{"json kill -9", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := t.TempDir()
			itxd, addr := runItxdOnLoopback(t, data) // restarted on addr below
			creds, err := server.ReadCredentials(data)
			require.NoError(t, err)
			token := creds.ProjectToken
			appendTypes(t, addr, token, "/f", "before-1", "before-2", "before-3")

			args := []string{"tail", "/f", "--from", "0"}
			if tc.asJSON {
				args = append(args, "--json")
			}
			tail := startItxCommand(t, addr, token, args...)
			tail.wait(t, tail.out, "before-3")

			if tc.kill {
				itxd.kill9(t)
			} else {
				itxd.stop(t)
			}
			tail.wait(t, tail.errs, "itxd went away")

			// Appended while the tail cannot reach itxd: the same data directory served at
			// another address.
			side, sideAddr := runItxd(t, data, "127.0.0.1:0")
			appendTypes(t, sideAddr, token, "/f", "down-1", "down-2")
			side.stop(t)

			_, _ = runItxd(t, data, addr) // itxd back on its address
			appendTypes(t, addr, token, "/f", "restarted")
			tail.wait(t, tail.errs, "reconnected to "+addr)
			appendTypes(t, addr, token, "/f", "after-1", "after-2")
			tail.wait(t, tail.out, "after-2")
			tail.interrupt(t)

			var types []string
			for i, e := range tailedEvents(t, tail.out.String(), tc.asJSON) {
				require.Equal(t, int64(i+1), e.Offset, "offsets printed once each, in order: %q", tail.out.String())
				types = append(types, e.Type)
			}
			require.Equal(t, []string{"before-1", "before-2", "before-3", "down-1", "down-2", "restarted", "after-1", "after-2"}, types)
			require.Equal(t, 1, strings.Count(tail.errs.String(), "itxd went away"), "said once: %q", tail.errs.String())
		})
	}
}

// Ctrl-C while itx tail waits for itxd to come back still stops it, with exit status 130.
func TestMain_TailInterruptedWhileReconnectingExits130(t *testing.T) {
	data := t.TempDir()
	itxd, addr := runItxd(t, data, "127.0.0.1:0")
	creds, err := server.ReadCredentials(data)
	require.NoError(t, err)
	tail := startItxCommand(t, addr, creds.ProjectToken, "tail", "/f")
	tail.wait(t, tail.errs, "tailing /f")
	itxd.stop(t)
	tail.wait(t, tail.errs, "itxd went away (serverShuttingDown)")
	tail.interrupt(t)
}

// itx watch goes on across an itxd restart too: it says so on stderr and, resubscribed,
// prints a fresh snapshot, which shows what was appended while itxd was down. It ended with
// exit status 1.
func TestMain_WatchGoesOnAcrossAnItxdRestart(t *testing.T) {
	data := t.TempDir()
	itxd, addr := runItxdOnLoopback(t, data) // restarted on addr below
	creds, err := server.ReadCredentials(data)
	require.NoError(t, err)
	token := creds.ProjectToken
	appendTypes(t, addr, token, "/w", "first")

	watch := startItxCommand(t, addr, token, "watch", "/w")
	watch.wait(t, watch.out, `"head": 1`)
	itxd.stop(t)
	watch.wait(t, watch.errs, "itxd went away (serverShuttingDown)")

	side, sideAddr := runItxd(t, data, "127.0.0.1:0")
	appendTypes(t, sideAddr, token, "/w", "while-down")
	side.stop(t)
	_, _ = runItxd(t, data, addr)

	watch.waitUntil(t, watch.out, "a second snapshot showing head 2", func(out string) bool {
		parts := strings.Split(out, "snapshot at revision")
		return len(parts) == 3 && strings.Contains(parts[2], `"head": 2`)
	})
	watch.interrupt(t)
	require.Equal(t, 1, strings.Count(watch.errs.String(), "itxd went away"), "said once: %q", watch.errs.String())
}

// A close that is not itxd going away still ends .tail with its reason, as before: here the
// stream is removed with its project (streamRemoved).
func TestTail_EndsWhenTheStreamIsRemoved(t *testing.T) {
	srv := itxtest.Start(t, server.Config{})
	ctx := context.Background()
	info, token, _, err := srv.Srv.CreateProject(ctx, server.Admin{}, "tailed")
	require.NoError(t, err)
	ts := &testServer{addr: srv.Addr, token: token, dir: srv.Dir}
	s := newSession(t, ts)

	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	result := make(chan error, 1)
	go func() { result <- s.RunCommand(tctx, "tail /gone") }()
	require.True(t, s.errs.waitFor("tailing /gone"), "stderr %q", s.errs.String())
	ts.appendDirect(t, "/gone", itx.EventInput{Type: "seen"})
	require.True(t, s.out.waitFor(`"type":"seen"`), "stdout %q", s.out.String())

	require.NoError(t, srv.Srv.DeleteProject(ctx, server.Admin{}, info.ID, true))
	select {
	case err := <-result:
		require.Error(t, err, "the connection closed by the server ends .tail")
		require.Contains(t, err.Error(), "streamRemoved")
	case <-time.After(20 * time.Second):
		t.Fatal(".tail went on after its stream was removed")
	}
	require.NotContains(t, s.errs.String(), "itxd went away")
}

// blockedWriter is an output that blocks its writes until released: a terminal or pipe that
// does not keep up.
type blockedWriter struct {
	*syncBuffer
	writing chan struct{} // closed when the first write begins
	once    sync.Once
	release chan struct{}
}

func (w *blockedWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.writing) })
	<-w.release
	return w.syncBuffer.Write(p)
}

// When stdout falls so far behind that the connection's buffer (10,000 events) fills, .tail
// loses nothing: it prints what it holds and opens the connection again after the last offset
// printed. It dropped the oldest events and said "(N events dropped: output too slow)".
func TestTail_SlowOutputLosesNothing(t *testing.T) {
	ts := startServer(t)
	out := &blockedWriter{syncBuffer: newSyncBuffer(), writing: make(chan struct{}), release: make(chan struct{})}
	errs := newSyncBuffer()
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	rs, err := repl.Connect(cctx, repl.Config{Addr: ts.addr, Token: ts.token, Out: out, Err: errs, Format: repl.FormatJSON})
	require.NoError(t, err)
	t.Cleanup(func() { rs.Close() })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	result := make(chan error, 1)
	go func() { result <- rs.RunCommand(ctx, "tail /slow") }()
	require.True(t, errs.waitFor("tailing /slow"), "stderr %q", errs.String())
	ts.appendDirect(t, "/slow", itx.EventInput{Type: "first"})
	<-out.writing // the tail holds the first event and cannot print it

	const total = 11_001
	batch := make([]itx.EventInput, 1000)
	for i := range batch {
		batch[i] = itx.EventInput{Type: "more"}
	}
	for n := 1; n < total; n += len(batch) {
		ts.appendDirect(t, "/slow", batch...)
	}
	// Every event has reached the tail's sink (it accepts them while stdout is blocked): the
	// connection's delivered offset in the stream's live state is the head.
	observer := newSession(t, ts)
	waitFor(t, "the tail's connection delivered everything", func() bool {
		got := observer.mustEval(t, `(() => { const v = project.streams.get("/slow").liveState(); `+
			`const st = v.snapshot().state; v.cancel(); return Object.values(st.connections).map(c => c.delivered).join() })()`)
		return got == fmt.Sprint(total)
	})

	close(out.release)
	require.True(t, out.waitFor(fmt.Sprintf(`"offset":%d,`, total)), "the last event: stderr %q", errs.String())
	cancel()
	require.NoError(t, <-result)
	got := tailedEvents(t, out.String(), true)
	require.Equal(t, total, len(got), "events printed; stderr %q", errs.String())
	for i, e := range got {
		require.Equal(t, int64(i+1), e.Offset, "each offset once, in order")
	}
	require.NotContains(t, errs.String(), "dropped")
}

// A stream deleted and created again while itx tail could not reach itxd is another stream: its
// offsets start over at 1, so opening again "after the last offset printed" on it would skip its
// first events and print the rest as if they followed the old ones (with 5 new events), or fail
// naming an offset past its head (with 1). The tail ends instead, saying the stream it tailed
// was removed (streamRemoved, exit status 1), printing nothing of the new one.
func TestMain_TailEndsAtAStreamCreatedAgainWhileAway(t *testing.T) {
	for _, created := range []int{5, 1} {
		t.Run(fmt.Sprintf("%d new events", created), func(t *testing.T) {
			data := t.TempDir()
			itxd, addr := runItxdOnLoopback(t, data) // restarted on addr below
			creds, err := server.ReadCredentials(data)
			require.NoError(t, err)
			token := creds.ProjectToken
			appendTypes(t, addr, token, "/f", "old-1", "old-2", "old-3")

			tail := startItxCommand(t, addr, token, "tail", "/f", "--from", "0", "--json", "--reader", "tailer")
			tail.wait(t, tail.out, "old-3")
			itxd.stop(t)
			tail.wait(t, tail.errs, "itxd went away")

			// While the tail cannot reach itxd, the stream is deleted and created again.
			side, sideAddr := runItxd(t, data, "127.0.0.1:0")
			ctx := context.Background()
			c, err := client.Dial(ctx, sideAddr)
			require.NoError(t, err)
			_, err = client.DeleteStream(ctx, c.Login(ctx, token), "/f", true)
			require.NoError(t, err)
			c.Close()
			var types []string
			for i := range created {
				types = append(types, fmt.Sprintf("new-%d", i+1))
			}
			appendTypes(t, sideAddr, token, "/f", types...)
			side.stop(t)

			_, _ = runItxd(t, data, addr)
			deadline := time.NewTimer(30 * time.Second)
			defer deadline.Stop()
			for ended := false; !ended; {
				tail.out.mu.Lock()
				printed, changed := tail.out.buf.String(), tail.out.changed
				tail.out.mu.Unlock()
				if strings.Contains(printed, "new-") {
					t.Fatalf("itx tail went on on the new stream: stdout %q, stderr %q", printed, tail.errs.String())
				}
				select {
				case <-tail.exited:
					ended = true
				case <-changed:
				case <-deadline.C:
					t.Fatalf("itx tail did not end: stdout %q, stderr %q", printed, tail.errs.String())
				}
			}
			var exit *exec.ExitError
			require.True(t, errors.As(tail.exitErr, &exit), "want exit status 1, got %v", tail.exitErr)
			require.Equal(t, 1, exit.ExitCode(), "stderr %q", tail.errs.String())
			require.Contains(t, tail.errs.String(), "streamRemoved")
			var printed []string
			for _, e := range tailedEvents(t, tail.out.String(), true) {
				printed = append(printed, e.Type)
			}
			require.Equal(t, []string{"old-1", "old-2", "old-3"}, printed, "nothing of the new stream is printed")
			// Nor is its reader's checkpoint, an offset of the old stream, registered on the
			// new one (a tail resumed from it would skip the new stream's first events).
			ts := &testServer{addr: addr, token: token}
			readers, err := client.ListReaders(ctx, client.Readers(ctx, ts.streamDirect(t, ctx, "/f")))
			require.NoError(t, err)
			require.Empty(t, readers)
		})
	}
}

// A call in flight when the connection to itxd is lost fails with one line that says the
// connection was lost before the answer and that the call may have taken effect, not
// go-capnp's "rpc: connection closed". The connection runs through a proxy that cuts it once
// the call has passed through it to itxd.
func TestMain_CallInFlightWhenTheConnectionDropsSaysSo(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/w", itx.EventInput{Type: "first"})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	sent := make(chan struct{}) // closed once the waitForEvent call has gone through to itxd
	cut := make(chan struct{})
	go func() {
		client, err := ln.Accept()
		if err != nil {
			return
		}
		defer client.Close()
		target, err := net.Dial("tcp", ts.addr)
		if err != nil {
			return
		}
		defer target.Close()
		go io.Copy(client, target)
		go func() {
			buf := make([]byte, 64<<10)
			var once sync.Once
			for {
				n, err := client.Read(buf)
				if n > 0 {
					target.Write(buf[:n])
					if bytes.Contains(buf[:n], []byte("never-comes")) {
						once.Do(func() { close(sent) })
					}
				}
				if err != nil {
					return
				}
			}
		}()
		<-cut
	}()
	wait := startItxCommand(t, ln.Addr().String(), ts.token, "-e",
		`project.streams.get("/w").waitForEvent({types: ["never-comes"], after: 1, timeoutMs: 60000})`)
	select {
	case <-sent:
	case <-wait.exited:
		t.Fatalf("itx exited before its call reached itxd: %q", wait.errs.String())
	}
	close(cut) // the proxy closes both sides: the connection to itxd is lost
	<-wait.exited
	var exit *exec.ExitError
	require.True(t, errors.As(wait.exitErr, &exit), "want exit status 1, got %v", wait.exitErr)
	require.Equal(t, exitError, exit.ExitCode())
	errs := wait.errs.String()
	require.Equal(t, 1, strings.Count(errs, "\n"), "one line: %q", errs)
	require.True(t, strings.HasPrefix(errs, "disconnected: the connection to itxd was lost before the call was answered ("), errs)
	require.Contains(t, errs, "it may or may not have taken effect")
	require.NotContains(t, errs, "rpc:", errs)
}
