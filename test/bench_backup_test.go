package test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/stretchr/testify/require"
)

// BenchmarkBackup: Admin.backup of a data directory of 100 loaded streams of 2,000 events each
// (~85-byte payloads) while one appender appends to another stream one event at a time. An op
// is one backup. It reports how long the loaded streams stood still for the instant
// (frozen-us, itxd's own figure), the appender's slowest, p99 and median append during the
// backups (append-*-us) and for as long again without one (append-*-us-nobackup), and the
// copy's rate (MB/s of database files written).
func BenchmarkBackup(b *testing.B) {
	b.Run("to-path", func(b *testing.B) { benchBackup(b, false) })
	// download: the same copy sent over the connection to a BackupSink in this process.
	b.Run("download", func(b *testing.B) { benchBackup(b, true) })
}

func benchBackup(b *testing.B, download bool) {
	const streams, perStream = 100, 2000
	srv := startBenchItxd(b, noBreaker...)
	p := srv.project(b)
	ctx := context.Background()
	for i := 0; i < streams; i++ {
		s := client.Stream(ctx, p, fmt.Sprintf("/data/%03d", i))
		for j := 0; j < perStream; j += 500 {
			_, err := client.Append(ctx, s, benchEvents(500, j), itx.AppendOptions{})
			require.NoError(b, err)
		}
		s.Release()
	}
	root, err := client.Dial(ctx, srv.addr)
	require.NoError(b, err)
	b.Cleanup(func() { root.Close() })
	admin := client.Admin(ctx, root.Login(ctx, srv.creds.DeploymentToken))
	hot := srv.stream(b, "/hot")
	_, err = client.Append(ctx, hot, benchEvents(1, 0), itx.AppendOptions{})
	require.NoError(b, err)

	var mu sync.Mutex
	var lat []time.Duration
	measuring := false
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			if _, err := client.Append(ctx, hot, benchEvents(1, i), itx.AppendOptions{}); err != nil {
				b.Error(err)
				return
			}
			mu.Lock()
			if measuring {
				lat = append(lat, time.Since(start))
			}
			mu.Unlock()
		}
	}()

	var frozen time.Duration
	var bytes int64
	dir := b.TempDir()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		mu.Lock()
		measuring = true
		mu.Unlock()
		backup := client.Backup
		if download {
			backup = client.DownloadBackup
		}
		res, err := backup(ctx, admin, filepath.Join(dir, fmt.Sprintf("b%d", i)))
		mu.Lock()
		measuring = false
		mu.Unlock()
		require.NoError(b, err)
		require.GreaterOrEqual(b, res.Streams, streams+1)
		frozen += res.Frozen
		bytes += res.Bytes
	}
	elapsed := time.Since(start)
	b.StopTimer()
	// The same appender for as long again without a backup: its own spread on this machine.
	mu.Lock()
	during := lat
	lat, measuring = nil, true
	mu.Unlock()
	time.Sleep(elapsed)
	mu.Lock()
	without := lat
	measuring = false
	mu.Unlock()
	close(stop)
	<-done
	for _, x := range []struct {
		name string
		lat  []time.Duration
	}{{"", during}, {"-nobackup", without}} {
		slices.Sort(x.lat)
		if len(x.lat) > 0 {
			b.ReportMetric(float64(x.lat[len(x.lat)-1].Microseconds()), "append-max-us"+x.name)
			b.ReportMetric(float64(x.lat[len(x.lat)*99/100].Microseconds()), "append-p99-us"+x.name)
			b.ReportMetric(float64(x.lat[len(x.lat)/2].Microseconds()), "append-p50-us"+x.name)
		}
	}
	b.ReportMetric(float64(frozen.Microseconds())/float64(b.N), "frozen-us")
	b.ReportMetric(float64(bytes)/1e6/elapsed.Seconds(), "MB/s")
}
