package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/itx-dev/itx"
)

// CursorRow is one row of the seed's subscription_cursors table. Zero means NULL for the
// nullable integer columns (offsets and times are never legitimately 0 there).
type CursorRow struct {
	Name                  string
	ConfiguredAtOffset    int64 // config epoch: the configured event in force (the birth, moved by a changed config)
	CursorChangedAtOffset int64 // seek epoch
	ConfirmedOffset       int64
	Status                string // "active" | "halted" | "parked"
	// DeliveredOffset: an offset-acking subscription's highest offset delivered (it may confirm
	// through here); 0 for the others, whose deliveries confirm themselves. Kept in its own
	// table (subscription_delivered), so the seed's cursor table keeps its columns.
	DeliveredOffset int64

	Attempt             int
	NextAttemptAt       int64 // epoch ms
	FailingEventOffset  int64
	FailingEventAttempt int
	FailingEventSkips   int
	LastError           string

	InFlightDeadlineAt           int64
	InFlightConnectionGeneration int64
	UpdatedAt                    string
}

// Cursor statuses: the domain's (itx.StatusActive, ...), as the cursor table stores them.
const (
	StatusActive = itx.StatusActive
	StatusHalted = itx.StatusHalted
	StatusParked = itx.StatusParked
)

func nullInt(v int64) any {
	if v == 0 {
		return nil
	}
	return v
}

func nullText(v string) any {
	if v == "" {
		return nil
	}
	return v
}

const cursorColumns = `name, configured_at_offset, cursor_changed_at_offset, confirmed_offset, status,
	attempt, next_attempt_at, failing_event_offset, failing_event_attempt,
	failing_event_skips_since_last_success, last_error, in_flight_deadline_at,
	in_flight_connection_generation, updated_at`

func upsertCursor(ctx context.Context, tx *sql.Tx, r *CursorRow) error {
	_, err := tx.ExecContext(ctx, `insert into subscription_cursors (`+cursorColumns+`)
		values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		on conflict (name) do update set
		configured_at_offset = excluded.configured_at_offset,
		cursor_changed_at_offset = excluded.cursor_changed_at_offset,
		confirmed_offset = excluded.confirmed_offset, status = excluded.status,
		attempt = excluded.attempt, next_attempt_at = excluded.next_attempt_at,
		failing_event_offset = excluded.failing_event_offset,
		failing_event_attempt = excluded.failing_event_attempt,
		failing_event_skips_since_last_success = excluded.failing_event_skips_since_last_success,
		last_error = excluded.last_error, in_flight_deadline_at = excluded.in_flight_deadline_at,
		in_flight_connection_generation = excluded.in_flight_connection_generation,
		updated_at = excluded.updated_at`,
		r.Name, r.ConfiguredAtOffset, r.CursorChangedAtOffset, r.ConfirmedOffset, r.Status,
		r.Attempt, nullInt(r.NextAttemptAt), nullInt(r.FailingEventOffset), r.FailingEventAttempt,
		r.FailingEventSkips, nullText(r.LastError), nullInt(r.InFlightDeadlineAt),
		nullInt(r.InFlightConnectionGeneration), r.UpdatedAt)
	if err != nil {
		return fmt.Errorf("upsert cursor %q: %w", r.Name, err)
	}
	if r.DeliveredOffset > 0 {
		_, err = tx.ExecContext(ctx, `insert into subscription_delivered (name, delivered_offset) values (?, ?)
			on conflict (name) do update set delivered_offset = excluded.delivered_offset`, r.Name, r.DeliveredOffset)
	} else {
		_, err = tx.ExecContext(ctx, `delete from subscription_delivered where name = ?`, r.Name)
	}
	if err != nil {
		return fmt.Errorf("upsert cursor %q: delivered offset: %w", r.Name, err)
	}
	return nil
}

// deleteCursor deletes a cursor row and its delivered offset.
func deleteCursor(ctx context.Context, tx *sql.Tx, name string) error {
	if _, err := tx.ExecContext(ctx, `delete from subscription_cursors where name = ?`, name); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `delete from subscription_delivered where name = ?`, name)
	return err
}

// CursorRows reads every cursor row.
func (s *Stream) CursorRows(ctx context.Context) ([]CursorRow, error) {
	rows, err := s.w.QueryContext(ctx, `select `+cursorColumns+`, coalesce((select d.delivered_offset from subscription_delivered d where d.name = c.name), 0)
		from subscription_cursors c order by name`)
	if err != nil {
		return nil, fmt.Errorf("read cursors: %w", err)
	}
	defer rows.Close()
	var out []CursorRow
	for rows.Next() {
		var r CursorRow
		var next, failing, deadline, gen sql.NullInt64
		var lastErr sql.NullString
		if err := rows.Scan(&r.Name, &r.ConfiguredAtOffset, &r.CursorChangedAtOffset, &r.ConfirmedOffset, &r.Status,
			&r.Attempt, &next, &failing, &r.FailingEventAttempt, &r.FailingEventSkips, &lastErr, &deadline, &gen,
			&r.UpdatedAt, &r.DeliveredOffset); err != nil {
			return nil, fmt.Errorf("read cursors: %w", err)
		}
		r.NextAttemptAt, r.FailingEventOffset = next.Int64, failing.Int64
		r.InFlightDeadlineAt, r.InFlightConnectionGeneration = deadline.Int64, gen.Int64
		r.LastError = lastErr.String
		out = append(out, r)
	}
	return out, rows.Err()
}

// KV reads a value below the reduction; nil if absent.
func (s *Stream) KV(ctx context.Context, key string) ([]byte, error) {
	var v []byte
	err := s.w.QueryRowContext(ctx, `select value from kv where key = ?`, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read kv %q: %w", key, err)
	}
	return v, nil
}

// KVUsage counts the kv rows whose key starts with prefix and their bytes: each key after the
// prefix plus its value. One range scan of the primary key, so a caller can keep the totals
// up to date from there instead of scanning per write.
func (s *Stream) KVUsage(ctx context.Context, prefix string) (keys int, bytes int64, err error) {
	q := `select count(*), coalesce(sum(length(cast(key as blob)) + length(cast(value as blob))), 0) from kv where key >= ?`
	args := []any{prefix}
	if end, ok := prefixEnd(prefix); ok {
		q += ` and key < ?`
		args = append(args, end)
	} else {
		q += ` and substr(cast(key as blob), 1, ?) = cast(? as blob)`
		args = append(args, len(prefix), prefix)
	}
	if err := s.w.QueryRowContext(ctx, q, args...).Scan(&keys, &bytes); err != nil {
		return 0, 0, fmt.Errorf("kv usage %q: %w", prefix, err)
	}
	return keys, bytes - int64(keys)*int64(len(prefix)), nil
}

// prefixEnd is the least string above every string starting with prefix (keys compare
// bytewise); false when there is none (prefix is empty or all 0xff bytes).
func prefixEnd(prefix string) (string, bool) {
	b := []byte(prefix)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1]), true
		}
	}
	return "", false
}
