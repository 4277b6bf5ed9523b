package storage

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/itx-dev/itx"
)

// BenchmarkStream_Events reads a 100,000-event stream in 1,000-event pages, as a connection's
// catch-up does (a cancellable context, every column). ns/op is per page.
func BenchmarkStream_Events(b *testing.B) {
	ctx := context.Background()
	s, err := CreateStream(ctx, filepath.Join(b.TempDir(), "s.db"), StreamMeta{StreamID: "sid", ProjectID: "p", Path: "/a"})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const total, page = 100_000, 1000
	for from := int64(1); from <= total; from += 10_000 {
		batch := make([]itx.Event, 10_000)
		for i := range batch {
			off := from + int64(i)
			batch[i] = itx.Event{Offset: off, Type: "bench.event", CreatedAt: 1_700_000_000_000 + off,
				Payload: json.RawMessage(fmt.Sprintf(`{"seq":%d,"user":"u-%04d","action":"clicked","target":"button-checkout","ok":true}`, off, off%1000))}
		}
		if err := s.Commit(ctx, Commit{Events: batch, HeadOffset: from + 9_999}); err != nil {
			b.Fatal(err)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	b.ReportAllocs()
	b.ResetTimer()
	after := int64(0)
	for i := 0; i < b.N; i++ {
		if after >= total {
			after = 0
		}
		got, err := s.Events(cctx, Query{After: after, UpTo: total, Limit: page, IncludeEphemeral: true})
		if err != nil || len(got) != page {
			b.Fatal(len(got), err)
		}
		after = got[len(got)-1].Offset
	}
	b.ReportMetric(float64(b.N*page)/b.Elapsed().Seconds(), "events/s")
}
