package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Storage damaged while itxd is stopped or while a stream is unloaded: a stream's database file
// overwritten, cut short or deleted, or the data directory's own database lost. No acknowledged
// event may vanish silently (a stream made anew, empty, would reissue its offsets from 1), the
// damaged stream answers a typed error naming its file, and every other stream, project and
// itxd itself go on. diskfull_test.go, diskreserve_test.go and fsyncfail_test.go cover a full
// disk and a failing fsync.

// damageEvents is how many kib events populate appends to /a: about 20 pages of its file.
const damageEvents = 60

// damageFixture is a data directory itxd wrote and stopped cleanly: /a holds damageEvents kib
// events, /b one.
type damageFixture struct {
	dir    string
	fileA  string // /a's database
	idA    string
	copyA  []byte // /a's database as itxd left it: the backup a restore copies back
	copyDB []byte // directory.db as itxd left it
}

func populateForDamage(t *testing.T) damageFixture {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	p := startItxd(t, dir)
	ctx := ctxT(t)
	proj := dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
	mustAppend(t, stream(t, proj, "/a"), kibEvents(damageEvents, 0)...)
	mustAppend(t, stream(t, proj, "/b"), ev("t", `{}`))
	info, err := client.Describe(ctx, stream(t, proj, "/a"))
	require.NoError(t, err)
	require.NoError(t, p.stop(t))
	f := damageFixture{dir: dir, idA: info.StreamID, fileA: filepath.Join(dir, "streams", info.StreamID+".db")}
	for _, wal := range []string{f.fileA + "-wal", filepath.Join(dir, "directory.db-wal")} {
		_, err := os.Stat(wal)
		require.ErrorIs(t, err, os.ErrNotExist, "a clean stop checkpoints every database into its file")
	}
	f.copyA, err = os.ReadFile(f.fileA)
	require.NoError(t, err)
	f.copyDB, err = os.ReadFile(filepath.Join(dir, "directory.db"))
	require.NoError(t, err)
	return f
}

// overwrite writes n bytes of 0xA5 at off in file.
func overwrite(t *testing.T, file string, off int64, n int) {
	t.Helper()
	fd, err := os.OpenFile(file, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer fd.Close()
	_, err = fd.WriteAt([]byte(strings.Repeat("\xa5", n)), off)
	require.NoError(t, err)
}

// requireOthersServed checks that the undamaged streams of the project read and take appends,
// and that a new stream is made.
func requireOthersServed(t *testing.T, proj schema.Project) {
	t.Helper()
	ctx := ctxT(t)
	b := stream(t, proj, "/b")
	events, err := client.ReadAll(ctx, b, itx.Query{})
	require.NoError(t, err, "/b reads")
	require.Len(t, events, 1)
	res, err := client.Append(ctx, b, []itx.EventInput{ev("t", `{}`)}, itx.AppendOptions{})
	require.NoError(t, err, "/b takes appends")
	require.Equal(t, []int64{2}, res.Offsets)
	res, err = client.Append(ctx, stream(t, proj, "/new"), []itx.EventInput{ev("t", `{}`)}, itx.AppendOptions{})
	require.NoError(t, err, "a new stream is made")
	require.Equal(t, []int64{1}, res.Offsets)
}

// requireUnavailableNaming asserts err is unavailable and names what.
func requireUnavailableNaming(t *testing.T, err error, what string) {
	t.Helper()
	requireCode(t, err, itx.EUnavailable)
	require.Contains(t, err.Error(), what)
}

// requireLogged waits until itxd's log matches pattern: what it wrote reaches the buffer through
// exec's copying goroutine, after the call that made it write has answered.
func requireLogged(t *testing.T, p *itxdProcess, pattern, what string) {
	t.Helper()
	requireLoggedWithin(t, p, pattern, what, 20*time.Second)
}

// requireLoggedWithin is requireLogged waiting up to within.
func requireLoggedWithin(t *testing.T, p *itxdProcess, pattern, what string, within time.Duration) {
	t.Helper()
	re := regexp.MustCompile(pattern)
	require.Eventually(t, func() bool { return re.MatchString(p.logs.String()) }, within, time.Millisecond, what)
}

// requireRestored stops p, copies /a's database back from the fixture's copy, starts itxd again
// and checks /a holds every acknowledged event at its offset: nothing was made anew over it.
func requireRestored(t *testing.T, p *itxdProcess, f damageFixture) {
	t.Helper()
	require.NoError(t, p.stop(t))
	for _, name := range []string{f.fileA + "-wal", f.fileA + "-shm"} {
		require.NoError(t, os.RemoveAll(name))
	}
	require.NoError(t, os.WriteFile(f.fileA, f.copyA, 0o600))
	p = startItxd(t, f.dir)
	ctx := ctxT(t)
	a := stream(t, dial(t, p.addr).Login(ctx, p.creds.ProjectToken), "/a")
	events, err := client.ReadAll(ctx, a, itx.Query{})
	require.NoError(t, err, "/a reads once its file is restored")
	require.Len(t, events, damageEvents)
	for i, e := range events {
		require.Equal(t, int64(i+1), e.Offset)
		require.Equal(t, i, kibSeq(t, e))
	}
	res, err := client.Append(ctx, a, []itx.EventInput{ev("t", `{}`)}, itx.AppendOptions{})
	require.NoError(t, err)
	require.Equal(t, []int64{damageEvents + 1}, res.Offsets, "offsets go on from the restored head")
}

// TestStorageDamage_StreamFileUnreadable: a stream's database overwritten at its header, cut to
// half, emptied or deleted while itxd was stopped. itxd starts; every call on the stream
// (describe, reads, appends, subscriptions.list) answers unavailable naming its file, and itxd
// logs it; the stream is still listed; the other streams read and take appends. It is never
// made anew empty (an emptied or deleted file was: describe said head 0 and the next append
// took offset 1 again), and once its file is restored every event is there.
func TestStorageDamage_StreamFileUnreadable(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, file string)
	}{
		{"header overwritten", func(t *testing.T, file string) { overwrite(t, file, 0, 100) }},
		{"cut to half", func(t *testing.T, file string) {
			fi, err := os.Stat(file)
			require.NoError(t, err)
			require.NoError(t, os.Truncate(file, fi.Size()/2))
		}},
		{"emptied", func(t *testing.T, file string) { require.NoError(t, os.Truncate(file, 0)) }},
		{"deleted", func(t *testing.T, file string) { require.NoError(t, os.Remove(file)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := populateForDamage(t)
			tc.damage(t, f.fileA)
			p := startItxd(t, f.dir)
			ctx := ctxT(t)
			proj := dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
			a := stream(t, proj, "/a")
			file := filepath.Base(f.fileA)

			_, err := client.Describe(ctx, a)
			requireUnavailableNaming(t, err, file)
			_, err = client.ReadAll(ctx, a, itx.Query{})
			requireUnavailableNaming(t, err, file)
			_, err = client.Append(ctx, a, []itx.EventInput{ev("t", `{}`)}, itx.AppendOptions{})
			requireUnavailableNaming(t, err, file)
			subs := client.Subscriptions(ctx, a)
			_, err = client.ListSubscriptions(ctx, subs)
			subs.Release()
			requireUnavailableNaming(t, err, file)
			list, err := client.ListStreams(ctx, proj, "/a")
			require.NoError(t, err)
			require.Len(t, list, 1, "the damaged stream is still listed")
			require.Equal(t, int64(damageEvents), list[0].HeadOffset)

			requireOthersServed(t, proj)
			requireLogged(t, p, regexp.QuoteMeta(file), "itxd logs the damaged file")
			requireRestored(t, p, f)
		})
	}
}

// TestStorageDamage_StreamFileLostAfterACrash: itxd killed (-9) with a stream loaded, its
// database then deleted. The start that follows refreshes the summaries of the streams that
// were loaded, and it dropped this one's directory entry as a creation cut short (nothing left
// to say the stream had existed; the next append made it anew from offset 1). It stays listed
// and refused until its file is restored.
func TestStorageDamage_StreamFileLostAfterACrash(t *testing.T) {
	f := populateForDamage(t)
	p := startItxd(t, f.dir)
	ctx := ctxT(t)
	// An append marks the stream's summary stale: the next start reads its database. The
	// restore below brings back the file as it was before it (a backup older than the append).
	mustAppend(t, stream(t, dial(t, p.addr).Login(ctx, p.creds.ProjectToken), "/a"), ev("t", `{}`))
	p.kill9(t)
	for _, name := range []string{f.fileA, f.fileA + "-wal", f.fileA + "-shm"} {
		require.NoError(t, os.RemoveAll(name))
	}

	p = startItxd(t, f.dir)
	proj := dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
	list, err := client.ListStreams(ctx, proj, "/a")
	require.NoError(t, err)
	require.Len(t, list, 1, "the stream is still listed")
	requireLogged(t, p, regexp.QuoteMeta(filepath.Base(f.fileA)), "itxd logs the lost file at start")
	_, err = client.Append(ctx, stream(t, proj, "/a"), []itx.EventInput{ev("t", `{}`)}, itx.AppendOptions{})
	requireUnavailableNaming(t, err, filepath.Base(f.fileA))
	requireOthersServed(t, proj)
	requireRestored(t, p, f)
}

// TestStorageDamage_StreamFileDeletedWhileUnloaded: a stream unloaded for being idle, its
// database deleted while itxd runs: loading it again is refused (unavailable, naming the file),
// not a new empty stream.
func TestStorageDamage_StreamFileDeletedWhileUnloaded(t *testing.T) {
	f := populateForDamage(t)
	p := startItxd(t, f.dir, "--idle-timeout", "20ms")
	ctx := ctxT(t)
	proj := dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
	a := stream(t, proj, "/a")
	_, err := client.Describe(ctx, a)
	require.NoError(t, err)
	waitUntil(t, "/a unloads", func() bool {
		list, err := client.ListStreams(ctx, proj, "/a")
		require.NoError(t, err)
		_, statErr := os.Stat(f.fileA + "-wal")
		return len(list) == 1 && !list[0].Loaded && os.IsNotExist(statErr)
	})
	require.NoError(t, os.Remove(f.fileA))

	_, err = client.Describe(ctx, a)
	requireUnavailableNaming(t, err, filepath.Base(f.fileA))
	_, err = client.Append(ctx, a, []itx.EventInput{ev("t", `{}`)}, itx.AppendOptions{})
	requireUnavailableNaming(t, err, filepath.Base(f.fileA))
	requireOthersServed(t, proj)
	requireRestored(t, p, f)
}

// TestStorageDamage_StreamPageOverwritten: a page in the middle of a stream's events overwritten
// while itxd was stopped. The stream loads (its head and catalog are elsewhere in the file);
// reads short of the page are served, and a read that meets it answers unavailable naming the
// file (it answered internal, naming nothing), and itxd logs it. Other streams go on.
func TestStorageDamage_StreamPageOverwritten(t *testing.T) {
	f := populateForDamage(t)
	fi, err := os.Stat(f.fileA)
	require.NoError(t, err)
	pages := fi.Size() / 4096
	// The events are the file's last pages (the schema's come first): the one three quarters in.
	overwrite(t, f.fileA, pages*3/4*4096, 4096)
	p := startItxd(t, f.dir)
	ctx := ctxT(t)
	proj := dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
	a := stream(t, proj, "/a")
	info, err := client.Describe(ctx, a)
	require.NoError(t, err)
	require.Equal(t, int64(damageEvents), info.HeadOffset)
	first, err := client.GetEvents(ctx, a, itx.Query{Limit: 1})
	require.NoError(t, err, "the first event is on an intact page")
	require.Len(t, first, 1)

	// A subscription that must deliver across the page retries it as an outage, its lastError
	// saying why, and itxd logs the stream (by path: a read knows only its id).
	subs := client.Subscriptions(ctx, a)
	defer subs.Release()
	_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "copy",
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/copy"}})
	require.NoError(t, err)
	waitUntil(t, "the subscription meets the damaged page", func() bool {
		list, err := client.ListSubscriptions(ctx, subs)
		require.NoError(t, err)
		return len(list) == 1 && strings.Contains(list[0].LastError, "malformed")
	})
	require.Equal(t, itx.StatusActive, mustListSubscriptions(t, subs)[0].Status, "an outage: retried, not halted")
	requireLogged(t, p, regexp.QuoteMeta(filepath.Base(f.fileA)+" path=/a "), "itxd logs the stream its delivery found damaged")

	_, err = client.ReadAll(ctx, a, itx.Query{})
	requireUnavailableNaming(t, err, filepath.Base(f.fileA))
	requireOthersServed(t, proj)
	requireLogged(t, p, regexp.QuoteMeta(filepath.Base(f.fileA)), "itxd logs the damaged file")
	requireRestored(t, p, f)
}

func mustListSubscriptions(t *testing.T, subs schema.Subscriptions) []itx.SubscriptionSummary {
	t.Helper()
	list, err := client.ListSubscriptions(ctxT(t), subs)
	require.NoError(t, err)
	return list
}

// TestStorageDamage_DirectoryDatabase: the data directory's own database (projects, tokens, the
// streams' entries) damaged or lost while itxd was stopped: itxd refuses to start, saying which
// file and what to do, and writes nothing (credentials.json as it was). Lost (deleted or
// emptied) it started as on a fresh directory: new tokens over credentials.json, every stream
// unreachable. Once the file is restored itxd starts and serves every stream.
func TestStorageDamage_DirectoryDatabase(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, file string)
		says   string
	}{
		{"header overwritten", func(t *testing.T, file string) { overwrite(t, file, 0, 100) }, "is damaged"},
		{"cut to half", func(t *testing.T, file string) {
			fi, err := os.Stat(file)
			require.NoError(t, err)
			require.NoError(t, os.Truncate(file, fi.Size()/2))
		}, "is damaged"},
		{"emptied", func(t *testing.T, file string) { require.NoError(t, os.Truncate(file, 0)) }, "missing or empty"},
		{"deleted", func(t *testing.T, file string) { require.NoError(t, os.Remove(file)) }, "missing or empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := populateForDamage(t)
			file := filepath.Join(f.dir, "directory.db")
			creds, err := os.ReadFile(filepath.Join(f.dir, "credentials.json"))
			require.NoError(t, err)
			tc.damage(t, file)

			addr, exited, log := tryStartItxd(t, f.dir)
			require.Empty(t, addr, "itxd started on a damaged directory database")
			require.Error(t, exited)
			require.Contains(t, log, file)
			require.Contains(t, log, tc.says)
			require.Contains(t, log, "backup")
			after, err := os.ReadFile(filepath.Join(f.dir, "credentials.json"))
			require.NoError(t, err)
			require.Equal(t, string(creds), string(after), "credentials.json untouched")

			require.NoError(t, os.WriteFile(file, f.copyDB, 0o600))
			p := startItxd(t, f.dir)
			ctx := ctxT(t)
			proj := dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
			events, err := client.ReadAll(ctx, stream(t, proj, "/a"), itx.Query{})
			require.NoError(t, err)
			require.Len(t, events, damageEvents)
			requireOthersServed(t, proj)
		})
	}
}

// TestStorageDamage_Backup: a backup of a data directory holding a damaged stream fails, writing
// nothing at its path, and names the stream's file: a file that is not a database (it did), and
// a file missing while the directory records events on the stream (the backup succeeded without
// it: a copy counted good, whose restore lacks the stream, that scheduled backups would keep in
// place of the last one holding it). Once the file is restored the backup holds every stream.
func TestStorageDamage_Backup(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, file string)
	}{
		{"header overwritten", func(t *testing.T, file string) { overwrite(t, file, 0, 100) }},
		{"deleted", func(t *testing.T, file string) { require.NoError(t, os.Remove(file)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := populateForDamage(t)
			tc.damage(t, f.fileA)
			p := startItxd(t, f.dir)
			ctx := ctxT(t)
			admin := client.Admin(ctx, dial(t, p.addr).Login(ctx, p.creds.DeploymentToken))
			dest := filepath.Join(t.TempDir(), "backup")
			_, err := client.Backup(ctx, admin, dest)
			requireUnavailableNaming(t, err, filepath.Base(f.fileA))
			_, statErr := os.Stat(dest)
			require.ErrorIs(t, statErr, os.ErrNotExist, "a failed backup leaves nothing at its path")

			require.NoError(t, p.stop(t))
			require.NoError(t, os.WriteFile(f.fileA, f.copyA, 0o600))
			p = startItxd(t, f.dir)
			admin = client.Admin(ctx, dial(t, p.addr).Login(ctx, p.creds.DeploymentToken))
			_, err = client.Backup(ctx, admin, dest)
			require.NoError(t, err)
			got, err := os.ReadFile(filepath.Join(dest, "streams", filepath.Base(f.fileA)))
			require.NoError(t, err, "the backup holds the restored stream")
			require.NotEmpty(t, got)
		})
	}
}

func (ff *faultFile) PassthroughFd() (int, bool) {
	if ff.f.noPassthrough.Load() {
		return 0, false
	}
	return ff.LoopbackFile.PassthroughFd()
}

func (ff *faultFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if ff.f.readOnly.Load() {
		return 0, syscall.EROFS
	}
	return ff.LoopbackFile.Write(ctx, data, off)
}

func (ff *faultFile) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
	if ff.f.readOnly.Load() {
		return 0, syscall.EROFS
	}
	return ff.LoopbackFile.Writev(ctx, data, off)
}

func (ff *faultFile) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if ff.f.readOnly.Load() {
		return syscall.EROFS
	}
	return ff.LoopbackFile.Setattr(ctx, in, out)
}

func (n *faultNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if n.f.readOnly.Load() {
		return syscall.EROFS
	}
	return n.LoopbackNode.Setattr(ctx, fh, in, out)
}

func (n *faultNode) Unlink(ctx context.Context, name string) syscall.Errno {
	if n.f.readOnly.Load() {
		return syscall.EROFS
	}
	return n.LoopbackNode.Unlink(ctx, name)
}

// TestStorageDamage_ReadOnlyFileSystem: the data directory's file system turns read-only under a
// running itxd (as the kernel remounts one on an error; a tmpfs cannot be remounted read-only
// while itxd holds files open for writing, so the FUSE loopback of fsyncfail_test.go answers
// EROFS). Appends, to loaded and new streams, are refused with unavailable and none is
// acknowledged; reads and describe are served; once the file system is writable again the same
// process takes appends from the last acknowledged offset, and after a kill -9 every acknowledged
// event is there and nothing refused.
func TestStorageDamage_ReadOnlyFileSystem(t *testing.T) {
	mnt, f := mountFaulty(t)
	f.noPassthrough.Store(true)
	data := filepath.Join(mnt, "data")
	p := startItxd(t, data)
	ctx := ctxT(t)
	l := newAckLog(t, dial(t, p.addr).Login(ctx, p.creds.ProjectToken))
	require.True(t, l.append("/a", 3))
	require.True(t, l.append("/b", 1))

	f.readOnly.Store(true)
	for i := range 6 {
		path := []string{"/a", "/b", "/new"}[i%3]
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := client.Append(cctx, l.stream(path), kibEvents(1, 1_000_000+i), itx.AppendOptions{})
		cancel()
		require.Error(t, err, "%s: an append acknowledged on a read-only file system", path)
		requireUnavailableNaming(t, err, "read-only file system")
	}
	for _, path := range []string{"/a", "/b"} {
		events, err := client.ReadAll(ctx, l.stream(path), itx.Query{})
		require.NoError(t, err, "%s reads on a read-only file system", path)
		require.Equal(t, l.seqs[path], kibSeqs(t, events))
		info, err := client.Describe(ctx, l.stream(path))
		require.NoError(t, err)
		require.Equal(t, l.head[path], info.HeadOffset)
	}

	f.readOnly.Store(false)
	require.True(t, l.append("/a", 2), "appends once the file system is writable")
	require.True(t, l.append("/b", 1))
	require.True(t, l.append("/new", 1), "a new stream once the file system is writable")
	l.check()
	p = l.restart(p, data)
	l.check()
}

// startItxdWithoutDACOverride starts itxd on dataDir as startItxd does, but unable to bypass
// file modes when the tests run as root (setpriv drops CAP_DAC_OVERRIDE and
// CAP_DAC_READ_SEARCH from its bounding set): a file chmod 000 is then unreadable to it, as to
// the unprivileged user itxd runs as in production. Skips where root has no setpriv.
func startItxdWithoutDACOverride(t *testing.T, dataDir string, extra ...string) *itxdProcess {
	t.Helper()
	if os.Getuid() != 0 {
		return startItxd(t, dataDir, extra...)
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("running as root without setpriv (util-linux): root reads a file chmod 000, so the test cannot make one unreadable to itxd")
	}
	wrapper := filepath.Join(t.TempDir(), "itxd-no-dac")
	script := "#!/bin/sh\nexec " + setpriv + " --bounding-set -dac_override,-dac_read_search --inh-caps -dac_override,-dac_read_search " + itxdBin + ` "$@"` + "\n"
	require.NoError(t, os.WriteFile(wrapper, []byte(script), 0o700))
	return startItxdBin(t, wrapper, nil, dataDir, extra...)
}

// TestStorageDamage_StreamFileUnreadableByItxd: a stream's database made unreadable to itxd
// (chmod 000) while it was stopped, and again while it ran with the stream unloaded: the
// stream's calls answer unavailable naming its file, itxd logs it, other streams are served, and
// nothing is made anew; once the mode is back the same process serves every event.
func TestStorageDamage_StreamFileUnreadableByItxd(t *testing.T) {
	f := populateForDamage(t)
	require.NoError(t, os.Chmod(f.fileA, 0))
	p := startItxdWithoutDACOverride(t, f.dir, "--idle-timeout", "20ms")
	ctx := ctxT(t)
	proj := dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
	a := stream(t, proj, "/a")
	file := filepath.Base(f.fileA)
	requireRefusedThenServed := func(when string) {
		t.Helper()
		_, err := client.Describe(ctx, a)
		requireUnavailableNaming(t, err, file)
		_, err = client.Append(ctx, a, []itx.EventInput{ev("t", `{}`)}, itx.AppendOptions{})
		requireUnavailableNaming(t, err, file)
		requireLogged(t, p, regexp.QuoteMeta(file), when+": itxd logs the file it cannot open")
		require.NoError(t, os.Chmod(f.fileA, 0o600))
		events, err := client.ReadAll(ctx, a, itx.Query{})
		require.NoError(t, err, "%s: served once readable", when)
		require.Len(t, events, damageEvents, when)
		require.Equal(t, int64(damageEvents), events[len(events)-1].Offset, when)
	}
	requireRefusedThenServed("chmod while stopped")
	requireOthersServed(t, proj)

	waitUntil(t, "/a unloads", func() bool {
		list, err := client.ListStreams(ctx, proj, "/a")
		require.NoError(t, err)
		_, statErr := os.Stat(f.fileA + "-wal")
		return len(list) == 1 && !list[0].Loaded && os.IsNotExist(statErr)
	})
	require.NoError(t, os.Chmod(f.fileA, 0))
	requireRefusedThenServed("chmod while unloaded")
}

// TestStorageDamage_DeleteUnreadable: a stream whose database is damaged or lost cannot be
// read, so it could not be deleted either (the delete loads it first): with no backup its path
// answered unavailable for good. Not forced, the delete is refused, saying how to delete it, and
// deletes nothing; forced, the stream is deleted unread: gone from the listing, its files
// removed, the audit record saying unread with the head its directory entry last recorded, and
// the next append to its path starts a new stream at offset 1, after a restart too.
func TestStorageDamage_DeleteUnreadable(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, file string)
	}{
		{"header overwritten", func(t *testing.T, file string) { overwrite(t, file, 0, 100) }},
		{"deleted", func(t *testing.T, file string) { require.NoError(t, os.Remove(file)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := populateForDamage(t)
			tc.damage(t, f.fileA)
			p := startItxd(t, f.dir)
			ctx := ctxT(t)
			proj := dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
			file := filepath.Base(f.fileA)

			root := dial(t, p.addr).Login(ctx, p.creds.DeploymentToken)
			_, err := client.Backup(ctx, client.Admin(ctx, root), filepath.Join(t.TempDir(), "refused"))
			requireUnavailableNaming(t, err, file)
			_, err = client.DeleteStream(ctx, proj, "/a", false)
			requireCode(t, err, itx.EFailedPrecondition)
			require.Contains(t, err.Error(), file, "the refusal names the file")
			require.Contains(t, err.Error(), "by forcing", "the refusal says how to delete it")
			list, err := client.ListStreams(ctx, proj, "/a")
			require.NoError(t, err)
			require.Len(t, list, 1, "refused: nothing deleted")

			gone, err := client.DeleteStream(ctx, proj, "/a", true)
			require.NoError(t, err, "forced, a damaged stream is deleted")
			require.Equal(t, client.DeletedStream{StreamID: f.idA, HeadOffset: damageEvents, Unread: true}, gone)
			requireStreamFilesGone(t, f.dir, f.idA)
			list, err = client.ListStreams(ctx, proj, "/a")
			require.NoError(t, err)
			require.Empty(t, list)
			recs := auditedDeletions(t, root)
			require.Len(t, recs, 1)
			require.Equal(t, f.idA, recs[0]["streamId"])
			require.Equal(t, true, recs[0]["unread"])
			require.Equal(t, float64(damageEvents), recs[0]["headOffset"])
			require.Contains(t, recs[0]["cause"], file)

			res, err := client.Append(ctx, stream(t, proj, "/a"), []itx.EventInput{ev("t", `{}`)}, itx.AppendOptions{})
			require.NoError(t, err, "the path takes a new stream")
			require.Equal(t, []int64{1}, res.Offsets)
			requireOthersServed(t, proj)
			// Every backup failed while the stream was there (TestStorageDamage_Backup): its
			// deletion is the way out when no backup holds it.
			dest := filepath.Join(t.TempDir(), "backup")
			_, err = client.Backup(ctx, client.Admin(ctx, root), dest)
			require.NoError(t, err, "backups succeed once the damaged stream is deleted")
			require.NoFileExists(t, filepath.Join(dest, "streams", file))

			require.NoError(t, p.stop(t))
			p = startItxd(t, f.dir)
			proj = dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
			info, err := client.Describe(ctx, stream(t, proj, "/a"))
			require.NoError(t, err)
			require.NotEqual(t, f.idA, info.StreamID)
			require.Equal(t, int64(1), info.HeadOffset)
			requireStreamFilesGone(t, f.dir, f.idA)
		})
	}
}

// TestStorageDamage_DeleteProjectWithUnreadableStream: a forced delete of a project one of whose
// streams has a damaged database deletes the project and every stream's files (it failed
// unavailable, reading the damaged stream's pending audit records, and could never succeed);
// its audit record names the stream deleted unread.
func TestStorageDamage_DeleteProjectWithUnreadableStream(t *testing.T) {
	f := populateForDamage(t)
	overwrite(t, f.fileA, 0, 100)
	p := startItxd(t, f.dir)
	ctx := ctxT(t)
	proj := dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
	info, err := client.Describe(ctx, stream(t, proj, "/b"))
	require.NoError(t, err)
	root := dial(t, p.addr).Login(ctx, p.creds.DeploymentToken)
	require.NoError(t, client.DeleteProject(ctx, client.Admin(ctx, root), p.creds.ProjectID, true))
	requireStreamFilesGone(t, f.dir, f.idA)
	requireStreamFilesGone(t, f.dir, info.StreamID)
	recs := audited(t, root, server.AuditProjectDeleted)
	require.Len(t, recs, 1)
	require.Equal(t, []any{"/a"}, recs[0]["unread"])
}

// TestStorageDamage_AlarmOfUnreadableStream: a stream whose database is missing while its alarm
// (a scheduled append) is due is tried at every wake-up of any stream's alarm, and each logged
// "waking a stream for its alarm" at error level: a line per wake-up for as long as the file
// stayed lost. It is logged once (noteDamaged), and its alarm is kept: once the file is back,
// with no restart, the next wake-up loads it and the scheduled append lands.
func TestStorageDamage_AlarmOfUnreadableStream(t *testing.T) {
	f := populateForDamage(t)
	ctx := ctxT(t)
	// The scheduled append must still be owed when itxd stops: a stop that took longer than
	// the wait (a loaded machine) let it land, and nothing was due at the next start. Taken
	// again, with a longer wait and a key of its own (the landed one's key would schedule
	// nothing), until the stop came first; owedHead is /a's head once the owed one lands. The
	// one before is cancelled first: the stop may have come before it landed, and it would
	// land at a load, moving the head.
	var owedHead int64
	var owedDue time.Time
	for n, wait := 0, 500*time.Millisecond; ; n, wait = n+1, wait*4 {
		p := startItxd(t, f.dir)
		proj := dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
		a := stream(t, proj, "/a")
		if n > 0 {
			_, err := client.CancelScheduled(ctx, a, fmt.Sprint("due", n-1))
			require.NoError(t, err)
		}
		info, err := client.Describe(ctx, a)
		require.NoError(t, err)
		due := time.Now().Add(wait)
		_, _, err = client.Schedule(ctx, a, keyed("due", `{}`, fmt.Sprint("due", n)), due)
		require.NoError(t, err)
		require.NoError(t, p.stop(t))
		if time.Now().Before(due) {
			owedHead, owedDue = info.HeadOffset+1, due
			break
		}
		require.Less(t, wait, 30*time.Second, "itxd never stopped before the scheduled append was due")
	}
	away := f.fileA + ".away"
	require.NoError(t, os.Rename(f.fileA, away))

	// /b unloads between its scheduled appends, so each lands from an alarm's wake-up.
	p := startItxd(t, f.dir, "--idle-timeout", "20ms")
	proj := dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
	b := stream(t, proj, "/b")
	const wakes = 4
	for i := range wakes {
		_, _, err := client.Schedule(ctx, b, keyed("tick", `{}`, fmt.Sprint("tick", i)), time.Now().Add(time.Duration(i+1)*200*time.Millisecond))
		require.NoError(t, err)
	}
	waitUntil(t, "/b's scheduled appends land", func() bool {
		list, err := client.ListStreams(ctx, proj, "/b")
		require.NoError(t, err)
		return len(list) == 1 && list[0].HeadOffset == 1+wakes
	})
	// Logged when /a's alarm is first tried: when it is due, or at /b's wake-ups after that.
	requireLoggedWithin(t, p, regexp.QuoteMeta(filepath.Base(f.fileA)), "itxd logs the lost file", time.Until(owedDue)+20*time.Second)
	logs := p.logs.String()
	require.Zero(t, strings.Count(logs, "waking a stream for its alarm"), "a wake-up logs the lost stream again:\n%s", logs)
	require.Equal(t, 1, strings.Count(logs, "a stream cannot be served from its database"), logs)

	require.NoError(t, os.Rename(away, f.fileA))
	// A tick of /b wakes the alarm loop only when /b unloaded before it was due (a loaded
	// stream appends its own): on a loaded machine it may not have, so ticks go on, each once
	// the one before landed, until /a's append lands.
	head := int64(1 + wakes)
	for i := 0; ; i++ {
		_, _, err := client.Schedule(ctx, b, keyed("tick", `{}`, fmt.Sprint("after", i)), time.Now().Add(300*time.Millisecond))
		require.NoError(t, err)
		head++
		waitUntil(t, "/b's tick lands", func() bool {
			list, err := client.ListStreams(ctx, proj, "/b")
			require.NoError(t, err)
			return len(list) == 1 && list[0].HeadOffset == head
		})
		list, err := client.ListStreams(ctx, proj, "/a")
		require.NoError(t, err)
		if len(list) == 1 && list[0].HeadOffset == owedHead {
			break
		}
		require.Less(t, i, 30, "/a's scheduled append never landed once its file was back")
	}
}

// TestStorageDamage_UnavailableInTheViews: an operator sees at a glance which streams itxd cannot
// serve. A stream whose file was lost while itxd was stopped is listed with unavailable naming
// its file once a call met it (it was listed as any unloaded stream, its summary's head and
// consumers, nothing amiss), itx_streams_unavailable counts it, and once its file is back, with
// no restart, the next load clears both.
func TestStorageDamage_UnavailableInTheViews(t *testing.T) {
	f := populateForDamage(t)
	away := f.fileA + ".away"
	require.NoError(t, os.Rename(f.fileA, away))
	metrics := freeAddr(t)
	p := startItxd(t, f.dir, "--metrics", metrics)
	ctx := ctxT(t)
	proj := dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
	list := func() map[string]itx.StreamInfo {
		all, err := client.ListStreams(ctx, proj, "/")
		require.NoError(t, err)
		out := map[string]itx.StreamInfo{}
		for _, i := range all {
			out[i.Path] = i
		}
		return out
	}
	require.Zero(t, scrapeMetric(t, metrics, "itx_streams_unavailable"))

	_, err := client.Describe(ctx, stream(t, proj, "/a"))
	requireUnavailableNaming(t, err, filepath.Base(f.fileA))
	got := list()
	require.Contains(t, got["/a"].Unavailable, filepath.Base(f.fileA), "the lost stream says why it is not served")
	require.Equal(t, int64(damageEvents), got["/a"].HeadOffset, "with the head its summary recorded")
	require.Empty(t, got["/b"].Unavailable, "another stream is served")
	require.Equal(t, 1.0, scrapeMetric(t, metrics, "itx_streams_unavailable"))

	require.NoError(t, os.Rename(away, f.fileA))
	_, err = client.Describe(ctx, stream(t, proj, "/a"))
	require.NoError(t, err, "served once its file is back")
	require.Empty(t, list()["/a"].Unavailable)
	require.Zero(t, scrapeMetric(t, metrics, "itx_streams_unavailable"))
}
