package test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// A project's streams take at most --max-project-bytes of disk: past it that project's appends
// are refused (resourceExhausted, naming the flag, writing nothing, a new stream of it too) while
// another project appends on; its reads go on, and deleting a stream gives the room back; a
// server started again on the data directory measures the files and refuses as before.
func TestProjectQuota(t *testing.T) {
	const quota = 3 << 20
	dir := t.TempDir()
	var logs syncBuffer
	ts := startServer(t, server.Config{DataDir: dir, MaxProjectBytes: quota, Log: zerolog.New(&logs)})
	ctx := ctxT(t)
	full := ts.project(t)
	a := client.Admin(ctx, ts.deployment(t))
	defer a.Release()
	_, tok, _, err := client.CreateProject(ctx, a, "other")
	require.NoError(t, err)
	other := ts.login(t, tok)

	pad := strings.Repeat("x", 60_000)
	big := func(i int) []itx.EventInput {
		out := make([]itx.EventInput, 4)
		for j := range out {
			out[j] = ev("big", fmt.Sprintf(`{"i":%d,"pad":%q}`, i*4+j, pad))
		}
		return out
	}
	acked := map[string]int{}
	var refusal error
	for i := 0; i < 200 && refusal == nil; i++ {
		path := []string{"/a", "/b"}[i%2]
		if _, err := client.Append(ctx, stream(t, full, path), big(i), itx.AppendOptions{}); err != nil {
			refusal = err
			break
		}
		acked[path] += 4
	}
	require.Error(t, refusal, "48 MB appended under a 3 MiB quota")
	requireCode(t, refusal, itx.EResourceExhausted)
	require.Contains(t, refusal.Error(), "--max-project-bytes")

	usage, err := client.DiskUsage(ctx, full, "")
	require.NoError(t, err)
	var total int64
	for _, u := range usage {
		total += u.DiskBytes
	}
	require.GreaterOrEqual(t, total, int64(quota), "refused once the files reach the quota")
	require.Less(t, total, int64(quota+4<<20), "not long after (a reading every 256 KiB per stream, the last append)")

	_, err = client.Append(ctx, stream(t, full, "/fresh"), []itx.EventInput{ev("note", `{}`)}, itx.AppendOptions{})
	requireCode(t, err, itx.EResourceExhausted)
	_, err = client.Append(ctx, stream(t, other, "/a"), big(0), itx.AppendOptions{})
	require.NoError(t, err, "another project appends on")
	// The operator is told of the crossing once, naming the project, not of every refusal.
	crossings := strings.Count(logs.String(), "reached its quota (--max-project-bytes)")
	require.Equal(t, 1, crossings, "logs:\n%s", logs.String())
	require.Contains(t, logs.String(), `"level":"warn","project":"`)
	all, err := client.ReadAll(ctx, stream(t, full, "/a"), itx.Query{})
	require.NoError(t, err)
	require.Len(t, all, acked["/a"], "reads go on; nothing refused was written")

	// Restarted on the same data directory: the files are measured again.
	ts.srv.Close(ctx)
	ts = startServer(t, server.Config{DataDir: dir, MaxProjectBytes: quota})
	full = ts.project(t)
	_, err = client.Append(ctx, stream(t, full, "/a"), []itx.EventInput{ev("note", `{}`)}, itx.AppendOptions{})
	requireCode(t, err, itx.EResourceExhausted)

	// Deleting a stream gives its room back at once.
	_, err = client.DeleteStream(ctx, full, "/b", true)
	require.NoError(t, err)
	_, err = client.Append(ctx, stream(t, full, "/a"), []itx.EventInput{ev("note", `{}`)}, itx.AppendOptions{})
	require.NoError(t, err, "under the quota again once /b is deleted")

	// Trimming gives the room back too, once the trim's space went back to the file system.
	sa := stream(t, full, "/a")
	for i := 0; ; i++ {
		res, err := client.Append(ctx, sa, big(i), itx.AppendOptions{})
		if err != nil {
			requireCode(t, err, itx.EResourceExhausted)
			break
		}
		require.Less(t, i, 200, "never refused")
		_ = res
	}
	info, err := client.Describe(ctx, sa)
	require.NoError(t, err)
	_, err = client.Trim(ctx, sa, info.HeadOffset)
	require.NoError(t, err)
	waitUntil(t, "an append taken once the trimmed space went back", func() bool {
		_, err := client.Append(ctx, sa, []itx.EventInput{ev("note", `{}`)}, itx.AppendOptions{})
		if err != nil {
			requireCode(t, err, itx.EResourceExhausted)
		}
		return err == nil
	})
}

// itxd --max-project-bytes: the flag reaches the server.
func TestItxd_MaxProjectBytes(t *testing.T) {
	p := startItxd(t, t.TempDir(), "--max-project-bytes", "300000")
	proj := dial(t, p.addr).Login(ctxT(t), p.creds.ProjectToken)
	s := stream(t, proj, "/a")
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		_, err = client.Append(ctxT(t), s, kibEvents(100, i*100), itx.AppendOptions{})
	}
	requireCode(t, err, itx.EResourceExhausted)
	require.Contains(t, err.Error(), "--max-project-bytes")
}

// /metrics shows the quota and, per project, the disk its streams take as counted against it,
// so an operator sees a project nearing its quota before its appends are refused: the figure
// grows with the project's appends, reaches the quota when they are refused, and is the one
// project's (another project's streams have their own series).
func TestItxd_ProjectQuotaMetrics(t *testing.T) {
	const quota = 300_000
	metrics := freeAddr(t)
	p := startItxd(t, t.TempDir(), "--max-project-bytes", fmt.Sprint(quota), "--metrics", metrics)
	ctx := ctxT(t)
	require.Equal(t, float64(quota), scrapeMetric(t, metrics, "itx_project_quota_bytes"))
	proj := dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
	series := `itx_project_disk_bytes{project="` + p.creds.ProjectID + `"}`

	s := stream(t, proj, "/a")
	_, err := client.Append(ctx, s, kibEvents(10, 0), itx.AppendOptions{})
	require.NoError(t, err)
	first := scrapeMetric(t, metrics, series)
	require.Greater(t, first, float64(0), "the project's streams' files, once one loaded")
	require.Less(t, first, float64(quota))

	for i := 1; i < 100 && err == nil; i++ {
		_, err = client.Append(ctx, s, kibEvents(100, i*100), itx.AppendOptions{})
	}
	requireCode(t, err, itx.EResourceExhausted)
	shown := scrapeMetric(t, metrics, series)
	require.GreaterOrEqual(t, shown, float64(quota), "refused: /metrics shows the project at its quota")
	usage, err := client.DiskUsage(ctx, proj, "")
	require.NoError(t, err)
	require.Len(t, usage, 1)
	require.InDelta(t, float64(usage[0].DiskBytes), shown, float64(usage[0].DiskBytes)/10, "what itx du counts")

	root := dial(t, p.addr).Login(ctx, p.creds.DeploymentToken)
	_, err = client.Append(ctx, stream(t, root, "/global"), kibEvents(1, 0), itx.AppendOptions{})
	require.NoError(t, err)
	require.Greater(t, scrapeMetric(t, metrics, `itx_project_disk_bytes{project="`+server.DeploymentProjectID+`"}`), float64(0))
	require.Equal(t, shown, scrapeMetric(t, metrics, series), "each project its own series")
}
