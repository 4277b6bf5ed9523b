package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/cmd/itx/internal/repl"
	"github.com/stretchr/testify/require"
)

// itx import appends newline-delimited JSON events in order, from standard input or a file;
// run again with idempotency keys it appends nothing; a line that does not parse stops it and
// the message says how far it got, the batches before it committed.
func TestRun_Import(t *testing.T) {
	ts := startServer(t)
	c := newCLI(t)
	conn := []string{"--addr", ts.addr, "--token", ts.token}
	var lines []string
	for i := range 250 {
		lines = append(lines, fmt.Sprintf(`{"type": "order/placed", "payload": {"i": %d}, "idempotencyKey": "o-%d"}`, i, i))
	}
	input := strings.Join(lines[:100], "\n") + "\n\n" + strings.Join(lines[100:], "\n") + "\n" // a blank line is skipped

	code, _, errs := c.run(input, append(conn, "import", "/imported")...)
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.Contains(t, errs, "imported 250 events into /imported (250 new, 0 already there")
	code, out, errs := c.run("", append(conn, "--json", "-e", `project.streams.get("/imported").getEvents({after: 0, limit: 500}).map(e => e.payload.i)`)...)
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	var order []int
	require.NoError(t, json.Unmarshal([]byte(out), &order))
	require.Len(t, order, 250)
	for i, v := range order {
		require.Equal(t, i, v, "offset %d", i+1)
	}

	file := filepath.Join(t.TempDir(), "events.ndjson")
	require.NoError(t, os.WriteFile(file, []byte(input), 0o600))
	code, _, errs = c.run("", append(conn, "import", "/imported", file)...)
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.Contains(t, errs, "(0 new, 250 already there by idempotency key); head 250")

	broken := strings.Join(lines[:150], "\n") + "\n{not json\n" + strings.Join(lines[150:], "\n")
	code, _, errs = c.run(broken, append(conn, "import", "/broken")...)
	require.Equal(t, exitError, code)
	require.Contains(t, errs, "line 151 is not an event")
	require.Contains(t, errs, "100 events before it imported; lines 101-150 were read and not sent")
	code, out, _ = c.run("", append(conn, "--json", "-e", `project.streams.get("/broken").describe().headOffset`)...)
	require.Equal(t, exitOK, code)
	require.Equal(t, "100", strings.TrimSpace(out), "the first batch committed; nothing after the bad line")

	// export writes what import reads: a copy through the pair holds the same events in order.
	code, exported, errs := c.run("", append(conn, "export", "/imported")...)
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.Contains(t, errs, "exported 250 events of /imported through offset 250")
	require.Len(t, strings.Split(strings.TrimSpace(exported), "\n"), 250)
	code, _, errs = c.run(exported, append(conn, "import", "/copy")...)
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	code, out, errs = c.run("", append(conn, "--json", "-e", `project.streams.get("/copy").getEvents({after: 0, limit: 500}).map(e => e.idempotencyKey + ":" + e.payload.i)`)...)
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	var copied []string
	require.NoError(t, json.Unmarshal([]byte(out), &copied))
	require.Len(t, copied, 250)
	for i, v := range copied {
		require.Equal(t, fmt.Sprintf("o-%d:%d", i, i), v)
	}
	code, tail, _ := c.run("", append(conn, "export", "/imported", "200")...)
	require.Equal(t, exitOK, code)
	require.Len(t, strings.Split(strings.TrimSpace(tail), "\n"), 50, "after offset 200")

	code, _, errs = c.run(`{"type": "", "payload": {}}`, append(conn, "import", "/refused")...)
	require.Equal(t, exitError, code)
	require.Contains(t, errs, "invalidArgument: import: lines 1-1 refused")

	// A refused batch stops the import: the batches already in flight may commit, no more are
	// sent, and the message counts both.
	var many []string
	for i := range 5000 {
		typ := "order/placed"
		if i == 3 {
			typ = "" // refused: batch 1 (lines 1-100)
		}
		many = append(many, fmt.Sprintf(`{"type": %q, "payload": {"i": %d}}`, typ, i))
	}
	code, _, errs = c.run(strings.Join(many, "\n"), append(conn, "import", "/stopped")...)
	require.Equal(t, exitError, code)
	require.Contains(t, errs, "lines 1-100 refused")
	require.Contains(t, errs, "0 events imported before them")
	code, out, _ = c.run("", append(conn, "--json", "-e", `project.streams.get("/stopped").describe().headOffset`)...)
	require.Equal(t, exitOK, code)
	var head int
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &head))
	require.Less(t, head, 4900, "the import stopped sending after the refusal")
	require.Contains(t, errs, fmt.Sprintf("%d in the batches already sent after them", head))
}

// itx export leaves out the stream's own stream/* control records (saying how many) unless
// --with-control is given, and itx import skips them unless --with-control is given: a copy
// through the pair does not give the copy the source's subscriptions. With --with-control, a
// configure replayed unchanged is counted as ignored, not as a duplicate by idempotency key.
func TestRun_ExportImportLeaveControlRecordsBehind(t *testing.T) {
	ts := startServer(t)
	c := newCLI(t)
	conn := []string{"--addr", ts.addr, "--token", ts.token}
	ts.appendDirect(t, "/a", itx.EventInput{Type: "note"})
	code, _, errs := c.run("", append(conn, "-e", `project.streams.get("/a").subscriptions.configure({name: "m", receiver: {type: "copy-to-stream", path: "/m"}})`)...)
	require.Equal(t, exitOK, code, errs)
	subscriptions := func(path string) string {
		t.Helper()
		code, out, errs := c.run("", append(conn, "--json", "-e", `project.streams.get("`+path+`").subscriptions.list().map(s => s.name).join(",")`)...)
		require.Equal(t, exitOK, code, errs)
		return strings.TrimSpace(out)
	}
	controlLines := func(ndjson string) int {
		n := 0
		for _, line := range strings.Split(strings.TrimSpace(ndjson), "\n") {
			var e struct{ Type string }
			require.NoError(t, json.Unmarshal([]byte(line), &e))
			if itx.IsCoreType(e.Type) {
				n++
			}
		}
		return n
	}

	code, full, errs := c.run("", append(conn, "export", "/a", "--with-control")...)
	require.Equal(t, exitOK, code, errs)
	control := controlLines(full)
	require.Positive(t, control, "the configure is on /a's log: %s", full)
	require.NotContains(t, errs, "skipped")

	code, exported, errs := c.run("", append(conn, "export", "/a")...)
	require.Equal(t, exitOK, code, errs)
	require.Zero(t, controlLines(exported), exported)
	require.Contains(t, errs, fmt.Sprintf("skipped %d stream/* control record", control))
	require.Contains(t, errs, "(--with-control includes them)")

	for range 2 {
		code, _, errs = c.run(exported, append(conn, "import", "/b")...)
		require.Equal(t, exitOK, code, errs)
		require.Contains(t, errs, "imported 1 event into /b (1 new, 0 already there by idempotency key)")
	}
	require.Equal(t, `""`, subscriptions("/b"), "the copy has none of /a's subscriptions")

	// An export made with the control records is skipped over by a plain import too.
	code, _, errs = c.run(full, append(conn, "import", "/b")...)
	require.Equal(t, exitOK, code, errs)
	require.Contains(t, errs, fmt.Sprintf("skipped %d stream/* control record", control))
	require.Contains(t, errs, "(--with-control appends them)")
	require.Equal(t, `""`, subscriptions("/b"))

	// Asked for, they are replayed; the second run's unchanged configure is ignored by itxd, and
	// said so, not counted as a duplicate by a key it does not have.
	code, _, errs = c.run(full, append(conn, "import", "/c", "--with-control")...)
	require.Equal(t, exitOK, code, errs)
	require.Equal(t, `"m"`, subscriptions("/c"))
	code, _, errs = c.run(full, append(conn, "import", "/c", "-", "--with-control")...)
	require.Equal(t, exitOK, code, errs)
	require.Contains(t, errs, "0 already there by idempotency key, 1 ignored by itxd as unchanged)", errs)
}

// itx export prints each event as itx prints events everywhere else (.tail --json, getEvents):
// createdAt an ISO-8601 time in UTC, not epoch milliseconds; import still reads it back.
func TestRun_ExportTimesAreISO(t *testing.T) {
	ts := startServer(t)
	ts.appendDirect(t, "/times", itx.EventInput{Type: "a", Payload: json.RawMessage(`{"n": 12345678901234567890}`)})
	c := newCLI(t)
	conn := []string{"--addr", ts.addr, "--token", ts.token}
	code, exported, errs := c.run("", append(conn, "export", "/times")...)
	require.Equal(t, exitOK, code, errs)
	var e map[string]any
	require.NoError(t, json.Unmarshal([]byte(exported), &e), exported)
	require.Regexp(t, isoTime, e["createdAt"])
	require.Contains(t, exported, `{"n":12345678901234567890}`, "big integers stay exact")

	code, at, errs := c.run("", append(conn, "--json", "-e", `project.streams.get("/times").getEvents()[0].createdAt`)...)
	require.Equal(t, exitOK, code, errs)
	require.Contains(t, exported, `"createdAt":`+strings.TrimSpace(at), "the time getEvents shows")

	code, _, errs = c.run(exported, append(conn, "import", "/times-copy")...)
	require.Equal(t, exitOK, code, errs)
}

// itx <command> passes its arguments as the shell split them: a file name with a space is one
// argument (the command line was joined with spaces and split again, so "my events.ndjson" was
// two arguments, "too many arguments"), and a stream path with a space reaches itxd, which
// refuses it, instead of being read as a path and an offset (refused before connecting, as a
// usage error, since itx checks a command's path itself).
func TestRun_CommandArgumentsKeepTheirSpaces(t *testing.T) {
	ts := startServer(t)
	c := newCLI(t)
	conn := []string{"--addr", ts.addr, "--token", ts.token}
	file := writeFile(t, t.TempDir(), "my events.ndjson", `{"type": "a"}`+"\n")
	code, _, errs := c.run("", append(conn, "import", "/spaced", file)...)
	require.Equal(t, exitOK, code, errs)
	require.Contains(t, errs, "imported 1 event into /spaced")

	code, out, errs := c.run("", append(conn, "export", "/bad path")...)
	require.Equal(t, exitUsage, code, errs)
	require.Empty(t, out)
	require.Equal(t, "itx export: stream path \"/bad path\": character ' ' is not allowed\nusage: itx export <path> [after] [--with-control]\n", errs)
}

// At the prompt (and in piped input) a command's argument may be quoted, as in a shell: a file
// name with a space is one argument. It was split at the space ("too many arguments").
func TestSession_CommandArgumentsMayBeQuoted(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	dir := t.TempDir()
	file := writeFile(t, dir, "my events.ndjson", `{"type": "a"}`+"\n"+`{"type": "b"}`+"\n")
	require.NoError(t, s.RunCommand(t.Context(), `import /quoted "`+file+`"`))
	require.Contains(t, s.errs.String(), "imported 2 events into /quoted")
	require.NoError(t, s.RunCommand(t.Context(), `import /quoted2 '`+file+`'`))
	require.Contains(t, s.errs.String(), "imported 2 events into /quoted2")

	err := s.RunCommand(t.Context(), `import /quoted "`+file)
	require.Error(t, err)
	require.Contains(t, err.Error(), "unterminated quote")
	c := newCLI(t)
	c.env["ITX_ADDR"], c.env["ITX_TOKEN"] = ts.addr, ts.token
	code, _, errs := c.run(`.import /quoted3 "` + file + `"` + "\n")
	require.Equal(t, exitOK, code, errs)
}

// An export pages through the stream it described when it began. A stream deleted and created
// again under its path while the export runs (here while its output is blocked on the first
// page) is another stream: its pages after that offset went into the export as if they followed
// the old ones (new-501 after old-500). The export stops instead, saying the stream it read was
// deleted, with what it wrote before.
func TestRun_ExportEndsAtAStreamCreatedAgain(t *testing.T) {
	ts := startServer(t)
	appendMany := func(typ string, n int) {
		for i := 0; i < n; i += 500 {
			var batch []itx.EventInput
			for j := i; j < min(n, i+500); j++ {
				batch = append(batch, itx.EventInput{Type: fmt.Sprintf("%s-%d", typ, j+1)})
			}
			ts.appendDirect(t, "/exported", batch...)
		}
	}
	appendMany("old", 1200)
	out := &blockedWriter{syncBuffer: newSyncBuffer(), writing: make(chan struct{}), release: make(chan struct{})}
	errs := newSyncBuffer()
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	rs, err := repl.Connect(cctx, repl.Config{Addr: ts.addr, Token: ts.token, Out: out, Err: errs, Format: repl.FormatJSON})
	require.NoError(t, err)
	t.Cleanup(func() { rs.Close() })
	result := make(chan error, 1)
	go func() { result <- rs.RunCommand(context.Background(), "export /exported") }()
	<-out.writing // the first page is read and being written

	ctx := context.Background()
	c, err := client.Dial(ctx, ts.addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = client.DeleteStream(ctx, c.Login(ctx, ts.token), "/exported", true)
	require.NoError(t, err)
	appendMany("new", 1200)
	close(out.release)

	err = <-result
	require.Error(t, err, "stdout ends %q", tailOf(out.String()))
	require.Equal(t, itx.ENotFound, itx.ErrorCode(err), "%v", err)
	require.Contains(t, err.Error(), "was deleted")
	require.NotContains(t, out.String(), `"new-`, "nothing of the new stream is exported")
}

func tailOf(s string) string { return s[max(0, len(s)-300):] }

// A line longer than any event can be stops the import with tooLarge, naming the line and the
// bound, not bufio's "token too long" "after" the line before it.
func TestRun_ImportLineTooLong(t *testing.T) {
	ts := startServer(t)
	c := newCLI(t)
	conn := []string{"--addr", ts.addr, "--token", ts.token}
	input := `{"type": "small"}` + "\n" + `{"type": "huge", "payload": {"s": "` + strings.Repeat("x", 2<<20) + `"}}` + "\n"
	code, _, errs := c.run(input, append(conn, "import", "/long")...)
	require.Equal(t, exitError, code)
	require.Equal(t, "tooLarge: import: line 2 is longer than 1.1 MiB, more than an event can hold (1.0 MiB); 0 events before it imported; line 1 was read and not sent\n", errs)
}

// itx import reading a pipe whose producer pauses appends what it read when the producer pauses
// (it held up to 99 lines until 100 had come or the pipe closed), and Ctrl-C stops it while it
// waits for more on a pipe that stays open (it waited for the pipe to close), saying how far it
// got.
func TestMain_ImportFromAPipeThatPauses(t *testing.T) {
	ts := startServer(t)
	pr, pw, err := os.Pipe()
	require.NoError(t, err)
	t.Cleanup(func() { pr.Close(); pw.Close() })
	cmd := exec.Command(os.Args[0], "import", "/piped")
	cmd.Env = append(os.Environ(), "ITX_TEST_MAIN=1", "HOME="+t.TempDir(), "ITX_ADDR="+ts.addr, "ITX_TOKEN="+ts.token, "NO_COLOR=1")
	c := &itxCommand{cmd: cmd, out: newSyncBuffer(), errs: newSyncBuffer(), exited: make(chan struct{})}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pr, c.out, c.errs
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
	for i := range 150 { // a batch of 100, then 50 and a pause
		fmt.Fprintf(pw, `{"type": "line", "payload": {"i": %d}}`+"\n", i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = client.WaitForEvent(ctx, ts.streamDirect(t, ctx, "/piped"), itx.Predicate{Where: "payload.i = 149"}, 0, 20*time.Second)
	require.NoError(t, err, "the 50 lines after the first batch are appended in the pause")

	c.interrupt(t) // exit status 130, with the pipe still open
	errs := c.errs.String()
	require.True(t, strings.HasPrefix(errs, "cancelled: import: interrupted; "), errs)
	require.NotContains(t, errs, "read and not sent", errs)
	require.Equal(t, 1, strings.Count(errs, "\n"), errs)
}

// An .import at the prompt that stops early (a bad line) leaves no goroutine behind reading the
// rest of its file: a long session's failed imports once each kept one, blocked for good.
func TestSession_FailedImportsLeaveNoReader(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	var b strings.Builder
	b.WriteString(`{"type": "a"}` + "\n" + "not json\n")
	for b.Len() < 1<<20 { // more than the reader's chunks: it is mid-file when the import stops
		b.WriteString(`{"type": "b", "payload": {"pad": "` + strings.Repeat("x", 200) + `"}}` + "\n")
	}
	file := writeFile(t, t.TempDir(), "bad.ndjson", b.String())
	s.mustEval(t, `1`) // the session's own goroutines are up
	before := runtime.NumGoroutine()
	for range 20 {
		err := s.RunCommand(t.Context(), "import /bad "+file)
		require.ErrorContains(t, err, "line 2 is not an event")
	}
	require.Eventually(t, func() bool { return runtime.NumGoroutine() < before+10 }, 10*time.Second, 10*time.Millisecond,
		"goroutines: %d before 20 failed imports, %d after", before, runtime.NumGoroutine())
}

// import --with-control replays a cursor-set at the same event of the copy: its afterOffset is
// an offset of the exported stream, and the copy's offsets differ (the export leaves ephemeral
// events out, and a stream that held events before the import starts further on). It was
// replayed as it was, so a cursor-set past the copy's head failed the import whole ("afterOffset
// 6 is outside 0..5"), and one below it moved the cursor to other events. A generated name,
// subscription:<birth offset>, is the copy's birth offset of that subscription: replayed as
// it was, it named no subscription of the copy, and the import failed whole ("subscription
// \"subscription:10\" does not exist").
func TestRun_ImportWithControlMovesCursorSetsToTheSameEvents(t *testing.T) {
	ts := startServer(t)
	c := newCLI(t)
	conn := []string{"--addr", ts.addr, "--token", ts.token}
	// /a: 1 note, 2 and 3 ephemeral, 4 the configure, 5 a note, 6 ephemeral, 7 a cursor-set
	// after the configure, 8 one after the ephemeral 6 (after the note 5 in the copy), 9 one
	// to the start, 10 a nameless configure (subscription:10), 11 its cursor-set.
	ts.appendDirect(t, "/a", itx.EventInput{Type: "note"})
	ts.appendDirect(t, "/a", itx.EventInput{Type: "typing", Ephemeral: true}, itx.EventInput{Type: "typing", Ephemeral: true})
	code, _, errs := c.run("", append(conn, "-e", `let a = project.streams.get("/a")
a.subscriptions.configure({name: "m", receiver: {type: "copy-to-stream", path: "/m"}, start: "now"})
a.append({type: "note"})
a.append({type: "typing", ephemeral: true})
a.setSubscriptionCursor("m", 4)
a.setSubscriptionCursor("m", 6)
a.setSubscriptionCursor("m", 0)
a.subscriptions.configure({receiver: {type: "copy-to-stream", path: "/m"}, start: "now", idempotencyKey: "nameless-m"})
a.setSubscriptionCursor("subscription:10", 5)`)...)
	require.Equal(t, exitOK, code, errs)
	code, exported, errs := c.run("", append(conn, "export", "/a", "--with-control")...)
	require.Equal(t, exitOK, code, errs)

	// The copy holds two events already: /a's 1 is its 3, the configure its 4, the note its 5,
	// the nameless configure its 9 (subscription:9).
	ts.appendDirect(t, "/b", itx.EventInput{Type: "before"}, itx.EventInput{Type: "before"})
	code, _, errs = c.run(exported, append(conn, "import", "/b", "--with-control")...)
	require.Equal(t, exitOK, code, errs)
	code, out, errs := c.run("", append(conn, "--json", "-e", `JSON.stringify(project.streams.get("/b").getEvents({types: "stream/subscription-cursor-set"}).map(e => [e.offset, e.payload.name, e.payload.afterOffset]))`)...)
	require.Equal(t, exitOK, code, errs)
	var got string
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.Equal(t, `[[6,"m",4],[7,"m",5],[8,"m",2],[10,"subscription:9",5]]`, got, "each cursor-set after the same event of the copy, of the same subscription")
}
