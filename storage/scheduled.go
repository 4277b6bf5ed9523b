package storage

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// Scheduled is one scheduled append: the event (an itx.EventInput as JSON) the stream appends at
// DueAt, named by its idempotency key.
type Scheduled struct {
	Key   string
	DueAt int64 // epoch ms
	Event []byte
}

// ScheduledDue lists the scheduled appends' keys and times, without their events, in due order:
// what a loaded stream keeps in memory.
func (s *Stream) ScheduledDue(ctx context.Context) ([]Scheduled, error) {
	return s.scheduled(ctx, `select key, due_at, null from scheduled_events order by due_at, key`)
}

// ScheduledEvents lists the scheduled appends with their events in due order: at most limit, and
// ending after the one that brings their events to maxBytes (the first always goes).
func (s *Stream) ScheduledEvents(ctx context.Context, limit, maxBytes int) ([]Scheduled, error) {
	rows, err := s.scheduled(ctx, `select key, due_at, event from scheduled_events order by due_at, key limit ?`, limit)
	if err != nil {
		return nil, err
	}
	total := 0
	for i := range rows {
		if total += len(rows[i].Event); total >= maxBytes {
			return rows[:i+1], nil
		}
	}
	return rows, nil
}

// ScheduledByKeys returns the events of the scheduled appends named by keys (absent keys are
// left out).
func (s *Stream) ScheduledByKeys(ctx context.Context, keys []string) (map[string][]byte, error) {
	out := map[string][]byte{}
	for len(keys) > 0 {
		n := min(len(keys), 500)
		args := make([]any, n)
		for i, k := range keys[:n] {
			args[i] = k
		}
		rows, err := s.scheduled(ctx, `select key, due_at, event from scheduled_events where key in (?`+strings.Repeat(",?", n-1)+`)`, args...)
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			out[r.Key] = r.Event
		}
		keys = keys[n:]
	}
	return out, nil
}

func (s *Stream) scheduled(ctx context.Context, query string, args ...any) ([]Scheduled, error) {
	rows, err := s.w.QueryContext(ctx, query, args...)
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
