package test

// Statements of seed 000 that the seed-000 checklists (docs/seed-000-*-checklist.md) map to no
// test asserting them directly: the consumer-side barrier waits for an offset the stream has
// not reached yet and resolves once it is appended and confirmed; an offset at or before a
// subscription's birth cursor resolves at once; a subscription born by an event inside an
// append batch owes exactly the events after that event, not the batch's earlier ones; and
// the verbs on a stream with no event yet refuse by name without creating it.

import (
	"fmt"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Seed 000: "one unified waitUntilProcessed(name, {offset}) is the CONSUMER-side barrier";
// "delivery resumes after confirmed_offset". A barrier for an offset past the head is not
// refused and not answered early: it holds until the events up to it are appended and the
// receiver confirmed them, and answers with the confirmed cursor. One for an offset the
// cursor already passed (0 included, and every offset up to the birth of a start "now"
// subscription, which owes nothing before its birth) answers at once.
func TestSeed000_BarrierPastTheHeadWaitsForTheEvents(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	const path = "/seed000/barrier-ahead"
	s := stream(t, e.p, path)
	h := newHook(t, nil)
	mustAppend(t, s, ev("before", `{}`), ev("before", `{}`)) // 1, 2
	name, birth := e.configure(t, s, client.SubscriptionConfig{Name: "ahead", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}}) // 3
	require.Equal(t, int64(3), birth)

	for _, at := range []int64{0, 1, birth} {
		require.Equal(t, birth, e.waitProcessed(t, s, name, at), "offset %d is behind the birth cursor", at)
	}
	require.Empty(t, h.received(), "start now: nothing before the birth is owed")

	target := birth + 2
	errc := e.barrier(t, path, name, target)
	first := mustAppend(t, s, ev("a", `{}`)).HeadOffset
	require.Equal(t, birth+1, first)
	e.waitProcessed(t, s, name, first)
	select {
	case err := <-errc:
		t.Fatalf("the barrier for %d answered (%v) with the head at %d", target, err, first)
	default:
	}
	second := mustAppend(t, s, ev("b", `{}`)).HeadOffset
	require.Equal(t, target, second)
	require.NoError(t, answer(t, errc))
	require.Equal(t, []int64{first, second}, h.received())
	require.Equal(t, second, e.describe(t, s, name).ConfirmedOffset)
}

// Seed 000: a subscription is "born ... by appended events"; its birth epoch is the offset of
// its configured event. Born with start "now" by an event in the middle of one append, it owes
// the events after that event and none before it, though they were committed together; a
// subscription removed and configured again inside one append is a new occupant, born at its
// second configured event and starting from its own start position.
func TestSeed000_BirthInsideAnAppendBatch(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := newHook(t, nil)
	configured := func(name, start string) itx.EventInput {
		return ev(itx.TypeSubscriptionConfigured, fmt.Sprintf(
			`{"name":%q,"receiver":{"action":"webhook-post","url":%q,"delivery":{"start":%q,"onFailingEvent":"halt"}}}`,
			name, h.url(), start))
	}
	t.Run("start now", func(t *testing.T) {
		s := stream(t, e.p, "/seed000/born-in-a-batch")
		mustAppend(t, s, ev("old", `{}`))                                                  // 1
		r := mustAppend(t, s, ev("x", `{}`), configured("mid", "now"), ev("y", `{"n":1}`)) // 2, 3, 4
		require.Equal(t, []int64{2, 3, 4}, r.Offsets)
		require.Equal(t, int64(4), e.waitProcessed(t, s, "mid", 4))
		d := e.describe(t, s, "mid")
		require.Equal(t, int64(3), d.ConfiguredAtOffset, "born at its configured event, not at the batch's first")
		require.Equal(t, int64(3), d.CursorChangedAtOffset)
		require.Equal(t, []int64{4}, h.received(), "only the event after the birth is owed")
	})
	t.Run("removed and configured again", func(t *testing.T) {
		before := h.count()
		s := stream(t, e.p, "/seed000/reborn-in-a-batch")
		r := mustAppend(t, s, configured("again", "now"), ev("a", `{}`),
			ev(itx.TypeSubscriptionRemoved, `{"name":"again","reason":"requested"}`),
			ev("b", `{}`), configured("again", "now"), ev("c", `{}`)) // 1 .. 6
		require.Equal(t, int64(6), r.HeadOffset)
		require.Equal(t, int64(6), e.waitProcessed(t, s, "again", 6))
		d := e.describe(t, s, "again")
		require.Equal(t, int64(5), d.ConfiguredAtOffset, "the second occupant's birth")
		require.Equal(t, itx.StatusActive, d.Status)
		require.Equal(t, []int64{6}, h.received()[before:], "the first occupant was removed before anything reached it; the second owes only what follows its birth")
		list := e.list(t, s)
		require.Len(t, list, 1)
		require.Equal(t, int64(5), list[0].ConfiguredAtOffset)
	})
}

// Seed 000: "A stream has subscriptions, connections, and readers. Nothing else." A stream no
// event created yet has none: listing its subscriptions is empty, and every verb naming one
// (describe, waitUntilProcessed, setSubscriptionCursor, resumeSubscription, remove) is
// refused notFound; none of them writes an event, so the stream still does not exist after.
func TestSeed000_VerbsOnAStreamWithNoEventYet(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/seed000/unborn")
	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	list, err := client.ListSubscriptions(e.ctx, subs)
	require.NoError(t, err)
	require.Empty(t, list)
	sub := client.Subscription(e.ctx, s, "nobody")
	defer sub.Release()
	_, err = client.DescribeSubscription(e.ctx, sub)
	requireCode(t, err, itx.ENotFound)
	_, err = client.WaitUntilProcessed(e.ctx, sub, 0, time.Second)
	requireCode(t, err, itx.ENotFound)
	_, err = client.SetSubscriptionCursor(e.ctx, s, "nobody", 0)
	requireCode(t, err, itx.ENotFound)
	_, err = client.ResumeSubscription(e.ctx, s, "nobody")
	requireCode(t, err, itx.ENotFound)
	_, err = client.RemoveSubscription(e.ctx, subs, "nobody")
	requireCode(t, err, itx.ENotFound)

	info, err := client.Describe(e.ctx, s)
	require.NoError(t, err)
	require.Zero(t, info.HeadOffset)
	require.Empty(t, info.StreamID, "no verb created the stream")
	streams, err := client.ListStreams(e.ctx, e.p, "/seed000/")
	require.NoError(t, err)
	for _, st := range streams {
		require.NotEqual(t, "/seed000/unborn", st.Path)
	}
}

// Seed 000: names are "1-500 chars, trimmed". A blank name (empty, or whitespace that trims to
// nothing) is no name: every verb that addresses a subscription by name refuses it as bad input
// (invalidArgument), the barrier as describe, setSubscriptionCursor, resumeSubscription and
// remove do, rather than answering that such a subscription is gone; nothing is written.
func TestSeed000_BlankNameIsBadInputOnEveryVerb(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/seed000/blank")
	h := newHook(t, nil)
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "w",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	head := mustAppend(t, s, ev("a", `{}`)).HeadOffset
	e.waitProcessed(t, s, name, head)
	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	for _, blank := range []string{"", " \t "} {
		sub := client.Subscription(e.ctx, s, blank)
		_, err := client.WaitUntilProcessed(e.ctx, sub, 0, time.Second)
		requireCode(t, err, itx.EInvalid)
		require.Contains(t, itx.ErrorMessage(err), "must not be empty")
		_, err = client.DescribeSubscription(e.ctx, sub)
		requireCode(t, err, itx.EInvalid)
		sub.Release()
		_, err = client.SetSubscriptionCursor(e.ctx, s, blank, 0)
		requireCode(t, err, itx.EInvalid)
		_, err = client.ResumeSubscription(e.ctx, s, blank)
		requireCode(t, err, itx.EInvalid)
		_, err = client.RemoveSubscription(e.ctx, subs, blank)
		requireCode(t, err, itx.EInvalid)
		requireNothingWritten(t, s, head)
	}
}
