package test

// Conformance checks of seeds 000 and 002 (subscriptions, processors) over a real itxd.

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
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

// Seed 000: "delivery resumes after confirmed_offset", and a cursor-set is the operator's verb
// on every kind (on a processor, the rewind reprocessFrom); a changed config keeps the cursor.
// A processor whose runner has not taken a cursor-set yet (halted, or placed where no host runs
// it) keeps it across a reconfigure: the events the operator stepped over are not processed.
// Before, the reconfigure took the seek's epoch for a new one, the runner resumed from its own
// progress, and every event the operator had skipped was processed after all.
func TestProcessors_SeekSurvivesAReconfigure(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "forwarder")})
	ctx := ctxT(t)
	inbox := func(n int) itx.EventInput { return ev("inbox/message", fmt.Sprintf(`{"n":%d}`, n)) }
	forwarded := func(t *testing.T, s schema.Stream) []int64 {
		t.Helper()
		events, err := client.ReadAll(ctx, s, itx.Query{Types: []string{"outbox/forwarded"}})
		require.NoError(t, err)
		var from []int64
		for _, e := range events {
			var f struct {
				SourceOffset int64 `json:"sourceOffset"`
			}
			require.NoError(t, json.Unmarshal(e.Payload, &f))
			from = append(from, f.SourceOffset)
		}
		return from
	}
	for _, tc := range []struct {
		name  string
		first client.Receiver // a config under which nothing runs the processor
	}{
		{"halted on an unknown contract", client.Receiver{Kind: client.ReceiverProcessorWake, Processor: "no-such-contract"}},
		{"parked without a host", client.Receiver{Kind: client.ReceiverProcessorWake, Placement: "remote"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := stream(t, ts.project(t), "/h5/seek-reconfigure/"+strings.ReplaceAll(tc.name, " ", "-"))
			subs := client.Subscriptions(ctx, s)
			defer subs.Release()
			_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "forwarder", Receiver: tc.first})
			require.NoError(t, err)
			res := mustAppend(t, s, inbox(1), inbox(2), inbox(3)) // offsets 2, 3, 4
			sub := client.Subscription(ctx, s, "forwarder")
			defer sub.Release()
			waitUntil(t, "not running", func() bool {
				d, err := client.DescribeSubscription(ctx, sub)
				require.NoError(t, err)
				return d.Status == itx.StatusHalted || d.Status == itx.StatusParked
			})
			// Step over the first two messages, then fix the config.
			_, err = client.SetSubscriptionCursor(ctx, s, "forwarder", res.Offsets[1])
			require.NoError(t, err)
			_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "forwarder",
				Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}})
			require.NoError(t, err)
			info, err := client.Describe(ctx, s)
			require.NoError(t, err)
			_, err = client.WaitUntilProcessed(ctx, sub, info.HeadOffset, 0)
			require.NoError(t, err)
			require.Equal(t, []int64{res.Offsets[2]}, forwarded(t, s), "only the message after the cursor set is forwarded")
			d, err := client.DescribeSubscription(ctx, sub)
			require.NoError(t, err)
			require.Equal(t, itx.StatusActive, d.Status)
			require.GreaterOrEqual(t, d.ConfirmedOffset, info.HeadOffset)

			// A rewind afterwards still works as before: back to the start, everything again
			// (the forwards are keyed: the one already made dedupes).
			_, err = client.SetSubscriptionCursor(ctx, s, "forwarder", 0)
			require.NoError(t, err)
			info, err = client.Describe(ctx, s)
			require.NoError(t, err)
			_, err = client.WaitUntilProcessed(ctx, sub, info.HeadOffset, 0)
			require.NoError(t, err)
			require.Equal(t, []int64{res.Offsets[2], res.Offsets[0], res.Offsets[1]}, forwarded(t, s))
		})
	}
}
