package test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// itxd --metrics serves Prometheus text with the instruments operators need: appends, bytes,
// latency histograms, loaded streams and RPC connections.
func TestItxd_Metrics(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real itxd process")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	proc := startItxd(t, t.TempDir(), "--metrics", addr)
	ctx := ctxT(t)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	defer p.Release()
	s := stream(t, p, "/metered")
	mustAppend(t, s, ev("a", `{"x":1}`), ev("b", `{"x":2}`))
	_, err = client.Append(ctx, s, nil, itx.AppendOptions{})
	requireCode(t, err, "invalidArgument")

	var body string
	waitUntil(t, "metrics served", func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == 200
	})
	for _, want := range []string{
		`itx_append_calls_total{result="ok"} 1`,
		`itx_append_calls_total{result="invalidArgument"} 1`,
		"itx_appended_events_total 2",
		"itx_appended_bytes_total ",
		"itx_append_latency_seconds_bucket",
		"itx_commit_latency_seconds_bucket",
		"itx_commit_events_bucket",
		"itx_loaded_streams 1",
		"itx_rpc_connections 1",
		"go_goroutines",
	} {
		require.True(t, strings.Contains(body, want), "metrics lack %q", want)
	}
}

// itx_delivery_failures_total counts failed delivery tries by receiver kind, as the README
// promises: a webhook answering 503 twice is two webhook-post failures, an itx-call with nothing
// mounted one itx-call failure (its park), and a delivery that succeeds counts nothing.
func TestMetrics_DeliveryFailuresByKind(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	failures := func(kind string) float64 {
		return testutil.ToFloat64(e.ts.srv.Metrics().DeliveryFailures.WithLabelValues(kind))
	}
	h := newHook(t, func(n int, b itx.WebhookBody) int {
		if n < 2 {
			return 503
		}
		return 200
	})
	s := stream(t, e.p, "/failing")
	hook, _ := e.configure(t, s, client.SubscriptionConfig{Name: "hook", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	call, _ := e.configure(t, s, client.SubscriptionConfig{Name: "call", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "nobody-home"}})
	res := mustAppend(t, s, ev("job", `{}`))

	waitUntil(t, "first failure recorded", func() bool { return e.describe(t, s, hook).Attempt == 1 })
	require.Equal(t, 1.0, failures("webhook-post"))
	e.clock.Advance(time.Second)
	waitUntil(t, "second failure recorded", func() bool { return e.describe(t, s, hook).Attempt == 2 })
	e.clock.Advance(2 * time.Second)
	e.waitProcessed(t, s, hook, res.HeadOffset)
	waitUntil(t, "parked", func() bool { return e.describe(t, s, call).Status == "parked" })
	e.settle(t, "/failing")

	require.Equal(t, 2.0, failures("webhook-post"), "two 503s; the success is not a failure")
	require.Equal(t, 1.0, failures("itx-call"), "the absent receiver's one try")
	require.Zero(t, failures("copy-to-stream"))
}

// The failed-deliveries counter has a series for every receiver kind from the start, at 0, so an
// alert on its rate sees 0 rather than no data before the first failure.
func TestMetrics_DeliveryFailuresStartAtZero(t *testing.T) {
	ts := startServer(t, server.Config{})
	require.Equal(t, 4, testutil.CollectAndCount(ts.srv.Metrics().DeliveryFailures))
	require.Zero(t, testutil.ToFloat64(ts.srv.Metrics().DeliveryFailures.WithLabelValues("processor-wake")))
}

// So do the commits a disk refuses (a full one, a failing one) and the appends taken: an alert
// on rate(itx_commit_failures_total{code="resourceExhausted"}) saw no data until the disk first
// filled.
func TestMetrics_CommitFailuresStartAtZero(t *testing.T) {
	ts := startServer(t, server.Config{})
	require.Equal(t, 2, testutil.CollectAndCount(ts.srv.Metrics().CommitFailures))
	for _, code := range []string{"resourceExhausted", "unavailable"} {
		require.Zero(t, testutil.ToFloat64(ts.srv.Metrics().CommitFailures.WithLabelValues(code)))
	}
	require.Equal(t, 1, testutil.CollectAndCount(ts.srv.Metrics().AppendCalls))
}

// The consumer standing gauges sum what Streams.list shows per stream: subscriptions, those
// halted now, and the largest lag of any subscription or registered reader, from the live state
// of loaded streams and from the directory's summaries once they are unloaded.
func TestMetrics_ConsumerStanding(t *testing.T) {
	e := newSubEnv(t, server.Config{IdleTimeout: time.Minute})
	gauge := func(name string) float64 {
		t.Helper()
		mfs, err := e.ts.srv.Metrics().Registry.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == name {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatalf("no metric %s", name)
		return 0
	}
	standing := func() [5]float64 {
		return [5]float64{gauge("itx_subscriptions"), gauge("itx_subscriptions_halted"), gauge("itx_consumer_lag_max_events"), gauge("itx_readers"),
			gauge("itx_subscriptions_parked")}
	}
	require.Equal(t, [5]float64{0, 0, 0, 0, 0}, standing(), "nothing to stand anywhere yet")

	// A registered reader 5 behind on one stream, a subscription that will halt on another.
	read := stream(t, e.p, "/read")
	mustAppend(t, read, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`), ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))
	rf, release := read.Readers(e.ctx, nil)
	defer release()
	require.NoError(t, client.RegisterReader(e.ctx, rf.Readers(), "mirror", 1))
	require.Equal(t, [5]float64{0, 0, 5, 1, 0}, standing())
	// A reader at the head counts too, and lags by nothing.
	require.NoError(t, client.RegisterReader(e.ctx, rf.Readers(), "at-head", 6))
	require.Equal(t, [5]float64{0, 0, 5, 2, 0}, standing())

	h := newHook(t, func(int, itx.WebhookBody) int { return 500 })
	s := stream(t, e.p, "/ladder")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "fragile", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	e.configure(t, s, client.SubscriptionConfig{Name: "idle", Start: "now", FilterTypes: []string{"never"},
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	mustAppend(t, s, ev("job", `{"n":1}`))
	require.Equal(t, 2.0, gauge("itx_subscriptions"))
	require.Equal(t, 0.0, gauge("itx_subscriptions_halted"))
	for attempt := 1; attempt < itx.MaxDeliveryAttempts; attempt++ {
		waitUntil(t, fmt.Sprintf("attempt %d failed", attempt), func() bool { return e.describe(t, s, name).Attempt == attempt })
		e.clock.Advance(itx.Backoff(attempt, 0.5))
	}
	waitUntil(t, "halted", func() bool { return e.describe(t, s, name).Status == "halted" })
	d := e.describe(t, s, name)
	lag := d.HeadOffset - d.ConfirmedOffset
	require.Positive(t, lag)
	require.Equal(t, [5]float64{2, 1, float64(max(5, lag)), 2, 0}, standing(), "loaded: the streams' live state")

	// A receiver that is not mounted parks its subscription.
	e.configure(t, read, client.SubscriptionConfig{Name: "absent", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "nobody-mounted"}})
	mustAppend(t, read, ev("a", `{}`))
	waitUntil(t, "parked", func() bool { return e.describe(t, read, "absent").Status == itx.StatusParked })
	most := float64(max(lag, maxLagOf(t, s), maxLagOf(t, read), 8-1)) // the reader at 1, the head at 8
	require.Equal(t, [5]float64{3, 1, most, 2, 1}, standing(), "loaded, one parked")

	// Unloaded, both streams stand as their summaries say.
	e.unloadAll(t)
	require.Equal(t, [5]float64{3, 1, most, 2, 1}, standing(), "unloaded: the directory's summaries")
}
