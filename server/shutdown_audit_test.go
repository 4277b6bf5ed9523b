package server

import (
	"context"
	"math"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/storage"
	"github.com/stretchr/testify/require"
)

// A graceful shutdown (itxd's SIGTERM: Server.Close) that lands while a trim is in flight, on a
// stream with no subscription: the trim's chunk commits with its audit record pending in the
// stream, the record's append to /audit fails (the server is closing). The next start appends it
// without anything touching the stream, and the stream's alarm is clear once it did. Before, the
// unload cleared the alarm the trim had set (a stream with nothing to deliver owes nothing), so
// the record waited, out of /audit, until the stream was next used; and a load that appended a
// pending record left the alarm due for ever (it did not own it), loading the stream at every
// start.
func TestShutdown_InATrimItsAuditRecordIsAppendedAtTheNextStart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	clk := clocktest.New(time.Unix(1_800_000_000, 0))
	cfg := Config{DataDir: dir, Clock: clk, IdleTimeout: time.Minute}
	s1, projectID := mustOpen(t, cfg)
	ref := StreamRef{ProjectID: projectID, Path: "/t"}
	_, err := s1.Append(ctx, ref, []itx.EventInput{{Type: "a"}, {Type: "b"}, {Type: "c"}}, itx.AppendOptions{})
	require.NoError(t, err)

	closed := make(chan error, 1)
	trimChunkCommittedHook = func() {
		// SIGTERM right after the chunk (and its pending record) committed.
		go func() {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			closed <- s1.Close(cctx)
		}()
		<-s1.base.Done()
	}
	t.Cleanup(func() { trimChunkCommittedHook = nil })
	_, _ = s1.TrimStream(ctx, Admin{}, ref, 2, 0)
	trimChunkCommittedHook = nil
	require.NoError(t, <-closed)
	trims := func(s *Server) int {
		page, err := s.ReadEvents(ctx, StreamRef{ProjectID: DeploymentProjectID, Path: AuditPath}, itx.Query{})
		if itx.ErrorCode(err) == itx.ENotFound {
			return 0
		}
		require.NoError(t, err)
		n := 0
		for _, e := range page.Events {
			if e.Type == AuditStreamTrimmed {
				n++
			}
		}
		return n
	}

	s2, _ := mustOpen(t, cfg)
	require.Eventually(t, func() bool { return trims(s2) == 1 }, 10*time.Second, 5*time.Millisecond,
		"the trim's record is appended at the start, the stream untouched")
	entry, err := s2.dir.Stream(ctx, projectID, "/t")
	require.NoError(t, err)
	alarm := func() int64 {
		due, err := s2.dir.DueAlarms(ctx, math.MaxInt64)
		require.NoError(t, err)
		for _, d := range due {
			if d.StreamID == entry.StreamID {
				return d.DueAt
			}
		}
		return 0
	}
	require.Eventually(t, func() bool {
		clk.Advance(2 * time.Minute)
		s2.Sweep()
		return s2.LoadedStreams() == 0 && alarm() == 0
	}, 10*time.Second, 5*time.Millisecond, "the stream owes nothing once its record is in /audit")
	page, err := s2.ReadEvents(ctx, ref, itx.Query{})
	require.NoError(t, err)
	require.Len(t, page.Events, 1, "the trim stands")
}

// A graceful shutdown that lands as a download's last part is accepted: the copy counts as
// written, and its admin/backup-written record is in /audit after the next start. Before, the
// record was appended only then and there: refused by the closing server, it was lost (the log
// said it would be appended at the next start; nothing kept it), and the download went on
// outside the calls a shutdown waits for, so the directory could close under it.
func TestShutdown_AsADownloadEndsItsAuditRecordIsKept(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cfg := Config{DataDir: dir}
	s1, projectID := mustOpen(t, cfg)
	_, err := s1.Append(ctx, StreamRef{ProjectID: projectID, Path: "/t"}, []itx.EventInput{{Type: "a"}}, itx.AppendOptions{})
	require.NoError(t, err)
	download := func(onPart func(path string)) error {
		_, err := s1.Download(ctx, Admin{}, func(path string, _ int64, _ []byte) error {
			onPart(path)
			return nil
		})
		return err
	}
	// The first download's record makes /audit: the second sends every file the third will.
	require.NoError(t, download(func(string) {}))
	var last string
	require.NoError(t, download(func(p string) { last = p }))

	closed := make(chan error, 1)
	require.NoError(t, download(func(p string) {
		if p != last {
			return
		}
		// SIGTERM as the last part is taken.
		go func() {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			closed <- s1.Close(cctx)
		}()
		<-s1.base.Done()
	}))
	require.NoError(t, <-closed)

	s2, _ := mustOpen(t, cfg)
	page, err := s2.ReadEvents(ctx, StreamRef{ProjectID: DeploymentProjectID, Path: AuditPath}, itx.Query{Types: []string{AuditBackupWritten}})
	require.NoError(t, err)
	require.Len(t, page.Events, 3, "each download whose every part was taken is recorded")
}

// A stream deleted while the audit record of its trim is still pending in it (/audit refused
// it: its circuit breaker was open) keeps that record: the directory takes it over with the
// deletion's, and the next start appends both. Before, the record went with the stream's files:
// /audit never learned of the trim.
func TestDeleteStream_KeepsItsPendingAuditRecords(t *testing.T) {
	t.Run("the stream", func(t *testing.T) { deleteKeepsPendingAudits(t, false) })
	t.Run("its project", func(t *testing.T) { deleteKeepsPendingAudits(t, true) })
}

func deleteKeepsPendingAudits(t *testing.T, project bool) {
	ctx := context.Background()
	dir := t.TempDir()
	clk := clocktest.New(time.Unix(1_800_000_000, 0))
	cfg := Config{DataDir: dir, Clock: clk, BreakerBurst: 2, BreakerRefillPerMinute: 1}
	s1, projectID := mustOpen(t, cfg)
	ref := StreamRef{ProjectID: projectID, Path: "/t"}
	_, err := s1.Append(ctx, ref, []itx.EventInput{{Type: "a"}, {Type: "b"}}, itx.AppendOptions{})
	require.NoError(t, err)
	// Two records fill /audit's breaker (the clock stands still: it does not refill).
	require.NoError(t, s1.SetRetention(ctx, Admin{}, ref, 0, 100, 0))
	require.NoError(t, s1.SetRetention(ctx, Admin{}, ref, 0, 0, 0))
	_, err = s1.TrimStream(ctx, Admin{}, ref, 1, 0)
	require.NoError(t, err)
	deleted := AuditStreamDeleted
	if project {
		require.NoError(t, s1.DeleteProject(ctx, Admin{}, projectID, true))
		deleted = AuditProjectDeleted
	} else {
		_, err = s1.DeleteStream(ctx, Admin{}, ref, false)
		require.NoError(t, err)
	}
	mustClose(t, s1)

	s2, err := Open(ctx, cfg) // not mustOpen: the project and its token may be gone
	require.NoError(t, err)
	t.Cleanup(func() { mustClose(t, s2) })
	count := func(typ string) int {
		page, err := s2.ReadEvents(ctx, StreamRef{ProjectID: DeploymentProjectID, Path: AuditPath}, itx.Query{Types: []string{typ}})
		require.NoError(t, err)
		return len(page.Events)
	}
	require.Equal(t, 2, count(AuditRetentionSet))
	require.Equal(t, 1, count(AuditStreamTrimmed), "the trim /audit refused, kept through the delete")
	require.Equal(t, 1, count(deleted))
}

// A trim's audit record in /audit while the vacuum after the trim is under way: the stream
// forgets its pending copy once the vacuum is done (forgetAudit). A shutdown (or an idle unload)
// between two vacuum turns ended the vacuum, and the forget with it: the record stayed pending,
// the stream's alarm due at once, and the next load appended it to /audit again (a second record
// once /audit trimmed the first). The unload now forgets what is in /audit before it closes.
func TestShutdown_MidVacuumATrimsRecordInAuditIsNotPendingAgain(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cfg := Config{DataDir: dir}
	s1, projectID := mustOpen(t, cfg)
	ref := StreamRef{ProjectID: projectID, Path: "/t"}
	payload := []byte(`{"p":"` + strings.Repeat("x", 1024) + `"}`)
	for range 4 {
		batch := make([]itx.EventInput, 1000)
		for i := range batch {
			batch[i] = itx.EventInput{Type: "e", Payload: payload}
		}
		_, err := s1.Append(ctx, ref, batch, itx.AppendOptions{})
		require.NoError(t, err)
	}
	entry, err := s1.dir.Stream(ctx, projectID, ref.Path)
	require.NoError(t, err)

	trimmed := make(chan error, 1)
	closed := make(chan error, 1)
	var turns atomic.Int32
	vacuumChunkCommittedHook = func(_, left int64) {
		switch turns.Add(1) {
		case 1:
			// The trim answers once its record is in /audit, the forget queued behind this turn.
			if err := <-trimmed; err != nil || left == 0 {
				t.Errorf("the trim: %v; the vacuum has %d bytes left (it must take more turns)", err, left)
			}
		case 2:
			go func() { // SIGTERM between two turns
				cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				closed <- s1.Close(cctx)
			}()
			<-s1.base.Done()
		}
	}
	t.Cleanup(func() { vacuumChunkCommittedHook = nil })
	go func() {
		_, err := s1.TrimStream(ctx, Admin{}, ref, 4000, 0)
		trimmed <- err
	}()
	require.NoError(t, <-closed)
	vacuumChunkCommittedHook = nil
	require.GreaterOrEqual(t, turns.Load(), int32(2))

	d, err := storage.OpenDirectory(ctx, filepath.Join(dir, "directory.db"))
	require.NoError(t, err)
	due, err := d.DueAlarms(ctx, math.MaxInt64)
	require.NoError(t, err)
	require.NoError(t, d.Close())
	for _, a := range due {
		require.NotEqual(t, entry.StreamID, a.StreamID, "the stream owes /audit nothing: no load is due")
	}
	store, err := storage.OpenStream(ctx, filepath.Join(dir, "streams", entry.StreamID+".db"))
	require.NoError(t, err)
	defer store.Close()
	pending, err := store.KV(ctx, auditPendingKey)
	require.NoError(t, err)
	require.Nil(t, pending, "the record in /audit is not pending in the stream")
}
