package test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/wire"
	"github.com/stretchr/testify/require"
)

// requireNothingWritten checks that the stream's head has not moved past head.
func requireNothingWritten(t *testing.T, s schema.Stream, head int64) {
	t.Helper()
	info, err := client.Describe(ctxT(t), s)
	require.NoError(t, err)
	require.Equal(t, head, info.HeadOffset, "nothing written")
}

func TestStrictInput_Events(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/strict/events")
	mustAppend(t, s, ev("seed", `{}`))
	for _, tc := range []struct {
		name string
		in   itx.EventInput
	}{
		{"payload with invalid UTF-8", itx.EventInput{Type: "x", Payload: json.RawMessage("{\"a\":\"\xff\"}")}},
		{"payload key with invalid UTF-8", itx.EventInput{Type: "x", Payload: json.RawMessage("{\"\xc3\":1}")}},
		{"metadata with invalid UTF-8", itx.EventInput{Type: "x", Payload: json.RawMessage(`{}`), Metadata: json.RawMessage("{\"m\":\"\xed\xa0\x80\"}")}},
		{"type with invalid UTF-8", itx.EventInput{Type: "x\xff"}},
		{"key with invalid UTF-8", itx.EventInput{Type: "x", IdempotencyKey: "k\xff"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The bad event is second: the whole batch is refused.
			_, err := client.Append(ctxT(t), s, []itx.EventInput{ev("ok", `{}`), tc.in}, itx.AppendOptions{})
			requireCode(t, err, itx.EInvalid)
			require.Contains(t, itx.ErrorMessage(err), "UTF-8")
			requireNothingWritten(t, s, 1)
		})
	}
}

func TestStrictInput_UnsignedFields(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/strict/unsigned")
	ctx := ctxT(t)
	// The Go client refuses a negative expected head before sending (f1142b2); another client
	// can send the wire's uint64 above int64's range, which itxd refuses.
	_, err := client.Append(ctx, s, []itx.EventInput{ev("x", `{}`)}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: -1})
	requireCode(t, err, itx.EInvalid)
	require.Contains(t, itx.ErrorMessage(err), "ExpectedHeadOffset must not be negative (got -1)")
	af, rel := s.Append(ctx, func(p schema.Stream_append_Params) error {
		if err := wire.SetEventInputs(p.NewEvents, []itx.EventInput{ev("x", `{}`)}); err != nil {
			return err
		}
		o, err := p.NewOptions()
		o.SetConditional(true)
		o.SetExpectedHeadOffset(^uint64(0))
		return err
	})
	_, err = af.Struct()
	rel()
	requireCode(t, err, itx.EInvalid)
	require.Contains(t, itx.ErrorMessage(err), "expectedHeadOffset is 18446744073709551615")
	requireNothingWritten(t, s, 0)

	// Negative offsets the Go client refuses before sending (3525784); the wire's uint64 above
	// int64's range is refused by itxd as expectedHeadOffset is above.
	_, err = client.GetEventPage(ctx, s, itx.Query{After: -2})
	requireCode(t, err, itx.EInvalid)
	require.Contains(t, itx.ErrorMessage(err), "Query.After must not be negative (got -2)")

	_, err = client.WaitForEvent(ctx, s, itx.Predicate{}, -1, time.Millisecond)
	requireCode(t, err, itx.EInvalid)
	require.Contains(t, itx.ErrorMessage(err), "after must not be negative (got -1)")
}

func TestStrictInput_Subscriptions(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/strict/subs")
	mustAppend(t, s, ev("seed", `{}`))
	subs := client.Subscriptions(ctxT(t), s)
	defer subs.Release()
	hook := func(mod func(*client.SubscriptionConfig)) client.SubscriptionConfig {
		c := client.SubscriptionConfig{Name: "ok", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: "https://hooks.example.com/x"}}
		mod(&c)
		return c
	}
	over := "(" + strings.Repeat(" ", itx.MaxJSONataLength) + "true)"
	for _, tc := range []struct {
		name string
		cfg  client.SubscriptionConfig
		msg  string
	}{
		{"name with NUL", hook(func(c *client.SubscriptionConfig) { c.Name = "a\x00b" }), "control character"},
		{"name with a newline", hook(func(c *client.SubscriptionConfig) { c.Name = "a\nb" }), "control character"},
		{"name with U+2028", hook(func(c *client.SubscriptionConfig) { c.Name = "a\u2028b" }), "control character"},
		{"name with invalid UTF-8", hook(func(c *client.SubscriptionConfig) { c.Name = "a\xffb" }), "UTF-8"},
		{"name of 501 characters", hook(func(c *client.SubscriptionConfig) { c.Name = strings.Repeat("é", 501) }), "at most 500"},
		{"header value with CR/LF", hook(func(c *client.SubscriptionConfig) {
			c.Receiver.Headers = []client.Header{{Name: "X-Ok", Value: "a\r\nX-Injected: 1"}}
		}), "control character"},
		{"header value with invalid UTF-8", hook(func(c *client.SubscriptionConfig) {
			c.Receiver.Headers = []client.Header{{Name: "X-Ok", Value: "a\xff"}}
		}), "UTF-8"},
		{"header name with a space", hook(func(c *client.SubscriptionConfig) {
			c.Receiver.Headers = []client.Header{{Name: "X Bad", Value: "1"}}
		}), "header name"},
		{"header name with a colon", hook(func(c *client.SubscriptionConfig) {
			c.Receiver.Headers = []client.Header{{Name: "X-Bad:", Value: "1"}}
		}), "header name"},
		{"transform over 16 KiB", hook(func(c *client.SubscriptionConfig) { c.Transform = over }), "at most 16384"},
		{"filter condition over 16 KiB", hook(func(c *client.SubscriptionConfig) { c.FilterCondition = over }), "at most 16384"},
		{"itx-call capability with a newline", client.SubscriptionConfig{Name: "c", Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "a\nb"}}, "control character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := client.ConfigureSubscription(ctxT(t), subs, tc.cfg)
			requireCode(t, err, itx.EInvalid)
			require.Contains(t, itx.ErrorMessage(err), tc.msg)
			requireNothingWritten(t, s, 1)
		})
	}

	t.Run("where over 16 KiB", func(t *testing.T) {
		_, err := client.WaitForEvent(ctxT(t), s, itx.Predicate{Where: over}, 0, time.Millisecond)
		requireCode(t, err, itx.EInvalid)
		require.Contains(t, itx.ErrorMessage(err), "at most 16384")
	})

	// The Go client refuses enum strings the schema has no value for with a typed error.
	for _, cfg := range []client.SubscriptionConfig{
		hook(func(c *client.SubscriptionConfig) { c.Start = "later" }),
		hook(func(c *client.SubscriptionConfig) { c.OnFailingEvent = "retry" }),
		{Name: "k", Receiver: client.Receiver{Kind: "carrier-pigeon"}},
	} {
		_, _, err := client.ConfigureSubscription(ctxT(t), subs, cfg)
		requireCode(t, err, itx.EInvalid)
		require.NotContains(t, err.Error(), "place arguments")
	}
	requireNothingWritten(t, s, 1)
}

func TestStrictInput_MountNames(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	ctx := context.Background()
	cf, releaseCaps := p.Capabilities(ctx, nil)
	defer releaseCaps()
	caps := cf.Capabilities()
	for _, name := range []string{"", "a\x00b", "a\nb", "a\xffb", " padded", strings.Repeat("m", 1<<20)} {
		mf, release := caps.Mount(ctx, func(a schema.Capabilities_mount_Params) error {
			if err := a.SetName(name); err != nil {
				return err
			}
			return a.SetReceiver(client.ServeReceiver(newReceiverServer().receive))
		})
		_, err := mf.Struct()
		release()
		requireCode(t, err, itx.EInvalid)
	}
	mounts, err := client.ListMounts(ctxT(t), caps)
	require.NoError(t, err)
	require.Empty(t, mounts)
}

// A raw stream/subscription-configured event that the append's validation refuses is refused,
// also when itxd rewrites the payload before that validation (a webhook secret kept apart from
// the log, a scoped token's scope written in): the rewrite must not turn invalid UTF-8 into
// U+FFFD or drop what follows the object, and so make the bad payload a good one.
func TestStrictInput_ConfiguredPayloadRewrites(t *testing.T) {
	ts := startServer(t, server.Config{})
	whole := stream(t, ts.project(t), "/in/strict-whole")
	tok, _ := ts.token(t, itx.Scope{Prefix: "/in"})
	scoped := stream(t, ts.login(t, tok), "/in/strict-scoped")
	mustAppend(t, whole, ev("seed", `{}`))
	mustAppend(t, scoped, ev("seed", `{}`))
	const hook = `"receiver":{"action":"webhook-post","url":"http://127.0.0.1:9/h","secret":"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}`
	const call = `"receiver":{"action":"itx-call","capability":"c"}`
	for _, tc := range []struct {
		name    string
		s       schema.Stream
		payload string
	}{
		{"secret kept apart, invalid UTF-8", whole, "{\"name\":\"a\",\"description\":\"\xff\"," + hook + "}"},
		{"secret kept apart, trailing bracket", whole, `{"name":"b",` + hook + `}]`},
		{"scope written in, invalid UTF-8", scoped, "{\"name\":\"c\",\"description\":\"\xff\"," + call + "}"},
		{"scope written in, trailing data", scoped, `{"name":"d",` + call + `} x`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := client.Append(ctxT(t), tc.s, []itx.EventInput{ev(itx.TypeSubscriptionConfigured, tc.payload)}, itx.AppendOptions{})
			requireCode(t, err, itx.EInvalid)
			requireNothingWritten(t, tc.s, 1)
		})
	}
}
