package server

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// failRemove is the SQLite backend whose Remove cannot remove one stream's files (a permission
// error, say): it removes the others.
type failRemove struct {
	sqliteBackend
	fail string
}

func (b failRemove) Remove(ctx context.Context, streamIDs []string) ([]string, error) {
	removed, err := b.sqliteBackend.Remove(ctx, slices.DeleteFunc(slices.Clone(streamIDs), func(id string) bool { return id == b.fail }))
	if slices.Contains(streamIDs, b.fail) {
		err = errors.Join(err, os.ErrPermission)
	}
	return removed, err
}

// The start-up sweep (Open) removes the files of the streams the directory recorded as deleted, and
// forgets a record only once its files are gone: a failure keeps the record for the next start,
// files already gone (a sweep cut short before it forgot them) are no error, and a sweep run
// again changes nothing. A live stream's files are never touched.
func TestServer_RemoveDeletedStreams(t *testing.T) {
	ctx := context.Background()
	data := t.TempDir()
	streams := filepath.Join(data, "streams")
	require.NoError(t, os.Mkdir(streams, 0o700))
	d, err := storage.OpenDirectory(ctx, filepath.Join(data, "directory.db"))
	require.NoError(t, err)
	defer d.Close()
	for _, p := range []string{"live", "gone"} {
		require.NoError(t, d.CreateProjectWithToken(ctx, storage.Project{ID: p, Name: p, CreatedAt: 1}, storage.Token{ID: "t-" + p, ProjectID: p, CreatedAt: 1}, "tok-"+p, nil))
	}
	files := func(id string) []string {
		f := filepath.Join(streams, id+".db")
		return []string{f, f + "-wal", f + "-shm"}
	}
	for _, e := range []storage.StreamEntry{
		{StreamID: "s-live", ProjectID: "live", Path: "/a"},
		{StreamID: "s-gone", ProjectID: "gone", Path: "/a"},
		{StreamID: "s-half", ProjectID: "gone", Path: "/b"}, // a removal cut short: its WAL is left
	} {
		require.NoError(t, d.CreateStream(ctx, e, 0))
		for i, f := range files(e.StreamID) {
			if e.StreamID == "s-gone" || e.StreamID == "s-half" && i == 1 {
				require.NoError(t, os.WriteFile(f, []byte("data of "+e.StreamID), 0o600))
			}
		}
	}
	// The live stream holds an acknowledged event and stays open, so its WAL and shared memory
	// are on disk beside its database throughout.
	live, err := storage.CreateStream(ctx, files("s-live")[0], storage.StreamMeta{StreamID: "s-live", ProjectID: "live", Path: "/a"})
	require.NoError(t, err)
	defer live.Close()
	acked := []itx.Event{{Offset: 1, Type: "e", Payload: json.RawMessage(`{"acknowledged":true}`), CreatedAt: 1}}
	require.NoError(t, live.Commit(ctx, storage.Commit{Events: acked, HeadOffset: 1, LastAppendAt: 1}))
	require.NoError(t, d.DeleteProject(ctx, "gone", nil))
	s := &Server{dir: d, log: zerolog.Nop()}

	requireState := func(t *testing.T, recorded []string, present ...string) {
		t.Helper()
		got, err := d.DeletedStreams(ctx)
		require.NoError(t, err)
		require.Equal(t, recorded, got, "recorded as deleted")
		for _, id := range []string{"s-gone", "s-half"} {
			for _, f := range files(id) {
				if slices.Contains(present, id) {
					require.FileExists(t, f)
				} else {
					require.NoFileExists(t, f)
				}
			}
		}
		for _, f := range files("s-live") {
			require.FileExists(t, f, "a live stream's file")
		}
		reopened, err := storage.OpenStream(ctx, files("s-live")[0])
		require.NoError(t, err)
		defer reopened.Close()
		events, err := reopened.Events(ctx, storage.Query{UpTo: 1, Limit: 10})
		require.NoError(t, err)
		require.Equal(t, acked, events, "the live stream's acknowledged event")
	}
	recorded, err := d.DeletedStreams(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"s-gone", "s-half"}, recorded, "the delete recorded its streams")

	t.Run("a failed removal keeps its record", func(t *testing.T) {
		s.backend = failRemove{sqliteBackend{dir: streams}, "s-gone"}
		require.ErrorIs(t, s.removeDeletedStreams(ctx), os.ErrPermission)
		requireState(t, []string{"s-gone"}, "s-gone")
	})

	t.Run("the next start removes the rest", func(t *testing.T) {
		srv, err := Open(ctx, Config{DataDir: data, Log: zerolog.Nop()})
		require.NoError(t, err)
		mustClose(t, srv)
		requireState(t, nil)
	})

	t.Run("run again, nothing changes", func(t *testing.T) {
		s.backend = sqliteBackend{dir: streams}
		require.NoError(t, s.removeDeletedStreams(ctx))
		require.NoError(t, s.removeDeletedStreams(ctx))
		requireState(t, nil)
	})

	t.Run("files already gone are no error", func(t *testing.T) {
		// A sweep killed after it removed the files and before it forgot them: the next one
		// only forgets them. Another deleted project's streams, recorded with no file left.
		require.NoError(t, d.CreateProjectWithToken(ctx, storage.Project{ID: "gone2", Name: "gone2", CreatedAt: 2}, storage.Token{ID: "t-gone2", ProjectID: "gone2", CreatedAt: 2}, "tok-gone2", nil))
		require.NoError(t, d.CreateStream(ctx, storage.StreamEntry{StreamID: "s-gone2", ProjectID: "gone2", Path: "/a"}, 0))
		require.NoError(t, d.DeleteProject(ctx, "gone2", nil))
		requireState(t, []string{"s-gone2"})
		require.NoError(t, s.removeDeletedStreams(ctx))
		requireState(t, nil)
	})
}

// A project with streams is refused deletion unless forced, counting them in words: "1 stream",
// not "1 streams".
func TestDeleteProject_RefusalCountsItsStreams(t *testing.T) {
	ctx := context.Background()
	s, _ := mustOpen(t, Config{DataDir: t.TempDir()})
	info, _, _, err := s.CreateProject(ctx, Admin{}, "busy")
	require.NoError(t, err)
	for i, want := range []string{`project "busy" has 1 stream: delete it with the project by forcing`,
		`project "busy" has 2 streams: delete them with it by forcing`} {
		_, err = s.Append(ctx, StreamRef{ProjectID: info.ID, Path: []string{"/a", "/b"}[i]}, []itx.EventInput{{Type: "e"}}, itx.AppendOptions{})
		require.NoError(t, err)
		err = s.DeleteProject(ctx, Admin{}, info.ID, false)
		require.Equal(t, itx.EFailedPrecondition, itx.ErrorCode(err), "%v", err)
		require.Equal(t, want, itx.ErrorMessage(err))
	}
	require.NoError(t, s.DeleteProject(ctx, Admin{}, info.ID, true))
}
