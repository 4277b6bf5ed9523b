package test

// Processor benchmarks recorded in docs/benchmarks.md ("Processors in itxd"): an in-process
// server (loopback TCP for the client's appends and barriers) hosting processors.
//
//	go test -run '^$' -bench 'ProcessorBacklog' -benchtime 200000x ./test/
//	go test -run '^$' -bench 'ProcessorWakeLatency' -benchtime 2000x ./test/
//
// Backlog (BenchmarkProcessorBacklog): b.N guestbook/signed events are appended first (not
// timed), then the guestbook's processor-wake subscription is configured and the clock runs until
// waitUntilProcessed(head) answers: every event reduced, its progress committed. ns/op is per
// event. "remote" runs the guestbook in a remote host (processors/remote) in this test process,
// on its own RPC connection over loopback: it pages the stream itself and commits its progress
// through the ports itxd serves.
//
// Latency (BenchmarkProcessorWakeLatency): one event at a time on an idle stream: append, wait
// until the processor's ProcessEvent runs for it. b.N counts events.

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

var processorRun atomic.Int64

func BenchmarkProcessorBacklog(b *testing.B) {
	b.Run("in-process", func(b *testing.B) { benchProcessorBacklog(b, false) })
	b.Run("remote", func(b *testing.B) { benchProcessorBacklog(b, true) })
}

func benchProcessorBacklog(b *testing.B, remote bool) {
	ts := startServer(b, server.Config{Processors: referenceHost(b, "guestbook")})
	if remote {
		awaitMount(b, runRemoteHost(b, ts.addr, ts.creds.ProjectToken, "bench", referenceHost(b, "guestbook")))
	}
	ctx := context.Background()
	s := stream(b, ts.project(b), fmt.Sprintf("/bench/guestbook-%d", processorRun.Add(1)))
	batch := make([]itx.EventInput, 0, 1000)
	var head int64
	for i := 0; i < b.N; i += len(batch) {
		batch = batch[:0]
		for j := 0; j < min(1000, b.N-i); j++ {
			batch = append(batch, examples.GuestbookSigned.Input(examples.Signed{Name: fmt.Sprintf("guest-%d", i+j), Message: "hello from the backlog"}, ""))
		}
		head = mustAppend(b, s, batch...).HeadOffset
	}
	b.ResetTimer()
	start := time.Now()
	if remote {
		configureRemote(b, s, "guestbook")
	} else {
		configureProcessor(b, s, "guestbook")
	}
	sub := client.Subscription(ctx, s, "guestbook")
	defer sub.Release()
	_, err := client.WaitUntilProcessed(ctx, sub, head, 10*time.Minute)
	require.NoError(b, err)
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
}

func BenchmarkProcessorWakeLatency(b *testing.B) {
	b.Run("in-process", func(b *testing.B) { benchProcessorWakeLatency(b, false) })
	b.Run("remote", func(b *testing.B) { benchProcessorWakeLatency(b, true) })
}

func benchProcessorWakeLatency(b *testing.B, remote bool) {
	seen := make(chan int64, 1)
	host := processors.NewHost("bench")
	require.NoError(b, processors.Add(host, func() processors.Contract[int] {
		return processors.Contract[int]{
			Name: "probe", ConsumedTypes: []string{"probe/ping"}, ReducerVersion: "1",
			InitialState: func() int { return 0 },
			Reduce:       func(n int, e itx.Event) int { return n + 1 },
			ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
				if a.Event != nil {
					select {
					case seen <- a.Event.Offset:
					default:
					}
				}
				return nil
			},
		}
	}))
	ts := startServer(b, server.Config{Processors: host})
	s := stream(b, ts.project(b), fmt.Sprintf("/bench/probe-%d", processorRun.Add(1)))
	if remote {
		awaitMount(b, runRemoteHost(b, ts.addr, ts.creds.ProjectToken, "bench", host))
		configureRemote(b, s, "probe")
	} else {
		configureProcessor(b, s, "probe")
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		off := mustAppend(b, s, ev("probe/ping", `{}`)).Offsets[0]
		for got := <-seen; got != off; got = <-seen {
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(percentile(lat, 0.50).Microseconds()), "p50-us")
	b.ReportMetric(float64(percentile(lat, 0.99).Microseconds()), "p99-us")
}
