package test

import (
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A listing's page size above its maximum is invalidArgument whoever asks and whatever the page
// would hold: a project's own admin listing projects (a page of its one project), and a token
// limited to /a listing streams under a prefix outside its scope (an empty page), are refused as
// the deployment root and a whole-project token are, not answered.
func TestListings_LimitOverTheMaximumIsRefusedForEveryCaller(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)

	pa := client.Admin(ctx, ts.project(t))
	defer pa.Release()
	_, _, err := client.ListProjectsPage(ctx, pa, "", server.MaxListProjects+1)
	requireCode(t, err, itx.EInvalid)
	_, _, err = client.ListProjectsPage(ctx, pa, "", 1<<32+1)
	requireCode(t, err, itx.EInvalid) // the Go client does not wrap it to a limit of 1
	page, _, err := client.ListProjectsPage(ctx, pa, "", server.MaxListProjects)
	require.NoError(t, err)
	require.Len(t, page, 1, "its own project")

	tok, _ := ts.token(t, itx.Scope{Prefix: "/a"})
	sf, release := ts.login(t, tok).Streams(ctx, nil)
	defer release()
	streams := sf.Streams()
	_, _, err = client.ListStreamsPage(ctx, streams, "/b", "", server.MaxListStreams+1)
	requireCode(t, err, itx.EInvalid)
	fut, rel := streams.DiskUsage(ctx, func(p schema.Streams_diskUsage_Params) error {
		p.SetLimit(server.MaxListStreams + 1)
		return p.SetPrefix("/b")
	})
	defer rel()
	_, err = fut.Struct()
	requireCode(t, err, itx.EInvalid)
	listed, _, err := client.ListStreamsPage(ctx, streams, "/b", "", server.MaxListStreams)
	require.NoError(t, err)
	require.Empty(t, listed, "nothing of /b is inside /a")
}
