package test

import (
	"strings"
	"testing"

	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A processor instance under the longest subscription name (500 characters) on a 1,000-byte
// path, in a real itxd: its stable-keyed append lands and the cursor passes it. The key
// Args.IdempotencyKey built there (name, key word, path and offset: over 1,500 bytes) was
// refused by itxd's 512-byte bound at every redelivery, so the forwarder stalled on its first
// event until the ladder halted it.
func TestProcessors_LongestNameOnADeepPathAppends(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "forwarder")})
	ctx := ctxT(t)
	path := "/" + strings.Repeat("p", 999)
	s := stream(t, ts.project(t), path)
	name := strings.Repeat("f", 500)
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{
		Name: name, Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Processor: "forwarder"},
	})
	require.NoError(t, err)
	head := mustAppend(t, s, examples.InboxMessage.Input([]byte(`{"n":1}`), "")).HeadOffset
	sub := client.Subscription(ctx, s, name)
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	require.Equal(t, 1, countType(t, s, string(examples.OutboxForwarded)))
}
