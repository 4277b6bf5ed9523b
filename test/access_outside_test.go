package test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A session whose token is limited to a prefix learns of no stream outside it, though a wider
// token wired its streams to streams outside: copies out (a subscription's config, its lastError
// naming the target, its live-state row), copies in (provenance, the copy's idempotency key, the
// record of a dropped copy), the configured events in the log, and listProjects' stream count.
func TestAccess_PrefixedSessionLearnsNothingOutside(t *testing.T) {
	ts := startServer(t, server.Config{MaxStreamsPerProject: 2})
	ctx := ctxT(t)
	full := ts.project(t)
	in, out := stream(t, full, "/in/a"), stream(t, full, "/out/src")
	mustAppend(t, in, ev("note", `{}`))
	mustAppend(t, out, ev("note", `{}`))
	configure := func(s any, name, target string) {
		t.Helper()
		st := in
		if s == "out" {
			st = out
		}
		subs := client.Subscriptions(ctx, st)
		defer subs.Release()
		_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: name, Start: "now",
			Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: target}})
		require.NoError(t, err)
	}
	configure("out", "feed", "/in/a")   // copies in
	configure("in", "back", "/out/src") // its copies of feed's copies come back: dropped, recorded in /in/a
	configure("in", "export", "/out/new")
	head := mustAppend(t, out, ev("secret/thing", `{"n": 1}`)).Offsets[0]
	waitProcessed := func(s any, name string, offset int64) {
		t.Helper()
		st := in
		if s == "out" {
			st = out
		}
		sub := client.Subscription(ctx, st, name)
		defer sub.Release()
		_, err := client.WaitUntilProcessed(ctx, sub, offset, 15*time.Second)
		require.NoError(t, err)
	}
	waitProcessed("out", "feed", head)
	// /out/src's copy of its own event travels back, and is dropped there; /in/a's event copied
	// out and back is dropped in /in/a with a record naming /out/src.
	inHead := mustAppend(t, in, ev("mine", `{}`)).Offsets[0]
	waitProcessed("in", "back", inHead)
	outDesc, err := client.Describe(ctx, out)
	require.NoError(t, err)
	waitProcessed("out", "feed", outDesc.HeadOffset)
	exportDesc := func() itx.SubscriptionDescription {
		sub := client.Subscription(ctx, in, "export")
		defer sub.Release()
		d, err := client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		return d
	}
	waitUntil(t, "the export failed (the project is full)", func() bool { return exportDesc().LastError != "" })
	all, err := client.GetEvents(ctx, in, itx.Query{})
	require.NoError(t, err)
	require.Contains(t, dump(t, all), "/out/", "the whole-project token reads the log as stored")
	require.Contains(t, dump(t, all), "dropped", "a dropped copy was recorded")

	tok, _ := ts.token(t, itx.Scope{Prefix: "/in"})
	scoped := ts.login(t, tok)
	s := stream(t, scoped, "/in/a")
	seen := map[string]any{}

	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	seen["subscriptions.list"], err = client.ListSubscriptions(ctx, subs)
	require.NoError(t, err)
	for _, name := range []string{"export", "back"} {
		sub := client.Subscription(ctx, s, name)
		d, err := client.DescribeSubscription(ctx, sub)
		sub.Release()
		require.NoError(t, err)
		require.Equal(t, itx.KindCopyToStream, d.Kind)
		seen["describe "+name] = d
	}
	require.NotEmpty(t, seen["describe export"].(itx.SubscriptionDescription).LastError)
	events, err := client.GetEvents(ctx, s, itx.Query{})
	require.NoError(t, err)
	require.Len(t, events, len(all))
	seen["getEvents"] = events
	page, err := client.GetEventPage(ctx, s, itx.Query{})
	require.NoError(t, err)
	seen["getEventPage"] = page
	copied, err := client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"secret/thing"}}, 0, 5*time.Second)
	require.NoError(t, err)
	require.NotEmpty(t, copied.Provenance)
	seen["waitForEvent"] = copied
	// Nor can a predicate find what the reads hide: matching sees the events as read.
	for _, probe := range []itx.Predicate{
		{Types: []string{itx.TypeSubscriptionConfigured}, PayloadContains: json.RawMessage(`{"receiver": {"receivingStreamPath": "/out/new"}}`)},
		{Where: `$contains(idempotencyKey, "/out/src")`},
	} {
		_, err := client.WaitForEvent(ctx, s, probe, 0, 300*time.Millisecond)
		assert.Equal(t, itx.EDeadlineExceeded, itx.ErrorCode(err), "probe %s%s: %v", probe.PayloadContains, probe.Where, err)
		_, err = client.WaitForEvent(ctx, in, probe, 0, 5*time.Second)
		require.NoError(t, err, "the whole-project token's probe %s%s matches", probe.PayloadContains, probe.Where)
	}

	sink := newTestSink()
	_, err = openConn(t, s, connOpts{}, sink)
	require.NoError(t, err)
	waitUntil(t, "the connection caught up", func() bool { return len(sink.offsets()) == len(all) })
	sink.mu.Lock()
	seen["connection"] = append([]itx.Event(nil), sink.events...)
	sink.mu.Unlock()

	live := &liveView{}
	subscribeLive(t, s, live)
	waitUntil(t, "live snapshot", func() bool { rev, _ := live.state(); return rev > 0 })
	_, seen["liveState"] = live.state()

	admin := client.Admin(ctx, scoped)
	defer admin.Release()
	projects, err := client.ListProjects(ctx, admin)
	require.NoError(t, err)
	require.Len(t, projects, 1)
	assert.Equal(t, 1, projects[0].StreamCount, "the scoped token counts the streams it can list")

	for what, v := range seen {
		assert.NotContains(t, dump(t, v), "/out", "%s names a stream outside /in", what)
	}

	// A subscription the scoped token configures reads the stream as the token does: its webhook
	// is sent no path outside the prefix, and its filter cannot find one.
	peek, probe := newHook(t, nil), newHook(t, nil)
	for _, c := range []client.SubscriptionConfig{
		{Name: "peek", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: peek.url()}},
		{Name: "probe", FilterCondition: `$contains(idempotencyKey, "/ou" & "t/src")`, // spelt apart: its own configured event is delivered too
			Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: probe.url()}},
	} {
		_, _, err := client.ConfigureSubscription(ctx, subs, c)
		require.NoError(t, err)
	}
	// A raw configured event cannot claim a wider scope.
	rawPeek := newHook(t, nil)
	raw, err := json.Marshal(map[string]any{"name": "raw-peek", "scope": "/",
		"receiver": map[string]any{"action": "webhook-post", "url": rawPeek.url()}})
	require.NoError(t, err)
	mustAppend(t, s, itx.EventInput{Type: itx.TypeSubscriptionConfigured, Payload: raw})
	head2, err := client.Describe(ctx, s)
	require.NoError(t, err)
	for _, name := range []string{"peek", "probe", "raw-peek"} {
		sub := client.Subscription(ctx, s, name)
		_, err := client.WaitUntilProcessed(ctx, sub, head2.HeadOffset, 15*time.Second)
		sub.Release()
		require.NoError(t, err, name)
	}
	for _, h := range []*hook{peek, rawPeek} {
		h.mu.Lock()
		require.NotEmpty(t, h.raw)
		for _, raw := range h.raw {
			assert.NotContains(t, strings.ReplaceAll(string(raw), `\"`, `"`), "/out", "a webhook of the scoped token's subscription")
		}
		h.mu.Unlock()
	}
	assert.Zero(t, probe.count(), "the scoped token's filter found a path outside its prefix")
}

func dump(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return strings.ReplaceAll(string(b), `\"`, `"`)
}

// A raw configured event from a session limited to a prefix cannot aim a copy or a dead letter
// outside it by spelling a field twice (JSON keys match case-insensitively, the last one
// winning): the target checked is the one the stored config holds. The server rewrites such an
// event (its scope) before it is stored, and the rewrite reorders keys.
func TestAccess_ScopedRawConfigureCannotSmuggleATarget(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	full := ts.project(t)
	mustAppend(t, stream(t, full, "/in/a"), ev("note", `{}`))
	tok, _ := ts.token(t, itx.Scope{Prefix: "/in"})
	s := stream(t, ts.login(t, tok), "/in/a")
	h := newHook(t, nil)
	for _, c := range []struct{ name, payload string }{
		{"smuggle", `{"name": "smuggle", "receiver": {"action": "copy-to-stream",
			"receivingstreampath": "/out/y", "receivingStreamPath": "/in/x"}}`},
		{"smuggle-dead", `{"name": "smuggle-dead", "receiver": {"action": "webhook-post", "url": "` + h.url() + `",
			"delivery": {"start": "now", "onFailingEvent": "skip", "deadletterpath": "/out/dead", "deadLetterPath": "/in/dead"}}}`},
	} {
		_, err := client.Append(ctx, s, []itx.EventInput{{Type: itx.TypeSubscriptionConfigured, Payload: json.RawMessage(c.payload)}}, itx.AppendOptions{})
		if err != nil {
			assert.Equal(t, itx.EPermissionDenied, itx.ErrorCode(err), "%s: %v", c.name, err)
			continue
		}
		// Accepted: what it stored must be inside the prefix.
		sub := client.Subscription(ctx, stream(t, full, "/in/a"), c.name)
		d, err := client.DescribeSubscription(ctx, sub)
		sub.Release()
		require.NoError(t, err)
		r := d.Config.Receiver
		assert.True(t, itx.PathUnder(r.ReceivingStreamPath, "/in") || r.ReceivingStreamPath == "", "%s copies into %s", c.name, r.ReceivingStreamPath)
		assert.True(t, itx.PathUnder(r.EffectiveDelivery().DeadLetterPath, "/in") || r.EffectiveDelivery().DeadLetterPath == "",
			"%s dead-letters into %s", c.name, r.EffectiveDelivery().DeadLetterPath)
	}
}

// A configured event a wider token wrote with its fields in another case (they match
// case-insensitively) is read under a prefix as the usual spelling is: its targets outside the
// prefix are hidden.
func TestAccess_ScopedReadHidesCaseVariantTargets(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	full := ts.project(t)
	in := stream(t, full, "/in/a")
	h := newHook(t, nil)
	mustAppend(t, in, itx.EventInput{Type: itx.TypeSubscriptionConfigured, Payload: json.RawMessage(
		`{"name": "cp", "Receiver": {"action": "copy-to-stream", "ReceivingStreamPath": "/out/x"}}`)})
	mustAppend(t, in, itx.EventInput{Type: itx.TypeSubscriptionConfigured, Payload: json.RawMessage(
		`{"name": "dl", "receiver": {"action": "webhook-post", "url": "` + h.url() + `", "Delivery": {"start": "now", "onFailingEvent": "skip", "DeadLetterPath": "/out/dead"}}}`)})
	tok, _ := ts.token(t, itx.Scope{Prefix: "/in"})
	events, err := client.GetEvents(ctx, stream(t, ts.login(t, tok), "/in/a"), itx.Query{})
	require.NoError(t, err)
	assert.NotContains(t, dump(t, events), "/out", "the scoped session's read")
}
