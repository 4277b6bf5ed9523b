package main

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/creack/pty"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A scheduled append due at 0, the epoch (a time past: at once), shows that time, not null:
// null is what itx prints for "no time" (a subscription's nextAttemptAt when none is planned).
// The circuit breaker (one event a minute here, spent by the first append) holds it back, so
// it is still listed.
func TestRun_ScheduledAtTheEpochShowsItsTime(t *testing.T) {
	s := itxtest.Start(t, server.Config{BreakerBurst: 1, BreakerRefillPerMinute: 1})
	ts := &testServer{addr: s.Addr, token: s.Creds.ProjectToken, dir: s.Dir}
	ts.appendDirect(t, "/due", itx.EventInput{Type: "first", IdempotencyKey: "first"})
	c := newCLI(t)
	c.env["ITX_ADDR"], c.env["ITX_TOKEN"] = ts.addr, ts.token

	const epoch = "1970-01-01T00:00:00.000Z"
	code, out, errs := c.run("", "--json", "-e", `project.streams.get("/due").schedule({type: "r", idempotencyKey: "r-0"}, 0)`)
	require.Equal(t, exitOK, code, errs)
	require.JSONEq(t, `{"dueAt": "`+epoch+`"}`, out)

	code, out, errs = c.run(`project.streams.get("/due").listScheduled()`+"\n", "--json")
	require.Equal(t, exitOK, code, errs)
	var list []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &list), out)
	require.Len(t, list, 1, "held back by the breaker: %s", out)
	require.Equal(t, epoch, list[0]["dueAt"])

	code, out, errs = c.run("", "--json", "-e", `project.streams.get("/due").listScheduled()[0].dueAt`)
	require.Equal(t, exitOK, code, errs)
	require.Equal(t, `"`+epoch+`"`+"\n", out, "the value JavaScript sees too")

	// A key already in the log schedules nothing: no time, the key's offset.
	code, out, errs = c.run("", "--json", "-e", `project.streams.get("/due").schedule({type: "first", idempotencyKey: "first"}, 0)`)
	require.Equal(t, exitOK, code, errs)
	require.JSONEq(t, `{"dueAt": null, "appendedOffset": 1}`, out)
}

// A usage error in piped input (a command given arguments it does not take, or no command of
// that name) exits 2, as the same mistake does from the shell (itx tail without a path); the
// inputs after it still run, as after any error, and it outranks a failed evaluation (1).
func TestRun_PipedUsageErrorsExit2(t *testing.T) {
	ts := startServer(t)
	c := newCLI(t)
	c.env["ITX_ADDR"], c.env["ITX_TOKEN"] = ts.addr, ts.token
	for _, tc := range []struct{ input, errs string }{
		{".tail\n", "invalidArgument: usage: .tail <path> [--from N | N] [--reader <name>]\n"},
		{".tail /t --from x\n", "invalidArgument: tail: after must be an offset, got \"x\"; usage: .tail <path> [--from N | N] [--reader <name>]\n"},
		{".watch /a /b\n", "invalidArgument: watch: too many arguments; usage: .watch <path> [--processor <name>]\n"},
		{".export\n", "invalidArgument: usage: .export <path> [after] [--with-control]\n"},
		{".import /a --with-contrl\n", "invalidArgument: import: unknown flag \"--with-contrl\"; usage: .import <path> [file.ndjson | -] [--with-control]\n"},
		{".import /a\n", "invalidArgument: import: name a file to read (standard input is only read by `itx import <path>`); usage: .import <path> [file.ndjson | -] [--with-control]\n"},
		{".nope\n", "invalidArgument: unknown command .nope (try .help)\n"},
		// A chain continued on a line of its own: the line before already ran; say how to write it.
		{"let st = project.streams\n  .get(\"/a\")\n", `invalidArgument: unknown command .get("/a"): a line that starts with "." is a dot-command, so a chain cannot go on there; end the line before with the dot instead ("project.streams." and "get(...)" on the next line), or run the input as one script (itx - < file)` + "\n"},
		{"let n = 1\n  .toFixed(2)\n", "unknown command .toFixed(2): a line that starts with"},
		{"let m = [1]\n  .length\n", "unknown command .length (try .help)\n"}, // a bare word: not a call, the plain message
		{".time bogus\n", "invalidArgument: usage: .time [iso|relative]\n"},
		{".output yaml\n", "invalidArgument: output: unknown output format \"yaml\" (auto, pretty, json, table; wide or fit for a table's width); usage: .output [auto|pretty|json|table|wide|fit]\n"},
		{".help Nope\n", "invalidArgument: help: no interface \"Nope\""},
		// Words a command does not take were ignored: .reconnect reconnected, .exit left.
		{".reconnect now\n", "invalidArgument: reconnect: too many arguments; usage: .reconnect\n"},
		{".exit now\n", "invalidArgument: exit: too many arguments; usage: .exit\n"},
		{".quit now\n", "invalidArgument: quit: too many arguments; usage: .quit\n"},
		{".help Stream Streams\n", "invalidArgument: help: too many arguments; usage: .help [interface]\n"},
		{".time iso relative\n", "invalidArgument: time: too many arguments; usage: .time [iso|relative]\n"},
		{".output json wide\n", "invalidArgument: output: too many arguments; usage: .output [auto|pretty|json|table|wide|fit]\n"},
		{"nope\n.tail\n", "ReferenceError: nope is not defined\ninvalidArgument: usage: .tail <path> [--from N | N] [--reader <name>]\n"},
	} {
		code, out, errs := c.run(tc.input + "1 + 1\n")
		require.Equal(t, exitUsage, code, "%q: %s", tc.input, errs)
		require.Equal(t, "2\n", out, "%q: the inputs after a usage error still run", tc.input)
		require.Contains(t, errs, tc.errs, "%q", tc.input)
	}
	code, _, errs := c.run("nope\n1\n")
	require.Equal(t, exitError, code, "an evaluation error alone exits 1: %s", errs)
}

// itx tail and itx watch run until Ctrl-C, and then exit 130 like the rest of the CLI when
// interrupted (piped input stopped during a .tail, a call cancelled by Ctrl-C), whether the
// SIGINT is sent to the process or typed at the terminal it runs on. They exited 0. Each waits
// for its first line of output (the event after offset 0, the snapshot) before the interrupt.
func TestMain_LiveViewCommandInterruptedExits130(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/live", itx.EventInput{Type: "first-event"})
	for _, tc := range []struct {
		args  []string
		first string
	}{
		{[]string{"tail", "/live", "--from", "0"}, "first-event"},
		{[]string{"watch", "/live"}, "snapshot at revision"},
	} {
		for _, how := range []string{"signal", "terminal"} {
			t.Run(tc.args[0]+" "+how, func(t *testing.T) {
				cmd := exec.Command(os.Args[0], tc.args...)
				cmd.Env = append(os.Environ(), "ITX_TEST_MAIN=1", "HOME="+t.TempDir(), "ITX_ADDR="+ts.addr,
					"ITX_TOKEN="+ts.token, "NO_COLOR=1", "TERM=xterm")
				out := newSyncBuffer()
				var ptmx *os.File
				if how == "terminal" {
					var err error
					ptmx, err = pty.Start(cmd)
					require.NoError(t, err)
					defer ptmx.Close()
					go io.Copy(out, ptmx)
				} else {
					cmd.Stdout, cmd.Stderr = out, io.Discard
					require.NoError(t, cmd.Start())
				}
				exited := make(chan error, 1)
				go func() { exited <- cmd.Wait() }()
				defer func() {
					if cmd.ProcessState == nil {
						cmd.Process.Kill()
					}
				}()
				started := make(chan bool, 1)
				go func() { started <- out.waitFor(tc.first) }()
				select {
				case ok := <-started:
					require.True(t, ok, "no first line: %q", out.String())
				case err := <-exited:
					t.Fatalf("itx exited before its first line: %v; output %q", err, out.String())
				}
				if how == "terminal" {
					_, err := ptmx.Write([]byte{3}) // Ctrl-C: the terminal sends SIGINT
					require.NoError(t, err)
				} else {
					require.NoError(t, cmd.Process.Signal(os.Interrupt))
				}
				err := <-exited
				var exit *exec.ExitError
				require.True(t, errors.As(err, &exit), "want exit status 130, got %v; output %q", err, out.String())
				require.Equal(t, exitInterrupted, exit.ExitCode(), "output %q", out.String())
			})
		}
	}
}

// A script that recurses without end is stopped with a RangeError, as in node, and the session
// goes on; it grew goja's call stack until the machine ran out of memory.
func TestRun_UnboundedRecursionIsARangeError(t *testing.T) {
	ts := startServer(t)
	c := newCLI(t)
	c.env["ITX_ADDR"], c.env["ITX_TOKEN"] = ts.addr, ts.token
	code, out, errs := c.run("function f(n) { return f(n + 1) + 1 }\nf(0)\n1 + 1\n")
	require.Equal(t, exitError, code, errs)
	require.Equal(t, "RangeError: Maximum call stack size exceeded\n", errs)
	require.Equal(t, "2\n", out, "the session goes on")
	// Recursion a script means is not cut short.
	code, out, errs = c.run("", "-e", "function d(n) { return n == 0 ? 0 : 1 + d(n - 1) }; d(5000)")
	require.Equal(t, exitOK, code, errs)
	require.Equal(t, "5000\n", out)
}

// Under --json every result is a JSON document, also one JSON cannot encode: a function prints
// as its label and a value that refers to itself as what it reads as, both as JSON strings
// (they printed bare: [Function f], [object Object]).
func TestRun_JSONResultsAreAlwaysJSON(t *testing.T) {
	ts := startServer(t)
	c := newCLI(t)
	c.env["ITX_ADDR"], c.env["ITX_TOKEN"] = ts.addr, ts.token
	for src, want := range map[string]string{
		`(function f() {})`:                 `"[Function f]"`,
		`let o = {}; o.self = o; o`:         `"[object Object]"`,
		`print(function g() {}); undefined`: `"[Function g]"`,
		`[function() {}, 1]`:                `[null,1]`,
		`project.streams.get("/a")`:         `"[Stream /a]"`,
		`let p = {}; p.p = p; print(p); 1`:  "\"[object Object]\"\n1",
	} {
		code, out, errs := c.run("", "--json", "-e", src)
		require.Equal(t, exitOK, code, "%s: %s", src, errs)
		require.Equal(t, want+"\n", out, src)
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			require.True(t, json.Valid([]byte(line)), "%s: %q", src, line)
		}
	}
	code, out, _ := c.run("", "-e", `(function f() {})`)
	require.Equal(t, exitOK, code)
	require.Equal(t, "[Function f]\n", out, "as it was, off --json")
}

// A connection opened at the prompt answers key() (Connection.key in the schema): the key it
// was opened under, or the one itxd gave it; .help Stream lists it.
func TestEval_ConnectionKey(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/keyed", itx.EventInput{Type: "a"})
	s := newSession(t, ts)
	require.Equal(t, "mine", s.mustEval(t, `project.streams.get("/keyed").openConnection({key: "mine"}).key()`))
	generated := s.mustEval(t, `project.streams.get("/keyed").openConnection().key()`)
	require.NotEmpty(t, generated)
	require.NoError(t, s.RunCommand(t.Context(), "help Stream"))
	require.Contains(t, s.out.String(), "{take(min?, timeoutMs?), ping(), key(), close(reason)}")
}

// Under --json a usage error is an error like any other: {"error": {code, message}} on stderr,
// invalidArgument with a one-line message, and exit status 2 (it printed the shell's text).
func TestRun_JSONUsageErrors(t *testing.T) {
	c := newCLI(t)
	conn := []string{"--addr", mustClosedPort(t), "--token", "itx_unused", "--json"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"tail"}, "usage: itx tail <path> [--from N | N] [--reader <name>]"},
		{[]string{"tail", "/t", "1", "2"}, "itx tail: too many arguments; usage: itx tail <path> [--from N | N] [--reader <name>]"},
		{[]string{"-e", "1", "extra"}, "itx: -e takes no other arguments"},
		{[]string{"missing-script.js"}, "itx: open missing-script.js: no such file or directory"},
		// itx's own flags: the flag package printed these as text, with the usage, under --json.
		{[]string{"--bogus"}, "itx: flag provided but not defined: -bogus"},
		{[]string{"--output", "yaml"}, `itx: unknown output format "yaml" (auto, pretty, json, table)`},
		{[]string{"tail", "/t", "--output"}, "itx: flag needs an argument: -output"},
	} {
		code, out, errs := c.run("", append(conn, tc.args...)...)
		require.Equal(t, exitUsage, code, "%v: %s", tc.args, errs)
		require.Empty(t, out)
		var failure struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		require.NoError(t, json.Unmarshal([]byte(errs), &failure), "%v: stderr %q", tc.args, errs)
		require.Equal(t, "invalidArgument", failure.Error.Code, "%v", tc.args)
		require.Equal(t, tc.want, failure.Error.Message, "%v", tc.args)
	}
	code, _, errs := c.run("", "--addr", mustClosedPort(t), "--token", "itx_unused", "tail")
	require.Equal(t, exitUsage, code)
	require.Equal(t, "usage: itx tail <path> [--from N | N] [--reader <name>]\n", errs, "text without --json, as before")

	// --json after the flag the parse stopped at asks for JSON too.
	code, _, errs = c.run("", "--addr", mustClosedPort(t), "--bogus", "--json")
	require.Equal(t, exitUsage, code)
	require.JSONEq(t, `{"error": {"code": "invalidArgument", "message": "itx: flag provided but not defined: -bogus"}}`, errs)
	code, _, errs = c.run("", "--addr", mustClosedPort(t), "--bogus")
	require.Equal(t, exitUsage, code)
	require.True(t, strings.HasPrefix(errs, "flag provided but not defined: -bogus\nUsage:\n"), "text without --json, with the usage: %q", errs)
}

// Under --json every command's output is JSON a script can read: .help (with and without an
// interface), .output and .time printed text before.
func TestRun_SettingsCommandsPrintJSON(t *testing.T) {
	ts := startServer(t)
	c := newCLI(t)
	c.env["ITX_ADDR"], c.env["ITX_TOKEN"] = ts.addr, ts.token
	code, out, errs := c.run(".help\n.help Subscription\n.output\n.time\n", "--json")
	require.Equal(t, 0, code, errs)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4, out)
	var help struct {
		Commands   []struct{ Name, Args, Help string }
		Interfaces []string
	}
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &help), lines[0])
	require.Contains(t, help.Interfaces, "Subscription")
	var commands []string
	for _, c := range help.Commands {
		commands = append(commands, c.Name)
	}
	require.Contains(t, commands, ".help")
	require.Contains(t, commands, ".watch")
	var ifc struct {
		Interface string
		Methods   []struct{ Name, Usage string }
	}
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &ifc), lines[1])
	require.Equal(t, "Subscription", ifc.Interface)
	var names []string
	for _, m := range ifc.Methods {
		names = append(names, m.Name)
	}
	require.Contains(t, names, "confirm")
	require.JSONEq(t, `{"format": "json", "width": "fit"}`, lines[2])
	require.JSONEq(t, `{"times": "iso"}`, lines[3])
}
