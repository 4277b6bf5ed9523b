package test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// followed records what Follow delivered.
type followed struct {
	mu      sync.Mutex
	offsets []int64
}

func (f *followed) deliver(_ context.Context, b itx.DeliveryBatch) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range b.Events {
		f.offsets = append(f.offsets, e.Offset)
	}
	return nil
}

func (f *followed) got() []int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int64(nil), f.offsets...)
}

func appendAt(t *testing.T, addr, token, path string, n int) int64 {
	t.Helper()
	s := stream(t, dial(t, addr).Login(ctxT(t), token), path)
	var head int64
	for i := range n {
		head = mustAppend(t, s, ev("e", fmt.Sprintf(`{"i": %d}`, i))).HeadOffset
	}
	return head
}

// client.Follow delivers every event after its start once, in order, across an itxd killed
// (kill -9) and one stopped (SIGTERM) and each started again on the same address, reconnecting
// after the last offset delivered; cancelling its context returns that offset.
func TestClientFollow_AcrossRestarts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	addr := freeAddr(t)
	p := startItxd(t, dir, "--listen", addr)
	token := p.creds.ProjectToken
	appendAt(t, addr, token, "/follow", 20)

	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	var f followed
	var connected atomic.Int32
	type result struct {
		last int64
		err  error
	}
	done := make(chan result, 1)
	go func() {
		last, err := client.Follow(ctx, client.FollowConfig{Addr: addr, Token: token, Path: "/follow",
			Connection: client.ConnectionOptions{After: 5, MaxDeliveryEvents: 3}, MinBackoff: 10 * time.Millisecond,
			Connected: func() { connected.Add(1) }, Logf: t.Logf, Reader: "follower", ReaderInterval: 20 * time.Millisecond}, f.deliver)
		done <- result{last, err}
	}()
	waitUntil(t, "the catch-up", func() bool { return len(f.got()) == 15 })

	p.kill9(t)
	p = startItxd(t, dir, "--listen", addr)
	head := appendAt(t, addr, token, "/follow", 10)
	waitUntil(t, "the events after the kill", func() bool { return len(f.got()) == int(head-5) })
	waitUntil(t, "a second connection", func() bool { return connected.Load() >= 2 })

	require.NoError(t, p.stop(t))
	p = startItxd(t, dir, "--listen", addr)
	head = appendAt(t, addr, token, "/follow", 4)
	waitUntil(t, "the events after the stop", func() bool { return len(f.got()) == int(head-5) })
	waitUntil(t, "a third connection", func() bool { return connected.Load() >= 3 })
	require.Equal(t, offsetsFrom(6, head), f.got(), "each event once, in order")
	// Its reader shows where it stands.
	readers := client.Readers(ctxT(t), stream(t, dial(t, addr).Login(ctxT(t), token), "/follow"))
	defer readers.Release()
	waitUntil(t, "the reader's checkpoint at the head", func() bool {
		list, err := client.ListReaders(ctxT(t), readers)
		require.NoError(t, err)
		return len(list) == 1 && list[0].Name == "follower" && list[0].Checkpoint == head
	})

	cancel()
	r := <-done
	require.ErrorIs(t, r.err, context.Canceled)
	require.Equal(t, head, r.last)
}

// Follow's reader takes the last offset delivered when it stops (however short its interval
// would have been), and a reader name the stream refuses (a subscription's) stops it at once.
func TestClientFollow_Reader(t *testing.T) {
	p := startItxd(t, filepath.Join(t.TempDir(), "data"))
	token := p.creds.ProjectToken
	head := appendAt(t, p.addr, token, "/reader", 5)
	ctx := ctxT(t)
	s := stream(t, dial(t, p.addr).Login(ctx, token), "/reader")
	cfg := client.FollowConfig{Addr: p.addr, Token: token, Path: "/reader", Reader: "mirror", ReaderInterval: time.Hour,
		Connection: client.ConnectionOptions{MaxDeliveryEvents: 1}}
	stop := errors.New("enough")
	last, err := client.Follow(ctx, cfg, func(_ context.Context, b itx.DeliveryBatch) error {
		if b.Events[len(b.Events)-1].Offset < head {
			return nil
		}
		return stop
	})
	require.ErrorIs(t, err, stop)
	require.Equal(t, head-1, last)
	list, err := client.ListReaders(ctx, client.Readers(ctx, s))
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, last, list[0].Checkpoint, "the checkpoint is the last offset delivered")

	// Resumed from its reader: the next event is the one after the checkpoint.
	rctx, cancel := context.WithCancel(ctx)
	resumed := cfg
	resumed.Resume = true
	var first int64
	last, err = client.Follow(rctx, resumed, func(_ context.Context, b itx.DeliveryBatch) error {
		if first == 0 {
			first = b.Events[0].Offset
		}
		cancel()
		return nil
	})
	cancel()
	require.ErrorIs(t, err, context.Canceled)
	requireCode(t, err, itx.ECancelled) // a code like every other call's end with its context
	require.Equal(t, head, first, "resumed after the reader's checkpoint")
	require.Equal(t, head, last)
	noReader := cfg
	noReader.Reader, noReader.Resume = "", true
	_, err = client.Follow(ctx, noReader, func(context.Context, itx.DeliveryBatch) error { return nil })
	require.Equal(t, itx.EInvalid, itx.ErrorCode(err), "%v", err)

	_, _, err = client.ConfigureSubscription(ctx, client.Subscriptions(ctx, s),
		client.SubscriptionConfig{Name: "taken", Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/reader-copy"}})
	require.NoError(t, err)
	cfg.Reader = "taken"
	_, err = client.Follow(ctx, cfg, func(context.Context, itx.DeliveryBatch) error { return nil })
	require.Equal(t, itx.EFailedPrecondition, itx.ErrorCode(err), "%v", err)
}

// Follow stops, without retrying, on what a new connection would not change: a refused login,
// its connection replaced under its key, and deliver's own failure (returning the offset before
// the failing batch, from which a later Follow resumes).
func TestClientFollow_Stops(t *testing.T) {
	p := startItxd(t, filepath.Join(t.TempDir(), "data"))
	token := p.creds.ProjectToken
	head := appendAt(t, p.addr, token, "/stops", 6)
	ctx := ctxT(t)
	cfg := client.FollowConfig{Addr: p.addr, Token: token, Path: "/stops", MinBackoff: 10 * time.Millisecond}

	bad := cfg
	bad.Token = "itx_not-a-token"
	_, err := client.Follow(ctx, bad, func(context.Context, itx.DeliveryBatch) error { return nil })
	require.Equal(t, itx.EUnauthenticated, itx.ErrorCode(err), "%v", err)

	failing := cfg
	failing.Connection.MaxDeliveryEvents = 2
	boom := errors.New("the receiver's own failure")
	var seen []int64
	last, err := client.Follow(ctx, failing, func(_ context.Context, b itx.DeliveryBatch) error {
		if b.Events[0].Offset > 2 {
			return boom
		}
		for _, e := range b.Events {
			seen = append(seen, e.Offset)
		}
		return nil
	})
	require.ErrorIs(t, err, boom)
	require.Equal(t, int64(2), last)
	require.Equal(t, []int64{1, 2}, seen)
	var f followed
	resumed := cfg
	resumed.Connection.After = last
	resumed.Connection.Key = "follower"
	type result struct {
		last int64
		err  error
	}
	done := make(chan result, 1)
	go func() {
		last, err := client.Follow(ctx, resumed, f.deliver)
		done <- result{last, err}
	}()
	waitUntil(t, "the rest", func() bool { return len(f.got()) == int(head-2) })
	require.Equal(t, offsetsFrom(3, head), f.got())

	// Another connection under its key replaces Follow's: it stops with replaced.
	s := stream(t, dial(t, p.addr).Login(ctx, token), "/stops")
	c, err := client.OpenConnection(ctx, s, client.ConnectionOptions{Key: "follower", After: head},
		client.ConnectionHandler{Deliver: func(context.Context, itx.DeliveryBatch) error { return nil }})
	require.NoError(t, err)
	defer c.Release()
	r := <-done
	var cc *client.ConnectionClosed
	require.ErrorAs(t, r.err, &cc)
	require.Equal(t, schema.CloseReason_replaced, cc.Why)
	require.Equal(t, head, r.last)
}

// A stream deleted and created again under its path while Follow was away (a partition here)
// is another stream: its offsets start over at 1, so opening "after the last offset delivered"
// on it would skip its first events and deliver the rest as if they followed the old ones (with
// 5 new events), or fail naming an offset past its head (with 1, or none). Follow stops instead,
// as when it hears streamRemoved, with the last offset of the stream it followed, delivering
// nothing of the new one.
func TestClientFollow_StopsAtAStreamCreatedAgain(t *testing.T) {
	for _, created := range []int{5, 1, 0} {
		t.Run(fmt.Sprintf("%d new events", created), func(t *testing.T) {
			ts := startServer(t, server.Config{})
			ctx := ctxT(t)
			p := ts.project(t)
			s := stream(t, p, "/again")
			mustAppend(t, s, ev("old", `{}`), ev("old", `{}`), ev("old", `{}`))
			var down atomic.Bool
			px := newGatedProxy(t, ts.addr, &down)
			var f followed
			var ids sync.Map
			type result struct {
				last int64
				err  error
			}
			done := make(chan result, 1)
			go func() {
				last, err := client.Follow(ctx, client.FollowConfig{Addr: px.addr(), Token: ts.creds.ProjectToken, Path: "/again",
					MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, Logf: t.Logf,
					Reader: "mirror", ReaderInterval: time.Millisecond},
					func(ctx context.Context, b itx.DeliveryBatch) error {
						ids.Store(b.StreamID, true)
						return f.deliver(ctx, b)
					})
				done <- result{last, err}
			}()
			waitUntil(t, "the old stream's events", func() bool { return len(f.got()) == 3 })

			down.Store(true)
			px.cut()
			_, err := client.DeleteStream(ctx, p, "/again", true)
			require.NoError(t, err)
			for range created {
				mustAppend(t, s, ev("new", `{}`))
			}
			down.Store(false)

			var r result
			waitUntil(t, "Follow stopped, or went on on the new stream", func() bool {
				select {
				case r = <-done:
					return true
				default:
					return len(f.got()) > 3
				}
			})
			require.Equal(t, []int64{1, 2, 3}, f.got(), "nothing of the new stream is delivered")
			if r.err == nil {
				r = <-done
			}
			require.Equal(t, int64(3), r.last)
			var cc *client.ConnectionClosed
			require.ErrorAs(t, r.err, &cc)
			require.Equal(t, schema.CloseReason_streamRemoved, cc.Why, "%v", r.err)
			n := 0
			ids.Range(func(any, any) bool { n++; return true })
			require.Equal(t, 1, n, "batches of one stream only")
			// Nor is its reader's checkpoint, an offset of the old stream, registered on the new
			// one (a Follow resumed from it would skip the new stream's first events).
			if created > 0 {
				readers, err := client.ListReaders(ctx, client.Readers(ctx, s))
				require.NoError(t, err)
				require.Empty(t, readers)
			}
		})
	}
}

// A Follow given the StreamID its offset belongs to (saved with the last offset a previous
// Follow delivered) stops at once on another stream at the path, instead of taking it up.
func TestClientFollow_StreamIDOfAPreviousRun(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	s := stream(t, p, "/previous")
	old := mustAppend(t, s, ev("old", `{}`), ev("old", `{}`))
	_, err := client.DeleteStream(ctx, p, "/previous", true)
	require.NoError(t, err)
	mustAppend(t, s, ev("new", `{}`), ev("new", `{}`), ev("new", `{}`))
	// The stream named by FollowConfig.StreamID, or by Connection.ExpectedStreamID (it was
	// overwritten with the empty id of a Follow that had not learnt one: Follow went on after 2
	// on the new stream, skipping its first events).
	for _, cfg := range []client.FollowConfig{
		{StreamID: old.StreamID, Connection: client.ConnectionOptions{After: 2}},
		{Connection: client.ConnectionOptions{After: 2, ExpectedStreamID: old.StreamID}},
	} {
		cfg.Addr, cfg.Token, cfg.Path = ts.addr, ts.creds.ProjectToken, "/previous"
		var f followed
		last, err := client.Follow(ctx, cfg, f.deliver)
		var cc *client.ConnectionClosed
		require.ErrorAs(t, err, &cc)
		require.Equal(t, schema.CloseReason_streamRemoved, cc.Why, "%v", err)
		require.Equal(t, int64(2), last)
		require.Empty(t, f.got())
	}
	_, err = client.Follow(ctx, client.FollowConfig{Addr: ts.addr, Token: ts.creds.ProjectToken, Path: "/previous",
		StreamID: old.StreamID, Connection: client.ConnectionOptions{ExpectedStreamID: "another"}}, func(context.Context, itx.DeliveryBatch) error { return nil })
	requireCode(t, err, itx.EInvalid)
}

// newGatedProxy is a TCP relay to target that, while down is set, closes every connection it
// accepts at once (a partition a client keeps redialing into).
func newGatedProxy(t testing.TB, target string, down *atomic.Bool) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	px := &proxy{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if down.Load() {
				c.Close()
				continue
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			px.mu.Lock()
			px.conns = append(px.conns, c, up)
			px.mu.Unlock()
			go func() { io.Copy(up, c); up.Close() }()
			go func() { io.Copy(c, up); c.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close(); px.cut() })
	return px
}

// An itxd that holds Follow's connection open and answers nothing (a stalled proxy between
// them: TCP keepalive is answered, no byte of itxd's comes through): Follow's ping goes
// unanswered, it takes the connection for lost and dials again, and delivers what was appended
// meanwhile, each event once. Before, it waited for a batch for as long as its context lasted.
func TestClientFollow_ReconnectsFromASilentConnection(t *testing.T) {
	ts := startServer(t, server.Config{})
	px := newProxy(t, ts.addr)
	s := stream(t, ts.project(t), "/follow/silent")
	mustAppend(t, s, ev("e", `{}`), ev("e", `{}`))
	var f followed
	logs := make(chan string, 64)
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan struct{})
	go func() {
		defer close(done)
		client.Follow(ctx, client.FollowConfig{Addr: px.addr(), Token: ts.creds.ProjectToken, Path: "/follow/silent",
			PingEvery: 50 * time.Millisecond, PingTimeout: 300 * time.Millisecond, MinBackoff: 10 * time.Millisecond,
			Logf: func(format string, args ...any) {
				select {
				case logs <- fmt.Sprintf(format, args...):
				default:
				}
			}}, f.deliver)
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitUntil(t, "the first two events", func() bool { return len(f.got()) == 2 })
	px.stall()
	mustAppend(t, s, ev("e", `{}`), ev("e", `{}`))
	waitUntil(t, "the events appended while the connection was silent", func() bool { return len(f.got()) == 4 })
	require.Equal(t, []int64{1, 2, 3, 4}, f.got())
	for line := range logs {
		if strings.Contains(line, "reconnecting") {
			require.Contains(t, line, "itx.disconnected: itxd answered no ping for 300ms")
			break
		}
	}
}
