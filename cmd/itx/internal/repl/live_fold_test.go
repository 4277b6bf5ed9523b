package repl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/stretchr/testify/require"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
)

// A live view that holds more unread patches than its bound (a script that reads patches()
// rarely, or .watch writing into a paused pipe) still shows the current state: its snapshot and
// the patches after it follow one another revision by revision, so applying them gives what a
// fresh view shows. (Before, the oldest patches were dropped and the snapshot kept its
// revision: the patches that followed it left a gap, and .watch printed that stale snapshot
// again before them.) The bound is lowered from 10,000 to 3 so that a few appends pass it.
func TestLiveView_PatchesPastTheBoundFoldIntoTheSnapshot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, st, v := openLiveView(ctx, t, "/fold")
	v.mu.Lock()
	v.maxPatches = 3
	rev := v.revision
	v.mu.Unlock()

	// One append at a time, each seen by the view before the next: every revision comes as a
	// patch (a view that fell behind would get a fresh snapshot instead).
	const appends = 8
	for range appends {
		rev = appendSeen(ctx, t, st, v)
	}

	var snap struct {
		Revision uint64          `json:"revision"`
		State    json.RawMessage `json:"state"`
	}
	var patches []struct {
		Revision uint64          `json:"revision"`
		Ops      json.RawMessage `json:"ops"`
	}
	eval := evalJSON(ctx, t, s)
	eval(`live.snapshot()`, &snap)
	eval(`live.patches()`, &patches)
	require.NotEmpty(t, patches)
	require.LessOrEqual(t, len(patches), 3, "the bound holds")
	doc := []byte(snap.State)
	want := snap.Revision
	for _, p := range patches {
		want++
		require.Equal(t, want, p.Revision, "the patches follow the snapshot without a gap (snapshot at %d)", snap.Revision)
		patch, err := jsonpatch.DecodePatch(p.Ops)
		require.NoError(t, err)
		doc, err = patch.Apply(doc)
		require.NoError(t, err)
	}
	require.Equal(t, rev, want, "through the latest revision")
	var got map[string]any
	require.NoError(t, json.Unmarshal(doc, &got))
	require.Equal(t, float64(1+appends), got["head"])
}

// appendSeen appends one event to st and waits until the view v has its revision, so that each
// comes as a patch (a view that fell behind would get a fresh snapshot instead); it returns the
// view's revision then.
func appendSeen(ctx context.Context, t *testing.T, st schema.Stream, v *liveView) uint64 {
	t.Helper()
	v.mu.Lock()
	rev := v.revision
	v.mu.Unlock()
	_, err := client.Append(ctx, st, []itx.EventInput{{Type: "a"}}, itx.AppendOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		v.mu.Lock()
		defer v.mu.Unlock()
		return v.revision > rev
	}, 10*time.Second, time.Millisecond)
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.revision
}

// openLiveView starts an itxd with one event in path, and opens the stream's live state at an
// itx session's prompt as live; it returns the session, a Go client's capability to the stream
// (to append with) and the view.
func openLiveView(ctx context.Context, t *testing.T, path string) (*Session, schema.Stream, *liveView) {
	t.Helper()
	ts := itxtest.Start(t, server.Config{})
	s, err := Connect(ctx, Config{Addr: ts.Addr, Token: ts.Creds.ProjectToken, Out: io.Discard, Err: io.Discard, Format: FormatJSON})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })

	c, err := client.Dial(ctx, ts.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	project := c.Login(ctx, ts.Creds.ProjectToken)
	t.Cleanup(project.Release)
	st := client.Stream(ctx, project, path)
	t.Cleanup(st.Release)
	_, err = client.Append(ctx, st, []itx.EventInput{{Type: "a"}}, itx.AppendOptions{})
	require.NoError(t, err)

	_, err = s.Eval(ctx, "<test>", fmt.Sprintf(`var live = project.streams.get(%q).liveState()`, path))
	require.NoError(t, err)
	var v *liveView
	s.liveMu.Lock()
	for h := range s.live {
		if lv, ok := h.(*liveView); ok {
			v = lv
		}
	}
	s.liveMu.Unlock()
	require.NotNil(t, v)
	return s, st, v
}

// The patches a script reads become part of its view's snapshot: snapshot() after patches()
// shows the state through the last patch read, at its revision, so snapshot() and the patches()
// after it make the current state whenever they are read. (Before, snapshot() kept showing the
// state the view started from, or last got whole, and the patches read were gone: a script that
// read patches() and then snapshot() saw a stale state and a gap before the next patches.)
func TestLiveView_PatchesReadFoldIntoTheSnapshot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, st, v := openLiveView(ctx, t, "/read")
	type frame struct {
		Revision uint64          `json:"revision"`
		State    json.RawMessage `json:"state"`
		Ops      json.RawMessage `json:"ops"`
	}
	eval := evalJSON(ctx, t, s)
	head := func(state json.RawMessage) float64 {
		var doc map[string]any
		require.NoError(t, json.Unmarshal(state, &doc))
		return doc["head"].(float64)
	}

	var first frame
	eval(`live.snapshot()`, &first)
	require.Equal(t, float64(1), head(first.State))
	appendSeen(ctx, t, st, v)
	appendSeen(ctx, t, st, v)
	var read []frame
	eval(`live.patches()`, &read)
	require.NotEmpty(t, read)
	var snap frame
	eval(`live.snapshot()`, &snap)
	require.Equal(t, read[len(read)-1].Revision, snap.Revision, "the snapshot is at the last patch read")
	require.Equal(t, float64(3), head(snap.State), "the snapshot shows the state through the patches read")

	appendSeen(ctx, t, st, v)
	var next []frame
	eval(`live.patches()`, &next)
	require.NotEmpty(t, next)
	doc := []byte(snap.State)
	want := snap.Revision
	for _, p := range next {
		want++
		require.Equal(t, want, p.Revision, "the patches follow the snapshot without a gap")
		patch, err := jsonpatch.DecodePatch(p.Ops)
		require.NoError(t, err)
		doc, err = patch.Apply(doc)
		require.NoError(t, err)
	}
	require.Equal(t, float64(4), head(doc))
}

// evalJSON returns a function that evaluates src in the session and decodes its JSON into into.
func evalJSON(ctx context.Context, t *testing.T, s *Session) func(src string, into any) {
	return func(src string, into any) {
		t.Helper()
		val, err := s.Eval(ctx, "<test>", "JSON.stringify("+src+")")
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal([]byte(val.String()), into))
	}
}
