package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// itx du lists the streams under a prefix, largest on disk first, each with the size of its
// files as they are on disk, and the total; a bad prefix is a usage error.
func TestRun_Du(t *testing.T) {
	srv := itxtest.Start(t, server.Config{})
	ts := &testServer{addr: srv.Addr, token: srv.Creds.ProjectToken, dir: srv.Dir}
	big := strings.Repeat("x", 60_000)
	for i := range 40 {
		ts.appendDirect(t, "/logs/big", itx.EventInput{Type: "e", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d,"pad":%q}`, i, big))})
	}
	ts.appendDirect(t, "/logs/small", itx.EventInput{Type: "e", Payload: json.RawMessage(`{}`)})
	ts.appendDirect(t, "/other", itx.EventInput{Type: "e", Payload: json.RawMessage(`{}`)})

	c := newCLI(t)
	conn := []string{"--addr", ts.addr, "--token", ts.token}
	type row struct {
		Path       string
		DiskBytes  int64
		Size       string
		HeadOffset int64
	}
	du := func(args ...string) []row {
		t.Helper()
		code, out, errs := c.run("", append(append(conn, "--json", "du"), args...)...)
		require.Equal(t, exitOK, code, errs)
		var rows []row
		require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
		return rows
	}
	all := du()
	require.Len(t, all, 3, "%+v", all)
	require.Equal(t, "/logs/big", all[0].Path, "largest first")
	require.Equal(t, int64(40), all[0].HeadOffset)
	require.Greater(t, all[0].DiskBytes, int64(40*60_000), "the big stream holds its 2.4 MB of payloads")
	require.Greater(t, all[0].DiskBytes, 10*all[1].DiskBytes)
	require.Contains(t, all[0].Size, "MiB")
	for _, r := range all[1:] {
		require.Greater(t, r.DiskBytes, int64(0), r.Path)
	}
	// The sizes are the stream files' own.
	var onDisk int64
	files, err := filepath.Glob(filepath.Join(srv.Dir, "streams", "*.db*"))
	require.NoError(t, err)
	for _, f := range files {
		fi, err := os.Stat(f)
		require.NoError(t, err)
		onDisk += fi.Size()
	}
	require.Equal(t, onDisk, all[0].DiskBytes+all[1].DiskBytes+all[2].DiskBytes, "the three streams' files")

	logs := du("/logs/")
	require.Len(t, logs, 2)
	code, out, errs := c.run("", append(conn, "du", "/logs/")...)
	require.Equal(t, exitOK, code, errs)
	require.Contains(t, out+errs, "in 2 streams")

	code, out, errs = c.run("", append(conn, "--json", "-e", `project.streams.diskUsage("/logs/").map(s => s.path)`)...)
	require.Equal(t, exitOK, code, errs)
	require.JSONEq(t, `["/logs/big", "/logs/small"]`, out, "Streams.diskUsage at the prompt")

	code, _, errs = c.run("", append(conn, "du", "logs")...)
	require.Equal(t, exitUsage, code, errs)
	require.Contains(t, errs, "must start with /")
}
