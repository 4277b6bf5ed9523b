package test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/storage"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// requireStreamFilesGone fails unless no file of the stream id is left in the data directory.
func requireStreamFilesGone(t *testing.T, dataDir, id string) {
	t.Helper()
	for _, suffix := range []string{".db", ".db-wal", ".db-shm"} {
		require.NoFileExists(t, filepath.Join(dataDir, "streams", id+suffix), "a file of the deleted stream")
	}
}

// auditedDeletions reads the deployment's audit records of deleted streams.
func auditedDeletions(t *testing.T, root schema.Project) []map[string]any {
	t.Helper()
	return audited(t, root, server.AuditStreamDeleted)
}

// audited reads the deployment's audit records of one type, their payloads decoded.
func audited(t *testing.T, root schema.Project, typ string) []map[string]any {
	t.Helper()
	events, err := client.ReadAll(ctxT(t), stream(t, root, server.AuditPath), itx.Query{Types: []string{typ}})
	require.NoError(t, err)
	var out []map[string]any
	for _, e := range events {
		var m map[string]any
		require.NoError(t, json.Unmarshal(e.Payload, &m))
		out = append(out, m)
	}
	return out
}

// Streams.remove deletes one stream for good: it is no longer listed, its files are gone, the
// deletion is audited; the streams beside it (its children included) keep every event; the next
// append to the path starts a new stream at offset 1 under a new id, where an idempotency key
// of the old stream is new again.
func TestStreams_RemoveDeletesOneStream(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	orders := stream(t, p, "/orders")
	mustAppend(t, orders, keyed("placed", `{"n":1}`, "k1"), ev("placed", `{"n":2}`), ev("placed", `{"n":3}`))
	child := stream(t, p, "/orders/eu")
	mustAppend(t, child, ev("placed", `{"eu":1}`), ev("placed", `{"eu":2}`))
	other := stream(t, p, "/other")
	mustAppend(t, other, ev("x", `{}`))
	before, err := client.Describe(ctx, orders)
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(ts.dir, "streams", before.StreamID+".db"))

	gone, err := client.DeleteStream(ctx, p, "/orders", false)
	require.NoError(t, err)
	require.Equal(t, client.DeletedStream{StreamID: before.StreamID, HeadOffset: 3}, gone)

	list, err := client.ListStreams(ctx, p, "")
	require.NoError(t, err)
	var paths []string
	for _, s := range list {
		paths = append(paths, s.Path)
	}
	require.Equal(t, []string{"/orders/eu", "/other"}, paths)
	requireStreamFilesGone(t, ts.dir, before.StreamID)
	info, err := client.Describe(ctx, orders)
	require.NoError(t, err)
	require.Empty(t, info.StreamID, "no stream at the path")
	events, err := client.ReadAll(ctx, orders, itx.Query{})
	require.NoError(t, err)
	require.Empty(t, events)
	for path, n := range map[string]int{"/orders/eu": 2, "/other": 1} {
		events, err := client.ReadAll(ctx, stream(t, p, path), itx.Query{})
		require.NoError(t, err)
		require.Len(t, events, n, path)
	}

	require.Equal(t, 1.0, testutil.ToFloat64(ts.srv.Metrics().StreamsDeleted))

	// Deleted twice: there is nothing to delete.
	_, err = client.DeleteStream(ctx, p, "/orders", true)
	requireCode(t, err, itx.ENotFound)

	// A new stream at the path: offset 1, a new id, the old idempotency key unknown to it.
	res := mustAppend(t, orders, keyed("placed", `{"n":"again"}`, "k1"))
	require.Equal(t, []int64{1}, res.Offsets)
	require.Equal(t, []bool{false}, res.Duplicate)
	require.NotEqual(t, before.StreamID, res.StreamID)

	audited := auditedDeletions(t, ts.deployment(t))
	require.Len(t, audited, 1)
	require.Equal(t, "/orders", audited[0]["path"])
	require.Equal(t, before.StreamID, audited[0]["streamId"])
	require.EqualValues(t, 3, audited[0]["headOffset"])
	require.Equal(t, "default", audited[0]["projectId"])

	// Bad input and the audit stream.
	_, err = client.DeleteStream(ctx, p, "orders", true)
	requireCode(t, err, itx.EInvalid)
	_, err = client.DeleteStream(ctx, p, "/never", true)
	requireCode(t, err, itx.ENotFound)
	_, err = client.DeleteStream(ctx, ts.deployment(t), server.AuditPath, true)
	requireCode(t, err, itx.EFailedPrecondition)
}

// A stream that subscriptions, registered readers or open connections consume is not deleted
// unless forced, and the refusal deletes nothing. Forced, its connection hears streamRemoved,
// its live view ends with streamRemoved, and a barrier waiting on it fails notFound.
func TestStreams_RemoveRefusedWhileConsumedUnlessForced(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	ctx := e.ctx
	subbed := stream(t, e.p, "/subbed")
	mustAppend(t, subbed, ev("a", `{}`))
	e.configure(t, subbed, client.SubscriptionConfig{Name: "inbox", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}})
	read := stream(t, e.p, "/read")
	mustAppend(t, read, ev("a", `{}`))
	registerReader(t, read, "mirror", 1)
	conned := stream(t, e.p, "/conned")
	mustAppend(t, conned, ev("a", `{}`), ev("b", `{}`))
	sink := newTestSink()
	_, err := openConn(t, conned, connOpts{noState: true}, sink)
	require.NoError(t, err)
	waitUntil(t, "caught up", func() bool { return len(sink.offsets()) == 2 })

	for path, why := range map[string]string{"/subbed": "1 subscription", "/read": "1 registered reader", "/conned": "1 open connection"} {
		_, err := client.DeleteStream(ctx, e.p, path, false)
		requireCode(t, err, itx.EFailedPrecondition)
		require.Contains(t, err.Error(), why)
		events, err := client.ReadAll(ctx, stream(t, e.p, path), itx.Query{})
		require.NoError(t, err)
		require.NotEmpty(t, events, "%s keeps its events", path)
	}
	require.Nil(t, sink.closeReason(), "the refused delete left the connection open")

	// Forced: what the stream serves ends, told why.
	waited := waitForNever(t, ctx, conned)
	view := &liveView{}
	subscribeLive(t, conned, view)
	waitUntil(t, "live", func() bool { rev, _ := view.state(); return rev > 0 })
	for _, path := range []string{"/subbed", "/read", "/conned"} {
		_, err := client.DeleteStream(ctx, e.p, path, true)
		require.NoError(t, err, path)
	}
	waitUntil(t, "told", func() bool { return sink.closeReason() != nil })
	require.Equal(t, schema.CloseReason_streamRemoved, *sink.closeReason(), sink.closeMs)
	require.Contains(t, sink.closeMs, "/conned was deleted")
	select {
	case err := <-waited:
		requireCode(t, err, itx.ENotFound)
	case <-ctx.Done():
		t.Fatal("waitForEvent still waits")
	}
	waitUntil(t, "view ended", func() bool { _, ended := view.endedWith(); return ended })
	why, _ := view.endedWith()
	require.Equal(t, schema.CloseReason_streamRemoved, why)
	list, err := client.ListStreams(ctx, e.p, "")
	require.NoError(t, err)
	require.Empty(t, list)
	// The subscription and the reader went with their stream.
	mustAppend(t, subbed, ev("a", `{}`))
	sc := client.Subscriptions(ctx, subbed)
	defer sc.Release()
	subs, err := client.ListSubscriptions(ctx, sc)
	require.NoError(t, err)
	require.Empty(t, subs)
	mustAppend(t, read, ev("a", `{}`))
	rf, releaseReaders := read.Readers(ctx, nil)
	defer releaseReaders()
	readers, err := client.ListReaders(ctx, rf.Readers())
	require.NoError(t, err)
	require.Empty(t, readers)
}

// Deleting takes the admin right, on a path inside the token's prefix.
func TestStreams_RemoveNeedsTheAdminRightInsideThePrefix(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	full := ts.project(t)
	for _, path := range []string{"/team/a", "/elsewhere"} {
		mustAppend(t, stream(t, full, path), ev("a", `{}`))
	}
	worker, _ := ts.token(t, itx.Scope{Rights: []itx.Right{itx.RightRead, itx.RightAppend, itx.RightSubscribe}})
	_, err := client.DeleteStream(ctx, ts.login(t, worker), "/team/a", true)
	requireCode(t, err, itx.EPermissionDenied)
	teamAdmin, _ := ts.token(t, itx.Scope{Prefix: "/team", Rights: []itx.Right{itx.RightAdmin}})
	team := ts.login(t, teamAdmin)
	_, err = client.DeleteStream(ctx, team, "/elsewhere", true)
	requireCode(t, err, itx.EPermissionDenied)
	_, err = client.DeleteStream(ctx, team, "/team/a", true)
	require.NoError(t, err)
	list, err := client.ListStreams(ctx, full, "")
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "/elsewhere", list[0].Path)
}

// Appends racing a delete never fail and are never lost without the delete saying so: each one
// lands on the deleted stream, at or below the head the delete reports, or on the new stream at
// the path, which holds exactly the appends acknowledged with its id.
func TestStreams_RemoveRacingAppends(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	s := stream(t, p, "/race")
	first := mustAppend(t, s, ev("seed", `{}`))
	type ack struct {
		key      string
		streamID string
		offset   int64
	}
	var (
		mu   sync.Mutex
		acks []ack
		errs []error
		wg   sync.WaitGroup
	)
	stop := make(chan struct{})
	appended := make(chan struct{}, 1000)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("w%d-%d", w, i)
				res, err := client.Append(ctx, s, []itx.EventInput{keyed("e", `{}`, key)}, itx.AppendOptions{})
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					acks = append(acks, ack{key, res.StreamID, res.Offsets[0]})
				}
				mu.Unlock()
				select {
				case appended <- struct{}{}:
				default:
				}
			}
		}()
	}
	for range 50 {
		<-appended
	}
	gone, err := client.DeleteStream(ctx, p, "/race", true)
	require.NoError(t, err)
	for range 50 {
		<-appended // appends after the delete too
	}
	close(stop)
	wg.Wait()
	require.Empty(t, errs)
	require.Equal(t, first.StreamID, gone.StreamID)

	var oldMax int64
	newKeys := map[int64]string{}
	var newID string
	for _, a := range acks {
		if a.streamID == gone.StreamID {
			oldMax = max(oldMax, a.offset)
			continue
		}
		require.True(t, newID == "" || newID == a.streamID, "one new stream")
		newID = a.streamID
		newKeys[a.offset] = a.key
	}
	require.Equal(t, oldMax, gone.HeadOffset, "the delete reports the last acknowledged append of the old stream")
	require.NotEmpty(t, newKeys, "appends went on after the delete")
	events, err := client.ReadAll(ctx, s, itx.Query{})
	require.NoError(t, err)
	got := map[int64]string{}
	for i, e := range events {
		require.Equal(t, int64(i+1), e.Offset)
		got[e.Offset] = e.IdempotencyKey
	}
	require.Equal(t, newKeys, got, "the new stream holds exactly the appends acknowledged with its id")
	requireStreamFilesGone(t, ts.dir, gone.StreamID)
}

// kill -9 of itxd at the worst point of a stream's delete: its directory entry deleted (the
// commit on disk), its files not removed yet. After the restart the files are gone, the stream
// stays deleted and its deletion is audited once; the stream beside it keeps every event.
func TestCrash_Kill9AfterDeleteStreamCommitLeavesNoFiles(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxdKilledAt(t, dataDir, "delete-stream-committed")
	ctx := ctxT(t)
	conn := dial(t, proc.addr)
	p := conn.Login(ctx, proc.creds.ProjectToken)
	doomed := stream(t, p, "/doomed")
	kept := stream(t, p, "/kept")
	for i := range 20 {
		mustAppend(t, doomed, ev("e", fmt.Sprintf(`{"i":%d}`, i)))
		mustAppend(t, kept, ev("e", fmt.Sprintf(`{"i":%d}`, i)))
	}
	info, err := client.Describe(ctx, doomed)
	require.NoError(t, err)
	want, err := client.ReadAll(ctx, kept, itx.Query{})
	require.NoError(t, err)

	_, err = client.DeleteStream(ctx, p, "/doomed", false)
	require.Error(t, err, "itxd died before answering")
	proc.requireKilledAtThePoint(t)
	d, err := storage.OpenDirectory(ctx, filepath.Join(dataDir, "directory.db"))
	require.NoError(t, err)
	entry, err := d.Stream(ctx, "default", "/doomed")
	require.NoError(t, err)
	require.Nil(t, entry, "the delete committed")
	require.NoError(t, d.Close())
	require.FileExists(t, filepath.Join(dataDir, "streams", info.StreamID+".db"), "killed before the files were removed")

	proc = startItxd(t, dataDir)
	requireStreamFilesGone(t, dataDir, info.StreamID)
	conn = dial(t, proc.addr)
	p = conn.Login(ctx, proc.creds.ProjectToken)
	list, err := client.ListStreams(ctx, p, "")
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "/kept", list[0].Path)
	got, err := client.ReadAll(ctx, stream(t, p, "/kept"), itx.Query{})
	require.NoError(t, err)
	require.Equal(t, want, got)
	audited := auditedDeletions(t, conn.Login(ctx, proc.creds.DeploymentToken))
	require.Len(t, audited, 1, "the deletion is audited once")
	require.Equal(t, info.StreamID, audited[0]["streamId"])
}

// Deletes (forced) racing every other use of a handful of paths: appends, connections opened
// and closed, readers registered, subscriptions configured, trims, describes. No call fails with
// anything but the codes a deleted stream explains, none hangs, and once the churn stops every
// path is either gone or a working stream whose listing and describe agree.
func TestStreams_RemoveChurn(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	paths := []string{"/churn/a", "/churn/b", "/churn/c"}
	expected := map[itx.Code]bool{
		itx.ENotFound:           true, // deleted under the call (a barrier, a trim of a stream gone)
		itx.EFailedPrecondition: true, // a delete of a stream being deleted; a name taken
		itx.EInvalid:            true, // a reader checkpoint above a new stream's head
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var unexpected []error
	note := func(op string, err error) {
		if err == nil || expected[itx.ErrorCode(err)] {
			return
		}
		mu.Lock()
		unexpected = append(unexpected, fmt.Errorf("%s: %w", op, err))
		mu.Unlock()
	}
	deletes := atomic.Int64{}
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 99))
			for i := 0; i < 60; i++ {
				path := paths[rng.IntN(len(paths))]
				s := client.Stream(ctx, p, path)
				switch op := rng.IntN(7); op {
				case 0, 1:
					_, err := client.Append(ctx, s, []itx.EventInput{ev("e", `{}`)}, itx.AppendOptions{})
					note("append", err)
				case 2:
					_, err := client.DeleteStream(ctx, p, path, true)
					if err == nil {
						deletes.Add(1)
					}
					note("delete", err)
				case 3:
					sink := newTestSink()
					c, err := openConn(t, s, connOpts{noState: true}, sink)
					note("open", err)
					if err == nil {
						fut, release := c.Close(ctx, func(p schema.Connection_close_Params) error { return p.SetReason("done") })
						_, err = fut.Struct()
						release()
						note("close", err)
					}
				case 4:
					rf, release := s.Readers(ctx, nil)
					note("register", client.RegisterReader(ctx, rf.Readers(), "r", 1))
					release()
				case 5:
					subs := client.Subscriptions(ctx, s)
					_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "copy",
						Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/churn/copies"}})
					subs.Release()
					note("configure", err)
				case 6:
					_, err := client.Trim(ctx, s, 1)
					note("trim", err)
					_, err = client.Describe(ctx, s)
					note("describe", err)
				}
				s.Release()
			}
		}()
	}
	wg.Wait()
	require.Empty(t, unexpected)
	require.Positive(t, deletes.Load())
	list, err := client.ListStreams(ctx, p, "/churn/")
	require.NoError(t, err)
	listed := map[string]int64{}
	for _, info := range list {
		listed[info.Path] = info.HeadOffset
	}
	for _, path := range paths {
		s := stream(t, p, path)
		info, err := client.Describe(ctx, s)
		require.NoError(t, err)
		head, ok := listed[path]
		require.Equal(t, ok, info.StreamID != "", "%s: listed iff it exists", path)
		if ok {
			require.Equal(t, head, info.HeadOffset, path)
			res := mustAppend(t, s, ev("after", `{}`))
			require.Equal(t, info.HeadOffset+1, res.Offsets[0], "%s takes appends", path)
		}
	}
}
