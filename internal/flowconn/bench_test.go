package flowconn_test

import (
	"context"
	"net"
	"runtime/metrics"
	"sync"
	"syscall"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/rpc"
	"github.com/itx-dev/itx/internal/flowconn"
	"github.com/itx-dev/itx/schema"
)

// BenchmarkTransport_Calls makes small calls to a flow-controlled server over loopback TCP, one
// at a time and 64 in flight, and reports the CPU both ends spend per call (cpu-us/call, from
// getrusage: less sensitive than ns/op to whatever else the machine runs), and the goroutines
// both ends start per call.
func BenchmarkTransport_Calls(b *testing.B) {
	for _, inFlight := range []int{1, 64} {
		b.Run(map[int]string{1: "sequential", 64: "64-in-flight"}[inFlight], func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			pool := flowconn.NewPool(flowconn.Limits{})
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				tr := flowconn.New(c, pool)
				conn := rpc.NewConn(tr, &rpc.Options{BootstrapClient: capnp.Client(schema.Gateway_ServerToClient(&gateway{t: tr}))})
				tr.CountCapabilities(conn.ExportCount) // as itxd serves a connection
				<-conn.Done()
			}()
			nc, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			conn := rpc.NewConn(rpc.NewStreamTransport(nc), nil)
			defer conn.Close()
			gw := schema.Gateway(conn.Bootstrap(context.Background()))
			defer gw.Release()
			call := func() error {
				fut, release := gw.Login(context.Background(), nil)
				defer release()
				_, err := fut.Struct()
				return err
			}
			if err := call(); err != nil {
				b.Fatal(err)
			}
			cpu0, created0 := cpuTime(), goroutinesCreated()
			b.ResetTimer()
			var wg sync.WaitGroup
			for w := 0; w < inFlight; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := w; i < b.N; i += inFlight {
						if err := call(); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-us/call")
			b.ReportMetric(float64(goroutinesCreated()-created0)/float64(b.N), "goroutines/call")
		})
	}
}

// goroutinesCreated is the number of goroutines the process has started (both ends run here).
func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
