package storage

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

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

// BenchmarkStream_Commit commits 100-event batches as the actor does for a batched append
// (ns/op per commit). On tmpfs the fsync is free, which leaves the CPU of the insert path.
func BenchmarkStream_Commit(b *testing.B) {
	dirs := map[string]string{"disk": b.TempDir()}
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "itx-bench")
		if err != nil {
			b.Fatal(err)
		}
		defer os.RemoveAll(d)
		dirs["tmpfs"] = d
	}
	for _, name := range []string{"disk", "tmpfs"} {
		dir, ok := dirs[name]
		if !ok {
			continue
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			f, err := os.CreateTemp(dir, "s-*.db") // a fresh file per run, also under -count
			if err != nil {
				b.Fatal(err)
			}
			f.Close()
			os.Remove(f.Name())
			s, err := CreateStream(ctx, f.Name(), StreamMeta{StreamID: "sid", ProjectID: "p", Path: "/a"})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			b.ReportAllocs()
			head := int64(0)
			batch := make([]itx.Event, 100)
			for i := 0; i < b.N; i++ {
				for j := range batch {
					head++
					batch[j] = itx.Event{Offset: head, Type: "bench.event", CreatedAt: 1_700_000_000_000 + head,
						Payload: json.RawMessage(`{"seq":1,"user":"u-0001","action":"clicked","target":"button-checkout","ok":true}`)}
				}
				if err := s.Commit(ctx, Commit{Events: batch, HeadOffset: head}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*len(batch))/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkStream_CommitAfterIdle commits one event per transaction, back to back and after an
// idle gap like the one an RPC round trip leaves between two sequential appends, and reports the
// commit's median and 90th percentile. On this kind of VM the same fsync takes longer when the
// process was idle before it (see docs/benchmarks.md, "Where a sequential append's time goes").
func BenchmarkStream_CommitAfterIdle(b *testing.B) {
	for _, gap := range []time.Duration{0, 300 * time.Microsecond} {
		b.Run(fmt.Sprintf("gap=%v", gap), func(b *testing.B) {
			ctx := context.Background()
			s, err := CreateStream(ctx, filepath.Join(b.TempDir(), "s.db"), StreamMeta{StreamID: "sid", ProjectID: "p", Path: "/a"})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			lat := make([]time.Duration, 0, b.N)
			for i := 0; i < b.N; i++ {
				head := int64(i + 1)
				ev := []itx.Event{{Offset: head, Type: "bench.event", CreatedAt: 1_700_000_000_000 + head,
					Payload: json.RawMessage(`{"seq":1,"user":"u-0001","action":"clicked","target":"button-checkout","ok":true}`)}}
				if gap > 0 {
					time.Sleep(gap) // the workload: an idle process between commits
				}
				t0 := time.Now()
				if err := s.Commit(ctx, Commit{Events: ev, HeadOffset: head}); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us")
			b.ReportMetric(float64(lat[len(lat)*9/10].Microseconds()), "p90-us")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
			b.ReportMetric(float64(lat[len(lat)*999/1000].Microseconds()), "p99.9-us")
		})
	}
}

// BenchmarkStream_Trim deletes a stream's events 5,000 at a time, as Stream.trim's chunks do
// (ns/op per chunk: how long the stream's writer is busy with one, which appends wait behind),
// on the disk: each chunk is one fsynced transaction.
func BenchmarkStream_Trim(b *testing.B) {
	ctx := context.Background()
	s, err := CreateStream(ctx, filepath.Join(b.TempDir(), "s.db"), StreamMeta{StreamID: "sid", ProjectID: "p", Path: "/a"})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const chunk = 5000
	head := int64(0)
	fill := func(n int) {
		for done := 0; done < n; done += 10_000 {
			batch := make([]itx.Event, 10_000)
			for i := range batch {
				off := head + int64(i) + 1
				batch[i] = itx.Event{Offset: off, Type: "bench.event", CreatedAt: 1_700_000_000_000 + off,
					Payload: json.RawMessage(fmt.Sprintf(`{"seq":%d,"user":"u-%04d","action":"clicked","target":"button-checkout","ok":true}`, off, off%1000))}
			}
			head += int64(len(batch))
			if err := s.Commit(ctx, Commit{Events: batch, HeadOffset: head}); err != nil {
				b.Fatal(err)
			}
		}
	}
	fill(max(b.N*chunk, 10_000))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		n, _, _, err := s.Trim(ctx, head, chunk)
		if err != nil || n != chunk {
			b.Fatal(n, err)
		}
	}
	b.ReportMetric(float64(b.N*chunk)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkStream_Vacuum gives back a trimmed stream's free pages a chunk per transaction, as the
// stream's vacuum turns do (ns/op per chunk: how long the stream's writer is busy with one, which
// appends wait behind), on the disk. The oldest half of the stream was trimmed, so every page
// given back moves a page in use from the end of the file into the hole the trim left: the
// costliest case (a trim of nearly everything mostly cuts free pages off the end).
func BenchmarkStream_Vacuum(b *testing.B) {
	for _, chunk := range []int64{512 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("chunk=%dKiB", chunk>>10), func(b *testing.B) {
			ctx := context.Background()
			s, err := CreateStream(ctx, filepath.Join(b.TempDir(), "s.db"), StreamMeta{StreamID: "sid", ProjectID: "p", Path: "/a"})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			payload := json.RawMessage(`{"p":"` + strings.Repeat("x", 1000) + `"}`)
			events := 2 * (int64(b.N)*chunk + vacuumKeepMax) / 1000 // about a page per 3-4 events
			head := int64(0)
			for head < events {
				batch := make([]itx.Event, min(10_000, events-head))
				for i := range batch {
					head++
					batch[i] = itx.Event{Offset: head, Type: "bench.event", CreatedAt: 1_700_000_000_000 + head, Payload: payload}
				}
				if err := s.Commit(ctx, Commit{Events: batch, HeadOffset: head}); err != nil {
					b.Fatal(err)
				}
			}
			for {
				n, _, _, err := s.Trim(ctx, head/2, 50_000)
				if err != nil {
					b.Fatal(err)
				}
				if n == 0 {
					break
				}
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				freed, _, err := s.Vacuum(ctx, chunk)
				if err != nil || freed < chunk {
					b.Fatal(freed, err)
				}
			}
			b.ReportMetric(float64(int64(b.N)*chunk>>20)/b.Elapsed().Seconds(), "MiB/s")
		})
	}
}
