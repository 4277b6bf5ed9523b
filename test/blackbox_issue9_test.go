package test

// Black-box probes of issue 9 (live connections, registered readers, live state) over real RPC
// against a real itxd, written from the issue text and the schema alone. The other probes made
// (caps, refused opens, replace and collisions, close reasons, slow consumers, readers across a
// restart, live-state patches and coalescing, state frames, ephemeral catch-up, attenuations,
// racing opens) passed and repeat existing tests; this one covers what none did.

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// bb9Sink is a raw EventSink recording the offsets and close reasons the server sends.
type bb9Sink struct {
	mu      sync.Mutex
	offsets []int64
	closed  []schema.CloseReason
	changed chan struct{}
}

func newBB9Sink() *bb9Sink { return &bb9Sink{changed: make(chan struct{}, 1)} }

func (k *bb9Sink) poke() {
	select {
	case k.changed <- struct{}{}:
	default:
	}
}

func (k *bb9Sink) Deliver(ctx context.Context, call schema.EventSink_deliver) error {
	b, err := call.Args().Batch()
	if err != nil {
		return err
	}
	evs, err := b.Events()
	if err != nil {
		return err
	}
	k.mu.Lock()
	for i := 0; i < evs.Len(); i++ {
		k.offsets = append(k.offsets, int64(evs.At(i).Offset()))
	}
	k.mu.Unlock()
	k.poke()
	return nil
}

func (k *bb9Sink) Closed(ctx context.Context, call schema.EventSink_closed) error {
	k.mu.Lock()
	k.closed = append(k.closed, call.Args().Why())
	k.mu.Unlock()
	k.poke()
	return nil
}

func (k *bb9Sink) State(ctx context.Context, call schema.EventSink_state) error { return nil }

// waitFor waits until cond holds (checked under the sink's lock) or fails the test.
func (k *bb9Sink) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		k.mu.Lock()
		ok := cond()
		k.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-k.changed:
		case <-deadline:
			k.mu.Lock()
			defer k.mu.Unlock()
			t.Fatalf("timed out waiting for %s: offsets %v closed %v", what, k.offsets, k.closed)
		}
	}
}

// bb9Open opens a connection under key after offset after, expecting stream id wantID ("": any).
func bb9Open(ctx context.Context, s schema.Stream, key string, after uint64, wantID string, k *bb9Sink) (schema.Connection, error) {
	fut, release := s.OpenConnection(ctx, func(p schema.Stream_openConnection_Params) error {
		o, err := p.NewOptions()
		if err != nil {
			return err
		}
		o.SetAfter(after)
		o.SetNoState(true)
		if err := o.SetKey(key); err != nil {
			return err
		}
		if err := o.SetExpectedStreamId(wantID); err != nil {
			return err
		}
		return p.SetSink(schema.EventSink_ServerToClient(k))
	})
	defer release()
	res, err := client.Await(ctx, fut)
	if err != nil {
		return schema.Connection{}, err
	}
	return res.Connection().AddRef(), nil
}

func bb9Ping(ctx context.Context, c schema.Connection) error {
	fut, release := c.Ping(ctx, nil)
	defer release()
	_, err := client.Await(ctx, fut)
	return err
}

// A client back after a reconnect reopens its key from a new RPC session with the same token:
// an open refused because the path holds another stream than expectedStreamId (notFound)
// leaves the first session's connection as it was, as any refused open does; an accepted one
// replaces it (replaced, then failedPrecondition for its ping).
func TestBBIssue9_ReopenFromAnotherSession(t *testing.T) {
	ctx := ctxT(t)
	ts := startServer(t, server.Config{})
	s1 := stream(t, ts.project(t), "/bb9/resess")
	mustAppend(t, s1, ev("t", `{}`))
	s2 := stream(t, ts.project(t), "/bb9/resess") // another RPC session, the same token
	a := newBB9Sink()
	ca, err := bb9Open(ctx, s1, "k", 0, "", a)
	require.NoError(t, err)
	defer ca.Release()
	a.waitFor(t, "the first connection's catch-up", func() bool { return len(a.offsets) == 1 })

	_, err = bb9Open(ctx, s2, "k", 0, "not-this-stream", newBB9Sink())
	requireCode(t, err, itx.ENotFound)
	require.NoError(t, bb9Ping(ctx, ca), "a refused open leaves the connection under its key open")
	mustAppend(t, s1, ev("t", `{}`))
	a.waitFor(t, "delivery after the refused open", func() bool { return len(a.offsets) == 2 })

	b := newBB9Sink()
	cb, err := bb9Open(ctx, s2, "k", 2, "", b)
	require.NoError(t, err)
	defer cb.Release()
	a.waitFor(t, "the first connection replaced", func() bool { return len(a.closed) > 0 })
	mustAppend(t, s1, ev("t", `{}`))
	b.waitFor(t, "the new connection's delivery", func() bool { return len(b.offsets) == 1 })
	a.mu.Lock()
	require.Equal(t, []schema.CloseReason{schema.CloseReason_replaced}, a.closed)
	require.Equal(t, []int64{1, 2}, a.offsets, "a replaced connection receives nothing more")
	a.mu.Unlock()
	requireCode(t, bb9Ping(ctx, ca), itx.EFailedPrecondition)
}
