package main

// Black-box probes of issues 4 and 12 (the itx REPL, clients from the schema alone), written
// from the issues, the README and the schema, driving the itx command against a real itxd.

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/exc"
	"github.com/creack/pty"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// bbTerminal starts itx in a pseudo-terminal of the given size against ts.
func bbTerminal(t *testing.T, ts *testServer, cols, rows uint16, env ...string) (*terminal, <-chan error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "ITX_TEST_MAIN=1", "HOME="+home, "ITX_ADDR="+ts.addr, "ITX_TOKEN="+ts.token,
		"XDG_CONFIG_HOME=", "NO_COLOR=1", "TERM=xterm", "ITX_PAGER=", "PAGER=")
	cmd.Env = append(cmd.Env, env...)
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: rows, Cols: cols})
	require.NoError(t, err)
	t.Cleanup(func() { ptmx.Close() })
	term := &terminal{t: t, pty: ptmx, out: newSyncBuffer()}
	go io.Copy(term.out, ptmx)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
	})
	term.expect("itx> ")
	return term, exited
}

// expectEither waits until a or b appears after the previous match, and returns which.
func (term *terminal) expectEither(a, b string) string {
	term.t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		term.out.mu.Lock()
		all, changed := term.out.buf.String(), term.out.changed
		term.out.mu.Unlock()
		ia, ib := strings.Index(all[term.mark:], a), strings.Index(all[term.mark:], b)
		if ia >= 0 && (ib < 0 || ia < ib) {
			term.mark += ia + len(a)
			return a
		}
		if ib >= 0 {
			term.mark += ib + len(b)
			return b
		}
		select {
		case <-changed:
		case <-deadline:
			term.t.Fatalf("timed out waiting for %q or %q; output after the last match:\n%q", a, b, all[term.mark:])
		}
	}
}

func (term *terminal) dump() string {
	term.out.mu.Lock()
	defer term.out.mu.Unlock()
	return term.out.buf.String()
}

// TestBlackbox_ReconnectIsNotALoss: .reconnect drops the connection on purpose; the terminal's
// watcher must not then report the old connection's end as a loss (and dial yet again). An
// itxd restart at the prompt is reported once, and the session goes on with its variables.
func TestBlackbox_ReconnectIsNotALoss(t *testing.T) {
	data := t.TempDir()
	p, addr := runItxdOnLoopback(t, data)
	creds, err := server.ReadCredentials(data)
	require.NoError(t, err)
	token := creds.ProjectToken
	term, exited := bbTerminal(t, &testServer{addr: addr, token: token}, 120, 40)
	term.send(`var v = 41; let a = project.streams.get("/rc")` + "\r")
	term.expect("itx> ")
	term.send(".reconnect\r")
	term.expect("itx: reconnected to " + addr)
	term.expect("itx> ")
	term.send(".reconnect\r")
	term.expect("itx: reconnected to " + addr)
	term.expect("itx> ")
	term.send(`a.append({type: "x"}).headOffset + v` + "\r")
	term.expect("42")
	term.expect("itx> ")

	// A real loss: itxd restarts on the same address while the session waits at the prompt.
	p.stop(t)
	term.expect("itx: lost the connection to " + addr)
	_, _ = runItxd(t, data, addr)
	term.expect("itx: reconnected to " + addr)
	term.send(`a.append({type: "x"}).headOffset + v` + "\r")
	term.expect("43")
	term.expect("itx> ")
	term.send("exit\r")
	select {
	case err := <-exited:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("itx did not exit on exit")
	}
	out := term.dump()
	require.Equal(t, 1, strings.Count(out, "lost the connection"), "only the restart is a loss:\n%s", out)
	require.Equal(t, 3, strings.Count(out, "itx: reconnected to"), "%s", out)
}

// TestBlackbox_UnknownMethodCarriesACode: a client built from a newer schema (or one that sends
// a method of another interface) calls a method this server does not know. Its exception, like
// every other the server raises (schema/itx.capnp, "Errors"), carries "itx.<code>: ".
func TestBlackbox_UnknownMethodCarriesACode(t *testing.T) {
	ts := startServer(t)
	ctx := t.Context()
	conn, err := client.Dial(ctx, ts.addr)
	require.NoError(t, err)
	defer conn.Close()
	project := conn.Login(ctx, ts.token)
	defer project.Release()
	for _, m := range []capnp.Method{
		{InterfaceID: schema.Project_TypeID, MethodID: 999, InterfaceName: "itx.capnp:Project", MethodName: "fromTheFuture"},
		{InterfaceID: schema.Stream_TypeID, MethodID: 0, InterfaceName: "itx.capnp:Stream", MethodName: "append"},
	} {
		ans, release := capnp.Client(project).SendCall(ctx, capnp.Send{Method: m, ArgsSize: capnp.ObjectSize{}})
		_, err := ans.Struct()
		release()
		require.Error(t, err)
		reason := err.Error()
		require.Regexp(t, `itx\.[A-Za-z]+: `, reason, "%s.%s", m.InterfaceName, m.MethodName)
		require.Equal(t, itx.EUnavailable, itx.ErrorCode(err), "%s", reason)
		require.Equal(t, exc.Unimplemented, exc.TypeOf(err), "%s", reason)
	}
}

// TestBlackbox_ScriptAwaitsInsideAsyncFunctions: a script pasted from the TypeScript surface
// awaits at the top level (a no-op: itx calls return their results) and inside its own async
// functions, where an await waits for a real promise. Only the top-level ones may go. (A
// top-level await of a real promise cannot wait: goja runs promise jobs only once the script
// returns; the prompt then prints a promise result settled.)
func TestBlackbox_ScriptAwaitsInsideAsyncFunctions(t *testing.T) {
	ts := startServer(t)
	c := newCLI(t)
	c.env["ITX_ADDR"], c.env["ITX_TOKEN"] = ts.addr, ts.token
	script := writeFile(t, t.TempDir(), "await.js", `
const s = project.streams.get("/await");
const r = await s.append({type: "a"});
async function both() {
  const [d, p] = await Promise.all([s.describe(), project.describe()]);
  return d.headOffset + " " + p.id;
}
const arrow = async () => (await Promise.resolve(r.headOffset)) + 1;
both().then(v => print(v), e => print("rejected: " + e));
arrow().then(v => print(v), e => print("rejected: " + e));
`)
	code, out, errs := c.run("", script)
	require.Equal(t, 0, code, "stderr: %s", errs)
	require.Equal(t, "2\n1 default\n", out) // arrow settles in fewer promise jobs, as in node

	// At the prompt (piped), `await (async () => ...)()` is the idiom for an async block.
	code, out, errs = c.run(`await (async () => { const v = await Promise.all([1, 2]); return v.length })()`+"\n", "--json")
	require.Equal(t, 0, code, "stderr: %s", errs)
	require.Equal(t, "2\n", out)
}

// TestBlackbox_HistoryIsTheUsersAlone: the history keeps what was typed, a webhook's signing
// secret among it; like a shell's, it is readable by its user only, an older world-readable
// one included.
func TestBlackbox_HistoryIsTheUsersAlone(t *testing.T) {
	ts := startServer(t)
	for _, existing := range []bool{false, true} {
		history := filepath.Join(t.TempDir(), "state", "history")
		if existing {
			require.NoError(t, os.MkdirAll(filepath.Dir(history), 0o700))
			require.NoError(t, os.WriteFile(history, []byte("1+1\n"), 0o644))
		}
		term, exited := bbTerminal(t, ts, 120, 40, "ITX_HISTORY="+history)
		term.send(`"whsec_" + "c2VjcmV0"` + "\r")
		term.expect(`"whsec_c2VjcmV0"`)
		term.expect("itx> ")
		term.send("\x04")
		select {
		case err := <-exited:
			require.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Fatal("itx did not exit on Ctrl-D")
		}
		b, err := os.ReadFile(history)
		require.NoError(t, err)
		require.Contains(t, string(b), `"whsec_" + "c2VjcmV0"`)
		fi, err := os.Stat(history)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "existing: %v", existing)
	}
}

// TestBlackbox_AnOffsetTooLargeSaysSo: the schema's offsets are UInt64, the prompt's integers
// reach 2^63-1; a larger whole number is refused for its size, not as if it were no integer.
func TestBlackbox_AnOffsetTooLargeSaysSo(t *testing.T) {
	ts := startServer(t)
	c := newCLI(t)
	c.env["ITX_ADDR"], c.env["ITX_TOKEN"] = ts.addr, ts.token
	for _, v := range []string{"18446744073709551615n", "2 ** 64", "1e20"} {
		code, _, errs := c.run("", "--json", "-e", `project.streams.get("/big").getEvents({after: `+v+`})`)
		require.Equal(t, exitError, code, v)
		require.Contains(t, errs, `"code":"invalidArgument"`, v)
		require.Contains(t, errs, "after: expected a non-negative integer up to 9223372036854775807, got ", v)
	}
	code, _, errs := c.run("", "--json", "-e", `project.streams.get("/big").getEvents({after: -1})`)
	require.Equal(t, exitError, code)
	require.Contains(t, errs, "after: expected a non-negative integer, got -1")
}

// TestBlackbox_ExitCalledAsAFunction: a person used to Python's prompt types exit() or quit()
// (or help()); like the bare words, they leave (or show the help), not a ReferenceError.
func TestBlackbox_ExitCalledAsAFunction(t *testing.T) {
	ts := startServer(t)
	c := newCLI(t)
	c.env["ITX_ADDR"], c.env["ITX_TOKEN"] = ts.addr, ts.token
	for _, word := range []string{"exit()", "quit();", "exit;"} {
		code, out, errs := c.run("1 + 1\n" + word + "\n40 + 2\n")
		require.Equal(t, exitOK, code, "%s: %s", word, errs)
		require.Equal(t, "2\n", out, word)
	}
	code, out, errs := c.run("help()\n")
	require.Equal(t, exitOK, code, errs)
	require.Contains(t, out, "Commands:")
}

// TestBlackbox_HelpTakesAnInterfaceWithoutTheDot: .help says help works without the dot;
// help Stream (and Python's help("Stream")) show the interface as .help Stream does, rather
// than a SyntaxError or a ReferenceError, while "help in x" stays JavaScript.
func TestBlackbox_HelpTakesAnInterfaceWithoutTheDot(t *testing.T) {
	ts := startServer(t)
	c := newCLI(t)
	c.env["ITX_ADDR"], c.env["ITX_TOKEN"] = ts.addr, ts.token
	_, want, errs := c.run(".help Readers\n")
	require.Contains(t, want, "Readers:\n  register(", errs)
	for _, line := range []string{"help Readers", "help readers;", `help("Readers")`, "help('Readers')"} {
		code, out, errs := c.run(line + "\n")
		require.Equal(t, exitOK, code, "%s: %s", line, errs)
		require.Equal(t, want, out, line)
	}
	code, _, errs := c.run("help in {}\n")
	require.Equal(t, exitError, code)
	require.Contains(t, errs, "ReferenceError: help is not defined")
	code, _, errs = c.run("help Nothing\n")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errs, `no interface "Nothing"`)
}

// TestBlackbox_CtrlCWhileReconnectingIsCancelled: with itxd gone, a call at the prompt waits
// for the reconnect; Ctrl-C cancels it, and says so (the call was never sent), rather than
// reporting the last failed dial as if itxd were the matter. The loss is announced once.
func TestBlackbox_CtrlCWhileReconnectingIsCancelled(t *testing.T) {
	data := t.TempDir()
	p, addr := runItxdOnLoopback(t, data)
	creds, err := server.ReadCredentials(data)
	require.NoError(t, err)
	term, _ := bbTerminal(t, &testServer{addr: addr, token: creds.ProjectToken}, 120, 40)
	term.send(`let a = project.streams.get("/cc"); a.append({type: "x"}).headOffset` + "\r")
	term.expect("1")
	term.expect("itx> ")
	p.stop(t)
	term.expect("itx: lost the connection to " + addr)
	want := "cancelled: cancelled while reconnecting to itxd at " + addr + " (the call was not sent)"
	for try := 0; ; try++ {
		term.send(`print("wait" + "ing"); a.describe()` + "\r")
		term.expect("waiting")
		term.send("\x03")
		// Ctrl-C may (rarely, on a starved machine) reach itx before the call after print
		// starts waiting: the script is interrupted there instead, and the line goes again.
		if term.expectEither(want, "cancelled: interrupted") == want {
			break
		}
		require.Less(t, try, 5, "Ctrl-C never reached the waiting call")
	}
	term.expect("itx> ")
	term.send(`"still" + " here"` + "\r")
	term.expect(`"still here"`)
	// The watcher said the connection was lost; the call that waited for the same reconnect
	// does not say it again.
	out := term.dump()
	require.Equal(t, 1, strings.Count(out, "lost the connection")+strings.Count(out, "was lost"), "%s", out)
}

// TestBlackbox_CtrlCWithCandidatesListedDropsTheLine: Ctrl-C at the prompt drops the line typed
// so far, also while Tab's candidates are listed under it (once, or twice to pick one). It only
// closed the list, the line kept, so what was typed next landed after it: a SyntaxError.
func TestBlackbox_CtrlCWithCandidatesListedDropsTheLine(t *testing.T) {
	ts := startServer(t)
	for _, tabs := range []string{"\t", "\t\t"} {
		term, _ := bbTerminal(t, ts, 120, 40)
		term.send(`project.streams.get("/a").readers.`)
		term.expect(`readers.`)
		for range tabs {
			term.send("\t")
			term.expect("register(")
		}
		term.send("\x03")
		term.expect("^C")
		term.expect("itx> ")
		term.send(`"after" + " ctrl-c"` + "\r")
		term.expect(`"after ctrl-c"`)
		require.NotContains(t, term.dump(), "SyntaxError", "tabs %q", tabs)
	}
}
