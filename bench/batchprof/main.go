// Command batchprof appends 100-event batches from one producer with up to -inflight of them
// unanswered (client.Appender) to a running itxd, for -d, and writes its own CPU profile: run it
// while taking itxd's (--pprof) to see where a pipelined batch's time goes on both sides. With
// -sliding it keeps the window full instead of flushing after each burst (make compare's shape).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:7878", "itxd's address")
	token := flag.String("token", "", "a project token")
	dur := flag.Duration("d", 15*time.Second, "how long to append")
	prof := flag.String("prof", "client.prof", "where the client's CPU profile goes")
	inflight := flag.Int("inflight", 8, "batches unanswered at most")
	sliding := flag.Bool("sliding", false, "keep the window full (no flush after each burst)")
	flag.Parse()
	ctx := context.Background()
	conn, err := client.Dial(ctx, *addr)
	if err != nil {
		panic(err)
	}
	p := conn.Login(ctx, *token)
	s := client.Stream(ctx, p, "/bprof")
	pb := client.NewAppender(s, *inflight)
	f, err := os.Create(*prof)
	if err != nil {
		panic(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		panic(err)
	}
	start := time.Now()
	n := 0
	for time.Since(start) < *dur {
		for k := 0; k < *inflight; k++ {
			events := make([]itx.EventInput, 100)
			for j := range events {
				n++
				events[j] = itx.EventInput{Type: "bench.event", Payload: []byte(fmt.Sprintf(`{"seq":%d,"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`, n))}
			}
			if _, err := pb.Append(ctx, events, itx.AppendOptions{}); err != nil {
				panic(err)
			}
		}
		if *sliding {
			continue
		}
		if err := pb.Flush(ctx); err != nil {
			panic(err)
		}
	}
	if err := pb.Flush(ctx); err != nil {
		panic(err)
	}
	pprof.StopCPUProfile()
	fmt.Printf("%.0f events/s\n", float64(n)/time.Since(start).Seconds())
}
