package test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// An unchanged subscription configure sent with an idempotency key is written (inert: nothing
// about the subscription changes), so its key is kept: a later event, in the same call or
// another, cannot take the key, and a retry of the configure returns its own offset.
func TestIdempotency_KeyOfAnUnchangedConfigureIsKept(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/idem/configure")
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, birth, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "c",
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/idem/configure-dst"}})
	require.NoError(t, err)
	all, err := client.ReadAll(ctx, s, itx.Query{})
	require.NoError(t, err)
	cfg := all[0].Payload

	_, err = client.Append(ctx, s, []itx.EventInput{
		{Type: itx.TypeSubscriptionConfigured, Payload: cfg, IdempotencyKey: "K"},
		{Type: "x", Payload: json.RawMessage(`{}`), IdempotencyKey: "K"},
	}, itx.AppendOptions{})
	requireCode(t, err, itx.EIdempotencyConflict)

	call := []itx.EventInput{{Type: itx.TypeSubscriptionConfigured, Payload: cfg, IdempotencyKey: "K2"}}
	first, err := client.Append(ctx, s, call, itx.AppendOptions{})
	require.NoError(t, err)
	_, err = client.Append(ctx, s, []itx.EventInput{keyed("x", `{}`, "K2")}, itx.AppendOptions{})
	requireCode(t, err, itx.EIdempotencyConflict)
	again, err := client.Append(ctx, s, call, itx.AppendOptions{})
	require.NoError(t, err)
	require.Equal(t, first.Offsets, again.Offsets)
	require.Equal(t, []bool{true}, again.Duplicate)

	sub := client.Subscription(ctx, s, "c")
	defer sub.Release()
	d, err := client.DescribeSubscription(ctx, sub)
	require.NoError(t, err)
	require.Equal(t, birth, d.ConfiguredAtOffset, "the unchanged configure changed nothing")
}

// An idempotency key compares bodies as JSON values: a number spelled otherwise (1 and 1.0, as
// another serializer writes it on a retry) is the same body; another value is a conflict.
func TestIdempotency_NumbersCompareByValue(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/idem/numbers")
	first := mustAppend(t, s, keyed("n", `{"v":1,"w":[100]}`, "k"))
	res, err := client.Append(ctx, s, []itx.EventInput{keyed("n", `{"w":[1e2],"v":1.0}`, "k")}, itx.AppendOptions{})
	require.NoError(t, err)
	require.Equal(t, first.Offsets, res.Offsets)
	_, err = client.Append(ctx, s, []itx.EventInput{keyed("n", `{"v":1.5,"w":[100]}`, "k")}, itx.AppendOptions{})
	requireCode(t, err, itx.EIdempotencyConflict)
}

// waitForEvent matches an ephemeral event appended while it waits, as a live connection would;
// one buffered before the call matches only with includeEphemeral.
func TestWaitForEvent_EphemeralWhileWaiting(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	s := stream(t, p, "/wait/ephemeral")
	buffered := ev("tick", `{"n":1}`)
	buffered.Ephemeral = true
	mustAppend(t, s, ev("a", `{}`), buffered)

	type answer struct {
		e   itx.Event
		err error
	}
	got := make(chan answer, 1)
	go func() {
		e, err := client.WaitForEvent(ctx, stream(t, p, "/wait/ephemeral"), itx.Predicate{Types: []string{"tick"}}, 0, 15*time.Second)
		got <- answer{e, err}
	}()
	// Nothing shows when the call is in, so live ticks go until it answers: the first one
	// appended after it started must match (before the fix none ever did).
	var a answer
	var appended []int64
	for done := false; !done; {
		live := ev("tick", `{"n":2}`)
		live.Ephemeral = true
		appended = append(appended, mustAppend(t, s, live).HeadOffset)
		select {
		case a = <-got:
			done = true
		case <-time.After(50 * time.Millisecond):
		}
	}
	require.NoError(t, a.err)
	require.Contains(t, appended, a.e.Offset, "a live one, not the buffered one (offset 2)")

	e, err := client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"tick"}, IncludeEphemeral: true}, 0, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, int64(2), e.Offset, "includeEphemeral: the buffered one")
}

// The subscription verbs' refusals name no event: the caller sent none (the control event is the
// server's own).
func TestSubscriptionVerbs_ErrorsNameNoEvent(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/verbs/errors")
	h := newHook(t, nil)
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "fine", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	_, err := client.ResumeSubscription(e.ctx, s, name)
	requireCode(t, err, itx.EFailedPrecondition)
	require.False(t, strings.Contains(itx.ErrorMessage(err), "event 0"), "%v", err)
	_, err = client.SetSubscriptionCursor(e.ctx, s, "nope", 0)
	requireCode(t, err, itx.ENotFound)
	require.False(t, strings.Contains(itx.ErrorMessage(err), "event 0"), "%v", err)
}

// One append that uses a key twice with two bodies is refused whole, and the refusal names the
// event of the call that took the key first: it named "offset 2", the offset that event would
// have had, though nothing was written and offset 2 became another event later.
func TestIdempotency_ConflictInsideOneAppendNamesTheEvent(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/idem/inside")
	mustAppend(t, s, ev("first", `{}`))
	_, err := client.Append(ctx, s, []itx.EventInput{ev("x", `{}`), keyed("t", `{"a":1}`, "k"), keyed("t", `{"a":2}`, "k")}, itx.AppendOptions{})
	requireCode(t, err, itx.EIdempotencyConflict)
	require.Contains(t, itx.ErrorMessage(err), `event 2: idempotency key "k" is already used by event 1 of this append with a different body`)
	require.NotContains(t, itx.ErrorMessage(err), "offset")
	require.Equal(t, int64(1), mustDescribe(t, s).HeadOffset, "nothing written")

	// A key a committed event holds is named by its offset, as before.
	held := mustAppend(t, s, keyed("t", `{"a":1}`, "held")).Offsets[0]
	_, err = client.Append(ctx, s, []itx.EventInput{keyed("t", `{"a":2}`, "held")}, itx.AppendOptions{})
	requireCode(t, err, itx.EIdempotencyConflict)
	require.Contains(t, itx.ErrorMessage(err), fmt.Sprintf("already used by offset %d", held))
}

// A retry that sends empty metadata where the first try sent none (or the other way round) is
// the same event, as an omitted payload and {} are: it was an idempotencyConflict, so a client
// that normalizes what it sends failed its own retry.
func TestIdempotency_EmptyMetadataIsNoMetadata(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/idem/metadata")
	for i, c := range []struct{ first, retry string }{{"", `{}`}, {`{}`, ""}, {`{ }`, "null"}} {
		key := fmt.Sprintf("m%d", i)
		in := func(meta string) []itx.EventInput {
			e := itx.EventInput{Type: "x", Payload: json.RawMessage(`{"n":1}`), IdempotencyKey: key}
			if meta != "" {
				e.Metadata = json.RawMessage(meta)
			}
			return []itx.EventInput{e}
		}
		first, err := client.Append(ctx, s, in(c.first), itx.AppendOptions{})
		require.NoError(t, err)
		again, err := client.Append(ctx, s, in(c.retry), itx.AppendOptions{})
		require.NoError(t, err, "case %d", i)
		require.Equal(t, first.Offsets, again.Offsets)
		require.Equal(t, []bool{true}, again.Duplicate)
		_, err = client.Append(ctx, s, in(`{"a":1}`), itx.AppendOptions{})
		requireCode(t, err, itx.EIdempotencyConflict)
	}
	all, err := client.ReadAll(ctx, s, itx.Query{})
	require.NoError(t, err)
	require.Len(t, all, 3, "one event per key")
}
