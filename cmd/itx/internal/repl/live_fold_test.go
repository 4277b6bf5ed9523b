package repl

import (
	"context"
	"encoding/json"
	"io"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/stretchr/testify/require"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/server"
)

// A live view that holds more unread patches than its bound (a script that reads patches()
// rarely, or .watch writing into a paused pipe) still shows the current state: its snapshot and
// the patches after it follow one another revision by revision, so applying them gives what a
// fresh view shows. (Before, the oldest patches were dropped and the snapshot kept its
// revision: the patches that followed it left a gap, and .watch printed that stale snapshot
// again before them.) The bound is lowered from 10,000 to 3 so that a few appends pass it.
func TestLiveView_PatchesPastTheBoundFoldIntoTheSnapshot(t *testing.T) {
	ts := itxtest.Start(t, server.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Connect(ctx, Config{Addr: ts.Addr, Token: ts.Creds.ProjectToken, Out: io.Discard, Err: io.Discard, Format: FormatJSON})
	require.NoError(t, err)
	defer s.Close()

	c, err := client.Dial(ctx, ts.Addr)
	require.NoError(t, err)
	defer c.Close()
	project := c.Login(ctx, ts.Creds.ProjectToken)
	defer project.Release()
	st := client.Stream(ctx, project, "/fold")
	defer st.Release()
	_, err = client.Append(ctx, st, []itx.EventInput{{Type: "a"}}, itx.AppendOptions{})
	require.NoError(t, err)

	_, err = s.Eval(ctx, "<test>", `var live = project.streams.get("/fold").liveState()`)
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
	v.mu.Lock()
	v.maxPatches = 3
	rev := v.revision
	v.mu.Unlock()

	// One append at a time, each seen by the view before the next: every revision comes as a
	// patch (a view that fell behind would get a fresh snapshot instead).
	const appends = 8
	for range appends {
		_, err = client.Append(ctx, st, []itx.EventInput{{Type: "a"}}, itx.AppendOptions{})
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			v.mu.Lock()
			defer v.mu.Unlock()
			return v.revision > rev
		}, 10*time.Second, time.Millisecond)
		v.mu.Lock()
		rev = v.revision
		v.mu.Unlock()
	}

	var snap struct {
		Revision uint64          `json:"revision"`
		State    json.RawMessage `json:"state"`
	}
	var patches []struct {
		Revision uint64          `json:"revision"`
		Ops      json.RawMessage `json:"ops"`
	}
	eval := func(src string, into any) {
		t.Helper()
		val, err := s.Eval(ctx, "<test>", "JSON.stringify("+src+")")
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal([]byte(val.String()), into))
	}
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
