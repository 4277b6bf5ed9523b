package storage

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/itx-dev/itx"
)

// Directory is the server-level database: projects and their tokens, the streams that exist,
// and the alarms that must wake streams after a restart.
type Directory struct {
	db *sql.DB
	// commits counts the write transactions committed (each one fsync): Commits.
	commits *atomic.Int64
	// MigratedFrom and MigratedTo are the schema versions OpenDirectory found and left: equal
	// when it had nothing to do, MigratedFrom 0 for a new directory.
	MigratedFrom, MigratedTo int
}

// Project is a login root.
type Project struct {
	ID         string
	Name       string
	Deployment bool // the deployment root, holding global streams
	CreatedAt  int64
}

// StreamEntry is the directory's record of one stream.
type StreamEntry struct {
	StreamID     string
	ProjectID    string
	Path         string
	CreatedAt    int64
	HeadOffset   int64
	LastAppendAt int64
	// SubscriptionCount, HaltedSubscriptions, MaxLag, ReaderCount and ParkedSubscriptions are
	// refreshed with the head summary.
	SubscriptionCount   int
	HaltedSubscriptions int
	MaxLag              int64 // the largest lag of a subscription or registered reader
	ReaderCount         int   // registered readers
	ParkedSubscriptions int   // subscriptions parked (receiver absent)
	// SummaryStale: the stream may have moved since its summary was refreshed.
	SummaryStale bool
	// Born: the stream's first commit landed (an append, or a reader's registration at head 0),
	// so it exists; an entry not born is a creation in flight, cut short, or whose first commit
	// failed (see CreateStream).
	Born bool
}

// OpenDirectory opens or creates the directory database at file.
func OpenDirectory(ctx context.Context, file string) (*Directory, error) {
	commits := new(atomic.Int64)
	db, err := openCountedDB(file, true, 4, commits)
	if err != nil {
		return nil, fmt.Errorf("open directory: %w", err)
	}
	from, to, err := migrate(ctx, db, "directory")
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open directory: %w", err)
	}
	return &Directory{db: db, commits: commits, MigratedFrom: from, MigratedTo: to}, nil
}

// Commits is how many write transactions the directory has committed since it was opened, each
// one fsync: what work that touches many streams (a start's refresh of their summaries) is
// counted by.
func (d *Directory) Commits() int64 { return d.commits.Load() }

// Close closes the database.
func (d *Directory) Close() error { return d.db.Close() }

// HashToken is how tokens are stored: never in the clear.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// Projects lists every project.
func (d *Directory) Projects(ctx context.Context) ([]Project, error) {
	return d.projects(ctx, `select id, name, deployment, created_at from projects order by created_at, id`)
}

func (d *Directory) projects(ctx context.Context, query string, args ...any) ([]Project, error) {
	rows, err := d.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list projects: %w", err)
	}
	defer rows.Close()
	var out []Project
	for rows.Next() {
		var p Project
		if err := rows.Scan(&p.ID, &p.Name, &p.Deployment, &p.CreatedAt); err != nil {
			return nil, fmt.Errorf("list projects: %w", err)
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// ProjectsAfter lists up to limit projects in id order, after the id after (exclusive).
func (d *Directory) ProjectsAfter(ctx context.Context, after string, limit int) ([]Project, error) {
	return d.projects(ctx, `select id, name, deployment, created_at from projects where id > ? order by id limit ?`, after, limit)
}

// Stream returns the directory entry of (projectID, path), or nil if the stream does not exist.
func (d *Directory) Stream(ctx context.Context, projectID, path string) (*StreamEntry, error) {
	var e StreamEntry
	err := d.db.QueryRowContext(ctx, `select stream_id, project_id, path, created_at, head_offset, last_append_at,
		subscription_count, halted_subscriptions, max_lag, reader_count, parked_subscriptions, summary_stale, born from streams where project_id = ? and path = ?`, projectID, path).
		Scan(&e.StreamID, &e.ProjectID, &e.Path, &e.CreatedAt, &e.HeadOffset, &e.LastAppendAt, &e.SubscriptionCount, &e.HaltedSubscriptions, &e.MaxLag, &e.ReaderCount, &e.ParkedSubscriptions, &e.SummaryStale, &e.Born)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up stream %s: %w", path, err)
	}
	return &e, nil
}

// CreateStream records a new stream, its summary stale (its first commit follows). It is
// committed before the stream's database is created, so a crash before the stream's first commit
// leaves an entry whose database is missing, unfinished or empty: the stream does not exist yet
// (it is not listed), and the next start deletes the entry (DeleteUnfinishedStream).
//
// A project holding max streams already (max > 0) is refused with ELimitExceeded, writing
// nothing. The count and the insert are one transaction, begun with the write lock held
// (_txlock=immediate), so two creations racing for a project's last place cannot both pass. The
// count is the project's stream_counts row, which triggers keep in step with the streams table.
func (d *Directory) CreateStream(ctx context.Context, e StreamEntry, max int) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("create stream %s: %w", e.Path, err)
	}
	defer tx.Rollback()
	if max > 0 {
		n, err := countStreams(ctx, tx, e.ProjectID)
		if err != nil {
			return fmt.Errorf("create stream %s: %w", e.Path, err)
		}
		if n >= max {
			noun := "streams"
			if n == 1 {
				noun = "stream"
			}
			return itx.Errorf(itx.ELimitExceeded, "the project holds %d %s, its most", n, noun)
		}
	}
	_, err = tx.ExecContext(ctx, `insert into streams (stream_id, project_id, path, created_at, head_offset, last_append_at,
		summary_stale) values (?, ?, ?, ?, ?, ?, 1)`, e.StreamID, e.ProjectID, e.Path, e.CreatedAt, e.HeadOffset, e.LastAppendAt)
	if err != nil {
		return fmt.Errorf("create stream %s: %w", e.Path, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("create stream %s: %w", e.Path, err)
	}
	return nil
}

// DeleteUnfinishedStream deletes the entry of a stream whose creation never finished (nothing
// committed: the caller checked, and removed its file first), with its alarm, parked marks and
// secret uses, in one transaction. It no longer counts toward the project's streams.
func (d *Directory) DeleteUnfinishedStream(ctx context.Context, streamID string) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("delete unfinished stream: %w", err)
	}
	defer tx.Rollback()
	for _, q := range []string{
		`delete from alarms where stream_id = ?`,
		`delete from parked where stream_id = ?`,
		`delete from secret_uses where stream_id = ?`,
		`delete from streams where stream_id = ?`,
	} {
		if _, err := tx.ExecContext(ctx, q, streamID); err != nil {
			return fmt.Errorf("delete unfinished stream: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("delete unfinished stream: %w", err)
	}
	return nil
}

// StreamSummary is what the directory keeps of a stream's state for listing it unloaded.
type StreamSummary struct {
	HeadOffset          int64
	LastAppendAt        int64
	Subscriptions       int
	HaltedSubscriptions int
	MaxLag              int64
	Readers             int
	ParkedSubscriptions int
	// Born: the stream's first commit landed (StreamEntry.Born). A summary never unmarks it.
	Born bool
}

// UpdateStreamSummary refreshes the summary of a stream (on actor unload, or after a crash) and
// clears its stale mark.
func (d *Directory) UpdateStreamSummary(ctx context.Context, streamID string, sum StreamSummary) error {
	if err := updateSummary(ctx, d.db, streamID, sum); err != nil {
		return fmt.Errorf("update stream summary: %w", err)
	}
	return nil
}

func updateSummary(ctx context.Context, db execer, streamID string, sum StreamSummary) error {
	_, err := db.ExecContext(ctx, `update streams set head_offset = ?, last_append_at = ?, subscription_count = ?,
		halted_subscriptions = ?, max_lag = ?, reader_count = ?, parked_subscriptions = ?, born = max(born, ?), summary_stale = 0 where stream_id = ?`,
		sum.HeadOffset, sum.LastAppendAt, sum.Subscriptions, sum.HaltedSubscriptions, sum.MaxLag, sum.Readers, sum.ParkedSubscriptions, sum.Born || sum.HeadOffset > 0, streamID)
	return err
}

// SummaryRefresh is a stream's summary and the webhook secrets its committed catalog references,
// as RefreshSummaries writes them.
type SummaryRefresh struct {
	ProjectID, StreamID string
	SecretRefs          []string
	Summary             StreamSummary
}

// RefreshSummaries replaces each stream's secret uses with its SecretRefs, the references of its
// committed catalog (read when it unloads, or at start-up for a stream marked stale), and
// refreshes its summary, clearing its stale mark (as UpdateStreamSummary), all in one
// transaction: both or neither for every stream, so a stream still marked stale has its uses
// rewritten again by the next start. One commit (one fsync) for all of them: a start after a
// kill -9 refreshes every stream that was loaded, and at two commits each it spent seconds on
// fsyncs alone.
func (d *Directory) RefreshSummaries(ctx context.Context, rs []SummaryRefresh) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("refresh stream summaries: %w", err)
	}
	defer tx.Rollback()
	for _, r := range rs {
		if _, err := tx.ExecContext(ctx, `delete from secret_uses where stream_id = ?`, r.StreamID); err != nil {
			return fmt.Errorf("refresh stream summaries: %w", err)
		}
		for _, ref := range r.SecretRefs {
			if _, err := tx.ExecContext(ctx, `insert or ignore into secret_uses (stream_id, project_id, ref) values (?, ?, ?)`,
				r.StreamID, r.ProjectID, ref); err != nil {
				return fmt.Errorf("refresh stream summaries: %w", err)
			}
		}
		if err := updateSummary(ctx, tx, r.StreamID, r.Summary); err != nil {
			return fmt.Errorf("refresh stream summaries: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("refresh stream summaries: %w", err)
	}
	return nil
}

// NoteStreamHead records that a new stream's first commit landed (Born), with its head and last
// append, without touching the rest of its summary or its stale mark: a stream whose first
// commit landed is listed from then on, even if its summary cannot be written at its unload (a
// full disk). The head may be 0: a first commit that registered a reader.
func (d *Directory) NoteStreamHead(ctx context.Context, streamID string, head, lastAppendAt int64) error {
	if _, err := d.db.ExecContext(ctx, `update streams set head_offset = ?, last_append_at = ?, born = 1 where stream_id = ? and (head_offset < ? or born = 0)`,
		head, lastAppendAt, streamID, head); err != nil {
		return fmt.Errorf("note stream head: %w", err)
	}
	return nil
}

// MarkSummaryStale records that a stream is about to move past its summary.
func (d *Directory) MarkSummaryStale(ctx context.Context, streamID string) error {
	if _, err := d.db.ExecContext(ctx, `update streams set summary_stale = 1 where stream_id = ?`, streamID); err != nil {
		return fmt.Errorf("mark stream summary stale: %w", err)
	}
	return nil
}

// StaleStreams lists the streams whose summary may be behind: after a clean shutdown, none.
func (d *Directory) StaleStreams(ctx context.Context) ([]StreamEntry, error) {
	rows, err := d.db.QueryContext(ctx, `select stream_id, project_id, path, created_at, head_offset, last_append_at,
		subscription_count, halted_subscriptions, max_lag, reader_count, parked_subscriptions, born from streams where summary_stale = 1`)
	if err != nil {
		return nil, fmt.Errorf("stale streams: %w", err)
	}
	defer rows.Close()
	var out []StreamEntry
	for rows.Next() {
		e := StreamEntry{SummaryStale: true}
		if err := rows.Scan(&e.StreamID, &e.ProjectID, &e.Path, &e.CreatedAt, &e.HeadOffset, &e.LastAppendAt, &e.SubscriptionCount, &e.HaltedSubscriptions, &e.MaxLag, &e.ReaderCount, &e.ParkedSubscriptions, &e.Born); err != nil {
			return nil, fmt.Errorf("stale streams: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// ListStreams lists a project's streams whose path starts with prefix and sorts after after,
// in path order, at most limit of them.
func (d *Directory) ListStreams(ctx context.Context, projectID, prefix, after string, limit int) ([]StreamEntry, error) {
	return d.ListStreamsUnder(ctx, projectID, "", prefix, after, limit)
}

// ListStreamsUnder is ListStreams limited to the streams at or under the path scope (by path
// segment: /in holds /in and /in/x, not /in-x); "" or "/" is no limit.
func (d *Directory) ListStreamsUnder(ctx context.Context, projectID, scope, prefix, after string, limit int) ([]StreamEntry, error) {
	query, args := listStreamsQuery(projectID, scope, prefix, after, limit)
	rows, err := d.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list streams: %w", err)
	}
	defer rows.Close()
	var out []StreamEntry
	for rows.Next() {
		var e StreamEntry
		if err := rows.Scan(&e.StreamID, &e.ProjectID, &e.Path, &e.CreatedAt, &e.HeadOffset, &e.LastAppendAt, &e.SubscriptionCount, &e.HaltedSubscriptions, &e.MaxLag, &e.ReaderCount, &e.ParkedSubscriptions, &e.Born); err != nil {
			return nil, fmt.Errorf("list streams: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// listStreamsQuery is ListStreamsUnder's statement. The prefix and the scope are matched
// exactly by substr, which no index serves: alone, they made SQLite read every entry of the
// project after `after` (a prefix matching a few streams of 100,000 read all 100,000, about
// 20 ms, for each page and each tab completion at the prompt). So the paths they allow are also
// given as one range, [lo, hi), that the (project_id, path) index seeks to and stops at: one
// lower bound and one upper bound on path, as SQLite uses one of each.
func listStreamsQuery(projectID, scope, prefix, after string, limit int) (string, []any) {
	if scope == "/" {
		scope = ""
	}
	// Every path allowed starts with prefix and, under a scope, with scope (scope itself, or
	// scope + "/..."): it lies in [prefix, prefixEnd(prefix)) and in [scope, scope + "0"),
	// "0" being the byte after "/".
	lo := prefix
	hi, bounded := prefixEnd(prefix)
	if scope != "" {
		lo = max(lo, scope)
		if !bounded || scope+"0" < hi {
			hi, bounded = scope+"0", true
		}
	}
	// path > after and path >= lo as one bound: whichever is the stronger.
	lower, bound := "path >= ?", lo
	if after >= lo {
		lower, bound = "path > ?", after
	}
	upper, end := "", any(nil)
	if bounded {
		upper, end = " and path < ?", hi
	}
	query := `select stream_id, project_id, path, created_at, head_offset, last_append_at,
		subscription_count, halted_subscriptions, max_lag, reader_count, parked_subscriptions, born from streams
		where project_id = ? and ` + lower + upper + ` and substr(path, 1, ?) = ?
		and (? = '' or path = ? or substr(path, 1, ?) = ?) order by path limit ?`
	args := []any{projectID, bound}
	if bounded {
		args = append(args, end)
	}
	return query, append(args, len(prefix), prefix, scope, scope, len(scope)+1, scope+"/", limit)
}

// SetAlarm records (or with dueAt 0, clears) a stream's next alarm.
func (d *Directory) SetAlarm(ctx context.Context, streamID string, dueAt int64) error {
	var err error
	if dueAt == 0 {
		_, err = d.db.ExecContext(ctx, `delete from alarms where stream_id = ?`, streamID)
	} else {
		_, err = d.db.ExecContext(ctx, `insert into alarms (stream_id, due_at) values (?, ?)
			on conflict (stream_id) do update set due_at = excluded.due_at`, streamID, dueAt)
	}
	if err != nil {
		return fmt.Errorf("set alarm: %w", err)
	}
	return nil
}

// PullAlarms moves every alarm due after `after` and at or before `through` (epoch ms) to
// `after`, in one transaction, and returns how many it moved.
func (d *Directory) PullAlarms(ctx context.Context, after, through int64) (int64, error) {
	res, err := d.db.ExecContext(ctx, `update alarms set due_at = ? where due_at > ? and due_at <= ?`, after, after, through)
	if err != nil {
		return 0, fmt.Errorf("pull alarms: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("pull alarms: %w", err)
	}
	return n, nil
}

// DueAlarm is an alarm at or before a given time, with the stream it wakes.
type DueAlarm struct {
	StreamEntry
	DueAt int64
}

// DueAlarms lists alarms due at or before now (epoch ms), earliest first.
func (d *Directory) DueAlarms(ctx context.Context, now int64) ([]DueAlarm, error) {
	rows, err := d.db.QueryContext(ctx, `select s.stream_id, s.project_id, s.path, s.created_at, s.head_offset,
		s.last_append_at, a.due_at from alarms a join streams s using (stream_id) where a.due_at <= ? order by a.due_at`, now)
	if err != nil {
		return nil, fmt.Errorf("due alarms: %w", err)
	}
	defer rows.Close()
	var out []DueAlarm
	for rows.Next() {
		var a DueAlarm
		if err := rows.Scan(&a.StreamID, &a.ProjectID, &a.Path, &a.CreatedAt, &a.HeadOffset, &a.LastAppendAt, &a.DueAt); err != nil {
			return nil, fmt.Errorf("due alarms: %w", err)
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// NextAlarm returns the earliest alarm due after `after` (epoch ms), 0 if none.
func (d *Directory) NextAlarm(ctx context.Context, after int64) (int64, error) {
	var due sql.NullInt64
	if err := d.db.QueryRowContext(ctx, `select min(due_at) from alarms where due_at > ?`, after).Scan(&due); err != nil {
		return 0, fmt.Errorf("next alarm: %w", err)
	}
	return due.Int64, nil
}

// SetParked records the capabilities a stream's parked subscriptions wait for, replacing what
// was recorded (none: the stream waits for nothing).
func (d *Directory) SetParked(ctx context.Context, streamID string, capabilities []string) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("set parked: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `delete from parked where stream_id = ?`, streamID); err != nil {
		return fmt.Errorf("set parked: %w", err)
	}
	for _, c := range capabilities {
		if _, err := tx.ExecContext(ctx, `insert or ignore into parked (stream_id, capability) values (?, ?)`, streamID, c); err != nil {
			return fmt.Errorf("set parked: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("set parked: %w", err)
	}
	return nil
}

// ParkedOn lists the streams of a project with subscriptions parked waiting for capability.
func (d *Directory) ParkedOn(ctx context.Context, projectID, capability string) ([]StreamEntry, error) {
	rows, err := d.db.QueryContext(ctx, `select s.stream_id, s.project_id, s.path from parked p
		join streams s using (stream_id) where p.capability = ? and s.project_id = ? order by s.path`, capability, projectID)
	if err != nil {
		return nil, fmt.Errorf("parked on: %w", err)
	}
	defer rows.Close()
	var out []StreamEntry
	for rows.Next() {
		var e StreamEntry
		if err := rows.Scan(&e.StreamID, &e.ProjectID, &e.Path); err != nil {
			return nil, fmt.Errorf("parked on: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// Ping checks that the directory database answers a query.
func (d *Directory) Ping(ctx context.Context) error {
	var one int
	return d.db.QueryRowContext(ctx, "select 1").Scan(&one)
}
