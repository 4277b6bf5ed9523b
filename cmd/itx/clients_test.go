// The tests of issue 12 ("clients: any Cap'n Proto language works from the schema alone, and
// itx a person enjoys"), one or more per point; each fails on the code before it.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/creack/pty"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/capability"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/cmd/itx/internal/repl"
	"github.com/itx-dev/itx/internal/flowconn"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/server"
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
func TestRun_DataDirConnects(t *testing.T) {
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
func TestRun_BigIntegers(t *testing.T) {
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

	// An offset may be a BigInt too.
	code, out, errs = c.run("", append(conn, "--json", "-e", `project.streams.get("/big").getEvents({after: 1n}).length`)...)
	require.Equal(t, exitOK, code, errs)
	require.Equal(t, "1\n", out)
}

// serveAt serves an itxd on dir at addr ("127.0.0.1:0": any port; "": a freshly drawn loopback
// address, see itxtest.ListenLoopback) until the returned stop is called (or the test ends); a second
// call on the same dir and address is the same server restarted, as after a deploy, which needs
// the first to be on a drawn address: a port of 127.0.0.1 may be taken by another socket
// meanwhile.
func serveAt(t *testing.T, dir, addr string) (string, func()) {
	return serveAtLimits(t, dir, addr, flowconn.Limits{})
}

// serveAtLimits is serveAt with the RPC connections' bounds given (zero fields: the defaults).
func serveAtLimits(t *testing.T, dir, addr string, limits flowconn.Limits) (string, func()) {
	t.Helper()
	ctx := context.Background()
	srv, err := server.Open(ctx, server.Config{DataDir: dir})
	require.NoError(t, err)
	var ln net.Listener
	if addr == "" {
		ln = itxtest.ListenLoopback(t)
	} else {
		ln, err = net.Listen("tcp", addr)
		require.NoError(t, err)
	}
	l := capability.NewListenerWithLimits(srv, limits)
	go l.Serve(ln)
	var once sync.Once
	stop := func() {
		once.Do(func() {
			ln.Close()
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			srv.Close(sctx)
			l.CloseConnections(sctx)
		})
	}
	t.Cleanup(stop)
	return ln.Addr().String(), stop
}

// startTerminal runs itx on a pseudo-terminal of the given size with env added.
func startTerminal(t *testing.T, cols, rows uint16, env ...string) (*terminal, chan error) {
	return startTerminalArgs(t, cols, rows, nil, env...)
}

func startTerminalArgs(t *testing.T, cols, rows uint16, args []string, env ...string) (*terminal, chan error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), "ITX_TEST_MAIN=1", "HOME="+home, "XDG_CONFIG_HOME=", "NO_COLOR=1",
		"TERM=xterm", "ITX_HISTORY="+filepath.Join(home, "history"), "ITX_PAGER=cat", "PAGER=cat"), env...)
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: rows, Cols: cols})
	require.NoError(t, err)
	term := &terminal{t: t, pty: ptmx, out: newSyncBuffer()}
	go io.Copy(term.out, ptmx)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
		ptmx.Close()
	})
	term.expect("itx> ")
	return term, exited
}

// line types one line at the prompt and waits for want in what follows.
func (term *terminal) line(src string, want ...string) {
	term.t.Helper()
	term.send(src + "\r")
	for _, w := range want {
		term.expect(w)
	}
	term.expect("itx> ")
}

// Point 3: after itxd restarts, itx reconnects on its own (saying so), keeps variables and
// reaches capabilities again on their next use; .reconnect does it on demand.
func TestTerminal_Reconnect(t *testing.T) {
	dir := t.TempDir()
	addr, stop := serveAt(t, dir, "") // restarted on addr below
	creds, err := server.ReadCredentials(dir)
	require.NoError(t, err)
	term, _ := startTerminal(t, 200, 50, "ITX_ADDR="+addr, "ITX_TOKEN="+creds.ProjectToken)

	term.line(`let a = project.streams.get("/r"); let keep = 40`)
	term.line(`a.append({type: "note"}).headOffset`, "1")

	stop() // a deploy: itxd goes away...
	term.expect("lost the connection to " + addr)
	_, stop = serveAt(t, dir, addr) // ...and comes back on the same address
	term.expect("reconnected to " + addr)
	term.expect("itx> ")
	term.line(`a.append({type: "note"}).headOffset + keep`, "42")

	// A call made while the server is down waits for it (with backoff) instead of failing.
	stop()
	term.expect("lost the connection to " + addr)
	term.send(`a.describe().headOffset + keep` + "\r")
	_, _ = serveAt(t, dir, addr)
	term.expect("42")
	term.expect("itx> ")

	term.line(".reconnect", "reconnected to "+addr)
	term.line(`a.describe().headOffset + keep + 1`, "43")
}

// When itxd aborts the connection for a bound the session crossed, itx says which, then
// reconnects as after any loss.
func TestTerminal_SaysWhyItxdAbortedTheConnection(t *testing.T) {
	dir := t.TempDir()
	addr, _ := serveAtLimits(t, dir, "127.0.0.1:0", flowconn.Limits{Capabilities: 8})
	creds, err := server.ReadCredentials(dir)
	require.NoError(t, err)
	term, _ := startTerminal(t, 200, 50, "ITX_ADDR="+addr, "ITX_TOKEN="+creds.ProjectToken)

	term.send(`let held = []; for (let i = 0; i < 20; i++) { held.push(project.streams.get("/c" + i)); held[i].describe() }` + "\r")
	term.expect("lost the connection to " + addr + " (itxd aborted the connection: itx.limitExceeded: ")
	term.expect("--rpc-max-capabilities")
	term.expect("reconnected to " + addr)
	term.line(`project.streams.get("/after").append({type: "note"}).headOffset`, "1")
}

// Point 5: a cut page says so and how to go on; all: true walks every page;
// streams.list(prefix, after, limit) honours every argument.
func TestRun_Paging(t *testing.T) {
	ts := startServer(t)
	batch := make([]itx.EventInput, 300)
	for i := range batch {
		batch[i] = itx.EventInput{Type: "tick"}
	}
	ts.appendDirect(t, "/p", batch...)
	ts.appendDirect(t, "/p", batch...)
	c := newCLI(t)
	conn := []string{"--addr", ts.addr, "--token", ts.token, "--json"}

	code, out, errs := c.run("", append(conn, "-e", `project.streams.get("/p").getEvents().length`)...)
	require.Equal(t, exitOK, code, errs)
	require.Equal(t, "500\n", out)
	require.Equal(t, "(500 events shown, more follow: getEvents({after: 500}) for the next page, or getEvents({all: true}) for every one)\n", errs)
	code, out, errs = c.run("", append(conn, "-e", `project.streams.get("/p").getEvents({limit: 501}).length`)...)
	require.Equal(t, exitOK, code, errs)
	require.Equal(t, "500\n", out, "a page holds at most 500 events")
	require.Equal(t, "(500 events shown, more follow: getEvents({after: 500, limit: 500}) for the next page, or getEvents({all: true}) for every one)\n", errs,
		"the hint names the limit the page kept to")

	code, out, errs = c.run("", append(conn, "-e", `project.streams.get("/p").getEvents({all: true}).length`)...)
	require.Equal(t, exitOK, code, errs)
	require.Equal(t, "600\n", out)
	require.Empty(t, errs)

	code, out, errs = c.run("", append(conn, "-e", `project.streams.get("/p").getEvents(550).length`)...)
	require.Equal(t, exitOK, code, errs)
	require.Equal(t, "50\n", out, "the last page says nothing")
	require.Empty(t, errs)

	for _, p := range []string{"/l/a", "/l/b", "/l/c", "/m"} {
		ts.appendDirect(t, p, itx.EventInput{Type: "x"})
	}
	paths := func(src string) (string, string) {
		t.Helper()
		code, out, errs := c.run("", append(conn, "-e", src+`.map(s => s.path).join(" ")`)...)
		require.Equal(t, exitOK, code, errs)
		return strings.TrimSpace(out), errs
	}
	got, _ := paths(`project.streams.list("/l/", "/l/a")`)
	require.Equal(t, `"/l/b /l/c"`, got, "after is exclusive")
	got, errs = paths(`project.streams.list("/l/", "", 1)`)
	require.Equal(t, `"/l/a"`, got, "limit is one page")
	require.Contains(t, errs, `more follow: list("/l/", "/l/a", 1)`)
	got, _ = paths(`project.streams.list({prefix: "/l/", after: "/l/b"})`)
	require.Equal(t, `"/l/c"`, got)
}

// Point 6, argument styles: every method takes its values in order or one options object.
func TestEval_ArgumentStyles(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var st = project.streams.get("/args"); st.append([{type: "a"}, {type: "b"}])`)
	require.Equal(t, "mirror", obj(t, s.mustEval(t, `st.subscriptions.configure("mirror", {type: "copy-to-stream", path: "/copy"}, {start: "now"})`))["name"])
	require.Equal(t, 3.0, obj(t, s.mustEval(t, `st.subscriptions.get("mirror").waitUntilProcessed(3, 20000)`))["confirmedOffset"])
	require.Equal(t, 4.0, obj(t, s.mustEval(t, `st.setSubscriptionCursor("mirror", 0)`))["offset"], "as the README shows it")
	require.Equal(t, 5.0, obj(t, s.mustEval(t, `st.setSubscriptionCursor({name: "mirror", afterOffset: 0})`))["offset"])
	require.Equal(t, "failedPrecondition", s.failure(t, `st.resumeSubscription("mirror")`).Code)
	require.Equal(t, "failedPrecondition", s.failure(t, `st.resumeSubscription({name: "mirror"})`).Code)
	events := arr(t, s.mustEval(t, `st.getEvents(1, 1)`))
	require.Len(t, events, 1)
	require.Equal(t, 2.0, obj(t, events[0])["offset"])
	require.Equal(t, "b", obj(t, s.mustEval(t, `st.waitForEvent("b", 1, 1000)`))["type"])
	f := s.failure(t, `st.getEvents(1, {after: 2})`)
	require.Equal(t, repl.Failure{Code: "invalidArgument", Message: "getEvents: after is given twice, as an argument and as an option"}, f)

	require.NoError(t, s.RunCommand(context.Background(), "help Stream"))
	require.Contains(t, s.out.String(), "setSubscriptionCursor(name, afterOffset) or setSubscriptionCursor({name, afterOffset})")
	require.Contains(t, s.out.String(), "getEvents(after?, limit?) or getEvents({after, before, limit, types, includeEphemeral, subscription, all})")
}

var isoTime = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`)

// Point 6: output a person reads, at a terminal.
func TestTerminal_Output(t *testing.T) {
	ts := startServer(t)
	for _, p := range []string{"/out/a", "/out/b"} {
		ts.appendDirect(t, p, itx.EventInput{Type: "note", Payload: json.RawMessage(`{"text": "a payload long enough to need cutting on a narrow terminal, and then some more"}`)})
	}
	conn := []string{"ITX_ADDR=" + ts.addr, "ITX_TOKEN=" + ts.token}

	t.Run("tables fit the terminal, with a row count", func(t *testing.T) {
		term, _ := startTerminal(t, 70, 50, conn...)
		term.line(`project.streams.list("/out/")`, "(2 rows)")
		table := tableBefore(t, term, "(2 rows)")
		for _, line := range table {
			require.LessOrEqual(t, utf8.RuneCountInString(line), 70, "%q", line)
		}
		require.Contains(t, strings.Join(table, "\n"), "…", "cut columns end in an ellipsis")
		require.Contains(t, term.out.String(), "(2 rows) not shown: ", "the columns left out are named after the count")

		term.line(".output wide")
		term.line(`project.streams.list("/out/")`, "(2 rows)")
		table = tableBefore(t, term, "(2 rows)")
		require.Greater(t, utf8.RuneCountInString(table[1]), 70, ".output wide prints every column whole")
		require.NotContains(t, strings.Join(table, "\n"), "…")
	})

	t.Run("--wide", func(t *testing.T) {
		term, _ := startTerminalArgs(t, 70, 50, []string{"--wide"}, conn...)
		term.line(`project.streams.list("/out/")`, "(2 rows)")
		require.NotContains(t, strings.Join(tableBefore(t, term, "(2 rows)"), "\n"), "…")
	})

	t.Run("events print one to a line", func(t *testing.T) {
		term, _ := startTerminal(t, 200, 50, conn...)
		term.line(`project.streams.get("/out/a").getEvents()`, "(1 row)")
		table := tableBefore(t, term, "(1 row)")
		require.Equal(t, []string{"offset", "createdAt", "type", "payload"}, strings.Fields(table[0]))
		cells := strings.Fields(table[1])
		require.Equal(t, "1", cells[0])
		require.Regexp(t, isoTime, cells[1], "times are ISO-8601")
		require.Equal(t, "note", cells[2])
		require.True(t, strings.HasPrefix(cells[3], `{"text":"a`), "compact payload: %q", table[1])

		term.line(".time relative")
		term.line(`project.streams.get("/out/a").getEvents()`, "(1 row)")
		require.Contains(t, tableBefore(t, term, "(1 row)")[1], "s ago", "relative times on request")
	})

	t.Run("a pager for what is taller than the screen", func(t *testing.T) {
		term, _ := startTerminal(t, 200, 10, append(conn, "ITX_PAGER=sed s/^/paged:/")...)
		term.line(`Array.from({length: 30}, (_, i) => ({i}))`, "paged:(30 rows)")
		term.line(`[{i: 1}]`, "(1 row)")
		require.NotContains(t, term.out.String()[strings.LastIndex(term.out.String(), "[{i: 1}]"):], "paged:", "what fits is not paged")
	})

	t.Run("help, exit and quit are words", func(t *testing.T) {
		term, exited := startTerminal(t, 200, 50, conn...)
		term.line("help", "Commands:", ".reconnect")
		term.send("quit\r")
		require.NoError(t, <-exited)
		term, exited = startTerminal(t, 200, 50, conn...)
		term.send("exit\r")
		require.NoError(t, <-exited)
	})
}

// tableBefore returns the lines of the table the terminal printed just before its row count.
func tableBefore(t *testing.T, term *terminal, count string) []string {
	t.Helper()
	all := strings.ReplaceAll(term.out.String()[:term.mark], "\r\n", "\n")
	end := strings.LastIndex(all, count)
	require.GreaterOrEqual(t, end, 0)
	start := strings.LastIndex(all[:end], "\n"+"path ")
	if i := strings.LastIndex(all[:end], "\n"+"offset "); i > start {
		start = i
	}
	require.GreaterOrEqual(t, start, 0, "no table in %q", all)
	return strings.Split(strings.TrimRight(all[start+1:end], "\n"), "\n")
}

// Point 6: piped input prints each result, like a session without a prompt; times are ISO-8601
// in JSON too; errors show no Go symbols.
func TestRun_PipedAndErrors(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/pipe", itx.EventInput{Type: "x"})
	c := newCLI(t)
	c.env["ITX_ADDR"], c.env["ITX_TOKEN"] = ts.addr, ts.token

	code, out, errs := c.run("project.streams.list().length\nlet a = project.streams.get(\"/pipe\")\na.describe().headOffset +\n  1\nnope\n[1,\n 2]\n")
	require.Equal(t, exitError, code, "an input failed")
	require.Equal(t, "1\n2\n[1, 2]\n", out, "each result printed, a statement over two lines as one")
	require.Equal(t, "ReferenceError: nope is not defined\n", errs, "and the inputs after an error still run")

	code, out, errs = c.run("project.streams.list()\n")
	require.Equal(t, exitOK, code, errs)
	require.Contains(t, out, `"path": "/pipe"`, "echo 'project.streams.list()' | itx prints the list")

	code, out, errs = c.run("1\nexit\n2\n")
	require.Equal(t, exitOK, code, errs)
	require.Equal(t, "1\n", out)

	code, out, errs = c.run("", "--json", "-e", `project.streams.get("/pipe").getEvents()[0].createdAt`)
	require.Equal(t, exitOK, code, errs)
	var at string
	require.NoError(t, json.Unmarshal([]byte(out), &at))
	require.Regexp(t, isoTime, at)

	for _, src := range []string{
		`project.streams.get("/pipe").append({type: 1n})`,
		`project.streams.get("/pipe").getEvents({after: -1n})`,
		`project.streams.get("/pipe").append({type: "x", payload: Symbol("s")})`,
		`project.streams.get(Symbol("s"))`,
	} {
		code, _, errs := c.run("", "-e", src)
		require.Equal(t, exitError, code, src)
		require.True(t, strings.HasPrefix(errs, "invalidArgument: "), "%s: %s", src, errs)
		for _, sym := range []string{"*big.Int", "goja", "reflect", "runtime", "0xc0", "<nil>", "%!"} {
			require.NotContains(t, errs, sym, src)
		}
	}
}

// Point 2: every exception's reason carries "itx.<code>: ", wherever the library puts its own
// text; itx shows the code either way.
func TestEval_ErrorCodes(t *testing.T) {
	ts := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := ts.streamDirect(t, ctx, "/codes")
	sub := client.Subscription(ctx, s, "nobody")
	defer sub.Release()
	_, err := client.DescribeSubscription(ctx, sub)
	require.Error(t, err)
	require.Regexp(t, `itx\.notFound: subscription "nobody" does not exist`, err.Error())
	require.Equal(t, itx.ENotFound, itx.ErrorCode(err))

	sess := newSession(t, ts)
	f := sess.failure(t, `project.streams.get("/codes").subscriptions.get("nobody").describe()`)
	require.Equal(t, "notFound", f.Code)
	require.Contains(t, f.Message, `subscription "nobody" does not exist`)
}

// A token read from a data directory's credentials.json that itxd no longer knows (rotated:
// revoked after a new one was made) is refused with a hint naming the file, not "unknown token"
// alone; the deployment token's names itxd --new-deployment-token. A token given with --token
// gets no hint.
func TestRun_RevokedCredentialsTokenHint(t *testing.T) {
	data := t.TempDir()
	startItxd(t, data)
	path := filepath.Join(data, "credentials.json")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var creds map[string]any
	require.NoError(t, json.Unmarshal(b, &creds))
	creds["projectToken"] = "itx_" + strings.Repeat("0", 48)
	creds["deploymentToken"] = "itxd_" + strings.Repeat("0", 48)
	b, err = json.Marshal(creds)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b, 0o600))

	c := newCLI(t)
	code, _, errs := c.run("", "--data", data, "-e", "project.describe().name")
	require.Equal(t, exitError, code)
	require.Contains(t, errs, "unauthenticated: ")
	require.Contains(t, errs, "the token read from "+path+": revoked since? pass --token")
	code, _, errs = c.run("", "--data", data, "admin", "projects")
	require.Equal(t, exitError, code)
	require.Contains(t, errs, "the deployment token read from "+path)
	require.Contains(t, errs, "itxd --new-deployment-token")
	code, _, errs = c.run("", "--data", data, "--token", "itx_"+strings.Repeat("1", 48), "-e", "project.describe().name")
	require.Equal(t, exitError, code)
	require.Contains(t, errs, "unauthenticated: ")
	require.NotContains(t, errs, "revoked since?")
}
