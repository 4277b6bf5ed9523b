package test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/processors/remote"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A prefix-scoped Streams.list never names a stream outside its prefix, not in a page and not
// in nextAfter: /in holds /in/a, not /in-secret-plans.
func TestAccess_ScopedListNamesNothingOutside(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	full := ts.project(t)
	mustAppend(t, stream(t, full, "/in-secret-plans"), ev("note", `{}`))
	mustAppend(t, stream(t, full, "/in/a"), ev("note", `{}`))
	mustAppend(t, stream(t, full, "/in/b"), ev("note", `{}`))
	tok, _ := ts.token(t, itx.Scope{Prefix: "/in"})
	in := ts.login(t, tok)
	fut, release := in.Streams(ctx, nil)
	defer release()
	var seen []string
	after := ""
	for {
		page, next, err := client.ListStreamsPage(ctx, fut.Streams(), "", after, 1)
		require.NoError(t, err)
		require.True(t, next == "" || itx.PathUnder(next, "/in"), "nextAfter names a stream outside /in: %q", next)
		for _, s := range page {
			seen = append(seen, s.Path)
		}
		if next == "" {
			break
		}
		after = next
	}
	require.Equal(t, []string{"/in/a", "/in/b"}, seen)
	page, next, err := client.ListStreamsPage(ctx, fut.Streams(), "/in-", "", 10)
	require.NoError(t, err)
	require.Empty(t, page)
	require.Empty(t, next)
}

// An expired token ends like a revoked one, at the instant: its next call fails, and the
// connections it opened are closed (accessEnded), not only refused new calls, while another
// login on the same RPC session carries on.
func TestAccess_ExpiryEndsWhatTheSessionOpened(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	ts := startServer(t, server.Config{Clock: clock})
	ctx := ctxT(t)
	a := client.Admin(ctx, ts.deployment(t))
	defer a.Release()
	tok, _, err := client.CreateToken(ctx, a, "default", client.TokenOptions{Label: "second",
		Expires: clock.Now().Add(time.Second), Scope: itx.Scope{Rights: []itx.Right{itx.RightRead}}})
	require.NoError(t, err)
	writer := stream(t, ts.project(t), "/exp")
	mustAppend(t, writer, ev("note", `{"n":1}`))

	conn := dial(t, ts.addr)
	p := conn.Login(ctx, tok)
	defer p.Release()
	kept := conn.Login(ctx, ts.creds.ProjectToken) // keeps the RPC session open
	defer kept.Release()
	_, err = client.DescribeProject(ctx, kept)
	require.NoError(t, err)
	sink := newTestSink()
	_, err = openConn(t, stream(t, p, "/exp"), connOpts{noState: true}, sink)
	require.NoError(t, err)
	waitUntil(t, "event 1 delivered", func() bool { return len(sink.offsets()) == 1 })

	clock.Advance(2 * time.Second)
	waitUntil(t, "the connection closed", func() bool { return sink.closeReason() != nil })
	require.Equal(t, schema.CloseReason_accessEnded, *sink.closeReason())
	_, err = client.DescribeProject(ctx, p)
	requireCode(t, err, itx.EUnauthenticated)
	_, err = client.DescribeProject(ctx, kept)
	require.NoError(t, err, "the other login carries on")
	mustAppend(t, writer, ev("note", `{"secret":"after expiry"}`))
	require.Equal(t, []int64{1}, sink.offsets(), "nothing after the close")
}

// A revoked session's connections, live views and mounts end at once, even while another login
// on the same RPC connection keeps it open; that login's own carry on.
func TestAccess_RevocationEndsWhatTheSessionOpened(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	a := client.Admin(ctx, ts.deployment(t))
	defer a.Release()
	tok, info, err := client.CreateToken(ctx, a, "default", client.TokenOptions{Label: "gone"})
	require.NoError(t, err)
	writer := stream(t, ts.project(t), "/rev")
	mustAppend(t, writer, ev("note", `{"n":1}`))

	conn := dial(t, ts.addr)
	revoked := conn.Login(ctx, tok)
	defer revoked.Release()
	kept := conn.Login(ctx, ts.creds.ProjectToken)
	defer kept.Release()
	_, err = client.DescribeProject(ctx, kept)
	require.NoError(t, err)
	rs := client.Stream(ctx, revoked, "/rev")
	defer rs.Release()
	ks := client.Stream(ctx, kept, "/rev")
	defer ks.Release()
	gone, stays := newTestSink(), newTestSink()
	_, err = openConn(t, rs, connOpts{key: "gone", noState: true}, gone)
	require.NoError(t, err)
	_, err = openConn(t, ks, connOpts{key: "stays", noState: true}, stays)
	require.NoError(t, err)
	waitUntil(t, "event 1 delivered to both", func() bool { return len(gone.offsets()) == 1 && len(stays.offsets()) == 1 })

	require.NoError(t, client.RevokeToken(ctx, a, "default", info.ID))
	waitUntil(t, "the revoked session's connection closed", func() bool { return gone.closeReason() != nil })
	require.Equal(t, schema.CloseReason_accessEnded, *gone.closeReason())
	res := mustAppend(t, writer, ev("note", `{"secret":"after revocation"}`))
	waitUntil(t, "the other login's connection carries on", func() bool { return len(stays.offsets()) == 2 })
	require.Nil(t, stays.closeReason())
	require.Equal(t, []int64{1}, gone.offsets(), "nothing after the close (offset %d)", res.HeadOffset)
}

// The subscribe right is issue 14's: it configures subscriptions (by the verb or by a raw
// stream/subscription-configured append) and mounts receivers without read (attaching a consumer
// is what it grants), and the subscription delivers; it cannot read the stream itself, mount a
// processor host (which pages the streams: read too), nor configure or append anything without
// subscribe.
func TestAccess_SubscribeRight(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	mustAppend(t, stream(t, ts.project(t), "/secret"), ev("note", `{"secret":"s3cr3t"}`))
	tok, _ := ts.token(t, itx.Scope{Rights: []itx.Right{itx.RightSubscribe}})
	p := ts.login(t, tok)
	s := stream(t, p, "/secret")
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	got := make(chan string, 4)
	h, err := client.MountReceiver(ctx, p, "mine", client.ServeReceiver(func(_ context.Context, b itx.DeliveryBatch) (int64, error) {
		for _, e := range b.Events {
			got <- e.Type
		}
		return 0, nil
	}))
	require.NoError(t, err)
	defer h.Release()
	_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "out", FilterTypes: []string{"note"},
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "mine"}})
	require.NoError(t, err)
	select {
	case typ := <-got:
		require.Equal(t, "note", typ)
	case <-time.After(20 * time.Second):
		t.Fatal("the subscription delivered nothing")
	}
	// A raw configured event is the verb, appended with the append right (and subscribe, not read).
	raw, _ := json.Marshal(map[string]any{"name": "raw", "receiver": map[string]any{"action": itx.KindITXCall, "capability": "mine"}})
	_, err = client.Append(ctx, s, []itx.EventInput{{Type: itx.TypeSubscriptionConfigured, Payload: raw}}, itx.AppendOptions{})
	requireCode(t, err, itx.EPermissionDenied)
	both, _ := ts.token(t, itx.Scope{Rights: []itx.Right{itx.RightSubscribe, itx.RightAppend}})
	_, err = client.Append(ctx, stream(t, ts.login(t, both), "/secret"), []itx.EventInput{{Type: itx.TypeSubscriptionConfigured, Payload: raw}}, itx.AppendOptions{})
	require.NoError(t, err)
	appendOnly, _ := ts.token(t, itx.Scope{Rights: []itx.Right{itx.RightAppend}})
	_, err = client.Append(ctx, stream(t, ts.login(t, appendOnly), "/secret"), []itx.EventInput{{Type: itx.TypeSubscriptionConfigured, Payload: raw}}, itx.AppendOptions{})
	requireCode(t, err, itx.EPermissionDenied)

	_, err = client.GetEvents(ctx, s, itx.Query{})
	requireCode(t, err, itx.EPermissionDenied)
	_, err = client.Append(ctx, s, []itx.EventInput{ev("note", `{}`)}, itx.AppendOptions{})
	requireCode(t, err, itx.EPermissionDenied)
	_, err = remote.Mount(ctx, p, "host", remote.NewHostServer(remote.Config{Host: referenceHost(t, "guestbook")}))
	requireCode(t, err, itx.EPermissionDenied)

	readOnly, _ := ts.token(t, itx.Scope{Rights: []itx.Right{itx.RightRead, itx.RightAppend}})
	rs := client.Subscriptions(ctx, stream(t, ts.login(t, readOnly), "/secret"))
	defer rs.Release()
	_, _, err = client.ConfigureSubscription(ctx, rs, client.SubscriptionConfig{Name: "no",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "mine"}})
	requireCode(t, err, itx.EPermissionDenied)
}

// A scoped admin sees the tokens that fit its own scope (the ones it could make and revoke),
// and a token made by one that expires expires no later.
func TestAccess_ScopedAdminTokens(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	ts := startServer(t, server.Config{Clock: clock})
	ctx := ctxT(t)
	root := client.Admin(ctx, ts.project(t))
	defer root.Release()
	_, wide, err := client.CreateToken(ctx, root, "", client.TokenOptions{Label: "everything"})
	require.NoError(t, err)
	_, other, err := client.CreateToken(ctx, root, "", client.TokenOptions{Label: "team-b", Scope: itx.Scope{Prefix: "/team-b"}})
	require.NoError(t, err)
	teamTok, team, err := client.CreateToken(ctx, root, "", client.TokenOptions{Label: "team-a admin",
		Expires: clock.Now().Add(time.Hour), Scope: itx.Scope{Prefix: "/team-a", Rights: []itx.Right{itx.RightAdmin, itx.RightRead}}})
	require.NoError(t, err)
	a := client.Admin(ctx, ts.login(t, teamTok))
	defer a.Release()
	_, mine, err := client.CreateToken(ctx, a, "", client.TokenOptions{Label: "team-a reader",
		Expires: clock.Now().Add(30 * time.Minute), Scope: itx.Scope{Prefix: "/team-a/x", Rights: []itx.Right{itx.RightRead}}})
	require.NoError(t, err)
	list, err := client.ListTokens(ctx, a, "")
	require.NoError(t, err)
	var ids []string
	for _, info := range list {
		ids = append(ids, info.ID)
	}
	require.ElementsMatch(t, []string{team.ID, mine.ID}, ids, "not %s nor %s", wide.ID, other.ID)

	_, _, err = client.CreateToken(ctx, a, "", client.TokenOptions{Label: "forever", Scope: itx.Scope{Prefix: "/team-a", Rights: []itx.Right{itx.RightRead}}})
	requireCode(t, err, itx.EPermissionDenied)
	_, _, err = client.CreateToken(ctx, a, "", client.TokenOptions{Label: "too late", Expires: clock.Now().Add(2 * time.Hour),
		Scope: itx.Scope{Prefix: "/team-a", Rights: []itx.Right{itx.RightRead}}})
	requireCode(t, err, itx.EPermissionDenied)
}

// A deployment token limited to a path prefix administers only what is under it: the deployment
// project's tokens inside its scope, never another project (creating, renaming or deleting one,
// or its tokens: those reach every stream of it) nor the list of projects. A deployment token
// with no prefix and only the admin right still administers every project.
func TestAccess_PrefixedDeploymentTokenStaysInside(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	root := client.Admin(ctx, ts.deployment(t))
	defer root.Release()
	auditorTok, _, err := client.CreateToken(ctx, root, "", client.TokenOptions{Label: "auditor",
		Scope: itx.Scope{Prefix: server.AuditPath, Rights: []itx.Right{itx.RightRead, itx.RightAdmin}}})
	require.NoError(t, err)
	a := client.Admin(ctx, ts.login(t, auditorTok))
	defer a.Release()

	_, _, _, err = client.CreateProject(ctx, a, "sneaky")
	requireCode(t, err, itx.EPermissionDenied)
	requireCode(t, client.RenameProject(ctx, a, "default", "taken"), itx.EPermissionDenied)
	requireCode(t, client.DeleteProject(ctx, a, "default", true), itx.EPermissionDenied)
	_, _, err = client.CreateToken(ctx, a, "default", client.TokenOptions{Label: "everything"})
	requireCode(t, err, itx.EPermissionDenied)
	_, err = client.ListTokens(ctx, a, "default")
	requireCode(t, err, itx.EPermissionDenied)
	requireCode(t, client.RevokeToken(ctx, a, "default", "tok_default"), itx.EPermissionDenied)
	projects, err := client.ListProjects(ctx, a)
	require.NoError(t, err)
	require.Len(t, projects, 1, "%v", projects)
	require.Equal(t, "deployment", projects[0].Info.ID)
	// Nothing was written: the default project is as it was, with its token.
	p, err := client.DescribeProject(ctx, ts.project(t))
	require.NoError(t, err)
	require.Equal(t, "default", p.Name)

	// Inside its own scope it administers as a project's admin does.
	_, _, err = client.CreateToken(ctx, a, "", client.TokenOptions{Label: "audit reader",
		Scope: itx.Scope{Prefix: server.AuditPath, Rights: []itx.Right{itx.RightRead}}})
	require.NoError(t, err)

	adminTok, _, err := client.CreateToken(ctx, root, "", client.TokenOptions{Label: "provisioner",
		Scope: itx.Scope{Rights: []itx.Right{itx.RightAdmin}}})
	require.NoError(t, err)
	prov := client.Admin(ctx, ts.login(t, adminTok))
	defer prov.Release()
	_, _, _, err = client.CreateProject(ctx, prov, "provisioned")
	require.NoError(t, err)
}

// The deployment's audit stream is written by the server only (as a processor's AppendTo already
// was refused): a deployment token cannot forge a record into it by an append, a scheduled
// append, a copy or a dead letter. Subscribing to it (forwarding the audit elsewhere) still works.
func TestAccess_AuditIsWrittenByTheServerOnly(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	root := ts.deployment(t)
	audit := stream(t, root, server.AuditPath)
	before, err := client.Describe(ctx, audit)
	require.NoError(t, err)
	forged := ev(server.AuditTokenRevoked, `{"projectId": "default", "tokenId": "tok_forged"}`)
	_, err = client.Append(ctx, audit, []itx.EventInput{forged}, itx.AppendOptions{})
	requireCode(t, err, itx.EPermissionDenied)
	_, _, err = client.Schedule(ctx, audit, keyed(forged.Type, string(forged.Payload), "later"), time.Now())
	requireCode(t, err, itx.EPermissionDenied)

	g := stream(t, root, "/global")
	mustAppend(t, g, forged)
	subs := client.Subscriptions(ctx, g)
	defer subs.Release()
	for _, cfg := range []client.SubscriptionConfig{
		{Name: "copy", Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: server.AuditPath}},
		{Name: "dead", OnFailingEvent: "skip", DeadLetterPath: server.AuditPath,
			Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: "http://127.0.0.1:1/hook"}},
	} {
		_, _, err := client.ConfigureSubscription(ctx, subs, cfg)
		requireCode(t, err, itx.EPermissionDenied)
	}
	after, err := client.Describe(ctx, audit)
	require.NoError(t, err)
	require.Equal(t, before.HeadOffset, after.HeadOffset, "nothing was written into the audit stream")

	auditSubs := client.Subscriptions(ctx, audit)
	defer auditSubs.Release()
	_, _, err = client.ConfigureSubscription(ctx, auditSubs, client.SubscriptionConfig{Name: "siem",
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/audit-copy"}})
	require.NoError(t, err, "a subscription on the audit stream reads it")
}
