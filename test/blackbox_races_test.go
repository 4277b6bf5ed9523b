package test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Black-box race probes: several clients, each on its own RPC connection to an in-process itxd
// (so the race detector sees the server), hit one name at once. Run with
// go test -race -count=3 -run TestBBRace ./test/.

// raceTyped fails the test on an error that carries no typed code, or an internal one: a race
// lost by a client is answered with a code it can switch on.
func raceTyped(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	code := itx.ErrorCode(err)
	if code == "" || code == itx.EInternal {
		t.Errorf("%s: untyped or internal error: %v", what, err)
	}
}

// TestBBRace_OneNameSpace: in each round three clients claim one name at once, as a reader, a
// subscription and a connection key. A subscription's name is refused to readers and
// connections and the other way round, while a reader and a connection may share one: either
// the subscription wins alone or the reader and the connection both do.
func TestBBRace_OneNameSpace(t *testing.T) {
	ts := startServer(t, server.Config{})
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) }))
	defer hook.Close()
	const path = "/race/names"
	ctx := ctxT(t)
	setup := stream(t, ts.project(t), path)
	mustAppend(t, setup, ev("seed", `{}`))
	sR, sS, sC := stream(t, ts.project(t), path), stream(t, ts.project(t), path), stream(t, ts.project(t), path)
	readers := client.Readers(ctx, sR)
	defer readers.Release()
	subs := client.Subscriptions(ctx, sS)
	defer subs.Release()

	for round := 0; round < 40; round++ {
		name := fmt.Sprintf("n%d", round)
		var wg sync.WaitGroup
		var errR, errS, errC error
		var conn *client.Connection
		wg.Add(3)
		go func() {
			defer wg.Done()
			errR = client.RegisterReader(ctx, readers, name, 1)
		}()
		go func() {
			defer wg.Done()
			_, _, errS = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: name,
				Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: hook.URL}})
		}()
		go func() {
			defer wg.Done()
			conn, errC = client.OpenConnection(ctx, sC, client.ConnectionOptions{Key: name, After: 1},
				client.ConnectionHandler{Deliver: func(context.Context, itx.DeliveryBatch) error { return nil }})
		}()
		wg.Wait()
		for _, err := range []error{errR, errS, errC} {
			raceTyped(t, name, err)
		}
		// A reader and a connection may carry one name (a client's mirror); a subscription
		// shares it with neither.
		require.True(t, (errS == nil) != (errR == nil) && (errR == nil) == (errC == nil),
			"round %d: reader %v, subscription %v, connection %v", round, errR, errS, errC)
		if errS == nil {
			_, err := client.RemoveSubscription(ctx, subs, name)
			require.NoError(t, err)
		} else {
			require.NoError(t, client.RemoveReader(ctx, readers, name))
			require.NoError(t, conn.Close(ctx))
		}
	}
}
