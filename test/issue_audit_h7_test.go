package test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Issue 12 (point 2): start: beginning is the default, and it delivers the whole log from offset 1,
// the stream's own stream/* records included, the subscription's own configured event among them.
// A configure that leaves start out gets the note appended before it, then its own birth, then
// what follows.
func TestIssue12_DefaultStartDeliversTheStreamsOwnRecords(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := newHook(t, nil)
	s := stream(t, e.p, "/audit-h7/default-start")
	first := mustAppend(t, s, ev("note", `{"n":1}`)).HeadOffset
	name, birth := e.configure(t, s, client.SubscriptionConfig{Name: "hook",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	last := mustAppend(t, s, ev("note", `{"n":2}`)).HeadOffset
	e.waitProcessed(t, s, name, last)
	require.Equal(t, []int64{first, birth, last}, h.distinct(), "the whole log from offset 1")
	h.mu.Lock()
	defer h.mu.Unlock()
	var types []string
	seen := map[int64]bool{}
	for _, b := range h.bodies {
		if !seen[b.Event.Offset] {
			seen[b.Event.Offset] = true
			types = append(types, b.Event.Type)
		}
	}
	require.Equal(t, []string{"note", itx.TypeSubscriptionConfigured, "note"}, types,
		"the subscription's own configured event is delivered to it")
}

// Issue 10 (point 3): each restart of itxd that loads a stream with processors records one
// stream/woken carrying that incarnation's id: two restarts, two records, two distinct ids.
func TestIssue10_EachRestartRecordsWokenWithItsIncarnation(t *testing.T) {
	dir := t.TempDir()
	host := referenceHost(t, "guestbook")
	cfg := server.Config{DataDir: dir, Processors: host}
	ts := startServer(t, cfg)
	ctx := ctxT(t)
	const path = "/audit-h7/woken"
	configureProcessor(t, stream(t, ts.project(t), path), "guestbook")
	for range 2 {
		closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		require.NoError(t, ts.srv.Close(closeCtx))
		cancel()
		ts = startServer(t, cfg)
		s := stream(t, ts.project(t), path)
		head := mustAppend(t, s, examples.GuestbookSigned.Input(examples.Signed{Name: "a"}, "")).HeadOffset
		sub, _ := processorOf(t, s, "guestbook")
		_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
		require.NoError(t, err)
	}
	events, err := client.ReadAll(ctx, stream(t, ts.project(t), path), itx.Query{Types: []string{itx.TypeWoken}})
	require.NoError(t, err)
	require.Len(t, events, 2, "one stream/woken for each of the two restarts")
	ids := map[string]bool{}
	for _, e := range events {
		var p struct {
			IncarnationID string `json:"incarnationId"`
		}
		require.NoError(t, json.Unmarshal(e.Payload, &p))
		require.NotEmpty(t, p.IncarnationID, "stream/woken names its incarnation: %s", e.Payload)
		ids[p.IncarnationID] = true
	}
	require.Len(t, ids, 2, "each restart is its own incarnation")
}

// Issue 14 (points 1 and 7): what the administration answered survives kill -9 of itxd. A revoked
// token stays refused, a deleted project stays gone with its streams' files, a renamed project
// keeps its new name, and a created token keeps logging in.
func TestIssue14_Kill9KeepsAnsweredAdministration(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	root := dial(t, proc.addr).Login(ctx, proc.creds.DeploymentToken)
	admin := client.Admin(ctx, root)
	kept, _, err := client.CreateToken(ctx, admin, proc.creds.ProjectID, client.TokenOptions{Label: "kept"})
	require.NoError(t, err)
	revoked, info, err := client.CreateToken(ctx, admin, proc.creds.ProjectID, client.TokenOptions{Label: "revoked"})
	require.NoError(t, err)
	require.NoError(t, client.RevokeToken(ctx, admin, proc.creds.ProjectID, info.ID))

	gone, goneTok, _, err := client.CreateProject(ctx, admin, "gone")
	require.NoError(t, err)
	before := map[string]bool{}
	for _, f := range streamFiles(t, dataDir) {
		before[f] = true
	}
	mustAppend(t, stream(t, dial(t, proc.addr).Login(ctx, goneTok), "/doomed"), ev("note", `{}`))
	var doomed []string
	for _, f := range streamFiles(t, dataDir) {
		if !before[f] {
			doomed = append(doomed, f)
		}
	}
	require.NotEmpty(t, doomed, "the doomed stream has its files")
	require.NoError(t, client.DeleteProject(ctx, admin, gone.ID, true))

	renamed, _, _, err := client.CreateProject(ctx, admin, "before")
	require.NoError(t, err)
	require.NoError(t, client.RenameProject(ctx, admin, renamed.ID, "after"))
	admin.Release()
	proc.kill9(t)

	proc = startItxd(t, dataDir)
	_, err = client.DescribeProject(ctx, dial(t, proc.addr).Login(ctx, revoked))
	requireCode(t, err, itx.EUnauthenticated)
	_, err = client.DescribeProject(ctx, dial(t, proc.addr).Login(ctx, goneTok))
	requireCode(t, err, itx.EUnauthenticated)
	_, err = client.DescribeProject(ctx, dial(t, proc.addr).Login(ctx, kept))
	require.NoError(t, err, "a token created and not revoked logs in")

	admin = client.Admin(ctx, dial(t, proc.addr).Login(ctx, proc.creds.DeploymentToken))
	defer admin.Release()
	list, err := client.ListProjects(ctx, admin)
	require.NoError(t, err)
	names := map[string]string{}
	for _, ps := range list {
		names[ps.Info.ID] = ps.Info.Name
	}
	require.NotContains(t, names, gone.ID, "the deleted project stays deleted")
	require.Equal(t, "after", names[renamed.ID], "the rename stays")
	files := streamFiles(t, dataDir)
	for _, f := range doomed {
		require.NotContains(t, files, f, "the deleted project's stream left its file behind")
	}
}
