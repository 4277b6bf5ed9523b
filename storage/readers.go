package storage

import (
	"context"
	"database/sql"
	"fmt"
)

// Reader is one registered reader: a name and the checkpoint it declared.
type Reader struct {
	Name       string
	Checkpoint int64
	UpdatedAt  int64 // epoch ms
	// Owner is the id of the token that registered it ("": none recorded); see the readers
	// table's owner column.
	Owner string
	// NoHold: its checkpoint does not hold back trims or the retention policy (registered
	// without the subscribe right); see the readers table's no_hold column.
	NoHold bool
}

// Readers lists the registered readers by name.
func (s *Stream) Readers(ctx context.Context) ([]Reader, error) {
	rows, err := s.w.QueryContext(ctx, `select name, checkpoint, updated_at, owner, no_hold from readers order by name`)
	if err != nil {
		return nil, fmt.Errorf("read readers: %w", err)
	}
	defer rows.Close()
	var out []Reader
	for rows.Next() {
		var r Reader
		if err := rows.Scan(&r.Name, &r.Checkpoint, &r.UpdatedAt, &r.Owner, &r.NoHold); err != nil {
			return nil, fmt.Errorf("read readers: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func upsertReader(ctx context.Context, tx *sql.Tx, r *Reader) error {
	_, err := tx.ExecContext(ctx, `insert into readers (name, checkpoint, updated_at, owner, no_hold) values (?, ?, ?, ?, ?)
		on conflict (name) do update set checkpoint = excluded.checkpoint, updated_at = excluded.updated_at, owner = excluded.owner, no_hold = excluded.no_hold`,
		r.Name, r.Checkpoint, r.UpdatedAt, r.Owner, r.NoHold)
	if err != nil {
		return fmt.Errorf("upsert reader %q: %w", r.Name, err)
	}
	return nil
}
