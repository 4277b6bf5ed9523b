package test

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// freeOn is the space an unprivileged writer has left on the file system holding dir.
func freeOn(t *testing.T, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	require.NoError(t, syscall.Statfs(dir, &st))
	return int64(st.Bavail) * int64(st.Bsize)
}

// TestDiskReserve_AClientCannotFillTheDisk: a real itxd on a 48 MiB tmpfs keeping 16 MiB in
// reserve (SQLite copies a stream's log into its database file at checkpoints of ~4 MiB, after
// the reading that let the commits in: the disk may go that far below the reserve; with 8 MiB
// kept it went below half of it once, 3.87 MB free, on a loaded machine). One client appending as fast as it can is refused (resourceExhausted, naming the
// flag) while the disk still has room, never at its last byte; below the reserve nothing that
// adds events is written (a new stream, a new subscription, a new scheduled append), while what
// frees or needs no room works: an idempotent retry of an acknowledged append, reads, removing a
// subscription, trimming and deleting a stream, revoking a token (creating one, or a project, is
// refused: each is an /audit record too). Once space is freed the next append is taken at
// once, without a restart.
func TestDiskReserve_AClientCannotFillTheDisk(t *testing.T) {
	fs := mountTmpfs(t, "48m")
	const reserve = 16 << 20
	metrics := freeAddr(t)
	p := startItxd(t, filepath.Join(fs, "data"), "--min-free-disk-bytes", strconv.Itoa(reserve), "--metrics", metrics)
	proj := dial(t, p.addr).Login(context.Background(), p.creds.ProjectToken)
	ctx := ctxT(t)
	require.Equal(t, float64(reserve), scrapeMetric(t, metrics, "itx_disk_reserve_bytes"))

	_, spare, err := client.CreateToken(ctx, client.Admin(ctx, proj), "", client.TokenOptions{Label: "spare"})
	require.NoError(t, err)
	fill := stream(t, proj, "/fill")
	first, err := client.Append(ctx, fill, []itx.EventInput{keyed("note", `{"first":true}`, "k1")}, itx.AppendOptions{})
	require.NoError(t, err)
	subs := client.Subscriptions(ctx, fill)
	_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "old",
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/elsewhere"}, Start: "now"})
	require.NoError(t, err)

	acked := 2 // the note and the subscription's configured event
	var refusal error
	for i := 0; i < 200 && refusal == nil; i++ {
		res, err := client.Append(ctx, fill, kibEvents(500, i*500), itx.AppendOptions{})
		if err != nil {
			refusal = err
			break
		}
		require.Len(t, res.Offsets, 500)
		acked += 500
	}
	require.Error(t, refusal, "100 MiB of appends were all taken")
	requireCode(t, refusal, itx.EResourceExhausted)
	require.Contains(t, refusal.Error(), "--min-free-disk-bytes")
	free := freeOn(t, fs)
	require.Greater(t, free, int64(reserve/2), "refused while the disk still has room, not at its last byte")
	require.Greater(t, acked, 5_000, "the reserve let the disk fill to it first (%d bytes free)", free)
	shown := scrapeMetric(t, metrics, "itx_disk_free_bytes")
	require.Greater(t, shown, float64(0))
	require.LessOrEqual(t, shown, float64(reserve), "/metrics shows the reading that refused")

	// Below the reserve: nothing that adds events is written.
	_, err = client.Append(ctx, stream(t, proj, "/fresh"), []itx.EventInput{ev("note", `{}`)}, itx.AppendOptions{})
	requireCode(t, err, itx.EResourceExhausted)
	_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "new",
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/other"}})
	requireCode(t, err, itx.EResourceExhausted)
	_, _, err = client.Schedule(ctx, fill, keyed("note", `{}`, "later"), time.Now().Add(time.Hour))
	requireCode(t, err, itx.EResourceExhausted)
	list, err := client.ListStreams(ctx, proj, "")
	require.NoError(t, err)
	for _, s := range list {
		require.NotEqual(t, "/fresh", s.Path, "a refused creating append leaves no stream")
	}

	// What needs no room works: a retry of what is in the log, reads, a removal, a trim.
	retry, err := client.Append(ctx, fill, []itx.EventInput{keyed("note", `{"first":true}`, "k1")}, itx.AppendOptions{})
	require.NoError(t, err, "an idempotent retry writes nothing")
	require.Equal(t, first.Offsets, retry.Offsets)
	require.Equal(t, []bool{true}, retry.Duplicate)
	all, err := client.ReadAll(ctx, fill, itx.Query{})
	require.NoError(t, err)
	require.Len(t, all, acked, "every acknowledged event, nothing refused")
	_, err = client.RemoveSubscription(ctx, subs, "old")
	require.NoError(t, err, "removing a subscription below the reserve")
	_, err = client.Trim(ctx, fill, 100)
	require.NoError(t, err, "trimming below the reserve")
	root := dial(t, p.addr).Login(context.Background(), p.creds.DeploymentToken)
	audit, err := client.ReadAll(ctx, stream(t, root, server.AuditPath), itx.Query{})
	require.NoError(t, err)
	require.NotEmpty(t, audit)
	require.Equal(t, server.AuditStreamTrimmed, audit[len(audit)-1].Type, "the trim's audit record is written below the reserve")

	// Administration that only adds (each change is also an /audit record, which may use the
	// reserve) is refused; revoking a token is not.
	admin := client.Admin(ctx, root)
	_, made, err := client.CreateToken(ctx, client.Admin(ctx, proj), "", client.TokenOptions{Label: "more"})
	requireCode(t, err, itx.EResourceExhausted)
	require.Empty(t, made.ID, "no token was created")
	_, _, _, err = client.CreateProject(ctx, admin, "another")
	requireCode(t, err, itx.EResourceExhausted)
	require.Equal(t, itx.EResourceExhausted, itx.ErrorCode(client.RenameProject(ctx, admin, "", "renamed")))
	require.NoError(t, client.RevokeToken(ctx, client.Admin(ctx, proj), "", spare.ID), "revoking below the reserve")

	// Streams.diskUsage says which stream takes the disk.
	usage, err := client.DiskUsage(ctx, proj, "/fill")
	require.NoError(t, err)
	require.Len(t, usage, 1)
	require.Greater(t, usage[0].DiskBytes, int64(acked*1000), "the stream's files hold its events")

	// Deleting the stream frees the disk: the next append is taken at once.
	_, err = client.DeleteStream(ctx, proj, "/fill", true)
	require.NoError(t, err, "deleting below the reserve")
	require.Greater(t, freeOn(t, fs), int64(reserve))
	res, err := client.Append(ctx, stream(t, proj, "/fresh"), []itx.EventInput{ev("note", `{}`)}, itx.AppendOptions{})
	require.NoError(t, err, "appends are taken as soon as space returns")
	require.Equal(t, []int64{1}, res.Offsets)
}

// TestDiskReserve_ScheduledAppendsWaitForRoom: a scheduled append that comes due while the disk
// is below the reserve stays scheduled (it is not dropped, nor recorded as refused) and lands
// once space returns.
func TestDiskReserve_ScheduledAppendsWaitForRoom(t *testing.T) {
	fs := mountTmpfs(t, "24m")
	p := startItxd(t, filepath.Join(fs, "data"), "--min-free-disk-bytes", "8388608")
	proj := dial(t, p.addr).Login(context.Background(), p.creds.ProjectToken)
	ctx := ctxT(t)

	s := stream(t, proj, "/s")
	mustAppend(t, s, ev("note", `{}`))
	// Due once the disk below is short: filling it and meeting the refusal take well under a
	// second alone, and seconds on a loaded machine (2 s was thin there).
	due := time.Now().Add(6 * time.Second)
	_, _, err := client.Schedule(ctx, s, keyed("due", `{"x":1}`, "due-1"), due)
	require.NoError(t, err)

	// Take the disk below the reserve from outside itxd, before the append comes due.
	// itxd trusts a reading of the free space for 250 ms: what another process writes is seen
	// that late, so appends are taken until then.
	free := fillDisk(t, fs, 4<<20)
	head := int64(1)
	for start := time.Now(); ; {
		_, err = client.Append(ctx, s, []itx.EventInput{ev("note", `{}`)}, itx.AppendOptions{})
		if err != nil {
			requireCode(t, err, itx.EResourceExhausted)
			break
		}
		head++
		require.Less(t, time.Since(start), 5*time.Second, "appends still taken with the disk below the reserve")
	}
	require.True(t, time.Now().Before(due), "the disk was short before the append came due (filling took too long)")
	time.Sleep(time.Until(due) + 500*time.Millisecond) // past its due time: itxd's clock is the system's, in another process
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.Equal(t, head, info.HeadOffset, "nothing landed while the disk was short")

	free()
	waitUntil(t, "the scheduled append landed once space returned", func() bool {
		all, err := client.ReadAll(ctx, s, itx.Query{})
		require.NoError(t, err)
		if int64(len(all)) == head+1 {
			require.Equal(t, "due", all[head].Type)
			return true
		}
		require.Len(t, all, int(head), "nothing but the scheduled append (no refusal record)")
		return false
	})
}

// readyz is /readyz's status and body.
func readyz(t *testing.T, metrics string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + metrics + "/readyz")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// The free space /metrics shows, and /readyz, follow the disk while nobody appends: another
// process filling the data directory's disk below the reserve shows at the next scrape (the
// gauge was read only by appends, so on a quiet server it kept its value from the last one and
// the alert on it nearing the reserve never fired), and so does the space coming back. /readyz
// stays 200 below the reserve (the server serves the trims and deletes that give space back)
// and says in its body that appends are refused, naming the flag.
func TestDiskReserve_ScrapesSeeTheDiskWithoutAppends(t *testing.T) {
	fs := mountTmpfs(t, "32m")
	const reserve = 8 << 20
	metrics := freeAddr(t)
	startItxd(t, filepath.Join(fs, "data"), "--min-free-disk-bytes", "8388608", "--metrics", metrics)
	require.Greater(t, scrapeMetric(t, metrics, "itx_disk_free_bytes"), float64(reserve))
	code, body := readyz(t, metrics)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ready\n", body)

	free := fillDisk(t, fs, 4<<20)
	require.Eventually(t, func() bool { return scrapeMetric(t, metrics, "itx_disk_free_bytes") < reserve },
		10*time.Second, 20*time.Millisecond, "a scrape shows the disk below the reserve without an append")
	code, body = readyz(t, metrics)
	require.Equal(t, http.StatusOK, code, "below the reserve, still ready: %s", body)
	require.Contains(t, body, "appends that add events are refused")
	require.Contains(t, body, "--min-free-disk-bytes")

	free()
	require.Eventually(t, func() bool { return scrapeMetric(t, metrics, "itx_disk_free_bytes") > reserve },
		10*time.Second, 20*time.Millisecond, "a scrape shows the space back without an append")
	code, body = readyz(t, metrics)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ready\n", body)
}
