// Command itx is the interactive client of itxd: a JavaScript prompt over the capability graph.
//
//	itx                                  interactive session
//	itx -e 'project.streams.list()'      evaluate one expression, print its result
//	itx script.js [args...]              run a script (`args` holds its arguments; - reads stdin)
//	itx tail /a                          print events as they are appended, until Ctrl-C
//	itx watch /a                         print a stream's live state, until Ctrl-C
//
// Exit status: 0 on success, 1 when an evaluation or the connection fails, 2 for a usage
// error, 130 when interrupted.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strings"
	"time"

	"github.com/chzyer/readline"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/cmd/itx/internal/repl"
	"golang.org/x/term"
)

func main() {
	os.Exit(run(os.Args[1:], environment{
		stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv,
		stdinTTY:  readline.IsTerminal(int(os.Stdin.Fd())),
		stdoutTTY: readline.IsTerminal(int(os.Stdout.Fd())),
		stderrTTY: readline.IsTerminal(int(os.Stderr.Fd())),
		size:      terminalSize,
	}))
}

// environment is what run touches of the process, so tests can run it in-process.
type environment struct {
	stdin                          io.Reader
	stdout, stderr                 io.Writer
	getenv                         func(string) string
	stdinTTY, stdoutTTY, stderrTTY bool
	size                           func() (cols, rows int) // the terminal's; nil off a terminal
}

// terminalSize reports the size of the terminal on stdout (0, 0 when it has none).
func terminalSize() (int, int) {
	cols, rows, err := term.GetSize(int(os.Stdout.Fd()))
	if err != nil {
		return 0, 0
	}
	return cols, rows
}

// pagerCommand is the pager for results taller than the screen: ITX_PAGER, then PAGER, then
// less if it is installed (-F: no paging for what fits after all, -R: keep colors, -X: leave
// the text on the screen). ITX_PAGER=cat turns paging off.
func pagerCommand(getenv func(string) string) string {
	for _, k := range []string{"ITX_PAGER", "PAGER"} {
		if p := getenv(k); p != "" {
			return p
		}
	}
	if _, err := exec.LookPath("less"); err == nil {
		return "less -FRX"
	}
	return ""
}

const (
	exitOK          = 0
	exitError       = 1
	exitUsage       = 2
	exitInterrupted = 130
)

func run(args []string, env environment) int {
	fs := flag.NewFlagSet("itx", flag.ContinueOnError)
	// The flag package prints a parse error and the usage as it parses; held back here, so
	// that under --json the error prints as every other error does instead.
	var parseOut bytes.Buffer
	fs.SetOutput(&parseOut)
	var st settings
	fs.StringVar(&st.addr, "addr", "", "itxd address host:port (env ITX_ADDR; default "+defaultAddr+")")
	fs.StringVar(&st.token, "token", "", "project token (env ITX_TOKEN; default: the config file, then <data>/credentials.json)")
	fs.StringVar(&st.configPath, "config", "", "config file {\"addr\", \"token\"} (env ITX_CONFIG; default $XDG_CONFIG_HOME/itx/config.json)")
	fs.StringVar(&st.dataDir, "data", "", "a local itxd data directory to take the token from (env ITX_DATA; default "+defaultDataDir+")")
	useTLS := fs.Bool("tls", false, "connect over TLS (implied by --ca)")
	caFile := fs.String("ca", "", "TLS: trust only the CA certificates in this PEM file (default: the system's roots)")
	certFile := fs.String("cert", "", "TLS: present this client certificate (PEM; for a server with --tls-client-ca)")
	keyFile := fs.String("key", "", "TLS: the client certificate's private key (PEM)")
	expr := fs.String("e", "", "evaluate `expression` (or run a dot-command: -e '.du /a'), print its result and exit")
	jsonOut := fs.Bool("json", false, "machine output: one compact JSON document per result, errors as {\"error\": {code, message}} on stderr")
	output := fs.String("output", "auto", "result format: auto (tables on a terminal), pretty, json or table")
	history := fs.String("history", "", "history file (env ITX_HISTORY; default $XDG_STATE_HOME/itx/history)")
	noColor := fs.Bool("no-color", false, "never color errors (NO_COLOR does the same)")
	wide := fs.Bool("wide", false, "print tables at full width instead of cutting columns to the terminal (.output wide)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage:
  itx [flags]                        interactive session
  itx [flags] -e 'expression'        evaluate one expression and print its result (or run one
                                     dot-command: itx -e '.help Stream')
  itx [flags] script.js [args...]    run a script; - reads it from stdin
  ... | itx [flags]                  evaluate piped lines one by one, printing each result
  itx [flags] tail <path> [--from N | N] [--reader <name>]
                                     print events after offset N (default: the head) as they
                                     are appended, until Ctrl-C; --reader keeps a registered
                                     reader's checkpoint at the last event printed and, without
                                     --from, resumes after it
  itx [flags] import <path> [file] [--with-control]
                                     append newline-delimited JSON events (stdin without a file);
                                     stream/* control records are skipped without --with-control
  itx [flags] export <path> [after] [--with-control]
                                     print a stream's events as newline-delimited JSON;
                                     stream/* control records are left out without --with-control
  itx [flags] watch <path> [--processor <name>]
                                     print a stream's live state, until Ctrl-C; --processor:
                                     that of the processor its processor-wake subscription
                                     <name> runs
  itx [flags] consumers [prefix] [--behind]
                                     every subscription and registered reader under prefix with
                                     its lag, halted and parked ones first (--behind: only those
                                     behind or not active)
  itx [flags] du [prefix]            the streams under prefix, largest on disk first, with the
                                     size of their files and their head, and the total
  itx [flags] rm <path> [--force] [--recursive]
                                     delete a stream for good (the admin right); --force also
                                     while subscriptions, readers or connections consume it;
                                     --recursive: every stream at or below the path
  itx [flags] admin <command> ...    projects and tokens (itx admin help)

The flags may also follow a command (itx tail /a --json).

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			// Asked for, the usage is the output (itx --help | less), as a usage error's is not.
			env.stdout.Write(parseOut.Bytes())
			return exitOK
		}
		if *jsonOut || asksJSON(args) {
			return usageText(env.stderr, "itx: "+err.Error(), true)
		}
		env.stderr.Write(parseOut.Bytes())
		return exitUsage
	}
	fs.SetOutput(env.stderr)
	// A command (itx admin, itx tail, ...) may be followed by itx's own flags too.
	var sub string
	var subArgs []string
	if fs.NArg() > 0 && *expr == "" {
		if c, ok := repl.LookupCommand(fs.Arg(0)); fs.Arg(0) == "admin" || ok && c.CLI {
			sub = fs.Arg(0)
			var err error
			if subArgs, err = takeGlobalFlags(fs, fs.Args()[1:], commandValueFlags[sub]); err != nil {
				return usageText(env.stderr, "itx: "+err.Error(), *jsonOut)
			}
		}
	}
	format, err := repl.ParseFormat(*output)
	if err != nil {
		return usageText(env.stderr, "itx: "+err.Error(), *jsonOut)
	}
	if *jsonOut {
		format = repl.FormatJSON
	}
	asJSON := format == repl.FormatJSON
	color := env.stderrTTY && !*noColor && env.getenv("NO_COLOR") == ""
	tokenHint := "" // set once the token is resolved
	fail := func(err error) int {
		repl.PrintFailureHinted(env.stderr, err, asJSON, color, tokenHint)
		return exitError
	}

	// What to do: an expression, a command, a script, or a session.
	var (
		command    *repl.Command
		scriptName string
		script     string
		scriptArgs []string
		admin      *adminCall
	)
	interactive, piped := false, false
	switch {
	case *expr != "":
		if fs.NArg() > 0 {
			return usageText(env.stderr, "itx: -e takes no other arguments", asJSON)
		}
	case sub == "admin":
		call, code, ok := checkAdmin(subArgs, env, asJSON)
		if !ok {
			return code
		}
		admin = &call
	case fs.NArg() > 0:
		if c, ok := repl.LookupCommand(sub); ok {
			// Its arguments are checked before connecting: a usage error is one whether
			// or not itxd is up.
			if c.Check != nil {
				if err := c.Check(subArgs); err != nil {
					return usageFailure(env.stderr, err, asJSON)
				}
			}
			command = c
			break
		}
		scriptName, scriptArgs = fs.Arg(0), fs.Args()[1:]
		var b []byte
		if scriptName == "-" {
			b, err = io.ReadAll(env.stdin)
		} else {
			b, err = os.ReadFile(scriptName)
		}
		if err != nil {
			if errors.Is(err, os.ErrNotExist) && looksLikeCommand(scriptName) {
				// "itx tial /a", "itx help": a mistyped command, not a missing script.
				guess := ""
				if g := repl.Nearest(scriptName, cliCommands()); g != "" {
					guess = fmt.Sprintf(" (did you mean itx %s?)", g)
				}
				return usageText(env.stderr, fmt.Sprintf("itx: %q is neither a command (%s) nor a script file%s; itx --help shows the usage",
					scriptName, strings.Join(cliCommands(), ", "), guess), asJSON)
			}
			return usageText(env.stderr, "itx: "+err.Error(), asJSON)
		}
		script = string(b)
	case env.stdinTTY:
		interactive = true
	default:
		piped = true
	}

	conf, err := resolve(st, env.getenv)
	if err != nil {
		return usageText(env.stderr, "itx: "+err.Error(), asJSON)
	}
	tokenHint = conf.tokenHint(false)
	var tlsConfig *tls.Config
	if *useTLS || *caFile != "" || *certFile != "" || *keyFile != "" {
		if tlsConfig, err = client.TLSConfig(*caFile, *certFile, *keyFile); err != nil {
			return usageText(env.stderr, "itx: "+err.Error(), asJSON)
		}
	}
	if admin != nil {
		return runAdmin(*admin, conf, tlsConfig, env, asJSON, color)
	}
	dialCtx, cancelDial := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelDial()
	cfg := repl.Config{
		Addr: conf.addr, Token: conf.token, TLS: tlsConfig, Out: env.stdout, Err: env.stderr,
		Format: format, TTY: env.stdoutTTY, Color: color, Wide: *wide, Size: env.size,
		TokenHint: conf.tokenHint(false),
	}
	if interactive {
		cfg.Pager, cfg.PagerOut = pagerCommand(env.getenv), env.stdout
	}
	if command != nil {
		cfg.In = env.stdin // itx import <path> with no file reads standard input
	}
	s, err := repl.Connect(dialCtx, cfg)
	if err != nil {
		return fail(err)
	}
	defer s.Close()

	if interactive {
		info, err := s.Describe(dialCtx)
		if err != nil {
			return fail(err)
		}
		kind := "project"
		if info.Deployment {
			kind = "deployment root"
		}
		hist := *history
		if hist == "" {
			hist = historyPath(env.getenv)
		}
		banner := fmt.Sprintf("itx: connected to %s, %s %q (token from %s)\nType .help for help. Tab completes, Ctrl-C cancels a call, Ctrl-D exits.\n",
			conf.addr, kind, info.Name, conf.tokenFrom)
		if err := s.RunTerminal(repl.TerminalConfig{HistoryFile: hist, Banner: banner}); err != nil {
			return fail(err)
		}
		return exitOK
	}

	// Non-interactive: Ctrl-C (or SIGINT) cancels the evaluation and exits 130.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var runErr error
	switch {
	case command != nil:
		runErr = s.RunCommandArgs(ctx, sub, subArgs)
	case *expr != "":
		if line, ok := repl.CommandLine(*expr); ok {
			// itx -e '.du /a' runs the command, as the line piped or at the prompt does.
			if runErr = s.RunCommand(ctx, line); errors.Is(runErr, repl.ErrExit) {
				runErr = nil
			}
			break
		}
		v, err := s.Eval(ctx, "<expression>", *expr)
		if err == nil {
			s.Print(v)
		}
		runErr = err
	case piped:
		// Each input is evaluated and its result printed, as at the prompt; an error is printed
		// and the next input runs; the exit status says whether any failed. An interrupt stops
		// the input where it is, whether it cancelled a call or ended a .tail or .watch (which
		// end without an error): the status says the rest was not run. A usage error (.tail
		// without a path) exits 2, as the same mistake does from the shell, even after others.
		failed, usage := s.RunLines(ctx, env.stdin)
		if ctx.Err() != nil {
			return exitInterrupted
		}
		if usage > 0 {
			return exitUsage
		}
		if failed > 0 {
			return exitError
		}
		return exitOK
	default:
		if err := s.SetArgs(scriptArgs); err != nil {
			return fail(err)
		}
		_, runErr = s.Eval(ctx, scriptName, script)
		runErr = repl.AtScriptLine(runErr, scriptName)
	}
	if runErr == nil && ctx.Err() != nil {
		// itx tail and itx watch run until Ctrl-C and then end without an error: the status
		// says they were interrupted, as for an interrupted call or piped input.
		return exitInterrupted
	}
	if runErr != nil {
		var usage *repl.UsageError
		if errors.As(runErr, &usage) {
			return usageFailure(env.stderr, runErr, asJSON)
		}
		s.PrintError(runErr)
		if ctx.Err() != nil {
			return exitInterrupted
		}
		return exitError
	}
	return exitOK
}

// looksLikeCommand reports whether a script name that names no file reads as a command word
// rather than a path: no directory, no extension.
func looksLikeCommand(name string) bool {
	return name != "" && !strings.ContainsAny(name, "/.\\")
}

// cliCommands names the commands itx runs from the shell (itx tail, itx admin, ...).
func cliCommands() []string {
	names := []string{"admin"}
	for _, c := range repl.Commands() {
		if c.CLI {
			names = append(names, c.Name)
		}
	}
	sort.Strings(names)
	return names
}

// asksJSON reports whether args ask for --json anywhere before "--": a parse stopped at a bad
// flag has not read the ones after it.
func asksJSON(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-json", "--json", "-json=true", "--json=true":
			return true
		}
	}
	return false
}

// commandValueFlags are the flags of a command that take a value as the next argument
// ("--label ci"): that value is the command's, whatever it looks like.
var commandValueFlags = map[string]map[string]bool{
	"admin": adminValueFlags(),
	"tail":  {"from": true, "reader": true},
}

// valueFlags names the flags of fs that take a value (all but the booleans).
func valueFlags(fs *flag.FlagSet) map[string]bool {
	out := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
			out[f.Name] = true
		}
	})
	return out
}

// takeGlobalFlags sets the flags of fs (itx's own, but -e) found among a command's arguments
// and returns the arguments without them, in order: "itx admin projects --json" as "itx --json
// admin projects". The value of one of the command's own flags (valueFlags) is left to it, and
// after "--" nothing is taken.
func takeGlobalFlags(fs *flag.FlagSet, args []string, valueFlags map[string]bool) ([]string, error) {
	rest := []string{} // not nil: "itx admin" alone is still itx admin
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(rest, args[i:]...), nil
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		f := fs.Lookup(name)
		switch {
		case !strings.HasPrefix(a, "-") || a == "-" || name == "":
			rest = append(rest, a)
		case f == nil || name == "e":
			rest = append(rest, a)
			if valueFlags[name] && !hasValue && i+1 < len(args) {
				i++
				rest = append(rest, args[i])
			}
		default:
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !hasValue && ok && b.IsBoolFlag() {
				value, hasValue = "true", true
			}
			if !hasValue {
				if i+1 == len(args) {
					return nil, fmt.Errorf("flag needs an argument: -%s", name)
				}
				i++
				value = args[i]
			}
			if err := fs.Set(name, value); err != nil {
				return nil, fmt.Errorf("invalid value %q for flag -%s: %v", value, name, err)
			}
		}
	}
	return rest, nil
}

// usageFailure reports a command's usage error as a shell shows it ("usage: itx tail <path>
// ..."), or under --json as an invalidArgument error on one line, with the status of a usage
// error.
func usageFailure(stderr io.Writer, err error, asJSON bool) int {
	var usage *repl.UsageError
	switch {
	case errors.As(err, &usage) && asJSON:
		return usageText(stderr, strings.ReplaceAll(usage.CLIUsage(), "\n", "; "), true)
	case errors.As(err, &usage):
		fmt.Fprintln(stderr, usage.CLIUsage())
		return exitUsage
	}
	return usageText(stderr, "itx: "+repl.Describe(err).String(), asJSON)
}

// usageText reports a usage error: its text, or under --json {"error": {"code":
// "invalidArgument", "message": text}}, as every error prints there.
func usageText(stderr io.Writer, text string, asJSON bool) int {
	if asJSON {
		repl.PrintFailure(stderr, itx.Errorf(itx.EInvalid, "%s", text), true, false)
	} else {
		fmt.Fprintln(stderr, text)
	}
	return exitUsage
}
