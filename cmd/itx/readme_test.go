package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/itx-dev/itx/processors/examples"
	"github.com/stretchr/testify/require"
)

// readmeSession returns the itx> lines of the README's code block that follows the line
// containing marker, without the prompt.
func readmeSession(t *testing.T, marker string) []string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(b), marker)
	require.True(t, ok, "the README has no %q", marker)
	_, block, ok := strings.Cut(rest, "```\n")
	require.True(t, ok)
	block, _, ok = strings.Cut(block, "```")
	require.True(t, ok)
	var lines []string
	for _, l := range strings.Split(block, "\n") {
		if in, ok := strings.CutPrefix(l, "itx> "); ok {
			lines = append(lines, in)
		}
	}
	require.NotEmpty(t, lines, "no itx> lines after %q", marker)
	return lines
}

// The README's tour at the itx prompt, run as a new user would type it: every line succeeds, and
// the listing at its end shows the stream the mirror subscription copied into. It showed /a
// alone when the listing ran before the copy (delivery runs on its own; the tour now waits for
// it with waitUntilProcessed).
func TestReadme_TourAtThePrompt(t *testing.T) {
	ts := startServer(t)
	c := newCLI(t)
	c.env["ITX_ADDR"], c.env["ITX_TOKEN"] = ts.addr, ts.token
	lines := readmeSession(t, "The same tour at the `itx` prompt")
	code, out, errs := c.run(strings.Join(lines, "\n")+"\n", "--json")
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.Empty(t, errs)
	results := strings.Split(strings.TrimSpace(out), "\n")
	var streams []struct{ Path string }
	require.NoError(t, json.Unmarshal([]byte(results[len(results)-1]), &streams), results[len(results)-1])
	var paths []string
	for _, s := range streams {
		paths = append(paths, s.Path)
	}
	require.Equal(t, []string{"/a", "/mirror"}, paths, "project.streams.list() at the tour's end")
}

// The README's guestbook at the prompt, against an itxd hosting the reference processors as
// make run's does: the snapshot at its end is the one signature.
func TestReadme_GuestbookAtThePrompt(t *testing.T) {
	srv := startProcessorServer(t, "readme", examples.Names...)
	c := newCLI(t)
	c.env["ITX_ADDR"], c.env["ITX_TOKEN"] = srv.addr, srv.token
	lines := readmeSession(t, "window). At the prompt:")
	code, out, errs := c.run(strings.Join(lines, "\n")+"\n", "--json")
	require.Equal(t, exitOK, code, "stderr: %s", errs)
	require.Empty(t, errs)
	results := strings.Split(strings.TrimSpace(out), "\n")
	var snap struct {
		State struct {
			Count int `json:"count"`
		} `json:"state"`
		ProcessedOffset int64 `json:"processedOffset"`
	}
	require.NoError(t, json.Unmarshal([]byte(results[len(results)-1]), &snap), results[len(results)-1])
	require.Equal(t, 1, snap.State.Count, results[len(results)-1])
	require.Equal(t, int64(2), snap.ProcessedOffset)
}
