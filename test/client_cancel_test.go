package test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
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
	// Sent, and not answered: whether it ran is not known.
	require.Contains(t, err.Error(), "context deadline exceeded before the answer came: the call may or may not have taken effect")
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
	require.Contains(t, err.Error(), "append not sent", "an append never sent says so, not that it may have taken effect")
	_, err = client.NewAppender(s, 1).Append(cctx, []itx.EventInput{{Type: "e"}}, itx.AppendOptions{})
	check("Appender.Append", context.Canceled, err)
	_, err = client.ListSubscriptions(cctx, subs)
	check("ListSubscriptions", context.Canceled, err)

	// Never sent, so known not to have taken effect: each says so, not that it may have.
	readers := client.Readers(ctx, s)
	defer readers.Release()
	conn := dial(t, ts.addr)
	open, err := client.OpenConnection(ctx, s, client.ConnectionOptions{}, client.ConnectionHandler{
		Deliver: func(context.Context, itx.DeliveryBatch) error { return nil }})
	require.NoError(t, err)
	defer open.Release()
	notSent := map[string]error{}
	_, notSent["Describe"] = client.Describe(cctx, s)
	_, notSent["GetEventPage"] = client.GetEventPage(cctx, s, itx.Query{})
	_, notSent["ListSubscriptions"] = client.ListSubscriptions(cctx, subs)
	_, notSent["WaitForEvent"] = client.WaitForEvent(cctx, s, itx.Predicate{}, 0, time.Second)
	_, _, notSent["ConfigureSubscription"] = client.ConfigureSubscription(cctx, subs, client.SubscriptionConfig{Name: "unsent",
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/client/cancel-copy"}})
	notSent["RegisterReader"] = client.RegisterReader(cctx, readers, "unsent", 1)
	_, _, notSent["Schedule"] = client.Schedule(cctx, s, itx.EventInput{Type: "later", IdempotencyKey: "unsent"}, time.Now().Add(time.Hour))
	_, notSent["OpenConnection"] = client.OpenConnection(cctx, s, client.ConnectionOptions{}, client.ConnectionHandler{
		Deliver: func(context.Context, itx.DeliveryBatch) error { return nil }})
	_, notSent["WatchStream"] = client.WatchStream(cctx, s)
	_, _, notSent["Connection.Ping"] = open.Ping(cctx)
	notSent["Conn.Ping"] = conn.Ping(cctx)
	for what, err := range notSent {
		check(what, context.Canceled, err)
		require.Contains(t, err.Error(), " not sent: context canceled", what)
		require.NotContains(t, err.Error(), "may or may not", what)
	}
	// And none of them took effect.
	list, err := client.ListSubscriptions(ctx, subs)
	require.NoError(t, err)
	require.Len(t, list, 1, "only the subscription configured before")
	rs, err := client.ListReaders(ctx, readers)
	require.NoError(t, err)
	require.Empty(t, rs)
	sched, err := client.ListScheduled(ctx, s)
	require.NoError(t, err)
	require.Empty(t, sched)

	// The connection still serves calls whose context lives.
	_, err = client.Describe(ctx, s)
	require.NoError(t, err)
}

// The capabilities the helpers return outlive the context they were asked under: a setup under a
// timeout with a deferred cancel, returning the project and the stream it made (their calls
// still unanswered when it returned), left them failing every later call with go-capnp's
// "returned no capabilities to pipeline on" (code internal) or "Gateway.login: ... context
// canceled".
func TestClient_CapabilitiesOutliveTheirSetupContext(t *testing.T) {
	ts := startServer(t, server.Config{})
	type made struct {
		project   schema.Project
		stream    schema.Stream
		readOnly  schema.Stream
		subs      schema.Subscriptions
		sub       schema.Subscription
		readers   schema.Readers
		admin     schema.Admin
		appendTo  schema.Stream
		deployRel func()
	}
	conn := dial(t, ts.addr)
	setup := func() made {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p := conn.Login(ctx, ts.creds.ProjectToken)
		s := client.Stream(ctx, p, "/client/setup")
		d := conn.Login(ctx, ts.creds.DeploymentToken)
		return made{project: p, stream: s, readOnly: client.ReadOnly(ctx, s), subs: client.Subscriptions(ctx, s),
			sub: client.Subscription(ctx, s, "mirror"), readers: client.Readers(ctx, s), admin: client.Admin(ctx, d),
			appendTo: client.AppendOnly(ctx, s), deployRel: d.Release}
	}
	m := setup()
	defer func() {
		for _, c := range []interface{ Release() }{m.project, m.stream, m.readOnly, m.subs, m.sub, m.readers, m.admin, m.appendTo} {
			c.Release()
		}
		m.deployRel()
	}()
	ctx := ctxT(t)
	_, err := client.DescribeProject(ctx, m.project)
	require.NoError(t, err, "project")
	_, err = client.Append(ctx, m.appendTo, []itx.EventInput{{Type: "e"}}, itx.AppendOptions{})
	require.NoError(t, err, "appendOnly")
	_, err = client.Append(ctx, m.stream, []itx.EventInput{{Type: "e"}}, itx.AppendOptions{})
	require.NoError(t, err, "stream")
	_, err = client.GetEventPage(ctx, m.readOnly, itx.Query{})
	require.NoError(t, err, "readOnly")
	_, _, err = client.ConfigureSubscription(ctx, m.subs, client.SubscriptionConfig{Name: "mirror",
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/client/setup-copy"}})
	require.NoError(t, err, "subscriptions")
	_, err = client.DescribeSubscription(ctx, m.sub)
	require.NoError(t, err, "subscription")
	require.NoError(t, client.RegisterReader(ctx, m.readers, "r", 1), "readers")
	_, err = client.ListProjects(ctx, m.admin)
	require.NoError(t, err, "admin")
}

// A negative offset given to the client is refused as invalidArgument naming it, before anything
// is sent. OpenConnection took After -1 for 0 and delivered the whole stream (and a negative
// batch cap for the default); the others sent it as 18446744073709551615 and were refused under
// that number.
func TestClient_NegativeOffsetsAreRefused(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/client/negative")
	mustAppend(t, s, ev("e", `{}`))
	sub := client.Subscription(ctx, s, "none")
	defer sub.Release()
	readers := client.Readers(ctx, s)
	defer readers.Release()
	delivered := newBatches()
	_, err := client.OpenConnection(ctx, s, client.ConnectionOptions{After: -1}, client.ConnectionHandler{Deliver: delivered.deliver})
	checks := map[string]error{"OpenConnection": err}
	_, err = client.OpenConnection(ctx, s, client.ConnectionOptions{MaxDeliveryEvents: -1}, client.ConnectionHandler{Deliver: delivered.deliver})
	checks["OpenConnection cap"] = err
	_, err = client.GetEventPage(ctx, s, itx.Query{After: -1})
	checks["GetEventPage"] = err
	_, err = client.GetEvents(ctx, s, itx.Query{Before: -2})
	checks["GetEvents"] = err
	_, err = client.ReadAll(ctx, s, itx.Query{After: -1})
	checks["ReadAll"] = err
	_, err = client.WaitForEvent(ctx, s, itx.Predicate{}, -1, 0)
	checks["WaitForEvent"] = err
	_, err = client.WaitUntilProcessed(ctx, sub, -1, 0)
	checks["WaitUntilProcessed"] = err
	_, err = client.ConfirmSubscription(ctx, sub, -1)
	checks["ConfirmSubscription"] = err
	_, err = client.SetSubscriptionCursor(ctx, s, "none", -1)
	checks["SetSubscriptionCursor"] = err
	checks["RegisterReader"] = client.RegisterReader(ctx, readers, "r", -1)
	for what, err := range checks {
		requireCode(t, err, itx.EInvalid)
		require.Contains(t, err.Error(), "must not be negative", what)
		require.NotContains(t, err.Error(), "18446744073709551615", what)
	}
	o, _ := delivered.got()
	require.Empty(t, o, "nothing delivered")
}
