package examples_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/examples"
	proctest "github.com/itx-dev/itx/processors/testing"
)

// BenchmarkGuestbook_Backlog reduces a backlog of signatures through the real runner, in memory,
// in pages of itx.DeliveryBatchEvents with one progress commit per page: the in-process ceiling
// of a pure projector (target: at least 100,000 events/s).
func BenchmarkGuestbook_Backlog(b *testing.B) {
	const backlog = 100_000
	clock := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	stream := proctest.NewMemoryStream("/guestbook", clock)
	batch := make([]itx.EventInput, 0, itx.MaxAppendEvents)
	for i := range backlog {
		batch = append(batch, examples.GuestbookSigned.Input(examples.Signed{Name: fmt.Sprintf("guest-%d", i), Message: "hello"}, ""))
		if len(batch) == cap(batch) {
			if _, err := stream.Append(context.Background(), batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		r, err := processors.NewRunner(examples.Guestbook(), processors.RunnerConfig{
			Path: "/guestbook", Log: stream, Progress: proctest.NewMemoryProgressStore(), Clock: clock,
			PageSize: itx.DeliveryBatchEvents,
		})
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Open(context.Background()); err != nil {
			b.Fatal(err)
		}
		if err := r.CatchUp(context.Background()); err != nil {
			b.Fatal(err)
		}
		if _, st := r.Snapshot(); st.Count != backlog {
			b.Fatalf("reduced %d, want %d", st.Count, backlog)
		}
		r.Close()
	}
	b.ReportMetric(float64(backlog*b.N)/b.Elapsed().Seconds(), "events/s")
}
