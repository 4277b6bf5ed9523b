package test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/processors/remote"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// clientLeakOptions are goleak's options for a check of what the Go client leaves running: the
// goroutines that ran before (the test binary's, itxd's process watchers) are not the client's.
func clientLeakOptions() []goleak.Option {
	return []goleak.Option{goleak.IgnoreCurrent()}
}

// Every kind of call the Go client makes against a real itxd process, answered, cancelled mid-way
// or refused, and every capability it served (a connection's sink, a live view's subscriber, a
// Receiver, a processor host): once the client closed its connection and stopped its host,
// nothing of it is left running.
func TestClient_ClosedLeavesNothingRunning(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	proc := startItxd(t, t.TempDir(), "--processors", "")
	ctx := ctxT(t)
	opts := clientLeakOptions()

	conn, err := client.Dial(ctx, proc.addr)
	require.NoError(t, err)
	p := conn.Login(ctx, proc.creds.ProjectToken)
	s := client.Stream(ctx, p, "/leak/calls")
	_, err = client.Append(ctx, s, []itx.EventInput{ev("a", `{}`), ev("b", `{}`)}, itx.AppendOptions{})
	require.NoError(t, err)
	a := client.NewAppender(s, 4)
	for range 8 {
		_, err := a.Append(ctx, []itx.EventInput{ev("c", `{}`)}, itx.AppendOptions{})
		require.NoError(t, err)
	}
	require.NoError(t, a.Flush(ctx))
	_, err = client.GetEventPage(ctx, s, itx.Query{Limit: 3})
	require.NoError(t, err)
	_, err = client.ReadAll(ctx, s, itx.Query{})
	require.NoError(t, err)
	_, err = client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"b"}}, 0, time.Second)
	require.NoError(t, err)
	// Refused: a typed error, and nothing of it left behind.
	_, err = client.Append(ctx, s, []itx.EventInput{{Type: ""}}, itx.AppendOptions{})
	requireCode(t, err, itx.EInvalid)
	// Cancelled while the server holds the call.
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = client.WaitForEvent(wctx, s, itx.Predicate{Types: []string{"never"}}, 0, 20*time.Second)
	cancel()
	requireCode(t, err, itx.ECancelled)

	// A connection with a sink, a live view, a registered reader, a mounted Receiver.
	delivered := make(chan int64, 64)
	c, err := client.OpenConnection(ctx, s, client.ConnectionOptions{}, client.ConnectionHandler{
		Deliver: func(_ context.Context, b itx.DeliveryBatch) error {
			delivered <- b.Events[len(b.Events)-1].Offset
			return nil
		},
		State: func(uint64, json.RawMessage) {}})
	require.NoError(t, err)
	lv, err := client.WatchStream(ctx, s)
	require.NoError(t, err)
	readers := client.Readers(ctx, s)
	require.NoError(t, client.RegisterReader(ctx, readers, "r", 1))
	received := make(chan struct{}, 1)
	h, err := client.MountReceiver(ctx, p, "inbox", client.ServeReceiver(func(context.Context, itx.DeliveryBatch) (int64, error) {
		select {
		case received <- struct{}{}:
		default:
		}
		return 0, nil
	}))
	require.NoError(t, err)
	subs := client.Subscriptions(ctx, s)
	_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "app",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}})
	require.NoError(t, err)
	<-received
	sub := client.Subscription(ctx, s, "app")
	_, err = client.WaitUntilProcessed(ctx, sub, 10, 0)
	require.NoError(t, err)
	for o := range delivered {
		if o >= 11 {
			break
		}
	}

	// A processor host in this process, woken once.
	hostCtx, stopHost := context.WithCancel(ctx)
	hostDone := make(chan error, 1)
	mounted := make(chan struct{}, 4)
	host := referenceHost(t, "forwarder")
	go func() {
		hostDone <- remote.Run(hostCtx, remote.Config{Addr: proc.addr, Token: proc.creds.ProjectToken, Name: "leak",
			Host: host, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
			Logf: t.Logf, Mounted: func() { mounted <- struct{}{} }})
	}()
	awaitMount(t, mounted)
	q := client.Stream(ctx, p, "/leak/queue")
	_, _, err = client.ConfigureSubscription(ctx, client.Subscriptions(ctx, q), client.SubscriptionConfig{Name: "forwarder",
		Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Placement: "remote"}})
	require.NoError(t, err)
	res, err := client.Append(ctx, q, []itx.EventInput{examples.InboxMessage.Input(json.RawMessage(`{"n":1}`), "")}, itx.AppendOptions{})
	require.NoError(t, err)
	fwd := client.Subscription(ctx, q, "forwarder")
	_, err = client.WaitUntilProcessed(ctx, fwd, res.HeadOffset, 0)
	require.NoError(t, err)
	pv, err := client.WatchProcessor(ctx, client.Processor(ctx, fwd))
	require.NoError(t, err)

	// Let go in the documented ways: the host's context, the view's Cancel, the connection's
	// Close, then the RPC connection.
	stopHost()
	select {
	case <-hostDone:
	case <-time.After(10 * time.Second):
		t.Fatal("remote.Run did not return once its context ended")
	}
	require.NoError(t, pv.Cancel(ctx))
	require.NoError(t, lv.Cancel(ctx))
	require.NoError(t, c.Close(ctx))
	h.Release()
	readers.Release()
	subs.Release()
	sub.Release()
	fwd.Release()
	q.Release()
	s.Release()
	p.Release()
	require.NoError(t, conn.Close())
	<-conn.Done()
	verifyNoLeak(t, opts...)
}
