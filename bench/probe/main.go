// Command probe splits a sequential append's latency against a separate itxd: the RPC round trip of
// a call that writes nothing (Stream.describe), the append, and the server's own mean commit time
// over the same appends (itx_commit_latency_seconds from its /metrics). See docs/benchmarks.md,
// "Where a sequential append's time goes".
//
//	cd bench && go build -o /tmp/itxd ../cmd/itxd && go run ./probe -itxd /tmp/itxd [-batch 100]
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"capnproto.org/go/capnp/v3/rpc"
	"github.com/itx-dev/itx/schema"
)

func pct(l []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), l...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(float64(len(s)-1)*p)]
}

func metric(addr, name string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), name+" ") {
			v, _ := strconv.ParseFloat(strings.Fields(sc.Text())[1], 64)
			return v
		}
	}
	return 0
}

func main() {
	bin := flag.String("itxd", "/tmp/itxd", "the itxd binary to start")
	n := flag.Int("n", 3000, "calls per round and kind")
	batch := flag.Int("batch", 1, "events per append")
	dir := flag.String("dir", ".", "where the data directory goes (the disk under test)")
	metricsAddr := flag.String("metrics", "127.0.0.1:7931", "itxd's metrics address")
	serverProcs := flag.String("server-gomaxprocs", "", "GOMAXPROCS for itxd only (empty: inherited)")
	withConn := flag.Bool("conn", false, "keep a live connection open on the stream (every append is also pushed to it)")
	flag.Parse()
	data, err := os.MkdirTemp(*dir, "probe-data")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(data)
	addrFile := filepath.Join(data, "addr")
	cmd := exec.Command(*bin, "--listen", "127.0.0.1:0", "--data", data, "--addr-file", addrFile, "--log-level", "error", "--metrics", *metricsAddr)
	if *serverProcs != "" {
		cmd.Env = append(os.Environ(), "GOMAXPROCS="+*serverProcs)
	}
	if err := cmd.Start(); err != nil {
		panic(err)
	}
	defer cmd.Process.Kill()
	var addr string
	for addr == "" {
		b, _ := os.ReadFile(addrFile)
		addr = string(b)
		time.Sleep(10 * time.Millisecond)
	}
	var creds struct{ ProjectToken string }
	b, _ := os.ReadFile(filepath.Join(data, "credentials.json"))
	json.Unmarshal(b, &creds)
	nc, _ := net.Dial("tcp", addr)
	nc.(*net.TCPConn).SetNoDelay(true)
	conn := rpc.NewConn(rpc.NewStreamTransport(nc), nil)
	ctx := context.Background()
	g := schema.Gateway(conn.Bootstrap(ctx))
	lf, _ := g.Login(ctx, func(p schema.Gateway_login_Params) error { return p.SetToken(creds.ProjectToken) })
	sf, _ := lf.Project().Streams(ctx, nil)
	gf, _ := sf.Streams().Get(ctx, func(p schema.Streams_get_Params) error { return p.SetPath("/probe") })
	s := gf.Stream()
	appendOne := func(i int) {
		f, rel := s.Append(ctx, func(p schema.Stream_append_Params) error {
			l, _ := p.NewEvents(int32(*batch))
			for j := 0; j < *batch; j++ {
				l.At(j).SetType("probe")
				l.At(j).SetPayload(fmt.Sprintf(`{"i":%d,"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`, i))
			}
			return nil
		})
		if _, err := f.Struct(); err != nil {
			panic(err)
		}
		rel()
	}
	appendOne(0)
	if *withConn {
		cf, release := s.OpenConnection(ctx, func(p schema.Stream_openConnection_Params) error {
			o, err := p.NewOptions()
			if err != nil {
				return err
			}
			o.SetNoState(true)
			return p.SetSink(schema.EventSink_ServerToClient(nullSink{}))
		})
		if _, err := cf.Struct(); err != nil {
			panic(err)
		}
		defer release()
	}
	for round := 0; round < 3; round++ {
		var d, a []time.Duration
		for i := 0; i < *n; i++ {
			t := time.Now()
			f, rel := s.Describe(ctx, nil)
			if _, err := f.Struct(); err != nil {
				panic(err)
			}
			rel()
			d = append(d, time.Since(t))
		}
		c0, s0 := metric(*metricsAddr, "itx_commit_latency_seconds_count"), metric(*metricsAddr, "itx_commit_latency_seconds_sum")
		b0 := []float64{metric(*metricsAddr, `itx_commit_latency_seconds_bucket{le="0.0008"}`), metric(*metricsAddr, `itx_commit_latency_seconds_bucket{le="0.0016"}`)}
		for i := 0; i < *n; i++ {
			t := time.Now()
			appendOne(i)
			a = append(a, time.Since(t))
		}
		c1, s1 := metric(*metricsAddr, "itx_commit_latency_seconds_count"), metric(*metricsAddr, "itx_commit_latency_seconds_sum")
		b1 := []float64{metric(*metricsAddr, `itx_commit_latency_seconds_bucket{le="0.0008"}`), metric(*metricsAddr, `itx_commit_latency_seconds_bucket{le="0.0016"}`)}
		fmt.Printf("describe p50 %v p90 %v p99 %v | append p50 %v p90 %v p99 %v | commit mean %.0fus over %v, %.1f%% above 0.8 ms, %.1f%% above 1.6 ms\n",
			pct(d, .5), pct(d, .9), pct(d, .99), pct(a, .5), pct(a, .9), pct(a, .99), (s1-s0)/(c1-c0)*1e6, c1-c0,
			100*(1-(b1[0]-b0[0])/(c1-c0)), 100*(1-(b1[1]-b0[1])/(c1-c0)))
	}
}

// nullSink takes every batch (-conn).
type nullSink struct{}

func (nullSink) Deliver(context.Context, schema.EventSink_deliver) error { return nil }
func (nullSink) Closed(context.Context, schema.EventSink_closed) error   { return nil }
func (nullSink) State(context.Context, schema.EventSink_state) error     { return nil }
