package test

import (
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A webhook's credentials (a header value, the URL's userinfo and query values) are the stream
// administrator's: a token without the admin right reads them redacted in describe, the
// configured event (getEvents, waitForEvent, a connection) and a failing delivery's lastError,
// and a subscription a subscribe token configures receives the configured event redacted, so it
// cannot forward them to itself. The webhook itself is still called with them, and the admin
// right reads them as given. Before, a read-only token read "Authorization: Bearer ..." in
// describe() and in the log.
func TestAccess_WebhookCredentialsRedacted(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	h := newHook(t, nil)
	secrets := []string{"h-secret", "u-secret", "q-secret", "dead-secret"}
	hookURL := strings.Replace(h.url(), "http://", "http://alice:u-secret@", 1) + "?token=q-secret&v=1"
	admin := stream(t, ts.project(t), "/billing")
	subs := client.Subscriptions(ctx, admin)
	defer subs.Release()
	_, cfgOff, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "bill", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: hookURL,
			Headers: []client.Header{{Name: "Authorization", Value: "Bearer h-secret"}}}})
	require.NoError(t, err)
	// Nothing listens at port 1: the delivery fails, and its error quotes the URL.
	_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "dead", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: "http://127.0.0.1:1/x?key=dead-secret"}})
	require.NoError(t, err)
	off := mustAppend(t, admin, ev("invoice", `{}`)).Offsets[0]
	waitUntil(t, "the webhook called", func() bool { return h.count() > 0 })
	h.mu.Lock()
	require.Equal(t, "Bearer h-secret", h.headers[0].Get("Authorization"), "the webhook is called with the header as given")
	h.mu.Unlock()

	requireHidden := func(t *testing.T, what, text string) {
		t.Helper()
		for _, s := range secrets {
			require.NotContains(t, text, s, what)
		}
	}
	tok, _ := ts.token(t, itx.Scope{Rights: []itx.Right{itx.RightRead}})
	reader := stream(t, ts.login(t, tok), "/billing")
	readerSubs := client.Subscriptions(ctx, reader)
	defer readerSubs.Release()

	t.Run("describe", func(t *testing.T) {
		sub := client.Subscription(ctx, reader, "bill")
		defer sub.Release()
		d, err := client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		require.Equal(t, map[string]string{"Authorization": itx.Redacted}, d.Config.Receiver.Headers)
		require.Equal(t, strings.Replace(h.url(), "http://", "http://redacted@", 1)+"?token=redacted&v=redacted", d.Config.Receiver.URL)

		full := client.Subscription(ctx, admin, "bill")
		defer full.Release()
		d, err = client.DescribeSubscription(ctx, full)
		require.NoError(t, err)
		require.Equal(t, "Bearer h-secret", d.Config.Receiver.Headers["Authorization"], "the admin right reads it as given")
		require.Equal(t, hookURL, d.Config.Receiver.URL)
	})

	t.Run("the configured events", func(t *testing.T) {
		events, err := client.GetEvents(ctx, reader, itx.Query{})
		require.NoError(t, err)
		var configured int
		for _, e := range events {
			requireHidden(t, "getEvents", string(e.Payload))
			if e.Type == itx.TypeSubscriptionConfigured {
				configured++
				if strings.Contains(string(e.Payload), `"bill"`) {
					require.Contains(t, string(e.Payload), `"Authorization":"(redacted)"`, "the header's name stays")
				}
			}
		}
		require.Equal(t, 2, configured)
		e, err := client.WaitForEvent(ctx, reader, itx.Predicate{Types: []string{itx.TypeSubscriptionConfigured}}, cfgOff-1, 0)
		require.NoError(t, err)
		requireHidden(t, "waitForEvent", string(e.Payload))

		sink := newTestSink()
		_, err = openConn(t, reader, connOpts{noState: true}, sink)
		require.NoError(t, err)
		waitUntil(t, "the connection caught up", func() bool { o := sink.offsets(); return len(o) > 0 && o[len(o)-1] >= off })
		sink.mu.Lock()
		for _, e := range sink.events {
			requireHidden(t, "a connection", string(e.Payload))
		}
		sink.mu.Unlock()

		full, err := client.GetEvents(ctx, admin, itx.Query{After: cfgOff - 1, Limit: 1})
		require.NoError(t, err)
		require.Contains(t, string(full[0].Payload), "Bearer h-secret", "the admin right reads the event as stored")
	})

	t.Run("lastError", func(t *testing.T) {
		var last string
		waitUntil(t, "the dead webhook failed", func() bool {
			list, err := client.ListSubscriptions(ctx, readerSubs)
			require.NoError(t, err)
			for _, s := range list {
				if s.Name == "dead" {
					last = s.LastError
				}
			}
			return last != ""
		})
		require.Contains(t, last, "127.0.0.1:1/x?key=redacted")
		requireHidden(t, "lastError", last)
	})

	t.Run("a subscribe token's webhook", func(t *testing.T) {
		subTok, _ := ts.token(t, itx.Scope{Rights: []itx.Right{itx.RightSubscribe}})
		tenantSubs := client.Subscriptions(ctx, stream(t, ts.login(t, subTok), "/billing"))
		defer tenantSubs.Release()
		spy := newHook(t, nil)
		_, _, err := client.ConfigureSubscription(ctx, tenantSubs, client.SubscriptionConfig{Name: "spy",
			Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: spy.url()}})
		require.NoError(t, err)
		waitUntil(t, "the spy caught up", func() bool { return spy.count() >= int(off) })
		spy.mu.Lock()
		defer spy.mu.Unlock()
		for _, raw := range spy.raw {
			requireHidden(t, "a subscription's delivery", string(raw))
		}
	})
}

// A page read as a subscription (Query.Subscription) keeps the events its condition holds for,
// and the condition sees them as the subscription's deliveries do: with a webhook's credentials
// redacted. Before, it ran on the events as stored, so a token with read and subscribe (not
// admin) configured a subscription whose condition tests another webhook's Authorization header
// and paged by it: one configured event kept or not per guess, the header read a character at a
// time.
func TestAccess_PageByConditionSeesCredentialsRedacted(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	h := newHook(t, nil)
	admin := stream(t, ts.project(t), "/billing")
	subs := client.Subscriptions(ctx, admin)
	defer subs.Release()
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "bill", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url(),
			Headers: []client.Header{{Name: "Authorization", Value: "Bearer h-secret"}}}})
	require.NoError(t, err)

	tok, _ := ts.token(t, itx.Scope{Rights: []itx.Right{itx.RightRead, itx.RightSubscribe}})
	tenant := stream(t, ts.login(t, tok), "/billing")
	tenantSubs := client.Subscriptions(ctx, tenant)
	defer tenantSubs.Release()
	for name, guess := range map[string]string{"guess-right": "Bearer h-", "redacted": "(redacted)"} {
		_, _, err = client.ConfigureSubscription(ctx, tenantSubs, client.SubscriptionConfig{Name: name, Start: "now",
			FilterCondition: `$contains($string(payload.receiver.headers.Authorization), "` + guess + `")`,
			Receiver:        client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
		require.NoError(t, err)
	}
	page, err := client.GetEventPage(ctx, tenant, itx.Query{Subscription: "guess-right"})
	require.NoError(t, err)
	require.Empty(t, page.Events, "the condition held on the stored header")
	page, err = client.GetEventPage(ctx, tenant, itx.Query{Subscription: "redacted"})
	require.NoError(t, err)
	require.Len(t, page.Events, 1, "the condition sees the header redacted")
	require.NotContains(t, string(page.Events[0].Payload), "h-secret")
}
