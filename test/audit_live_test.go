package test

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"sync"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// recordingLive is a liveView that also keeps each patch it applied, by revision.
type recordingLive struct {
	liveView
	pmu     sync.Mutex
	patches map[uint64]string
}

func (l *recordingLive) Patch(ctx context.Context, call schema.LiveSubscriber_patch) error {
	ops, _ := call.Args().Ops()
	l.pmu.Lock()
	if l.patches == nil {
		l.patches = map[uint64]string{}
	}
	l.patches[call.Args().Revision()] = ops
	l.pmu.Unlock()
	return l.liveView.Patch(ctx, call)
}

func (l *recordingLive) patch(rev uint64) string {
	l.pmu.Lock()
	defer l.pmu.Unlock()
	return l.patches[rev]
}

// Seed 000 "Live state": a projection push channel, snapshot plus structural patches. Calls that
// change nothing a view shows (an idempotent retry, a refused conditional append, an idempotency
// conflict, a reader moved to where it is, reads, a ping) send nothing: the next revision is the
// next real change alone.
func TestAudit_LiveUnchangedStateSendsNothing(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/audit/live-quiet")
	mustAppend(t, s, keyed("a", `{}`, "k1"))
	rf, release := s.Readers(ctx, nil)
	defer release()
	r := rf.Readers()
	require.NoError(t, client.RegisterReader(ctx, r, "mirror", 1))
	c, err := openConn(t, s, connOpts{key: "tab", noState: true}, newTestSink())
	require.NoError(t, err)
	view := &recordingLive{}
	fut, rel := s.LiveState(ctx, func(p schema.Stream_liveState_Params) error {
		return p.SetSubscriber(schema.LiveSubscriber_ServerToClient(view))
	})
	_, err = fut.Struct()
	rel()
	require.NoError(t, err)
	waitUntil(t, "settled", func() bool {
		_, doc := view.state()
		conns, _ := doc["connections"].(map[string]any)
		tab, _ := conns["tab"].(map[string]any)
		return tab["delivered"] == float64(1)
	})
	rev0, doc0 := view.state()

	_, err = client.Append(ctx, s, []itx.EventInput{keyed("a", `{}`, "k1")}, itx.AppendOptions{})
	require.NoError(t, err)
	_, err = client.Append(ctx, s, []itx.EventInput{keyed("a", `{"x":1}`, "k1")}, itx.AppendOptions{})
	requireCode(t, err, itx.EIdempotencyConflict)
	_, err = client.Append(ctx, s, []itx.EventInput{ev("a", `{}`)}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 5})
	requireCode(t, err, itx.EOffsetConflict)
	_, err = client.Append(ctx, s, []itx.EventInput{ev("", `{}`)}, itx.AppendOptions{})
	requireCode(t, err, itx.EInvalid)
	require.NoError(t, client.RegisterReader(ctx, r, "mirror", 1))
	requireCode(t, client.RemoveReader(ctx, r, "nobody"), itx.ENotFound)
	_, _, err = ping(t, c)
	require.NoError(t, err)
	_, err = client.GetEvents(ctx, s, itx.Query{})
	require.NoError(t, err)
	mustDescribe(t, s)

	require.NoError(t, client.RegisterReader(ctx, r, "marker", 0))
	waitUntil(t, "the marker", func() bool {
		_, doc := view.state()
		readers, _ := doc["readers"].(map[string]any)
		return readers["marker"] != nil
	})
	rev1, doc1 := view.state()
	require.Equal(t, rev0+1, rev1, "one revision: the marker (patch %s)", view.patch(rev1))
	var ops []map[string]any
	require.NoError(t, json.Unmarshal([]byte(view.patch(rev1)), &ops))
	for _, op := range ops {
		require.True(t, strings.HasPrefix(op["path"].(string), "/readers/marker"), "only the marker changed: %v", ops)
	}
	delete(doc1["readers"].(map[string]any), "marker")
	require.Equal(t, doc0, doc1)
}

// stateFollower applies a connection's state frames (EventSink.state) as a client does.
type stateFollower struct {
	testSink
	smu  sync.Mutex
	rev  uint64
	doc  []byte
	bad  []string // frames out of order, a patch before any snapshot, a patch that did not apply
	seen int
}

func (k *stateFollower) State(ctx context.Context, call schema.EventSink_state) error {
	j, _ := call.Args().Json()
	rev, snap := call.Args().Revision(), call.Args().Snapshot()
	k.smu.Lock()
	defer k.smu.Unlock()
	k.seen++
	switch {
	case snap:
		k.rev, k.doc = rev, []byte(j)
	case k.doc == nil || rev != k.rev+1:
		k.bad = append(k.bad, "out of order")
	default:
		p, err := jsonpatch.DecodePatch([]byte(j))
		if err == nil {
			var doc []byte
			if doc, err = p.Apply(k.doc); err == nil {
				k.rev, k.doc = rev, doc
				return nil
			}
		}
		k.bad = append(k.bad, err.Error())
	}
	return nil
}

func (k *stateFollower) state() map[string]any {
	k.smu.Lock()
	defer k.smu.Unlock()
	var m map[string]any
	_ = json.Unmarshal(k.doc, &m)
	return m
}

// State frames on a connection (noState false) are the stream's live state: a snapshot, then
// patches that reproduce it; a connection opened with noState gets none.
func TestAudit_ConnectionStateFramesOnlyWithoutNoState(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/audit/state-frames")
	mustAppend(t, s, ev("a", `{}`))
	framed := &stateFollower{testSink: testSink{changed: make(chan struct{}, 1)}}
	_, err := openConn(t, s, connOpts{key: "framed"}, framed)
	require.NoError(t, err)
	quiet := newTestSink()
	_, err = openConn(t, s, connOpts{key: "quiet", noState: true}, quiet)
	require.NoError(t, err)
	rf, release := s.Readers(ctx, nil)
	defer release()
	for i := range 5 {
		mustAppend(t, s, ev("a", `{}`))
		require.NoError(t, client.RegisterReader(ctx, rf.Readers(), "mirror", int64(i+1)))
	}
	fresh, _ := watchLive(t, s)
	waitUntil(t, "the frames reproduce the live state", func() bool {
		_, want := fresh.state()
		got := framed.state()
		conns, _ := want["connections"].(map[string]any)
		q, _ := conns["quiet"].(map[string]any)
		f, _ := conns["framed"].(map[string]any)
		return want["head"] == float64(6) && q["delivered"] == float64(6) && f["delivered"] == float64(6) && reflect.DeepEqual(want, got)
	})
	framed.smu.Lock()
	require.Empty(t, framed.bad)
	require.Greater(t, framed.seen, 1)
	framed.smu.Unlock()
	require.Equal(t, 6, len(quiet.offsets()))
	require.Zero(t, quiet.frameCount(), "noState: no state frames")
}
