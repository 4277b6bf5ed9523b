package test

import (
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A token rotated (a new one made with the old one's label and scope, the old one then revoked)
// keeps what the old one owned: its registered reader, its connection's key and its mounted
// Receiver are the new token's, while the old login is still open and after the old token is
// revoked. A token of the same scope under another label is still refused. Before, the new
// token was refused permissionDenied ("another token") for the connection key and the mount
// until the old session ended, and for the reader for good: only the admin right could move it.
func TestAccess_RotatedTokenKeepsWhatItOwned(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	admin := client.Admin(ctx, ts.deployment(t))
	defer admin.Release()
	scope := itx.Scope{Rights: []itx.Right{itx.RightRead, itx.RightSubscribe}}
	mint := func(label string) (string, itx.TokenInfo) {
		tok, info, err := client.CreateToken(ctx, admin, "default", client.TokenOptions{Label: label, Scope: scope})
		require.NoError(t, err)
		return tok, info
	}
	writer := stream(t, ts.project(t), "/shared")
	mustAppend(t, writer, ev("note", `{}`), ev("note", `{}`))

	oldTok, oldInfo := mint("mirror")
	oldP := ts.login(t, oldTok)
	old := stream(t, oldP, "/shared")
	require.NoError(t, client.RegisterReader(ctx, client.Readers(ctx, old), "mirror", 1))
	oldSink := newTestSink()
	_, err := openConn(t, old, connOpts{key: "dash", noState: true}, oldSink)
	require.NoError(t, err)
	mounted, err := client.MountReceiver(ctx, oldP, "billing", client.ServeReceiver((&batchRecorder{}).receive))
	require.NoError(t, err)
	defer mounted.Release()

	stranger, _ := mint("someone-else")
	refused := stream(t, ts.login(t, stranger), "/shared")
	requireCode(t, client.RegisterReader(ctx, client.Readers(ctx, refused), "mirror", 2), itx.EPermissionDenied)
	_, err = openConn(t, refused, connOpts{key: "dash", noState: true}, newTestSink())
	requireCode(t, err, itx.EPermissionDenied)

	newTok, _ := mint("mirror")
	newP := ts.login(t, newTok)
	rotated := stream(t, newP, "/shared")
	t.Run("while the old login is open", func(t *testing.T) {
		require.NoError(t, client.RegisterReader(ctx, client.Readers(ctx, rotated), "mirror", 2))
		_, err := openConn(t, rotated, connOpts{key: "dash", after: 2, noState: true}, newTestSink())
		require.NoError(t, err)
		waitUntil(t, "the old connection closed as replaced", func() bool { return oldSink.closeReason() != nil })
		require.Equal(t, schema.CloseReason_replaced, *oldSink.closeReason())
		h, err := client.MountReceiver(ctx, newP, "billing", client.ServeReceiver((&batchRecorder{}).receive))
		require.NoError(t, err)
		defer h.Release()
	})
	t.Run("after the old token is revoked", func(t *testing.T) {
		require.NoError(t, client.RevokeToken(ctx, admin, "default", oldInfo.ID))
		require.NoError(t, client.RegisterReader(ctx, client.Readers(ctx, rotated), "mirror", 2))
		require.NoError(t, client.RemoveReader(ctx, client.Readers(ctx, rotated), "mirror"))
	})
}
