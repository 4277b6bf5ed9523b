package storage

import (
	"context"
	"fmt"
)

// ConsumerStandings lists the summaries of the streams with a subscription or a registered
// reader: where the consumers of every stream not loaded stand.
func (d *Directory) ConsumerStandings(ctx context.Context) ([]StreamEntry, error) {
	rows, err := d.db.QueryContext(ctx, `select stream_id, project_id, path, subscription_count, halted_subscriptions, max_lag, reader_count,
		parked_subscriptions from streams where subscription_count > 0 or max_lag > 0 or reader_count > 0`)
	if err != nil {
		return nil, fmt.Errorf("consumer standings: %w", err)
	}
	defer rows.Close()
	var out []StreamEntry
	for rows.Next() {
		var e StreamEntry
		if err := rows.Scan(&e.StreamID, &e.ProjectID, &e.Path, &e.SubscriptionCount, &e.HaltedSubscriptions, &e.MaxLag, &e.ReaderCount, &e.ParkedSubscriptions); err != nil {
			return nil, fmt.Errorf("consumer standings: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}
