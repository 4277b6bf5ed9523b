package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// mountTmpfs mounts a tmpfs of size at a fresh directory, or skips the test where mounting is
// not allowed (it needs root). Unmounted when the test ends.
func mountTmpfs(t *testing.T, size string) string {
	dir := filepath.Join(t.TempDir(), "fs")
	require.NoError(t, os.Mkdir(dir, 0o700))
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v: %s); storage.TestStream_CommitOnAFullDisk covers a full disk with SQLite's page bound", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

// TestItxd_DiskFull: on a full file system an append answers resourceExhausted and writes
// nothing; every acknowledged event survives, and once space returns appends succeed again
// without a restart.
func TestItxd_DiskFull(t *testing.T) {
	fs := mountTmpfs(t, "3m")
	ts := startServer(t, server.Config{DataDir: filepath.Join(fs, "data")})
	s := stream(t, ts.project(t), "/full")
	ctx := ctxT(t)

	var acked int64
	var err error
	for i := 0; i < 1000; i++ {
		var res itx.AppendResult
		res, err = client.Append(ctx, s, kibEvents(20, i*20), itx.AppendOptions{})
		if err != nil {
			break
		}
		acked = res.Offsets[len(res.Offsets)-1]
	}
	require.Error(t, err, "3 MiB never filled up")
	requireCode(t, err, itx.EResourceExhausted)
	require.Greater(t, acked, int64(0))
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.Equal(t, acked, info.HeadOffset, "the refused append wrote nothing")

	// Space returns: the same server takes appends again.
	out, err := exec.Command("mount", "-o", "remount,size=64m", fs).CombinedOutput()
	require.NoError(t, err, "%s", out)
	res, err := client.Append(ctx, s, kibEvents(20, 0), itx.AppendOptions{})
	require.NoError(t, err)
	require.Equal(t, acked+1, res.Offsets[0])

	all, err := client.ReadAll(ctx, s, itx.Query{})
	require.NoError(t, err)
	require.Len(t, all, int(acked)+20, "every acknowledged event is there")
	for i, e := range all {
		require.Equal(t, int64(i+1), e.Offset)
	}
}

// TestItxd_ReadOnlyFileSystem: an existing data directory on a read-only file system is refused
// at start with a message that says so.
func TestItxd_ReadOnlyFileSystem(t *testing.T) {
	fs := mountTmpfs(t, "8m")
	dir := filepath.Join(fs, "data")
	srv, err := server.Open(ctxT(t), server.Config{DataDir: dir})
	require.NoError(t, err)
	require.NoError(t, srv.Close(ctxT(t)))
	out, err := exec.Command("mount", "-o", "remount,ro", fs).CombinedOutput()
	require.NoError(t, err, "%s", out)
	_, err = server.Open(ctxT(t), server.Config{DataDir: dir})
	require.ErrorContains(t, err, "read-only file system")
}
