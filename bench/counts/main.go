// Command counts populates an itxd with many things of one kind over real RPC and times the calls
// that must cope with their number (docs/benchmarks.md, "Counts").
//
//	go run ./counts -addr 127.0.0.1:8266 -data /tmp/d -do streams -n 20000
//	go run ./counts -addr 127.0.0.1:8266 -data /tmp/d -do list
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8266", "itxd's RPC address")
	data := flag.String("data", "", "itxd's data directory (for its credentials)")
	do := flag.String("do", "streams", "streams | list | subs | readers | scheduled | describe")
	n := flag.Int("n", 1000, "how many")
	par := flag.Int("par", 16, "calls in flight")
	path := flag.String("path", "/one", "the stream for subs, readers, scheduled, describe")
	in := flag.Duration("in", time.Minute, "schedmany: how far ahead the appends are due")
	prefix := flag.String("prefix", "", "list: the prefix; with -n, that many single-page calls are timed")
	flag.Parse()
	var creds struct{ ProjectToken string }
	b, err := os.ReadFile(filepath.Join(*data, "credentials.json"))
	if err != nil {
		log.Fatal(err)
	}
	if err := json.Unmarshal(b, &creds); err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	conn, err := client.Dial(ctx, *addr)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	project := conn.Login(ctx, creds.ProjectToken)
	start := time.Now()
	switch *do {
	case "streams":
		onEachStream(ctx, project, *par, *n, func(i int64, s schema.Stream) {
			if _, err := client.Append(ctx, s, []itx.EventInput{{Type: "x", Payload: []byte(`{"i":1}`)}}, itx.AppendOptions{}); err != nil {
				log.Fatal(err)
			}
			if i%2000 == 0 {
				fmt.Fprintf(os.Stderr, "%d streams, %.0f/s\n", i, float64(i)/time.Since(start).Seconds())
			}
		})
	case "list":
		streams := client.Streams(ctx, project)
		if *prefix != "" {
			var took []time.Duration
			var got int
			for range *n {
				t := time.Now()
				page, _, err := client.ListStreamsPage(ctx, streams, *prefix, "", 0)
				if err != nil {
					log.Fatal(err)
				}
				took, got = append(took, time.Since(t)), len(page)
			}
			slices.Sort(took)
			fmt.Printf("list prefix %q: %d streams, median %v over %d calls\n", *prefix, got, took[len(took)/2], len(took))
			break
		}
		after, total, pages := "", 0, 0
		for {
			t := time.Now()
			page, next, err := client.ListStreamsPage(ctx, streams, "", after, 0)
			if err != nil {
				log.Fatal(err)
			}
			total += len(page)
			pages++
			if pages == 1 || next == "" {
				fmt.Printf("page %d: %d streams in %v\n", pages, len(page), time.Since(t))
			}
			if next == "" {
				break
			}
			after = next
		}
		fmt.Printf("listed %d streams in %d pages\n", total, pages)
	case "subs":
		s := client.Stream(ctx, project, *path)
		subs := client.Subscriptions(ctx, s)
		for i := range *n {
			t := time.Now()
			_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{
				Name:     fmt.Sprintf("sub-%05d", i),
				Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "cap-" + fmt.Sprint(i)},
			})
			if err != nil {
				log.Fatal(err)
			}
			if i%100 == 0 || i == *n-1 {
				fmt.Printf("configure #%d: %v\n", i, time.Since(t))
			}
		}
		t := time.Now()
		l, err := client.ListSubscriptions(ctx, subs)
		fmt.Printf("list %d subscriptions: %v %v\n", len(l), time.Since(t), err)
	case "readers":
		s := client.Stream(ctx, project, *path)
		rs := client.Readers(ctx, s)
		for i := range *n {
			t := time.Now()
			if err := client.RegisterReader(ctx, rs, fmt.Sprintf("reader-%05d", i), 0); err != nil {
				log.Fatal(err)
			}
			if i%100 == 0 || i == *n-1 {
				fmt.Printf("register #%d: %v\n", i, time.Since(t))
			}
		}
	case "scheduled":
		s := client.Stream(ctx, project, *path)
		due := time.Now().Add(24 * time.Hour)
		for i := range *n {
			t := time.Now()
			if _, _, err := client.Schedule(ctx, s, itx.EventInput{Type: "later", IdempotencyKey: fmt.Sprintf("k-%06d", i)}, due.Add(time.Duration(i)*time.Second)); err != nil {
				log.Fatal(err)
			}
			if i%1000 == 0 || i == *n-1 {
				fmt.Printf("schedule #%d: %v\n", i, time.Since(t))
			}
		}
	case "schedmany":
		// one scheduled append on each of n existing streams /s/000001.., all due in -in
		due := time.Now().Add(*in)
		onEachStream(ctx, project, *par, *n, func(_ int64, s schema.Stream) {
			if _, _, err := client.Schedule(ctx, s, itx.EventInput{Type: "due", IdempotencyKey: "due-" + fmt.Sprint(due.UnixMilli())}, due); err != nil {
				log.Fatal(err)
			}
		})
		fmt.Printf("scheduled on %d streams, due %s\n", *n, due.Format(time.RFC3339Nano))
	case "describe":
		s := client.Stream(ctx, project, *path)
		for range 3 {
			t := time.Now()
			_, err := client.Describe(ctx, s)
			fmt.Printf("describe: %v %v\n", time.Since(t), err)
		}
	default:
		log.Fatalf("unknown -do %q", *do)
	}
	fmt.Printf("%s n=%d: %v\n", *do, *n, time.Since(start))
}

// onEachStream calls f on /s/000001 .. /s/<n> of project, from par goroutines at once.
func onEachStream(ctx context.Context, project schema.Project, par, n int, f func(i int64, s schema.Stream)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				s := client.Stream(ctx, project, fmt.Sprintf("/s/%06d", i))
				f(i, s)
				s.Release()
			}
		}()
	}
	wg.Wait()
}
