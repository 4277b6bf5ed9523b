package test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/stretchr/testify/require"
)

// TestSubscriptions_ConfigSizeIsBounded: a subscription's config lives in the stream's catalog,
// in memory while the stream is loaded and in the core-state checkpoint rewritten with every
// catalog change, for as long as the subscription exists. Bounded by the event size alone (1 MiB),
// 256 of them made 256 MiB per loaded stream; --max-subscription-config-bytes (64 KiB) bounds
// one. A larger config is refused with tooLarge, writing nothing, whether it comes through
// configure or as a plain append; a stream written under a larger bound still loads.
func TestSubscriptions_ConfigSizeIsBounded(t *testing.T) {
	data := t.TempDir()
	p := startItxd(t, data)
	ctx := ctxT(t)
	conn := dial(t, p.addr)
	proj := conn.Login(ctx, p.creds.ProjectToken)
	s := stream(t, proj, "/configs")
	mustAppend(t, s, ev("a", `{}`))
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	cfg := func(name string, descBytes int) client.SubscriptionConfig {
		return client.SubscriptionConfig{Name: name, Description: strings.Repeat("d", descBytes),
			Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/elsewhere"}}
	}

	_, _, err := client.ConfigureSubscription(ctx, subs, cfg("big", 100<<10))
	requireCode(t, err, itx.ETooLarge)
	require.Contains(t, itx.ErrorMessage(err), "--max-subscription-config-bytes")

	payload, err := json.Marshal(map[string]any{"name": "appended", "description": strings.Repeat("d", 100<<10),
		"receiver": map[string]any{"action": "copy-to-stream", "receivingStreamPath": "/elsewhere"}})
	require.NoError(t, err)
	_, err = client.Append(ctx, s, []itx.EventInput{{Type: itx.TypeSubscriptionConfigured, Payload: payload}}, itx.AppendOptions{})
	requireCode(t, err, itx.ETooLarge)

	// Growing an existing subscription's config past the bound is refused too.
	_, _, err = client.ConfigureSubscription(ctx, subs, cfg("kept", 40<<10))
	require.NoError(t, err)
	_, _, err = client.ConfigureSubscription(ctx, subs, cfg("kept", 70<<10))
	requireCode(t, err, itx.ETooLarge)

	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.Equal(t, int64(2), info.HeadOffset, "nothing of the refused configures was written")
	require.Equal(t, 1, info.SubscriptionCount)

	// Restarted with a lower bound, the stream still loads with what it holds, and the bound
	// applies to what comes next.
	proj.Release()
	p.kill9(t)
	p = startItxd(t, data, "--max-subscription-config-bytes", "1024")
	conn = dial(t, p.addr)
	proj = conn.Login(ctx, p.creds.ProjectToken)
	defer proj.Release()
	s = stream(t, proj, "/configs")
	info, err = client.Describe(ctx, s)
	require.NoError(t, err)
	require.Equal(t, 1, info.SubscriptionCount)
	subs2 := client.Subscriptions(ctx, s)
	defer subs2.Release()
	_, _, err = client.ConfigureSubscription(ctx, subs2, cfg("small", 2<<10))
	requireCode(t, err, itx.ETooLarge)
	_, _, err = client.ConfigureSubscription(ctx, subs2, cfg("small", 10))
	require.NoError(t, err)
}
