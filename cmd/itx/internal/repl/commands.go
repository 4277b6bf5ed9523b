package repl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"capnproto.org/go/capnp/v3"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
)

// Command is one command of the client: `.name args` at the prompt and, when CLI is set,
// `itx name args` from a shell. A live view (tail a connection, watch a live state) is one
// more entry here: it runs until its context is cancelled (Ctrl-C) and prints as it goes.
type Command struct {
	Name string
	Args string // argument synopsis for help
	Help string
	CLI  bool // also runnable as `itx <name> ...`
	Run  func(ctx context.Context, s *Session, args []string) error
	// Check, when set, reads the arguments without running anything: itx checks them before
	// it connects, so a usage error is one whether or not itxd is up. Run checks them too.
	Check func(args []string) error
}

// UsageError is a command given arguments it does not take. At the prompt it reads as
// invalidArgument: "usage: .tail <path> [--from N | N] [--reader <name>]"; itx <command> prints CLIUsage and exits
// 2.
type UsageError struct {
	Command string
	Problem string // what was wrong, or empty
	err     *itx.Error
}

func usageError(name, format string, args ...any) *UsageError {
	e := &UsageError{Command: name, Problem: fmt.Sprintf(format, args...)}
	msg := strings.TrimSpace("usage: ." + name + " " + commands[name].Args)
	if e.Problem != "" {
		msg = name + ": " + e.Problem + "; " + msg
	}
	e.err = &itx.Error{Code: itx.EInvalid, Message: msg}
	return e
}

func (e *UsageError) Error() string { return e.err.Error() }
func (e *UsageError) Unwrap() error { return e.err }

// chainLine matches a command line (its leading dot taken off) that reads as the rest of a
// method chain, `get("/a")` or `streams.list()`, rather than `.name args`.
var chainLine = regexp.MustCompile(`^\s*([A-Za-z_$][\w$]*)\s*[(.\[]`)

// unknownCommand is a command line naming no command: a usage error too.
func unknownCommand(name string) *UsageError {
	var names []string
	for _, c := range Commands() {
		names = append(names, c.Name)
	}
	if guess := nearest(name, names); guess != "" {
		return &UsageError{Command: name, err: itx.Errorf(itx.EInvalid, "unknown command .%s (did you mean .%s? .help lists the commands)", name, guess)}
	}
	return &UsageError{Command: name, err: itx.Errorf(itx.EInvalid, "unknown command .%s (try .help)", name)}
}

// CLIUsage is how the error reads from a shell: the problem, then "usage: itx tail <path> ...".
// A command itx does not run from the shell (.output, .time, .help...), reached there through
// itx -e, is named as a dot-command: "itx output" is no command.
func (e *UsageError) CLIUsage() string {
	c, ok := commands[e.Command]
	if !ok {
		return "itx: " + e.err.Message
	}
	name := "itx " + e.Command
	usage := strings.TrimSpace("usage: " + name + " " + c.Args)
	if !c.CLI {
		name = "itx -e ." + e.Command
		usage = "usage: itx -e '" + strings.TrimSpace("."+e.Command+" "+c.Args) + "'"
	}
	if e.Problem == "" {
		return usage
	}
	return name + ": " + e.Problem + "\n" + usage
}

// ErrExit is returned by .exit.
var ErrExit = errors.New("exit")

var commands = map[string]*Command{}

func register(c *Command) { commands[c.Name] = c }

// LookupCommand returns the command called name, if any.
func LookupCommand(name string) (*Command, bool) {
	c, ok := commands[name]
	return c, ok
}

// Commands lists the commands by name.
func Commands() []*Command {
	out := make([]*Command, 0, len(commands))
	for _, c := range commands {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func init() {
	register(&Command{Name: "help", Args: "[interface]", Help: "show commands, or the methods of an interface (.help Stream)", Run: runHelp})
	register(&Command{Name: "exit", Help: "leave (Ctrl-D does too)", Run: leave("exit")})
	register(&Command{Name: "reconnect", Help: "drop the connection and dial itxd again (variables are kept)", Run: runReconnect})
	register(&Command{Name: "output", Args: "[auto|pretty|json|table|wide|fit]", Help: "show or set how results print; wide: tables at full width, fit: cut to the terminal", Run: runOutput})
	register(&Command{Name: "time", Args: "[iso|relative]", Help: "show times in tables as ISO-8601 (the default) or relative to now", Run: runTime})
	register(&Command{Name: "quit", Help: "leave (as .exit)", Run: leave("quit")})
	register(&Command{Name: "tail", Args: "<path> [--from N | N] [--reader <name>]", CLI: true,
		Help: "open a connection and print events as they are appended, until Ctrl-C (default: after the head); goes on after the last one printed when itxd restarts; --reader registers a reader of that name whose checkpoint follows the last event printed (each second and at the end; itx consumers shows it) and, without --from, starts after its checkpoint", Run: runTail,
		Check: func(args []string) error { _, err := parseTail(args); return err }})
	register(&Command{Name: "import", Args: "<path> [file.ndjson | -] [--with-control]", CLI: true,
		Help: "append events from newline-delimited JSON ({type, payload, idempotencyKey, metadata} a line), pipelined in batches; - or no file: standard input (itx import only); stream/* control records are skipped unless --with-control (the platform's own halts, woken and revival records, and the resumes of those halts, always: itxd refuses them from a client)", Run: runImport,
		Check: func(args []string) error { _, err := parseImport(args); return err }})
	register(&Command{Name: "export", Args: "<path> [after] [--with-control]", CLI: true,
		Help: "print a stream's events after an offset (default 0) up to its head, one JSON event a line: what import reads; stream/* control records are left out unless --with-control", Run: runExport,
		Check: func(args []string) error { _, err := parseExport(args); return err }})
	register(&Command{Name: "watch", Args: "<path> [--processor <name>]", CLI: true,
		Help: "print a stream's live state (snapshot, then patches) until Ctrl-C, or with --processor the live state of the processor its processor-wake subscription <name> runs; a fresh snapshot when itxd restarts", Run: runWatch,
		Check: func(args []string) error { _, err := parseWatch(args); return err }})
}

// RunCommand runs the command line `name args...` (without the leading dot), its words split
// at spaces as a shell splits them: 'single' or "double" quotes keep a word's spaces.
func (s *Session) RunCommand(ctx context.Context, line string) error {
	if m := chainLine.FindStringSubmatch(line); m != nil && commands[m[1]] == nil {
		return &UsageError{Command: m[1], err: itx.Errorf(itx.EInvalid,
			"unknown command .%s: a line that starts with \".\" is a dot-command, so a chain cannot go on there; "+
				"end the line before with the dot instead (\"project.streams.\" and \"get(...)\" on the next line), or run the input as one script (itx - < file)",
			strings.TrimSpace(line))}
	}
	fields, err := splitWords(line)
	if err != nil {
		return err
	}
	if len(fields) == 0 {
		return nil
	}
	return s.RunCommandArgs(ctx, fields[0], fields[1:])
}

// splitWords splits a command line into words at unquoted spaces. Quotes group (and are
// dropped): within '...' every character is itself; within "...", \" and \\ stand for " and \.
// The line is read byte by byte (every byte it treats specially is ASCII, never part of a
// longer UTF-8 sequence), so a word keeps its bytes as typed, invalid UTF-8 included, for the
// server to refuse rather than a U+FFFD standing in for it.
func splitWords(line string) ([]string, error) {
	var (
		words []string
		word  strings.Builder
		in    bool // a word has begun (it may be empty: "")
		quote byte
	)
	for i := 0; i < len(line); i++ {
		r := line[i]
		switch {
		case quote == '\'':
			if r == '\'' {
				quote = 0
			} else {
				word.WriteByte(r)
			}
		case quote == '"':
			switch {
			case r == '"':
				quote = 0
			case r == '\\' && i+1 < len(line) && (line[i+1] == '"' || line[i+1] == '\\'):
				i++
				word.WriteByte(line[i])
			default:
				word.WriteByte(r)
			}
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == ' ' || r == '\t':
			if in {
				words = append(words, word.String())
				word.Reset()
				in = false
			}
		default:
			word.WriteByte(r)
			in = true
		}
	}
	if quote != 0 {
		return nil, &UsageError{err: itx.Errorf(itx.EInvalid, "unterminated quote (%c) in %q", quote, line)}
	}
	if in {
		words = append(words, word.String())
	}
	return words, nil
}

// RunCommandArgs runs the command name with args as they are (itx <command> from a shell,
// whose arguments may hold spaces).
func (s *Session) RunCommandArgs(ctx context.Context, name string, args []string) error {
	c, ok := commands[name]
	if !ok {
		return unknownCommand(name)
	}
	s.vmMu.Lock()
	defer s.vmMu.Unlock()
	if c.Name != "reconnect" && c.Name != "exit" {
		if err := s.ensureConnected(ctx); err != nil {
			return err
		}
	}
	return c.Run(ctx, s, args)
}

// atMost refuses a command more than n arguments: a word it does not take is a mistake to
// report (exit status 2 for piped input), not one to ignore while it reconnects or leaves.
func atMost(name string, args []string, n int) error {
	if len(args) > n {
		return usageError(name, "too many arguments")
	}
	return nil
}

// leave is .exit and .quit.
func leave(name string) func(context.Context, *Session, []string) error {
	return func(_ context.Context, _ *Session, args []string) error {
		if err := atMost(name, args, 0); err != nil {
			return err
		}
		return ErrExit
	}
}

func runReconnect(ctx context.Context, s *Session, args []string) error {
	if err := atMost("reconnect", args, 0); err != nil {
		return err
	}
	return s.reconnect(ctx)
}

const helpIntro = `Expressions are JavaScript; ` + "`project`" + ` is the project you logged into. For example:
  project.streams.get("/a").append({type: "note", payload: {text: "hi"}})
  project.streams.get("/a").getEvents({after: 0})
  let a = project.streams.get("/a"); a.describe()
  project.streams.list()
  project.streams.get("/a").subscriptions.get("agent").describe()
  agent("/a").processor.snapshot()   (agent(path): .processor and .subscription of its "agent" subscription, .liveState() its processor's)
Navigation (.streams, .get(path), .subscriptions, ...) is pipelined; the last call waits.
Calls return their results directly (await is accepted and does nothing). Tab completes.
Every method takes its values in order or one options object (.help Stream shows both).
help, exit and quit work without the dot too (help Stream as well), and as help(), exit(), quit().
`

func runHelp(ctx context.Context, s *Session, args []string) error {
	if err := atMost("help", args, 1); err != nil {
		return err
	}
	w := s.cfg.Out
	if len(args) > 0 {
		ifc := s.lookupInterface(args[0])
		if ifc == nil {
			return usageError("help", "no interface %q (%s)", args[0], strings.Join(boundInterfaces(), ", "))
		}
		type methodJS struct {
			Name  string `json:"name"`
			Usage string `json:"usage"`
		}
		methods := []methodJS{}
		if object, ok := promptObjects[ifc.Name]; ok {
			for _, m := range object {
				methods = append(methods, methodJS{m.name, m.usage})
			}
		} else {
			for _, m := range ifc.Methods {
				methods = append(methods, methodJS{m.Name, usage(ifc.Name, m)})
			}
			for _, m := range promptMethods[ifc.Name] {
				methods = append(methods, methodJS{m.name, m.binding.usage})
			}
		}
		if s.cfg.Format == FormatJSON {
			return s.printJSONLine(struct {
				Interface string     `json:"interface"`
				Methods   []methodJS `json:"methods"`
			}{ifc.Name, methods})
		}
		fmt.Fprintf(w, "%s:\n", ifc.Name)
		for _, m := range methods {
			fmt.Fprintf(w, "  %s\n", m.Usage)
		}
		return nil
	}
	if s.cfg.Format == FormatJSON {
		type commandJS struct {
			Name string `json:"name"`
			Args string `json:"args,omitempty"`
			Help string `json:"help"`
		}
		out := struct {
			Commands   []commandJS `json:"commands"`
			Interfaces []string    `json:"interfaces"`
		}{Interfaces: boundInterfaces()}
		for _, c := range Commands() {
			out.Commands = append(out.Commands, commandJS{"." + c.Name, c.Args, c.Help})
		}
		return s.printJSONLine(out)
	}
	fmt.Fprint(w, helpIntro)
	fmt.Fprintln(w, "\nCommands:")
	for _, c := range Commands() {
		fmt.Fprintf(w, "  .%-33s %s\n", strings.TrimSpace(c.Name+" "+c.Args), c.Help)
	}
	fmt.Fprintf(w, "\nInterfaces (.help <name>): %s\n", strings.Join(boundInterfaces(), ", "))
	return nil
}

// promptObjects are the objects the prompt makes of a capability it returns, which .help shows
// in place of the schema interface they wrap: a connection is read with take(), which the
// schema's Connection does not have (itxd pushes its events to the prompt's sink).
var promptObjects = map[string][]struct{ name, usage string }{
	"Connection": {
		{"take", "take(min?, timeoutMs?) or take({min, timeoutMs}) -> {events, dropped?, closed?} (the events delivered since the last take, at once; with min or timeoutMs it first waits until min events (default 1) have arrived or itxd closed the connection, at most timeoutMs (default 20000; deadlineExceeded, the events stay held); dropped: how many did not fit; closed: why itxd closed it)"},
		{"ping", "ping() -> {headOffset, deliveredOffset}"},
		{"key", "key() -> the connection's key"},
		{"close", "close(reason?)"},
	},
	// project.capabilities.mount(name)'s answer: the schema's Receiver is what itxd calls
	// (receive(batch)), which nobody calls from the prompt.
	"Receiver": {
		{"take", "take(min?, timeoutMs?) or take({min, timeoutMs}) -> {batches, dropped?, closed?} (the batches itx-call subscriptions delivered since the last take, at once; with min or timeoutMs it first waits until min batches (default 1) have arrived or the mount ended, at most timeoutMs (default 20000; deadlineExceeded, the batches stay held))"},
		{"unmount", "unmount() (ends the mount; the subscriptions delivering to it park until a mount under the name)"},
	},
}

// lookupInterface finds an interface by name, whatever its case (.help stream).
func (s *Session) lookupInterface(name string) *Interface {
	if ifc, ok := s.ifcs[name]; ok {
		return ifc
	}
	for n, ifc := range s.ifcs {
		if strings.EqualFold(n, name) {
			return ifc
		}
	}
	return nil
}

// usage is how a method is called from JavaScript.
func usage(iface string, m Method) string {
	if b, ok := bindings[iface][m.Name]; ok {
		return b.usage
	}
	if m.Property {
		return "." + m.Name + " -> " + m.Returns
	}
	call := m.Name + "(" + strings.Join(m.Params, ", ") + ")"
	if m.Returns == "" {
		return call // its result is data, which the schema names and this does not
	}
	return call + " -> " + m.Returns
}

// boundInterfaces lists the interfaces reachable from `project`.
func boundInterfaces() []string {
	out := make([]string, 0, len(bindings)+len(promptObjects))
	for name := range bindings {
		out = append(out, name)
	}
	for name := range promptObjects {
		if _, ok := bindings[name]; !ok {
			out = append(out, name) // Connection and Receiver: what the prompt makes of them
		}
	}
	sort.Strings(out)
	return out
}

func runOutput(ctx context.Context, s *Session, args []string) error {
	if err := atMost("output", args, 1); err != nil {
		return err
	}
	if len(args) == 0 {
		width := "fit"
		if s.cfg.Wide {
			width = "wide"
		}
		if s.cfg.Format == FormatJSON {
			return s.printJSONLine(map[string]string{"format": fmt.Sprint(s.cfg.Format), "width": width})
		}
		fmt.Fprintln(s.cfg.Out, s.cfg.Format, width)
		return nil
	}
	switch args[0] {
	case "wide", "fit":
		s.cfg.Wide = args[0] == "wide"
		return nil
	}
	f, err := ParseFormat(args[0])
	if err != nil {
		// ParseFormat names the formats; wide and fit (a table's width) are .output's too.
		return usageError("output", "unknown output format %q (auto, pretty, json, table; wide or fit for a table's width)", args[0])
	}
	s.cfg.Format = f
	return nil
}

func runTime(ctx context.Context, s *Session, args []string) error {
	if err := atMost("time", args, 1); err != nil {
		return err
	}
	if len(args) == 0 {
		times := "iso"
		if s.relativeTimes {
			times = "relative"
		}
		if s.cfg.Format == FormatJSON {
			return s.printJSONLine(map[string]string{"times": times})
		}
		fmt.Fprintln(s.cfg.Out, times)
		return nil
	}
	switch args[0] {
	case "iso", "relative":
		s.relativeTimes = args[0] == "relative"
		return nil
	}
	return usageError("time", "")
}

// streamArg reads the <path> argument of a command: the first, which is not a flag.
func streamArg(name string, args []string) (capPath, error) {
	if len(args) == 0 {
		return capPath{}, usageError(name, "")
	}
	if strings.HasPrefix(args[0], "-") {
		return capPath{}, usageError(name, "the stream's path comes first, got %q", args[0])
	}
	// A path itxd would refuse is a usage error, found before connecting (as .rm's and .du's).
	if err := itx.ValidatePath(args[0]); err != nil {
		return capPath{}, usageError(name, "%s", itx.ErrorMessage(err))
	}
	return streamPath(args[0]), nil
}

func streamPath(path string) capPath {
	return capPath{iface: "Stream", steps: []step{{method: "streams"}, {method: "get", arg: path}}}
}

// offsetArg reads an offset argument.
func offsetArg(name, arg string) (int64, error) {
	n, err := strconv.ParseInt(arg, 10, 64)
	if err != nil || n < 0 {
		return 0, usageError(name, "after must be an offset, got %q", arg)
	}
	return n, nil
}

// tailArgs are .tail's arguments: <path> [--from N | N] [--reader NAME].
type tailArgs struct {
	path     string
	after    int64
	fromHead bool   // no offset given: after the head (or the reader's checkpoint)
	reader   string // --reader: the registered reader whose checkpoint follows the tail
}

func parseTail(args []string) (tailArgs, error) {
	if _, err := streamArg("tail", args); err != nil {
		return tailArgs{}, err
	}
	t := tailArgs{path: args[0], fromHead: true}
	var rest []string
	for i := 1; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--reader" && i+1 < len(args):
			t.reader = args[i+1]
			i++
		case a == "--reader":
			return t, usageError("tail", "--reader needs a name")
		case strings.HasPrefix(a, "--reader="):
			t.reader = strings.TrimPrefix(a, "--reader=")
		case strings.HasPrefix(a, "--") && a != "--from" && !strings.HasPrefix(a, "--from=") && args[i-1] != "--from":
			// Not an offset: a misspelt flag says so rather than "after must be an offset".
			return t, usageError("tail", "unknown flag %q", a)
		default:
			rest = append(rest, a)
			continue
		}
		if strings.TrimSpace(t.reader) == "" {
			return t, usageError("tail", "--reader needs a name")
		}
	}
	switch {
	case len(rest) == 0:
		return t, nil
	case rest[0] == "--from" && len(rest) == 1:
		return t, usageError("tail", "--from needs an offset")
	case rest[0] == "--from":
		rest = rest[1:] // .tail /path --from N: events after N
	case strings.HasPrefix(rest[0], "--from="):
		rest = append([]string{strings.TrimPrefix(rest[0], "--from=")}, rest[1:]...)
	}
	if len(rest) > 1 {
		return t, usageError("tail", "too many arguments")
	}
	after, err := offsetArg("tail", rest[0])
	if err != nil {
		return t, err
	}
	t.after, t.fromHead = after, false
	return t, nil
}

// watchArgs is what .watch watches: a stream's live state, or its processor's.
type watchArgs struct {
	stream    capPath
	processor string // the processor-wake subscription's name; "": the stream
}

// target is the capability whose live state .watch opens.
func (w watchArgs) target() capPath {
	if w.processor == "" {
		return w.stream
	}
	return w.stream.child("Subscriptions", "subscriptions", "").child("Subscription", "get", w.processor).child("Processor", "processor", "")
}

func parseWatch(args []string) (watchArgs, error) {
	p, err := streamArg("watch", args)
	if err != nil {
		return watchArgs{}, err
	}
	w := watchArgs{stream: p}
	for rest := args[1:]; len(rest) > 0; rest = rest[1:] {
		switch {
		case rest[0] == "--processor" && len(rest) > 1 && rest[1] != "":
			w.processor, rest = rest[1], rest[1:]
		case strings.HasPrefix(rest[0], "--processor=") && rest[0] != "--processor=":
			w.processor = strings.TrimPrefix(rest[0], "--processor=")
		case rest[0] == "--processor" || rest[0] == "--processor=":
			return watchArgs{}, usageError("watch", "--processor needs the name of a processor-wake subscription")
		case !strings.HasPrefix(rest[0], "-"):
			return watchArgs{}, usageError("watch", "too many arguments")
		default:
			return watchArgs{}, usageError("watch", "unexpected %q", rest[0])
		}
	}
	return w, nil
}

func runTail(ctx context.Context, s *Session, args []string) error {
	ta, err := parseTail(args)
	if err != nil {
		return err
	}
	after := ta.after
	// Without --from the tail prints ephemeral events too: from the head it starts after, or,
	// resuming a reader, from its checkpoint (which holds them back from the sweep for it).
	ephemeral := ta.fromHead
	var rep *tailReader
	if ta.reader != "" {
		rep = &tailReader{s: s, path: ta.path, name: strings.TrimSpace(ta.reader), reported: -1}
		if ta.fromHead {
			checkpoint, found, err := rep.checkpoint(ctx)
			if err != nil {
				return err
			}
			if found {
				// Resume: what was printed after the last checkpoint reported is printed again.
				after, ta.fromHead = checkpoint, false
				fmt.Fprintf(s.cfg.Err, "reader %s resumes after offset %d\n", rep.name, checkpoint)
			}
		}
	}
	// The stream tailed: its offsets are positions in its life only, so a connection opened
	// again after the last offset printed must find the same stream at the path.
	streamID := ""
	// quiet: with --from, the head when the tail started. The ephemeral events at or below it
	// were appended before, and the tail does not print them (its first connection does not
	// ask for them), on a connection opened again either: that one asks for the ephemeral
	// events after the last offset printed, those the lost one delivered live, and without
	// this it printed the older ones too when it opened again still catching up.
	var quiet int64
	if ta.fromHead || !ephemeral {
		c := s.client(streamPath(ta.path))
		info, err := client.Describe(ctx, schema.Stream(c))
		c.Release()
		if err != nil {
			return err
		}
		if ta.fromHead {
			after, streamID = info.HeadOffset, info.StreamID
		} else {
			quiet = info.HeadOffset
		}
	}
	// Without --from the tail starts after the head it just read: the ephemeral events after
	// that head were appended since it started, and the stream may hold some by the time the
	// connection opens, which a connection delivers only when asked for (includeEphemeral).
	conn, err := s.openTail(ctx, ta.path, after, ephemeral, streamID, quiet)
	if err != nil {
		return err
	}
	if rep != nil {
		// Registered (or moved) before anything prints: a name a subscription holds is refused
		// here, and itx consumers shows the tail from now on. The refusal is the tail's error,
		// said once: not also as a checkpoint that did not move.
		rep.failed = true
		err := rep.report(ctx, after)
		rep.failed = false
		if err != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			conn.close(cctx, "itx tail could not register its reader")
			s.forget(conn)
			return err
		}
	}
	// A notice on stderr: stdout carries only events, one per line.
	fmt.Fprintf(s.cfg.Err, "tailing %s after offset %d; Ctrl-C stops\n", ta.path, after)
	for {
		var went string
		after, went, err = s.printTail(ctx, conn, after, rep)
		if err != nil || went == "" {
			return err
		}
		if went != tailOverflowed {
			fmt.Fprintf(s.cfg.Err, "itx: %s; reconnecting to go on after offset %d\n", wentAwayNotice(went), after)
		}
		// The connection opens again after the last offset printed: what came meanwhile is
		// read back from the log, and nothing printed is printed again.
		conn.sink.mu.Lock()
		streamID = conn.sink.streamID
		conn.sink.mu.Unlock()
		err = s.reopen(ctx, went, func() (err error) {
			conn, err = s.openTail(ctx, ta.path, after, true, streamID, quiet)
			if err != nil && itx.ErrorCode(err) != itx.EInvalid || streamID == "" {
				return err
			}
			// The stream the connection opened on, before the reader's checkpoint (an offset
			// of the stream tailed) is reported again: a batch tells it too, but none may come
			// for a while. Refused past the head, the stream tailed may be gone, and the one at
			// the path (if any) another, shorter one: say so rather than name the offset.
			c := s.client(streamPath(ta.path))
			info, derr := client.Describe(ctx, schema.Stream(c))
			c.Release()
			if derr == nil && info.StreamID != streamID && (err != nil || info.StreamID != "") {
				if err == nil {
					cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					conn.close(cctx, "itx tail: another stream at the path")
					s.forget(conn)
				}
				return streamReplaced(streamID, info.StreamID)
			}
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil // Ctrl-C while reconnecting
			}
			return err
		}
	}
}

// tailReportEvery is how often itx tail --reader moves its reader's checkpoint (when it moved).
const tailReportEvery = time.Second

// tailReader is itx tail --reader's registered reader on the stream at path.
type tailReader struct {
	s          *Session
	path, name string
	reported   int64 // the checkpoint last registered; -1: none yet
	failed     bool  // the last report failed (said once on stderr)
}

// checkpoint reads the reader's checkpoint, if it is registered.
func (r *tailReader) checkpoint(ctx context.Context) (int64, bool, error) {
	c := r.s.client(streamPath(r.path))
	defer c.Release()
	readers := client.Readers(ctx, schema.Stream(c))
	defer readers.Release()
	list, err := client.ListReaders(ctx, readers)
	if err != nil {
		return 0, false, err
	}
	for _, x := range list {
		if x.Name == r.name {
			r.reported = x.Checkpoint
			return x.Checkpoint, true, nil
		}
	}
	r.reported = -1
	return 0, false, nil
}

// report moves the reader's checkpoint to last when it moved since the last report. A failure
// (itxd away, say) is said once on stderr and tried again at the next report.
func (r *tailReader) report(ctx context.Context, last int64) error {
	if last == r.reported {
		return nil
	}
	c := r.s.client(streamPath(r.path))
	defer c.Release()
	readers := client.Readers(ctx, schema.Stream(c))
	defer readers.Release()
	if err := client.RegisterReader(ctx, readers, r.name, last); err != nil {
		if !r.failed {
			fmt.Fprintf(r.s.cfg.Err, "itx: reader %s: checkpoint not moved to %d: %s\n", r.name, last, itx.ErrorMessage(err))
		}
		r.failed = true
		return err
	}
	r.reported, r.failed = last, false
	return nil
}

// tailOverflowed is printTail's answer when stdout fell so far behind that the connection's
// buffer filled: the tail opens again after what it printed.
const tailOverflowed = "overflowed"

// openTail opens .tail's connection on the stream at path, after the offset after, refusing a
// stream whose id is not streamID (unless it is "": the first connection learns it). With
// ephemeral it asks for the buffered ephemeral events after that offset too: when the tail
// started at the head (they were appended since), and when it opens again (the connection it
// replaces would have delivered them live).
func (s *Session) openTail(ctx context.Context, path string, after int64, ephemeral bool, streamID string, quiet int64) (*liveConnection, error) {
	c := s.client(streamPath(path))
	defer c.Release()
	sink := newEventSink()
	sink.keepOldest, sink.streamID, sink.quietThrough = true, streamID, quiet
	return s.openConnectionTo(ctx, c, s.toJS(map[string]any{"after": after, "openedBy": "itx tail", "noState": true, "includeEphemeral": ephemeral}), sink)
}

// printTail prints conn's events until it ends, and returns the last offset printed (after,
// if none). went is why the connection ended when the tail should go on on a new one: itxd
// went away (a close reason, or "the connection was lost"), or tailOverflowed; "" with a nil
// error is Ctrl-C. Any other close ends the tail with its reason.
func (s *Session) printTail(ctx context.Context, conn *liveConnection, after int64, rep *tailReader) (last int64, went string, err error) {
	last = after
	var tick <-chan time.Time
	if rep != nil {
		t := time.NewTicker(tailReportEvery)
		defer t.Stop()
		tick = t.C
	}
	for {
		lost := false
		select {
		case <-ctx.Done():
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			conn.close(cctx, "itx tail ended")
			if rep != nil {
				rep.report(cctx, last) // where it stopped: said on stderr if it fails
			}
			return last, "", nil
		case <-s.Done():
			lost = true // print what arrived before, then go on on a new connection
		case <-conn.sink.wake:
		case <-tick:
			rep.report(ctx, last)
			continue
		}
		events, dropped, closed := conn.sink.take()
		for i, e := range eventsJS(events) {
			s.printEventLine(e)
			last = events[i].Offset
		}
		switch {
		case closed != nil && itxdWentAway(conn.sink.closedWhy()):
			s.forget(conn)
			if conn.sink.closedWhy() == schema.CloseReason_connectionLost.String() && !s.connected() {
				return last, "the connection was lost" + s.lostBecause(), nil // said with its cause
			}
			return last, conn.sink.closedWhy(), nil
		case closed != nil:
			s.forget(conn)
			return last, "", closed
		case lost:
			s.forget(conn)
			return last, "the connection was lost" + s.lostBecause(), nil
		case dropped > 0:
			// The sink kept the oldest events and discarded the rest (keepOldest): they are
			// read again from the log by a connection opened after the last one printed.
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			conn.close(cctx, "itx tail fell behind; opening again after offset "+strconv.FormatInt(last, 10))
			s.forget(conn)
			return last, tailOverflowed, nil
		}
	}
}

// itxdWentAway reports whether a live view closed with why goes on on a new one: itxd shut
// down (a restart), the RPC session ended, or itxd gave up on a sink that did not answer in
// time (this process was stalled). The rest end it: the stream was removed, another opened
// the same key, the token ended, the sink failed a delivery (it would again).
func itxdWentAway(why string) bool {
	switch why {
	case "serverShuttingDown", "connectionLost", "slowConsumer":
		return true
	}
	return false
}

// wentAwayNotice says why a live view ended that goes on on a new one (itxdWentAway).
// slowConsumer is this process's doing, not itxd's: it stopped answering in time.
func wentAwayNotice(why string) string {
	if why == "slowConsumer" {
		return "itxd closed the connection because this process fell behind (slowConsumer)"
	}
	return "itxd went away (" + why + ")"
}

// reopen calls open until it succeeds, reconnecting to itxd first whenever the connection is
// down (with the session's redial and its backoff) and backing off between attempts that fail
// because itxd is unavailable (still shutting down, say) or the connection broke under them.
// why is why the live view ended: after serverShuttingDown it dials a new connection at once,
// since the one it has leads to an itxd that is closing it (a call on it may fail with the
// connection half torn down). It tries until ctx ends (Ctrl-C) or open or the login fails
// otherwise. The caller holds vmMu, as for every command.
func (s *Session) reopen(ctx context.Context, why string, open func() error) error {
	backoff := client.NewBackoff(reconnectFirstDelay, reconnectMaxDelay)
	redial := why == "serverShuttingDown"
	for {
		if redial || !s.connected() {
			conn, project, err := s.redial(ctx)
			if err != nil {
				return err
			}
			s.adopt(conn, project)
			redial = false
		}
		err := open()
		if err == nil {
			return nil
		}
		if itx.ErrorCode(err) != itx.EUnavailable && !capnp.IsDisconnected(err) && s.connected() {
			return err
		}
		t := time.NewTimer(backoff.Next(0))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-s.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// printEventLine prints one tailed event: a JSON document in the JSON format, otherwise
// "offset  time  type  payload", as events print in a table, with "~" after the offset of an
// ephemeral event.
func (s *Session) printEventLine(e eventJS) {
	if s.cfg.Format == FormatJSON {
		b, _ := json.Marshal(e)
		fmt.Fprintln(s.cfg.Out, escapeJSONControls(string(b)))
		return
	}
	mark := ""
	if e.Ephemeral {
		mark = "~"
	}
	fmt.Fprintf(s.cfg.Out, "%d%s  %s  %s  %s\n", e.Offset, mark, isoTime(time.UnixMilli(int64(e.CreatedAt))),
		escapeText(e.Type, false), escapeJSONControls(string(e.Payload)))
}

func runWatch(ctx context.Context, s *Session, args []string) error {
	w, err := parseWatch(args)
	if err != nil {
		return err
	}
	v, err := s.openWatch(ctx, w)
	if err != nil {
		return err
	}
	for {
		went, err := s.printWatch(ctx, v)
		if err != nil || went == "" {
			return err
		}
		fmt.Fprintf(s.cfg.Err, "itx: %s; reconnecting to watch %s again\n", wentAwayNotice(went), w.stream.steps[len(w.stream.steps)-1].arg)
		err = s.reopen(ctx, went, func() (err error) {
			v, err = s.openWatch(ctx, w)
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil // Ctrl-C while reconnecting
			}
			return err
		}
	}
}

// openWatch registers .watch's live view on the stream, or on its processor.
func (s *Session) openWatch(ctx context.Context, w watchArgs) (*liveView, error) {
	c := s.client(w.target())
	defer c.Release()
	if w.processor != "" {
		return processorLiveView(ctx, s, c)
	}
	return streamLiveView(ctx, s, c)
}

// printWatch prints v's frames, its snapshot first, until it ends. went is why it ended when
// .watch should go on with a new view (itxdWentAway, or the connection was lost); "" with a nil
// error is Ctrl-C.
func (s *Session) printWatch(ctx context.Context, v *liveView) (went string, err error) {
	var shownSnapshot uint64
	first := true
	for {
		lost := false
		select {
		case <-ctx.Done():
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			v.cancel(cctx)
			return "", nil
		case <-s.Done():
			lost = true
		case <-v.wake:
		}
		snapshot, state, patches, dropped := v.takePatches()
		if state != nil && (first || snapshot != shownSnapshot || dropped > 0) {
			// The first frame, or a new snapshot (the server's, when the view fell behind, or
			// the view's own, the patches it could not hold folded in while the output was
			// paused): show the whole state, then the patches that followed it.
			s.printWatchFrame(snapshotJS{Revision: snapshot, State: state},
				fmt.Sprintf("snapshot at revision %d\n%s", snapshot, indentJSON(state)))
			first, shownSnapshot = false, snapshot
		}
		for _, pt := range patches {
			s.printWatchFrame(pt, fmt.Sprintf("revision %d: %s", pt.Revision, pt.Ops))
		}
		msg, why := v.endedWith()
		switch {
		case msg != "" && itxdWentAway(why):
			s.forget(v)
			if why == schema.CloseReason_connectionLost.String() && !s.connected() {
				return "the connection was lost" + s.lostBecause(), nil // said with its cause
			}
			return why, nil
		case msg != "":
			ended := v.endedErr() // with the code the server gave (notFound for streamRemoved, ...)
			s.forget(v)
			return "", ended
		case lost:
			s.forget(v)
			return "the connection was lost" + s.lostBecause(), nil
		}
	}
}

// snapshotJS is a live view's snapshot as .watch prints it under --json (the shape of
// snapshot()); a patch prints as patchJS, the shape of patches()' items.
type snapshotJS struct {
	Revision uint64          `json:"revision"`
	State    json.RawMessage `json:"state"`
}

// printJSONLine prints v as one line of JSON: what a command shows in the JSON format.
func (s *Session) printJSONLine(v any) error {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // usages hold "->"
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := io.WriteString(s.cfg.Out, escapeJSONControls(b.String()))
	return err
}

// printWatchFrame prints one frame of .watch: a JSON document a line in the JSON format (as
// .tail prints events), otherwise text.
func (s *Session) printWatchFrame(frame any, text string) {
	if s.cfg.Format == FormatJSON {
		b, _ := json.Marshal(frame)
		fmt.Fprintln(s.cfg.Out, escapeJSONControls(string(b)))
		return
	}
	fmt.Fprintln(s.cfg.Out, escapeJSONControls(text))
}

func indentJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return string(raw)
	}
	return b.String()
}
