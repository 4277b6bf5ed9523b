package test

// A client's walk through live connections and live state: what a dashboard and a mirror
// depend on, over real RPC.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// strictView records every frame and checks each as it arrives.
type strictView struct {
	mu        sync.Mutex
	rev       uint64
	doc       []byte
	snapshots int
	patches   int
	problems  []string
	closed    *schema.CloseReason
	changed   chan struct{}
}

func newStrictView() *strictView { return &strictView{changed: make(chan struct{}, 1)} }

func (v *strictView) sig() {
	select {
	case v.changed <- struct{}{}:
	default:
	}
}

func (v *strictView) Snapshot(ctx context.Context, call schema.LiveSubscriber_snapshot) error {
	st, _ := call.Args().State()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed != nil {
		v.problems = append(v.problems, "snapshot after closed")
	}
	if v.rev != 0 && call.Args().Revision() <= v.rev {
		v.problems = append(v.problems, fmt.Sprintf("snapshot revision %d after %d", call.Args().Revision(), v.rev))
	}
	v.rev, v.doc = call.Args().Revision(), []byte(st)
	v.snapshots++
	v.sig()
	return nil
}

func (v *strictView) Patch(ctx context.Context, call schema.LiveSubscriber_patch) error {
	ops, _ := call.Args().Ops()
	v.mu.Lock()
	defer v.mu.Unlock()
	v.patches++
	if v.closed != nil {
		v.problems = append(v.problems, "patch after closed")
	}
	if call.Args().Revision() != v.rev+1 {
		v.problems = append(v.problems, fmt.Sprintf("patch revision %d after %d", call.Args().Revision(), v.rev))
	}
	p, err := jsonpatch.DecodePatch([]byte(ops))
	if err != nil {
		v.problems = append(v.problems, "decode: "+err.Error())
		return nil
	}
	if len(p) == 0 {
		v.problems = append(v.problems, fmt.Sprintf("empty patch at %d", call.Args().Revision()))
	}
	doc, err := p.Apply(v.doc)
	if err != nil {
		v.problems = append(v.problems, fmt.Sprintf("apply %s to %s: %v", ops, v.doc, err))
		return nil
	}
	v.rev, v.doc = call.Args().Revision(), doc
	v.sig()
	return nil
}

func (v *strictView) Closed(ctx context.Context, call schema.LiveSubscriber_closed) error {
	why := call.Args().Why()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed != nil {
		v.problems = append(v.problems, "closed twice")
	}
	v.closed = &why
	v.sig()
	return nil
}

func (v *strictView) state() (uint64, itx.LiveStreamState, []string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	var st itx.LiveStreamState
	_ = json.Unmarshal(v.doc, &st)
	return v.rev, st, append([]string(nil), v.problems...)
}

func (v *strictView) raw() (uint64, string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.rev, string(v.doc)
}

func attachStrict(t *testing.T, s schema.Stream) (*strictView, schema.Handle) {
	t.Helper()
	v := newStrictView()
	fut, release := s.LiveState(context.Background(), func(p schema.Stream_liveState_Params) error {
		return p.SetSubscriber(schema.LiveSubscriber_ServerToClient(v))
	})
	defer release()
	res, err := fut.Struct()
	require.NoError(t, err)
	h := res.Handle().AddRef()
	t.Cleanup(h.Release)
	waitUntil(t, "first snapshot", func() bool { r, _ := v.raw(); return r > 0 })
	return v, h
}

// Names holding JSON Pointer's special characters ('/', '~') in every map of the live state.
func TestLiveWalk_LivePatchesWithPointerCharacters(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	s := stream(t, p, "/zz/ptr")
	mustAppend(t, s, ev("a", `{}`))
	v, _ := attachStrict(t, s)
	ctx := ctxT(t)
	readers := client.Readers(ctx, s)
	defer readers.Release()
	names := []string{"a/b", "c~d", "~1", "/", "~0~1/", "e~"}
	for i, n := range names {
		require.NoError(t, client.RegisterReader(ctx, readers, "r"+n, 1))
		_, err := openConn(t, s, connOpts{key: "k" + n, noState: true}, newTestSink())
		require.NoError(t, err)
		mustAppend(t, s, ev("a", fmt.Sprintf(`{"i":%d}`, i)))
		require.NoError(t, client.RegisterReader(ctx, readers, "r"+n, int64(i+2)))
	}
	head := mustDescribe(t, s).HeadOffset
	waitUntil(t, "converged", func() bool {
		_, st, probs := v.state()
		if len(probs) > 0 {
			return true
		}
		return st.Head == head && len(st.Readers) == len(names) && len(st.Connections) == len(names) &&
			st.Readers["r"+names[len(names)-1]].Checkpoint == int64(len(names)+1)
	})
	_, st, probs := v.state()
	require.Empty(t, probs)
	fresh, _ := attachStrict(t, s)
	_, fst, _ := fresh.state()
	require.Equal(t, fst, st)
	for _, n := range names {
		require.Contains(t, st.Readers, "r"+n)
		require.Contains(t, st.Connections, "k"+n)
	}
}

// A connection's own delivered position shows in the live state as it moves, and every
// connection's row goes when it closes; the patches always apply.
func TestLiveWalk_LiveConnectionDeliveredMoves(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	s := stream(t, p, "/zz/deliv")
	mustAppend(t, s, ev("a", `{}`))
	v, _ := attachStrict(t, s)
	sink := newTestSink()
	c, err := openConn(t, s, connOpts{key: "mirror", noState: true}, sink)
	require.NoError(t, err)
	for i := range 20 {
		mustAppend(t, s, ev("a", fmt.Sprintf(`{"i":%d}`, i)))
	}
	head := mustDescribe(t, s).HeadOffset
	waitUntil(t, "delivered", func() bool {
		_, st, _ := v.state()
		return st.Connections["mirror"].Delivered == head && st.Head == head
	})
	fut, release := c.Close(context.Background(), func(p schema.Connection_close_Params) error { return p.SetReason("bye") })
	_, err = fut.Struct()
	release()
	require.NoError(t, err)
	waitUntil(t, "row gone", func() bool {
		_, st, _ := v.state()
		return len(st.Connections) == 0 && st.ConnectionsOpen == 0
	})
	_, _, probs := v.state()
	require.Empty(t, probs)
	// close is answered once the stream let the connection go; the sink's closed notice is a
	// call of its own, which may still be on its way.
	waitUntil(t, "sink told", func() bool { return sink.closeReason() != nil })
	require.Equal(t, schema.CloseReason_closedByClient, *sink.closeReason())
}

// SIGTERM of a real itxd: an open connection's sink and a live view each hear
// serverShuttingDown, and what the sink got is a gapless, duplicate-free run from its offset.
func TestLiveWalk_SigtermTellsSinksAndViews(t *testing.T) {
	proc := startItxd(t, t.TempDir())
	c := dial(t, proc.addr)
	p := c.Login(context.Background(), proc.creds.ProjectToken)
	defer p.Release()
	s := stream(t, p, "/zz/term")
	for i := range 50 {
		mustAppend(t, s, ev("a", fmt.Sprintf(`{"i":%d}`, i)))
	}
	v, _ := attachStrict(t, s)
	sink := newTestSink()
	_, err := openConn(t, s, connOpts{after: 10, key: "m"}, sink)
	require.NoError(t, err)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := client.Append(context.Background(), s, []itx.EventInput{ev("b", `{}`)}, itx.AppendOptions{}); err != nil {
				return
			}
		}
	})
	waitUntil(t, "some tail", func() bool { return len(sink.offsets()) > 100 })
	require.NoError(t, proc.stop(t))
	close(stop)
	wg.Wait()
	waitUntil(t, "sink told", func() bool { return sink.closeReason() != nil })
	require.Equal(t, schema.CloseReason_serverShuttingDown, *sink.closeReason())
	waitUntil(t, "view told", func() bool { v.mu.Lock(); defer v.mu.Unlock(); return v.closed != nil })
	require.Equal(t, schema.CloseReason_serverShuttingDown, *v.closed)
	offs := sink.offsets()
	for i, o := range offs {
		require.Equal(t, int64(11+i), o)
	}
	_, _, probs := v.state()
	require.Empty(t, probs)
}

// includeEphemeral with a types filter: catch-up brings the buffered ephemeral events of the
// filtered types only; without includeEphemeral, only those appended while open.
func TestLiveWalk_EphemeralAndTypes(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	ephem := func(typ string) itx.EventInput { e := ev(typ, `{}`); e.Ephemeral = true; return e }
	for _, inc := range []bool{true, false} {
		s := stream(t, p, fmt.Sprintf("/zz/eph-%v", inc))
		mustAppend(t, s, ev("a", `{}`), ephem("a"), ephem("b"), ev("b", `{}`), ev("a", `{}`)) // 1..5
		sink := newTestSink()
		_, err := openConn(t, s, connOpts{after: 1, includeEphemeral: inc, types: []string{"a"}, noState: true}, sink)
		require.NoError(t, err)
		want := []int64{5}
		if inc {
			want = []int64{2, 5}
		}
		waitUntil(t, "catch-up", func() bool { return len(sink.offsets()) >= len(want) })
		res := mustAppend(t, s, ephem("a"), ephem("b"), ev("b", `{}`), ev("a", `{}`))
		first := res.Offsets[0]
		want = append(want, first, first+3)
		waitUntil(t, "tail", func() bool { o := sink.offsets(); return len(o) > 0 && o[len(o)-1] >= first+3 })
		require.Equal(t, want, sink.offsets(), "includeEphemeral=%v", inc)
	}
}

// A view's place under the per-stream bound comes back when its handle is released; a view
// the client cancelled hears nothing when the stream is removed afterwards.
func TestLiveWalk_ViewReleaseAndCancel(t *testing.T) {
	ts := startServer(t, server.Config{MaxLiveSubscribersPerStream: 1})
	p := ts.project(t)
	s := stream(t, p, "/zz/rel")
	mustAppend(t, s, ev("a", `{}`))
	v1, h1 := attachStrict(t, s)
	v2 := newStrictView()
	fut, release := s.LiveState(context.Background(), func(p schema.Stream_liveState_Params) error {
		return p.SetSubscriber(schema.LiveSubscriber_ServerToClient(v2))
	})
	_, err := fut.Struct()
	release()
	requireCode(t, err, itx.ELimitExceeded)
	cf, crel := h1.Cancel(context.Background(), nil)
	_, err = cf.Struct()
	crel()
	require.NoError(t, err)
	v3, h3 := attachStrict(t, s)
	h3.Release()
	var v4 *strictView
	waitUntil(t, "place given back on release", func() bool {
		v := newStrictView()
		fut, release := s.LiveState(context.Background(), func(p schema.Stream_liveState_Params) error {
			return p.SetSubscriber(schema.LiveSubscriber_ServerToClient(v))
		})
		res, err := fut.Struct()
		if err == nil {
			h := res.Handle().AddRef()
			t.Cleanup(h.Release)
			v4 = v
		}
		release()
		return err == nil
	})
	waitUntil(t, "v4 snapshot", func() bool { r, _ := v4.raw(); return r > 0 })
	_, err = client.DeleteStream(ctxT(t), p, "/zz/rel", true)
	require.NoError(t, err)
	waitUntil(t, "v4 told", func() bool { v4.mu.Lock(); defer v4.mu.Unlock(); return v4.closed != nil })
	require.Equal(t, schema.CloseReason_streamRemoved, *v4.closed)
	for _, v := range []*strictView{v1, v3} {
		v.mu.Lock()
		require.Nil(t, v.closed)
		v.mu.Unlock()
	}
}

// Connections at random offsets, with random type filters, caps and includeEphemeral, opened
// while mixed durable and ephemeral appends race: each gets exactly what the docs promise.
func TestLiveWalk_MixedRace(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	s := stream(t, p, "/zz/mixed")
	mustAppend(t, s, ev("a", `{}`))
	rng := rand.New(rand.NewPCG(3, 17))
	type rec struct {
		typ   string
		ephem bool
	}
	var mu sync.Mutex
	log := map[int64]rec{1: {"a", false}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		r := rand.New(rand.NewPCG(5, 9))
		for i := 0; i < 150; i++ {
			n := 1 + r.IntN(6)
			var evs []itx.EventInput
			for range n {
				e := ev([]string{"a", "b", "c"}[r.IntN(3)], fmt.Sprintf(`{"i":%d}`, i))
				e.Ephemeral = r.IntN(3) == 0
				evs = append(evs, e)
			}
			res, err := client.Append(context.Background(), s, evs, itx.AppendOptions{})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			for j, o := range res.Offsets {
				log[o] = rec{evs[j].Type, evs[j].Ephemeral}
			}
			mu.Unlock()
		}
	}()
	type opened struct {
		after int64
		inc   bool
		types []string
		sink  *testSink
	}
	var conns []opened
	for i := 0; i < 24; i++ {
		head := mustDescribe(t, s).HeadOffset
		o := opened{after: rng.Int64N(head + 1), inc: rng.IntN(2) == 0, sink: newTestSink()}
		switch rng.IntN(3) {
		case 1:
			o.types = []string{"a"}
		case 2:
			o.types = []string{"b", "c"}
		}
		_, err := openConn(t, s, connOpts{after: uint64(o.after), includeEphemeral: o.inc, types: o.types,
			maxEvents: uint32(1 + rng.IntN(5)), noState: rng.IntN(2) == 0}, o.sink)
		require.NoError(t, err)
		conns = append(conns, o)
	}
	<-done
	head := mustDescribe(t, s).HeadOffset
	for _, c := range conns {
		var want []int64
		var wantEph []int64
		for off := c.after + 1; off <= head; off++ {
			r := log[off]
			if len(c.types) > 0 && !slices.Contains(c.types, r.typ) {
				continue
			}
			if r.ephem {
				wantEph = append(wantEph, off)
			}
			want = append(want, off)
		}
		last := int64(-1)
		if len(want) > 0 {
			last = want[len(want)-1]
		}
		waitUntil(t, "caught up", func() bool {
			got := c.sink.offsets()
			return last < 0 || (len(got) > 0 && got[len(got)-1] == last)
		})
		got := c.sink.offsets()
		require.True(t, slices.IsSorted(got) && len(slices.Compact(slices.Clone(got))) == len(got), "ordered, no dup: %v", got)
		if c.inc {
			require.Equal(t, want, got, "after %d types %v inc", c.after, c.types)
			continue
		}
		// Durable: all. Ephemeral: a suffix (those appended once it was open).
		gotSet := map[int64]bool{}
		for _, o := range got {
			gotSet[o] = true
			require.Contains(t, want, o)
		}
		seenEph := false
		for _, o := range want {
			if !log[o].ephem {
				require.True(t, gotSet[o], "durable %d missing (after %d types %v)", o, c.after, c.types)
			} else if gotSet[o] {
				seenEph = true
			} else {
				require.False(t, seenEph, "ephemeral %d missing after a later one arrived (after %d types %v)", o, c.after, c.types)
			}
		}
	}
}

// A trim stops at a connection's delivered offset; a connection opened below the trim starts
// at the first event left.
func TestLiveWalk_TrimAndConnections(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	s := stream(t, p, "/zz/trim")
	for i := range 10 {
		mustAppend(t, s, ev("a", fmt.Sprintf(`{"i":%d}`, i)))
	}
	sink := newTestSink()
	sink.block = make(chan struct{})
	c, err := openConn(t, s, connOpts{after: 3, maxEvents: 1, noState: true}, sink)
	require.NoError(t, err)
	res, err := client.Trim(ctxT(t), s, 8)
	require.NoError(t, err)
	_, delivered, err := ping(t, c)
	require.NoError(t, err)
	require.LessOrEqual(t, res.TrimmedThrough, max(delivered, 3))
	close(sink.block)
	waitUntil(t, "all", func() bool { o := sink.offsets(); return len(o) > 0 && o[len(o)-1] == 10 })
	require.Equal(t, []int64{4, 5, 6, 7, 8, 9, 10}, sink.offsets())
	// The sink has event 10 before itxd has the answer to its delivery; the trim below is bound
	// by what itxd knows was delivered.
	waitUntil(t, "delivered through 8", func() bool { _, d, err := ping(t, c); return err == nil && d >= 8 })
	res, err = client.Trim(ctxT(t), s, 8)
	require.NoError(t, err)
	require.Equal(t, int64(8), res.TrimmedThrough)
	late := newTestSink()
	_, err = openConn(t, s, connOpts{after: 2, noState: true}, late)
	require.NoError(t, err)
	waitUntil(t, "late", func() bool { o := late.offsets(); return len(o) > 0 && o[len(o)-1] == 10 })
	require.Equal(t, []int64{9, 10}, late.offsets())
}
