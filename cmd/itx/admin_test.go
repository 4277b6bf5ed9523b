package main

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx/cmd/itx/internal/repl"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// itx admin, with the deployment token taken from the data directory (--data), creates a
// project and a scoped token, lists and revokes it; the scoped token then works at the prompt
// only within its scope.
func TestRun_Admin(t *testing.T) {
	s := itxtest.Start(t, server.Config{})
	c := newCLI(t)
	admin := func(args ...string) (int, string, string) {
		return c.run("", append([]string{"--data", s.Dir, "--addr", s.Addr, "admin"}, args...)...)
	}

	code, out, errs := admin("create-project", "team-a")
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	var created struct {
		ID    string `json:"id"`
		Token string `json:"token"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &created))
	require.NotEmpty(t, created.Token)

	code, out, errs = admin("create-token", "--project", created.ID, "--label", "reader", "--prefix", "/orders", "--rights", "read", "--expires", "1h")
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	var tok struct {
		Token string `json:"token"`
		Info  struct {
			ID     string   `json:"id"`
			Prefix string   `json:"prefix"`
			Rights []string `json:"rights"`
		} `json:"info"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &tok))
	require.Equal(t, "/orders", tok.Info.Prefix)
	require.Equal(t, []string{"read"}, tok.Info.Rights)

	code, out, _ = admin("tokens", "--project", created.ID)
	require.Equal(t, exitOK, code)
	require.Contains(t, out, tok.Info.ID)
	require.NotContains(t, out, tok.Token, "listings never show a token")

	conn := []string{"--addr", s.Addr, "--token", tok.Token}
	code, _, errs = c.run("", append(conn, "-e", `project.streams.get("/orders").append({type: "x"})`)...)
	require.Equal(t, exitError, code)
	require.Contains(t, errs, "permissionDenied: ")
	code, _, errs = c.run("", append(conn, "-e", `project.streams.get("/orders").getEvents()`)...)
	require.Equal(t, exitOK, code, "stderr: %s", errs)

	code, out, errs = admin("revoke-token", "--project", created.ID, tok.Info.ID)
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.Equal(t, "ok\n", out)
	code, _, errs = c.run("", append(conn, "-e", `project.describe()`)...)
	require.Equal(t, exitError, code)
	require.Contains(t, errs, "unauthenticated: ")

	code, _, errs = admin("delete-project", created.ID)
	require.Equal(t, exitOK, code, "a project without streams goes without --force: %s", errs)
	code, _, errs = admin("frobnicate")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errs, "unknown command")

	// A project token is not the deployment root.
	code, _, errs = c.run("", "--addr", s.Addr, "--token", s.Creds.ProjectToken, "admin", "create-project", "x")
	require.Equal(t, exitError, code)
	require.Contains(t, errs, "permissionDenied: ")
}

// itx admin create-token with a negative --expires is a usage error that creates nothing: "-5h"
// once made a token that never expires (the opposite of what was asked; 0 is "never").
func TestRun_AdminCreateTokenExpiresMustBePositive(t *testing.T) {
	s := itxtest.Start(t, server.Config{})
	c := newCLI(t)
	admin := func(args ...string) (int, string, string) {
		return c.run("", append([]string{"--data", s.Dir, "--addr", s.Addr, "admin"}, args...)...)
	}
	ids := func() []string {
		code, out, errs := admin("tokens")
		require.Equal(t, exitOK, code, "stderr: %s", errs)
		var list []struct {
			ID string `json:"id"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &list))
		var ids []string
		for _, tk := range list {
			ids = append(ids, tk.ID)
		}
		return ids
	}
	before := ids()
	for _, expires := range []string{"-5h", "-1ms"} {
		code, out, errs := admin("create-token", "--label", "short", "--expires", expires)
		require.Equal(t, exitUsage, code, "--expires %s: stdout %s stderr %s", expires, out, errs)
		require.Contains(t, errs, "--expires", expires)
		require.Empty(t, out, "--expires %s printed a token", expires)
	}
	require.Equal(t, before, ids(), "a refused create-token writes nothing")

	code, out, errs := admin("create-token", "--label", "later", "--expires", "1h")
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.Contains(t, out, `"expiresAt": "`)
}

// itx admin takes its flags before, between or after its arguments, as users write them
// (Go's flag package alone stops at the first argument: "revoke-token tok_... --project prj_..."
// was "want 1 argument(s), got 3"); after "--" everything is an argument.
func TestRun_AdminFlagsAnywhere(t *testing.T) {
	s := itxtest.Start(t, server.Config{})
	c := newCLI(t)
	admin := func(args ...string) (int, string, string) {
		return c.run("", append([]string{"--data", s.Dir, "--addr", s.Addr, "admin"}, args...)...)
	}
	code, out, errs := admin("create-project", "team-flags")
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	var created struct {
		ID    string `json:"id"`
		Token string `json:"token"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &created))

	code, out, errs = admin("create-token", "--label", "ci", "--project", created.ID, "--rights=read")
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	var tok struct {
		Info struct {
			ID string `json:"id"`
		} `json:"info"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &tok))

	code, out, errs = admin("revoke-token", tok.Info.ID, "--project", created.ID)
	require.Equal(t, exitOK, code, "a flag after the argument: %s", errs)
	require.Equal(t, "ok\n", out)

	code, _, errs = admin("rename-project", created.ID, "--", "-team-dash")
	require.Equal(t, exitOK, code, "after --, an argument that looks like a flag: %s", errs)

	// A stream in the project: deleting it needs --force, given last.
	code, _, errs = c.run("", "--addr", s.Addr, "--token", created.Token, "-e", `project.streams.get("/x").append({type: "x"})`)
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	code, _, errs = admin("delete-project", created.ID)
	require.Equal(t, exitError, code)
	require.Contains(t, errs, "by forcing (--force)", "the refusal names the flag that forces it")
	code, _, errs = admin("delete-project", created.ID, "--force")
	require.Equal(t, exitOK, code, "--force after the project id: %s", errs)
	code, out, _ = admin("projects")
	require.Equal(t, exitOK, code)
	require.NotContains(t, out, created.ID)

	code, _, errs = admin("revoke-token", "tok_x", "--bogus")
	require.Equal(t, exitUsage, code, "an unknown flag anywhere is a usage error: %s", errs)
	require.Contains(t, errs, "flag provided but not defined: -bogus")
	code, _, errs = admin("rename-project", created.ID)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errs, "want 2 argument(s), got 1")
}

func TestParseInterleaved(t *testing.T) {
	for _, tc := range []struct {
		args        []string
		label, rest string
		force       bool
	}{
		{[]string{"a", "--label", "l", "b"}, "l", "a b", false},
		{[]string{"--force", "a", "--label=l"}, "l", "a", true},
		{[]string{"a", "--", "--force", "-b"}, "", "a --force -b", false},
		{[]string{"--label", "--", "a", "--force"}, "--", "a", true},
		{[]string{"--label", "--", "--", "--force"}, "--", "--force", false},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		label := fs.String("label", "", "")
		force := fs.Bool("force", false, "")
		rest, err := parseInterleaved(fs, tc.args)
		require.NoError(t, err, "%q", tc.args)
		require.Equal(t, tc.rest, strings.Join(rest, " "), "%q", tc.args)
		require.Equal(t, tc.label, *label, "%q", tc.args)
		require.Equal(t, tc.force, *force, "%q", tc.args)
	}
}

// itx --json admin prints as every other --json command: one compact JSON document a result,
// nothing for a call without one (it printed "ok", which is not JSON), and errors as
// {"error": {code, message}} on stderr (they printed as text).
func TestRun_AdminJSON(t *testing.T) {
	s := itxtest.Start(t, server.Config{})
	c := newCLI(t)
	admin := func(args ...string) (int, string, string) {
		return c.run("", append([]string{"--data", s.Dir, "--addr", s.Addr, "--json", "admin"}, args...)...)
	}
	code, out, errs := admin("create-project", "team-json")
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.Equal(t, 1, strings.Count(out, "\n"), "one compact document: %q", out)
	var created struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &created))

	code, out, errs = admin("projects")
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.Equal(t, 1, strings.Count(out, "\n"), "one compact document: %q", out)
	require.True(t, json.Valid([]byte(out)), out)

	code, out, errs = admin("rename-project", created.ID, "team-json-2")
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.Empty(t, out, "no result, no document")

	code, out, errs = admin("rename-project", "prj_nope", "x")
	require.Equal(t, exitError, code)
	require.Empty(t, out)
	var failure struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(errs), &failure), "stderr %q", errs)
	require.Equal(t, "notFound", failure.Error.Code)

	// Without --json: indented JSON, "ok", and "<code>: <message>".
	code, out, _ = c.run("", "--data", s.Dir, "--addr", s.Addr, "admin", "rename-project", created.ID, "team-json-3")
	require.Equal(t, exitOK, code)
	require.Equal(t, "ok\n", out)
	code, _, errs = c.run("", "--data", s.Dir, "--addr", s.Addr, "admin", "rename-project", "prj_nope", "x")
	require.Equal(t, exitError, code)
	require.True(t, strings.HasPrefix(errs, "notFound: "), errs)
}

// itx's own flags (--json, --addr, --token, --data, ...) may follow a command too, as the flags
// of itx admin and itx tail may: "itx admin projects --json", "itx export /a --addr ...". They
// were the command's arguments ("flag provided but not defined: -json"; "after must be an
// offset"). A command flag's value is never taken for one of them.
func TestRun_GlobalFlagsAfterTheCommand(t *testing.T) {
	s := itxtest.Start(t, server.Config{})
	c := newCLI(t)
	code, out, errs := c.run("", "admin", "projects", "--json", "--addr", s.Addr, "--token", s.Creds.DeploymentToken)
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.Equal(t, 1, strings.Count(out, "\n"), "--json after the command: one compact document: %q", out)

	code, out, errs = c.run("", "admin", "create-token", "--label", "--json", "--data", s.Dir, "--addr", s.Addr)
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.Contains(t, out, `"label": "--json"`, "the value of --label, not itx's --json")

	code, _, errs = c.run("", "--addr", s.Addr, "--token", s.Creds.ProjectToken, "-e", `project.streams.get("/g").append({type: "x"})`)
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	code, out, errs = c.run("", "export", "/g", "0", "--addr", s.Addr, "--token="+s.Creds.ProjectToken, "--with-control")
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.Contains(t, out, `"type":"x"`)

	code, _, errs = c.run("", "admin", "--data", s.Dir)
	require.Equal(t, exitUsage, code, "itx admin alone shows its usage: %s", errs)
	require.Contains(t, errs, "Usage: itx [flags] admin <command>")

	code, _, errs = c.run("", "export", "/g", "--addr")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errs, "flag needs an argument: -addr")
	code, _, errs = c.run("", "export", "/g", "-e", "1", "--addr", s.Addr, "--token", s.Creds.ProjectToken)
	require.Equal(t, exitUsage, code, "-e is not a command's flag: %s", errs)
}

// itx admin's usage errors are found before it connects, so they are usage errors (2) whether
// or not itxd is up (an unknown command or a wrong argument count was found after dialing: with
// itxd down, "unavailable", 1), and under --json they print as {"error": ...} like every error.
func TestRun_AdminUsageErrorsBeforeConnecting(t *testing.T) {
	c := newCLI(t)
	conn := []string{"--addr", mustClosedPort(t), "--token", "itxd_unused"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, `itx admin: unknown command "frobnicate"`},
		{[]string{"rename-project", "prj_x"}, "itx admin rename-project: want 2 argument(s), got 1"},
		{[]string{"projects", "extra"}, "itx admin projects: want 0 argument(s), got 1"},
		{[]string{"create-token", "--label", "x", "--expires", "-1h"}, "itx admin create-token: --expires -1h0m0s: want a duration from now (0: never)"},
		{[]string{"tokens", "--bogus"}, "itx admin tokens: flag provided but not defined: -bogus"},
		// The label the usage line asks for: it was sent, and refused by itxd (exit 1), or a
		// connection error when itxd was down.
		{[]string{"create-token", "--prefix", "/a"}, "itx admin create-token: --label is required"},
		{nil, "itx admin: want a command (itx admin help)"},
	} {
		args := append(append([]string{}, conn...), "admin")
		code, out, errs := c.run("", append(args, tc.args...)...)
		require.Equal(t, exitUsage, code, "%v: %s", tc.args, errs)
		require.Empty(t, out)
		if tc.args == nil {
			require.Contains(t, errs, "Usage: itx [flags] admin <command>")
		} else {
			_, problem, _ := strings.Cut(tc.want, ": ")
			require.Contains(t, errs, problem, "%v", tc.args)
		}

		code, out, errs = c.run("", append(append([]string{"--json"}, args...), tc.args...)...)
		require.Equal(t, exitUsage, code, "--json %v: %s", tc.args, errs)
		require.Empty(t, out)
		var failure struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		require.NoError(t, json.Unmarshal([]byte(errs), &failure), "--json %v: stderr %q", tc.args, errs)
		require.Equal(t, repl.Failure{Code: "invalidArgument", Message: tc.want}, repl.Failure{Code: failure.Error.Code, Message: failure.Error.Message}, "%v", tc.args)
	}
}

// itx admin backup writes a copy that itxd starts on, with the events appended before it; the
// same from the prompt; a path that exists is refused, typed.
func TestRun_AdminBackup(t *testing.T) {
	s := itxtest.Start(t, server.Config{})
	c := newCLI(t)
	code, _, errs := c.run("", "--data", s.Dir, "--addr", s.Addr, "-e", `project.streams.get("/a").append({type: "note", payload: {n: 1}})`)
	require.Equal(t, exitOK, code, "stderr: %s", errs)

	dest := filepath.Join(t.TempDir(), "copy")
	code, out, errs := c.run("", "--data", s.Dir, "--addr", s.Addr, "admin", "backup", dest)
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	var res repl.BackupJS
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Equal(t, dest, res.Path)
	require.Equal(t, 1, res.Streams)

	code, _, errs = c.run("", "--data", s.Dir, "--addr", s.Addr, "admin", "backup", dest)
	require.Equal(t, exitError, code)
	require.Contains(t, errs, "failedPrecondition: ")

	creds, err := server.ReadCredentials(s.Dir)
	require.NoError(t, err)
	second := filepath.Join(t.TempDir(), "copy2")
	code, out, errs = c.run("", "--addr", s.Addr, "--token", creds.DeploymentToken, "--json", "-e", `project.admin.backup("`+second+`")`)
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Equal(t, second, res.Path)

	downloaded := filepath.Join(t.TempDir(), "downloaded")
	code, out, errs = c.run("", "--data", s.Dir, "--addr", s.Addr, "admin", "download-backup", downloaded)
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Equal(t, downloaded, res.Path)
	require.Equal(t, 2, res.Streams) // /a, and the deployment's /audit since the first backup

	third := filepath.Join(t.TempDir(), "third")
	code, out, errs = c.run("", "--addr", s.Addr, "--token", creds.DeploymentToken, "--json", "-e", `project.admin.download("`+third+`")`)
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Equal(t, third, res.Path)
	_, err = os.Stat(filepath.Join(third, "directory.db"))
	require.NoError(t, err)

	restoredDownload := itxtest.Start(t, server.Config{DataDir: downloaded})
	code, out, errs = c.run("", "--data", downloaded, "--addr", restoredDownload.Addr, "--json", "-e", `project.streams.get("/a").getEvents()`)
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.Contains(t, out, `"n":1`)

	restored := itxtest.Start(t, server.Config{DataDir: dest})
	code, out, errs = c.run("", "--data", dest, "--addr", restored.Addr, "--json", "-e", `project.streams.get("/a").getEvents()`)
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.Contains(t, out, `"n":1`)
}

// itx admin create-token --expires takes days ("30d"), as durations at the prompt do, and a
// value without a unit is refused saying what it wants, not with the flag package's "parse error".
func TestRun_AdminCreateTokenExpiresInDays(t *testing.T) {
	s := itxtest.Start(t, server.Config{})
	c := newCLI(t)
	admin := func(args ...string) (int, string, string) {
		return c.run("", append([]string{"--data", s.Dir, "--addr", s.Addr, "admin"}, args...)...)
	}
	code, out, errs := admin("create-token", "--label", "month", "--expires", "30d", "--json")
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	var tok struct {
		Info struct {
			CreatedAt time.Time `json:"createdAt"`
			ExpiresAt time.Time `json:"expiresAt"`
		} `json:"info"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &tok), out)
	require.InDelta(t, float64(30*24*time.Hour), float64(tok.Info.ExpiresAt.Sub(tok.Info.CreatedAt)), float64(time.Minute))

	code, out, errs = admin("create-token", "--label", "bad", "--expires", "5", "--json")
	require.Equal(t, exitUsage, code)
	require.Empty(t, out)
	require.Equal(t, `{"error":{"code":"invalidArgument","message":"itx admin create-token: invalid value \"5\" for flag -expires: want a duration with its unit, such as 720h, 30d or 90m"}}`+"\n", errs)
}

// A bad flag of an itx admin command is one line naming it, then that command's usage, not
// the flag package's listing of every admin flag (most of them other commands').
func TestRun_AdminBadFlagShowsTheCommandsUsage(t *testing.T) {
	c := newCLI(t)
	conn := []string{"--addr", mustClosedPort(t), "--token", "itx_unused", "admin"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"delete-project", "prj_x", "--bogus"}, "itx admin delete-project: flag provided but not defined: -bogus\nusage: itx admin delete-project [--force] <project-id>\n"},
		{[]string{"tokens", "--project"}, "itx admin tokens: flag needs an argument: -project\nusage: itx admin tokens [--project ID]\n"},
		{[]string{"backup", "--x", "/b"}, "itx admin backup: flag provided but not defined: -x\nusage: itx admin backup <absolute-path>\n"},
	} {
		code, out, errs := c.run("", append(conn, tc.args...)...)
		require.Equal(t, exitUsage, code, "%v", tc.args)
		require.Empty(t, out)
		require.Equal(t, tc.want, errs, "%v", tc.args)
	}
	code, out, errs := c.run("", append(conn, "projects", "-h")...)
	require.Equal(t, exitOK, code, "-h asks for the usage")
	require.Contains(t, out, "Usage: itx [flags] admin <command>", "asked for, the usage is the output")
	require.Empty(t, errs)
}

// export --with-control, then import --with-control into another stream: the platform's own
// facts in the export (a halt, stream/woken, stream/processor-revived) are skipped and counted,
// since itxd refuses them from a client; the import failed whole at the first of them. So are
// the resumes that ended those halts: with the halt left out, itxd refused the resume ("neither
// halted nor parked") and the import failed whole at it, for any stream whose subscription was
// ever halted and resumed.
func TestRun_ImportWithControlSkipsPlatformFacts(t *testing.T) {
	s := itxtest.Start(t, server.Config{})
	c := newCLI(t)
	conn := []string{"--addr", s.Addr, "--token", s.Creds.ProjectToken}
	lines := strings.Join([]string{
		`{"type":"x","payload":{"n":1}}`,
		`{"type":"stream/subscription-configured","payload":{"name":"ghost","receiver":{"action":"processor-wake"}}}`,
		`{"type":"stream/subscription-delivery-halted","payload":{"name":"ghost","reason":"delivery-failed","afterOffset":0,"attempts":1,"error":"e"}}`,
		`{"type":"stream/woken","payload":{"incarnationId":"i","reason":"loaded"}}`,
		`{"type":"stream/processor-revived","payload":{"processorSlug":"ghost","revivals":1,"version":"v"}}`,
		`{"type":"stream/subscription-delivery-resumed","payload":{"name":"ghost"}}`,
		`{"type":"x","payload":{"n":2}}`,
	}, "\n") + "\n"
	code, _, errs := c.run(lines, append([]string{"import", "/copy", "--with-control"}, conn...)...)
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.Contains(t, errs, "skipped 3 platform records")
	require.Contains(t, errs, "skipped 1 subscription resume (of halts")
	code, out, errs := c.run("", append([]string{"export", "/copy", "--with-control"}, conn...)...)
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	var types []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var e struct{ Type string }
		require.NoError(t, json.Unmarshal([]byte(l), &e))
		if e.Type != "stream/subscription-delivery-halted" { // the server's own halt of ghost, if its wake ran
			types = append(types, e.Type)
		}
	}
	require.Equal(t, []string{"x", "stream/subscription-configured", "x"}, types)
}

// A token command without --project acts on the token's own project, which for the deployment
// token (itx admin's default) is the deployment's, not "default": the help says so, since a
// token made that way for "default"'s streams reads none of them. itx admin help prints without
// a token.
func TestRun_AdminTokenWithoutProjectIsTheTokensOwn(t *testing.T) {
	s := itxtest.Start(t, server.Config{})
	c := newCLI(t)
	code, out, errs := c.run("", "--data", s.Dir, "--addr", s.Addr, "admin", "create-token", "--label", "ci")
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	var tok struct{ Info struct{ ProjectID string } }
	require.NoError(t, json.Unmarshal([]byte(out), &tok))
	require.Equal(t, "deployment", tok.Info.ProjectID)

	// Help needs no token: this CLI has no data directory, config or --token.
	code, out, errs = c.run("", "admin", "help")
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.Contains(t, out, "Without --project, a token command acts on the token's own project: for the deployment token,\nthe deployment's")
	code, _, errs = c.run("", "admin", "frobnicate")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errs, `unknown command "frobnicate"`, "a usage error is said before the missing token")
}

// Admin.listProjects(after, limit) pages at the prompt as Streams.list does: one page with a
// limit (saying where the next starts), every page after `after` without. It took no
// arguments ("takes no arguments, got an object"), though the README gives it after and limit.
func TestRun_AdminListProjectsPages(t *testing.T) {
	s := itxtest.Start(t, server.Config{})
	c := newCLI(t)
	run := func(expr string) (string, string) {
		code, out, errs := c.run("", "--addr", s.Addr, "--token", s.Creds.DeploymentToken, "--json", "-e", expr)
		require.Equal(t, exitOK, code, "%s: %s", expr, errs)
		return strings.TrimSpace(out), errs
	}
	for _, name := range []string{"p1", "p2"} {
		run(`project.admin.createProject("` + name + `").id`)
	}
	all, _ := run(`project.admin.listProjects().map(p => p.id)`)
	var ids []string
	require.NoError(t, json.Unmarshal([]byte(all), &ids))
	require.Len(t, ids, 4, "default, deployment and the two made here")

	out, errs := run(`project.admin.listProjects({limit: 1}).map(p => p.id)`)
	require.Equal(t, `["`+ids[0]+`"]`, out)
	require.Contains(t, errs, `more follow: listProjects("`+ids[0]+`", 1) for the next page`)
	out, _ = run(`project.admin.listProjects("` + ids[0] + `", 2).map(p => p.id)`)
	require.Equal(t, `["`+ids[1]+`","`+ids[2]+`"]`, out)
	out, _ = run(`project.admin.listProjects({after: "` + ids[1] + `"}).map(p => p.id)`)
	require.Equal(t, `["`+ids[2]+`","`+ids[3]+`"]`, out, "without a limit, every page after it")

	code, _, errs := c.run("", "--addr", s.Addr, "--token", s.Creds.DeploymentToken, "--json", "-e", `project.admin.listProjects({limit: 20000})`)
	require.Equal(t, exitError, code)
	require.Contains(t, errs, `"code":"invalidArgument"`, "a larger limit is refused, as the README says")
}
