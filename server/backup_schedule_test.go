package server

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// Scheduled backups on a virtual clock: the first at once (the folder holds none), then one
// every interval, the oldest beyond keep deleted with a crashed backup's leftover; a restart
// keeps the rhythm from the newest one in the folder.
func TestBackup_Scheduled(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 12, 5, 20, 0, 0, 0, time.UTC)
	clock := clocktest.New(start)
	dir, data := t.TempDir(), t.TempDir()
	cfg := Config{DataDir: data, Clock: clock, BackupDir: dir, BackupEvery: time.Hour, BackupKeep: 2}
	s, projectID := mustOpen(t, cfg)
	_, err := s.Append(ctx, StreamRef{ProjectID: projectID, Path: "/x"}, []itx.EventInput{{Type: "e"}}, itx.AppendOptions{})
	require.NoError(t, err)

	names := func() []string {
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		var out []string
		for _, e := range entries {
			out = append(out, e.Name())
		}
		return out
	}
	armed := func(s *Server, n int) func() bool {
		return func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.backupsArmed == n }
	}
	first := "itx-backup-20261205T200000.000Z"
	require.Eventually(t, func() bool { n := names(); return len(n) == 1 && n[0] == first }, 10*time.Second, time.Millisecond)
	require.Eventually(t, armed(s, 2), 10*time.Second, time.Millisecond)
	clock.Advance(59 * time.Minute) // due timers run within Advance: none is
	require.Equal(t, []string{first}, names())

	// A backup cut short by a crash left its temporary folder: the next prune deletes it; a
	// folder of another name is never touched.
	leftover := "." + first + ".itx-backup-123456"
	require.NoError(t, os.Mkdir(filepath.Join(dir, leftover), 0o700))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "mine"), 0o700))

	clock.Advance(time.Minute) // the second backup runs within Advance
	clock.Advance(time.Hour)   // the third; the first is deleted
	require.Equal(t, []string{"itx-backup-20261205T210000.000Z", "itx-backup-20261205T220000.000Z", "mine"}, names())
	require.Equal(t, 3.0, testutil.ToFloat64(s.metrics.Backups.WithLabelValues("ok")))

	// Restarted half an hour later: the next is due an hour after the newest, not at once.
	mustClose(t, s)
	clock.Advance(30 * time.Minute)
	s2, _ := mustOpen(t, cfg)
	require.Eventually(t, armed(s2, 1), 10*time.Second, time.Millisecond)
	clock.Advance(29 * time.Minute)
	require.Equal(t, []string{"itx-backup-20261205T210000.000Z", "itx-backup-20261205T220000.000Z", "mine"}, names())
	clock.Advance(time.Minute)
	require.Equal(t, []string{"itx-backup-20261205T220000.000Z", "itx-backup-20261205T230000.000Z", "mine"}, names())

	// Each copy opens as a data directory holding the stream.
	mustClose(t, s2)
	c, cp := mustOpen(t, Config{DataDir: filepath.Join(dir, "itx-backup-20261205T230000.000Z")})
	page, err := c.ReadEvents(ctx, StreamRef{ProjectID: cp, Path: "/x"}, itx.Query{})
	require.NoError(t, err)
	require.Len(t, page.Events, 1)
}

func TestBackup_ScheduleRefusedAtStart(t *testing.T) {
	data := t.TempDir()
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{BackupDir: "relative", BackupEvery: time.Hour}, "absolute"},
		{Config{BackupDir: filepath.Join(t.TempDir(), "none"), BackupEvery: time.Hour}, "does not exist"},
		{Config{BackupDir: data, BackupEvery: time.Hour}, "inside the data directory"},
		{Config{BackupDir: t.TempDir(), BackupEvery: time.Second}, "too often"},
		{Config{BackupDir: t.TempDir(), BackupEvery: time.Hour, BackupKeep: MaxBackupKeep + 1}, "keep"},
		{Config{BackupDir: t.TempDir()}, "without an interval"},
	} {
		c.cfg.DataDir = data
		_, err := Open(context.Background(), c.cfg)
		require.ErrorContains(t, err, c.want)
	}
}
