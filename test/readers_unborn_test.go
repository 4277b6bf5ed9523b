package test

import (
	"context"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// listedPaths is every stream path Streams.list shows under prefix, with its listing.
func listedPaths(t *testing.T, p schema.Project, prefix string) map[string]itx.StreamInfo {
	t.Helper()
	list, err := client.ListStreams(ctxT(t), p, prefix)
	require.NoError(t, err)
	out := map[string]itx.StreamInfo{}
	for _, info := range list {
		out[info.Path] = info
	}
	return out
}

// Seed 000's browser mirror registers its position before anything is written, and issue 9 asks
// for a checkpoint of at most the head: on a path nothing was appended to, registering at 0
// creates the stream (its first commit). It is described with an id and listed at head 0 with
// its reader, and an append shows the reader's lag, under the same id. One beyond the head is
// invalidArgument and creates nothing. Removing that reader leaves the stream (it exists until
// deleted), listed after a clean restart too, from the directory's summary.
func TestReaders_RegisterOnAStreamWithNoEventYet(t *testing.T) {
	dir := t.TempDir()
	ctx := ctxT(t)
	ts := startServer(t, server.Config{DataDir: dir})
	p := ts.project(t)
	s := stream(t, p, "/unborn/mirror")
	readers := client.Readers(ctx, s)
	defer readers.Release()

	requireCode(t, client.RegisterReader(ctx, readers, "mirror", 1), itx.EInvalid)
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.Empty(t, info.StreamID, "a refused registration creates no stream")
	require.Empty(t, listedPaths(t, p, "/unborn/"), "a refused registration creates no stream")

	require.NoError(t, client.RegisterReader(ctx, readers, "mirror", 0))
	list, err := client.ListReaders(ctx, readers)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, []any{"mirror", int64(0), int64(0)}, []any{list[0].Name, list[0].Checkpoint, list[0].Lag})
	info, err = client.Describe(ctx, s)
	require.NoError(t, err)
	require.NotEmpty(t, info.StreamID, "the registration is the stream's first commit")
	require.Equal(t, []any{int64(0), 1}, []any{info.HeadOffset, info.Readers})
	id := info.StreamID
	listed := listedPaths(t, p, "/unborn/")
	require.Contains(t, listed, "/unborn/mirror")
	require.Equal(t, []any{id, int64(0), 1}, []any{listed["/unborn/mirror"].StreamID, listed["/unborn/mirror"].HeadOffset, listed["/unborn/mirror"].Readers})

	res := mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))
	require.Equal(t, []int64{1, 2, 3}, res.Offsets)
	list, err = client.ListReaders(ctx, readers)
	require.NoError(t, err)
	require.Equal(t, []any{"mirror", int64(0), int64(3)}, []any{list[0].Name, list[0].Checkpoint, list[0].Lag})
	info, err = client.Describe(ctx, s)
	require.NoError(t, err)
	require.Equal(t, []any{id, int64(3), int64(3)}, []any{info.StreamID, info.HeadOffset, info.MaxLag})

	// A second stream whose only commits are a registration and its removal.
	s2 := stream(t, p, "/unborn/gone")
	readers2 := client.Readers(ctx, s2)
	require.NoError(t, client.RegisterReader(ctx, readers2, "once", 0))
	require.NoError(t, client.RemoveReader(ctx, readers2, "once"))
	info2, err := client.Describe(ctx, s2)
	require.NoError(t, err)
	require.NotEmpty(t, info2.StreamID, "removing its reader leaves the stream")
	readers2.Release()
	readers.Release()

	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, ts.srv.Close(cctx))
	ts2 := startServer(t, server.Config{DataDir: dir})
	p2 := ts2.project(t)
	listed = listedPaths(t, p2, "/unborn/")
	require.Len(t, listed, 2, "both listed unloaded, from the directory: %v", listed)
	require.False(t, listed["/unborn/mirror"].Loaded)
	require.Equal(t, []any{id, int64(3), 1}, []any{listed["/unborn/mirror"].StreamID, listed["/unborn/mirror"].HeadOffset, listed["/unborn/mirror"].Readers})
	require.Equal(t, []any{info2.StreamID, int64(0), 0}, []any{listed["/unborn/gone"].StreamID, listed["/unborn/gone"].HeadOffset, listed["/unborn/gone"].Readers})
	again, err := client.Describe(ctx, stream(t, p2, "/unborn/gone"))
	require.NoError(t, err)
	require.Equal(t, info2.StreamID, again.StreamID, "the same stream after the restart")

	// Deletion treats it as any stream: refused while it holds a reader, deleted once it holds none.
	_, err = client.DeleteStream(ctx, p2, "/unborn/mirror", false)
	requireCode(t, err, itx.EFailedPrecondition)
	gone, err := client.DeleteStream(ctx, p2, "/unborn/gone", false)
	require.NoError(t, err)
	require.Equal(t, []any{info2.StreamID, int64(0)}, []any{gone.StreamID, gone.HeadOffset})
	require.Equal(t, []string{"/unborn/mirror"}, keys(listedPaths(t, p2, "/unborn/")))
	again, err = client.Describe(ctx, stream(t, p2, "/unborn/gone"))
	require.NoError(t, err)
	require.Empty(t, again.StreamID)
}

// A registration that would create a stream past --max-streams-per-project is refused with
// limitExceeded, as the append would be, and writes nothing: no file, no listing, no reader. A
// registration on a stream that exists is not a creation.
func TestReaders_RegisterOnANewStreamCountsTowardTheStreamBound(t *testing.T) {
	dir := t.TempDir()
	ctx := ctxT(t)
	ts := startServer(t, server.Config{DataDir: dir, MaxStreamsPerProject: 1})
	p := ts.project(t)
	first := stream(t, p, "/bound/first")
	firstReaders := client.Readers(ctx, first)
	defer firstReaders.Release()
	require.NoError(t, client.RegisterReader(ctx, firstReaders, "mirror", 0), "the project's one stream")
	files := itxtest.StreamDatabases(t, dir)

	s := stream(t, p, "/bound/second")
	readers := client.Readers(ctx, s)
	defer readers.Release()
	err := client.RegisterReader(ctx, readers, "mirror", 0)
	requireCode(t, err, itx.ELimitExceeded)
	require.Contains(t, itx.ErrorMessage(err), "--max-streams-per-project")
	requireCode(t, client.RegisterReader(ctx, readers, "mirror", 0), itx.ELimitExceeded) // its actor is healthy: the same answer again
	require.Equal(t, files, itxtest.StreamDatabases(t, dir), "the refused registration created no file")
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.Empty(t, info.StreamID)
	list, err := client.ListReaders(ctx, readers)
	require.NoError(t, err)
	require.Empty(t, list)
	require.Equal(t, []string{"/bound/first"}, keys(listedPaths(t, p, "/bound/")))

	require.NoError(t, client.RegisterReader(ctx, firstReaders, "audit", 0), "the stream that exists takes more readers")
	mustAppend(t, first, ev("a", `{}`))
}

func keys(m map[string]itx.StreamInfo) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// A kill -9 of a real itxd right after a registration created a stream (head 0): the restart
// keeps it (its database holds the registration, unlike a creation a crash cut short, which the
// start drops), lists it with its reader, and describes it under the same id; an append then
// shows the reader's lag.
func TestCrash_ReaderOnAStreamWithNoEventSurvivesKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	ctx := ctxT(t)
	proc := startItxd(t, dataDir)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	s := client.Stream(ctx, p, "/unborn/crash")
	readers := client.Readers(ctx, s)
	require.NoError(t, client.RegisterReader(ctx, readers, "mirror", 0))
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.NotEmpty(t, info.StreamID)
	readers.Release()
	s.Release()
	p.Release()
	proc.kill9(t)

	proc = startItxd(t, dataDir)
	p = dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	defer p.Release()
	listed := listedPaths(t, p, "/unborn/")
	require.Contains(t, listed, "/unborn/crash", "the start kept the stream")
	require.Equal(t, []any{info.StreamID, int64(0), 1}, []any{listed["/unborn/crash"].StreamID, listed["/unborn/crash"].HeadOffset, listed["/unborn/crash"].Readers})
	s = client.Stream(ctx, p, "/unborn/crash")
	defer s.Release()
	again, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.Equal(t, info.StreamID, again.StreamID)
	readers = client.Readers(ctx, s)
	defer readers.Release()
	list, err := client.ListReaders(ctx, readers)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, []any{"mirror", int64(0), int64(0)}, []any{list[0].Name, list[0].Checkpoint, list[0].Lag})
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`))
	list, err = client.ListReaders(ctx, readers)
	require.NoError(t, err)
	require.Equal(t, int64(2), list[0].Lag)
}

// A backup taken while a stream holds only the reader that created it (head 0) has the stream:
// an itxd started on the copy lists it with its reader and describes it under the same id, as
// the start on the copy reads the stream's stale summary from its database.
func TestBackup_AStreamOnlyAReaderCreatedIsInTheCopy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	ctx := ctxT(t)
	proc := startItxd(t, t.TempDir())
	p := loginItxd(t, proc)
	s := stream(t, p, "/unborn/backed")
	readers := client.Readers(ctx, s)
	defer readers.Release()
	require.NoError(t, client.RegisterReader(ctx, readers, "mirror", 0))
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.NotEmpty(t, info.StreamID)
	dest := filepath.Join(t.TempDir(), "copy")
	res, err := client.Backup(ctx, rootAdmin(t, proc), dest)
	require.NoError(t, err)
	require.Equal(t, 1, res.Streams)
	require.NoError(t, proc.stop(t))

	restored := startItxd(t, dest)
	rp := loginItxd(t, restored)
	listed := listedPaths(t, rp, "/unborn/")
	require.Contains(t, listed, "/unborn/backed")
	require.Equal(t, []any{info.StreamID, int64(0), 1}, []any{listed["/unborn/backed"].StreamID, listed["/unborn/backed"].HeadOffset, listed["/unborn/backed"].Readers})
	rs := stream(t, rp, "/unborn/backed")
	again, err := client.Describe(ctx, rs)
	require.NoError(t, err)
	require.Equal(t, info.StreamID, again.StreamID)
	rr := client.Readers(ctx, rs)
	defer rr.Release()
	list, err := client.ListReaders(ctx, rr)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "mirror", list[0].Name)
}

// Creating a stream by registering a reader is for a caller with the subscribe right: a
// read-only token (or a readOnly() attenuation) registering on a path with no event yet gets
// notFound, as before registrations created streams, and writes nothing; were it allowed, a
// dashboard's read token could fill the project's stream bound with empty streams. On a stream
// that exists, the same token registers as it always could.
func TestReaders_AReadOnlyCallerCreatesNoStream(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, server.Config{DataDir: dir})
	ctx := ctxT(t)
	p := ts.project(t)
	readTok, _ := ts.token(t, itx.Scope{Rights: []itx.Right{itx.RightRead}})
	viewer := ts.login(t, readTok)
	files := itxtest.StreamDatabases(t, dir)

	for _, s := range []schema.Stream{stream(t, viewer, "/ro/fresh"), client.ReadOnly(ctx, stream(t, p, "/ro/fresh"))} {
		readers := client.Readers(ctx, s)
		err := client.RegisterReader(ctx, readers, "mirror", 0)
		requireCode(t, err, itx.ENotFound)
		require.Contains(t, itx.ErrorMessage(err), "subscribe right")
		readers.Release()
	}
	require.Equal(t, files, itxtest.StreamDatabases(t, dir), "no file")
	require.Empty(t, listedPaths(t, p, "/ro/"), "no stream listed")
	info, err := client.Describe(ctx, stream(t, p, "/ro/fresh"))
	require.NoError(t, err)
	require.Empty(t, info.StreamID)

	mustAppend(t, stream(t, p, "/ro/fresh"), ev("a", `{}`))
	readers := client.Readers(ctx, stream(t, viewer, "/ro/fresh"))
	defer readers.Release()
	require.NoError(t, client.RegisterReader(ctx, readers, "mirror", 0), "on a stream that exists, the read right registers")
	subTok, _ := ts.token(t, itx.Scope{Rights: []itx.Right{itx.RightRead, itx.RightSubscribe}})
	subReaders := client.Readers(ctx, stream(t, ts.login(t, subTok), "/ro/other"))
	defer subReaders.Release()
	require.NoError(t, client.RegisterReader(ctx, subReaders, "mirror", 0), "the subscribe right creates the stream")
	got := keys(listedPaths(t, p, "/ro/"))
	sort.Strings(got)
	require.Equal(t, []string{"/ro/fresh", "/ro/other"}, got)
}
