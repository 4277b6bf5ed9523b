package main

import (
	"encoding/json"
	"testing"

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
