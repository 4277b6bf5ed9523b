package test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/stretchr/testify/require"
)

// BenchmarkAppendUnderAbuse: a well-behaved client's sequential appends (one ~85-byte event
// each) first on an idle itxd, then while another client pipelines 100,000 getEventPage(limit
// 500) calls on 1 KiB events and never reads a reply. Reports both p99s, their ratio and itxd's
// peak RSS. b.N counts the appends measured under abuse.
func BenchmarkAppendUnderAbuse(b *testing.B) {
	srv := startBenchItxd(b)
	pages := srv.stream(b, "/abuse/pages")
	for i := range 10 {
		_, err := client.Append(context.Background(), pages, kibEvents(100, i*100), itx.AppendOptions{})
		require.NoError(b, err)
	}
	w := srv.stream(b, "/abuse/writer")
	measure := func(n, base int) []time.Duration {
		lat := make([]time.Duration, n)
		for i := range lat {
			start := time.Now()
			require.NoError(b, appendOnce(w, benchEvents(1, base+i)))
			lat[i] = time.Since(start)
		}
		slices.Sort(lat)
		return lat
	}
	const idleN = 2000
	idle := measure(idleN, 0)

	abused := make(chan func(), 1)
	go func() { abused <- pipelineUnread(b, srv.addr, srv.creds.ProjectToken, "/abuse/pages", 100_000) }()
	b.ResetTimer()
	cpu := srv.cpuMeter(b)
	busy := measure(b.N, idleN)
	b.StopTimer()
	cpu.report(b)
	(<-abused)()

	idleP99, busyP99 := percentile(idle, 0.99), percentile(busy, 0.99)
	b.ReportMetric(float64(percentile(idle, 0.50).Microseconds()), "idle-p50-us")
	b.ReportMetric(float64(idleP99.Microseconds()), "idle-p99-us")
	b.ReportMetric(float64(percentile(busy, 0.50).Microseconds()), "abuse-p50-us")
	b.ReportMetric(float64(busyP99.Microseconds()), "abuse-p99-us")
	b.ReportMetric(float64(busyP99)/float64(idleP99), "p99-ratio")
	b.ReportMetric(procStatusMiB(b, srv.cmd.Process.Pid, "VmHWM"), "server-peak-MiB")
	b.Logf("reads paused %v times; %s", srv.scrape(b, "itx_rpc_read_pauses_total"), fmt.Sprint("calls in flight ", srv.scrape(b, "itx_rpc_calls_in_flight")))
}
