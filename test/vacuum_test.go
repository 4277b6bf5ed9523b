package test

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	_ "github.com/mattn/go-sqlite3" // sqliteCheck's "sqlite3"
	"github.com/stretchr/testify/require"
)

// appendKiB appends n events of type "k" with 1 KiB payloads ({"i": <its number from 0>, ...}),
// 500 per call, and returns the head.
func appendKiB(t *testing.T, s schema.Stream, n int) int64 {
	t.Helper()
	pad := strings.Repeat("x", 1024)
	var head int64
	for i := 0; i < n; i += 500 {
		batch := make([]itx.EventInput, min(500, n-i))
		for j := range batch {
			batch[j] = ev("k", fmt.Sprintf(`{"i":%d,"pad":%q}`, i+j, pad))
		}
		head = mustAppend(t, s, batch...).HeadOffset
	}
	return head
}

// largestStreamFile is the biggest stream database under dataDir: the one a test filled.
func largestStreamFile(t *testing.T, dataDir string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dataDir, "streams", "*.db"))
	require.NoError(t, err)
	var best string
	var size int64 = -1
	for _, f := range files {
		if n := dbBytes(t, f); n > size {
			best, size = f, n
		}
	}
	require.NotEmpty(t, best)
	return best
}

// dbBytes is the size of a database file with its WAL.
func dbBytes(t *testing.T, file string) int64 {
	t.Helper()
	var n int64
	for _, f := range []string{file, file + "-wal"} {
		if st, err := os.Stat(f); err == nil {
			n += st.Size()
		} else if !os.IsNotExist(err) {
			require.NoError(t, err)
		}
	}
	return n
}

// sqliteCheck opens a stream's database (itxd stopped) and returns its auto_vacuum mode and
// what PRAGMA integrity_check says.
func sqliteCheck(t *testing.T, file string) (autoVacuum int, integrity string) {
	t.Helper()
	db, err := sql.Open("sqlite3", file)
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.QueryRow("PRAGMA auto_vacuum").Scan(&autoVacuum))
	require.NoError(t, db.QueryRow("PRAGMA integrity_check").Scan(&integrity))
	return autoVacuum, integrity
}

// requireKiBEvents checks that the stream holds exactly the "k" events numbered from..to-1.
func requireKiBEvents(t *testing.T, s schema.Stream, from, to int) {
	t.Helper()
	events, err := client.ReadAll(ctxT(t), s, itx.Query{Types: []string{"k"}})
	require.NoError(t, err)
	require.Len(t, events, to-from)
	for i, e := range events {
		var p struct{ I int }
		require.NoError(t, json.Unmarshal(e.Payload, &p))
		require.Equal(t, from+i, p.I, "offset %d", e.Offset)
	}
}

// A trim of most of a stream gives the space back to the file system, over real RPC against a
// real itxd: the stream's file (with its WAL) shrinks while it stays loaded, and is small once
// itxd stopped and checkpointed it; what is left reads back, appends go on, the file is sound.
func TestStream_TrimGivesTheSpaceBack(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real itxd process")
	}
	dataDir := t.TempDir()
	metrics := freeAddr(t)
	proc := startItxd(t, dataDir, "--metrics", metrics)
	ctx := ctxT(t)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	s := stream(t, p, "/big")
	const n = 16_000 // about 20 MiB on disk
	head := appendKiB(t, s, n)
	file := largestStreamFile(t, dataDir)
	before := dbBytes(t, file)
	require.Greater(t, before, int64(16<<20))

	r, err := client.Trim(ctx, s, head-100)
	require.NoError(t, err)
	require.Equal(t, client.TrimResult{TrimmedThrough: head - 100, Deleted: head - 100}, r)
	waitUntil(t, "the trimmed events' space given back", func() bool { return dbBytes(t, file) < before/2 })
	require.Greater(t, scrapeMetric(t, metrics, "itx_vacuumed_bytes_total"), float64(before/2))
	mustAppend(t, s, ev("after", `{}`))
	requireKiBEvents(t, s, n-100, n)

	require.NoError(t, proc.stop(t))
	after := dbBytes(t, file)
	t.Logf("%d bytes before the trim, %d after it and a checkpoint", before, after)
	require.Less(t, after, int64(3<<20), "100 events, the schema and the free space a stream keeps (1 MiB)")
	mode, check := sqliteCheck(t, file)
	require.Equal(t, 2, mode, "auto_vacuum=INCREMENTAL")
	require.Equal(t, "ok", check)
}

// kill -9 of itxd inside a vacuum's transaction (pages into it, before its commit) leaves the
// stream consistent: after the restart the trim's reach, the head and every event left are
// there, appends go on, the vacuum starts again at load and gives the space back, and SQLite's
// integrity check passes.
func TestCrash_Kill9MidVacuum(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxdKilledAt(t, dataDir, "vacuum-mid-transaction")
	ctx := ctxT(t)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	s := stream(t, p, "/big")
	const n = 16_000
	head := appendKiB(t, s, n)
	file := largestStreamFile(t, dataDir)
	before := dbBytes(t, file)
	_, _ = client.Trim(ctx, s, head-100) // answered or not: the vacuum runs once it is done
	proc.requireKilledAtThePoint(t)
	t.Logf("killed: %d bytes with the WAL, from %d", dbBytes(t, file), before)

	proc = startItxd(t, dataDir)
	p = dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	s = stream(t, p, "/big")
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.Equal(t, head-100, info.TrimmedThrough, "the trim committed before the vacuum began")
	require.Equal(t, head, info.HeadOffset)
	requireKiBEvents(t, s, n-100, n)
	require.Equal(t, []int64{head + 1}, mustAppend(t, s, ev("after", `{}`)).Offsets)
	waitUntil(t, "the vacuum, started again at load, gave the space back", func() bool { return dbBytes(t, file) < before/2 })

	require.NoError(t, proc.stop(t))
	_, check := sqliteCheck(t, file)
	require.Equal(t, "ok", check)
}

// A stream file written by an older itxd (auto_vacuum NONE) opens, takes appends and trims as
// before; itxd does not rewrite it behind the operator's back (its freed pages stay in it, for
// its next events). The offline conversion the README gives (itxd stopped: PRAGMA auto_vacuum =
// INCREMENTAL; VACUUM) makes it give space back like a new one.
func TestUpgrade_OldStreamFileTrims(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	ctx := ctxT(t)
	dir := extractFixture(t, "v-1ccfd85")
	b, err := os.ReadFile(filepath.Join(dir, "expected.json"))
	require.NoError(t, err)
	var exp upgradeExpected
	require.NoError(t, json.Unmarshal(b, &exp))
	login := func(proc *itxdProcess) schema.Stream {
		return stream(t, dial(t, proc.addr).Login(ctx, exp.Tokens["project"]), "/mirror")
	}

	proc := startItxd(t, dir)
	s := login(proc)
	const n = 4000
	head := appendKiB(t, s, n)
	file := largestStreamFile(t, dir)
	r, err := client.Trim(ctx, s, head-10)
	require.NoError(t, err)
	require.Equal(t, head-10, r.TrimmedThrough)
	require.Positive(t, r.Deleted)
	requireKiBEvents(t, s, n-10, n)
	mustAppend(t, s, ev("after", `{}`))
	require.NoError(t, proc.stop(t))
	trimmed := dbBytes(t, file)
	mode, check := sqliteCheck(t, file)
	require.Equal(t, 0, mode, "still auto_vacuum NONE: not converted behind the operator's back")
	require.Equal(t, "ok", check)
	require.Greater(t, trimmed, int64(4<<20), "its freed pages stay in the file")

	// The README's conversion, itxd stopped.
	db, err := sql.Open("sqlite3", file)
	require.NoError(t, err)
	_, err = db.Exec("PRAGMA auto_vacuum = INCREMENTAL")
	require.NoError(t, err)
	_, err = db.Exec("VACUUM")
	require.NoError(t, err)
	require.NoError(t, db.Close())
	mode, check = sqliteCheck(t, file)
	require.Equal(t, 2, mode)
	require.Equal(t, "ok", check)
	require.Less(t, dbBytes(t, file), trimmed/2, "VACUUM rewrote it without the free pages")

	proc = startItxd(t, dir)
	s = login(proc)
	const more = 12_000 // well above the WAL's few MiB, which stays while the stream is loaded
	head = appendKiB(t, s, more)
	grown := dbBytes(t, file)
	r, err = client.Trim(ctx, s, head-10)
	require.NoError(t, err)
	require.Equal(t, head-10, r.TrimmedThrough)
	waitUntil(t, "the converted file gave the space back", func() bool { return dbBytes(t, file) < grown/2 })
	requireKiBEvents(t, s, more-10, more)
}
