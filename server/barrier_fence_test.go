package server

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
	"github.com/stretchr/testify/require"
)

// gatedBackend holds the next commit of any of its streams, once armed, until released: the
// actor then gathers whatever is queued meanwhile into one step.
type gatedBackend struct {
	sqliteBackend
	armed            atomic.Bool
	entered, release chan struct{}
}

type gatedStore struct {
	streamStore
	b *gatedBackend
}

func (b *gatedBackend) wrap(st streamStore, err error) (streamStore, error) {
	if st == nil || err != nil {
		return st, err
	}
	return gatedStore{st, b}, nil
}

func (b *gatedBackend) Create(ctx context.Context, meta storage.StreamMeta) (streamStore, error) {
	return b.wrap(b.sqliteBackend.Create(ctx, meta))
}

func (b *gatedBackend) Open(ctx context.Context, streamID string) (streamStore, error) {
	return b.wrap(b.sqliteBackend.Open(ctx, streamID))
}

func (g gatedStore) Commit(ctx context.Context, c storage.Commit) error {
	if g.b.armed.CompareAndSwap(true, false) {
		close(g.b.entered)
		<-g.b.release
	}
	return g.streamStore.Commit(ctx, c)
}

// timerSpy tells when a timer of one duration is armed: a barrier arms its timeout first.
type timerSpy struct {
	itx.SystemClock
	d     time.Duration
	once  sync.Once
	armed chan struct{}
}

func (c *timerSpy) AfterFunc(d time.Duration, f func()) itx.Timer {
	if d == c.d {
		c.once.Do(func() { close(c.armed) })
	}
	return c.SystemClock.AfterFunc(d, f)
}

// A barrier on a subscription removed while it waits never answers for a registered reader that
// took the name in the same commit (seed 000: names bind, epochs fence; a reader is no occupant
// of the subscription the barrier waited on). It answered the reader's checkpoint, though the
// subscription had processed nothing.
func TestWaitUntilProcessed_SubscriptionReplacedByAReaderInOneCommit(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	const timeout = 37 * time.Second
	clock := &timerSpy{d: timeout, armed: make(chan struct{})}
	s, projectID := mustOpen(t, Config{DataDir: dir, Clock: clock})
	gate := &gatedBackend{sqliteBackend: sqliteBackend{dir: filepath.Join(dir, "streams")}, entered: make(chan struct{}), release: make(chan struct{})}
	s.backend = gate
	ref := StreamRef{ProjectID: projectID, Path: "/fenced"}

	// A remote processor no host serves: its cursor stays at 0.
	_, _, err := s.ConfigureSubscription(ctx, ref, itx.SubscriptionConfig{Name: "w",
		Receiver: itx.Receiver{Action: itx.KindProcessorWake, Placement: "remote"}}, "")
	require.NoError(t, err)
	res, err := s.Append(ctx, ref, []itx.EventInput{{Type: "x"}, {Type: "x"}}, itx.AppendOptions{})
	require.NoError(t, err)
	target := res.HeadOffset

	type answer struct {
		offset int64
		err    error
	}
	got := make(chan answer, 1)
	go func() {
		o, err := s.WaitUntilProcessed(ctx, ref, "w", target, timeout)
		got <- answer{o, err}
	}()
	<-clock.armed // the barrier is in; a commit more lets it see the subscription
	res, err = s.Append(ctx, ref, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
	require.NoError(t, err)

	// Hold the actor in a commit while the removal and the reader's registration queue: they
	// are decided in one step, so no view without "w" is ever published between them.
	gate.armed.Store(true)
	held, err := s.StartAppend(ctx, ref, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
	require.NoError(t, err)
	<-gate.entered
	removal, err := s.StartRemoveSubscription(ctx, ref, "w")
	require.NoError(t, err)
	reader, err := s.StartRegisterReader(ctx, ref, "w", res.HeadOffset)
	require.NoError(t, err)
	close(gate.release)
	_, err = held.Wait(ctx)
	require.NoError(t, err)
	_, _, err = removal.Wait(ctx)
	require.NoError(t, err)
	require.NoError(t, reader.Wait(ctx))

	select {
	case a := <-got:
		require.Error(t, a.err, "answered %d for a subscription that processed nothing", a.offset)
		require.Equal(t, itx.ENotFound, itx.AsError(a.err).Code, "%v", a.err)
	case <-time.After(timeout / 2):
		t.Fatal("the barrier still waits after its subscription was removed")
	}
}
