package test

import (
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A processorWake config sent over RPC with a start or failing-event policy (what a client in
// any language can put in the struct) is refused, writing nothing: the processor owns its
// checkpoint, so the policy would otherwise be dropped unheard.
func TestSubscriptions_ProcessorWakeRefusesADeliveryPolicy(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/pw")
	mustAppend(t, s, ev("note", `{}`))
	ctx := ctxT(t)
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	for name, set := range map[string]func(c schema.SubscriptionConfig){
		"start now":           func(c schema.SubscriptionConfig) { c.SetStart(schema.StartPosition_now) },
		"onFailingEvent skip": func(c schema.SubscriptionConfig) { c.SetOnFailingEvent(schema.FailingEventPolicy_skip) },
	} {
		t.Run(name, func(t *testing.T) {
			fut, release := subs.Configure(ctx, func(p schema.Subscriptions_configure_Params) error {
				c, err := p.NewConfig()
				if err != nil {
					return err
				}
				if err := c.SetName("guestbook"); err != nil {
					return err
				}
				c.Receiver().SetProcessorWake()
				set(c)
				return nil
			})
			defer release()
			_, err := fut.Struct()
			requireCode(t, err, itx.EInvalid)
			info, err := client.Describe(ctx, s)
			require.NoError(t, err)
			require.Equal(t, int64(1), info.HeadOffset, "nothing written")
		})
	}
}
