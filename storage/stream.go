package storage

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/itx-dev/itx"
)

// StreamMeta is the stream's identity and head, kept in its own database.
type StreamMeta struct {
	StreamID     string
	ProjectID    string
	Path         string
	CreatedAt    int64
	HeadOffset   int64
	LastAppendAt int64
	// TrimmedThrough is the offset through which Trim deleted the events (0: none).
	TrimmedThrough int64
}

// Stream is one stream's SQLite database. Writes go through a single connection (the actor is
// the only writer); reads use a separate pool of WAL readers and never wait for a writer.
type Stream struct {
	file string
	w    *sql.DB
	r    *sql.DB

	insert  *sql.Stmt
	setHead *sql.Stmt
	// inserts holds multi-row inserts by row count (insertChunks), prepared on the first commit
	// that needs one: one statement per chunk costs a fraction of one per row (database/sql's
	// per-call work and cgo crossings), and a stream that only ever takes single events never
	// holds them. Only the writer (Commit) touches it.
	inserts map[int]*sql.Stmt

	// Reader statements are prepared on the first read: preparing takes a connection, and a
	// stream that is only appended to should not hold one.
	readOnce    sync.Once
	readErr     error
	readAll     *sql.Stmt
	readDurable *sql.Stmt

	// scan reads pages without a type filter, the catch-up path, on its own connections
	// (scan_cgo.go); nil where it is not available, and reads then use r.
	scan *scanPool

	// incremental: the file was made with auto_vacuum=INCREMENTAL, so Vacuum can give its free
	// pages back to the file system; pageSize is its page size in bytes.
	incremental bool
	pageSize    int64

	// migratedFrom and migratedTo are the schema versions opening the file found and left (the
	// same when it was current; from 0 for a new file).
	migratedFrom, migratedTo int
}

// Migrated says which schema versions opening the file found and left: from < to when this
// open upgraded it (from 0: a new file).
func (s *Stream) Migrated() (from, to int) { return s.migratedFrom, s.migratedTo }

// Incremental says whether the file was made with auto_vacuum=INCREMENTAL: only then can Vacuum
// give the space deletes free back to the file system. Files made before itx made them so keep
// their freed pages for their next rows until converted (README, "Upgrading").
func (s *Stream) Incremental() bool { return s.incremental }

// File is the stream's database file.
func (s *Stream) File() string { return s.file }

// ReaderConns is the number of read connections one stream keeps at most; ReaderIdleTime is
// how long an unused one stays open.
const (
	ReaderConns    = 4
	ReaderIdleTime = 2 * time.Second
)

// ErrNotCreated is what OpenStream says of a file whose creation never finished: a crash after
// the file was made but before its stream_meta row committed. Nothing was ever committed to such
// a file (events commit only after the row), so it is a stream that does not exist yet, and
// CreateStream finishes it.
var ErrNotCreated = errors.New("the stream database was never finished (no stream_meta row)")

// CreateStream creates the database at file for a new stream. It fails if the file holds a
// stream; a file left by a creation that crashed before its stream_meta row (ErrNotCreated) is
// finished instead.
func CreateStream(ctx context.Context, file string, meta StreamMeta) (*Stream, error) {
	s, err := openStream(ctx, file, true)
	if err != nil {
		return nil, err
	}
	res, err := s.w.ExecContext(ctx, `insert into stream_meta
		(id, stream_id, project_id, path, created_at, head_offset, last_append_at)
		values (1, ?, ?, ?, ?, ?, ?) on conflict (id) do nothing`,
		meta.StreamID, meta.ProjectID, meta.Path, meta.CreatedAt, meta.HeadOffset, meta.LastAppendAt)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err == nil && n == 0 {
		err = errors.New("file exists")
	}
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("create stream %s: %w", file, err)
	}
	return s, nil
}

// OpenStream opens an existing stream database, applying pending migrations. A file whose
// creation never finished fails with ErrNotCreated.
func OpenStream(ctx context.Context, file string) (*Stream, error) {
	s, err := openStream(ctx, file, false)
	if err != nil {
		return nil, err
	}
	var n int
	if err := s.w.QueryRowContext(ctx, `select count(*) from stream_meta`).Scan(&n); err != nil {
		s.Close()
		return nil, fmt.Errorf("open stream %s: %w", file, err)
	}
	if n == 0 {
		s.Close()
		return nil, fmt.Errorf("open stream %s: %w", file, ErrNotCreated)
	}
	return s, nil
}

func openStream(ctx context.Context, file string, create bool) (*Stream, error) {
	// A new stream's file is made with auto_vacuum=INCREMENTAL, so that the pages a trim or a
	// sweep frees can go back to the file system (Vacuum). SQLite takes the mode only while the
	// file has no page yet, and the itx pragmas' journal_mode=WAL writes the first one: mattn
	// applies its _auto_vacuum parameter on a connection before the ConnectHook runs. A file made
	// before (auto_vacuum NONE, or a creation cut short before this build) keeps its mode:
	// changing it takes a VACUUM that rewrites the whole file (README, "Retention").
	var params []string
	if create {
		params = append(params, "&_auto_vacuum=incremental")
	}
	w, err := openDB(file, create, 1, params...)
	if err != nil {
		return nil, fmt.Errorf("open stream %s: %w", file, err)
	}
	from, to, err := migrate(ctx, w, "stream")
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("open stream %s: %w", file, err)
	}
	var autoVacuum int
	var pageSize int64
	if err := w.QueryRowContext(ctx, `select auto_vacuum, page_size from pragma_auto_vacuum, pragma_page_size`).Scan(&autoVacuum, &pageSize); err != nil {
		w.Close()
		return nil, fmt.Errorf("open stream %s: %w", file, err)
	}
	// Readers open on demand and close after a short idle spell: every SQLite connection holds
	// ~150 KB, and a server keeps many streams loaded that nobody is reading.
	r, err := openPool(file, false, ReaderConns, nil)
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("open stream %s: %w", file, err)
	}
	r.SetConnMaxIdleTime(ReaderIdleTime)
	s := &Stream{file: file, w: w, r: r, incremental: autoVacuum == autoVacuumIncremental, pageSize: pageSize,
		migratedFrom: from, migratedTo: to}
	if openDSNSuffix == "" { // the power-cut test's VFS takes an exclusive lock: r only there
		s.scan = newScanPool(file)
	}
	prep := []struct {
		db   *sql.DB
		stmt **sql.Stmt
		q    string
	}{
		{w, &s.insert, insertSQL(1)},
		{w, &s.setHead, `update stream_meta set head_offset = ?, last_append_at = ? where id = 1`},
	}
	for _, p := range prep {
		if *p.stmt, err = p.db.PrepareContext(ctx, p.q); err != nil {
			s.Close()
			return nil, fmt.Errorf("open stream %s: prepare: %w", file, err)
		}
	}
	return s, nil
}

// Close closes both connection pools.
func (s *Stream) Close() error {
	if s.scan != nil {
		s.scan.close()
	}
	return errors.Join(s.w.Close(), s.r.Close())
}

// Meta reads the stream's identity and head.
func (s *Stream) Meta(ctx context.Context) (StreamMeta, error) {
	var m StreamMeta
	err := s.w.QueryRowContext(ctx, `select stream_id, project_id, path, created_at, head_offset, last_append_at, trimmed_through
		from stream_meta where id = 1`).Scan(&m.StreamID, &m.ProjectID, &m.Path, &m.CreatedAt, &m.HeadOffset, &m.LastAppendAt, &m.TrimmedThrough)
	if err != nil {
		return m, fmt.Errorf("read stream meta: %w", err)
	}
	return m, nil
}

// EventsByKeys returns the committed events holding any of keys, by key; absent keys are
// missing from the map. One statement per 500 keys, not one per key: every standalone query
// opens and closes its own read transaction.
func (s *Stream) EventsByKeys(ctx context.Context, keys []string) (map[string]*itx.Event, error) {
	out := map[string]*itx.Event{}
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), 500)]
		keys = keys[len(chunk):]
		args := make([]any, len(chunk))
		for i, k := range chunk {
			args[i] = k
		}
		rows, err := s.w.QueryContext(ctx, `select `+eventColumns+` from events where idempotency_key in (?`+
			strings.Repeat(`, ?`, len(chunk)-1)+`)`, args...)
		if err != nil {
			return nil, fmt.Errorf("look up idempotency keys: %w", err)
		}
		events, err := scanEvents(rows, len(chunk), 0)
		if err != nil {
			return nil, err
		}
		for i := range events {
			out[events[i].IdempotencyKey] = &events[i]
		}
	}
	return out, nil
}

// Commit is one group commit: events with their offsets assigned, the new head, and the state
// derived from them (cursor rows, the core-state checkpoint) so that it can never disagree with
// the log it was reduced from.
type Commit struct {
	Events        []itx.Event
	HeadOffset    int64
	LastAppendAt  int64
	CursorUpserts []CursorRow
	CursorDeletes []string // run before CursorUpserts (and ReaderDeletes before ReaderUpserts)
	ReaderUpserts []Reader
	ReaderDeletes []string
	KV            map[string][]byte
	// KVDeletes and KVDeletePrefixes (every key starting with one, except keys starting with
	// one of KVKeepPrefixes) run before the KV upserts.
	KVDeletes        []string
	KVDeletePrefixes []string
	KVKeepPrefixes   []string
	// Scheduled appends: deletes (landed or cancelled) run before upserts.
	ScheduledUpserts []Scheduled
	ScheduledDeletes []string
	// EvictEphemeralThrough, when set, deletes the ephemeral rows at or below it (the ephemeral
	// buffer's FIFO eviction), in the same transaction.
	EvictEphemeralThrough int64
}

// Commit writes c in one transaction. It returns only after SQLite reports the commit durable
// (synchronous=FULL: the WAL is fsynced), which is what lets the actor acknowledge appends.
func (s *Stream) Commit(ctx context.Context, c Commit) error {
	if err := s.prepareInserts(ctx, len(c.Events)); err != nil {
		return err
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("commit: begin: %w", err)
	}
	defer tx.Rollback()
	if err := s.insertEvents(ctx, tx, c.Events); err != nil {
		return err
	}
	if len(c.Events) > 0 {
		if _, err := tx.StmtContext(ctx, s.setHead).ExecContext(ctx, c.HeadOffset, c.LastAppendAt); err != nil {
			return fmt.Errorf("commit: head: %w", err)
		}
	}
	if c.EvictEphemeralThrough > 0 {
		if _, err := tx.ExecContext(ctx, `delete from events where ephemeral = 1 and offset <= ?`, c.EvictEphemeralThrough); err != nil {
			return fmt.Errorf("commit: evict ephemeral events: %w", err)
		}
	}
	for _, name := range c.CursorDeletes {
		if err := deleteCursor(ctx, tx, name); err != nil {
			return fmt.Errorf("commit: delete cursor %q: %w", name, err)
		}
	}
	for i := range c.CursorUpserts {
		if err := upsertCursor(ctx, tx, &c.CursorUpserts[i]); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
	}
	for _, name := range c.ReaderDeletes {
		if _, err := tx.ExecContext(ctx, `delete from readers where name = ?`, name); err != nil {
			return fmt.Errorf("commit: delete reader %q: %w", name, err)
		}
	}
	for i := range c.ReaderUpserts {
		if err := upsertReader(ctx, tx, &c.ReaderUpserts[i]); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
	}
	for _, key := range c.ScheduledDeletes {
		if _, err := tx.ExecContext(ctx, `delete from scheduled_events where key = ?`, key); err != nil {
			return fmt.Errorf("commit: delete scheduled event %q: %w", key, err)
		}
	}
	for i := range c.ScheduledUpserts {
		if err := upsertScheduled(ctx, tx, &c.ScheduledUpserts[i]); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
	}
	for _, k := range c.KVDeletes {
		if _, err := tx.ExecContext(ctx, `delete from kv where key = ?`, k); err != nil {
			return fmt.Errorf("commit: delete kv %q: %w", k, err)
		}
	}
	for _, prefix := range c.KVDeletePrefixes {
		q, args := `delete from kv where key >= ?`, []any{prefix}
		if end, ok := prefixEnd(prefix); ok {
			q, args = q+` and key < ?`, append(args, end)
		} else {
			q, args = q+` and substr(cast(key as blob), 1, ?) = cast(? as blob)`, append(args, len(prefix), prefix)
		}
		for _, keep := range c.KVKeepPrefixes {
			if strings.HasPrefix(keep, prefix) {
				q, args = q+` and substr(cast(key as blob), 1, ?) <> cast(? as blob)`, append(args, len(keep), keep)
			}
		}
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("commit: delete kv under %q: %w", prefix, err)
		}
	}
	for k, v := range c.KV {
		if _, err := tx.ExecContext(ctx, `insert into kv (key, value) values (?, ?)
			on conflict (key) do update set value = excluded.value`, k, v); err != nil {
			return fmt.Errorf("commit: kv %q: %w", k, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// insertChunks are the row counts of the multi-row inserts, largest first: a commit's events go
// in as many of the largest as fit, then the smaller ones, then one by one. 64 rows of 8 columns
// stay far below SQLite's bound on bound parameters (32,766).
var insertChunks = [...]int{64, 16, 4}

const insertColumns = `insert into events
	(offset, type, payload, metadata, idempotency_key, created_at, ephemeral, provenance) values `

// insertEvents inserts events in order within tx.
func (s *Stream) insertEvents(ctx context.Context, tx *sql.Tx, events []itx.Event) error {
	args := make([]any, 0, 8*min(len(events), insertChunks[0]))
	for len(events) > 0 {
		n := 1
		for _, k := range insertChunks {
			if len(events) >= k {
				n = k
				break
			}
		}
		stmt := s.insert
		if n > 1 {
			stmt = s.inserts[n]
		}
		args = args[:0]
		for i := range events[:n] {
			e := &events[i]
			var metadata, key, provenance any
			if len(e.Metadata) > 0 {
				metadata = string(e.Metadata)
			}
			if e.IdempotencyKey != "" {
				key = e.IdempotencyKey
			}
			if len(e.Provenance) > 0 {
				b, err := json.Marshal(e.Provenance)
				if err != nil {
					return fmt.Errorf("commit: provenance: %w", err)
				}
				provenance = string(b)
			}
			args = append(args, e.Offset, e.Type, string(e.Payload), metadata, key, e.CreatedAt, e.Ephemeral, provenance)
		}
		if _, err := tx.StmtContext(ctx, stmt).ExecContext(ctx, args...); err != nil {
			if n == 1 {
				return fmt.Errorf("commit: insert offset %d: %w", events[0].Offset, err)
			}
			return fmt.Errorf("commit: insert offsets %d-%d: %w", events[0].Offset, events[n-1].Offset, err)
		}
		events = events[n:]
	}
	return nil
}

// prepareInserts prepares the multi-row inserts a commit of n events uses that are not prepared
// yet. It runs before the commit's transaction takes the writer's one connection.
func (s *Stream) prepareInserts(ctx context.Context, n int) error {
	for _, k := range insertChunks {
		if n < k || s.inserts[k] != nil {
			continue
		}
		st, err := s.w.PrepareContext(ctx, insertSQL(k))
		if err != nil {
			return fmt.Errorf("commit: prepare a %d-row insert: %w", k, err)
		}
		if s.inserts == nil {
			s.inserts = map[int]*sql.Stmt{}
		}
		s.inserts[k] = st
	}
	return nil
}

// insertSQL is the insert of n rows.
func insertSQL(n int) string {
	var q strings.Builder
	q.WriteString(insertColumns)
	for i := range n {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("(?, ?, ?, ?, ?, ?, ?, ?)")
	}
	return q.String()
}

// Query selects a page of events: offsets in (After, UpTo], at most Limit rows, and, when
// MaxBytes is set, ending after the row that brings the page's size (itx.Event.Size) to MaxBytes
// or more: the first row always goes.
type Query struct {
	After            int64
	UpTo             int64
	Limit            int
	MaxBytes         int // 0: no size bound
	Types            []string
	IncludeEphemeral bool
}

// Cut reports whether page, read for q, may have stopped before q.UpTo: it holds Limit events or
// reached MaxBytes. The reader then continues after its last event; otherwise the page covered
// all of (After, UpTo]. A page that reached a bound exactly at the end of the range counts as cut:
// the next read is then merely empty.
func (q Query) Cut(page []itx.Event) bool {
	if len(page) == 0 {
		return false
	}
	if len(page) >= q.Limit {
		return true
	}
	return q.MaxBytes > 0 && pageBytes(page) >= q.MaxBytes
}

func pageBytes(page []itx.Event) int {
	n := 0
	for i := range page {
		n += page[i].Size()
	}
	return n
}

func (s *Stream) prepareReads(ctx context.Context) error {
	s.readOnce.Do(func() {
		if s.readAll, s.readErr = s.r.PrepareContext(ctx, readAllQuery); s.readErr != nil {
			return
		}
		s.readDurable, s.readErr = s.r.PrepareContext(ctx, readDurableQuery)
	})
	return s.readErr
}

// Events reads a page. Reads run on the reader pool beside the writer.
func (s *Stream) Events(ctx context.Context, q Query) ([]itx.Event, error) {
	if q.Limit <= 0 || q.After >= q.UpTo {
		return nil, nil
	}
	if s.scan != nil && len(q.Types) == 0 {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("read events: %w", err)
		}
		return s.scan.events(ctx, q)
	}
	if err := s.prepareReads(context.Background()); err != nil {
		return nil, fmt.Errorf("read events: prepare: %w", err)
	}
	var rows *sql.Rows
	var err error
	switch {
	case len(q.Types) == 0 && q.IncludeEphemeral:
		rows, err = s.readAll.QueryContext(ctx, q.After, q.UpTo, q.Limit)
	case len(q.Types) == 0:
		rows, err = s.readDurable.QueryContext(ctx, q.After, q.UpTo, q.Limit)
	default:
		var b strings.Builder
		b.WriteString(`select ` + eventColumns + ` from events where offset > ? and offset <= ?`)
		if !q.IncludeEphemeral {
			b.WriteString(` and ephemeral = 0`)
		}
		b.WriteString(` and type in (?` + strings.Repeat(`, ?`, len(q.Types)-1) + `) order by offset limit ?`)
		args := []any{q.After, q.UpTo}
		for _, t := range q.Types {
			args = append(args, t)
		}
		args = append(args, q.Limit)
		rows, err = s.r.QueryContext(ctx, b.String(), args...)
	}
	if err != nil {
		return nil, fmt.Errorf("read events: %w", err)
	}
	return scanEvents(rows, q.Limit, q.MaxBytes)
}

const eventColumns = `offset, type, payload, metadata, idempotency_key, created_at, ephemeral, provenance`

// The page queries without a type filter; scan_cgo.go reads their columns by position.
const (
	readAllQuery     = `select ` + eventColumns + ` from events where offset > ? and offset <= ? order by offset limit ?`
	readDurableQuery = `select ` + eventColumns + ` from events where offset > ? and offset <= ? and ephemeral = 0 order by offset limit ?`
)

// scanEvents reads rows into events, stopping after the row that brings their size to maxBytes
// or more (0: no bound); closing rows then leaves the rest of them unread.
func scanEvents(rows *sql.Rows, capacity, maxBytes int) ([]itx.Event, error) {
	defer rows.Close()
	// Sized for the page up front (a catch-up page is 1,000 events): growing it row by row
	// copies every event several times.
	events := make([]itx.Event, 0, min(capacity, 1024))
	size := 0
	for (maxBytes <= 0 || size < maxBytes) && rows.Next() {
		var e itx.Event
		var payload, metadata []byte // scanned into fresh slices: one copy, no string detour
		var key, provenance sql.NullString
		if err := rows.Scan(&e.Offset, &e.Type, &payload, &metadata, &key, &e.CreatedAt, &e.Ephemeral, &provenance); err != nil {
			return nil, fmt.Errorf("read events: %w", err)
		}
		e.Payload = json.RawMessage(payload)
		if metadata != nil {
			e.Metadata = json.RawMessage(metadata)
		}
		e.IdempotencyKey = key.String
		if provenance.Valid {
			if err := json.Unmarshal([]byte(provenance.String), &e.Provenance); err != nil {
				return nil, fmt.Errorf("read events: offset %d provenance: %w", e.Offset, err)
			}
		}
		size += e.Size()
		events = append(events, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read events: %w", err)
	}
	return events, nil
}

// ephemeralSize is what one ephemeral row counts against the buffer: its type, payload and
// metadata bytes.
const ephemeralSize = `length(cast(type as blob)) + length(cast(payload as blob)) + coalesce(length(cast(metadata as blob)), 0)`

// EphemeralBytes is the size of the ephemeral rows the stream holds.
func (s *Stream) EphemeralBytes(ctx context.Context) (int64, error) {
	var n int64
	if err := s.w.QueryRowContext(ctx, `select coalesce(sum(`+ephemeralSize+`), 0) from events where ephemeral = 1`).Scan(&n); err != nil {
		return 0, fmt.Errorf("ephemeral bytes: %w", err)
	}
	return n, nil
}

// EphemeralCutoff finds the oldest ephemeral rows that together hold at least need bytes: it
// returns the offset to evict through and the bytes that frees (less than need when the stream
// holds less).
func (s *Stream) EphemeralCutoff(ctx context.Context, need int64) (through, freed int64, err error) {
	rows, err := s.w.QueryContext(ctx, `select offset, `+ephemeralSize+` from events where ephemeral = 1 order by offset`)
	if err != nil {
		return 0, 0, fmt.Errorf("ephemeral cutoff: %w", err)
	}
	defer rows.Close()
	for freed < need && rows.Next() {
		var size int64
		if err := rows.Scan(&through, &size); err != nil {
			return 0, 0, fmt.Errorf("ephemeral cutoff: %w", err)
		}
		freed += size
	}
	return through, freed, rows.Err()
}

// Trim deletes, in one transaction, at most limit durable events with offsets up to and
// including through, oldest first, except stream/* records (the core state is reduced from
// them), and records how far the stream is trimmed: through when no such event is left at or
// below it, else the offset of the last one deleted. reached is never below what an earlier
// trim reached; bytes is the deleted events' size (EventSize). Offsets are never reissued: the head lives in stream_meta. Ephemeral rows are
// left to their own sweep.
func (s *Stream) Trim(ctx context.Context, through int64, limit int) (deleted, reached, bytes int64, err error) {
	return s.TrimNoting(ctx, through, limit, nil)
}

// TrimNoting is Trim, writing in its transaction the KV entries note returns for what it
// deleted and reached (note may be nil, and may return nil): what a trim records of itself
// commits with the deletion.
func (s *Stream) TrimNoting(ctx context.Context, through int64, limit int, note func(deleted, reached int64) map[string][]byte) (deleted, reached, bytes int64, err error) {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("trim: %w", err)
	}
	defer tx.Rollback()
	var last sql.NullInt64
	if err := tx.QueryRowContext(ctx, `select max(offset), count(*), coalesce(sum(size), 0) from (select offset, `+eventSizeSQL+` as size from events
		where offset <= ? and ephemeral = 0 and substr(type, 1, 7) != 'stream/' order by offset limit ?)`, through, limit).Scan(&last, &deleted, &bytes); err != nil {
		return 0, 0, 0, fmt.Errorf("trim: %w", err)
	}
	reached = through
	if deleted > 0 {
		if _, err := tx.ExecContext(ctx, `delete from events where offset <= ? and ephemeral = 0 and substr(type, 1, 7) != 'stream/'`, last.Int64); err != nil {
			return 0, 0, 0, fmt.Errorf("trim: %w", err)
		}
		if deleted == int64(limit) {
			reached = last.Int64 // more may follow
		}
	}
	if _, err := tx.ExecContext(ctx, `update stream_meta set trimmed_through = max(trimmed_through, ?) where id = 1`, reached); err != nil {
		return 0, 0, 0, fmt.Errorf("trim: %w", err)
	}
	if err := tx.QueryRowContext(ctx, `select trimmed_through from stream_meta where id = 1`).Scan(&reached); err != nil {
		return 0, 0, 0, fmt.Errorf("trim: %w", err)
	}
	if note != nil {
		for k, v := range note(deleted, reached) {
			if _, err := tx.ExecContext(ctx, `insert into kv (key, value) values (?, ?)
				on conflict (key) do update set value = excluded.value`, k, v); err != nil {
				return 0, 0, 0, fmt.Errorf("trim: kv %q: %w", k, err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, 0, 0, fmt.Errorf("trim: %w", err)
	}
	return deleted, reached, bytes, nil
}

// LastCreatedBefore returns the offset of the last event created before t (epoch ms, the
// server's clock at its commit), 0 if the first one was not. It bisects over offsets, a seek
// per step: the times follow the offsets while the server's clock does not step back. If it
// did, the answer is some offset whose event was created before t and whose next one was not:
// it may stop short of an event created before t that a later-stamped one precedes, and it may
// pass events stamped at or after t that precede it (committed before the step, by a clock that
// was ahead). A trim to it deletes a prefix of the log, in commit order, either way.
func (s *Stream) LastCreatedBefore(ctx context.Context, t int64) (int64, error) {
	var head int64
	if err := s.w.QueryRowContext(ctx, `select head_offset from stream_meta where id = 1`).Scan(&head); err != nil {
		return 0, fmt.Errorf("last created before: %w", err)
	}
	// Every row at or below lo was created before t; no row at or above hi was, or none is there.
	lo, hi := int64(0), head+1
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		var off, at int64
		err := s.w.QueryRowContext(ctx, `select offset, created_at from events where offset >= ? and offset < ? order by offset limit 1`, mid, hi).Scan(&off, &at)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			hi = mid // no row in [mid, hi): the rows below mid decide
		case err != nil:
			return 0, fmt.Errorf("last created before: %w", err)
		case at < t:
			lo = off
		default:
			hi = off
		}
	}
	return lo, nil
}

// eventSizeSQL is EventSize of an events row, read from the row's header alone (octet_length
// does not load the value).
const eventSizeSQL = `octet_length(type) + octet_length(payload) + coalesce(octet_length(metadata), 0) + coalesce(octet_length(idempotency_key), 0)`

// EventSize is the size of an event as a retention policy's maxBytes counts it, and as
// itx.MaxEventBytes bounds it: its type, payload, metadata and idempotency key.
func EventSize(e *itx.Event) int64 {
	return int64(len(e.Type) + len(e.Payload) + len(e.Metadata) + len(e.IdempotencyKey))
}

// Trimmable reports whether a trim may delete an event of this kind: a durable one that is not a
// stream/* record.
func Trimmable(e *itx.Event) bool { return !e.Ephemeral && !strings.HasPrefix(e.Type, "stream/") }

// TrimmableBytes is the size (EventSize) of the events a trim could delete (durable, not stream/*
// records) among the first limit such events with offsets in (after, upTo], and the offset of the
// last of them (after when there is none) and how many there were: a stream's whole size is
// measured a chunk at a time. It reads the rows' headers only.
func (s *Stream) TrimmableBytes(ctx context.Context, after, upTo int64, limit int) (bytes, last int64, n int, err error) {
	var lastOff sql.NullInt64
	if err := s.w.QueryRowContext(ctx, `select coalesce(sum(size), 0), max(offset), count(*) from (select offset, `+eventSizeSQL+` as size
		from events where offset > ? and offset <= ? and ephemeral = 0 and substr(type, 1, 7) != 'stream/' order by offset limit ?)`,
		after, upTo, limit).Scan(&bytes, &lastOff, &n); err != nil {
		return 0, 0, 0, fmt.Errorf("trimmable bytes: %w", err)
	}
	last = after
	if lastOff.Valid {
		last = lastOff.Int64
	}
	return bytes, last, n, nil
}

// TrimmableThroughBytes is the offset through which the oldest events a trim could delete come
// to at least want bytes (EventSize), and their size; the last such event and the size of them
// all when they come to less. It reads at most limit rows' headers (n says how many): through
// is then where those end, short of want.
func (s *Stream) TrimmableThroughBytes(ctx context.Context, want int64, limit int) (through, bytes int64, n int, err error) {
	rows, err := s.w.QueryContext(ctx, `select offset, `+eventSizeSQL+` from events
		where ephemeral = 0 and substr(type, 1, 7) != 'stream/' order by offset limit ?`, limit)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("trimmable through bytes: %w", err)
	}
	defer rows.Close()
	for bytes < want && rows.Next() {
		var size int64
		if err := rows.Scan(&through, &size); err != nil {
			return 0, 0, 0, fmt.Errorf("trimmable through bytes: %w", err)
		}
		bytes += size
		n++
	}
	return through, bytes, n, rows.Err()
}

// OldestTrimmable returns the offset and creation time (epoch ms) of the stream's first event
// a trim could delete (durable, not a stream/* record); 0, 0 when it has none.
func (s *Stream) OldestTrimmable(ctx context.Context) (offset, createdAt int64, err error) {
	err = s.w.QueryRowContext(ctx, `select offset, created_at from events
		where ephemeral = 0 and substr(type, 1, 7) != 'stream/' order by offset limit 1`).Scan(&offset, &createdAt)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("oldest trimmable event: %w", err)
	}
	return offset, createdAt, nil
}

// DeleteEphemeral deletes ephemeral rows with offsets up to and including through and created
// before before (epoch ms), returning how many went. Offsets are never reissued: the head lives
// in stream_meta.
func (s *Stream) DeleteEphemeral(ctx context.Context, through, before int64) (int64, error) {
	res, err := s.w.ExecContext(ctx, `delete from events where ephemeral = 1 and offset <= ? and created_at < ?`, through, before)
	if err != nil {
		return 0, fmt.Errorf("delete ephemeral events: %w", err)
	}
	return res.RowsAffected()
}

// autoVacuumIncremental is PRAGMA auto_vacuum's value for INCREMENTAL.
const autoVacuumIncremental = 2

// The free space a stream's file keeps for its next rows rather than give it back (Vacuum):
// SQLite fills free pages before it grows the file, so what a stream frees and soon writes again
// (a retention policy trimming each minute what the last minute appended, ephemeral rows swept
// as new ones arrive) stays in the file instead of being moved out and written back. It is an
// eighth of the bytes in use, at least vacuumKeepMin and at most vacuumKeepMax.
const (
	vacuumKeepMin   = 1 << 20
	vacuumKeepMax   = 64 << 20
	vacuumKeepShare = 8
)

// vacuumPageHook, when set (tests), runs inside Vacuum's transaction after each page it gave
// back, with how many so far: a crash test kills the process there, mid-transaction.
var vacuumPageHook func(pages int64)

// Vacuum gives free pages of the stream's file (left by deletes: trims, sweeps, KV deletes) back
// to the file system: about maxBytes of them in one transaction (PRAGMA incremental_vacuum moves
// the pages in use at the end of the file into free ones below and cuts the file; the
// pointer-map pages past the new end go too), keeping the free space the bounds above say.
// freed is what it gave back, left what is still free beyond the keep: more calls are owed while
// it is positive. The transaction holds the writer, so maxBytes bounds how long an append waits
// behind it; a crash in it leaves the file as it was. The call that leaves nothing to give back
// checkpoints the WAL (PASSIVE: it never waits for a reader), which is when SQLite cuts the
// database file, rather than at the next checkpoint. A file made without auto_vacuum (before
// itx made them so) has nothing to give back: 0, 0.
func (s *Stream) Vacuum(ctx context.Context, maxBytes int64) (freed, left int64, err error) {
	if !s.incremental {
		return 0, 0, nil
	}
	// Read before the transaction: the one writer is the caller, and a stream with nothing to
	// give back (most calls) costs no write lock.
	const sizes = `select freelist_count, page_count from pragma_freelist_count, pragma_page_count`
	var free, total int64
	if err := s.w.QueryRowContext(ctx, sizes).Scan(&free, &total); err != nil {
		return 0, 0, fmt.Errorf("vacuum: %w", err)
	}
	keep := min(max((total-free)*s.pageSize/vacuumKeepShare, vacuumKeepMin), vacuumKeepMax) / s.pageSize
	over := free - keep
	if over <= 0 {
		return 0, 0, nil
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("vacuum: %w", err)
	}
	defer tx.Rollback()
	// incremental_vacuum answers a row per page it gave back and does one page per step: the
	// rows must be read to the end (an Exec would give back one page).
	rows, err := tx.QueryContext(ctx, fmt.Sprintf("PRAGMA incremental_vacuum(%d)", max(min(over, maxBytes/s.pageSize), 1)))
	if err != nil {
		return 0, 0, fmt.Errorf("vacuum: %w", err)
	}
	var pages int64
	for rows.Next() {
		pages++
		if vacuumPageHook != nil {
			vacuumPageHook(pages)
		}
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return 0, 0, fmt.Errorf("vacuum: %w", err)
	}
	// The file also loses the pointer-map pages past its new end, which count as no row.
	var freeAfter, totalAfter int64
	if err := tx.QueryRowContext(ctx, sizes).Scan(&freeAfter, &totalAfter); err != nil {
		return 0, 0, fmt.Errorf("vacuum: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, 0, fmt.Errorf("vacuum: %w", err)
	}
	freed, left = (total-totalAfter)*s.pageSize, max(freeAfter-keep, 0)*s.pageSize
	if left == 0 {
		// The commit is durable already: a checkpoint that fails only leaves the cut to the
		// next one.
		var busy, logged, done int
		_ = s.w.QueryRowContext(ctx, `PRAGMA wal_checkpoint(PASSIVE)`).Scan(&busy, &logged, &done)
	}
	return freed, left, nil
}
