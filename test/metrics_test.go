package test

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
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
