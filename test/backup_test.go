package test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/storage"
	"github.com/stretchr/testify/require"
)

// backupAck is one append as a worker saw it: when it was sent and when it was acknowledged.
type backupAck struct {
	path        string
	offset      int64
	payload     string
	sent, acked time.Time
}

// A backup taken while appenders write to many streams (most of them not loaded, so they load
// while the copy is being written) and two streams copy into each other is one instant of the
// whole data directory: every append acknowledged before the call is in it, nothing stamped
// after its instant is, each stream holds a prefix of the live one, and itxd started on the copy
// finishes the copies between the streams with every event exactly once.
func TestBackup_CopyIsOneInstantUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	ctx := ctxLong(t)
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir, "--max-loaded-streams", "4")
	p := loginItxd(t, proc)
	a, b := stream(t, p, "/a"), stream(t, p, "/b")
	copyCycle(t, a, b)
	paths := []string{"/a", "/b"}
	for i := 0; i < 30; i++ {
		paths = append(paths, fmt.Sprintf("/many/%02d", i))
	}

	var mu sync.Mutex
	var acks []backupAck
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn := dial(t, proc.addr)
			wp := conn.Login(context.Background(), proc.creds.ProjectToken)
			defer wp.Release()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				path := paths[rng.IntN(len(paths))]
				s := client.Stream(context.Background(), wp, path)
				payload := fmt.Sprintf(`{"w":%d,"i":%d}`, w, i)
				sent := time.Now()
				res, err := client.Append(context.Background(), s, []itx.EventInput{ev("e", payload)}, itx.AppendOptions{})
				s.Release()
				if err != nil {
					t.Errorf("append to %s: %v", path, err)
					return
				}
				mu.Lock()
				acks = append(acks, backupAck{path: path, offset: res.Offsets[0], payload: payload, sent: sent, acked: time.Now()})
				mu.Unlock()
			}
		}()
	}
	// Under way: every stream has events, and itxd has unloaded most of them. Each append to a
	// stream not loaded loads it and unloads another (four of 32 loaded), some fsyncs each: on
	// a loaded 2-vCPU machine, the test under -race, the 600 took longer than waitUntil's 20 s
	// (and the backup's context, made before, would have run out soon after).
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acks) >= 600
	}, 90*time.Second, time.Millisecond, "appends under way")

	admin := rootAdmin(t, proc)
	dest := filepath.Join(t.TempDir(), "backup")
	called := time.Now()
	res, err := client.Backup(ctx, admin, dest)
	returned := time.Now()
	require.NoError(t, err)
	// Appends go on after it: the copy holds none of them.
	waitUntil(t, "appends after the backup", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return acks[len(acks)-1].sent.After(returned.Add(50 * time.Millisecond))
	})
	close(stop)
	wg.Wait()
	require.Equal(t, dest, res.Path)
	require.Greater(t, res.Streams, len(paths)-1)
	require.Greater(t, res.Bytes, int64(0))
	t.Logf("backup: %d streams, %d bytes, frozen %s", res.Streams, res.Bytes, res.Frozen)

	// The live server's logs, read before it stops: the backups' copies must be prefixes of them.
	live := map[string][]itx.Event{}
	for _, path := range paths {
		s := stream(t, p, path)
		events, err := client.ReadAll(ctx, s, itx.Query{})
		require.NoError(t, err)
		live[path] = events
	}
	require.NoError(t, proc.stop(t))

	// Nothing but the copy is left beside it (the temporary folder was renamed).
	entries, err := os.ReadDir(filepath.Dir(dest))
	require.NoError(t, err)
	require.Len(t, entries, 1)

	// The copy as written, read from its files: an itxd started on it goes on delivering (the
	// copies between /a and /b) and would append past what the backup holds.
	atMs := itx.UnixMilli(res.At)
	held := map[string]map[int64]itx.Event{}
	for _, path := range paths {
		events := readBackupStream(t, dest, proc.creds.ProjectID, path)
		held[path] = map[int64]itx.Event{}
		require.LessOrEqual(t, len(events), len(live[path]), path)
		for i, e := range events {
			require.Equal(t, live[path][i].Offset, e.Offset, path)
			require.Equal(t, live[path][i].Type, e.Type, path)
			require.JSONEq(t, string(live[path][i].Payload), string(e.Payload), path)
			require.LessOrEqual(t, e.CreatedAt, atMs, "%s offset %d was stamped after the backup's instant", path, e.Offset)
			held[path][e.Offset] = e
		}
	}
	copiedAfter := 0
	for _, k := range acks {
		e, ok := held[k.path][k.offset]
		if k.acked.Before(called) {
			require.True(t, ok, "%s offset %d was acknowledged before the backup and is not in it", k.path, k.offset)
		}
		if k.sent.After(returned) {
			require.False(t, ok, "%s offset %d was sent after the backup and is in it", k.path, k.offset)
			copiedAfter++
		}
		if ok {
			require.JSONEq(t, k.payload, string(e.Payload))
		}
	}
	require.Greater(t, copiedAfter, 0)

	// The copies between /a and /b finish on the restored server, each event once.
	restored := startItxd(t, dest)
	rp := loginItxd(t, restored)
	ra, rb := stream(t, rp, "/a"), stream(t, rp, "/b")
	waitCopyCycle(t, ra, rb)
	for _, pair := range [][2]schema.Stream{{ra, rb}, {rb, ra}} {
		src, err := client.ReadAll(ctx, pair[0], itx.Query{Types: []string{"e"}})
		require.NoError(t, err)
		dst, err := client.ReadAll(ctx, pair[1], itx.Query{Types: []string{"e"}})
		require.NoError(t, err)
		copies := map[int64]int{}
		for _, e := range dst {
			if len(e.Provenance) > 0 {
				copies[e.Provenance[len(e.Provenance)-1].Offset]++
			}
		}
		for _, e := range src {
			if len(e.Provenance) == 0 { // appended there, not itself a copy
				require.Equal(t, 1, copies[e.Offset], "offset %d copied %d times", e.Offset, copies[e.Offset])
			}
		}
	}
}

// A backup is the deployment root's, to a new absolute path outside the data directory; every
// refusal is typed and leaves nothing behind.
func TestBackup_Refusals(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	ctx := ctxT(t)
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	p := loginItxd(t, proc)
	mustAppend(t, stream(t, p, "/a"), ev("e", `{}`))
	parent := t.TempDir()

	_, err := client.Backup(ctx, client.Admin(ctx, p), filepath.Join(parent, "x"))
	requireCode(t, err, itx.EPermissionDenied)

	admin := rootAdmin(t, proc)
	existing := filepath.Join(parent, "exists")
	require.NoError(t, os.Mkdir(existing, 0o700))
	for _, c := range []struct {
		path string
		code itx.Code
	}{
		{"relative/x", itx.EInvalid},
		{"", itx.EInvalid},
		{existing, itx.EFailedPrecondition},
		{filepath.Join(parent, "no", "such"), itx.EFailedPrecondition},
		{filepath.Join(dataDir, "streams", "x"), itx.EInvalid},
		{filepath.Join(dataDir, "x"), itx.EInvalid},
	} {
		_, err := client.Backup(ctx, admin, c.path)
		requireCode(t, err, c.code)
	}
	entries, err := os.ReadDir(parent)
	require.NoError(t, err)
	require.Len(t, entries, 1) // "exists" alone

	// And one that works, recorded in the deployment's audit stream.
	res, err := client.Backup(ctx, admin, filepath.Join(parent, "ok"))
	require.NoError(t, err)
	require.Equal(t, 1, res.Streams)
	root := dial(t, proc.addr).Login(ctx, proc.creds.DeploymentToken)
	audit := stream(t, root, "/audit")
	waitUntil(t, "the backup audited", func() bool {
		events, err := client.ReadAll(ctx, audit, itx.Query{Types: []string{"admin/backup-written"}})
		require.NoError(t, err)
		if len(events) != 1 {
			return false
		}
		var rec struct {
			Path    string `json:"path"`
			Streams int    `json:"streams"`
		}
		require.NoError(t, json.Unmarshal(events[0].Payload, &rec))
		return rec.Path == filepath.Join(parent, "ok") && rec.Streams == 1
	})
}

// kill -9 in the middle of a backup (while the streams stand still for its instant, and once it
// has copied a stream) loses nothing acknowledged, leaves nothing at the destination, and the
// restarted itxd backs up to the same path.
func TestBackup_Kill9DuringABackup(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	for _, point := range []string{"backup-frozen", "backup-copied-one"} {
		t.Run(point, func(t *testing.T) {
			dataDir := t.TempDir()
			// The first start builds itxd with the kill points, which under load took most of
			// a 30 s context made before it: the backup then answered cancelled, never froze,
			// and itxd did not die. Each call's context is made when the call is.
			proc := startItxdKilledAt(t, dataDir, point)
			p := loginItxd(t, proc)
			want := map[string]int{}
			for i := 0; i < 6; i++ {
				path := fmt.Sprintf("/s/%d", i)
				s := stream(t, p, path)
				for j := 0; j <= i; j++ {
					mustAppend(t, s, keyed("e", fmt.Sprintf(`{"j":%d}`, j), fmt.Sprintf("k%d", j)))
				}
				want[path] = i + 1
			}
			admin := rootAdmin(t, proc)
			parent := t.TempDir()
			dest := filepath.Join(parent, "copy")
			_, err := client.Backup(ctxT(t), admin, dest)
			require.Error(t, err)
			t.Logf("the backup cut short by the kill point answered: %v", err)
			proc.requireKilledAtThePoint(t)
			_, err = os.Lstat(dest)
			require.True(t, os.IsNotExist(err), "a backup cut short left %s", dest)

			proc = startItxd(t, dataDir)
			p = loginItxd(t, proc)
			for path, n := range want {
				require.Equal(t, n, countType(t, stream(t, p, path), "e"), path)
			}
			admin = rootAdmin(t, proc)
			res, err := client.Backup(ctxT(t), admin, dest)
			require.NoError(t, err)
			require.GreaterOrEqual(t, res.Streams, len(want))
			require.NoError(t, proc.stop(t))

			restored := startItxd(t, dest)
			rp := loginItxd(t, restored)
			for path, n := range want {
				require.Equal(t, n, countType(t, stream(t, rp, path), "e"), path)
			}
		})
	}
}

// itxd --backup-dir --backup-every writes its first backup at start (the folder holds none yet),
// and itxd starts on it.
func TestBackup_ScheduledByFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir, dir := t.TempDir(), t.TempDir()
	proc := startItxd(t, dataDir, "--backup-dir", dir, "--backup-every", "1h", "--backup-keep", "3")
	var name string
	waitUntil(t, "the first scheduled backup", func() bool {
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "itx-backup-") {
				name = e.Name()
				return true
			}
		}
		return false
	})
	require.NoError(t, proc.stop(t))
	restored := startItxd(t, filepath.Join(dir, name))
	loginItxd(t, restored)
}

// Admin.download sends the copy over the connection: written on the caller's machine, it
// restores like a backup written on the server; the server keeps no scratch copy; a project token
// is refused.
func TestBackup_Download(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	ctx := ctxT(t)
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	p := loginItxd(t, proc)
	want := map[string]int{}
	for i := 0; i < 5; i++ {
		path := fmt.Sprintf("/d/%d", i)
		s := stream(t, p, path)
		n := 1 + i*2000 // the largest streams' files span several 1 MiB parts
		for j := 0; j < n; j += 500 {
			batch := make([]itx.EventInput, min(500, n-j))
			for k := range batch {
				batch[k] = ev("e", fmt.Sprintf(`{"i":%d,"pad":"%0200d"}`, j+k, 0))
			}
			_, err := client.Append(ctx, s, batch, itx.AppendOptions{})
			require.NoError(t, err)
		}
		want[path] = n
	}
	_, err := client.DownloadBackup(ctx, client.Admin(ctx, p), filepath.Join(t.TempDir(), "x"))
	requireCode(t, err, itx.EPermissionDenied)

	admin := rootAdmin(t, proc)
	parent := t.TempDir()
	dest := filepath.Join(parent, "copy")
	res, err := client.DownloadBackup(ctx, admin, dest)
	require.NoError(t, err)
	require.Equal(t, dest, res.Path)
	require.Equal(t, len(want), res.Streams)
	entries, err := os.ReadDir(parent)
	require.NoError(t, err)
	require.Len(t, entries, 1) // the copy alone: the temporary folder was renamed
	requireNoDownloadScratch(t, dataDir)
	large := 0
	files, err := os.ReadDir(filepath.Join(dest, "streams"))
	require.NoError(t, err)
	for _, f := range files {
		if info, err := f.Info(); err == nil && info.Size() > 2<<20 {
			large++
		}
	}
	require.Greater(t, large, 0, "no stream file spans several parts")
	_, err = client.DownloadBackup(ctx, admin, dest)
	requireCode(t, err, itx.EFailedPrecondition)
	require.NoError(t, proc.stop(t))

	restored := startItxd(t, dest)
	rp := loginItxd(t, restored)
	for path, n := range want {
		require.Equal(t, n, countType(t, stream(t, rp, path), "e"), path)
	}
}

// refusingSink takes the first parts, then refuses.
type refusingSink struct{ took atomic.Int64 }

func (s *refusingSink) Write(ctx context.Context, call schema.BackupSink_write) error {
	if s.took.Add(1) > 1 {
		return itx.Errorf(itx.EResourceExhausted, "this disk is full")
	}
	return nil
}

// A sink that refuses a part ends the download with the refusal, and itxd keeps no scratch copy.
func TestBackup_DownloadEndsWhenTheSinkRefuses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	ctx := ctxT(t)
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	p := loginItxd(t, proc)
	mustAppend(t, stream(t, p, "/a"), ev("e", `{}`))
	admin := rootAdmin(t, proc)
	sink := &refusingSink{}
	fut, release := admin.Download(ctx, func(p schema.Admin_download_Params) error {
		return p.SetSink(schema.BackupSink_ServerToClient(sink))
	})
	defer release()
	_, err := fut.Struct()
	require.ErrorContains(t, err, "this disk is full")
	require.Equal(t, int64(2), sink.took.Load(), "nothing is sent after the refusal")
	requireNoDownloadScratch(t, dataDir)
	// itxd goes on: the next download works.
	res, err := client.DownloadBackup(ctx, admin, filepath.Join(t.TempDir(), "copy"))
	require.NoError(t, err)
	require.Equal(t, 1, res.Streams)
}

// rootAdmin is the Admin of proc's deployment root, on a connection of its own.
func rootAdmin(t *testing.T, proc *itxdProcess) schema.Admin {
	t.Helper()
	ctx := ctxT(t)
	return client.Admin(ctx, dial(t, proc.addr).Login(ctx, proc.creds.DeploymentToken))
}

// requireNoDownloadScratch fails when a download left its scratch copy in the data directory.
func requireNoDownloadScratch(t *testing.T, dataDir string) {
	t.Helper()
	entries, err := os.ReadDir(dataDir)
	require.NoError(t, err)
	for _, e := range entries {
		require.False(t, strings.HasPrefix(e.Name(), ".itx-download-"), "scratch copy %s left in the data directory", e.Name())
	}
}

// readBackupStream reads the durable events of a stream from a backup's files, without an itxd.
func readBackupStream(t *testing.T, dir, projectID, path string) []itx.Event {
	t.Helper()
	ctx := ctxT(t)
	d, err := storage.OpenDirectory(ctx, filepath.Join(dir, "directory.db"))
	require.NoError(t, err)
	defer d.Close()
	entry, err := d.Stream(ctx, projectID, path)
	require.NoError(t, err)
	if entry == nil {
		return nil
	}
	snap, err := storage.OpenSnapshot(ctx, filepath.Join(dir, "streams", entry.StreamID+".db"))
	require.NoError(t, err)
	defer snap.Close()
	var events []itx.Event
	for after := int64(0); ; {
		page, err := snap.Events(ctx, storage.Query{After: after, UpTo: math.MaxInt64, Limit: 500})
		require.NoError(t, err)
		if len(page) == 0 {
			return events
		}
		events = append(events, page...)
		after = page[len(page)-1].Offset
	}
}
