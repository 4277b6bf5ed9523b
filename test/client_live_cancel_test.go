package test

import (
	"context"
	"testing"
	"time"

	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// LiveView.Cancel with a context without a deadline gives up on a server that stopped
// answering after 10 s, as Connection.Close does, instead of waiting forever.
func TestClientLiveView_CancelDoesNotWaitForeverOnASilentServer(t *testing.T) {
	ts := startServer(t, server.Config{})
	mustAppend(t, stream(t, ts.project(t), "/client/silent"), ev("e", `{}`))
	px := newProxy(t, ts.addr)
	ctx := ctxT(t)
	conn, err := client.Dial(ctx, px.addr())
	require.NoError(t, err)
	t.Cleanup(func() { go conn.Close() })
	p := conn.Login(ctx, ts.creds.ProjectToken)
	s := client.Stream(ctx, p, "/client/silent")
	v, err := client.WatchStream(ctx, s)
	require.NoError(t, err)

	px.freeze()
	done := make(chan error, 1)
	started := time.Now()
	go func() { done <- v.Cancel(context.Background()) }()
	select {
	case err := <-done:
		require.Error(t, err, "the server never answered the cancel")
		require.Less(t, time.Since(started), 15*time.Second)
	case <-time.After(30 * time.Second):
		t.Fatal("LiveView.Cancel waited on a silent server past its 10 s bound")
	}
	select {
	case <-v.Done():
	default:
		t.Fatal("the view is not done after Cancel")
	}
}
