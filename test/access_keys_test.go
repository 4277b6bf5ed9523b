package test

import (
	"fmt"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors/remote"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A connection's key is its opener's: another token that reads the stream (it sees the key in
// the stream's live state) is refused permissionDenied when it opens under it, and the
// connection carries on; the same token, from another login (a reconnect) and through a
// read-only attenuation, still replaces it. Before, any reader closed another tenant's
// connections at will by reusing their keys.
func TestAccess_ConnectionKeyIsItsTokens(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	writer := stream(t, ts.project(t), "/shared")
	mustAppend(t, writer, ev("note", `{"n":1}`))

	owner := stream(t, ts.project(t), "/shared")
	dashboard := newTestSink()
	_, err := openConn(t, owner, connOpts{key: "dashboard", noState: true}, dashboard)
	require.NoError(t, err)
	waitUntil(t, "event 1 delivered", func() bool { return len(dashboard.offsets()) == 1 })

	tok, _ := ts.token(t, itx.Scope{Rights: []itx.Right{itx.RightRead}})
	other := stream(t, ts.login(t, tok), "/shared")
	for _, s := range []schema.Stream{other, client.ReadOnly(ctx, other)} {
		_, err = openConn(t, s, connOpts{key: "dashboard", noState: true}, newTestSink())
		requireCode(t, err, itx.EPermissionDenied)
		require.Contains(t, err.Error(), "another token")
	}
	mustAppend(t, writer, ev("note", `{"n":2}`))
	waitUntil(t, "event 2 delivered to the owner's connection", func() bool { return len(dashboard.offsets()) == 2 })
	require.Nil(t, dashboard.closeReason(), "the refused opens closed nothing")

	// The owner's token reconnecting, from a new login and through readOnly, replaces it.
	again := newTestSink()
	_, err = openConn(t, client.ReadOnly(ctx, stream(t, ts.project(t), "/shared")), connOpts{key: "dashboard", after: 2, noState: true}, again)
	require.NoError(t, err)
	waitUntil(t, "the old connection closed as replaced", func() bool { return dashboard.closeReason() != nil })
	require.Equal(t, schema.CloseReason_replaced, *dashboard.closeReason())
	mustAppend(t, writer, ev("note", `{"n":3}`))
	waitUntil(t, "event 3 delivered to the new connection", func() bool { return len(again.offsets()) == 1 })
}

// A registered reader is its registrant's token's: another token that reads the stream (it
// lists the readers' names) is refused permissionDenied when it moves or removes it, directly or
// through readOnly, and the checkpoint stays, still holding back a trim; the same token from
// another login moves it, the admin right removes it. The owner is stored with the reader: a
// restart keeps it. Before, any reader moved another's checkpoint past what it had read (or
// removed it) and a trim then deleted the events that reader still needed.
func TestAccess_ReaderIsItsTokens(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a real itxd")
	}
	data := t.TempDir()
	p := startItxd(t, data)
	ctx := ctxT(t)
	admin := client.Admin(ctx, dial(t, p.addr).Login(ctx, p.creds.DeploymentToken))
	readOnly := itx.Scope{Rights: []itx.Right{itx.RightRead}}
	// The mirror's token has subscribe: only such a reader holds back trims.
	mirrorTok, _, err := client.CreateToken(ctx, admin, "default", client.TokenOptions{Label: "mirror",
		Scope: itx.Scope{Rights: []itx.Right{itx.RightRead, itx.RightSubscribe}}})
	require.NoError(t, err)
	otherTok, _, err := client.CreateToken(ctx, admin, "default", client.TokenOptions{Label: "other", Scope: readOnly})
	require.NoError(t, err)
	login := func(tok string) schema.Stream {
		return stream(t, dial(t, p.addr).Login(ctx, tok), "/shared")
	}
	writer := login(p.creds.ProjectToken)
	for i := range 6 {
		mustAppend(t, writer, ev("note", fmt.Sprintf(`{"n":%d}`, i)))
	}
	require.NoError(t, client.RegisterReader(ctx, client.Readers(ctx, login(mirrorTok)), "mirror", 1))

	refused := func(when string) {
		t.Helper()
		other := login(otherTok)
		for _, s := range []schema.Stream{other, client.ReadOnly(ctx, other)} {
			r := client.Readers(ctx, s)
			err := client.RegisterReader(ctx, r, "mirror", 6)
			requireCode(t, err, itx.EPermissionDenied)
			require.Contains(t, err.Error(), "another token", when)
			requireCode(t, client.RemoveReader(ctx, r, "mirror"), itx.EPermissionDenied)
		}
		list, err := client.ListReaders(ctx, client.Readers(ctx, other))
		require.NoError(t, err)
		require.Len(t, list, 1, when)
		require.EqualValues(t, 1, list[0].Checkpoint, "%s: the refused calls left the checkpoint", when)
	}
	refused("registered")
	res, err := client.Trim(ctx, writer, 6)
	require.NoError(t, err)
	require.EqualValues(t, 1, res.TrimmedThrough, "the mirror's checkpoint holds the trim back")

	require.NoError(t, p.stop(t))
	p = startItxd(t, data)
	refused("after a restart")
	require.NoError(t, client.RegisterReader(ctx, client.Readers(ctx, login(mirrorTok)), "mirror", 3), "its own token, another login")
	// Another token may still register a name of its own.
	require.NoError(t, client.RegisterReader(ctx, client.Readers(ctx, login(otherTok)), "audit-copy", 6))
	require.NoError(t, client.RemoveReader(ctx, client.Readers(ctx, login(p.creds.ProjectToken)), "mirror"), "the admin right removes anyone's")
	list, err := client.ListReaders(ctx, client.Readers(ctx, writer))
	require.Error(t, err, "the writer's capability went with the first itxd")
	list, err = client.ListReaders(ctx, client.Readers(ctx, login(p.creds.ProjectToken)))
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "audit-copy", list[0].Name)
}

// A mounted Receiver is its token's: another token of the same scope with the subscribe right
// is refused permissionDenied when it mounts or unmounts under the name, and the subscription
// keeps delivering to the owner's Receiver. Before, it took the name over: the deliveries meant
// for the owner came to it, and its acknowledgements moved the owner's subscription past events
// the owner never saw. The same token from another login replaces it; the admin right unmounts it.
func TestAccess_MountIsItsTokens(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	ctx := e.ctx
	owner := &batchRecorder{}
	h, err := client.MountReceiver(ctx, e.p, "billing", client.ServeReceiver(owner.receive))
	require.NoError(t, err)
	defer h.Release()
	s := stream(t, e.p, "/pay")
	e.configure(t, s, client.SubscriptionConfig{Name: "bill", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "billing"}})

	tok, _ := e.ts.token(t, itx.Scope{Rights: []itx.Right{itx.RightSubscribe}})
	other := e.ts.login(t, tok)
	thief := &batchRecorder{}
	_, err = client.MountReceiver(ctx, other, "billing", client.ServeReceiver(thief.receive))
	requireCode(t, err, itx.EPermissionDenied)
	require.Contains(t, err.Error(), "another token")
	requireCode(t, unmountIn(t, other, "billing"), itx.EPermissionDenied)

	at := mustAppend(t, s, ev("charge", `{}`)).HeadOffset
	e.waitProcessed(t, s, "bill", at)
	require.Equal(t, [][]int64{{at}}, owner.got())
	require.Empty(t, thief.got())

	// The same token from another login replaces it (a reconnect).
	again := &batchRecorder{}
	h2, err := client.MountReceiver(ctx, e.ts.project(t), "billing", client.ServeReceiver(again.receive))
	require.NoError(t, err)
	defer h2.Release()
	at = mustAppend(t, s, ev("charge", `{}`)).HeadOffset
	e.waitProcessed(t, s, "bill", at)
	require.Equal(t, [][]int64{{at}}, again.got())

	// The admin right unmounts anyone's.
	adminTok, _ := e.ts.token(t, itx.Scope{Rights: []itx.Right{itx.RightSubscribe, itx.RightAdmin}})
	require.NoError(t, unmountIn(t, e.ts.login(t, adminTok), "billing"))
}

// unmountIn is project.capabilities().unmount(name).
func unmountIn(t *testing.T, p schema.Project, name string) error {
	t.Helper()
	caps, release := p.Capabilities(ctxT(t), nil)
	defer release()
	return client.Unmount(ctxT(t), caps.Capabilities(), name)
}

// A processor host's contracts are its token's: another token of the scope with read and
// subscribe mounting a host that announces a contract held by the owner's host, or under the
// owner's host's name, is refused permissionDenied and the owner's host stays mounted. Before, it
// took the contract over (the processor's progress, KV and wakes, the owner's host fenced).
// The same token from another login takes it over, as a failover does.
func TestAccess_ProcessorHostIsItsTokens(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	h, err := remote.Mount(ctx, ts.project(t), "books", remote.NewHostServer(remote.Config{Host: referenceHost(t, "guestbook")}))
	require.NoError(t, err)
	defer h.Release()

	tok, _ := ts.token(t, itx.Scope{Rights: []itx.Right{itx.RightRead, itx.RightSubscribe}})
	other := ts.login(t, tok)
	for _, name := range []string{"mine", "books"} {
		_, err = remote.Mount(ctx, other, name, remote.NewHostServer(remote.Config{Host: referenceHost(t, "guestbook")}))
		requireCode(t, err, itx.EPermissionDenied)
		require.Contains(t, err.Error(), "another token")
	}
	hosts := listHosts(t, ts.project(t))
	require.Len(t, hosts, 1)
	require.Equal(t, "books", hosts[0].Name)

	h2, err := remote.Mount(ctx, ts.project(t), "books-2", remote.NewHostServer(remote.Config{Host: referenceHost(t, "guestbook")}))
	require.NoError(t, err, "the same token takes its contract over")
	defer h2.Release()
}
