package test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/wire"
	"github.com/stretchr/testify/require"
)

// benchSink is a client EventSink that counts what it is given and timestamps arrivals.
type benchSink struct {
	got      atomic.Int64
	last     atomic.Int64
	arrivals chan arrival
	target   int64         // done closes once the sink has received through target
	done     chan struct{} // (0: never)
	once     sync.Once
}

func (k *benchSink) Deliver(ctx context.Context, call schema.EventSink_deliver) error {
	at := time.Now()
	b, err := call.Args().Batch()
	if err != nil {
		return err
	}
	list, err := b.Events()
	if err != nil {
		return err
	}
	k.got.Add(int64(list.Len()))
	last := int64(list.At(list.Len() - 1).Offset())
	k.last.Store(last)
	if k.target > 0 && last >= k.target {
		k.once.Do(func() { close(k.done) })
	}
	if k.arrivals != nil {
		select {
		case k.arrivals <- arrival{offset: last, at: at}:
		default:
		}
	}
	return nil
}
func (k *benchSink) Closed(context.Context, schema.EventSink_closed) error { return nil }
func (k *benchSink) State(context.Context, schema.EventSink_state) error   { return nil }

func openBenchConn(b *testing.B, s schema.Stream, after uint64, sink *benchSink) schema.Connection {
	fut, release := s.OpenConnection(context.Background(), func(p schema.Stream_openConnection_Params) error {
		opts, err := p.NewOptions()
		if err != nil {
			return err
		}
		opts.SetAfter(after)
		opts.SetNoState(true)
		if err := wire.SetTextList(nil, opts.NewTypes); err != nil {
			return err
		}
		return p.SetSink(schema.EventSink_ServerToClient(sink))
	})
	defer release()
	res, err := fut.Struct()
	require.NoError(b, err)
	return res.Connection().AddRef()
}

// BenchmarkConnection measures live connections against a separate itxd process: append-to-sink
// latency on one connection, catch-up of a large backlog over one connection, fan-out from one
// writer to many connections, and the memory an idle connection costs.
func BenchmarkConnection(b *testing.B) {
	srv := startBenchItxd(b, append(slices.Clone(noBreaker), "--max-live-per-login", "20000")...)

	b.Run("latency", func(b *testing.B) {
		s := srv.stream(b, fmt.Sprintf("/conn/latency-%d", b.N))
		sink := &benchSink{arrivals: make(chan arrival, 16)}
		c := openBenchConn(b, s, 0, sink)
		defer c.Release()
		events := benchEvents(1, 0)
		lat := make([]time.Duration, b.N)
		deliver := func(i int) error {
			t0 := time.Now()
			res, err := client.Append(context.Background(), s, events, itx.AppendOptions{})
			if err != nil {
				return err
			}
			for a := range sink.arrivals {
				if a.offset == res.Offsets[0] {
					if i >= 0 {
						lat[i] = a.at.Sub(t0)
					}
					return nil
				}
			}
			return nil
		}
		for i := 0; i < 20; i++ {
			require.NoError(b, deliver(-1))
		}
		cpu := srv.cpuMeter(b)
		runWorkers(b, 1, func(_, i int) error { return deliver(i) })
		cpu.report(b)
		reportLatency(b, lat)
	})

	b.Run("catch-up-1M", func(b *testing.B) {
		const total = 1_000_000
		s := srv.stream(b, "/conn/backlog")
		if info := mustDescribeB(b, s); info.HeadOffset < total {
			for i := 0; i < total/1000; i++ {
				require.NoError(b, appendOnce(s, benchEvents(1000, i*1000)))
			}
		}
		b.ResetTimer()
		start := time.Now()
		for n := 0; n < b.N; n++ {
			sink := &benchSink{target: total, done: make(chan struct{})}
			c := openBenchConn(b, s, 0, sink)
			<-sink.done
			c.Release()
		}
		b.ReportMetric(float64(total*b.N)/time.Since(start).Seconds(), "events/s")
	})

	for _, fan := range []int{100, 1000} {
		b.Run(fmt.Sprintf("fan-out-%d", fan), func(b *testing.B) {
			s := srv.stream(b, fmt.Sprintf("/conn/fan-%d-%d", fan, b.N))
			head := mustDescribeB(b, s).HeadOffset
			sinks := make([]*benchSink, fan)
			conns := make([]schema.Connection, fan)
			for i := range sinks {
				sinks[i] = &benchSink{arrivals: make(chan arrival, 1024)}
				conns[i] = openBenchConn(b, s, uint64(head), sinks[i])
			}
			defer func() {
				for _, c := range conns {
					c.Release()
				}
			}()
			lat := make([]time.Duration, 0, b.N*fan)
			cpu := srv.cpuMeter(b)
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				res, err := client.Append(context.Background(), s, benchEvents(1, i), itx.AppendOptions{})
				require.NoError(b, err)
				for _, k := range sinks {
					for a := range k.arrivals {
						if a.offset >= res.Offsets[0] {
							lat = append(lat, a.at.Sub(t0))
							break
						}
					}
				}
			}
			elapsed := time.Since(start)
			b.StopTimer()
			cpu.report(b)
			b.ReportMetric(float64(b.N*fan)/elapsed.Seconds(), "deliveries/s")
			slices.Sort(lat)
			reportLatency(b, lat)
		})
	}

	b.Run("idle-10000", func(b *testing.B) {
		const n = 10_000
		for r := 0; r < b.N; r++ {
			s := srv.stream(b, fmt.Sprintf("/conn/idle-%d", r))
			require.NoError(b, appendOnce(s, benchEvents(1, 0)))
			runtime.GC()
			before := procStatusMB(b, srv.cmd.Process.Pid, "VmRSS")
			conns := make([]schema.Connection, n)
			for i := range conns {
				conns[i] = openBenchConn(b, s, 1, &benchSink{})
			}
			after := procStatusMB(b, srv.cmd.Process.Pid, "VmRSS")
			b.ReportMetric(after, "rss-MB")
			b.ReportMetric((after-before)*1024/float64(n), "KiB/conn")
			srv.logMemory(b, "with 10,000 idle connections")
			for _, c := range conns {
				c.Release()
			}
		}
	})
}

func mustDescribeB(b *testing.B, s schema.Stream) itx.StreamInfo {
	info, err := client.Describe(context.Background(), s)
	require.NoError(b, err)
	return info
}
