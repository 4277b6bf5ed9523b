package test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/stretchr/testify/require"
)

// A disk whose fsync fails (EIO) is what a dying disk, a thin-provisioned volume out of space or
// a network block device gone away look like to itxd: the write went to the page cache, and the
// kernel says it may never reach the disk. itxd must not acknowledge what it could not sync, and
// must keep every event it did acknowledge. These tests run a real itxd on a FUSE loopback file
// system served by the test, which passes every operation through to a directory except the
// ones told to fail.

// faults is what the loopback file system fails on, switched by the test while itxd runs.
type faults struct {
	fsync  atomic.Bool  // every fsync and fdatasync of a file answers EIO
	pct    atomic.Int64 // or this percentage of them, spread by a hash of their count
	fsyncs atomic.Int64 // fsyncs answered, failed or not
	failed atomic.Int64 // fsyncs failed
	// hang, while set, holds every fsync until it is closed (a disk that stopped answering);
	// hung counts the fsyncs it held.
	hang atomic.Pointer[chan struct{}]
	hung atomic.Int64
	// readOnly, while set, answers EROFS to every write, create, open for writing, truncate and
	// unlink: a file system the kernel remounted read-only under itxd (errors=remount-ro). Writes
	// reach it only for files opened while noPassthrough was set: otherwise the kernel (6.9+)
	// sends them straight to the file below.
	readOnly      atomic.Bool
	noPassthrough atomic.Bool
}

func (f *faults) failNext() bool {
	n := f.fsyncs.Add(1)
	if !f.fsync.Load() && (n*2654435761)%100 >= f.pct.Load() {
		return false
	}
	f.failed.Add(1)
	return true
}

type faultNode struct {
	fs.LoopbackNode
	f *faults
}

type faultFile struct {
	*fs.LoopbackFile
	f *faults
}

func (ff *faultFile) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	if h := ff.f.hang.Load(); h != nil {
		ff.f.hung.Add(1)
		<-*h
	}
	if ff.f.failNext() {
		return syscall.EIO
	}
	return ff.LoopbackFile.Fsync(ctx, flags)
}

func (n *faultNode) wrap(fh fs.FileHandle) fs.FileHandle {
	if lf, ok := fh.(*fs.LoopbackFile); ok {
		return &faultFile{LoopbackFile: lf, f: n.f}
	}
	return fh
}

func (n *faultNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if n.f.readOnly.Load() && flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		return nil, 0, syscall.EROFS
	}
	fh, fl, errno := n.LoopbackNode.Open(ctx, flags)
	return n.wrap(fh), fl, errno
}

func (n *faultNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if n.f.readOnly.Load() {
		return nil, nil, 0, syscall.EROFS
	}
	in, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	return in, n.wrap(fh), fl, errno
}

// mountFaulty mounts a loopback of a fresh directory at another one and returns the mount point
// and its switches; it skips the test where FUSE cannot be mounted (no /dev/fuse, or no right to
// mount). Unmounted when the test ends, after what it holds is gone (cleanups run last first).
func mountFaulty(t *testing.T) (string, *faults) {
	t.Helper()
	under, mnt := filepath.Join(t.TempDir(), "under"), filepath.Join(t.TempDir(), "mnt")
	require.NoError(t, os.Mkdir(under, 0o700))
	require.NoError(t, os.Mkdir(mnt, 0o700))
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(under, &st))
	f := &faults{}
	root := &fs.LoopbackRoot{Path: under, Dev: uint64(st.Dev)}
	root.NewNode = func(r *fs.LoopbackRoot, _ *fs.Inode, _ string, _ *syscall.Stat_t) fs.InodeEmbedder {
		return &faultNode{LoopbackNode: fs.LoopbackNode{RootData: r}, f: f}
	}
	root.RootNode = root.NewNode(root, nil, "", &st)
	srv, err := fs.Mount(mnt, root.RootNode, &fs.Options{MountOptions: fuse.MountOptions{
		DirectMountStrict: true, FsName: "itx-faulty", Name: "itxfaulty", AllowOther: false,
	}})
	if err != nil {
		t.Skipf("cannot mount a FUSE file system here (%v): these tests need /dev/fuse and root", err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Logf("unmount %s: %v", mnt, err)
		}
	})
	return mnt, f
}

// TestFsyncFails_NothingUnsyncedIsAcknowledged: while every fsync fails, no append is
// acknowledged (each is refused with a typed error, in bounded time) and itxd stays up, serving
// reads of what it acknowledged before; once fsyncs work again, appends continue from the last
// acknowledged offset, and every acknowledged event is there, exactly once and in order, after
// a kill -9 and a restart too.
func TestFsyncFails_NothingUnsyncedIsAcknowledged(t *testing.T) {
	mnt, f := mountFaulty(t)
	data := filepath.Join(mnt, "data")
	p := startItxd(t, data)
	ctx := ctxT(t)
	l := newAckLog(t, dial(t, p.addr).Login(ctx, p.creds.ProjectToken))
	require.True(t, l.append("/a", 3))
	require.True(t, l.append("/b", 1))
	require.Positive(t, f.fsyncs.Load(), "itxd's commits reach the loopback's fsync")

	for round := range 3 {
		f.fsync.Store(true)
		before := f.failed.Load()
		for i := range 4 {
			path := []string{"/a", "/b", fmt.Sprintf("/new/%d", round)}[i%3]
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := client.Append(cctx, l.stream(path), kibEvents(1, 1_000_000+10*round+i), itx.AppendOptions{})
			cancel()
			require.Error(t, err, "round %d: an append acknowledged while every fsync fails (%s)", round, path)
			requireCode(t, err, itx.EUnavailable) // nothing committed: retry once the disk works
		}
		require.Greater(t, f.failed.Load(), before, "round %d: the failure went through an fsync", round)
		_, err := client.Describe(ctx, l.stream("/a"))
		require.NoError(t, err, "round %d: describe while fsyncs fail", round)
		f.fsync.Store(false)
		require.True(t, l.append("/a", 2), "round %d: appends once fsyncs work", round)
		require.True(t, l.append("/b", 1), "round %d", round)
		require.True(t, l.append(fmt.Sprintf("/new/%d", round), 1), "round %d: a new stream", round)
		l.check()
	}

	p = l.restart(p, data)
	l.check()
	require.True(t, l.append("/a", 1))
	l.check()
}

// TestFsyncFails_SomeOfThem: a fifth of the fsyncs fail, spread over appends to several
// streams, new streams, a copy-to-stream subscription's deliveries and cursor writes and
// SQLite's checkpoints. Every append is acknowledged or refused with unavailable; the
// acknowledged ones are all there, in order, exactly once, before and after a kill -9 (after it,
// a refused append may be there too, whole: see adoptRefusedThatLanded); the copy ends up
// holding its source's events once, in order, once fsyncs work again.
func TestFsyncFails_SomeOfThem(t *testing.T) {
	mnt, f := mountFaulty(t)
	data := filepath.Join(mnt, "data")
	p := startItxd(t, data)
	ctx := ctxLong(t) // 300 appends through a FUSE file system and a restart: over 30 s under load
	l := newAckLog(t, dial(t, p.addr).Login(ctx, p.creds.ProjectToken))
	require.True(t, l.append("/src", 1))
	_, birth, err := client.ConfigureSubscription(ctx, client.Subscriptions(ctx, l.stream("/src")),
		client.SubscriptionConfig{Name: "copy", Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/copy"}})
	require.NoError(t, err)
	l.head["/src"] = birth

	f.pct.Store(20)
	refused := 0
	codes := map[itx.Code]int{}
	refusedGroups := map[string][][]int{}
	ackedAt := map[int]int64{} // kib seq -> the offset its append was acknowledged at
	for i := range 300 {
		path := []string{"/src", "/a", "/b", fmt.Sprintf("/new/%d", i/20)}[i%4]
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		base := l.next
		l.next += 1 + i%3
		res, err := client.Append(cctx, l.stream(path), kibEvents(1+i%3, base), itx.AppendOptions{})
		cancel()
		if err != nil {
			requireCode(t, err, itx.EUnavailable)
			group := make([]int, 1+i%3)
			for j := range group {
				group[j] = base + j
			}
			refusedGroups[path] = append(refusedGroups[path], group)
			refused++
			codes[itx.ErrorCode(err)]++
			continue
		}
		if h := l.head[path]; h > 0 {
			require.Equal(t, h+1, res.Offsets[0], "%s: an acknowledged append follows the last acknowledged offset", path)
		}
		for j := range 1 + i%3 {
			l.seqs[path] = append(l.seqs[path], base+j)
			ackedAt[base+j] = res.Offsets[j]
		}
		l.head[path] = res.Offsets[len(res.Offsets)-1]
	}
	t.Logf("%d of 300 appends refused, %d of %d fsyncs failed; refusals by code %v", refused, f.failed.Load(), f.fsyncs.Load(), codes)
	require.Positive(t, refused)
	require.Less(t, refused, 300)
	f.pct.Store(0)
	l.check()

	p = l.restart(p, data)
	// One more append (its offset is not checked: a refused append may land before it) and the
	// copy's catch-up, then the logs read back.
	res, err := client.Append(ctx, l.stream("/src"), kibEvents(1, 900_000), itx.AppendOptions{})
	require.NoError(t, err)
	l.seqs["/src"] = append(l.seqs["/src"], 900_000)
	_, err = client.WaitUntilProcessed(ctx, client.Subscription(ctx, l.stream("/src"), "copy"), res.Offsets[0], 30*time.Second)
	require.NoError(t, err)
	paths := map[string]bool{}
	for path := range l.head {
		paths[path] = true
	}
	for path := range refusedGroups {
		paths[path] = true
	}
	for path := range paths {
		adoptRefusedThatLanded(t, l, path, refusedGroups[path], ackedAt)
	}
	l.check()
	copied, err := client.ReadAll(ctx, l.stream("/copy"), itx.Query{})
	require.NoError(t, err)
	require.Equal(t, l.seqs["/src"], kibSeqs(t, copied), "the copy holds every event of its source once, in order")
}

// adoptRefusedThatLanded reads path's kib events after a crash: every acknowledged one must be
// there once and in order, and anything else must be a whole append that was refused with
// unavailable (a failed fsync leaves the commit's pages to the page cache: if no later commit
// overwrote them before the crash, SQLite's recovery reads them back, like an append whose
// acknowledgement was lost). The ack log adopts what landed, so later checks expect it.
func adoptRefusedThatLanded(t *testing.T, l *ackLog, path string, refused [][]int, ackedAt map[int]int64) {
	t.Helper()
	all, err := client.ReadAll(ctxT(t), l.stream(path), itx.Query{})
	require.NoError(t, err, path)
	var got []int
	for _, e := range all {
		if e.Type == "kib" {
			seq := kibSeq(t, e)
			got = append(got, seq)
			if at, ok := ackedAt[seq]; ok {
				require.Equal(t, at, e.Offset, "%s: kib event %d was acknowledged at offset %d and is at %d after the crash", path, seq, at, e.Offset)
			}
		}
	}
	groupOf := map[int][]int{}
	for _, g := range refused {
		for _, seq := range g {
			groupOf[seq] = g
		}
	}
	acked := l.seqs[path]
	for i := 0; i < len(got); {
		if len(acked) > 0 && got[i] == acked[0] {
			acked, i = acked[1:], i+1
			continue
		}
		g := groupOf[got[i]]
		require.NotNil(t, g, "%s: kib event %d was neither acknowledged nor refused with unavailable (log %v)", path, got[i], got)
		require.GreaterOrEqual(t, len(got)-i, len(g), "%s: a refused append landed in part (log %v)", path, got)
		require.Equal(t, g, got[i:i+len(g)], "%s: a refused append landed in part (log %v)", path, got)
		t.Logf("%s: the refused append of %v is in the log after the crash", path, g)
		delete(groupOf, g[0])
		i += len(g)
	}
	require.Empty(t, acked, "%s: acknowledged events missing after the crash (log %v)", path, got)
	l.seqs[path] = got
	if len(all) > 0 {
		l.head[path] = all[len(all)-1].Offset
	}
}
