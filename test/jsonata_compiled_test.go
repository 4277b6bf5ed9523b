package test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/stretchr/testify/require"
)

// Compiled JSONata is bounded over the process (--jsonata-max-compiled-bytes): barriers waiting
// with long `where` expressions and subscriptions with long conditions kept each compiled
// expression (10-30 times its text) for as long as they lived, so a client could hold hundreds
// of megabytes with a few connections of waits. Past the bound expressions are dropped and
// compiled again on use, and still judge events as before.
func TestItxd_CompiledJSONataIsBounded(t *testing.T) {
	const budget = 200_000
	metrics := freeAddr(t)
	p := startItxd(t, t.TempDir(), "--metrics", metrics, "--jsonata-max-compiled-bytes", fmt.Sprint(budget))
	ctx := ctxT(t)
	conn := dial(t, p.addr)
	proj := conn.Login(ctx, p.creds.ProjectToken)
	defer proj.Release()
	s := stream(t, proj, "/bounded")
	mustAppend(t, s, ev("x", `{}`))

	// Each `where` is ~4 KiB: ~130 KB compiled by the estimate, 20 of them 2.6 MB.
	pad := strings.Repeat(" and true", 450)
	const waits = 20
	got := make(chan error, waits)
	for i := range waits {
		where := fmt.Sprintf("payload.n = %d%s", i, pad)
		go func() {
			e, err := client.WaitForEvent(ctx, s, itx.Predicate{Where: where}, 1, 30*time.Second)
			if err == nil && string(e.Payload) != fmt.Sprintf(`{"n":%d}`, i) {
				err = fmt.Errorf("wait %d matched %s", i, e.Payload)
			}
			got <- err
		}()
	}
	// Every wait is registered once the stream has seen each compile; the gauge stays within
	// the bound throughout.
	require.Eventually(t, func() bool {
		return scrapeMetric(t, metrics, "itx_jsonata_compiled_bytes") > 0
	}, 10*time.Second, 5*time.Millisecond)
	for i := range waits {
		mustAppend(t, s, ev("x", fmt.Sprintf(`{"n":%d}`, i)))
		require.LessOrEqual(t, scrapeMetric(t, metrics, "itx_jsonata_compiled_bytes"), float64(budget))
	}
	for range waits {
		require.NoError(t, <-got)
	}

	// A subscription's condition and transform, dropped and compiled again between events by
	// the waits above and below, still filter and shape every event.
	subs := client.Subscriptions(ctx, s)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "even", Start: "now",
		FilterCondition: "payload.n % 2 = 0" + pad,
		Transform:       `{"type": "even", "payload": {"m": payload.n * 10, "t": true` + pad + `}}`,
		Receiver:        client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/even"}})
	require.NoError(t, err)
	for i := range 10 {
		mustAppend(t, s, ev("x", fmt.Sprintf(`{"n":%d}`, 100+i)))
		go func() { // churn the cache meanwhile
			_, _ = client.WaitForEvent(ctx, s, itx.Predicate{Where: fmt.Sprintf("payload.n = -%d%s", i, pad)}, 1, time.Millisecond)
		}()
	}
	even := stream(t, proj, "/even")
	var events []itx.Event
	require.Eventually(t, func() bool {
		events, err = client.GetEvents(ctx, even, itx.Query{})
		return err == nil && len(events) >= 5
	}, 20*time.Second, 10*time.Millisecond)
	require.Len(t, events, 5)
	for i, e := range events {
		require.Equal(t, "even", e.Type)
		require.JSONEq(t, fmt.Sprintf(`{"m":%d,"t":true}`, (100+2*i)*10), string(e.Payload))
	}
	require.LessOrEqual(t, scrapeMetric(t, metrics, "itx_jsonata_compiled_bytes"), float64(budget))
}
