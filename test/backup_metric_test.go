package test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// itx_backup_last_success_timestamp_seconds holds the newest scheduled backup from the start of
// a process that finds one in --backup-dir: it said 0 after every restart until the schedule's
// next backup, up to --backup-every later, so an alert on its age fired for that long.
func TestBackupSchedule_LastSuccessSurvivesARestart(t *testing.T) {
	backups, data := t.TempDir(), t.TempDir()
	metrics := freeAddr(t)
	p := startItxd(t, data, "--backup-dir", backups, "--backup-every", "1h", "--metrics", metrics)
	var first float64
	require.Eventually(t, func() bool {
		first = scrapeMetric(t, metrics, "itx_backup_last_success_timestamp_seconds")
		return first > 0
	}, 20*time.Second, 20*time.Millisecond, "the first scheduled backup, at start")
	require.NoError(t, p.stop(t))

	metrics = freeAddr(t)
	startItxd(t, data, "--backup-dir", backups, "--backup-every", "1h", "--metrics", metrics)
	again := scrapeMetric(t, metrics, "itx_backup_last_success_timestamp_seconds")
	require.InDelta(t, first, again, 5, "the restarted process shows the backup the folder holds (next one due in an hour)")
	require.LessOrEqual(t, again, first, "its start, not later than the instant it holds")
}
