package test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// logLines returns the JSON log records whose message starts with prefix.
func logLines(logs *syncBuffer, prefix string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(logs.String(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil {
			if msg, _ := rec["message"].(string); strings.HasPrefix(msg, prefix) {
				out = append(out, rec)
			}
		}
	}
	return out
}

// A subscription parked because its receiver's mount went away is a park like one a delivery
// finds: the operator sees it in itx_subscription_parks_total and in the log, not only in the
// gauge of parked subscriptions. (The unmount parked a caught-up subscription at once, but
// neither counted nor logged it, so the gauge rose with no park on record.)
func TestOperatorView_UnmountParkIsCountedAndLogged(t *testing.T) {
	var logs syncBuffer
	ts := startServer(t, server.Config{Log: zerolog.New(&logs)})
	ctx := ctxT(t)
	p := ts.project(t)
	s := stream(t, p, "/calls")
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "call", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}})
	require.NoError(t, err)
	h, err := client.MountReceiver(ctx, p, "inbox", client.ServeReceiver(func(context.Context, itx.DeliveryBatch) (int64, error) { return 0, nil }))
	require.NoError(t, err)
	head := mustAppend(t, s, ev("a", `{}`)).HeadOffset
	sub := client.Subscription(ctx, s, "call")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	parks := func() float64 { return testutil.ToFloat64(ts.srv.Metrics().SubscriptionParks) }
	require.Zero(t, parks(), "delivered to its mount: no park yet")

	h.Release() // unmounts: the caught-up subscription parks with nothing appended
	waitUntil(t, "parked", func() bool { return describeSubIn(ctx, t, s, "call").Status == itx.StatusParked })
	waitUntil(t, "the park counted", func() bool { return parks() == 1 })
	var lines []map[string]any
	waitUntil(t, "the park logged", func() bool {
		lines = logLines(&logs, "subscription parked")
		return len(lines) > 0
	})
	require.Len(t, lines, 1, "one park, one line")
	require.Equal(t, "/calls", lines[0]["path"])
	require.Equal(t, "call", lines[0]["subscription"])
	require.Contains(t, lines[0]["error"], "it was unmounted")
	require.EqualValues(t, head, lines[0]["confirmedOffset"])
}
