package server

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// TestDiskReserve_ReadsTheDiskOnlyWhenTheLastReadingMayNotHold: the file system is read at the
// first check, again once the bytes committed since could have used half the margin it showed,
// again once diskReadingTTL old, and at every check while it showed too little, so that an append is
// taken as soon as space returns.
func TestDiskReserve_ReadsTheDiskOnlyWhenTheLastReadingMayNotHold(t *testing.T) {
	now := time.Unix(1_000, 0)
	free, reads := int64(100<<20), 0
	var shown int64
	d := newDiskReserve("/data", 64<<20, zerolog.Nop(), func(f int64) { shown = f })
	d.free = func(string) (int64, bool) { reads++; return free, true }
	d.now = func() time.Time { return now }

	require.NoError(t, d.room())
	require.Equal(t, 1, reads, "the first check reads the disk")
	require.Equal(t, int64(100<<20), shown)
	d.wrote(10 << 20) // 36 MiB of margin: 10 MiB written is under half of it
	require.NoError(t, d.room())
	require.Equal(t, 1, reads, "the reading still holds")
	d.wrote(10 << 20) // 20 MiB: past half the margin
	free = 70 << 20
	require.NoError(t, d.room())
	require.Equal(t, 2, reads, "read again once the writes could have used half the margin")

	now = now.Add(diskReadingTTL)
	free = 60 << 20 // another process filled the disk
	err := d.room()
	require.Equal(t, 3, reads, "read again once the reading is diskReadingTTL old")
	require.Equal(t, itx.EResourceExhausted, itx.ErrorCode(err))
	require.Contains(t, err.Error(), "--min-free-disk-bytes")

	requireCodeOf(t, d.room(), itx.EResourceExhausted)
	require.Equal(t, 4, reads, "below the reserve every check reads the disk")
	free = 65 << 20
	require.NoError(t, d.room(), "taken as soon as space returns")
	require.Equal(t, 5, reads)

	var none *diskReserve
	require.NoError(t, none.room())
	require.NoError(t, newDiskReserve("/data", 0, zerolog.Nop(), nil).room(), "no reserve")
}

// Without a reserve nothing is refused, but /metrics still shows the free space, read at most
// every diskReadingTTL.
func TestDiskReserve_WithoutAReserveTheFreeSpaceIsStillShown(t *testing.T) {
	now := time.Unix(1_000, 0)
	free, reads := int64(10<<20), 0
	shown := int64(-1)
	d := newDiskReserve("/data", 0, zerolog.Nop(), func(f int64) { shown = f })
	d.free = func(string) (int64, bool) { reads++; return free, true }
	d.now = func() time.Time { return now }

	require.NoError(t, d.room())
	require.Equal(t, int64(10<<20), shown)
	free = 1 // nothing is refused without a reserve
	require.NoError(t, d.room())
	require.Equal(t, 1, reads, "read at most every diskReadingTTL")
	now = now.Add(diskReadingTTL)
	require.NoError(t, d.room())
	require.Equal(t, int64(1), shown)
}

func requireCodeOf(t *testing.T, err error, want itx.Code) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, want, itx.ErrorCode(err), "%v", err)
}

// TestPlanGroup_TheDiskReserve: below the reserve a request that adds a client's events is
// refused whole and takes no breaker tokens, while a retry answered from the log, the server's
// own records and a subscription's removal go through; the reserve is asked once per group.
func TestPlanGroup_TheDiskReserve(t *testing.T) {
	now := time.Unix(1_000, 0)
	bucket := newTokenBucket(10, 600, now)
	asked := 0
	short := itx.Errorf(itx.EResourceExhausted, "short")
	room := func() error { asked++; return short }
	committed := map[string]*itx.Event{"k": {Offset: 3, Type: "a", Payload: []byte(`{}`), IdempotencyKey: "k"}}
	reqs := []*appendReq{
		{inputs: []itx.EventInput{{Type: "a", Payload: []byte(`{}`)}}, authority: authClient},
		{inputs: []itx.EventInput{{Type: "a", Payload: []byte(`{}`), IdempotencyKey: "k"}}, authority: authClient},
		{inputs: []itx.EventInput{{Type: itx.TypeErrorOccurred, Payload: []byte(`{"message":"m"}`)}}, authority: authCore},
		{inputs: []itx.EventInput{{Type: "b", Payload: []byte(`{}`)}}, authority: authCopy},
	}
	p := planGroup(3, "sid", bucket, room, newCoreState(), testRC(), reqs, committed, now)
	require.Equal(t, itx.EResourceExhausted, itx.ErrorCode(p.Replies[0].err))
	require.NoError(t, p.Replies[1].err)
	require.Equal(t, []bool{true}, p.Replies[1].result.Duplicate)
	require.NoError(t, p.Replies[2].err, "the server's own record")
	require.Equal(t, itx.EResourceExhausted, itx.ErrorCode(p.Replies[3].err), "a copy")
	require.Len(t, p.Events, 1)
	require.Equal(t, int64(4), p.Head)
	require.Equal(t, 1, asked)
	require.True(t, bucket.take(10, now), "refused requests took no tokens")
}

// The admission checks an append's step pays: the disk reserve's reading while it holds (no
// system call), and a stream's files measured for its project's quota (three stats, every
// usageStatBytes committed).
func BenchmarkAdmission(b *testing.B) {
	b.Run("reserve", func(b *testing.B) {
		d := newDiskReserve(b.TempDir(), 1<<20, zerolog.Nop(), nil)
		for b.Loop() {
			if err := d.room(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("measure-files", func(b *testing.B) {
		dir := b.TempDir()
		be := sqliteBackend{dir: dir}
		for _, suffix := range []string{".db", ".db-wal", ".db-shm"} {
			if err := os.WriteFile(filepath.Join(dir, "s"+suffix), []byte("x"), 0o600); err != nil {
				b.Fatal(err)
			}
		}
		for b.Loop() {
			if be.DiskBytes("s") != 3 {
				b.Fatal("size")
			}
		}
	})
}
