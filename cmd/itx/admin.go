package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/cmd/itx/internal/repl"
)

const adminUsage = `Usage: itx [flags] admin <command> [arguments]

Projects (the deployment root's token):
  projects                                   list projects
  create-project <name>                      create a project; prints its first token (shown once)
  rename-project <project-id> <name>
  delete-project [--force] <project-id>      --force: also delete its streams and their files

Tokens (the deployment root's token, or a project token with the admin right for its own project):
  tokens [--project ID]                      list tokens (never the secret)
  create-token [--project ID] --label L [--prefix /path] [--rights read,append,subscribe,admin] [--expires 720h]
                                             prints the new token (shown once)
  revoke-token [--project ID] <token-id>     revoke at once
Without --project, a token command acts on the token's own project: for the deployment token,
the deployment's (its global streams), not "default"; itx admin projects lists the ids.

The data directory (the deployment root's token):
  backup <absolute-path>                     itxd writes a copy of its whole data directory, as it
                                             stood at one instant, to a new directory at that path
                                             on the server's machine; itxd --data <path> restores it
  download-backup <dir>                      the same copy, sent over the connection and written to a
                                             new directory on this machine (for a server you have
                                             no shell on)

Flags may come before or after the arguments; after --, everything is an argument.
Without --token, itx admin uses the deployment token of the local data directory (--data).
`

// adminOptions are the flags of itx admin's commands.
type adminOptions struct {
	project, label, prefix, rights string
	expires                        time.Duration
	force                          bool
}

// adminFlags is the flag set of an itx admin command.
func adminFlags(name string) (*flag.FlagSet, *adminOptions) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	o := &adminOptions{}
	fs.StringVar(&o.project, "project", "", "the project (default: the token's own)")
	fs.StringVar(&o.label, "label", "", "the token's label")
	fs.StringVar(&o.prefix, "prefix", "", "limit the token to streams under this path")
	fs.StringVar(&o.rights, "rights", "", "limit the token to these rights (comma-separated: read, append, subscribe, admin)")
	fs.Var((*expiryFlag)(&o.expires), "expires", "the token expires after this long (a `duration`: 720h, 30d, 90m; 0: never)")
	fs.BoolVar(&o.force, "force", false, "delete-project: delete the project's streams and their files too")
	return fs, o
}

// expiryFlag is --expires: a Go duration ("720h", "90m") or a number of days ("30d"), as
// durations read at the prompt.
type expiryFlag time.Duration

func (f *expiryFlag) String() string { return time.Duration(*f).String() }

func (f *expiryFlag) Set(v string) error {
	if days, ok := strings.CutSuffix(v, "d"); ok {
		if n, err := strconv.ParseUint(days, 10, 16); err == nil {
			*f = expiryFlag(time.Duration(n) * 24 * time.Hour)
			return nil
		}
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("want a duration with its unit, such as 720h, 30d or 90m")
	}
	*f = expiryFlag(d)
	return nil
}

// adminCommandUsage is a command's line of adminUsage: "create-token [--project ID] --label L ...".
func adminCommandUsage(cmd string) string {
	for _, line := range strings.Split(adminUsage, "\n") {
		t := strings.TrimSpace(line)
		if name, _, _ := strings.Cut(t, " "); name == cmd {
			if i := strings.Index(t, "   "); i > 0 {
				t = t[:i] // the description after the columns' gap
			}
			return t
		}
	}
	return cmd
}

// adminValueFlags names the admin flags that take a value: itx leaves that value to them when
// it takes its own flags from among a command's arguments.
func adminValueFlags() map[string]bool {
	fs, _ := adminFlags("itx admin")
	return valueFlags(fs)
}

// adminArgCounts is how many arguments (besides flags) each admin command takes.
var adminArgCounts = map[string]int{
	"projects": 0, "create-project": 1, "rename-project": 2, "delete-project": 1,
	"tokens": 0, "create-token": 0, "revoke-token": 1, "backup": 1, "download-backup": 1,
}

// runAdmin runs `itx admin ...`: one administrative call, its result printed as JSON (indented,
// or under --json one compact document, and nothing for a call without a result, as -e prints).
// adminCall is an itx admin command whose arguments and flags were checked.
type adminCall struct {
	name string
	o    *adminOptions
	rest []string // its arguments, without the flags
}

// checkAdmin reads an itx admin command line before anything is resolved or dialed: help, a
// usage error and a bad flag need neither a token nor itxd (itx admin help in a folder without
// a data directory once said "no token"). ok false: it is done, with that exit status.
func checkAdmin(args []string, env environment, asJSON bool) (call adminCall, code int, ok bool) {
	// usage reports a usage error, found before connecting: its line, then the commands (but
	// for short, a problem with a value), or under --json the line as an error document.
	usage := func(short bool, format string, a ...any) int {
		msg := fmt.Sprintf(format, a...)
		switch {
		case asJSON:
			return usageText(env.stderr, msg, true)
		case short:
			fmt.Fprintln(env.stderr, msg)
		default:
			fmt.Fprintf(env.stderr, "%s\n\n%s", msg, adminUsage)
		}
		return exitUsage
	}
	if len(args) == 0 && !asJSON {
		fmt.Fprint(env.stderr, adminUsage)
		return adminCall{}, exitUsage, false
	}
	if len(args) == 0 {
		return adminCall{}, usage(true, "itx admin: want a command (itx admin help)"), false
	}
	if args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(env.stdout, adminUsage) // asked for: the output, as itx --help's is
		return adminCall{}, exitOK, false
	}
	want, known := adminArgCounts[args[0]]
	if !known {
		return adminCall{}, usage(false, "itx admin: unknown command %q", args[0]), false
	}
	fs, o := adminFlags("itx admin " + args[0])
	fs.SetOutput(io.Discard) // the error is reported below, on one line with the command's usage
	rest, err := parseInterleaved(fs, args[1:])
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(env.stdout, adminUsage)
		return adminCall{}, exitOK, false
	}
	if err != nil {
		if asJSON {
			return adminCall{}, usage(true, "itx admin %s: %v", args[0], err), false
		}
		// Not the flag package's listing of every admin flag, most of them another command's.
		fmt.Fprintf(env.stderr, "itx admin %s: %v\nusage: itx admin %s\n", args[0], err, adminCommandUsage(args[0]))
		return adminCall{}, exitUsage, false
	}
	if o.expires < 0 {
		// Read as "no expiry" (0), it would make a token that never expires.
		return adminCall{}, usage(true, "itx admin %s: --expires %s: want a duration from now (0: never)", args[0], o.expires), false
	}
	if len(rest) != want {
		return adminCall{}, usage(false, "itx admin %s: want %d argument(s), got %d", args[0], want, len(rest)), false
	}
	if args[0] == "create-token" && strings.TrimSpace(o.label) == "" {
		return adminCall{}, usage(true, "itx admin create-token: --label is required"), false
	}
	return adminCall{name: args[0], o: o, rest: rest}, exitOK, true
}

// runAdmin runs a checked itx admin command against itxd.
func runAdmin(call adminCall, conf resolved, tlsConfig *tls.Config, env environment, asJSON, color bool) int {
	o, rest := call.o, call.rest
	token := conf.token
	if conf.deploymentToken != "" {
		token = conf.deploymentToken
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := client.DialWith(dctx, conf.addr, client.Options{TLS: tlsConfig})
	if err != nil {
		repl.PrintFailure(env.stderr, itx.Errorf(itx.EUnavailable, "%v", err), asJSON, color)
		return exitError
	}
	defer conn.Close()
	p := conn.Login(ctx, token)
	defer p.Release()
	a := client.Admin(ctx, p)
	defer a.Release()

	var out any
	switch call.name {
	case "projects":
		var list []itx.ProjectSummary
		if list, err = client.ListProjects(ctx, a); err == nil {
			rows := make([]repl.ProjectJS, len(list))
			for i, p := range list {
				rows[i] = repl.ProjectOf(p)
			}
			out = rows
		}
	case "create-project":
		info, tok, t, e := client.CreateProject(ctx, a, rest[0])
		err, out = e, repl.CreatedProjectJS{ID: info.ID, Name: info.Name, Token: tok, TokenInfo: repl.TokenOf(t)}
	case "rename-project":
		err = client.RenameProject(ctx, a, rest[0], rest[1])
	case "delete-project":
		err = repl.ForceHint(client.DeleteProject(ctx, a, rest[0], o.force), "--force")
	case "tokens":
		var list []itx.TokenInfo
		if list, err = client.ListTokens(ctx, a, o.project); err == nil {
			rows := make([]repl.TokenJS, len(list))
			for i, t := range list {
				rows[i] = repl.TokenOf(t)
			}
			out = rows
		}
	case "create-token":
		to := client.TokenOptions{Label: o.label, Scope: itx.Scope{Prefix: o.prefix}}
		if o.rights != "" {
			for _, r := range strings.Split(o.rights, ",") {
				to.Scope.Rights = append(to.Scope.Rights, itx.Right(strings.TrimSpace(r)))
			}
		}
		if o.expires > 0 {
			to.Expires = time.Now().Add(o.expires)
		}
		tok, t, e := client.CreateToken(ctx, a, o.project, to)
		err, out = e, repl.CreatedTokenJS{Token: tok, Info: repl.TokenOf(t)}
	case "revoke-token":
		err = client.RevokeToken(ctx, a, o.project, rest[0])
	case "backup":
		var r client.BackupResult
		if r, err = client.Backup(ctx, a, rest[0]); err == nil {
			out = repl.BackupOf(r)
		}
	case "download-backup":
		var r client.BackupResult
		if r, err = client.DownloadBackup(ctx, a, rest[0]); err == nil {
			out = repl.BackupOf(r)
		}
	}
	if err != nil {
		repl.PrintFailureHinted(env.stderr, err, asJSON, color, conf.tokenHint(token == conf.deploymentToken))
		return exitError
	}
	switch {
	case out != nil:
		enc := json.NewEncoder(env.stdout)
		enc.SetEscapeHTML(false) // as results at the prompt: a path's "<" reads as itself
		if !asJSON {
			enc.SetIndent("", "  ")
		}
		enc.Encode(out)
	case !asJSON:
		fmt.Fprintln(env.stdout, "ok")
	}
	return exitOK
}

// parseInterleaved parses args as fs's flags, wherever they stand among the positional
// arguments ("revoke-token tok_... --project prj_..." as well as "revoke-token --project prj_...
// tok_..."): Go's flag package stops at the first argument that is not a flag. After "--",
// everything is an argument. It returns the arguments in order.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		consumed := args[:len(args)-len(rest)]
		if n := len(consumed); n > 0 && consumed[n-1] == "--" && !flagValue(fs, consumed[:n-1]) {
			// Parse stopped at "--", the end of the flags.
			return append(positional, rest...), nil
		}
		if len(rest) == 0 {
			return positional, nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// flagValue reports whether the argument after consumed is the value of consumed's last flag
// ("--label --": the label is "--"): that flag takes a value and was given without "=".
func flagValue(fs *flag.FlagSet, consumed []string) bool {
	if len(consumed) == 0 {
		return false
	}
	last := consumed[len(consumed)-1]
	name := strings.TrimLeft(last, "-")
	if !strings.HasPrefix(last, "-") || name == "" || strings.Contains(name, "=") {
		return false
	}
	f := fs.Lookup(name)
	if f == nil {
		return false
	}
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		return false
	}
	return !flagValue(fs, consumed[:len(consumed)-1])
}
