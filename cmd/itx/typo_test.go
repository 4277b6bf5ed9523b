package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRun_TyposSayWhatWasMeant: a mistyped member or name says which one was most likely
// meant, and a word close to nothing gets no guess. They said only that the member or name did
// not exist, leaving the person to find the spelling in .help.
func TestRun_TyposSayWhatWasMeant(t *testing.T) {
	ts := startServer(t)
	c := newCLI(t)
	conn := []string{"--addr", ts.addr, "--token", ts.token}
	for src, says := range map[string]string{
		`project.stream.get("/a")`:                        "TypeError: Project has no member 'stream' (did you mean streams? .help Project lists its methods)\n",
		`project.streams.get("/a").apend({type: "x"})`:    "TypeError: Stream has no member 'apend' (did you mean append? .help Stream lists its methods)\n",
		`project.streams.get("/a").getevents()`:           "TypeError: Stream has no member 'getevents' (did you mean getEvents? .help Stream lists its methods)\n",
		`project.streams.get("/a").subscription.get("x")`: "TypeError: Stream has no member 'subscription' (did you mean subscriptions? .help Stream lists its methods)\n",
		`project.streams.get("/a").xyzzy`:                 "TypeError: Stream has no member 'xyzzy' (.help Stream lists its methods)\n",
		`prject.streams.list()`:                           "ReferenceError: prject is not defined (did you mean project?)\n",
		"let orders = 1\nordrs + 1":                       "ReferenceError: ordrs is not defined (did you mean orders?)\n",
		`zzz`:                                             "ReferenceError: zzz is not defined\n",
		`.tial /a`:                                        "invalidArgument: unknown command .tial (did you mean .tail? .help lists the commands)\n",
		`.hlep`:                                           "invalidArgument: unknown command .hlep (did you mean .help? .help lists the commands)\n",
		`.nope`:                                           "invalidArgument: unknown command .nope (try .help)\n",
	} {
		code, _, errs := c.run(src+"\n", conn...)
		want := exitError
		if strings.HasPrefix(src, ".") {
			want = exitUsage // an unknown command is a usage error
		}
		require.Equal(t, want, code, src)
		require.Equal(t, says, errs, src)
	}
	// In a script, before where it was thrown.
	script := filepath.Join(t.TempDir(), "s.js")
	require.NoError(t, os.WriteFile(script, []byte("let n = 1\nprojct.streams.list()\n"), 0o600))
	code, _, errs := c.run("", append(conn, script)...)
	require.Equal(t, exitError, code)
	require.Equal(t, "ReferenceError: projct is not defined (did you mean project?) (at "+script+":2:1)\n", errs)
}
