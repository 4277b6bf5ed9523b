package repl

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"

	"github.com/chzyer/readline"
)

// TerminalConfig configures the interactive loop.
type TerminalConfig struct {
	HistoryFile string // empty: no history file
	Banner      string // printed once, before the first prompt
}

const (
	prompt         = "itx> "
	continuePrompt = "...  "
)

// RunTerminal reads, evaluates and prints until Ctrl-D or .exit. Ctrl-C at the prompt drops
// the line being typed; Ctrl-C while a call runs cancels that call (and interrupts the
// script); neither ends the session, and neither does an error.
func (s *Session) RunTerminal(cfg TerminalConfig) error {
	if cfg.HistoryFile != "" {
		// A history that cannot be written is not worth refusing to start over.
		os.MkdirAll(filepath.Dir(cfg.HistoryFile), 0o700)
		// What is typed can hold secrets (a webhook's signing secret, a token passed to a
		// call): the file is the user's alone, as the shells keep theirs. readline would
		// create it 0666 less the umask.
		if f, err := os.OpenFile(cfg.HistoryFile, os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
			f.Chmod(0o600)
			f.Close()
		}
	}
	// readline's own Close does not stop a read it has in flight on stdin (its FillableStdin
	// closes only its side pipe), so it can wait forever; closing the cancelable stdin first
	// ends that read.
	stdin := readline.NewCancelableStdin(os.Stdin)
	defer stdin.Close()
	var instance atomic.Pointer[readline.Instance]
	rl, err := readline.NewEx(&readline.Config{
		// Ctrl-C drops the line being typed, whatever shows under it. With Tab's candidates
		// listed, readline took the first press (two, once Tab was pressed again to pick
		// one) as only closing the list, the line kept: the next keys typed landed after it
		// (project.streams.1+1, a SyntaxError). Closing the list first lets the press do
		// what it does at a bare prompt. The filter runs on readline's own loop, as the list.
		FuncFilterInputRune: func(r rune) (rune, bool) {
			if r == readline.CharInterrupt {
				if in := instance.Load(); in != nil && in.Operation.IsInCompleteMode() {
					in.Operation.ExitCompleteMode(false)
				}
			}
			return r, true
		},
		Stdin:                  stdin,
		Prompt:                 prompt,
		HistoryFile:            cfg.HistoryFile,
		HistoryLimit:           5000,
		DisableAutoSaveHistory: true,
		HistorySearchFold:      true,
		AutoComplete:           completer{s},
		InterruptPrompt:        "^C",
		EOFPrompt:              "\n",
	})
	if err != nil {
		return err
	}
	instance.Store(rl)
	defer func() {
		stdin.Close()
		rl.Close()
	}()
	s.cfg.Out, s.cfg.Err = rl.Stdout(), rl.Stderr()
	if cfg.Banner != "" {
		io.WriteString(s.cfg.Err, cfg.Banner)
	}

	// While readline reads, the terminal is raw and Ctrl-C arrives as a key (ErrInterrupt).
	// While a call runs, the terminal is cooked and Ctrl-C arrives as SIGINT: it cancels the
	// evaluation's context.
	stopWatch := make(chan struct{})
	defer close(stopWatch)
	go s.watchConnection(stopWatch)

	sigint := make(chan os.Signal, 1)
	signal.Notify(sigint, os.Interrupt)
	defer signal.Stop(sigint)

	var pending []string // lines of an unfinished multi-line input
	for {
		if len(pending) == 0 {
			rl.SetPrompt(prompt)
		} else {
			rl.SetPrompt(continuePrompt)
		}
		line, err := rl.Readline()
		switch {
		case errors.Is(err, readline.ErrInterrupt):
			pending = nil
			continue
		case errors.Is(err, io.EOF):
			if len(pending) > 0 {
				pending = nil
				continue
			}
			return nil
		case err != nil:
			return err
		}
		if cmd, ok := commandLine(line); ok && len(pending) == 0 {
			rl.SaveHistory(line)
			err := s.interruptible(sigint, func(ctx context.Context) error {
				return s.RunCommand(ctx, cmd)
			})
			if errors.Is(err, ErrExit) {
				return nil
			}
			if err != nil {
				s.PrintError(err)
			}
			continue
		}
		pending = append(pending, line)
		src := strings.Join(pending, "\n")
		if Incomplete(src) {
			continue
		}
		pending = nil
		if strings.TrimSpace(src) == "" {
			continue
		}
		for _, entry := range historyEntries(src) {
			rl.SaveHistory(entry)
		}
		err = s.interruptible(sigint, func(ctx context.Context) error {
			v, err := s.EvalInput(ctx, "<repl>", src)
			if err != nil {
				return err
			}
			s.Print(v)
			return nil
		})
		if err != nil {
			s.PrintError(err)
		}
	}
}

// historyEntries is what history keeps of an input: the input as typed, recalled as it was
// run. A multi-line input is kept as one line, its lines joined with a space (their
// indentation dropped), when that is the same program: when every line break falls between
// tokens. One inside a template literal, ending a // comment or continuing a string (a line
// ending in a backslash) would change what the line means, so such an input is kept as its
// lines, one entry each, as Node's prompt keeps them. (Whitespace was collapsed everywhere
// once: "a    b" came back from history as "a b".)
func historyEntries(src string) []string {
	lines := strings.Split(src, "\n")
	if len(lines) == 1 {
		return lines
	}
	if !lineBreaksBetweenTokens(src) {
		var entries []string
		for _, l := range lines {
			if strings.TrimSpace(l) != "" {
				entries = append(entries, l)
			}
		}
		return entries
	}
	var parts []string
	for _, l := range lines {
		if l = strings.TrimSpace(l); l != "" {
			parts = append(parts, l)
		}
	}
	return []string{strings.Join(parts, " ")}
}

// lineBreaksBetweenTokens reports whether every line break in src is outside strings,
// template literals and comments, so that it could be a space. In doubt (a regular expression
// literal holding a quote can mislead the scan) it says no: the lines are then kept apart,
// which loses nothing.
func lineBreaksBetweenTokens(src string) bool {
	for i := 0; i < len(src); i++ {
		switch c := src[i]; {
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for ; j < len(src) && src[j] != c; j++ {
				if src[j] == '\n' {
					return false
				}
				if src[j] == '\\' {
					j++
					if j < len(src) && src[j] == '\n' {
						return false
					}
				}
			}
			i = j
		case c == '/' && i+1 < len(src) && src[i+1] == '/':
			return !strings.Contains(src[i:], "\n")
		case c == '/' && i+1 < len(src) && src[i+1] == '*':
			j := strings.Index(src[i+2:], "*/")
			if j < 0 {
				return false
			}
			i += 2 + j + 1
		}
	}
	return true
}

// CommandLine reports whether src, an expression given on the command line (itx -e), is a
// command rather than JavaScript, as the same line typed at the prompt or piped would be: one
// line that is a dot-command (".du /a") or help, exit or quit.
func CommandLine(src string) (string, bool) {
	if strings.ContainsAny(strings.TrimSpace(src), "\r\n") {
		return "", false
	}
	return commandLine(src)
}

// commandLine reports whether line is a command rather than JavaScript: a dot-command
// (".help Stream"), or help, exit or quit typed as a bare word, as a person would, or called
// as Python's prompt has them (exit()), a semicolon after either taken too. help also takes an
// interface that way (help Stream, help("Stream")), as .help does: neither is JavaScript that
// could mean anything else (two names side by side alone on a line are a syntax error, and
// help is no JavaScript name here; "help in x" has more after them and stays JavaScript).
func commandLine(line string) (string, bool) {
	t := strings.TrimSpace(line)
	if strings.HasPrefix(t, ".") {
		return strings.TrimPrefix(t, "."), true
	}
	word := strings.TrimSuffix(strings.TrimSpace(strings.TrimSuffix(t, ";")), "()")
	switch word {
	case "help", "exit", "quit":
		return word, true
	}
	if m := helpWithInterface.FindStringSubmatch(word); m != nil {
		return "help " + m[1] + m[2], true
	}
	return "", false
}

// helpWithInterface matches help given an interface's name as a bare word or a quoted string.
var helpWithInterface = regexp.MustCompile(`^help(?:\s+([A-Za-z]+)|\s*\(\s*["']([A-Za-z]+)["']\s*\))$`)

// RunLines evaluates src input by input (a line, or as many lines as a statement needs), as the
// prompt does: each result is printed, an error is printed and the next input runs. It returns
// how many inputs failed, and how many of those were usage errors (a command given arguments
// it does not take, or no command of that name). It stops when ctx ends.
func (s *Session) RunLines(ctx context.Context, src io.Reader) (failed, usage int) {
	sc := bufio.NewScanner(src)
	sc.Buffer(make([]byte, 64*1024), 16<<20)
	var in inputAssembler
	exited := false
	run := func(input string) {
		if cmd, ok := commandLine(input); ok {
			err := s.RunCommand(ctx, cmd)
			switch {
			case errors.Is(err, ErrExit):
				exited = true
			case err != nil:
				s.PrintError(err)
				failed++
				var u *UsageError
				if errors.As(err, &u) {
					usage++
				}
			}
			return
		}
		v, err := s.EvalInput(ctx, "<stdin>", input)
		if err != nil {
			s.PrintError(err)
			failed++
			return
		}
		s.Print(v)
	}
	for !exited && ctx.Err() == nil && sc.Scan() {
		line := sc.Text()
		if len(in.lines) == 0 {
			if strings.TrimSpace(line) == "" {
				continue
			}
			if _, ok := commandLine(line); ok {
				run(line)
				continue
			}
		}
		if input, ok := in.add(line); ok {
			run(input)
		}
	}
	if len(in.lines) > 0 && !exited {
		run(in.pending()) // reports the syntax error
	}
	if err := sc.Err(); err != nil {
		s.PrintError(err)
		failed++
	}
	return failed, usage
}

// interruptible runs f with a context that SIGINT cancels.
func (s *Session) interruptible(sigint chan os.Signal, f func(ctx context.Context) error) error {
	// Drop an interrupt that arrived while nothing ran: it was meant for nothing.
	select {
	case <-sigint:
	default:
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-sigint:
			cancel()
		case <-done:
		}
	}()
	return f(ctx)
}

// completer adapts Session.Complete to readline.
type completer struct{ s *Session }

func (c completer) Do(line []rune, pos int) ([][]rune, int) {
	candidates, partial := c.s.Complete(string(line[:pos]))
	n := len([]rune(partial))
	out := make([][]rune, len(candidates))
	for i, cand := range candidates {
		out[i] = []rune(cand)[n:]
	}
	return out, n
}
