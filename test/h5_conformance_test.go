package test

// Conformance checks of seeds 000 and 002 (subscriptions, processors) over a real itxd.

import (
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Configure is idempotent (DESIGN: "the same name with the same config returns the original birth
// event and leaves the cursor alone"), and a processor-wake receiver's defaults are part of the
// same config: its placement left out, "in-process" and the seed's "facet" all run it next to the
// stream, and its contract left out is the subscription's name. Spelling a default out (a service
// ensuring its subscription with the seed's words, another with none) must not append a
// configured event that starts a new epoch over the processor and clears its halt.
func TestConfigure_ProcessorWakeDefaultsSpelledOutAreTheSameConfig(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "guestbook")})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/h5/configure-defaults")
	mustAppend(t, s, ev("guestbook/signed", `{"name":"ada","message":"hi"}`))
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	configure := func(r client.Receiver) int64 {
		t.Helper()
		name, offset, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "guestbook", Receiver: r})
		require.NoError(t, err)
		require.Equal(t, "guestbook", name)
		return offset
	}
	birth := configure(client.Receiver{Kind: client.ReceiverProcessorWake})
	for _, r := range []client.Receiver{
		{Kind: client.ReceiverProcessorWake, Placement: "in-process"},
		{Kind: client.ReceiverProcessorWake, Placement: "facet"},
		{Kind: client.ReceiverProcessorWake, Processor: "guestbook"},
		{Kind: client.ReceiverProcessorWake, Placement: "facet", Processor: "guestbook"},
	} {
		require.Equal(t, birth, configure(r), "%+v says what the first configure said", r)
	}
	events, err := client.ReadAll(ctx, s, itx.Query{Types: []string{itx.TypeSubscriptionConfigured}})
	require.NoError(t, err)
	require.Len(t, events, 1, "one configured event: the others configured nothing new")
	sub := client.Subscription(ctx, s, "guestbook")
	defer sub.Release()
	d, err := client.DescribeSubscription(ctx, sub)
	require.NoError(t, err)
	require.Equal(t, birth, d.ConfiguredAtOffset, "the birth epoch stands")

	// And the other way round: a processor configured with the defaults spelled out.
	s2 := stream(t, ts.project(t), "/h5/configure-defaults-spelled")
	mustAppend(t, s2, ev("guestbook/signed", `{"name":"bob","message":"hi"}`))
	subs2 := client.Subscriptions(ctx, s2)
	defer subs2.Release()
	_, first, err := client.ConfigureSubscription(ctx, subs2, client.SubscriptionConfig{Name: "guestbook",
		Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Placement: "facet", Processor: "guestbook"}})
	require.NoError(t, err)
	_, again, err := client.ConfigureSubscription(ctx, subs2, client.SubscriptionConfig{Name: "guestbook",
		Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}})
	require.NoError(t, err)
	require.Equal(t, first, again)

	// A real change still is one: remote placement is another config.
	_, moved, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "guestbook",
		Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Placement: "remote"}})
	require.NoError(t, err)
	require.Greater(t, moved, birth)
}

// A filter's event types are a set (seed 000: the filter says which events the receiver gets; the
// cursor is a watermark over the rest): the same types in another order or repeated, and a list
// holding "*" (every type) beside no filter, are the same config, so configuring them again
// appends nothing; another set is a change.
func TestConfigure_FilterTypesAreASet(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/h5/filter-set")
	mustAppend(t, s, ev("a", `{}`))
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	hook := newHook(t, nil)
	configure := func(name string, types ...string) int64 {
		t.Helper()
		_, offset, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: name, FilterTypes: types,
			Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: hook.url()}})
		require.NoError(t, err)
		return offset
	}
	ab := configure("typed", "a", "b")
	require.Equal(t, ab, configure("typed", "b", "a"), "another order")
	require.Equal(t, ab, configure("typed", "b", "a", "a"), "a repeat")
	all := configure("all")
	require.Equal(t, all, configure("all", "*"), `"*" is every type, as no filter`)
	require.Equal(t, all, configure("all", "a", "*"), `a list holding "*" is every type`)
	require.Greater(t, configure("typed", "a"), ab, "another set is a change")
}
