package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/cmd/itx/internal/repl"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/stretchr/testify/require"
)

// cli runs itx in-process, as a shell would, and returns its exit status and output.
type cli struct {
	t   *testing.T
	env map[string]string
}

func newCLI(t *testing.T) *cli {
	// A fresh HOME: no config file or history of the machine's user leaks in.
	return &cli{t: t, env: map[string]string{"HOME": t.TempDir()}}
}

func (c *cli) run(stdin string, args ...string) (code int, stdout, stderr string) {
	c.t.Helper()
	var out, errs bytes.Buffer
	code = run(args, environment{
		stdin: strings.NewReader(stdin), stdout: &out, stderr: &errs,
		getenv: func(k string) string { return c.env[k] },
	})
	return code, out.String(), errs.String()
}

func TestRun_Expression(t *testing.T) {
	ts := startServer(t)
	c := newCLI(t)
	conn := []string{"--addr", ts.addr, "--token", ts.token}

	code, out, errs := c.run("", append(conn, "--json", "-e", `project.streams.get("/e").append({type: "note", payload: {text: "hi"}})`)...)
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.Empty(t, errs)
	var res struct {
		Offsets    []int64 `json:"offsets"`
		HeadOffset int64   `json:"headOffset"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Equal(t, []int64{1}, res.Offsets)
	require.Equal(t, 1, strings.Count(out, "\n"), "--json prints one document per line: %q", out)

	t.Run("an error exits non-zero", func(t *testing.T) {
		code, out, errs := c.run("", append(conn, "--json", "-e", `project.streams.get("/e").append({type: ""})`)...)
		require.Equal(t, exitError, code)
		require.Empty(t, out)
		require.JSONEq(t, `{"error": {"code": "invalidArgument", "message": "event 0: type must not be empty"}}`, errs)

		code, _, errs = c.run("", append(conn, "--json", "-e", `project.streams.get("/a<b>").describe()`)...)
		require.Equal(t, exitError, code)
		require.Equal(t, `{"error":{"code":"invalidArgument","message":"stream path \"/a<b>\": character '<' is not allowed"}}`+"\n", errs,
			"< and > read as themselves, not \\u003c")

		code, _, errs = c.run("", append(conn, "-e", `project.streams.get("/e").append({type: ""})`)...)
		require.Equal(t, exitError, code)
		require.Equal(t, "invalidArgument: event 0: type must not be empty\n", errs, "no color off a terminal")

		code, _, errs = c.run("", append(conn, "-e", `project.streams.get("/e").describe(`)...)
		require.Equal(t, exitError, code)
		require.True(t, strings.HasPrefix(errs, "SyntaxError: "), errs)

		code, _, errs = c.run("", append(conn, "--json", "-e", `project.streams.get("/e").waitForEvent({types: ["never"], after: 1, timeoutMs: 10})`)...)
		require.Equal(t, exitError, code)
		require.Contains(t, errs, `{"error":{"code":"deadlineExceeded","message":"timed out after 10ms`)
	})

	t.Run("pretty output by default", func(t *testing.T) {
		code, out, _ := c.run("", append(conn, "-e", `project.streams.get("/e").describe()`)...)
		require.Equal(t, exitOK, code)
		require.Contains(t, out, "{\n  \"path\": \"/e\",\n")
		code, out, _ = c.run("", append(conn, "--output", "table", "-e", `project.streams.list()`)...)
		require.Equal(t, exitOK, code)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 3, out)
		require.True(t, strings.HasPrefix(lines[0], "path  streamId"), out)
		require.True(t, strings.HasPrefix(lines[1], "/e    "), out)
		require.Equal(t, "(1 row)", lines[2], "a row count under every table")
	})

	t.Run("usage errors exit 2", func(t *testing.T) {
		code, _, _ := c.run("", append(conn, "-e", "1", "extra")...)
		require.Equal(t, exitUsage, code)
		code, _, _ = c.run("", append(conn, "--output", "yaml", "-e", "1")...)
		require.Equal(t, exitUsage, code)
		code, _, errs := c.run("", "--addr", ts.addr, "--data", t.TempDir(), "-e", "1")
		require.Equal(t, exitUsage, code)
		require.Contains(t, errs, "no token")
	})

	t.Run("a bad token or address is an error", func(t *testing.T) {
		code, _, errs := c.run("", "--addr", ts.addr, "--token", "itx_wrong", "--json", "-e", "project.describe()")
		require.Equal(t, exitError, code)
		require.Contains(t, errs, `"code":"unauthenticated"`)
		ln := mustClosedPort(t)
		code, _, errs = c.run("", "--addr", ln, "--token", ts.token, "-e", "1")
		require.Equal(t, exitError, code)
		require.True(t, strings.HasPrefix(errs, "unavailable: "), errs)
	})
}

// mustClosedPort returns an address nothing listens on: a freshly drawn loopback address (see
// itxtest.ListenLoopback), which no socket of another test takes once it is let go, unlike a port of
// 127.0.0.1.
func mustClosedPort(t *testing.T) string {
	l := itxtest.ListenLoopback(t)
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestRun_Script(t *testing.T) {
	ts := startServer(t)
	c := newCLI(t)
	c.env["ITX_ADDR"], c.env["ITX_TOKEN"] = ts.addr, ts.token
	dir := t.TempDir()

	script := writeFile(t, dir, "seed.js", `
const s = project.streams.get(args[0])
for (let i = 1; i <= 3; i++) {
  s.append({type: "tick", payload: {i}})
}
const events = await s.getEvents({types: ["tick"]})
print(events.length, events.map(e => e.payload.i).join(","))
s.describe().headOffset
`)
	code, out, errs := c.run("", script, "/script")
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.Equal(t, "3 1,2,3\n", out, "a script prints what it prints, not its completion value")

	code, out, errs = c.run("", "--json", script, "/script")
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.Equal(t, "6\n\"1,2,3,1,2,3\"\n", out, "print() writes one JSON document per argument in --json mode")

	failing := writeFile(t, dir, "fail.js", `
print("before")
project.streams.get("/script").append({type: "x", payload: "{not json"})
print("after")
`)
	code, out, errs = c.run("", failing)
	require.Equal(t, exitError, code)
	require.Equal(t, "before\n", out)
	require.True(t, strings.HasPrefix(errs, "invalidArgument: "), errs)
	require.True(t, strings.HasSuffix(errs, " (at "+failing+":3:38)\n"), "a script's error says where it was thrown: %s", errs)

	code, _, errs = c.run("print(1)\n\nundefinedName.x\n", "--json", "-")
	require.Equal(t, exitError, code)
	require.Equal(t, `{"error":{"code":"ReferenceError","message":"undefinedName is not defined (at -:3:1)"}}`+"\n", errs)
	code, _, errs = c.run("(async () => {\n  await 1\n  project.streams.get(\"/script\").append({type: \"\"})\n})()\n", "-")
	require.Equal(t, exitError, code)
	require.Equal(t, "invalidArgument: event 0: type must not be empty (at -:3:40)\n", errs, "an async function's rejection too")

	code, out, _ = c.run(`print(project.streams.get("/script").describe().headOffset)`, "-")
	require.Equal(t, exitOK, code)
	require.Equal(t, "6\n", out, "- reads the script from stdin")
	code, out, _ = c.run(`print(project.streams.list().length)`)
	require.Equal(t, exitOK, code)
	require.Equal(t, "1\n", out, "stdin that is not a terminal is a script")

	code, _, _ = c.run("", filepath.Join(dir, "missing.js"))
	require.Equal(t, exitUsage, code)
}

func TestRun_Config(t *testing.T) {
	ts := startServer(t)
	expr := []string{"--json", "-e", "project.describe().name"}

	t.Run("token from the data directory", func(t *testing.T) {
		c := newCLI(t)
		code, out, errs := c.run("", append([]string{"--addr", ts.addr, "--data", ts.dir}, expr...)...)
		require.Equal(t, exitOK, code, errs)
		require.Equal(t, "\"default\"\n", out)
		c.env["ITX_DATA"] = ts.dir
		code, _, errs = c.run("", append([]string{"--addr", ts.addr}, expr...)...)
		require.Equal(t, exitOK, code, errs)
	})

	t.Run("environment", func(t *testing.T) {
		c := newCLI(t)
		c.env["ITX_ADDR"], c.env["ITX_TOKEN"] = ts.addr, ts.token
		code, _, errs := c.run("", expr...)
		require.Equal(t, exitOK, code, errs)
		c.env["ITX_TOKEN"] = "itx_wrong"
		code, _, errs = c.run("", append([]string{"--token", ts.token}, expr...)...)
		require.Equal(t, exitOK, code, "a flag beats the environment: %s", errs)
	})

	t.Run("config file", func(t *testing.T) {
		c := newCLI(t)
		c.env["XDG_CONFIG_HOME"] = t.TempDir()
		writeFile(t, c.env["XDG_CONFIG_HOME"], "itx/config.json", `{"addr": "`+ts.addr+`", "token": "`+ts.token+`"}`)
		code, _, errs := c.run("", expr...)
		require.Equal(t, exitOK, code, errs)

		c = newCLI(t)
		writeFile(t, c.env["HOME"], ".config/itx/config.json", `{"addr": "`+ts.addr+`", "token": "`+ts.token+`"}`)
		code, _, errs = c.run("", expr...)
		require.Equal(t, exitOK, code, errs)

		path := writeFile(t, t.TempDir(), "other.json", `{"addr": "`+ts.addr+`", "token": "itx_wrong"}`)
		code, _, errs = c.run("", append([]string{"--config", path}, expr...)...)
		require.Equal(t, exitError, code, "--config replaces the default file")
		require.Contains(t, errs, "unauthenticated")

		code, _, _ = c.run("", append([]string{"--config", filepath.Join(t.TempDir(), "none.json")}, expr...)...)
		require.Equal(t, exitUsage, code, "a config file named explicitly must exist")

		// A misspelt field is refused, not ignored (which read as "no token"); so is what
		// follows the object.
		path = writeFile(t, t.TempDir(), "typo.json", `{"addr": "`+ts.addr+`", "tokn": "`+ts.token+`"}`)
		code, _, errs = c.run("", append([]string{"--config", path}, expr...)...)
		require.Equal(t, exitUsage, code)
		require.Contains(t, errs, `itx: config `+path+`: unknown field \"tokn\" (it holds {\"addr\", \"token\"})`, "the JSON error document names the field")
		path = writeFile(t, t.TempDir(), "trailing.json", `{"addr": "`+ts.addr+`", "token": "`+ts.token+`"} x`)
		code, _, errs = c.run("", append([]string{"--config", path}, expr...)...)
		require.Equal(t, exitUsage, code)
		require.Contains(t, errs, "something follows its JSON object")
	})
}

// The exit status reaches the shell: itx as a separate process.
func TestMain_ExitStatus(t *testing.T) {
	ts := startServer(t)
	itx := func(args ...string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), "ITX_TEST_MAIN=1", "HOME="+t.TempDir(), "ITX_ADDR="+ts.addr, "ITX_TOKEN="+ts.token)
		return cmd
	}
	out, err := itx("--json", "-e", `project.streams.get("/x").append({type: "a"}).headOffset`).Output()
	require.NoError(t, err)
	require.Equal(t, "1\n", string(out))

	err = itx("--json", "-e", `project.streams.get("/x").append({type: ""})`).Run()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "want an exit error, got %v", err)
	require.Equal(t, exitError, exit.ExitCode())
}

// terminal drives itx through a pseudo-terminal, as a person at a keyboard would.
type terminal struct {
	t    *testing.T
	pty  *os.File
	out  *syncBuffer
	mark int // expect searches output after this index
}

func (term *terminal) send(keys string) {
	term.t.Helper()
	_, err := term.pty.Write([]byte(keys))
	require.NoError(term.t, err)
}

// expect waits until s appears in the output after the previous match.
func (term *terminal) expect(s string) {
	term.t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		term.out.mu.Lock()
		all, changed := term.out.buf.String(), term.out.changed
		term.out.mu.Unlock()
		if i := strings.Index(all[term.mark:], s); i >= 0 {
			term.mark += i + len(s)
			return
		}
		select {
		case <-changed:
		case <-deadline:
			term.t.Fatalf("timed out waiting for %q; output after the last match:\n%q", s, all[term.mark:])
		}
	}
}

func TestTerminal_Session(t *testing.T) {
	ts := startServer(t)
	home := t.TempDir()
	history := filepath.Join(home, "state", "history")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "ITX_TEST_MAIN=1", "HOME="+home, "ITX_ADDR="+ts.addr, "ITX_TOKEN="+ts.token,
		"ITX_HISTORY="+history, "XDG_CONFIG_HOME=", "NO_COLOR=", "TERM=xterm")
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 50, Cols: 200})
	require.NoError(t, err)
	defer ptmx.Close()
	term := &terminal{t: t, pty: ptmx, out: newSyncBuffer()}
	go io.Copy(term.out, ptmx)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
	}()

	term.expect(`connected to ` + ts.addr)

	// Each line is typed at a prompt, as a person does: the prompt is drawn once the terminal
	// is back in raw mode.
	term.expect("itx> ")
	term.send(`let a = project.streams.get("/pty")` + "\r")
	term.expect("itx> ")
	term.send(`a.append({type: "note", payload: {text: "from pty"}})` + "\r")
	term.expect(`"headOffset": 1`)
	term.expect("itx> ")
	term.send("a.getEvents()\r")
	term.expect(`note  {"text":"from pty"}`) // events print one to a line
	term.expect("(1 row)")

	// A typed error, in red, and the session goes on.
	term.expect("itx> ")
	term.send(`a.append({type: ""})` + "\r")
	term.expect("\x1b[31minvalidArgument: event 0: type must not be empty")
	term.expect("itx> ")
	term.send("a.describe().headOffset + 41\r")
	term.expect("42")

	// Tab completes a method name from the schema: without it this line is a syntax error.
	term.expect("itx> ")
	term.send("a.waitF\t")
	term.expect("orEvent(")
	term.send(`{types: ["note"]})` + "\r")
	term.expect(`"type": "note"`)

	// Multi-line input.
	term.expect("itx> ")
	term.send("a.getEvents({\r")
	term.expect("...  ")
	term.send("limit: 1, types: [\"note\"]})\r")
	term.expect("(1 row)")

	// A list of flat records prints as a table on a terminal.
	term.expect("itx> ")
	term.send("project.streams.list()\r")
	term.expect("subscriptionCount")
	term.expect("/pty")

	// Ctrl-C at the prompt drops the line and stays.
	term.expect("itx> ")
	term.send("abandoned")
	term.send("\x03")
	term.expect("^C")
	term.expect("itx> ")
	term.send(`"still " + "here"` + "\r")
	term.expect(`"still here"`)

	// Ctrl-C during a call cancels it (without it the barrier waits a minute).
	term.expect("itx> ")
	term.send(`print("wait" + "ing"); a.waitForEvent({types: ["never"], after: 1, timeoutMs: 60000})` + "\r")
	term.expect("waiting")
	term.send("\x03")
	term.expect("cancelled: ")
	term.expect("itx> ")
	term.send(`"ok" + "ay"` + "\r")
	term.expect(`"okay"`)

	// Ctrl-D leaves.
	term.expect("itx> ")
	term.send("\x04")
	select {
	case err := <-exited:
		require.NoError(t, err, "itx exits 0 on Ctrl-D")
	case <-time.After(20 * time.Second):
		t.Fatal("itx did not exit on Ctrl-D")
	}
	b, err := os.ReadFile(history)
	require.NoError(t, err)
	require.Contains(t, string(b), `a.append({type: "note", payload: {text: "from pty"}})`+"\n")
	require.Contains(t, string(b), `a.getEvents({ limit: 1, types: ["note"]})`+"\n", "a multi-line input is one history entry")
}

// Piped input interrupted during a .tail or .watch (which end without an error on Ctrl-C)
// exits 130, as an interrupted call does, and the rest of the input is not run.
func TestMain_PipedLiveViewInterruptedExits130(t *testing.T) {
	ts := startServer(t)
	for _, command := range []string{".tail /t", ".watch /t"} {
		t.Run(command, func(t *testing.T) {
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), "ITX_TEST_MAIN=1", "HOME="+t.TempDir(), "ITX_ADDR="+ts.addr, "ITX_TOKEN="+ts.token)
			cmd.Stdin = strings.NewReader(command + "\n" + `project.streams.get("/t").append({type: "after-interrupt"})` + "\n")
			stdout, stderr := newSyncBuffer(), newSyncBuffer()
			cmd.Stdout, cmd.Stderr = stdout, stderr
			require.NoError(t, cmd.Start())
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			// The live view is running once it has said so (.tail on stderr) or printed its first
			// snapshot (.watch).
			started := make(chan bool, 2)
			go func() { started <- stderr.waitFor("tailing /t") }()
			go func() { started <- stdout.waitFor("snapshot at revision") }()
			select {
			case ok := <-started:
				require.True(t, ok, "stdout %q, stderr %q", stdout.String(), stderr.String())
			case err := <-exited:
				t.Fatalf("itx exited before the live view ran: %v; stderr %q", err, stderr.String())
			}
			require.NoError(t, cmd.Process.Signal(os.Interrupt))
			err := <-exited
			var exit *exec.ExitError
			require.True(t, errors.As(err, &exit), "want exit status 130, got %v; stderr %q", err, stderr.String())
			require.Equal(t, exitInterrupted, exit.ExitCode(), "stderr %q", stderr.String())
			require.NotContains(t, stdout.String(), "headOffset", "the input after the interrupt did not run")
		})
	}
	s := newSession(t, ts)
	require.Nil(t, s.mustEval(t, `project.streams.get("/t").getEvents().find(e => e.type == "after-interrupt")`))
}

// itx --help has a line for every command that runs from the shell, naming every option the
// command's own usage names: itx watch's --processor, which its usage error and .help show, was
// missing from it, and so was itx du altogether.
func TestRun_HelpNamesEveryCommandsOptions(t *testing.T) {
	c := newCLI(t)
	_, help, helpErr := c.run("", "--help")
	require.Empty(t, helpErr, "asked for, the usage is the output (itx --help | less), not an error")
	var cli []string
	for _, cmd := range repl.Commands() {
		if cmd.CLI {
			cli = append(cli, cmd.Name)
		}
	}
	require.Subset(t, cli, []string{"tail", "watch", "export", "import", "consumers", "rm", "du"})
	for _, cmd := range cli {
		_, _, usage := c.run("", "--addr", mustClosedPort(t), "--token", "itx_unused", cmd, "--no-such-flag")
		_, line, ok := strings.Cut(help, "  itx [flags] "+cmd+" ")
		require.True(t, ok, "itx --help has no line for %s:\n%s", cmd, help)
		line, _, _ = strings.Cut(line, "\n")
		for _, f := range strings.Fields(usage) {
			if opt := strings.Trim(f, "[]|"); strings.HasPrefix(opt, "--") {
				require.Contains(t, line, opt, "itx --help's line for %s (its usage: %s)", cmd, usage)
			}
		}
	}
}

// A command run from the shell with arguments it does not take prints its shell usage and
// exits 2, before connecting (no itxd listens here); at the prompt the same mistake is an
// invalidArgument error that shows the prompt's syntax.
func TestRun_CommandUsageErrors(t *testing.T) {
	c := newCLI(t)
	conn := []string{"--addr", mustClosedPort(t), "--token", "itx_unused"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"tail"}, "usage: itx tail <path> [--from N | N] [--reader <name>]\n"},
		{[]string{"tail", "/t", "--from"}, "itx tail: --from needs an offset\nusage: itx tail <path> [--from N | N] [--reader <name>]\n"},
		{[]string{"tail", "/t", "--from", "x"}, "itx tail: after must be an offset, got \"x\"\nusage: itx tail <path> [--from N | N] [--reader <name>]\n"},
		{[]string{"tail", "/t", "1", "2"}, "itx tail: too many arguments\nusage: itx tail <path> [--from N | N] [--reader <name>]\n"},
		{[]string{"tail", "/t", "--reader"}, "itx tail: --reader needs a name\nusage: itx tail <path> [--from N | N] [--reader <name>]\n"},
		{[]string{"tail", "/t", "--reader= "}, "itx tail: --reader needs a name\nusage: itx tail <path> [--from N | N] [--reader <name>]\n"},
		{[]string{"tail", "--from", "3"}, "itx tail: the stream's path comes first, got \"--from\"\nusage: itx tail <path> [--from N | N] [--reader <name>]\n"},
		{[]string{"tail", "/t", "--bogus"}, "itx tail: unknown flag \"--bogus\"\nusage: itx tail <path> [--from N | N] [--reader <name>]\n"},
		{[]string{"tail", "/t", "--form", "3"}, "itx tail: unknown flag \"--form\"\nusage: itx tail <path> [--from N | N] [--reader <name>]\n"},
		{[]string{"tail", "/t", "--from", "--bogus"}, "itx tail: after must be an offset, got \"--bogus\"\nusage: itx tail <path> [--from N | N] [--reader <name>]\n"},
		{[]string{"watch"}, "usage: itx watch <path> [--processor <name>]\n"},
		{[]string{"watch", "/a", "/b"}, "itx watch: too many arguments\nusage: itx watch <path> [--processor <name>]\n"},
		{[]string{"export"}, "usage: itx export <path> [after] [--with-control]\n"},
		{[]string{"export", "/a", "-1"}, "itx export: after must be an offset, got \"-1\"\nusage: itx export <path> [after] [--with-control]\n"},
		{[]string{"export", "/a", "--with-contrl"}, "itx export: unknown flag \"--with-contrl\"\nusage: itx export <path> [after] [--with-control]\n"},
		{[]string{"import"}, "usage: itx import <path> [file.ndjson | -] [--with-control]\n"},
		{[]string{"import", "/a", "--with-contrl"}, "itx import: unknown flag \"--with-contrl\"\nusage: itx import <path> [file.ndjson | -] [--with-control]\n"},
		// A path itxd would refuse, found before connecting (an empty import into "a" once
		// reported "imported 0 events into a" and exited 0).
		{[]string{"tail", "a"}, "itx tail: stream path \"a\" must start with /\nusage: itx tail <path> [--from N | N] [--reader <name>]\n"},
		{[]string{"watch", "/a/"}, "itx watch: stream path \"/a/\" has an empty segment or a trailing slash\nusage: itx watch <path> [--processor <name>]\n"},
		{[]string{"export", "a"}, "itx export: stream path \"a\" must start with /\nusage: itx export <path> [after] [--with-control]\n"},
		{[]string{"import", "a", os.DevNull}, "itx import: stream path \"a\" must start with /\nusage: itx import <path> [file.ndjson | -] [--with-control]\n"},
		{[]string{"watch", "/a", "--processor"}, "itx watch: --processor needs the name of a processor-wake subscription\nusage: itx watch <path> [--processor <name>]\n"},
		{[]string{"watch", "/a", "--processor="}, "itx watch: --processor needs the name of a processor-wake subscription\nusage: itx watch <path> [--processor <name>]\n"},
	} {
		code, out, errs := c.run("", append(conn, tc.args...)...)
		require.Equal(t, exitUsage, code, "%v: %s", tc.args, errs)
		require.Empty(t, out, "%v", tc.args)
		require.Equal(t, tc.want, errs, "%v", tc.args)
	}

	ts := startServer(t)
	s := newSession(t, ts)
	for line, want := range map[string]string{
		"tail":               "usage: .tail <path> [--from N | N] [--reader <name>]",
		"tail /t --from":     "tail: --from needs an offset; usage: .tail <path> [--from N | N] [--reader <name>]",
		"export /t nope":     `export: after must be an offset, got "nope"; usage: .export <path> [after] [--with-control]`,
		"tail /t --bogus":    `tail: unknown flag "--bogus"; usage: .tail <path> [--from N | N] [--reader <name>]`,
		"watch":              "usage: .watch <path> [--processor <name>]",
		"import /t a.json b": "import: too many arguments; usage: .import <path> [file.ndjson | -] [--with-control]",
	} {
		err := s.RunCommand(context.Background(), line)
		require.Equal(t, repl.Failure{Code: "invalidArgument", Message: want}, repl.Describe(err), line)
	}
}

// A command word that is no command and names no file ("itx tial /a", "itx help") is reported
// as such, naming the commands, before connecting; a missing script file keeps the file
// system's error.
func TestRun_MistypedCommandIsNamed(t *testing.T) {
	c := newCLI(t)
	conn := []string{"--addr", mustClosedPort(t), "--token", "itx_unused"}
	for word, guess := range map[string]string{"tial": " (did you mean itx tail?)", "help": ""} {
		code, out, errs := c.run("", append(conn, word, "/a")...)
		require.Equal(t, exitUsage, code, errs)
		require.Empty(t, out)
		require.Equal(t, `itx: "`+word+`" is neither a command (admin, consumers, du, export, import, rm, tail, watch) nor a script file`+guess+`; itx --help shows the usage`+"\n", errs)
	}
	code, _, errs := c.run("", append(conn, "--json", "tial")...)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errs, `{"error":{"code":"invalidArgument","message":"itx: \"tial\" is neither a command`)
	code, _, errs = c.run("", append(conn, filepath.Join(t.TempDir(), "missing.js"))...)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errs, "no such file or directory")
}

// itx -e runs a dot-command (or help) as the same line piped or typed at the prompt does,
// instead of failing to parse it as JavaScript.
func TestRun_ExpressionRunsADotCommand(t *testing.T) {
	ts := startServer(t)
	c := newCLI(t)
	conn := []string{"--addr", ts.addr, "--token", ts.token}
	ts.appendDirect(t, "/d", itx.EventInput{Type: "x"})

	code, out, errs := c.run("", append(conn, "--json", "-e", ".du /d")...)
	require.Equal(t, exitOK, code, errs)
	var rows []struct {
		Path string `json:"path"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
	require.Len(t, rows, 1)
	require.Equal(t, "/d", rows[0].Path)

	code, out, errs = c.run("", append(conn, "-e", "help")...)
	require.Equal(t, exitOK, code, errs)
	require.Contains(t, out, "Commands:")

	code, _, errs = c.run("", append(conn, "-e", ".exit")...)
	require.Equal(t, exitOK, code, errs)
	require.Empty(t, errs)

	code, _, errs = c.run("", append(conn, "-e", ".tail")...)
	require.Equal(t, exitUsage, code)
	require.Equal(t, "usage: itx tail <path> [--from N | N] [--reader <name>]\n", errs)

	code, out, errs = c.run("", append(conn, "-e", "[1,\n2].length")...)
	require.Equal(t, exitOK, code, errs)
	require.Equal(t, "2\n", out, "JavaScript over several lines is evaluated as before")
}

// --data (or ITX_DATA) naming a directory without itxd's credentials says which file is
// missing, instead of listing every other place a token may come from.
func TestRun_DataDirWithoutCredentialsIsNamed(t *testing.T) {
	c := newCLI(t)
	dir := filepath.Join(t.TempDir(), "not-itxd")
	want := "itx: no token: " + filepath.Join(dir, "credentials.json") + " does not exist (is " + dir + " the data directory of an itxd that has started?); or pass --token\n"
	code, out, errs := c.run("", "--data", dir, "-e", "1")
	require.Equal(t, exitUsage, code)
	require.Empty(t, out)
	require.Equal(t, want, errs)
	c.env["ITX_DATA"] = dir
	code, _, errs = c.run("", "-e", "1")
	require.Equal(t, exitUsage, code)
	require.Equal(t, want, errs)
}

// A top-level let or const at the prompt can be declared again by a later input: one whose
// call failed (the connection refused, here for an offset past the head) leaves no name that
// can never be used or declared again, and a tour line run twice runs. A let inside a block
// keeps its scope.
func TestRun_PromptLetCanBeDeclaredAgain(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/a", itx.EventInput{Type: "note"})
	c := newCLI(t)
	conn := []string{"--addr", ts.addr, "--token", ts.token, "--json"}
	input := strings.Join([]string{
		`let c = project.streams.get("/a").openConnection(99)`, // refused: past the head
		`let c = project.streams.get("/a").openConnection(0)`,
		`c.take(1, 20000).events.length`,
		`const n = 1`,
		`const n = 2`,
		`n`,
		`{ let n = 3 }`,
		`n`,
	}, "\n") + "\n"
	code, out, errs := c.run(input, conn...)
	require.Equal(t, exitError, code, "the refused open fails the piped input: %s", errs)
	require.Equal(t, 1, strings.Count(errs, "\n"), "the refused open is the only error: %s", errs)
	require.Contains(t, errs, "invalidArgument", errs)
	require.Equal(t, "1\n2\n2\n", out, "stderr: %s", errs)
}
