package test

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/rpc"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// requireRevoked asserts that a call failed because its token is gone: unauthenticated, or the
// connection was closed under it (a connection whose every session was revoked is closed): a
// call in flight then fails disconnected, one sent after go-capnp saw the close fails with
// rpc.ErrConnClosed.
func requireRevoked(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	require.True(t, itx.ErrorCode(err) == itx.EUnauthenticated || capnp.IsDisconnected(err) ||
		errors.Is(err, rpc.ErrConnClosed) || strings.HasSuffix(err.Error(), rpc.ErrConnClosed.Error()),
		"want unauthenticated or disconnected, got %v", err)
}

func TestAccess_RevokeTakesEffectAtOnce(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	a := client.Admin(ctx, ts.deployment(t))
	defer a.Release()
	tok, info, err := client.CreateToken(ctx, a, "default", client.TokenOptions{Label: "ci"})
	require.NoError(t, err)

	t.Run("the only session of a connection: its next call fails", func(t *testing.T) {
		p := ts.login(t, tok)
		s := stream(t, p, "/revoke")
		mustAppend(t, s, ev("note", `{}`))
		require.NoError(t, client.RevokeToken(ctx, a, "default", info.ID))
		_, err := client.Append(ctx, s, []itx.EventInput{ev("note", `{}`)}, itx.AppendOptions{})
		requireRevoked(t, err)
		_, err = client.DescribeProject(ctx, ts.login(t, tok))
		requireCode(t, err, itx.EUnauthenticated)
	})

	t.Run("beside another session on the same connection", func(t *testing.T) {
		tok2, info2, err := client.CreateToken(ctx, a, "default", client.TokenOptions{Label: "ci-2"})
		require.NoError(t, err)
		conn := dial(t, ts.addr)
		revoked := conn.Login(ctx, tok2)
		defer revoked.Release()
		kept := conn.Login(ctx, ts.creds.ProjectToken)
		defer kept.Release()
		rs := client.Stream(ctx, revoked, "/revoke")
		defer rs.Release()
		mustAppend(t, rs, ev("note", `{}`))
		require.NoError(t, client.RevokeToken(ctx, a, "default", info2.ID))
		_, err = client.GetEvents(ctx, rs, itx.Query{})
		requireCode(t, err, itx.EUnauthenticated)
		ks := client.Stream(ctx, kept, "/revoke")
		defer ks.Release()
		_, err = client.GetEvents(ctx, ks, itx.Query{})
		require.NoError(t, err, "the other session of the connection carries on")
	})

	t.Run("an unknown token id is notFound and revokes nothing", func(t *testing.T) {
		requireCode(t, client.RevokeToken(ctx, a, "default", "tok_nope"), itx.ENotFound)
		_, err := client.DescribeProject(ctx, ts.project(t))
		require.NoError(t, err)
	})

	t.Run("the audit stream records creations and revocations", func(t *testing.T) {
		events, err := client.GetEvents(ctx, stream(t, ts.deployment(t), server.AuditPath), itx.Query{})
		require.NoError(t, err)
		var got []string
		for _, e := range events {
			var p struct {
				TokenID string `json:"tokenId"`
				By      struct {
					TokenID string `json:"tokenId"`
				} `json:"by"`
			}
			require.NoError(t, json.Unmarshal(e.Payload, &p))
			require.Equal(t, "tok_deployment", p.By.TokenID, "who asked")
			got = append(got, e.Type+" "+p.TokenID)
			require.NotContains(t, string(e.Payload), tok)
		}
		require.Equal(t, []string{server.AuditTokenCreated + " " + info.ID, server.AuditTokenRevoked + " " + info.ID}, got[:2])
		require.Len(t, got, 4)
	})
}

func TestAccess_TokenExpires(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	ts := startServer(t, server.Config{Clock: clock})
	ctx := ctxT(t)
	a := client.Admin(ctx, ts.deployment(t))
	defer a.Release()
	_, _, err := client.CreateToken(ctx, a, "default", client.TokenOptions{Label: "past", Expires: clock.Now()})
	requireCode(t, err, itx.EInvalid)
	tok, _, err := client.CreateToken(ctx, a, "default", client.TokenOptions{Label: "hour", Expires: clock.Now().Add(time.Hour)})
	require.NoError(t, err)
	p := ts.login(t, tok)
	_, err = client.DescribeProject(ctx, p)
	require.NoError(t, err)
	clock.Advance(time.Hour)
	_, err = client.DescribeProject(ctx, p)
	requireRevoked(t, err) // its only session ended: the RPC connection is closed with it
	_, err = client.DescribeProject(ctx, ts.login(t, tok))
	requireCode(t, err, itx.EUnauthenticated)
}

func TestAccess_AttenuatedCapabilities(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/att")
	mustAppend(t, s, ev("note", `{"n": 1}`))

	ro := client.ReadOnly(ctx, s)
	defer ro.Release()
	_, err := client.Append(ctx, ro, []itx.EventInput{ev("note", `{}`)}, itx.AppendOptions{})
	requireCode(t, err, itx.EPermissionDenied)
	events, err := client.GetEvents(ctx, ro, itx.Query{})
	require.NoError(t, err)
	require.Len(t, events, 1)
	subs := client.Subscriptions(ctx, ro)
	defer subs.Release()
	_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "x",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "c"}})
	requireCode(t, err, itx.EPermissionDenied)

	ao := client.AppendOnly(ctx, s)
	defer ao.Release()
	mustAppend(t, ao, ev("note", `{"n": 2}`))
	_, err = client.GetEvents(ctx, ao, itx.Query{})
	requireCode(t, err, itx.EPermissionDenied)

	// Narrowing never widens: appendOnly of a read-only capability can do nothing.
	none := client.AppendOnly(ctx, ro)
	defer none.Release()
	_, err = client.Append(ctx, none, []itx.EventInput{ev("note", `{}`)}, itx.AppendOptions{})
	requireCode(t, err, itx.EPermissionDenied)

	t.Run("it dies with the session that minted it", func(t *testing.T) {
		a := client.Admin(ctx, ts.deployment(t))
		defer a.Release()
		tok, info, err := client.CreateToken(ctx, a, "default", client.TokenOptions{Label: "minter"})
		require.NoError(t, err)
		ro := client.ReadOnly(ctx, stream(t, ts.login(t, tok), "/att"))
		defer ro.Release()
		_, err = client.GetEvents(ctx, ro, itx.Query{})
		require.NoError(t, err)
		require.NoError(t, client.RevokeToken(ctx, a, "default", info.ID))
		_, err = client.GetEvents(ctx, ro, itx.Query{})
		requireRevoked(t, err)
	})
}

// streamFiles lists the stream database files of a data directory.
func streamFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dir, "streams"))
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func TestAccess_AdminProjectsAndAudit(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	root := ts.deployment(t)
	a := client.Admin(ctx, root)
	defer a.Release()
	before := streamFiles(t, ts.dir)

	info, tok, tinfo, err := client.CreateProject(ctx, a, "team-a")
	require.NoError(t, err)
	require.Equal(t, "team-a", info.Name)
	require.Equal(t, "initial", tinfo.Label)
	_, _, _, err = client.CreateProject(ctx, a, "team-a")
	requireCode(t, err, itx.EInvalid)
	_, _, _, err = client.CreateProject(ctx, a, " padded")
	requireCode(t, err, itx.EInvalid)

	p := ts.login(t, tok)
	got, err := client.DescribeProject(ctx, p)
	require.NoError(t, err)
	require.Equal(t, info.ID, got.ID)
	s := stream(t, p, "/orders")
	mustAppend(t, s, ev("order", `{"id": 1}`))
	s.Release()
	// A project token is not the deployment root, and another project's streams are not its own.
	pa := client.Admin(ctx, p)
	defer pa.Release()
	_, _, _, err = client.CreateProject(ctx, pa, "sneaky")
	requireCode(t, err, itx.EPermissionDenied)
	_, err = client.ListTokens(ctx, pa, "default")
	requireCode(t, err, itx.EPermissionDenied)
	own, err := client.ListProjects(ctx, pa)
	require.NoError(t, err)
	require.Len(t, own, 1)

	require.NoError(t, client.RenameProject(ctx, a, info.ID, "team-b"))
	got, err = client.DescribeProject(ctx, p)
	require.NoError(t, err)
	require.Equal(t, "team-b", got.Name, "a session logged in before the rename describes the project as it is")
	list, err := client.ListProjects(ctx, a)
	require.NoError(t, err)
	names := map[string]int{}
	for _, ps := range list {
		names[ps.Info.Name] = ps.StreamCount
	}
	require.Equal(t, 1, names["team-b"])
	require.Contains(t, names, "default")
	require.Contains(t, names, "deployment")

	tokens, err := client.ListTokens(ctx, a, info.ID)
	require.NoError(t, err)
	require.Len(t, tokens, 1)
	require.NotZero(t, tokens[0].LastUsedAt, "the login recorded its use")

	requireCode(t, client.DeleteProject(ctx, a, info.ID, false), itx.EFailedPrecondition)
	_, err = client.DescribeProject(ctx, p)
	require.NoError(t, err, "a refused delete changes nothing")
	requireCode(t, client.DeleteProject(ctx, a, "deployment", true), itx.EFailedPrecondition)

	require.NoError(t, client.DeleteProject(ctx, a, info.ID, true))
	_, err = client.DescribeProject(ctx, p)
	requireRevoked(t, err)
	_, err = client.DescribeProject(ctx, ts.login(t, tok))
	requireCode(t, err, itx.EUnauthenticated)
	requireCode(t, client.DeleteProject(ctx, a, info.ID, true), itx.ENotFound)
	// The audit stream is the one new file; the deleted project's stream left nothing behind.
	after := streamFiles(t, ts.dir)
	audit, err := client.Describe(ctx, stream(t, root, server.AuditPath))
	require.NoError(t, err)
	var want []string
	for _, f := range before {
		want = append(want, f)
	}
	for _, suffix := range []string{".db", ".db-shm", ".db-wal"} {
		want = append(want, audit.StreamID+suffix)
	}
	for _, f := range after {
		require.Contains(t, want, f, "file %s is left in streams/", f)
	}
	list, err = client.ListProjects(ctx, a)
	require.NoError(t, err)
	for _, ps := range list {
		require.NotEqual(t, info.ID, ps.Info.ID)
	}

	// Every change is in the deployment's audit stream, with no token in it.
	events, err := client.GetEvents(ctx, stream(t, root, server.AuditPath), itx.Query{})
	require.NoError(t, err)
	var types []string
	for _, e := range events {
		types = append(types, e.Type)
		require.NotContains(t, string(e.Payload), tok, "the audit never records a token")
	}
	require.Equal(t, []string{server.AuditProjectCreated, server.AuditProjectRenamed, server.AuditProjectDeleted}, types)
}

func TestAccess_TokenListingsNeverShowTheSecret(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	a := client.Admin(ctx, ts.deployment(t))
	defer a.Release()
	tok, info, err := client.CreateToken(ctx, a, "default", client.TokenOptions{Label: "reader",
		Scope: itx.Scope{Prefix: "/a", Rights: []itx.Right{itx.RightRead}}, Expires: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(tok, "itx_"))
	list, err := client.ListTokens(ctx, a, "default")
	require.NoError(t, err)
	b, err := json.Marshal(list)
	require.NoError(t, err)
	require.NotContains(t, string(b), tok)
	var found bool
	for _, t2 := range list {
		if t2.ID == info.ID {
			found = true
			require.Equal(t, "/a", t2.Scope.Prefix)
			require.Equal(t, []itx.Right{itx.RightRead}, t2.Scope.Rights)
			require.NotZero(t, t2.ExpiresAt)
		}
	}
	require.True(t, found)
	// At rest, only the hash.
	db, err := os.ReadFile(filepath.Join(ts.dir, "directory.db"))
	require.NoError(t, err)
	wal, _ := os.ReadFile(filepath.Join(ts.dir, "directory.db-wal"))
	require.NotContains(t, string(db)+string(wal), tok)

	for _, bad := range []itx.Scope{{Prefix: "a"}, {Prefix: "/a/"}, {Rights: []itx.Right{"write"}}} {
		_, _, err := client.CreateToken(ctx, a, "default", client.TokenOptions{Label: "bad", Scope: bad})
		requireCode(t, err, itx.EInvalid)
	}
	_, _, err = client.CreateToken(ctx, a, "no-such-project", client.TokenOptions{Label: "x"})
	requireCode(t, err, itx.ENotFound)
}

func TestAccess_WebhookSecretKeptApart(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/hooked")
	secret, _ := newSecret(t)
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	cfg := client.SubscriptionConfig{Name: "hook", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: "http://127.0.0.1:1/hook", Secret: secret}}
	_, off, err := client.ConfigureSubscription(ctx, subs, cfg)
	require.NoError(t, err)
	_, again, err := client.ConfigureSubscription(ctx, subs, cfg)
	require.NoError(t, err)
	require.Equal(t, off, again, "the same secret, the same reference: configure stays idempotent")

	events, err := client.GetEvents(ctx, s, itx.Query{})
	require.NoError(t, err)
	for _, e := range events {
		require.NotContains(t, string(e.Payload), secret)
		require.NotContains(t, string(e.Payload), "whsec_")
	}
	sub := client.Subscription(ctx, s, "hook")
	defer sub.Release()
	d, err := client.DescribeSubscription(ctx, sub)
	require.NoError(t, err)
	require.True(t, d.SecretSet)
	require.True(t, itx.IsSecretRef(d.Config.Receiver.Secret), "describe shows the reference: %q", d.Config.Receiver.Secret)

	// A raw append of a configured event keeps the secret out of the log too.
	raw, err := json.Marshal(map[string]any{"name": "raw", "receiver": map[string]any{"action": "webhook-post",
		"url": "http://127.0.0.1:1/raw", "secret": secret}, "description": "raw"})
	require.NoError(t, err)
	mustAppend(t, s, itx.EventInput{Type: itx.TypeSubscriptionConfigured, Payload: raw})
	events, err = client.GetEvents(ctx, s, itx.Query{})
	require.NoError(t, err)
	for _, e := range events {
		require.NotContains(t, string(e.Payload), "whsec_")
	}
	rawSub := client.Subscription(ctx, s, "raw")
	defer rawSub.Release()
	d, err = client.DescribeSubscription(ctx, rawSub)
	require.NoError(t, err)
	require.True(t, d.SecretSet)

	_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "bad",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: "http://127.0.0.1:1/", Secret: "whsec_short"}})
	requireCode(t, err, itx.EInvalid)
	long := "whsec_" + base64.StdEncoding.EncodeToString(make([]byte, itx.MaxWebhookSecretBytes+1))
	_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "bad",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: "http://127.0.0.1:1/", Secret: long}})
	requireCode(t, err, itx.EInvalid)
}

// Every distinct webhook secret is kept (apart from the log): a project keeps a bounded number,
// and one more is refused with limitExceeded, writing nothing; a secret already kept is reused.
func TestAccess_WebhookSecretsPerProjectBounded(t *testing.T) {
	ts := startServer(t, server.Config{MaxSecretsPerProject: 3})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/secrets")
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	configure := func(name, secret string) error {
		_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: name, Start: "now",
			Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: "http://127.0.0.1:1/" + name, Secret: secret}})
		return err
	}
	var secrets []string
	for i := range 4 {
		secret, _ := newSecret(t)
		secrets = append(secrets, secret)
		if i < 3 {
			require.NoError(t, configure(fmt.Sprintf("s%d", i), secret))
		}
	}
	head, err := client.Describe(ctx, s)
	require.NoError(t, err)
	requireCode(t, configure("s3", secrets[3]), itx.ELimitExceeded)
	after, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.Equal(t, head.HeadOffset, after.HeadOffset, "the refused configure wrote nothing")
	require.NoError(t, configure("s3", secrets[0]), "a kept secret is reused")
}

// listProjects pages in id order: every project once across the pages, nextAfter empty on the
// last one, a page over its bound refused; a project's own admin sees its own project only, on
// the first page.
func TestAdmin_ListProjectsPages(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	a := client.Admin(ctx, ts.deployment(t))
	defer a.Release()
	var own itx.ProjectInfo
	var tok string
	for i := range 5 {
		info, token, _, err := client.CreateProject(ctx, a, fmt.Sprintf("paged-%d", i))
		require.NoError(t, err)
		own, tok = info, token
	}
	all, err := client.ListProjects(ctx, a)
	require.NoError(t, err)
	require.Len(t, all, 7, "the five, default and the deployment's")
	var paged []string
	after, pages := "", 0
	for {
		page, next, err := client.ListProjectsPage(ctx, a, after, 2)
		require.NoError(t, err)
		pages++
		require.LessOrEqual(t, len(page), 2)
		for _, p := range page {
			paged = append(paged, p.Info.ID)
		}
		if next == "" {
			break
		}
		require.Equal(t, page[len(page)-1].Info.ID, next)
		after = next
	}
	require.Equal(t, 4, pages)
	require.True(t, slices.IsSorted(paged), "id order: %v", paged)
	var ids []string
	for _, p := range all {
		ids = append(ids, p.Info.ID)
	}
	require.Equal(t, ids, paged)
	_, _, err = client.ListProjectsPage(ctx, a, "", server.MaxListProjects+1)
	requireCode(t, err, itx.EInvalid)

	pa := client.Admin(ctx, ts.login(t, tok))
	defer pa.Release()
	page, next, err := client.ListProjectsPage(ctx, pa, "", 1)
	require.NoError(t, err)
	require.Len(t, page, 1)
	require.Equal(t, own.ID, page[0].Info.ID)
	require.Empty(t, next)
	page, _, err = client.ListProjectsPage(ctx, pa, own.ID, 1)
	require.NoError(t, err)
	require.Empty(t, page, "past its own project")
}
