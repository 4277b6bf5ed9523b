package test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A client call given up because the caller's context ended says so the same way whichever
// call it was: code cancelled, and errors.Is finds the context's error. The barriers
// (WaitForEvent, WaitUntilProcessed) and most calls failed with go-capnp's uncoded error
// ("itx.capnp:Stream.waitForEvent: context deadline exceeded"), which itx.ErrorCode read as
// internal, "a bug or an I/O failure", while GetEventPage and Append said cancelled (and there
// errors.Is found no context error).
func TestClient_CancelledCallsSayCancelled(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/client/cancel")
	mustAppend(t, s, ev("e", `{}`))
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "parked",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "nobody"}})
	require.NoError(t, err)
	sub := client.Subscription(ctx, s, "parked")
	defer sub.Release()

	check := func(what string, want error, err error) {
		t.Helper()
		require.Error(t, err, what)
		require.Equal(t, itx.ECancelled, itx.ErrorCode(err), "%s: %v", what, err)
		require.True(t, errors.Is(err, want), "%s: errors.Is(%v, %v)", what, err, want)
	}
	// Deadlines that end while the call waits on the server.
	dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = client.WaitForEvent(dctx, s, itx.Predicate{Types: []string{"never"}}, 0, 10*time.Second)
	cancel()
	check("WaitForEvent", context.DeadlineExceeded, err)
	dctx, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = client.WaitUntilProcessed(dctx, sub, 1, 10*time.Second)
	cancel()
	check("WaitUntilProcessed", context.DeadlineExceeded, err)

	// Contexts cancelled before the call.
	cctx, cancelNow := context.WithCancel(ctx)
	cancelNow()
	_, err = client.Describe(cctx, s)
	check("Describe", context.Canceled, err)
	_, err = client.GetEventPage(cctx, s, itx.Query{})
	check("GetEventPage", context.Canceled, err)
	_, err = client.Append(cctx, s, []itx.EventInput{{Type: "e"}}, itx.AppendOptions{})
	check("Append", context.Canceled, err)
	_, err = client.NewAppender(s, 1).Append(cctx, []itx.EventInput{{Type: "e"}}, itx.AppendOptions{})
	check("Appender.Append", context.Canceled, err)
	_, err = client.ListSubscriptions(cctx, subs)
	check("ListSubscriptions", context.Canceled, err)

	// The connection still serves calls whose context lives.
	_, err = client.Describe(ctx, s)
	require.NoError(t, err)
}
