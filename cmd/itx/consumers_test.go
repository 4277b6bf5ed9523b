package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// itx consumers lists every subscription and registered reader under a prefix with its lag,
// halted ones first and then by lag; --behind leaves out the caught-up ones; a bad prefix is a
// usage error.
func TestRun_Consumers(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	srv := itxtest.Start(t, server.Config{Clock: clock, Random: func() float64 { return 0.5 }})
	ts := &testServer{addr: srv.Addr, token: srv.Creds.ProjectToken, dir: srv.Dir}
	for _, p := range []string{"/shop/orders", "/shop/carts", "/other", "/quiet"} {
		ts.appendDirect(t, p, itx.EventInput{Type: "e", Payload: json.RawMessage(`{}`)})
	}
	c := newCLI(t)
	conn := []string{"--addr", ts.addr, "--token", ts.token}
	code, _, errs := c.run("", append(conn, "-e", `
		let orders = project.streams.get("/shop/orders")
		orders.subscriptions.configure({name: "mirror", receiver: {type: "copy-to-stream", path: "/mirror"}})
		orders.subscriptions.get("mirror").waitUntilProcessed(2)
		orders.readers.register("dashboard", 0)
		let carts = project.streams.get("/shop/carts")
		carts.subscriptions.configure({name: "hook", receiver: {type: "webhook-post", url: "http://127.0.0.1:1/unreachable"}})
		project.streams.get("/other").readers.register("late", 0)
		project.streams.get("/quiet").readers.register("at-head", 1)
	`)...)
	require.Equal(t, exitOK, code, errs)
	// The webhook fails every attempt: its ladder, on the virtual clock, ends in a halt.
	ctx := t.Context()
	hook := client.Subscription(ctx, ts.streamDirect(t, ctx, "/shop/carts"), "hook")
	defer hook.Release()
	describe := func() itx.SubscriptionDescription {
		d, err := client.DescribeSubscription(ctx, hook)
		require.NoError(t, err)
		return d
	}
	for attempt := 1; attempt < itx.MaxDeliveryAttempts; attempt++ {
		require.Eventually(t, func() bool { return describe().Attempt == attempt }, 10*time.Second, time.Millisecond, "attempt %d", attempt)
		clock.Advance(itx.Backoff(attempt, 0.5))
	}
	require.Eventually(t, func() bool { return describe().Status == itx.StatusHalted }, 10*time.Second, time.Millisecond, "halted")

	type row struct {
		Path, Name, Kind, Status string
		Confirmed, Head, Lag     int64
		Attempt                  int
	}
	consumers := func(args ...string) []row {
		t.Helper()
		code, out, errs := c.run("", append(append(conn, "--json", "consumers"), args...)...)
		require.Equal(t, exitOK, code, errs)
		var rows []row
		require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
		return rows
	}
	all := consumers()
	require.Len(t, all, 5, "%+v", all)
	require.Equal(t, row{"/shop/carts", "hook", "webhook-post", "halted", 0, 3, 3, itx.MaxDeliveryAttempts}, all[0], "halted first, on the ladder's last rung")
	require.Equal(t, row{"/shop/orders", "dashboard", "reader", "active", 0, 2, 2, 0}, all[1], "then by lag")
	require.Equal(t, "/other", all[2].Path)
	require.Equal(t, int64(1), all[2].Lag)
	require.Equal(t, row{"/quiet", "at-head", "reader", "active", 1, 1, 0, 0}, all[3], "a caught-up reader is listed too")
	require.Equal(t, row{"/shop/orders", "mirror", "copy-to-stream", "active", 2, 2, 0, 0}, all[4])

	behind := consumers("--behind")
	require.Len(t, behind, 3, "the caught-up mirror is left out: %+v", behind)
	shop := consumers("/shop/", "--behind")
	require.Len(t, shop, 2)
	for _, r := range shop {
		require.True(t, strings.HasPrefix(r.Path, "/shop/"), r.Path)
	}

	code, _, errs = c.run("", append(conn, "consumers", "shop")...)
	require.Equal(t, exitUsage, code, errs)
	require.Contains(t, errs, "must start with /")
}
