package test

import (
	"context"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors/remote"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// remote.Run returns the refusal when itxd refuses its login or mount for a reason dialing again
// does not change: an unknown token at once, a token revoked while it was mounted once the
// mount ends, a token without the right to mount. It dialed again forever, with only a log line
// every few seconds, so a host deployed with a wrong or revoked token looked up and ran nothing.
func TestRemote_RunReturnsARefusedMount(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	a := client.Admin(ctx, ts.deployment(t))
	defer a.Release()
	run := func(token string, mounted func()) <-chan error {
		done := make(chan error, 1)
		rctx, cancel := context.WithCancel(ctx)
		t.Cleanup(cancel)
		go func() {
			done <- remote.Run(rctx, remote.Config{Addr: ts.addr, Token: token, Name: "host", Host: referenceHost(t, "guestbook"),
				MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, Logf: t.Logf, Mounted: mounted})
		}()
		return done
	}
	wait := func(done <-chan error) error {
		t.Helper()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("remote.Run went on dialing")
			return nil
		}
	}

	requireCode(t, wait(run("itx_unknown", nil)), itx.EUnauthenticated)

	appendOnly, _, err := client.CreateToken(ctx, a, "default", client.TokenOptions{Label: "appender", Scope: itx.Scope{Rights: []itx.Right{itx.RightAppend}}})
	require.NoError(t, err)
	requireCode(t, wait(run(appendOnly, nil)), itx.EPermissionDenied)

	tok, info, err := client.CreateToken(ctx, a, "default", client.TokenOptions{Label: "host"})
	require.NoError(t, err)
	mounted := make(chan struct{}, 4)
	done := run(tok, func() { mounted <- struct{}{} })
	awaitMount(t, mounted)
	require.NoError(t, client.RevokeToken(ctx, a, "default", info.ID))
	requireCode(t, wait(done), itx.EUnauthenticated)
}
