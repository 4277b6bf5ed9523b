package test

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/wire"
	"github.com/stretchr/testify/require"
)

// heldReplies forwards one TCP connection to target, and holds everything target sends until
// release: the client's calls reach itxd, no answer reaches the client.
type heldReplies struct {
	addr    string
	gate    chan struct{}
	release func()
}

func holdReplies(t *testing.T, target string) *heldReplies {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	h := &heldReplies{addr: ln.Addr().String(), gate: make(chan struct{})}
	var once sync.Once
	h.release = func() { once.Do(func() { close(h.gate) }) }
	var wg sync.WaitGroup
	t.Cleanup(func() { h.release(); ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		in, err := ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", target)
		if err != nil {
			in.Close()
			return
		}
		wg.Add(2)
		go func() { defer wg.Done(); io.Copy(out, in); out.Close() }()
		go func() {
			defer wg.Done()
			<-h.gate
			io.Copy(in, out)
			in.Close()
		}()
	}()
	return h
}

// A chain sent through the generated API without awaiting any answer is pipelined by itxd:
// login, streams(), get(path) and an append on the stream all take effect while every answer
// is still on its way back (here: held). The Go client's helpers pipeline the same way
// (TestClient_HelpersArePipelined).
func TestRPC_ChainIsPipelined(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	direct := stream(t, ts.project(t), "/pipelined")

	h := holdReplies(t, ts.addr)
	conn, err := client.Dial(ctx, h.addr)
	require.NoError(t, err)
	t.Cleanup(func() { h.release(); conn.Close() })

	login, releaseLogin := conn.Gateway().Login(ctx, func(p schema.Gateway_login_Params) error { return p.SetToken(ts.creds.ProjectToken) })
	streams, releaseStreams := login.Project().Streams(ctx, nil)
	get, releaseGet := streams.Streams().Get(ctx, func(p schema.Streams_get_Params) error { return p.SetPath("/pipelined") })
	appended, releaseAppend := get.Stream().Append(ctx, func(p schema.Stream_append_Params) error {
		events, err := p.NewEvents(1)
		if err != nil {
			return err
		}
		in := ev("piped", `{}`)
		return wire.SetEventInput(events.At(0), &in)
	})

	// The append lands while every answer is held.
	e, err := client.WaitForEvent(ctx, direct, itx.Predicate{Types: []string{"piped"}}, 0, 20*time.Second)
	require.NoError(t, err, "the append never reached itxd while the answers were held")
	require.Equal(t, "piped", e.Type)
	h.release()
	_, err = appended.Struct()
	require.NoError(t, err)
	for _, release := range []func(){releaseAppend, releaseGet, releaseStreams, releaseLogin} {
		release()
	}
}

// The Go client's helpers return their capability at once: Conn.Login, client.Stream,
// client.Subscription, client.ReadOnly, client.Admin and client.Readers, and a call made on what they return,
// all reach itxd while every answer is held, and the chain answers once the replies flow.
func TestClient_HelpersArePipelined(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	direct := stream(t, ts.project(t), "/pipelined")
	_, birth, err := client.ConfigureSubscription(ctx, client.Subscriptions(ctx, direct),
		client.SubscriptionConfig{Name: "copy", Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/copied"}})
	require.NoError(t, err)

	h := holdReplies(t, ts.addr)
	conn, err := client.Dial(ctx, h.addr)
	require.NoError(t, err)
	t.Cleanup(func() { h.release(); conn.Close() })

	// Each helper returns before any reply: were one to wait, this would block until the
	// replies are released, which happens only once the append is seen below.
	project := conn.Login(ctx, ts.creds.ProjectToken)
	s := client.Stream(ctx, project, "/pipelined")
	sub := client.Subscription(ctx, s, "copy")
	ro := client.ReadOnly(ctx, s)
	admin := client.Admin(ctx, project)
	readers := client.Readers(ctx, s)
	defer func() {
		for _, c := range []interface{ Release() }{project, s, sub, ro, admin, readers} {
			c.Release()
		}
	}()
	type result struct {
		res itx.AppendResult
		err error
	}
	appended := make(chan result, 1)
	go func() {
		res, err := client.Append(ctx, s, []itx.EventInput{ev("piped", `{}`)}, itx.AppendOptions{})
		appended <- result{res, err}
	}()

	e, err := client.WaitForEvent(ctx, direct, itx.Predicate{Types: []string{"piped"}}, 0, 20*time.Second)
	require.NoError(t, err, "the append never reached itxd while the answers were held")
	require.Equal(t, birth+1, e.Offset)
	select {
	case r := <-appended:
		t.Fatalf("the append was answered while the replies were held: %+v", r)
	default:
	}
	h.release()
	r := <-appended
	require.NoError(t, r.err)
	require.Equal(t, []int64{e.Offset}, r.res.Offsets)

	// Every helper's capability works once answered.
	d, err := client.WaitUntilProcessed(ctx, sub, e.Offset, 20*time.Second)
	require.NoError(t, err)
	require.GreaterOrEqual(t, d, e.Offset)
	page, err := client.GetEventPage(ctx, ro, itx.Query{After: birth})
	require.NoError(t, err)
	require.Len(t, page.Events, 1)
	_, err = client.Append(ctx, ro, []itx.EventInput{ev("refused", `{}`)}, itx.AppendOptions{})
	require.Error(t, err, "a read-only stream refuses an append")
	tokens, err := client.ListTokens(ctx, admin, ts.creds.ProjectID)
	require.NoError(t, err)
	require.NotEmpty(t, tokens)
	require.NoError(t, client.RegisterReader(ctx, readers, "mirror", e.Offset))
	list, err := client.ListReaders(ctx, readers)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, e.Offset, list[0].Checkpoint)
}

// A refusal early in a pipelined chain reaches its end as itself: every call chained on a
// refused one fails with the refusal's code, however far down the chain and whether or not the
// refused call was still queued inside itxd when it was refused (go-capnp answered a call chained
// on a call rejected from a queue 'pipeline call has no pipeline caller', an internal error).
func TestRPC_RefusalReachesTheEndOfAChain(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	tok, _ := ts.token(t, itx.Scope{Prefix: "/in", Rights: []itx.Right{itx.RightRead, itx.RightSubscribe}})
	conn := dial(t, ts.addr)
	for round := range 50 {
		login, releaseLogin := conn.Gateway().Login(ctx, func(p schema.Gateway_login_Params) error { return p.SetToken(tok) })
		streams, releaseStreams := login.Project().Streams(ctx, nil)
		get, releaseGet := streams.Streams().Get(ctx, func(p schema.Streams_get_Params) error { return p.SetPath("/out/s") })
		subs, releaseSubs := get.Stream().Subscriptions(ctx, nil)
		sub, releaseSub := subs.Subscriptions().Get(ctx, func(p schema.Subscriptions_get_Params) error { return p.SetName("x") })
		described, releaseDescribe := sub.Subscription().Describe(ctx, nil)
		listed, releaseList := subs.Subscriptions().List(ctx, nil)
		_, err := described.Struct()
		requireCode(t, err, itx.EPermissionDenied)
		_, err = listed.Struct()
		requireCode(t, err, itx.EPermissionDenied)
		for _, release := range []func(){releaseList, releaseDescribe, releaseSub, releaseSubs, releaseGet, releaseStreams, releaseLogin} {
			release()
		}
		_ = round
	}
}

// Pipelined chains sent at once from several goroutines over two connections, half of them
// through a stream the token may not reach, some releasing their early answers before the end
// of the chain is answered: every call at the end of a chain answers, with its result or the
// refusal's own code. A drain inside itxd and a connection's receive loop
// once waited on each other for good when a call was pipelined on a refused one (go-capnp
// PATCHES.md), which hung the connection and everything on it.
func TestRPC_ConcurrentChainsAllAnswer(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	stream(t, ts.project(t), "/in/s")
	tok, _ := ts.token(t, itx.Scope{Prefix: "/in", Rights: []itx.Right{itx.RightRead, itx.RightSubscribe}})
	conns := []*client.Conn{dial(t, ts.addr), dial(t, ts.addr)}
	type outcome struct {
		path, call string
		err        error
	}
	const workers, rounds = 6, 40
	out := make(chan outcome, workers*rounds*3)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn := conns[w%len(conns)]
			for round := range rounds {
				path := []string{"/in/s", "/out/s"}[(w+round)%2]
				early := round%3 == 0 // release the chain's first answers before awaiting its end
				login, releaseLogin := conn.Gateway().Login(ctx, func(p schema.Gateway_login_Params) error { return p.SetToken(tok) })
				streams, releaseStreams := login.Project().Streams(ctx, nil)
				get, releaseGet := streams.Streams().Get(ctx, func(p schema.Streams_get_Params) error { return p.SetPath(path) })
				described, releaseDescribe := get.Stream().Describe(ctx, nil)
				subs, releaseSubs := get.Stream().Subscriptions(ctx, nil)
				listed, releaseList := subs.Subscriptions().List(ctx, nil)
				sub, releaseSub := subs.Subscriptions().Get(ctx, func(p schema.Subscriptions_get_Params) error { return p.SetName("none") })
				subDescribed, releaseSubDescribe := sub.Subscription().Describe(ctx, nil)
				if early {
					releaseStreams()
					releaseLogin()
				}
				_, err := described.Struct()
				out <- outcome{path, "Stream.describe", err}
				_, err = listed.Struct()
				out <- outcome{path, "Subscriptions.list", err}
				_, err = subDescribed.Struct()
				out <- outcome{path, "Subscription.describe", err}
				for _, release := range []func(){releaseSubDescribe, releaseSub, releaseList, releaseSubs, releaseDescribe, releaseGet} {
					release()
				}
				if !early {
					releaseStreams()
					releaseLogin()
				}
			}
		}()
	}
	wg.Wait()
	close(out)
	n := 0
	for o := range out {
		n++
		switch {
		case o.path == "/out/s":
			requireCode(t, o.err, itx.EPermissionDenied)
		case o.call == "Subscription.describe": // no such subscription
			requireCode(t, o.err, itx.ENotFound)
		default:
			require.NoError(t, o.err, "%s on %s", o.call, o.path)
		}
	}
	require.Equal(t, workers*rounds*3, n)
}
