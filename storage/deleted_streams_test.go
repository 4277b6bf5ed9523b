package storage

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
)

// A project's delete records its streams as deleted in its own transaction, and a recorded ID is
// never a live stream's: the record and the entry exclude each other until the record is
// forgotten.
func TestDirectory_DeletedStreams(t *testing.T) {
	ctx := context.Background()
	d, err := OpenDirectory(ctx, filepath.Join(t.TempDir(), "dir.db"))
	require.NoError(t, err)
	defer d.Close()
	for _, p := range []string{"p1", "p2"} {
		require.NoError(t, d.CreateProjectWithToken(ctx, Project{ID: p, Name: p, CreatedAt: 1}, Token{ID: "t" + p, ProjectID: p, CreatedAt: 1}, "tok"+p, nil))
		for _, path := range []string{"/a", "/b"} {
			require.NoError(t, d.CreateStream(ctx, StreamEntry{StreamID: p + path, ProjectID: p, Path: path, CreatedAt: 2}, 0))
		}
	}
	requireDeleted := func(t *testing.T, want ...string) {
		t.Helper()
		got, err := d.DeletedStreams(ctx)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}

	t.Run("none before a delete", func(t *testing.T) {
		requireDeleted(t)
	})

	t.Run("a delete records its project's streams, and only those", func(t *testing.T) {
		require.NoError(t, d.DeleteProject(ctx, "p1", nil))
		requireDeleted(t, "p1/a", "p1/b")
		e, err := d.Stream(ctx, "p1", "/a")
		require.NoError(t, err)
		require.Nil(t, e, "the entry went in the same transaction")
		e, err = d.Stream(ctx, "p2", "/a")
		require.NoError(t, err)
		require.NotNil(t, e)
	})

	t.Run("a refused delete records nothing", func(t *testing.T) {
		err := d.DeleteProject(ctx, "nope", nil)
		require.Equal(t, itx.ENotFound, itx.ErrorCode(err), "%v", err)
		requireDeleted(t, "p1/a", "p1/b")
	})

	t.Run("a recorded ID names no new stream", func(t *testing.T) {
		err := d.CreateStream(ctx, StreamEntry{StreamID: "p1/a", ProjectID: "p2", Path: "/c", CreatedAt: 3}, 0)
		require.ErrorContains(t, err, "deleted stream")
		e, err := d.Stream(ctx, "p2", "/c")
		require.NoError(t, err)
		require.Nil(t, e, "refused, writing nothing")
		n, err := d.CountStreams(ctx, "p2")
		require.NoError(t, err)
		require.Equal(t, 2, n)
	})

	t.Run("forgetting is idempotent", func(t *testing.T) {
		require.NoError(t, d.ForgetDeletedStreams(ctx, []string{"p1/a"}))
		requireDeleted(t, "p1/b")
		require.NoError(t, d.ForgetDeletedStreams(ctx, []string{"p1/a", "p1/b"}))
		requireDeleted(t)
		require.NoError(t, d.ForgetDeletedStreams(ctx, []string{"p1/b"}))
		requireDeleted(t)
	})
}

// One stream's delete takes its entry, alarm, parked marks and secret uses, records it deleted
// and keeps the audit record, in one transaction; the project's count drops by one; the secret
// references it used are returned; a stream not held is ENotFound and writes nothing.
func TestDirectory_DeleteStream(t *testing.T) {
	ctx := context.Background()
	d, err := OpenDirectory(ctx, filepath.Join(t.TempDir(), "dir.db"))
	require.NoError(t, err)
	defer d.Close()
	require.NoError(t, d.CreateProjectWithToken(ctx, Project{ID: "p", Name: "p", CreatedAt: 1}, Token{ID: "t", ProjectID: "p", CreatedAt: 1}, "tok", nil))
	for _, id := range []string{"a", "b"} {
		require.NoError(t, d.CreateStream(ctx, StreamEntry{StreamID: id, ProjectID: "p", Path: "/" + id, CreatedAt: 2}, 0))
		require.NoError(t, d.SetAlarm(ctx, id, 100))
		require.NoError(t, d.SetParked(ctx, id, []string{"inbox"}))
		require.NoError(t, d.AddSecretUses(ctx, "p", id, []string{"itxsecret:x", "itxsecret:" + id}))
	}
	count := func(q string, args ...any) int {
		t.Helper()
		var n int
		require.NoError(t, d.db.QueryRowContext(ctx, q, args...).Scan(&n))
		return n
	}

	refs, err := d.DeleteStream(ctx, "a", &AuditRecord{ID: "audit-1", Type: "admin/stream-deleted", Payload: []byte(`{}`)})
	require.NoError(t, err)
	require.Equal(t, []string{"itxsecret:a", "itxsecret:x"}, refs)
	e, err := d.Stream(ctx, "p", "/a")
	require.NoError(t, err)
	require.Nil(t, e)
	deleted, err := d.DeletedStreams(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, deleted)
	for _, table := range []string{"alarms", "parked", "secret_uses"} {
		require.Zero(t, count(`select count(*) from `+table+` where stream_id = 'a'`), table)
		require.NotZero(t, count(`select count(*) from `+table+` where stream_id = 'b'`), "%s of the other stream", table)
	}
	n, err := d.CountStreams(ctx, "p")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	pending, err := d.PendingAudits(ctx)
	require.NoError(t, err)
	require.Len(t, pending, 1)
	require.Equal(t, "audit-1", pending[0].ID)

	_, err = d.DeleteStream(ctx, "a", &AuditRecord{ID: "audit-2", Type: "admin/stream-deleted", Payload: []byte(`{}`)})
	require.Equal(t, itx.ENotFound, itx.ErrorCode(err), "%v", err)
	pending, err = d.PendingAudits(ctx)
	require.NoError(t, err)
	require.Len(t, pending, 1, "a refused delete keeps no audit record")
}
