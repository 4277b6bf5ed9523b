package server

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
)

// A project holds at most MaxStreamsPerProject streams: the append that would create one more
// fails with limitExceeded naming the flag, and creates no directory entry and no file; the
// stream's actor stays healthy, the existing streams keep taking appends, and a copy-to-stream
// delivery refused the same way is an outage (retried), not a failure of its events.
func TestServer_StreamsBoundedPerProject(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, projectID := mustOpen(t, Config{DataDir: dir, MaxStreamsPerProject: 2})
	ref := func(path string) StreamRef { return StreamRef{ProjectID: projectID, Path: path} }
	appendTo := func(path string) error {
		_, err := s.Append(ctx, ref(path), []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
		return err
	}
	databases := func() []string { // the stream database files (itxtest.StreamDatabases: itxtest imports server)
		entries, err := os.ReadDir(filepath.Join(dir, "streams"))
		require.NoError(t, err)
		var out []string
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".db") {
				out = append(out, e.Name())
			}
		}
		return out
	}

	require.NoError(t, appendTo("/a"))
	require.NoError(t, appendTo("/b"))
	before := databases()
	require.Len(t, before, 2)
	for range 2 { // the refused actor is left healthy: refused again the same way, not "internal"
		err := appendTo("/c")
		require.Equal(t, itx.ELimitExceeded, itx.ErrorCode(err), "%v", err)
		require.Contains(t, itx.ErrorMessage(err), "holds 2 streams")
		require.Contains(t, itx.ErrorMessage(err), "--max-streams-per-project")
	}
	entry, err := s.dir.Stream(ctx, projectID, "/c")
	require.NoError(t, err)
	require.Nil(t, entry, "no directory entry for the refused stream")
	require.Equal(t, before, databases(), "no database file for the refused stream")
	require.NoError(t, appendTo("/a"), "an existing stream still takes appends")

	copyTo := &copySender{srv: s, target: ref("/c")}
	batch := &itx.DeliveryBatch{Events: []itx.Event{{Offset: 1, Type: "x", Payload: []byte(`{}`)}}}
	batch.Path, batch.Subscription = "/a", "to-c"
	_, err = copyTo.send(ctx, &deliverer{srv: s}, batch)
	require.Equal(t, itx.ELimitExceeded, itx.ErrorCode(err), "%v", err)
	require.Equal(t, classOutage, classify(err), "the receiving side is full, whatever the events")
	require.Equal(t, before, databases())
}

// The subscription verbs' control events record the name the subscription has, trimmed, not
// the caller's spacing.
func TestVerbs_ControlEventsRecordTheTrimmedName(t *testing.T) {
	ctx := context.Background()
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir()})
	ref := StreamRef{ProjectID: projectID, Path: "/trimmed"}
	_, err := s.Append(ctx, ref, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
	require.NoError(t, err)
	name, _, err := s.ConfigureSubscription(ctx, ref, itx.SubscriptionConfig{Name: "  sp  ",
		Receiver: itx.Receiver{Action: itx.KindCopyToStream, ReceivingStreamPath: "/elsewhere"}}, "")
	require.NoError(t, err)
	require.Equal(t, "sp", name)
	_, err = s.SetSubscriptionCursor(ctx, ref, " sp ", 1)
	require.NoError(t, err)
	_, err = s.RemoveSubscription(ctx, ref, " sp ")
	require.NoError(t, err)
	page, err := s.ReadEvents(ctx, ref, itx.Query{})
	require.NoError(t, err)
	var names []string
	for _, e := range page.Events {
		if strings.HasPrefix(e.Type, "stream/subscription-") {
			var p struct{ Name string }
			require.NoError(t, json.Unmarshal(e.Payload, &p))
			names = append(names, e.Type+" "+p.Name)
		}
	}
	require.Equal(t, []string{itx.TypeSubscriptionConfigured + " sp", itx.TypeSubscriptionCursorSet + " sp", itx.TypeSubscriptionRemoved + " sp"}, names)
}
