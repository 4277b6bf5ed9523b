package client

import (
	"context"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/wire"
	"github.com/stretchr/testify/require"
)

// A subscription config survives the trip through its Cap'n Proto struct, for every receiver
// kind: configure() writes what describe() reads back, through wire/'s one codec.
func TestSubscriptionConfig_RoundTrip(t *testing.T) {
	for _, cfg := range []SubscriptionConfig{
		{Name: "hook", Receiver: Receiver{Kind: ReceiverWebhookPost, URL: "https://example.test/h", Secret: "whsec_x",
			Headers: []Header{{"X-A", "1"}, {"X-B", "2"}}}, FilterTypes: []string{"note", "other"},
			FilterCondition: `payload.n > 1`, Start: "now", OnFailingEvent: "skip", Description: "d"},
		{Name: "copy", Receiver: Receiver{Kind: ReceiverCopyToStream, Path: "/mirror"}, Transform: `{"type": type}`,
			Start: "beginning", OnFailingEvent: "halt"},
		{Receiver: Receiver{Kind: ReceiverItxCall, Capability: "inbox"}, Start: "beginning", OnFailingEvent: "halt"},
		{Name: "agent", Receiver: Receiver{Kind: ReceiverProcessorWake, Placement: "remote"}, Start: "beginning", OnFailingEvent: "halt"},
	} {
		_, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
		require.NoError(t, err)
		c, err := schema.NewRootSubscriptionConfig(seg)
		require.NoError(t, err)
		ic, err := cfg.Config()
		require.NoError(t, err)
		require.NoError(t, wire.SetSubscriptionConfig(c, &ic))
		got, err := wire.SubscriptionConfigFromSchema(c)
		require.NoError(t, err)
		require.Equal(t, cfg, ConfigOf(got))
	}
}

func TestSubscriptionConfig_Refused(t *testing.T) {
	for _, tc := range []struct {
		cfg  SubscriptionConfig
		want string
	}{
		{SubscriptionConfig{Receiver: Receiver{Kind: "email"}}, `receiver kind "email"`},
		{SubscriptionConfig{Receiver: Receiver{Kind: ReceiverItxCall}, Start: "later"}, `start "later"`},
		{SubscriptionConfig{Receiver: Receiver{Kind: ReceiverItxCall}, OnFailingEvent: "retry"}, `onFailingEvent "retry"`},
	} {
		_, err := tc.cfg.Config()
		require.ErrorContains(t, err, tc.want)
	}
}

// A timeout the wire's 32 bits of milliseconds cannot carry, or past the server's bound, is
// refused before the call instead of wrapping to another timeout.
func TestWaitUntilProcessed_TimeoutBeyondTheBound(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, itx.MaxWaitTimeout + time.Millisecond, (1<<32 + 100) * time.Millisecond} {
		_, err := WaitUntilProcessed(context.Background(), schema.Subscription{}, 1, d)
		if got := itx.ErrorCode(err); got != itx.EInvalid {
			t.Errorf("timeout %s: got %v (%q), want %s", d, got, err, itx.EInvalid)
		}
		_, err = WaitForEvent(context.Background(), schema.Stream{}, itx.Predicate{}, 0, d)
		if got := itx.ErrorCode(err); got != itx.EInvalid {
			t.Errorf("waitForEvent timeout %s: got %v (%q), want %s", d, got, err, itx.EInvalid)
		}
	}
}
