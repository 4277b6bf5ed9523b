package test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mintedProject is a client-side Project whose Streams.get answers one capability, whatever the
// path: it lets the stream-level cases of methodCases run on a minted (attenuated) Stream.
type mintedProject struct{ s schema.Stream }

func (m mintedProject) Streams(_ context.Context, call schema.Project_streams) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return res.SetStreams(schema.Streams_ServerToClient(mintedStreams(m)))
}

func (mintedProject) Capabilities(context.Context, schema.Project_capabilities) error {
	return errors.New("not served by the minted-capability proxy")
}
func (mintedProject) Processors(context.Context, schema.Project_processors) error {
	return errors.New("not served by the minted-capability proxy")
}
func (mintedProject) Describe(context.Context, schema.Project_describe) error {
	return errors.New("not served by the minted-capability proxy")
}
func (mintedProject) Admin(context.Context, schema.Project_admin) error {
	return errors.New("not served by the minted-capability proxy")
}

type mintedStreams struct{ s schema.Stream }

func (m mintedStreams) Get(_ context.Context, call schema.Streams_get) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return res.SetStream(m.s.AddRef())
}

func (mintedStreams) List(context.Context, schema.Streams_list) error {
	return errors.New("not served by the minted-capability proxy")
}
func (mintedStreams) Remove(context.Context, schema.Streams_remove) error {
	return errors.New("not served by the minted-capability proxy")
}
func (mintedStreams) DiskUsage(context.Context, schema.Streams_diskUsage) error {
	return errors.New("not served by the minted-capability proxy")
}

// A capability minted with Stream.readOnly() or Stream.appendOnly() refuses, with
// permissionDenied, every method of the schema reachable from it that its rights do not cover
// (through navigation too: its subscriptions, a subscription, its readers, a connection or a live
// view opened on it), and allows the rest; narrowing twice, or narrowing a token that lacks the
// right, leaves nothing. Table-driven over methodCases, so a new stream-level method is covered.
func TestAccAudit_MintedCapabilitiesEveryStreamMethod(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	full := ts.project(t)
	s := stream(t, full, "/in/s")
	mustAppend(t, s, ev("note", `{"n": 1}`))
	subs := client.Subscriptions(ctx, s)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "sub",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "rcv"}})
	subs.Release()
	require.NoError(t, err)
	appendTok, _ := ts.token(t, itx.Scope{Rights: []itx.Right{itx.RightAppend}})
	appender := stream(t, ts.login(t, appendTok), "/in/s")

	ro := client.ReadOnly(ctx, s)
	defer ro.Release()
	ao := client.AppendOnly(ctx, s)
	defer ao.Release()
	none := client.AppendOnly(ctx, ro)
	defer none.Release()
	readOfAppender := client.ReadOnly(ctx, appender)
	defer readOfAppender.Release()
	minted := []struct {
		name   string
		s      schema.Stream
		rights []itx.Right
	}{
		{"readOnly", ro, []itx.Right{itx.RightRead}},
		{"appendOnly", ao, []itx.Right{itx.RightAppend}},
		{"appendOnly of readOnly", none, nil},
		{"readOnly of an append-only token's stream", readOfAppender, nil},
	}
	has := func(rights []itx.Right, r itx.Right) bool {
		for _, x := range rights {
			if x == r {
				return true
			}
		}
		return false
	}
	for _, m := range served(t) {
		c := methodCases[m]
		if !c.pathed || c.viaWake || c.unserved || m == "Streams.get" || m == "Streams.remove" {
			continue
		}
		t.Run(m, func(t *testing.T) {
			for _, mc := range minted {
				p := schema.Project_ServerToClient(mintedProject{s: mc.s})
				err := c.call(ctxT(t), p, "/in/s")
				p.Release()
				allowed := c.right == "" || has(mc.rights, c.right)
				if c.andRead && !has(mc.rights, itx.RightRead) {
					allowed = false
				}
				if allowed {
					require.NotEqual(t, itx.EPermissionDenied, itx.ErrorCode(err), "%s through a %s capability: %v", m, mc.name, err)
				} else {
					require.Equal(t, itx.EPermissionDenied, itx.ErrorCode(err), "%s through a %s capability must be refused: %v", m, mc.name, err)
				}
			}
		})
	}
}

// A project admin limited to a prefix revokes only tokens inside its own scope: a wider token
// (the whole project's) and a sibling's are refused with permissionDenied and keep working; a
// project's admin never reaches another project's token (the deployment's among them) by id; and
// a revoked token cannot log in again.
func TestAccAudit_AdminRevokesOnlyInsideItsReach(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	root := client.Admin(ctx, ts.project(t))
	defer root.Release()
	wideTok, wide, err := client.CreateToken(ctx, root, "", client.TokenOptions{Label: "everything"})
	require.NoError(t, err)
	siblingTok, sibling, err := client.CreateToken(ctx, root, "", client.TokenOptions{Label: "team-ab", Scope: itx.Scope{Prefix: "/team-ab"}})
	require.NoError(t, err)
	teamTok, _, err := client.CreateToken(ctx, root, "", client.TokenOptions{Label: "team-a admin",
		Scope: itx.Scope{Prefix: "/team-a", Rights: []itx.Right{itx.RightAdmin, itx.RightRead}}})
	require.NoError(t, err)
	a := client.Admin(ctx, ts.login(t, teamTok))
	defer a.Release()

	requireCode(t, client.RevokeToken(ctx, a, "", wide.ID), itx.EPermissionDenied)
	requireCode(t, client.RevokeToken(ctx, a, "", sibling.ID), itx.EPermissionDenied)
	for _, tok := range []string{wideTok, siblingTok} {
		_, err := client.DescribeProject(ctx, ts.login(t, tok))
		require.NoError(t, err, "a refused revocation revoked nothing")
	}
	// A sibling prefix that only shares characters (/team-ab under /team-a) is not inside.
	_, _, err = client.CreateToken(ctx, a, "", client.TokenOptions{Label: "sibling", Scope: itx.Scope{Prefix: "/team-ab", Rights: []itx.Right{itx.RightRead}}})
	requireCode(t, err, itx.EPermissionDenied)

	// The whole default project's admin cannot reach the deployment's tokens by id.
	dep := client.Admin(ctx, ts.deployment(t))
	defer dep.Release()
	depTokens, err := client.ListTokens(ctx, dep, "")
	require.NoError(t, err)
	require.NotEmpty(t, depTokens)
	requireCode(t, client.RevokeToken(ctx, root, "", depTokens[0].ID), itx.ENotFound)
	requireCode(t, client.RevokeToken(ctx, root, depTokens[0].ProjectID, depTokens[0].ID), itx.EPermissionDenied)
	_, err = client.DescribeProject(ctx, ts.deployment(t))
	require.NoError(t, err, "the deployment token still works")

	// Revoked: a new login with it fails unauthenticated, and so does a call pipelined on it.
	require.NoError(t, client.RevokeToken(ctx, root, "", wide.ID))
	p := ts.login(t, wideTok)
	_, err = client.DescribeProject(ctx, p)
	requireCode(t, err, itx.EUnauthenticated)
	_, err = client.GetEvents(ctx, stream(t, p, "/x"), itx.Query{})
	requireCode(t, err, itx.EUnauthenticated)
}

// Reader names follow the subscription name rules (issue 8: control characters and invalid
// UTF-8 in reader names are refused with invalidArgument, nothing written).
func TestAccAudit_ReaderNamesAreStrict(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/r")
	mustAppend(t, s, ev("note", `{}`))
	fut, release := s.Readers(ctx, nil)
	defer release()
	r := fut.Readers()
	for _, name := range []string{"a\x00b", "a\nb", "bad\xff", "", "a\u2028b"} {
		rf, rel := r.Register(ctx, func(p schema.Readers_register_Params) error {
			if err := p.SetName(name); err != nil {
				return err
			}
			p.SetCheckpoint(1)
			return nil
		})
		_, err := rf.Struct()
		rel()
		require.Equal(t, itx.EInvalid, itx.ErrorCode(err), "reader name %q: %v", name, err)
	}
	lf, lrel := r.List(ctx, nil)
	defer lrel()
	res, err := lf.Struct()
	require.NoError(t, err)
	list, err := res.Readers()
	require.NoError(t, err)
	require.Equal(t, 0, list.Len(), "a refused register wrote nothing")
}

// A connection's key and openedBy (who opened it, shown in the stream's live state) refuse
// control characters and invalid UTF-8 with invalidArgument, and nothing is opened.
func TestAccAudit_ConnectionNamesAreStrict(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/c")
	mustAppend(t, s, ev("note", `{}`))
	ctx := ctxT(t)
	for _, o := range []struct{ key, openedBy string }{{"k\x00", ""}, {"k\xff", ""}, {"a\nb", ""}, {"", "me\xff"}, {"", "me\x00"}, {"", "a\nb"}} {
		fut, release := s.OpenConnection(ctx, func(p schema.Stream_openConnection_Params) error {
			opts, err := p.NewOptions()
			if err != nil {
				return err
			}
			if err := opts.SetKey(o.key); err != nil {
				return err
			}
			if err := opts.SetOpenedBy(o.openedBy); err != nil {
				return err
			}
			return p.SetSink(schema.EventSink_ServerToClient(quietSink{}))
		})
		_, err := fut.Struct()
		release()
		assert.Equal(t, itx.EInvalid, itx.ErrorCode(err), "key %q openedBy %q: %v", o.key, o.openedBy, err)
	}
}

// A revoked session's mounted Receiver is unmounted at once, even while another login keeps the
// RPC connection open: the listing no longer shows it, its subscription parks, and no event
// appended after the revocation reaches it.
func TestAccAudit_RevocationUnmountsTheSessionsReceiver(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	a := client.Admin(ctx, ts.deployment(t))
	defer a.Release()
	tok, info, err := client.CreateToken(ctx, a, "default", client.TokenOptions{Label: "gone"})
	require.NoError(t, err)
	full := ts.project(t)
	writer := stream(t, full, "/rev")
	mustAppend(t, writer, ev("note", `{"n":1}`))

	conn := dial(t, ts.addr)
	revoked := conn.Login(ctx, tok)
	defer revoked.Release()
	kept := conn.Login(ctx, ts.creds.ProjectToken)
	defer kept.Release()
	_, err = client.DescribeProject(ctx, kept)
	require.NoError(t, err)

	var mu sync.Mutex
	var got []int64
	h, err := client.MountReceiver(ctx, revoked, "mine", client.ServeReceiver(func(_ context.Context, b itx.DeliveryBatch) (int64, error) {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range b.Events {
			got = append(got, e.Offset)
		}
		return b.Events[len(b.Events)-1].Offset, nil
	}))
	require.NoError(t, err)
	defer h.Release()
	subs := client.Subscriptions(ctx, writer)
	defer subs.Release()
	_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "to-mine", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "mine"}})
	require.NoError(t, err)
	first := mustAppend(t, writer, ev("note", `{"n":2}`))
	sub := client.Subscription(ctx, writer, "to-mine")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, first.HeadOffset, 0)
	require.NoError(t, err)

	require.NoError(t, client.RevokeToken(ctx, a, "default", info.ID))
	caps, release := kept.Capabilities(ctx, nil)
	defer release()
	waitUntil(t, "the revoked session's mount is gone", func() bool {
		mounts, err := client.ListMounts(ctx, caps.Capabilities())
		require.NoError(t, err)
		for _, m := range mounts {
			if m.Name == "mine" {
				return false
			}
		}
		return true
	})
	after := mustAppend(t, writer, ev("note", `{"secret":"after revocation"}`))
	waitUntil(t, "the subscription parks", func() bool {
		d, err := client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		return d.Status == itx.StatusParked
	})
	mu.Lock()
	defer mu.Unlock()
	require.NotContains(t, got, after.HeadOffset, "an event appended after the revocation reached the revoked session's receiver")
	_, err = client.DescribeProject(ctx, kept)
	require.NoError(t, err, "the other login carries on")
}

// A token limited to /in reaches no stream outside it through a path spelt to look inside:
// dot segments, doubled or trailing slashes and case variants are refused (permissionDenied or
// invalidArgument), and none reads /out/s's event.
func TestAccAudit_ScopedPathSpellingsStayInside(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	full := ts.project(t)
	mustAppend(t, stream(t, full, "/out/s"), ev("note", `{"secret":1}`))
	mustAppend(t, stream(t, full, "/in/s"), ev("note", `{}`))
	tok, _ := ts.token(t, itx.Scope{Prefix: "/in"})
	in := ts.login(t, tok)
	for _, path := range []string{"/in/../out/s", "/in/./../out/s", "/in//../out/s", "/in/%2e%2e/out/s", "/in/..", "/in/../out", "/In/s", "/in/s/", "/in//s", "in/s", "/in\\..\\out\\s", "/in/\u2025/out/s"} {
		s := stream(t, in, path)
		events, err := client.GetEvents(ctx, s, itx.Query{})
		if err == nil {
			for _, e := range events {
				require.NotContains(t, string(e.Payload), "secret", "%q read /out/s", path)
			}
			continue
		}
		require.Contains(t, []itx.Code{itx.EPermissionDenied, itx.EInvalid}, itx.ErrorCode(err), "%q: %v", path, err)
	}
}

// A barrier a session had in flight when its token was revoked never answers what it found after
// the revocation, and does not wait on: a waitForEvent whose event is appended after the
// revocation fails, and so do a waitForEvent that nothing matches and a waitUntilProcessed that
// nothing confirms, each long before its timeout (unauthenticated, or the connection closes),
// even while another login keeps the RPC connection open.
func TestAccAudit_RevocationEndsBarriersInFlight(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	a := client.Admin(ctx, ts.deployment(t))
	defer a.Release()
	tok, info, err := client.CreateToken(ctx, a, "default", client.TokenOptions{Label: "gone"})
	require.NoError(t, err)
	writer := stream(t, ts.project(t), "/wait")
	mustAppend(t, writer, ev("note", `{}`))
	subs := client.Subscriptions(ctx, writer)
	defer subs.Release()
	_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "parked",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "nobody"}})
	require.NoError(t, err)

	conn := dial(t, ts.addr)
	revoked := conn.Login(ctx, tok)
	defer revoked.Release()
	kept := conn.Login(ctx, ts.creds.ProjectToken)
	defer kept.Release()
	_, err = client.DescribeProject(ctx, kept)
	require.NoError(t, err)
	rs := client.Stream(ctx, revoked, "/wait")
	defer rs.Release()
	_, err = client.Describe(ctx, rs)
	require.NoError(t, err)
	sub := client.Subscription(ctx, rs, "parked")
	defer sub.Release()

	type answer struct {
		what string
		e    itx.Event
		err  error
	}
	done := make(chan answer, 3)
	go func() {
		e, err := client.WaitForEvent(ctx, rs, itx.Predicate{Types: []string{"secret"}}, 1, 25*time.Second)
		done <- answer{"waitForEvent(secret)", e, err}
	}()
	go func() {
		e, err := client.WaitForEvent(ctx, rs, itx.Predicate{Types: []string{"never"}}, 1, 25*time.Second)
		done <- answer{"waitForEvent(never)", e, err}
	}()
	go func() {
		_, err := client.WaitUntilProcessed(ctx, sub, 1, 25*time.Second)
		done <- answer{"waitUntilProcessed", itx.Event{}, err}
	}()
	// Calls on one capability are delivered in order: the describes answered after each
	// barrier's call reached the server.
	_, err = client.Describe(ctx, rs)
	require.NoError(t, err)
	_, err = client.DescribeSubscription(ctx, sub)
	require.NoError(t, err)
	require.NoError(t, client.RevokeToken(ctx, a, "default", info.ID))
	mustAppend(t, writer, ev("secret", `{"pin":1234}`))
	deadline := time.After(20 * time.Second)
	for range 3 {
		select {
		case got := <-done:
			require.Error(t, got.err, "%s: the revoked session was answered %+v", got.what, got.e)
			requireRevoked(t, got.err)
		case <-deadline:
			t.Fatal("a barrier of the revoked session still waits")
		}
	}
	_, err = client.DescribeProject(ctx, kept)
	require.NoError(t, err)
}

// Strict input beyond the verbs' own fields: a waitForEvent `where` over 16 KiB, a predicate or
// a connection's type with invalid UTF-8, a scheduled event with invalid UTF-8, and a
// subscription's description or webhook URL with invalid UTF-8 are each refused with
// invalidArgument, and nothing is written.
func TestAccAudit_StrictInputElsewhere(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/strict")
	mustAppend(t, s, ev("note", `{}`))
	before, err := client.Describe(ctx, s)
	require.NoError(t, err)

	over := `true` + strings.Repeat(" ", 16*1024)
	_, err = client.WaitForEvent(ctx, s, itx.Predicate{Where: over}, 0, time.Second)
	assert.Equal(t, itx.EInvalid, itx.ErrorCode(err), "where over 16 KiB: %v", err)
	_, err = client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"a\xff"}}, 0, time.Second)
	assert.Equal(t, itx.EInvalid, itx.ErrorCode(err), "predicate type with invalid UTF-8: %v", err)
	_, err = openConn(t, s, connOpts{types: []string{"a\xff"}}, newTestSink())
	assert.Equal(t, itx.EInvalid, itx.ErrorCode(err), "connection type with invalid UTF-8: %v", err)
	_, _, err = client.Schedule(ctx, s, keyed("note", "{\"a\":\"\xff\"}", "later"), time.Now().Add(time.Hour))
	assert.Equal(t, itx.EInvalid, itx.ErrorCode(err), "scheduled payload with invalid UTF-8: %v", err)
	scheduled, err := client.ListScheduled(ctx, s)
	require.NoError(t, err)
	assert.Empty(t, scheduled)

	h := newHook(t, nil)
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	for name, cfg := range map[string]client.SubscriptionConfig{
		"description with invalid UTF-8": {Name: "d", Description: "x\xff", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}},
		"url with invalid UTF-8":         {Name: "u", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url() + "/\xff"}},
		"filter type with invalid UTF-8": {Name: "f", FilterTypes: []string{"a\xff"}, Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}},
	} {
		_, _, err := client.ConfigureSubscription(ctx, subs, cfg)
		assert.Equal(t, itx.EInvalid, itx.ErrorCode(err), "%s: %v", name, err)
	}
	after, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.Equal(t, before.HeadOffset, after.HeadOffset, "nothing written")
}

// stubHost is a ProcessorHost that is never woken in these tests.
type stubHost struct{}

func (stubHost) Wake(context.Context, schema.ProcessorHost_wake) error { return errors.New("stub") }
func (stubHost) GetRuntimeState(context.Context, schema.ProcessorHost_getRuntimeState) error {
	return errors.New("stub")
}
func (stubHost) Stop(context.Context, schema.ProcessorHost_stop) error { return errors.New("stub") }

func mountStubHost(t *testing.T, p schema.Project, name string) schema.Handle {
	t.Helper()
	ctx := ctxT(t)
	hosts, release := p.Processors(ctx, nil)
	defer release()
	fut, rel := hosts.Processors().Mount(ctx, func(a schema.ProcessorHosts_mount_Params) error {
		if err := a.SetName(name); err != nil {
			return err
		}
		cs, err := a.NewContracts(1)
		if err != nil {
			return err
		}
		if err := cs.At(0).SetName("contract-of-" + name); err != nil {
			return err
		}
		if err := cs.At(0).SetReducerVersion("1"); err != nil {
			return err
		}
		if err := wire.SetTextList([]string{"note"}, cs.At(0).NewConsumedTypes); err != nil {
			return err
		}
		return a.SetHost(schema.ProcessorHost_ServerToClient(stubHost{}))
	})
	defer rel()
	res, err := fut.Struct()
	require.NoError(t, err)
	h := res.Handle().AddRef()
	t.Cleanup(h.Release)
	return h
}

// ProcessorHosts.list is namespaced like Capabilities.list: a prefix-scoped token lists only the
// hosts mounted under its own scope (never the whole project's nor another tenant's names or
// contracts), and a token without a prefix lists every scope's, each with its scope.
func TestAccAudit_ProcessorHostListingsAreNamespaced(t *testing.T) {
	ts := startServer(t, server.Config{})
	full := ts.project(t)
	aTok, _ := ts.token(t, itx.Scope{Prefix: "/a"})
	bTok, _ := ts.token(t, itx.Scope{Prefix: "/b"})
	a, b := ts.login(t, aTok), ts.login(t, bTok)
	mountStubHost(t, full, "whole-host")
	mountStubHost(t, a, "a-host")
	mountStubHost(t, b, "b-host")
	names := func(list []itx.MountInfo) map[string]string {
		out := map[string]string{}
		for _, m := range list {
			out[m.Name] = m.Scope
		}
		return out
	}
	require.Equal(t, map[string]string{"a-host": "/a"}, names(listHosts(t, a)))
	require.Equal(t, map[string]string{"b-host": "/b"}, names(listHosts(t, b)))
	require.Equal(t, map[string]string{"whole-host": "", "a-host": "/a", "b-host": "/b"}, names(listHosts(t, full)))
}

// A token that expires ends its session's barriers in flight as a revocation does: a
// waitForEvent nothing matches fails at the expiry, not at its own timeout.
func TestAccAudit_ExpiryEndsABarrierInFlight(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	ts := startServer(t, server.Config{Clock: clock})
	ctx := ctxT(t)
	a := client.Admin(ctx, ts.deployment(t))
	defer a.Release()
	tok, _, err := client.CreateToken(ctx, a, "default", client.TokenOptions{Label: "brief",
		Expires: clock.Now().Add(time.Second), Scope: itx.Scope{Rights: []itx.Right{itx.RightRead}}})
	require.NoError(t, err)
	mustAppend(t, stream(t, ts.project(t), "/exp"), ev("note", `{}`))

	conn := dial(t, ts.addr)
	p := conn.Login(ctx, tok)
	defer p.Release()
	kept := conn.Login(ctx, ts.creds.ProjectToken)
	defer kept.Release()
	_, err = client.DescribeProject(ctx, kept)
	require.NoError(t, err)
	s := client.Stream(ctx, p, "/exp")
	defer s.Release()
	done := make(chan error, 1)
	go func() {
		_, err := client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"never"}}, 1, 10*time.Minute)
		done <- err
	}()
	_, err = client.Describe(ctx, s) // answered after the barrier's call reached the server
	require.NoError(t, err)
	clock.Advance(2 * time.Second)
	select {
	case err := <-done:
		requireRevoked(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the expired session's waitForEvent still waits")
	}
}

// Streams.get of a path outside a token's prefix is refused the same way whether that stream
// exists or not (and whether its parent does): the code and the message say nothing of it, for
// the get itself and for every call pipelined on its answer.
func TestAccAudit_OutsidePathsAreRefusedAlike(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	full := ts.project(t)
	mustAppend(t, stream(t, full, "/out/exists"), ev("note", `{}`))
	tok, _ := ts.token(t, itx.Scope{Prefix: "/in"})
	in := ts.login(t, tok)
	outcome := func(path string) []string {
		var out []string
		fut, release := in.Streams(ctx, nil)
		defer release()
		g, rel := fut.Streams().Get(ctx, func(a schema.Streams_get_Params) error { return a.SetPath(path) })
		_, err := g.Struct()
		rel()
		out = append(out, string(itx.ErrorCode(err)), itx.ErrorMessage(err))
		s := stream(t, in, path)
		_, err = client.GetEvents(ctx, s, itx.Query{})
		out = append(out, string(itx.ErrorCode(err)), itx.ErrorMessage(err))
		_, err = client.Describe(ctx, s)
		out = append(out, string(itx.ErrorCode(err)), itx.ErrorMessage(err))
		_, err = client.Append(ctx, s, []itx.EventInput{ev("note", `{}`)}, itx.AppendOptions{})
		out = append(out, string(itx.ErrorCode(err)), itx.ErrorMessage(err))
		return out
	}
	exists := outcome("/out/exists")
	require.Equal(t, string(itx.EPermissionDenied), exists[0], "%v", exists)
	for _, path := range []string{"/out/missing", "/nowhere/at/all"} {
		got := outcome(path)
		for i := range got {
			got[i] = strings.ReplaceAll(got[i], path, "/out/exists")
		}
		require.Equal(t, exists, got, "%s is refused differently from an existing stream", path)
	}
	for _, part := range exists {
		require.NotContains(t, part, "/out", "a refusal names the path")
	}
}

// Tokens stay hashed at rest: a token created over RPC, and a project's first token, appear in
// no file of the data directory (the directory, its WAL, the streams and /audit), while their
// ids do.
func TestAccAudit_TokensAreNotStoredInClear(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	a := client.Admin(ctx, ts.deployment(t))
	defer a.Release()
	tok, info, err := client.CreateToken(ctx, a, "default", client.TokenOptions{Label: "secretive"})
	require.NoError(t, err)
	_, first, firstInfo, err := client.CreateProject(ctx, a, "hashed")
	require.NoError(t, err)
	_, err = client.DescribeProject(ctx, ts.login(t, tok)) // a login records its use
	require.NoError(t, err)
	var sawID bool
	require.NoError(t, filepath.WalkDir(ts.dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, secret := range []string{tok, first} {
			require.False(t, bytes.Contains(b, []byte(secret)), "%s holds a token in clear", path)
			require.False(t, bytes.Contains(b, []byte(strings.TrimPrefix(secret, "itx_"))), "%s holds a token's digits in clear", path)
		}
		sawID = sawID || (bytes.Contains(b, []byte(info.ID)) && bytes.Contains(b, []byte(firstInfo.ID)))
		return nil
	}))
	require.True(t, sawID, "the scan read the files that record the tokens")
}

// The per-stream bounds with no flag test of their own hold on a real itxd given their flags:
// one connection more than --max-connections-per-stream, one live-state view more than
// --max-live-subscribers-per-stream and one scheduled key more than --max-scheduled-per-stream
// each fail limitExceeded, and the refused schedule is not kept.
func TestAccAudit_PerStreamFlagsBoundARealItxd(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	p := startItxd(t, t.TempDir(), "--max-connections-per-stream", "1", "--max-live-subscribers-per-stream", "1", "--max-scheduled-per-stream", "1")
	ctx := ctxT(t)
	s := stream(t, dial(t, p.addr).Login(ctx, p.creds.ProjectToken), "/bounded")
	mustAppend(t, s, ev("note", `{}`))

	_, err := openConn(t, s, connOpts{noState: true}, newTestSink())
	require.NoError(t, err)
	_, err = openConn(t, s, connOpts{noState: true}, newTestSink())
	requireCode(t, err, itx.ELimitExceeded)

	live := func() error {
		fut, release := s.LiveState(ctx, func(p schema.Stream_liveState_Params) error {
			return p.SetSubscriber(schema.LiveSubscriber_ServerToClient(quietLive{}))
		})
		defer release()
		res, err := fut.Struct()
		if err == nil {
			h := res.Handle().AddRef()
			t.Cleanup(h.Release)
		}
		return err
	}
	require.NoError(t, live())
	requireCode(t, live(), itx.ELimitExceeded)

	due := time.Now().Add(time.Hour)
	_, _, err = client.Schedule(ctx, s, keyed("note", `{}`, "one"), due)
	require.NoError(t, err)
	_, _, err = client.Schedule(ctx, s, keyed("note", `{}`, "two"), due)
	requireCode(t, err, itx.ELimitExceeded)
	pending, err := client.ListScheduled(ctx, s)
	require.NoError(t, err)
	require.Len(t, pending, 1, "the refused schedule is not kept")
}

// A logged-in client that never finishes replies holding capabilities (Project.streams) is
// aborted past --rpc-max-unfinished-replies, with an Abort naming the bound and its flag, on a
// real itxd, before it holds more than the bound plus the calls in flight (--rpc-max-calls); a
// client that finishes them is not.
func TestAccAudit_LoggedInUnfinishedRepliesAreBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	p := startItxd(t, t.TempDir(), "--rpc-max-unfinished-replies", "10", "--rpc-max-calls", "16")
	login := func(r *itxtest.RawClient) {
		r.Bootstrap(0)
		r.Call(1, 0, schema.Gateway_TypeID, 0, 1, func(s capnp.Struct) error {
			return s.SetNewText(0, p.creds.ProjectToken)
		})
		r.UntilReturn(1)
		r.Finish(0)
	}
	r := itxtest.DialRaw(t, p.addr)
	login(r)
	for q := uint32(2); q < 502; q++ {
		r.Call(q, 1, schema.Project_TypeID, 0, 0, nil) // Project.streams, never finished
	}
	returns, reason := r.UntilAbort()
	t.Logf("%d returns before the abort", returns)
	require.True(t, strings.HasPrefix(reason, "itx.limitExceeded: "), "abort reason %q", reason)
	require.Contains(t, reason, "--rpc-max-unfinished-replies")
	// The calls already read when the bound is passed are answered (at most --rpc-max-calls in
	// flight), then nothing more is read.
	require.LessOrEqual(t, returns, 10+16+1, "the abort came once the bound was passed")

	polite := itxtest.DialRaw(t, p.addr)
	login(polite)
	for q := uint32(2); q < 42; q++ {
		polite.Call(q, 1, schema.Project_TypeID, 0, 0, nil)
		polite.UntilReturn(q)
		polite.Finish(q)
	}
	ok := dial(t, p.addr)
	_, err := client.DescribeProject(ctxT(t), ok.Login(ctxT(t), p.creds.ProjectToken))
	require.NoError(t, err)
}

// Every spelling of "all interfaces" is off loopback: itxd refuses to serve plaintext RPC on an
// empty host or the IPv6 unspecified address without --insecure, and writes nothing.
func TestAccAudit_PlaintextRefusedOnEveryAllInterfacesSpelling(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	for _, listen := range []string{":0", "[::]:0", "0:0"} {
		data := filepath.Join(t.TempDir(), "data")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := exec.CommandContext(ctx, itxdBin, "--listen", listen, "--data", data).CombinedOutput()
		cancel()
		require.Error(t, err, "--listen %s: %s", listen, out)
		require.Contains(t, string(out), "refusing to serve plaintext RPC", "--listen %s", listen)
		_, statErr := os.Stat(data)
		require.True(t, os.IsNotExist(statErr), "--listen %s: nothing is written", listen)
	}
}

// slowStateHost is a ProcessorHost whose getRuntimeState answers {"secret": 1} only once let go.
type slowStateHost struct {
	stubHost
	asked   chan struct{}
	letItGo chan struct{}
}

func (h slowStateHost) GetRuntimeState(ctx context.Context, call schema.ProcessorHost_getRuntimeState) error {
	call.Go()
	select {
	case h.asked <- struct{}{}:
	default:
	}
	select {
	case <-h.letItGo:
	case <-ctx.Done():
		return ctx.Err()
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return res.SetState(`{"secret": 1}`)
}

// A remote processor's getRuntimeState in flight when the caller's token is revoked does not
// answer what the host says after the revocation (its state, and itxd's fields beside it).
func TestAccAudit_RevocationEndsARuntimeStateInFlight(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	a := client.Admin(ctx, ts.deployment(t))
	defer a.Release()
	tok, info, err := client.CreateToken(ctx, a, "default", client.TokenOptions{Label: "gone"})
	require.NoError(t, err)
	full := ts.project(t)
	host := slowStateHost{asked: make(chan struct{}, 1), letItGo: make(chan struct{})}
	hosts, release := full.Processors(ctx, nil)
	defer release()
	mfut, mrel := hosts.Processors().Mount(ctx, func(p schema.ProcessorHosts_mount_Params) error {
		if err := p.SetName("slow"); err != nil {
			return err
		}
		cs, err := p.NewContracts(1)
		if err != nil {
			return err
		}
		if err := cs.At(0).SetName("c"); err != nil {
			return err
		}
		if err := cs.At(0).SetReducerVersion("1"); err != nil {
			return err
		}
		if err := wire.SetTextList([]string{"note"}, cs.At(0).NewConsumedTypes); err != nil {
			return err
		}
		return p.SetHost(schema.ProcessorHost_ServerToClient(host))
	})
	_, err = mfut.Struct()
	require.NoError(t, err)
	defer mrel()
	s := stream(t, full, "/proc")
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "c",
		Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Placement: "remote"}})
	require.NoError(t, err)

	conn := dial(t, ts.addr)
	revoked := conn.Login(ctx, tok)
	defer revoked.Release()
	kept := conn.Login(ctx, ts.creds.ProjectToken)
	defer kept.Release()
	_, err = client.DescribeProject(ctx, kept)
	require.NoError(t, err)
	sub := client.Subscription(ctx, client.Stream(ctx, revoked, "/proc"), "c")
	defer sub.Release()
	pfut, prel := sub.Processor(ctx, nil)
	defer prel()
	done := make(chan error, 1)
	go func() {
		f, rel := pfut.Processor().GetRuntimeState(ctx, nil)
		defer rel()
		res, err := f.Struct()
		if err == nil {
			state, _ := res.State()
			t.Logf("answered %s", state)
		}
		done <- err
	}()
	select {
	case <-host.asked:
	case <-time.After(20 * time.Second):
		t.Fatal("the host was never asked")
	}
	require.NoError(t, client.RevokeToken(ctx, a, "default", info.ID))
	close(host.letItGo)
	select {
	case err := <-done:
		requireRevoked(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("getRuntimeState still waits")
	}
}

// Administration refuses what it cannot keep with invalidArgument and writes nothing: a token
// label with a control character or invalid UTF-8, an expiry in the past, an unknown right, a
// scope prefix that is not a path, a project name with a newline.
func TestAccAudit_AdminInputIsStrict(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	a := client.Admin(ctx, ts.deployment(t))
	defer a.Release()
	before, err := client.ListTokens(ctx, a, "default")
	require.NoError(t, err)
	for name, o := range map[string]client.TokenOptions{
		"label with a newline":      {Label: "a\nb"},
		"label with invalid UTF-8":  {Label: "a\xff"},
		"empty label":               {Label: ""},
		"expiry in the past":        {Label: "past", Expires: time.Now().Add(-time.Hour)},
		"prefix that is not a path": {Label: "bad prefix", Scope: itx.Scope{Prefix: "in"}},
		"prefix with a dot segment": {Label: "dots", Scope: itx.Scope{Prefix: "/in/.."}},
		"unknown right":             {Label: "bad right", Scope: itx.Scope{Rights: []itx.Right{"everything"}}},
	} {
		_, _, err := client.CreateToken(ctx, a, "default", o)
		require.Equal(t, itx.EInvalid, itx.ErrorCode(err), "%s: %v", name, err)
	}
	after, err := client.ListTokens(ctx, a, "default")
	require.NoError(t, err)
	require.Len(t, after, len(before), "a refused createToken made no token")
	_, _, _, err = client.CreateProject(ctx, a, "team\nb")
	requireCode(t, err, itx.EInvalid)
	requireCode(t, client.RenameProject(ctx, a, "default", "de\x00fault"), itx.EInvalid)
	projects, err := client.ListProjects(ctx, a)
	require.NoError(t, err)
	require.Len(t, projects, 2, "the deployment and default only")
}

// A copy-to-stream subscription and a dead-letter stream append to another stream on their
// configurer's behalf, so configuring one takes the append right as well as subscribe and read:
// a [read, subscribe] token is refused (permissionDenied, nothing configured, nothing copied),
// and the same token with append configures both.
func TestAccAudit_WritingTargetsNeedTheAppendRight(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	full := ts.project(t)
	src := stream(t, full, "/in/s")
	mustAppend(t, src, ev("note", `{"n": 1}`))
	target := stream(t, full, "/in/target")
	mustAppend(t, target, ev("note", `{"n": 0}`))

	configs := map[string]client.SubscriptionConfig{
		"copy": {Name: "copy", Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/in/target"}},
		"dead": {Name: "dead", OnFailingEvent: "skip", DeadLetterPath: "/in/dead",
			Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: "http://127.0.0.1:1/hook"}},
	}
	noAppend, _ := ts.token(t, itx.Scope{Prefix: "/in", Rights: []itx.Right{itx.RightRead, itx.RightSubscribe}})
	s := stream(t, ts.login(t, noAppend), "/in/s")
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	for name, cfg := range configs {
		_, _, err := client.ConfigureSubscription(ctx, subs, cfg)
		requireCode(t, err, itx.EPermissionDenied)
		require.ErrorContains(t, err, "append right", name)
	}
	events, err := client.ReadAll(ctx, src, itx.Query{})
	require.NoError(t, err)
	require.Len(t, events, 1, "a refused configure writes nothing")
	page, err := client.GetEventPage(ctx, target, itx.Query{})
	require.NoError(t, err)
	require.EqualValues(t, 1, page.StreamMaxOffset, "nothing copied into the target")

	withAppend, _ := ts.token(t, itx.Scope{Prefix: "/in", Rights: []itx.Right{itx.RightRead, itx.RightSubscribe, itx.RightAppend}})
	s2 := stream(t, ts.login(t, withAppend), "/in/s")
	subs2 := client.Subscriptions(ctx, s2)
	defer subs2.Release()
	for _, cfg := range configs {
		_, _, err := client.ConfigureSubscription(ctx, subs2, cfg)
		require.NoError(t, err)
	}
	waitUntil(t, "the copy in the target", func() bool {
		page, err := client.GetEventPage(ctx, target, itx.Query{Types: []string{"note"}})
		require.NoError(t, err)
		return len(page.Events) == 2
	})
}
