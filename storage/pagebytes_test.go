package storage

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
)

// sizedEvents are n events of varied sizes (every ephemeralEvery-th ephemeral, of type "eph";
// the others alternate types "a" and "b"), some with metadata and idempotency keys.
func sizedEvents(n, ephemeralEvery int) []itx.Event {
	out := events(1, n, ephemeralEvery)
	for i := range out {
		e := &out[i]
		e.Payload = json.RawMessage(`{"p":"` + strings.Repeat("x", 100+(i*137)%900) + `"}`)
		if !e.Ephemeral {
			e.Type = []string{"a", "b"}[i%2]
			if i%3 == 0 {
				e.IdempotencyKey = fmt.Sprintf("key-%d", e.Offset)
			}
		}
		if i%4 == 0 {
			e.Metadata = json.RawMessage(`{"m":"` + strings.Repeat("m", i) + `"}`)
		}
	}
	return out
}

// cutAt is the prefix of full a page bounded by maxBytes keeps: through the event that brings it
// to maxBytes or more, the first always.
func cutAt(full []itx.Event, maxBytes int) []itx.Event {
	total := 0
	for i := range full {
		if total += full[i].Size(); total >= maxBytes {
			return full[:i+1]
		}
	}
	return full
}

// TestStream_Events_MaxBytes checks the size bound on every read path: the direct scanner (with
// buffers small enough that a page continues in a larger one) and database/sql, without and
// with a type filter, without and with ephemeral events. A bounded page is the unbounded one's
// prefix through the event that reaches the bound; the first event always goes; paging on after
// a cut page's last event reads every event once, in order.
func TestStream_Events_MaxBytes(t *testing.T) {
	ctx := context.Background()
	s, _ := mustCreateStream(t)
	const n = 200
	require.NoError(t, s.Commit(ctx, Commit{Events: sizedEvents(n, 7), HeadOffset: n}))
	scan := s.scan

	type path struct {
		name string
		read func(Query) ([]itx.Event, error)
	}
	paths := []path{{"database/sql", func(q Query) ([]itx.Event, error) {
		s.scan = nil
		defer func() { s.scan = scan }()
		return s.Events(ctx, q)
	}}}
	if scan != nil {
		for _, hint := range []int{1, 256} {
			paths = append(paths, path{fmt.Sprintf("scanner, %d bytes a row", hint), func(q Query) ([]itx.Event, error) {
				scan.bytesPerRow = hint
				return s.Events(ctx, q)
			}})
		}
	}
	for _, p := range paths {
		for _, base := range []Query{
			{UpTo: n, Limit: 1000},
			{UpTo: n, Limit: 1000, IncludeEphemeral: true},
			{UpTo: n, Limit: 1000, Types: []string{"a", "eph"}},
			{UpTo: n, Limit: 1000, Types: []string{"a", "eph"}, IncludeEphemeral: true},
			{After: 50, UpTo: 150, Limit: 30, IncludeEphemeral: true},
		} {
			t.Run(fmt.Sprintf("%s %+v", p.name, base), func(t *testing.T) {
				full, err := p.read(base)
				require.NoError(t, err)
				require.NotEmpty(t, full)
				for _, maxBytes := range []int{1, full[0].Size(), full[0].Size() + 1, 2000, 10_000, 1 << 30} {
					q := base
					q.MaxBytes = maxBytes
					got, err := p.read(q)
					require.NoError(t, err)
					want := cutAt(full, maxBytes)
					require.Equal(t, offsets(want), offsets(got), "MaxBytes %d", maxBytes)
					require.Equal(t, want, got, "MaxBytes %d", maxBytes)
					require.Equal(t, len(want) < len(full) || len(full) == base.Limit || pageBytes(full) >= maxBytes, q.Cut(got))
				}

				// Paging by size alone reads the unbounded page's events once each, in order.
				q := base
				q.Limit = 1000
				unbounded, err := p.read(q)
				require.NoError(t, err)
				q.MaxBytes = 3000
				var all []itx.Event
				for pages := 0; ; pages++ {
					require.Less(t, pages, n, "paging makes progress")
					page, err := p.read(q)
					require.NoError(t, err)
					if len(page) > 1 {
						require.Less(t, pageBytes(page[:len(page)-1]), q.MaxBytes, "a page ends at the event that reaches the bound")
					}
					all = append(all, page...)
					if !q.Cut(page) {
						break
					}
					q.After = page[len(page)-1].Offset
				}
				require.Equal(t, offsets(unbounded), offsets(all))
			})
		}
	}
}

// TestStream_Events_MaxBytesFirstEventGoes checks that an event larger than the bound is read
// alone, on both paths.
func TestStream_Events_MaxBytesFirstEventGoes(t *testing.T) {
	ctx := context.Background()
	s, _ := mustCreateStream(t)
	batch := events(1, 3, 0)
	batch[0].Payload = json.RawMessage(`{"big":"` + strings.Repeat("x", 1<<20) + `"}`)
	batch[1].Payload = json.RawMessage(`{"big":"` + strings.Repeat("y", 1<<20) + `"}`)
	require.NoError(t, s.Commit(ctx, Commit{Events: batch, HeadOffset: 3}))
	for _, q := range []Query{
		{UpTo: 3, Limit: 500, MaxBytes: 1000},
		{UpTo: 3, Limit: 500, MaxBytes: 1000, Types: []string{"t"}},
	} {
		got, err := s.Events(ctx, q)
		require.NoError(t, err)
		require.Equal(t, []int64{1}, offsets(got))
		require.True(t, q.Cut(got))
		scan := s.scan
		s.scan = nil
		got, err = s.Events(ctx, q)
		s.scan = scan
		require.NoError(t, err)
		require.Equal(t, []int64{1}, offsets(got))
	}
}
