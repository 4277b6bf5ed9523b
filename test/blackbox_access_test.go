package test

// Black-box probes of issues 8 (hardening: strict input) and 14 (access: tokens, revocation,
// attenuation), written from the issues, the schema and the README, over real RPC against a real
// itxd. Only the probes that found a defect or cover what no other test does are kept.

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// waitForEvent's payloadContains with invalid UTF-8 could never match (events refuse invalid
// UTF-8): it is refused at once with invalidArgument, not waited out to deadlineExceeded.
func TestBlackboxAccess_PayloadContainsInvalidUTF8IsRefused(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/contains")
	mustAppend(t, s, ev("a", `{"x":"y"}`))
	_, err := client.WaitForEvent(ctx, s, itx.Predicate{PayloadContains: json.RawMessage("{\"x\":\"\xff\"}")}, 0, 5*time.Second)
	requireCode(t, err, itx.EInvalid)
	require.Contains(t, itx.ErrorMessage(err), "UTF-8")
	// Valid text still matches.
	e, err := client.WaitForEvent(ctx, s, itx.Predicate{PayloadContains: json.RawMessage(`{"x":"y"}`)}, 0, 5*time.Second)
	require.NoError(t, err)
	require.EqualValues(t, 1, e.Offset)
}

// A connection that logged in with two tokens keeps its session cache: after one token is
// revoked, the other login carries on, while the revoked one's capabilities (and a read-only
// capability minted from them) fail unauthenticated, and logging in again with it on the same
// connection (which would reuse the cached session) fails too.
func TestBlackboxAccess_RevokedLoginOnASharedConnection(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	full := ts.project(t)
	admin := client.Admin(ctx, full)
	t.Cleanup(admin.Release)
	mustAppend(t, stream(t, full, "/shared"), ev("a", `{}`))
	tokA, infoA, err := client.CreateToken(ctx, admin, "", client.TokenOptions{Label: "A"})
	require.NoError(t, err)
	tokB, _, err := client.CreateToken(ctx, admin, "", client.TokenOptions{Label: "B"})
	require.NoError(t, err)

	c := dial(t, ts.addr)
	pA := c.Login(ctx, tokA)
	t.Cleanup(pA.Release)
	pB := c.Login(ctx, tokB)
	t.Cleanup(pB.Release)
	sA := stream(t, pA, "/shared")
	roA := client.ReadOnly(ctx, sA)
	t.Cleanup(roA.Release)
	_, err = client.GetEvents(ctx, roA, itx.Query{})
	require.NoError(t, err)
	sB := stream(t, pB, "/shared")
	_, err = client.GetEvents(ctx, sB, itx.Query{})
	require.NoError(t, err)

	require.NoError(t, client.RevokeToken(ctx, admin, "", infoA.ID))
	_, err = client.GetEvents(ctx, sB, itx.Query{})
	require.NoError(t, err, "the other login on the connection")
	_, err = client.GetEvents(ctx, sA, itx.Query{})
	requireCode(t, err, itx.EUnauthenticated)
	_, err = client.GetEvents(ctx, roA, itx.Query{})
	requireCode(t, err, itx.EUnauthenticated)

	again := c.Login(ctx, tokA)
	t.Cleanup(again.Release)
	_, err = client.DescribeProject(ctx, again)
	requireCode(t, err, itx.EUnauthenticated)
	_, err = client.GetEvents(ctx, stream(t, again, "/shared"), itx.Query{})
	requireCode(t, err, itx.EUnauthenticated)
}

// Issue 8: unsigned fields are reported as unsigned. The offsets and counts no other test sends
// past 2^63-1: trim's throughOffset, a query's before, confirm's offset, setRetention's
// maxEvents. Each is refused with invalidArgument quoting the value as sent, nothing written.
func TestBlackboxAccess_UnsignedFieldsReportedAsSent(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/unsigned")
	mustAppend(t, s, ev("a", `{}`))
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "c", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/unsigned-copy"}})
	require.NoError(t, err)
	const huge = ^uint64(0)
	check := func(what string, err error) {
		t.Helper()
		requireCode(t, err, itx.EInvalid)
		require.Contains(t, itx.ErrorMessage(err), "18446744073709551615", what)
		require.NotContains(t, itx.ErrorMessage(err), "-1", what)
	}

	tf, rel := s.Trim(ctx, func(p schema.Stream_trim_Params) error {
		p.SetThroughOffset(huge)
		return nil
	})
	_, err = tf.Struct()
	rel()
	check("trim throughOffset", err)

	gf, rel := s.GetEventPage(ctx, func(p schema.Stream_getEventPage_Params) error {
		q, err := p.NewQuery()
		q.SetBefore(huge)
		return err
	})
	_, err = gf.Struct()
	rel()
	check("getEventPage before", err)

	sub := client.Subscription(ctx, s, "c")
	t.Cleanup(sub.Release)
	cf, rel := sub.Confirm(ctx, func(p schema.Subscription_confirm_Params) error {
		p.SetOffset(huge)
		return nil
	})
	_, err = cf.Struct()
	rel()
	check("confirm offset", err)

	rf, rel := s.SetRetention(ctx, func(p schema.Stream_setRetention_Params) error {
		p.SetMaxEvents(huge)
		return nil
	})
	_, err = rf.Struct()
	rel()
	check("setRetention maxEvents", err)

	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.EqualValues(t, 2, info.HeadOffset, "nothing written")
}

// A token with the admin right revoking itself is answered: the revocation closes the connection
// (none of its logins is valid any more), but only once the revoke's own answer is written, so the
// caller learns it took effect instead of "disconnected: it may or may not have taken effect".
// Its calls after it fail, and the connection then ends.
func TestBlackboxAccess_SelfRevocationIsAnswered(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	admin := client.Admin(ctx, ts.project(t))
	t.Cleanup(admin.Release)
	for i := range 5 {
		tok, info, err := client.CreateToken(ctx, admin, "", client.TokenOptions{Label: "self", Scope: itx.Scope{Rights: []itx.Right{itx.RightAdmin, itx.RightRead}}})
		require.NoError(t, err)
		c := dial(t, ts.addr)
		own := client.Admin(ctx, c.Login(ctx, tok))
		_, err = client.ListTokens(ctx, own, "")
		require.NoError(t, err)
		require.NoError(t, client.RevokeToken(ctx, own, "", info.ID), "round %d", i)
		_, err = client.ListTokens(ctx, own, "")
		require.Contains(t, []itx.Code{itx.EUnauthenticated, itx.EDisconnected}, itx.ErrorCode(err), "%v", err)
		select {
		case <-c.Done():
		case <-ctx.Done():
			t.Fatal("the connection of a revoked login stayed open")
		}
		own.Release()
		toks, err := client.ListTokens(ctx, admin, "")
		require.NoError(t, err)
		for _, tk := range toks {
			require.NotEqual(t, info.ID, tk.ID, "the token was revoked")
		}
	}
}
