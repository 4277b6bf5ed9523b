package test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors/remote"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/wire"
	"github.com/stretchr/testify/require"
)

// requireDisconnected asserts what a Go SDK user is promised of a call on a lost connection:
// code disconnected, a message saying the call may or may not have taken effect, and
// go-capnp's exception still reachable for errors.As and capnp.IsDisconnected.
func requireDisconnected(t *testing.T, what string, err error) {
	t.Helper()
	require.Error(t, err, what)
	require.Equal(t, itx.EDisconnected, itx.ErrorCode(err), "%s: %v", what, err)
	require.Contains(t, itx.ErrorMessage(err), "may or may not have taken effect", what)
	require.NotContains(t, err.Error(), "rpc:", what)
	require.True(t, capnp.IsDisconnected(err), "%s: capnp.IsDisconnected(%v)", what, err)
	var coded *itx.Error
	require.True(t, errors.As(err, &coded), what)
	require.Equal(t, itx.EDisconnected, coded.Code, what)
}

// The connection to itxd is cut (TCP closed by a proxy between them) while calls are in flight:
// every call of the Go client that fails for it, in flight or made after, says disconnected
// (it said internal: "rpc: connection closed"), and so do the connection, the live view and the
// remote processor host that lived on it.
func TestClient_LostConnectionIsDisconnected(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	px := newProxy(t, ts.addr)
	conn := dial(t, px.addr())
	p := conn.Login(ctx, ts.creds.ProjectToken)
	t.Cleanup(p.Release)
	s := stream(t, p, "/lost/calls")
	mustAppend(t, s, ev("a", `{}`))

	c, lv := openConnectionAndView(ctx, t, s)

	logs := make(chan string, 64)
	hostCtx, stopHost := context.WithCancel(context.Background())
	hostDone := make(chan struct{})
	mounted := make(chan struct{}, 16)
	go func() {
		defer close(hostDone)
		_ = remote.Run(hostCtx, remote.Config{Addr: px.addr(), Token: ts.creds.ProjectToken, Name: "lost",
			Host: referenceHost(t, "guestbook"), MinBackoff: time.Hour, MaxBackoff: time.Hour,
			Logf: func(f string, a ...any) {
				select {
				case logs <- fmt.Sprintf(f, a...):
				default:
				}
			},
			Mounted: func() { mounted <- struct{}{} }})
	}()
	t.Cleanup(func() { stopHost(); <-hostDone })
	awaitMount(t, mounted)

	// In flight when the connection goes: a barrier, and appends through an Appender.
	wait, releaseWait := s.WaitForEvent(ctx, func(p schema.Stream_waitForEvent_Params) error {
		p.SetAfter(1)
		p.SetTimeoutMs(25_000)
		pr, err := p.NewPredicate()
		if err != nil {
			return err
		}
		return wire.SetPredicate(pr, itx.Predicate{Types: []string{"never"}})
	})
	defer releaseWait()
	a := client.NewAppender(s, 4)
	futs := []*client.AppendFuture{}
	// A barrier answered after the wait was sent (calls on one capability arrive in order):
	// the wait is in flight at itxd before the cut.
	_, err := client.Describe(ctx, s)
	require.NoError(t, err)
	px.freeze()
	for range 3 {
		f, err := a.Append(ctx, []itx.EventInput{ev("b", `{}`)}, itx.AppendOptions{})
		require.NoError(t, err)
		futs = append(futs, f)
	}
	px.cut()
	_, err = client.Await(ctx, wait)
	requireDisconnected(t, "waitForEvent in flight", err)
	for _, f := range futs {
		_, err := f.Wait(ctx)
		requireDisconnected(t, "Appender's append in flight", err)
	}
	requireDisconnected(t, "Appender.Flush", a.Flush(ctx))
	<-conn.Done()

	// Made after it went.
	_, err = client.Append(ctx, s, []itx.EventInput{ev("c", `{}`)}, itx.AppendOptions{})
	requireDisconnected(t, "append", err)
	_, err = client.GetEventPage(ctx, s, itx.Query{})
	requireDisconnected(t, "getEventPage", err)
	_, err = client.OpenConnection(ctx, s, client.ConnectionOptions{}, client.ConnectionHandler{
		Deliver: func(context.Context, itx.DeliveryBatch) error { return nil }})
	requireDisconnected(t, "openConnection", err)
	_, err = client.WatchStream(ctx, s)
	requireDisconnected(t, "liveState", err)
	readers := client.Readers(ctx, s)
	defer readers.Release()
	requireDisconnected(t, "readers.register", client.RegisterReader(ctx, readers, "r", 0))
	_, err = client.ListReaders(ctx, readers)
	requireDisconnected(t, "readers.list", err)

	// What lived on it ends so too.
	<-c.Done()
	require.Equal(t, itx.EDisconnected, itx.ErrorCode(c.Err()), "connection: %v", c.Err())
	<-lv.Done()
	require.Equal(t, itx.EDisconnected, itx.ErrorCode(lv.Err()), "live view: %v", lv.Err())
	var closed *client.ConnectionClosed
	require.True(t, errors.As(lv.Err(), &closed))

	// The remote host logs the loss as disconnected, and will dial again.
	for {
		select {
		case line := <-logs:
			if strings.Contains(line, "reconnecting") {
				require.Contains(t, line, "itx.disconnected: ", line)
				return
			}
		case <-ctx.Done():
			t.Fatal("the remote host never logged its lost connection")
		}
	}
}

// A remote host whose connection goes silent after it mounted (a stalled proxy: TCP stays up,
// no byte of itxd's comes through): its ping goes unanswered, it takes the connection for lost
// and mounts again over a new one. Before, it stayed "mounted" on the silent connection for good.
func TestRemote_HostRedialsFromASilentConnection(t *testing.T) {
	ts := startServer(t, server.Config{})
	px := newProxy(t, ts.addr)
	logs := make(chan string, 64)
	mounted := make(chan struct{}, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = remote.Run(ctx, remote.Config{Addr: px.addr(), Token: ts.creds.ProjectToken, Name: "silent",
			Host: referenceHost(t, "guestbook"), MinBackoff: 10 * time.Millisecond,
			PingEvery: 50 * time.Millisecond, PingTimeout: 300 * time.Millisecond,
			Logf: func(f string, a ...any) {
				select {
				case logs <- fmt.Sprintf(f, a...):
				default:
				}
			},
			Mounted: func() { mounted <- struct{}{} }})
	}()
	t.Cleanup(func() { cancel(); <-done })
	awaitMount(t, mounted)
	px.stall()
	awaitMount(t, mounted)
	for {
		line := <-logs
		if strings.Contains(line, "reconnecting") {
			require.Contains(t, line, "itx.disconnected: itxd answered no ping for 300ms", line)
			break
		}
	}
}

// A connection that goes silent (a stalled proxy: TCP stays up, no byte of itxd's comes
// through) ends what the user opened on it: the Conn's watchdog pings itxd, takes the
// connection for lost once a ping goes unanswered, and closes it. The live Connection and the
// LiveView end with connectionLost (code disconnected), a call in flight fails disconnected,
// and Conn.Err says why. Before, their Done never closed: only a closed connection ended them.
func TestClient_SilentConnectionEndsWhatLivesOnIt(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	px := newProxy(t, ts.addr)
	conn, err := client.DialWith(ctx, px.addr(), client.Options{PingEvery: 50 * time.Millisecond, PingTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	p := conn.Login(ctx, ts.creds.ProjectToken)
	t.Cleanup(p.Release)
	s := stream(t, p, "/silent/views")
	mustAppend(t, s, ev("a", `{}`))

	c, lv := openConnectionAndView(ctx, t, s)

	px.stall()
	// In flight on the silent connection, with no deadline of its own.
	inFlight := make(chan error, 1)
	go func() {
		_, err := client.Describe(context.Background(), s)
		inFlight <- err
	}()
	for what, done := range map[string]<-chan struct{}{"the Conn": conn.Done(), "the Connection": c.Done(), "the LiveView": lv.Done()} {
		select {
		case <-done:
		case <-ctx.Done():
			t.Fatalf("%s never ended on the silent connection", what)
		}
	}
	require.Equal(t, itx.EDisconnected, itx.ErrorCode(conn.Err()), "Conn.Err: %v", conn.Err())
	require.Contains(t, conn.Err().Error(), "itxd answered no ping for 300ms")
	for what, err := range map[string]error{"connection": c.Err(), "live view": lv.Err()} {
		var closed *client.ConnectionClosed
		require.True(t, errors.As(err, &closed), "%s: %v", what, err)
		require.Equal(t, schema.CloseReason_connectionLost, closed.Why, what)
		require.Equal(t, itx.EDisconnected, itx.ErrorCode(err), "%s: %v", what, err)
	}
	select {
	case err := <-inFlight:
		requireDisconnected(t, "describe in flight", err)
	case <-ctx.Done():
		t.Fatal("a call in flight on the silent connection never returned")
	}
}

// A slow link carrying a large answer is not a silent one: the ping sent after the read waits
// behind the page's bytes for longer than PingTimeout, but bytes keep arriving, so the Conn's
// watchdog keeps the connection and the read completes. (Taking it for lost would fail every
// large read, and end every Connection and LiveView, on a link slower than its payload.)
func TestClient_SlowLinkIsNotSilent(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/slow/link")
	big := strings.Repeat("x", 100<<10)
	for range 8 {
		mustAppend(t, s, ev("big", fmt.Sprintf(`{"pad":%q}`, big)))
	}
	px := newProxy(t, ts.addr)
	px.small.Store(true)
	conn, err := client.DialWith(ctx, px.addr(), client.Options{PingEvery: 50 * time.Millisecond, PingTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	p := conn.Login(ctx, ts.creds.ProjectToken)
	t.Cleanup(p.Release)
	slow := stream(t, p, "/slow/link")
	_, err = client.Describe(ctx, slow)
	require.NoError(t, err)
	px.slow.Store(2 << 10) // about 200 KiB/s: the 800 KiB page takes about 4 s
	page, err := client.GetEventPage(ctx, slow, itx.Query{Limit: 8})
	require.NoError(t, err, "the read over the slow link")
	require.Len(t, page.Events, 8)
	// The other way: a large append, the ping queued behind it on the way to itxd.
	batch := make([]itx.EventInput, 8)
	for i := range batch {
		batch[i] = ev("big", fmt.Sprintf(`{"pad":%q}`, big))
	}
	res, err := client.Append(ctx, slow, batch, itx.AppendOptions{})
	require.NoError(t, err, "the append over the slow link")
	require.Len(t, res.Offsets, 8)
	require.Nil(t, conn.Err())
}

// openConnectionAndView opens a connection and a live view on s, both released at the test's end.
func openConnectionAndView(ctx context.Context, t *testing.T, s schema.Stream) (*client.Connection, *client.LiveView) {
	t.Helper()
	c, err := client.OpenConnection(ctx, s, client.ConnectionOptions{}, client.ConnectionHandler{
		Deliver: func(context.Context, itx.DeliveryBatch) error { return nil }})
	require.NoError(t, err)
	t.Cleanup(c.Release)
	lv, err := client.WatchStream(ctx, s)
	require.NoError(t, err)
	t.Cleanup(func() { lv.Cancel(context.Background()) })
	return c, lv
}
