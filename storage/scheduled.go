package storage

import (
	"context"
	"database/sql"
	"fmt"
)

// Scheduled is one scheduled append: the event (an itx.EventInput as JSON) the stream appends at
// DueAt, named by its idempotency key.
type Scheduled struct {
	Key   string
	DueAt int64 // epoch ms
	Event []byte
}

// ScheduledEvents lists the scheduled appends in due order.
func (s *Stream) ScheduledEvents(ctx context.Context) ([]Scheduled, error) {
	rows, err := s.w.QueryContext(ctx, `select key, due_at, event from scheduled_events order by due_at, key`)
	if err != nil {
		return nil, fmt.Errorf("read scheduled events: %w", err)
	}
	defer rows.Close()
	var out []Scheduled
	for rows.Next() {
		var r Scheduled
		if err := rows.Scan(&r.Key, &r.DueAt, &r.Event); err != nil {
			return nil, fmt.Errorf("read scheduled events: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func upsertScheduled(ctx context.Context, tx *sql.Tx, r *Scheduled) error {
	_, err := tx.ExecContext(ctx, `insert into scheduled_events (key, due_at, event) values (?, ?, ?)
		on conflict (key) do update set due_at = excluded.due_at, event = excluded.event`,
		r.Key, r.DueAt, string(r.Event))
	if err != nil {
		return fmt.Errorf("upsert scheduled event %q: %w", r.Key, err)
	}
	return nil
}
