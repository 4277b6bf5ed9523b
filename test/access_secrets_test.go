package test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/storage"
	"github.com/stretchr/testify/require"
)

// A webhook secret is stored before the configure that references it commits; one nothing
// references any more is collected: a configure the stream refused, a subscription removed or
// reconfigured without it, a raw configured event refused. So a client with the subscribe right
// cannot fill the project's bound with secrets nobody uses, and a secret another subscription
// still references keeps signing its deliveries.
func TestAccess_WebhookSecretsCollected(t *testing.T) {
	const bound = 3
	e := newSubEnv(t, server.Config{MaxSecretsPerProject: bound})
	ctx := e.ctx
	h := newHook(t, nil)
	s := stream(t, e.p, "/collected")
	mustAppend(t, s, ev("m", `{}`))
	fut, release := s.Readers(ctx, nil)
	defer release()
	require.NoError(t, client.RegisterReader(ctx, fut.Readers(), "taken", 1))
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	configure := func(sub schema.Subscriptions, name, secret string) error {
		_, _, err := client.ConfigureSubscription(ctx, sub, client.SubscriptionConfig{Name: name, Start: "now",
			Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url(), Secret: secret}})
		return err
	}
	fresh := func() string { secret, _ := newSecret(t); return secret }

	t.Run("refused configures", func(t *testing.T) {
		for range 2 * bound {
			// The name is a registered reader's: the stream refuses the configure after its
			// secret was stored.
			requireCode(t, configure(subs, "taken", fresh()), itx.EFailedPrecondition)
		}
		raw, err := json.Marshal(map[string]any{"name": "raw", "receiver": map[string]any{"action": "webhook-post",
			"url": h.url(), "secret": fresh()}})
		require.NoError(t, err)
		_, err = client.Append(ctx, s, []itx.EventInput{{Type: itx.TypeSubscriptionConfigured, Payload: raw}},
			itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 99})
		requireCode(t, err, itx.EOffsetConflict)
	})

	shared := fresh()
	t.Run("the bound still holds every secret in use", func(t *testing.T) {
		require.NoError(t, configure(subs, "a", shared))
		require.NoError(t, configure(subs, "b", fresh()))
		require.NoError(t, configure(subs, "c", fresh()))
		requireCode(t, configure(subs, "d", fresh()), itx.ELimitExceeded)
	})

	t.Run("removed and reconfigured", func(t *testing.T) {
		_, err := client.RemoveSubscription(ctx, subs, "b")
		require.NoError(t, err)
		require.NoError(t, configure(subs, "d", fresh()), "the removed subscription's secret was collected")
		require.NoError(t, configure(subs, "c", ""), "reconfigured without its secret")
		require.NoError(t, configure(subs, "e", fresh()), "the reconfigured subscription's secret was collected")
		requireCode(t, configure(subs, "f", fresh()), itx.ELimitExceeded)
	})

	t.Run("a secret still referenced is kept", func(t *testing.T) {
		other := stream(t, e.p, "/collected-other")
		otherSubs := client.Subscriptions(ctx, other)
		defer otherSubs.Release()
		require.NoError(t, configure(otherSubs, "a", shared))
		_, err := client.RemoveSubscription(ctx, subs, "a")
		require.NoError(t, err)
		requireCode(t, configure(subs, "f", fresh()), itx.ELimitExceeded)
		off := mustAppend(t, other, ev("m", `{}`)).Offsets[0]
		require.Equal(t, off, e.waitProcessed(t, other, "a", off), "delivered, signed with the kept secret")
	})

	t.Run("a deleted stream's secrets", func(t *testing.T) {
		// /collected holds c (no secret), d and e (theirs); /collected-other holds a (shared).
		_, err := client.DeleteStream(ctx, e.p, "/collected", true)
		require.NoError(t, err)
		again := stream(t, e.p, "/collected")
		mustAppend(t, again, ev("m", `{}`))
		againSubs := client.Subscriptions(ctx, again)
		defer againSubs.Release()
		require.NoError(t, configure(againSubs, "x", fresh()), "the deleted stream's secrets were collected")
		require.NoError(t, configure(againSubs, "y", fresh()))
		requireCode(t, configure(againSubs, "z", fresh()), itx.ELimitExceeded) // the shared secret is still referenced
	})
}

// A secret whose configure was cut short by a kill -9 (stored, the configure never committed) is
// collected when itxd starts again; one a committed configure references survives the kill and
// signs the deliveries after it.
func TestCrash_Kill9KeepsReferencedSecretsAndCollectsTheRest(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir, "--max-secrets-per-project", "2")
	ctx := ctxT(t)
	h := newHook(t, nil)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	s := client.Stream(ctx, p, "/kept")
	subs := client.Subscriptions(ctx, s)
	configure := func(subs schema.Subscriptions, name, secret string) error {
		_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: name, Start: "now",
			Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url(), Secret: secret}})
		return err
	}
	kept, _ := newSecret(t)
	require.NoError(t, configure(subs, "hook", kept))
	subs.Release()
	s.Release()
	p.Release()
	proc.kill9(t)

	// The window a kill -9 can cut: a secret stored in the directory, its configure not
	// committed. Recreated here by storing one as the configure would, with itxd down.
	orphan, _ := newSecret(t)
	storeOrphanSecret(t, dataDir, "default", orphan)

	proc = startItxd(t, dataDir, "--max-secrets-per-project", "2")
	p = dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	defer p.Release()
	s = client.Stream(ctx, p, "/kept")
	defer s.Release()
	off := mustAppend(t, s, ev("m", `{}`)).Offsets[0]
	sub := client.Subscription(ctx, s, "hook")
	defer sub.Release()
	confirmed, err := client.WaitUntilProcessed(ctx, sub, off, 0)
	require.NoError(t, err, "the referenced secret survived the kill")
	require.Equal(t, off, confirmed)
	other := client.Stream(ctx, p, "/other")
	defer other.Release()
	otherSubs := client.Subscriptions(ctx, other)
	defer otherSubs.Release()
	fresh, _ := newSecret(t)
	require.NoError(t, configure(otherSubs, fmt.Sprintf("after-%d", off), fresh), "the orphan was collected at start-up")
}

// storeOrphanSecret stores a secret in the directory of a stopped itxd, as a configure does
// before its commit.
func storeOrphanSecret(t *testing.T, dataDir, projectID, secret string) {
	t.Helper()
	ctx := ctxT(t)
	d, err := storage.OpenDirectory(ctx, filepath.Join(dataDir, "directory.db"))
	require.NoError(t, err)
	defer d.Close()
	require.NoError(t, d.StoreSecret(ctx, projectID, itx.SecretRefPrefix+strings.Repeat("0f", 16), secret, 1))
}

// A raw configured event cannot keep its webhook secret in the log by spelling the field in
// another case ("Secret", a "Receiver" object): JSON fields match case-insensitively, so the
// subscription would sign with it while every reader of the stream read it. The secret is kept
// apart, or the event refused; either way the log does not hold it.
func TestAccess_RawConfigureKeepsACaseVariantSecretOutOfTheLog(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/secrets/case")
	secret, _ := newSecret(t)
	for i, payload := range []map[string]any{
		{"name": "upper-field", "receiver": map[string]any{"action": "webhook-post", "url": "http://127.0.0.1:1/a", "Secret": secret}},
		{"name": "upper-receiver", "Receiver": map[string]any{"action": "webhook-post", "url": "http://127.0.0.1:1/b", "secret": secret}},
	} {
		raw, err := json.Marshal(payload)
		require.NoError(t, err)
		_, err = client.Append(ctx, s, []itx.EventInput{{Type: itx.TypeSubscriptionConfigured, Payload: raw}}, itx.AppendOptions{})
		t.Logf("payload %d: %v", i, err)
	}
	events, err := client.GetEvents(ctx, s, itx.Query{})
	require.NoError(t, err)
	for _, e := range events {
		require.NotContains(t, string(e.Payload), "whsec_", "the log holds a webhook secret")
	}
}

// A secret reference (what describe and the configured event show in place of a webhook secret)
// is no proof of knowing the secret: a token that reads it cannot have itxd sign for another
// subscription, another URL or another stream with it, by the verb or a raw configured event
// (else a reader with the subscribe right gets bodies of its choosing, a transform's, signed
// with a receiver's secret, for its own URL, and replays them to that receiver). Configuring the
// subscription again as describe reads it back still works.
func TestAccess_SecretReferenceSignsOnlyItsOwnSubscription(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	full := ts.project(t)
	legit, evil := newHook(t, nil), newHook(t, nil)
	secret, _ := newSecret(t)
	s := stream(t, full, "/a/pay")
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	pay := client.SubscriptionConfig{Name: "pay", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: legit.url(), Secret: secret}}
	_, off, err := client.ConfigureSubscription(ctx, subs, pay)
	require.NoError(t, err)

	tok, _ := ts.token(t, itx.Scope{Prefix: "/a", Rights: []itx.Right{itx.RightRead, itx.RightSubscribe}})
	reader := stream(t, ts.login(t, tok), "/a/pay")
	ref := describeSub(t, reader, "pay").Config.Receiver.Secret
	require.True(t, itx.IsSecretRef(ref))
	readerSubs := client.Subscriptions(ctx, reader)
	defer readerSubs.Release()
	for _, cfg := range []client.SubscriptionConfig{
		{Name: "evil", Transform: `{"forged": true}`, Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: evil.url(), Secret: ref}},
		{Name: "pay", Start: "now", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: evil.url(), Secret: ref}},
	} {
		_, _, err := client.ConfigureSubscription(ctx, readerSubs, cfg)
		requireCode(t, err, itx.EPermissionDenied)
	}
	other := stream(t, full, "/a/other")
	mustAppend(t, other, ev("m", `{}`))
	otherSubs := client.Subscriptions(ctx, other)
	defer otherSubs.Release()
	_, _, err = client.ConfigureSubscription(ctx, otherSubs, client.SubscriptionConfig{Name: "pay", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: legit.url(), Secret: ref}})
	requireCode(t, err, itx.EPermissionDenied)
	raw, err := json.Marshal(map[string]any{"name": "raw", "receiver": map[string]any{"action": "webhook-post", "url": evil.url(), "secret": ref}})
	require.NoError(t, err)
	_, err = client.Append(ctx, s, []itx.EventInput{{Type: itx.TypeSubscriptionConfigured, Payload: raw}}, itx.AppendOptions{})
	requireCode(t, err, itx.EPermissionDenied)

	// The subscription itself, configured again as read back (its reference, its URL).
	pay.Receiver.Secret = ref
	_, again, err := client.ConfigureSubscription(ctx, subs, pay)
	require.NoError(t, err)
	require.Equal(t, off, again, "the same config: nothing appended")
	pay.Description = "described"
	_, _, err = client.ConfigureSubscription(ctx, subs, pay)
	require.NoError(t, err)
	at := mustAppend(t, s, ev("m", `{}`)).Offsets[0]
	sub := client.Subscription(ctx, s, "pay")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, at, 15*time.Second)
	require.NoError(t, err)
	legit.mu.Lock()
	defer legit.mu.Unlock()
	require.NoError(t, client.VerifyWebhook(secret, legit.headers[len(legit.headers)-1], legit.raw[len(legit.raw)-1], time.Now()))
	require.Zero(t, evil.count())
}
