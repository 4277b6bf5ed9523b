package storage

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
)

func mustCreateStream(t *testing.T) (*Stream, string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "s.db")
	s, err := CreateStream(context.Background(), file, StreamMeta{StreamID: "sid", ProjectID: "p", Path: "/a", CreatedAt: 5})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s, file
}

func events(from int64, n int, ephemeralEvery int) []itx.Event {
	var out []itx.Event
	for i := 0; i < n; i++ {
		off := from + int64(i)
		e := itx.Event{Offset: off, Type: "t", Payload: json.RawMessage(`{"i":` + itoa(off) + `}`), CreatedAt: 100 + off}
		if ephemeralEvery > 0 && off%int64(ephemeralEvery) == 0 {
			e.Ephemeral = true
			e.Type = "eph"
		}
		out = append(out, e)
	}
	return out
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

func TestStream_CommitAndRead(t *testing.T) {
	ctx := context.Background()
	s, file := mustCreateStream(t)

	batch := events(1, 10, 5) // offsets 5 and 10 ephemeral
	batch[2].IdempotencyKey = "k3"
	batch[3].Metadata = json.RawMessage(`{"m":1}`)
	batch[4].Provenance = nil
	batch[6].Provenance = []itx.Hop{{StreamID: "src", Path: "/src", Offset: 9, Subscription: "copy", CursorChangedAtOffset: 2, Type: "orig"}}
	require.NoError(t, s.Commit(ctx, Commit{Events: batch, HeadOffset: 10, LastAppendAt: 110}))

	t.Run("durable only by default", func(t *testing.T) {
		got, err := s.Events(ctx, Query{After: 0, UpTo: 10, Limit: 100})
		require.NoError(t, err)
		require.Len(t, got, 8)
		for _, e := range got {
			require.False(t, e.Ephemeral)
		}
	})
	t.Run("with ephemeral", func(t *testing.T) {
		got, err := s.Events(ctx, Query{After: 0, UpTo: 10, Limit: 100, IncludeEphemeral: true})
		require.NoError(t, err)
		require.Len(t, got, 10)
		require.True(t, got[4].Ephemeral)
	})
	t.Run("fields round-trip", func(t *testing.T) {
		got, err := s.Events(ctx, Query{After: 2, UpTo: 7, Limit: 100})
		require.NoError(t, err)
		require.Equal(t, int64(3), got[0].Offset)
		require.Equal(t, "k3", got[0].IdempotencyKey)
		require.JSONEq(t, `{"m":1}`, string(got[1].Metadata))
		require.Equal(t, batch[6].Provenance, got[3].Provenance)
		require.Equal(t, int64(107), got[3].CreatedAt)
	})
	t.Run("bounds, limit and types", func(t *testing.T) {
		got, err := s.Events(ctx, Query{After: 3, UpTo: 8, Limit: 2})
		require.NoError(t, err)
		require.Equal(t, []int64{4, 6}, offsets(got))
		got, err = s.Events(ctx, Query{After: 0, UpTo: 10, Limit: 100, Types: []string{"eph"}, IncludeEphemeral: true})
		require.NoError(t, err)
		require.Equal(t, []int64{5, 10}, offsets(got))
		got, err = s.Events(ctx, Query{After: 0, UpTo: 10, Limit: 100, Types: []string{"eph"}})
		require.NoError(t, err)
		require.Empty(t, got)
	})
	t.Run("idempotency key lookup", func(t *testing.T) {
		byKey, err := s.EventsByKeys(ctx, []string{"absent", "k3"})
		require.NoError(t, err)
		require.Len(t, byKey, 1)
		require.Equal(t, int64(3), byKey["k3"].Offset)
	})
	t.Run("a duplicate key fails the whole commit", func(t *testing.T) {
		dup := events(11, 2, 0)
		dup[1].IdempotencyKey = "k3"
		require.Error(t, s.Commit(ctx, Commit{Events: dup, HeadOffset: 12, LastAppendAt: 120}))
		got, err := s.Events(ctx, Query{After: 10, UpTo: 12, Limit: 10, IncludeEphemeral: true})
		require.NoError(t, err)
		require.Empty(t, got, "nothing of a failed commit is visible")
		m, err := s.Meta(ctx)
		require.NoError(t, err)
		require.Equal(t, int64(10), m.HeadOffset)
	})
	t.Run("ephemeral sweep keeps the head", func(t *testing.T) {
		n, err := s.DeleteEphemeral(ctx, 10, 106) // created_at < 106: only offset 5
		require.NoError(t, err)
		require.Equal(t, int64(1), n)
		got, err := s.Events(ctx, Query{After: 0, UpTo: 10, Limit: 100, IncludeEphemeral: true})
		require.NoError(t, err)
		require.Equal(t, []int64{1, 2, 3, 4, 6, 7, 8, 9, 10}, offsets(got))
		n, err = s.DeleteEphemeral(ctx, 10, 1000)
		require.NoError(t, err)
		require.Equal(t, int64(1), n)
		m, err := s.Meta(ctx)
		require.NoError(t, err)
		require.Equal(t, int64(10), m.HeadOffset, "the head survives the deletion of the top row")
	})
	t.Run("reopen", func(t *testing.T) {
		require.NoError(t, s.Close())
		s2, err := OpenStream(ctx, file)
		require.NoError(t, err)
		defer s2.Close()
		m, err := s2.Meta(ctx)
		require.NoError(t, err)
		require.Equal(t, StreamMeta{StreamID: "sid", ProjectID: "p", Path: "/a", CreatedAt: 5, HeadOffset: 10, LastAppendAt: 110}, m)
		got, err := s2.Events(ctx, Query{After: 0, UpTo: 10, Limit: 100})
		require.NoError(t, err)
		require.Len(t, got, 8)
	})
}

func offsets(events []itx.Event) []int64 {
	var out []int64
	for _, e := range events {
		out = append(out, e.Offset)
	}
	return out
}

func TestStream_Pragmas(t *testing.T) {
	_, file := mustCreateStream(t)
	// A connection opened through the itx driver must be WAL with synchronous=FULL: mattn's
	// compiled default would silently give NORMAL.
	db, err := openDB(file, false, 1)
	require.NoError(t, err)
	defer db.Close()
	var mode string
	var sync, version int
	require.NoError(t, db.QueryRow("PRAGMA journal_mode").Scan(&mode))
	require.NoError(t, db.QueryRow("PRAGMA synchronous").Scan(&sync))
	require.NoError(t, db.QueryRow("PRAGMA user_version").Scan(&version))
	require.Equal(t, "wal", mode)
	require.Equal(t, 2, sync)
	require.Equal(t, 7, version, "migrations ran")

	// The seed's cursor table exists with its exact columns.
	rows, err := db.Query("select name from pragma_table_info('subscription_cursors') order by cid")
	require.NoError(t, err)
	var cols []string
	for rows.Next() {
		var c string
		require.NoError(t, rows.Scan(&c))
		cols = append(cols, c)
	}
	require.Equal(t, []string{"name", "configured_at_offset", "cursor_changed_at_offset", "confirmed_offset", "status",
		"attempt", "next_attempt_at", "failing_event_offset", "failing_event_attempt",
		"failing_event_skips_since_last_success", "last_error", "in_flight_deadline_at",
		"in_flight_connection_generation", "updated_at"}, cols)
}

func TestCreateStream_RefusesExistingFile(t *testing.T) {
	_, file := mustCreateStream(t)
	_, err := CreateStream(context.Background(), file, StreamMeta{StreamID: "other"})
	require.Error(t, err)
}

// A crash while a stream is created can leave its file without the stream_meta row: empty (made,
// never opened by SQLite) or migrated. Such a file holds nothing ever committed: OpenStream says
// ErrNotCreated, and CreateStream finishes it instead of refusing the stream's path forever.
func TestCreateStream_FinishesACreationCutShort(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		make func(t *testing.T, file string)
	}{
		{"empty file", func(t *testing.T, file string) { require.NoError(t, createPrivate(file)) }},
		{"migrated, no meta row", func(t *testing.T, file string) {
			s, err := openStream(ctx, file, true)
			require.NoError(t, err)
			require.NoError(t, s.Close())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "s.db")
			tc.make(t, file)
			_, err := OpenStream(ctx, file)
			require.ErrorIs(t, err, ErrNotCreated)

			meta := StreamMeta{StreamID: "sid", ProjectID: "p", Path: "/a", CreatedAt: 1}
			s, err := CreateStream(ctx, file, meta)
			require.NoError(t, err)
			require.NoError(t, s.Commit(ctx, Commit{Events: events(1, 1, 0), HeadOffset: 1, LastAppendAt: 2}))
			require.NoError(t, s.Close())

			s, err = OpenStream(ctx, file)
			require.NoError(t, err)
			defer s.Close()
			got, err := s.Meta(ctx)
			require.NoError(t, err)
			meta.HeadOffset, meta.LastAppendAt = 1, 2
			require.Equal(t, meta, got)
			_, err = CreateStream(ctx, file, StreamMeta{StreamID: "other"})
			require.Error(t, err, "a finished stream is never created over")
		})
	}
}

func TestMigrate_Idempotent(t *testing.T) {
	_, file := mustCreateStream(t)
	db, err := sql.Open(driverName, "file:"+file)
	require.NoError(t, err)
	defer db.Close()
	from, to, err := migrate(context.Background(), db, "stream")
	require.NoError(t, err)
	require.Equal(t, from, to, "a created stream is at the last version")
	from2, to2, err := migrate(context.Background(), db, "stream")
	require.NoError(t, err)
	require.Equal(t, []int{to, to}, []int{from2, to2}, "nothing to do again")
}

// Projects made together are all recorded or none: the second refused, the first is not there.
func TestDirectory_CreateProjectsWithTokensIsAllOrNone(t *testing.T) {
	ctx := context.Background()
	d, err := OpenDirectory(ctx, filepath.Join(t.TempDir(), "dir.db"))
	require.NoError(t, err)
	defer d.Close()
	err = d.CreateProjectsWithTokens(ctx, []NewProject{
		{Project: Project{ID: "p1", Name: "same", CreatedAt: 1}, Token: Token{ID: "t1", ProjectID: "p1", CreatedAt: 1}, Secret: "tok1"},
		{Project: Project{ID: "p2", Name: "same", CreatedAt: 1}, Token: Token{ID: "t2", ProjectID: "p2", CreatedAt: 1}, Secret: "tok2"},
	}, nil)
	require.Equal(t, itx.EInvalid, itx.ErrorCode(err))
	ps, err := d.Projects(ctx)
	require.NoError(t, err)
	require.Empty(t, ps)
	_, _, err = d.TokenByHash(ctx, "tok1", 1)
	require.Equal(t, itx.EUnauthenticated, itx.ErrorCode(err))
}

// An audited change keeps its record in its own transaction: a refused change keeps none, and a
// record stays pending until DeleteAudit.
func TestDirectory_AuditRecords(t *testing.T) {
	ctx := context.Background()
	d, err := OpenDirectory(ctx, filepath.Join(t.TempDir(), "dir.db"))
	require.NoError(t, err)
	defer d.Close()
	rec := func(id string) *AuditRecord {
		return &AuditRecord{ID: id, Type: "admin/x", Payload: []byte(`{"id":"` + id + `"}`)}
	}

	require.NoError(t, d.CreateProjectWithToken(ctx, Project{ID: "p1", Name: "one", CreatedAt: 1}, Token{ID: "t1", ProjectID: "p1", CreatedAt: 1}, "tok1", rec("a1")))
	require.Error(t, d.CreateProjectWithToken(ctx, Project{ID: "p2", Name: "one", CreatedAt: 1}, Token{ID: "t2", ProjectID: "p2", CreatedAt: 1}, "tok2", rec("refused1")))
	require.NoError(t, d.CreateTokenBounded(ctx, Token{ID: "t3", ProjectID: "p1", CreatedAt: 2}, "tok3", 0, rec("a2")))
	require.Error(t, d.CreateTokenBounded(ctx, Token{ID: "t4", ProjectID: "p1", CreatedAt: 2}, "tok4", 2, rec("refused2")))
	require.NoError(t, d.DeleteToken(ctx, "p1", "t3", rec("a3")))
	require.Error(t, d.DeleteToken(ctx, "p1", "t3", rec("refused3")))
	require.NoError(t, d.RenameProject(ctx, "p1", "uno", rec("a4")))
	require.Error(t, d.RenameProject(ctx, "nope", "dos", rec("refused4")))
	require.NoError(t, d.DeleteProject(ctx, "p1", rec("a5")))
	require.Error(t, d.DeleteProject(ctx, "p1", rec("refused5")))

	pending, err := d.PendingAudits(ctx)
	require.NoError(t, err)
	var got []string
	for _, a := range pending {
		got = append(got, a.ID)
		require.Equal(t, *rec(a.ID), a)
	}
	require.Equal(t, []string{"a1", "a2", "a3", "a4", "a5"}, got, "in the order of their changes")
	require.NoError(t, d.DeleteAudit(ctx, "a1"))
	require.NoError(t, d.DeleteAudit(ctx, "a1"), "forgetting one twice is no error")
	pending, err = d.PendingAudits(ctx)
	require.NoError(t, err)
	require.Len(t, pending, 4)
	require.Equal(t, "a2", pending[0].ID)
}

func TestDirectory(t *testing.T) {
	ctx := context.Background()
	d, err := OpenDirectory(ctx, filepath.Join(t.TempDir(), "dir.db"))
	require.NoError(t, err)
	defer d.Close()

	require.NoError(t, d.CreateProjectWithToken(ctx, Project{ID: "p1", Name: "one", CreatedAt: 1}, Token{ID: "t1", ProjectID: "p1", Label: "l", CreatedAt: 1}, "tok1", nil))
	err = d.CreateProjectWithToken(ctx, Project{ID: "p2", Name: "one", CreatedAt: 1}, Token{ID: "t2", ProjectID: "p2", Label: "l", CreatedAt: 1}, "tok2", nil)
	require.Equal(t, itx.EInvalid, itx.ErrorCode(err), "a name is unique")
	_, err = d.Project(ctx, "p2")
	require.Equal(t, itx.ENotFound, itx.ErrorCode(err), "a refused project writes nothing")
	tok, p, err := d.TokenByHash(ctx, "tok1", 5)
	require.NoError(t, err)
	require.Equal(t, "p1", p.ID)
	require.Equal(t, int64(5), tok.LastUsedAt)
	_, _, err = d.TokenByHash(ctx, "nope", 5)
	require.Equal(t, itx.EUnauthenticated, itx.ErrorCode(err))
	require.NoError(t, d.CreateToken(ctx, Token{ID: "t3", ProjectID: "p1", Label: "x", Prefix: "/a", Rights: []string{"read"}, CreatedAt: 2, ExpiresAt: 10}, "tok3"))
	_, _, err = d.TokenByHash(ctx, "tok3", 10)
	require.Equal(t, itx.EUnauthenticated, itx.ErrorCode(err), "expired")
	tokens, err := d.Tokens(ctx, "p1")
	require.NoError(t, err)
	require.Len(t, tokens, 2)
	require.Equal(t, []string{"read"}, tokens[1].Rights)
	require.NoError(t, d.DeleteToken(ctx, "p1", "t3", nil))
	require.Equal(t, itx.ENotFound, itx.ErrorCode(d.DeleteToken(ctx, "p1", "t3", nil)))

	for _, path := range []string{"/a", "/a/b", "/ab", "/b"} {
		require.NoError(t, d.CreateStream(ctx, StreamEntry{StreamID: "s" + path, ProjectID: "p1", Path: path, CreatedAt: 2}, 0))
	}
	list, err := d.ListStreams(ctx, "p1", "/a", "", 100)
	require.NoError(t, err)
	require.Len(t, list, 3)
	list, err = d.ListStreams(ctx, "p1", "/a/", "", 100)
	require.NoError(t, err)
	require.Len(t, list, 1)
	list, err = d.ListStreams(ctx, "other", "", "", 100)
	require.NoError(t, err)
	require.Empty(t, list)
	e, err := d.Stream(ctx, "p1", "/b")
	require.NoError(t, err)
	require.Equal(t, "s/b", e.StreamID)
	e, err = d.Stream(ctx, "p1", "/zzz")
	require.NoError(t, err)
	require.Nil(t, e)

	require.NoError(t, d.SetAlarm(ctx, "s/a", 50))
	require.NoError(t, d.SetAlarm(ctx, "s/b", 10))
	require.NoError(t, d.SetAlarm(ctx, "s/a", 30))
	due, err := d.DueAlarms(ctx, 40)
	require.NoError(t, err)
	require.Len(t, due, 2)
	require.Equal(t, "/b", due[0].Path)
	require.Equal(t, int64(30), due[1].DueAt)
	require.NoError(t, d.SetAlarm(ctx, "s/b", 0))
	due, err = d.DueAlarms(ctx, 40)
	require.NoError(t, err)
	require.Len(t, due, 1)
}

func TestStream_Readers(t *testing.T) {
	ctx := context.Background()
	s, err := CreateStream(ctx, filepath.Join(t.TempDir(), "r.db"), StreamMeta{StreamID: "s", ProjectID: "p", Path: "/r", CreatedAt: 1})
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.Commit(ctx, Commit{ReaderUpserts: []Reader{{Name: "mirror", Checkpoint: 3, UpdatedAt: 10}, {Name: "audit", Checkpoint: 0, UpdatedAt: 11}}}))
	require.NoError(t, s.Commit(ctx, Commit{ReaderUpserts: []Reader{{Name: "mirror", Checkpoint: 5, UpdatedAt: 12}}, ReaderDeletes: []string{"audit"}}))
	got, err := s.Readers(ctx)
	require.NoError(t, err)
	require.Equal(t, []Reader{{Name: "mirror", Checkpoint: 5, UpdatedAt: 12}}, got)
}

// A cursor row keeps an offset-acking subscription's delivered offset, and rows written before the
// column existed read it as 0.
func TestStream_CursorDeliveredOffset(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "c.db")
	s, err := CreateStream(ctx, path, StreamMeta{StreamID: "s", ProjectID: "p", Path: "/c", CreatedAt: 1})
	require.NoError(t, err)
	row := CursorRow{Name: "acking", ConfiguredAtOffset: 1, ConfirmedOffset: 3, DeliveredOffset: 7, Status: StatusActive, UpdatedAt: "t"}
	require.NoError(t, s.Commit(ctx, Commit{CursorUpserts: []CursorRow{row}}))
	got, err := s.CursorRows(ctx)
	require.NoError(t, err)
	require.Equal(t, []CursorRow{row}, got)

	// Back to 0: the row goes from the side table; deleting the cursor deletes it too.
	row.DeliveredOffset = 0
	require.NoError(t, s.Commit(ctx, Commit{CursorUpserts: []CursorRow{row, {Name: "other", ConfiguredAtOffset: 1, DeliveredOffset: 2, Status: StatusActive}}}))
	got, err = s.CursorRows(ctx)
	require.NoError(t, err)
	require.Equal(t, []int64{0, 2}, []int64{got[0].DeliveredOffset, got[1].DeliveredOffset})
	require.NoError(t, s.Commit(ctx, Commit{CursorDeletes: []string{"other"}}))
	require.NoError(t, s.Close())

	// A database from before migration 004 (no side table) gains it with its cursor rows kept.
	db, err := openDB(path, false, 1)
	require.NoError(t, err)
	defer db.Close()
	var left int
	require.NoError(t, db.QueryRowContext(ctx, `select count(*) from subscription_delivered`).Scan(&left))
	require.Zero(t, left, "nothing left of deleted or zeroed rows")
	_, err = db.ExecContext(ctx, `drop table subscription_delivered; alter table stream_meta drop column trimmed_through; alter table readers drop column no_hold; alter table readers drop column owner; PRAGMA user_version = 3`)
	require.NoError(t, err)
	_, _, err = migrate(ctx, db, "stream")
	require.NoError(t, err)
	var cursors int
	require.NoError(t, db.QueryRowContext(ctx, `select count(*) from subscription_cursors c left join subscription_delivered d using (name)`).Scan(&cursors))
	require.Equal(t, 1, cursors)
}

// A directory from before tokens had their own table keeps logging in with its projects' tokens:
// migration 005 makes each project's token its "initial" token.
func TestDirectory_MigratesProjectTokens(t *testing.T) {
	ctx := context.Background()
	db, err := openDB(filepath.Join(t.TempDir(), "dir.db"), true, 1)
	require.NoError(t, err)
	defer db.Close()
	for _, name := range []string{"001_init.sql", "002_subscription_count.sql", "003_summary_stale.sql", "004_parked.sql"} {
		body, err := migrations.ReadFile("migrations/directory/" + name)
		require.NoError(t, err)
		_, err = db.ExecContext(ctx, string(body))
		require.NoError(t, err)
	}
	_, err = db.ExecContext(ctx, `PRAGMA user_version = 4`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `insert into projects (id, name, token_hash, deployment, created_at) values ('default', 'default', ?, 0, 7)`, HashToken("itx_old"))
	require.NoError(t, err)

	_, _, err = migrate(ctx, db, "directory")
	require.NoError(t, err)
	d := &Directory{db: db}
	tok, p, err := d.TokenByHash(ctx, "itx_old", 9)
	require.NoError(t, err)
	require.Equal(t, "default", p.ID)
	require.Equal(t, Token{ID: "tok_default", ProjectID: "default", Label: "initial", CreatedAt: 7, LastUsedAt: 9}, tok)
}

// CreateStream refuses a project's stream past its bound with ELimitExceeded and writes nothing;
// each project is counted apart; creations racing for the last place cannot both pass; the
// count follows deletions and survives reopening the directory.
func TestDirectory_CreateStreamBounded(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "dir.db")
	d, err := OpenDirectory(ctx, file)
	require.NoError(t, err)
	defer func() { d.Close() }()
	for _, p := range []string{"p1", "p2", "p3"} {
		require.NoError(t, d.CreateProjectWithToken(ctx, Project{ID: p, Name: p, CreatedAt: 1}, Token{ID: "t" + p, ProjectID: p, Label: "l", CreatedAt: 1}, "tok"+p, nil))
	}
	create := func(project, path string, max int) error {
		return d.CreateStream(ctx, StreamEntry{StreamID: project + path, ProjectID: project, Path: path, CreatedAt: 2}, max)
	}
	// requireCount checks the kept count against the table itself.
	requireCount := func(t *testing.T, project string, want int) {
		t.Helper()
		got, err := d.CountStreams(ctx, project)
		require.NoError(t, err)
		require.Equal(t, want, got, "kept count of %s", project)
		require.NoError(t, d.db.QueryRowContext(ctx, `select count(*) from streams where project_id = ?`, project).Scan(&got))
		require.Equal(t, want, got, "entries of %s", project)
	}

	t.Run("refused past the bound, writing nothing", func(t *testing.T) {
		require.NoError(t, create("p1", "/a", 2))
		require.NoError(t, create("p1", "/b", 2))
		err := create("p1", "/c", 2)
		require.Equal(t, itx.ELimitExceeded, itx.ErrorCode(err), "%v", err)
		require.Contains(t, itx.ErrorMessage(err), "holds 2 streams")
		e, err := d.Stream(ctx, "p1", "/c")
		require.NoError(t, err)
		require.Nil(t, e, "no entry for the refused stream")
		requireCount(t, "p1", 2)
		require.NoError(t, create("p2", "/a", 2), "another project is counted apart")
		requireCount(t, "p2", 1)
		require.Contains(t, itx.ErrorMessage(create("p2", "/b", 1)), "holds 1 stream,")
		require.NoError(t, create("p1", "/c", 0), "0: no bound")
		requireCount(t, "p1", 3)
	})

	t.Run("racing creations take exactly the free places", func(t *testing.T) {
		const max, racers = 3, 16
		errs := make(chan error, racers)
		for i := range racers {
			go func() { errs <- create("p3", "/r"+itoa(int64(i)), max) }()
		}
		created := 0
		for range racers {
			err := <-errs
			if err == nil {
				created++
				continue
			}
			require.Equal(t, itx.ELimitExceeded, itx.ErrorCode(err), "%v", err)
		}
		require.Equal(t, max, created)
		requireCount(t, "p3", max)
	})

	t.Run("the count survives reopening", func(t *testing.T) {
		require.NoError(t, d.Close())
		d, err = OpenDirectory(ctx, file)
		require.NoError(t, err)
		requireCount(t, "p3", 3)
		require.Equal(t, itx.ELimitExceeded, itx.ErrorCode(create("p3", "/more", 3)))
	})

	t.Run("deleting a project drops its count", func(t *testing.T) {
		require.NoError(t, d.DeleteProject(ctx, "p1", nil))
		requireCount(t, "p1", 0)
		var rows int
		require.NoError(t, d.db.QueryRowContext(ctx, `select count(*) from stream_counts where project_id = 'p1'`).Scan(&rows))
		require.Zero(t, rows, "the count row goes with its project")
		requireCount(t, "p2", 1)
	})
}

// A directory from before stream_counts counts the streams it already holds: migration 006
// backfills the counts, and the bound applies to them at once.
func TestDirectory_MigratesStreamCounts(t *testing.T) {
	ctx := context.Background()
	db, err := openDB(filepath.Join(t.TempDir(), "dir.db"), true, 1)
	require.NoError(t, err)
	defer db.Close()
	for _, name := range []string{"001_init.sql", "002_subscription_count.sql", "003_summary_stale.sql", "004_parked.sql", "005_access.sql"} {
		body, err := migrations.ReadFile("migrations/directory/" + name)
		require.NoError(t, err)
		_, err = db.ExecContext(ctx, string(body))
		require.NoError(t, err)
	}
	_, err = db.ExecContext(ctx, `PRAGMA user_version = 5`)
	require.NoError(t, err)
	for _, p := range []string{"p1", "p2"} {
		_, err = db.ExecContext(ctx, `insert into projects (id, name, token_hash, created_at) values (?, ?, ?, 1)`, p, p, HashToken(p))
		require.NoError(t, err)
	}
	for _, path := range []string{"/a", "/b"} {
		_, err = db.ExecContext(ctx, `insert into streams (stream_id, project_id, path, created_at) values (?, 'p1', ?, 1)`, "s"+path, path)
		require.NoError(t, err)
	}

	_, _, err = migrate(ctx, db, "directory")
	require.NoError(t, err)
	d := &Directory{db: db}
	for project, want := range map[string]int{"p1": 2, "p2": 0} {
		got, err := d.CountStreams(ctx, project)
		require.NoError(t, err)
		require.Equal(t, want, got, project)
	}
	err = d.CreateStream(ctx, StreamEntry{StreamID: "s/c", ProjectID: "p1", Path: "/c", CreatedAt: 2}, 2)
	require.Equal(t, itx.ELimitExceeded, itx.ErrorCode(err), "%v", err)
	require.NoError(t, d.CreateStream(ctx, StreamEntry{StreamID: "t/c", ProjectID: "p2", Path: "/c", CreatedAt: 2}, 2))
}

func TestStream_KVUsage(t *testing.T) {
	ctx := context.Background()
	s, _ := mustCreateStream(t)
	count := func(prefix string) (int, int64) {
		t.Helper()
		keys, bytes, err := s.KVUsage(ctx, prefix)
		require.NoError(t, err)
		return keys, bytes
	}
	keys, bytes := count("p/")
	require.Equal(t, 0, keys)
	require.Equal(t, int64(0), bytes)

	require.NoError(t, s.Commit(ctx, Commit{KV: map[string][]byte{
		"p/a": []byte("123"), "p/bé": {}, "p0": []byte("outside"), "p": []byte("outside"), "o/z": []byte("outside"),
	}}))
	keys, bytes = count("p/")
	require.Equal(t, 2, keys)
	require.Equal(t, int64(len("a")+3+len("bé")), bytes, "bytes of keys after the prefix and values")

	require.NoError(t, s.Commit(ctx, Commit{KV: map[string][]byte{"p/a": []byte("1")}}))
	_, bytes = count("p/")
	require.Equal(t, int64(len("a")+1+len("bé")), bytes, "an overwrite counts its new value")

	t.Run("a prefix with no end", func(t *testing.T) {
		require.NoError(t, s.Commit(ctx, Commit{KV: map[string][]byte{"\xff\xffk": []byte("v")}}))
		keys, bytes := count("\xff\xff")
		require.Equal(t, 1, keys)
		require.Equal(t, int64(2), bytes)
		keys, _ = count("")
		require.Equal(t, 6, keys)
	})
}

// A commit's events go in as multi-row inserts of 64, 16 and 4 rows and then one by one: every
// field of every row must come back as it went in, whatever chunk it fell in, and a duplicate key
// inside a chunk fails the whole commit as it does row by row.
func TestStream_CommitInChunksRoundTrips(t *testing.T) {
	ctx := context.Background()
	for _, n := range []int{1, 3, 4, 5, 16, 21, 64, 87, 150} {
		s, _ := mustCreateStream(t)
		batch := events(1, n, 7)
		for i := range batch {
			e := &batch[i]
			if i%3 == 0 {
				e.IdempotencyKey = "k-" + itoa(e.Offset)
			}
			if i%4 == 1 {
				e.Metadata = json.RawMessage(`{"m":` + itoa(e.Offset) + `}`)
			}
			if i%5 == 2 {
				e.Provenance = []itx.Hop{{StreamID: "src", Path: "/src", Offset: e.Offset * 2, Subscription: "copy", Type: "orig"}}
			}
		}
		require.NoError(t, s.Commit(ctx, Commit{Events: batch, HeadOffset: int64(n), LastAppendAt: 9}), "n=%d", n)
		got, err := s.Events(ctx, Query{After: 0, UpTo: int64(n), Limit: 1000, IncludeEphemeral: true})
		require.NoError(t, err)
		require.Len(t, got, n)
		for i := range batch {
			want := batch[i]
			require.Equal(t, want.Offset, got[i].Offset, "n=%d row %d", n, i)
			require.Equal(t, want.Type, got[i].Type)
			require.JSONEq(t, string(want.Payload), string(got[i].Payload))
			require.Equal(t, want.IdempotencyKey, got[i].IdempotencyKey)
			require.Equal(t, want.Ephemeral, got[i].Ephemeral)
			require.Equal(t, want.CreatedAt, got[i].CreatedAt)
			require.Equal(t, want.Provenance, got[i].Provenance)
			if want.Metadata == nil {
				require.Nil(t, got[i].Metadata)
			} else {
				require.JSONEq(t, string(want.Metadata), string(got[i].Metadata))
			}
		}

		dup := events(int64(n)+1, 70, 0)
		dup[40].IdempotencyKey = batch[0].IdempotencyKey // inside the 64-row chunk
		require.Error(t, s.Commit(ctx, Commit{Events: dup, HeadOffset: int64(n) + 70, LastAppendAt: 10}))
		after, err := s.Events(ctx, Query{After: int64(n), UpTo: int64(n) + 70, Limit: 1000, IncludeEphemeral: true})
		require.NoError(t, err)
		require.Empty(t, after, "nothing of a failed commit is visible")
	}
}

// A snapshot reads a stream closed cleanly (its WAL checkpointed and gone) from its database
// file alone, making no -shm file, and is refused while a write-ahead log holds commits.
func TestStream_Snapshot(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "s.db")
	s, err := CreateStream(ctx, file, StreamMeta{StreamID: "id", ProjectID: "p", Path: "/snap", CreatedAt: 1})
	require.NoError(t, err)
	commitN := func(s *Stream, first int64, n int) {
		for i := range n {
			o := first + int64(i)
			require.NoError(t, s.Commit(ctx, Commit{Events: []itx.Event{{Offset: o, Type: "e", Payload: []byte(`{}`), CreatedAt: 2}}, HeadOffset: o, LastAppendAt: 2}))
		}
	}
	commitN(s, 1, 5)
	_, err = OpenSnapshot(ctx, file)
	require.ErrorIs(t, err, ErrWALPending, "the commits are in the WAL")
	require.NoError(t, s.Close())

	snap, err := OpenSnapshot(ctx, file)
	require.NoError(t, err)
	m, err := snap.Meta(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(5), m.HeadOffset)
	events, err := snap.Events(ctx, Query{After: 1, UpTo: 5, Limit: 10})
	require.NoError(t, err)
	require.Len(t, events, 4)
	require.Equal(t, int64(2), events[0].Offset)
	require.NoError(t, snap.Close())
	_, err = os.Stat(file + "-shm")
	require.ErrorIs(t, err, os.ErrNotExist, "the snapshot made no -shm file")

	s, err = OpenStream(ctx, file)
	require.NoError(t, err)
	defer s.Close()
	m, err = s.Meta(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(5), m.HeadOffset, "the stream is as it was")
}

// Trim deletes durable events through an offset, a chunk at a time, oldest first, keeping the
// stream/* records and the ephemeral rows; how far it reached survives a reopen and never moves
// back; the keys of deleted events are forgotten; the head stays.
func TestStream_Trim(t *testing.T) {
	ctx := context.Background()
	s, file := mustCreateStream(t)
	batch := events(1, 12, 6) // offsets 6 and 12 ephemeral
	batch[2].Type = "stream/subscription-configured"
	batch[3].Type = "Stream/not-core" // core types are case-sensitive
	batch[4].IdempotencyKey = "k5"
	require.NoError(t, s.Commit(ctx, Commit{Events: batch, HeadOffset: 12, LastAppendAt: 112}))

	sizes := func(offs ...int) (n int64) {
		for _, o := range offs {
			n += EventSize(&batch[o-1])
		}
		return n
	}
	trimmable, last, n, err := s.TrimmableBytes(ctx, 0, 12, 100)
	require.NoError(t, err)
	require.Equal(t, sizes(1, 2, 4, 5, 7, 8, 9, 10, 11), trimmable, "durable events, stream/* records aside")
	require.Equal(t, int64(11), last)
	require.Equal(t, 9, n)
	chunk, last, n, err := s.TrimmableBytes(ctx, 2, 9, 3)
	require.NoError(t, err)
	require.Equal(t, sizes(4, 5, 7), chunk, "a chunk: after 2, the first 3")
	require.Equal(t, int64(7), last)
	require.Equal(t, 3, n)
	chunk, last, n, err = s.TrimmableBytes(ctx, 7, 9, 3)
	require.NoError(t, err)
	require.Equal(t, sizes(8, 9), chunk, "up to 9")
	require.Equal(t, int64(9), last)
	require.Equal(t, 2, n)
	chunk, last, n, err = s.TrimmableBytes(ctx, 11, 12, 3)
	require.NoError(t, err)
	require.Zero(t, chunk)
	require.Equal(t, int64(11), last, "none: after")
	require.Zero(t, n)
	through, bytes, rows, err := s.TrimmableThroughBytes(ctx, sizes(1, 2)+1, 100)
	require.NoError(t, err)
	require.Equal(t, int64(4), through, "the oldest trimmable events coming to the bytes asked")
	require.Equal(t, sizes(1, 2, 4), bytes)
	require.Equal(t, 3, rows)
	through, bytes, _, err = s.TrimmableThroughBytes(ctx, 1<<40, 100)
	require.NoError(t, err)
	require.Equal(t, int64(11), through, "all of them, when they come to less")
	require.Equal(t, trimmable, bytes)
	through, bytes, rows, err = s.TrimmableThroughBytes(ctx, 1<<40, 2)
	require.NoError(t, err)
	require.Equal(t, int64(2), through, "no more rows than the limit")
	require.Equal(t, sizes(1, 2), bytes)
	require.Equal(t, 2, rows)

	deleted, reached, bytes, err := s.Trim(ctx, 9, 3)
	require.NoError(t, err)
	require.Equal(t, int64(3), deleted) // 1, 2, 4
	require.Equal(t, int64(4), reached, "a full chunk: more may follow")
	require.Equal(t, sizes(1, 2, 4), bytes)
	deleted, reached, bytes, err = s.Trim(ctx, 9, 3)
	require.NoError(t, err)
	require.Equal(t, int64(3), deleted) // 5, 7, 8
	require.Equal(t, int64(8), reached)
	require.Equal(t, sizes(5, 7, 8), bytes)
	deleted, reached, _, err = s.Trim(ctx, 9, 3)
	require.NoError(t, err)
	require.Equal(t, int64(1), deleted) // 9
	require.Equal(t, int64(9), reached)
	trimmable, _, _, err = s.TrimmableBytes(ctx, 0, 12, 100)
	require.NoError(t, err)
	require.Equal(t, sizes(10, 11), trimmable)
	got, err := s.Events(ctx, Query{After: 0, UpTo: 12, Limit: 100, IncludeEphemeral: true})
	require.NoError(t, err)
	require.Equal(t, []int64{3, 6, 10, 11, 12}, offsets(got))
	byKey, err := s.EventsByKeys(ctx, []string{"k5"})
	require.NoError(t, err)
	require.Empty(t, byKey)

	deleted, reached, bytes, err = s.Trim(ctx, 2, 3)
	require.NoError(t, err)
	require.Zero(t, deleted)
	require.Zero(t, bytes)
	require.Equal(t, int64(9), reached, "never moves back")
	require.NoError(t, s.Close())
	s2, err := OpenStream(ctx, file)
	require.NoError(t, err)
	defer s2.Close()
	m, err := s2.Meta(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(9), m.TrimmedThrough)
	require.Equal(t, int64(12), m.HeadOffset)
}

// LastCreatedBefore finds the last event created before a time, across gaps.
func TestStream_LastCreatedBefore(t *testing.T) {
	ctx := context.Background()
	s, _ := mustCreateStream(t)
	got, err := s.LastCreatedBefore(ctx, 1000)
	require.NoError(t, err)
	require.Zero(t, got, "an empty stream")
	batch := events(1, 20, 0) // created_at 101..120
	require.NoError(t, s.Commit(ctx, Commit{Events: batch, HeadOffset: 25, LastAppendAt: 120}))
	_, _, _, err = s.Trim(ctx, 7, 100) // a gap at 1..7
	require.NoError(t, err)
	for at, want := range map[int64]int64{0: 0, 101: 0, 108: 0, 109: 8, 110: 9, 115: 14, 120: 19, 121: 20, 1 << 40: 20} {
		got, err := s.LastCreatedBefore(ctx, at)
		require.NoError(t, err)
		require.Equal(t, want, got, "before %d", at)
	}
}

// OldestTrimmable skips what a trim keeps (stream/* records, ephemeral rows) and what it deleted.
func TestStream_OldestTrimmable(t *testing.T) {
	ctx := context.Background()
	s, _ := mustCreateStream(t)
	off, at, err := s.OldestTrimmable(ctx)
	require.NoError(t, err)
	require.Zero(t, off, "an empty stream")
	require.Zero(t, at)
	batch := events(1, 10, 3) // 3, 6 and 9 ephemeral; created_at 101..110
	batch[0].Type = "stream/subscription-configured"
	require.NoError(t, s.Commit(ctx, Commit{Events: batch, HeadOffset: 10, LastAppendAt: 110}))
	off, at, err = s.OldestTrimmable(ctx)
	require.NoError(t, err)
	require.Equal(t, [2]int64{2, 102}, [2]int64{off, at}, "past the stream/* record")
	_, _, _, err = s.Trim(ctx, 2, 100)
	require.NoError(t, err)
	off, at, err = s.OldestTrimmable(ctx)
	require.NoError(t, err)
	require.Equal(t, [2]int64{4, 104}, [2]int64{off, at}, "past the trimmed event and the ephemeral row")
	_, _, _, err = s.Trim(ctx, 10, 100)
	require.NoError(t, err)
	off, _, err = s.OldestTrimmable(ctx)
	require.NoError(t, err)
	require.Zero(t, off, "only what a trim keeps is left")
}

// fileBytes is the size of a database file with its WAL (0 for a file that is not there).
func fileBytes(t *testing.T, file string) int64 {
	t.Helper()
	var n int64
	for _, f := range []string{file, file + "-wal"} {
		st, err := os.Stat(f)
		if err == nil {
			n += st.Size()
		} else if !os.IsNotExist(err) {
			require.NoError(t, err)
		}
	}
	return n
}

// fillKiB commits n events with 1 KiB payloads after head, 1,000 per commit, and returns the new
// head.
func fillKiB(t *testing.T, s *Stream, head int64, n int) int64 {
	t.Helper()
	payload := json.RawMessage(`{"p":"` + strings.Repeat("x", 1024) + `"}`)
	for done := 0; done < n; {
		k := min(1000, n-done)
		batch := make([]itx.Event, k)
		for i := range batch {
			head++
			batch[i] = itx.Event{Offset: head, Type: "t", Payload: payload, CreatedAt: 100 + head}
		}
		require.NoError(t, s.Commit(context.Background(), Commit{Events: batch, HeadOffset: head, LastAppendAt: 100 + head}))
		done += k
	}
	return head
}

// A new stream's file gives what a trim freed back to the file system, a bounded chunk per
// Vacuum, keeping a little free for its next rows; what is left of the stream is intact.
func TestStream_Vacuum(t *testing.T) {
	ctx := context.Background()
	s, file := mustCreateStream(t)
	var mode int
	require.NoError(t, s.w.QueryRowContext(ctx, "PRAGMA auto_vacuum").Scan(&mode))
	require.Equal(t, 2, mode, "a new stream's file is auto_vacuum=INCREMENTAL")

	freed, left, err := s.Vacuum(ctx, 1<<20)
	require.NoError(t, err)
	require.Equal(t, [2]int64{0, 0}, [2]int64{freed, left}, "nothing deleted, nothing to give back")

	head := fillKiB(t, s, 0, 12_000) // about 14 MiB
	for {
		n, _, _, err := s.Trim(ctx, head-100, 5000)
		require.NoError(t, err)
		if n == 0 {
			break
		}
	}
	before, err := s.PageCount(ctx)
	require.NoError(t, err)
	const chunk = 1 << 20
	var total int64
	turns := 0
	for {
		freed, left, err := s.Vacuum(ctx, chunk)
		require.NoError(t, err)
		require.LessOrEqual(t, freed, int64(chunk)+s.pageSize, "one turn gives back its chunk (and a pointer-map page)")
		total += freed
		turns++
		if left == 0 {
			break
		}
		require.Positive(t, freed, "a turn that leaves more to do did some")
		require.Less(t, turns, 100)
	}
	require.Greater(t, turns, 5, "given back over several turns")
	after, err := s.PageCount(ctx)
	require.NoError(t, err)
	require.Equal(t, before-after, total/s.pageSize, "the file lost the pages given back")
	var free int64
	require.NoError(t, s.w.QueryRowContext(ctx, "PRAGMA freelist_count").Scan(&free))
	require.LessOrEqual(t, free*s.pageSize, int64(vacuumKeepMin), "what stays free is the keep")
	require.Less(t, after*s.pageSize, int64(3<<20), "the 100 events left and the keep")
	require.Less(t, fileBytes(t, file), int64(8<<20), "checkpointed: the database file was cut")
	freed, left, err = s.Vacuum(ctx, chunk)
	require.NoError(t, err)
	require.Equal(t, [2]int64{0, 0}, [2]int64{freed, left}, "done")

	got, err := s.Events(ctx, Query{After: 0, UpTo: head, Limit: 1000})
	require.NoError(t, err)
	require.Len(t, got, 100)
	require.Equal(t, head-99, got[0].Offset)
	var check string
	require.NoError(t, s.w.QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&check))
	require.Equal(t, "ok", check)
	fillKiB(t, s, head, 10) // and it takes appends after
	require.NoError(t, s.Close())
	require.Less(t, fileBytes(t, file), int64(3<<20), "closed: the WAL checkpointed and removed")
}

// makeOldStream makes a stream file as itx made them before auto_vacuum (NONE): the schema and
// the meta row, nothing else.
func makeOldStream(t *testing.T, file string) {
	t.Helper()
	ctx := context.Background()
	db, err := openDB(file, true, 1)
	require.NoError(t, err)
	_, _, err = migrate(ctx, db, "stream")
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `insert into stream_meta (id, stream_id, project_id, path, created_at, head_offset, last_append_at)
		values (1, 'sid', 'p', '/old', 1, 0, 0)`)
	require.NoError(t, err)
	require.NoError(t, db.Close())
}

// A stream file made before auto_vacuum opens, takes appends and trims as before; Vacuum has
// nothing to give back and leaves the file's mode as it is (no rewrite behind the operator's back).
func TestStream_VacuumOldFile(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "old.db")
	makeOldStream(t, file)
	s, err := OpenStream(ctx, file)
	require.NoError(t, err)
	defer s.Close()
	head := fillKiB(t, s, 0, 3000)
	n, _, _, err := s.Trim(ctx, head-10, 5000)
	require.NoError(t, err)
	require.Equal(t, int64(2990), n)
	before, err := s.PageCount(ctx)
	require.NoError(t, err)
	freed, left, err := s.Vacuum(ctx, 1<<20)
	require.NoError(t, err)
	require.Equal(t, [2]int64{0, 0}, [2]int64{freed, left})
	after, err := s.PageCount(ctx)
	require.NoError(t, err)
	require.Equal(t, before, after, "the file keeps its pages")
	var mode int
	require.NoError(t, s.w.QueryRowContext(ctx, "PRAGMA auto_vacuum").Scan(&mode))
	require.Equal(t, 0, mode, "still NONE")
	head = fillKiB(t, s, head, 100)
	got, err := s.Events(ctx, Query{After: 0, UpTo: head, Limit: 1000})
	require.NoError(t, err)
	require.Len(t, got, 110)
}

// EventsByKeys looks keys up 500 at a time: a look-up of more finds every one of them (a group
// commit's keyed events can be more than one chunk).
func TestStream_EventsByKeysPastOneChunk(t *testing.T) {
	ctx := context.Background()
	s, _ := mustCreateStream(t)
	evs := events(1, 1201, 0)
	keys := make([]string, len(evs))
	for i := range evs {
		keys[i] = "key-" + itoa(evs[i].Offset)
		evs[i].IdempotencyKey = keys[i]
	}
	require.NoError(t, s.Commit(ctx, Commit{Events: evs, HeadOffset: 1201}))
	byKey, err := s.EventsByKeys(ctx, append(keys, "absent"))
	require.NoError(t, err)
	require.Len(t, byKey, len(keys))
	for i, k := range keys {
		require.NotNil(t, byKey[k], k)
		require.Equal(t, evs[i].Offset, byKey[k].Offset, k)
	}
}

// A commit's EvictEphemeralThrough deletes the ephemeral rows at or below it, and only those:
// the ephemeral row just above it and the durable rows stay.
func TestStream_CommitEvictsEphemeralThroughItsBound(t *testing.T) {
	ctx := context.Background()
	s, _ := mustCreateStream(t)
	require.NoError(t, s.Commit(ctx, Commit{Events: events(1, 6, 2), HeadOffset: 6})) // ephemeral: 2, 4, 6
	require.NoError(t, s.Commit(ctx, Commit{Events: events(7, 1, 0), HeadOffset: 7, EvictEphemeralThrough: 4}))
	got, err := s.Events(ctx, Query{After: 0, UpTo: 7, Limit: 100, IncludeEphemeral: true})
	require.NoError(t, err)
	var offsets []int64
	for _, e := range got {
		offsets = append(offsets, e.Offset)
	}
	require.Equal(t, []int64{1, 3, 5, 6, 7}, offsets)
}

// A cursor row written again takes every field of the new one (the retry block, the skips, the
// in-flight fence, a delivered offset of 1), as it was first written.
func TestStream_CursorUpsertReplacesEveryField(t *testing.T) {
	ctx := context.Background()
	s, _ := mustCreateStream(t)
	first := CursorRow{Name: "hook", ConfiguredAtOffset: 1, CursorChangedAtOffset: 1, ConfirmedOffset: 1, Status: StatusActive, UpdatedAt: "a"}
	require.NoError(t, s.Commit(ctx, Commit{CursorUpserts: []CursorRow{first}}))
	second := CursorRow{Name: "hook", ConfiguredAtOffset: 2, CursorChangedAtOffset: 3, ConfirmedOffset: 4, DeliveredOffset: 1,
		Status: StatusHalted, Attempt: 5, NextAttemptAt: 6, FailingEventOffset: 7, FailingEventAttempt: 8, FailingEventSkips: 9,
		LastError: "refused", InFlightDeadlineAt: 10, InFlightConnectionGeneration: 11, UpdatedAt: "b"}
	require.NoError(t, s.Commit(ctx, Commit{CursorUpserts: []CursorRow{second}}))
	got, err := s.CursorRows(ctx)
	require.NoError(t, err)
	require.Equal(t, []CursorRow{second}, got)
}
