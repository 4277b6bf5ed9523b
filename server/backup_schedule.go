package server

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/itx-dev/itx"
)

// DefaultBackupKeep and MaxBackupKeep bound the scheduled backups kept (Config.BackupKeep).
const (
	DefaultBackupKeep = 7
	MaxBackupKeep     = 1000
)

// scheduledBackupPrefix and scheduledBackupLayout name a scheduled backup by the time it was
// started (UTC): itx-backup-20261205T195700.000Z. Names sort in time order, and only folders
// named so are ever deleted.
const (
	scheduledBackupPrefix = "itx-backup-"
	scheduledBackupLayout = "20060102T150405.000Z"
)

// scheduledBy is who the audit record of a scheduled backup names.
var scheduledBy = Admin{TokenID: "itxd-schedule"}

// CheckBackupSchedule is checkBackupSchedule for itxd's flags, before anything is written.
func CheckBackupSchedule(dataDir, dir string, every time.Duration, keep int) error {
	if keep < 1 || keep > MaxBackupKeep {
		return fmt.Errorf("backups: keep %d: want 1 to %d", keep, MaxBackupKeep)
	}
	return checkBackupSchedule(&Config{DataDir: dataDir, BackupDir: dir, BackupEvery: every, BackupKeep: keep})
}

// checkBackupSchedule refuses a schedule itxd could not keep: a folder that is not absolute,
// does not exist, or lies inside the data directory; a keep out of range.
func checkBackupSchedule(cfg *Config) error {
	if cfg.BackupEvery < 0 {
		return fmt.Errorf("backups: the interval %s is negative", cfg.BackupEvery)
	}
	if cfg.BackupEvery == 0 {
		if cfg.BackupDir != "" {
			return fmt.Errorf("backups: a folder (%s) without an interval: set both or neither", cfg.BackupDir)
		}
		return nil
	}
	if cfg.BackupDir == "" {
		return fmt.Errorf("backups: an interval (%s) without a folder: set both or neither", cfg.BackupEvery)
	}
	if cfg.BackupEvery < time.Minute {
		return fmt.Errorf("backups: every %s is too often (at least 1m)", cfg.BackupEvery)
	}
	if cfg.BackupKeep == 0 {
		cfg.BackupKeep = DefaultBackupKeep
	}
	if cfg.BackupKeep < 1 || cfg.BackupKeep > MaxBackupKeep {
		return fmt.Errorf("backups: keep %d: want 1 to %d", cfg.BackupKeep, MaxBackupKeep)
	}
	if !filepath.IsAbs(cfg.BackupDir) {
		return fmt.Errorf("backups: the folder must be an absolute path, not %q", cfg.BackupDir)
	}
	st, err := os.Stat(cfg.BackupDir)
	if err != nil || !st.IsDir() {
		return fmt.Errorf("backups: the folder %s does not exist", cfg.BackupDir)
	}
	dir, _ := filepath.EvalSymlinks(cfg.BackupDir)
	data, _ := filepath.Abs(cfg.DataDir)
	if d, err := filepath.EvalSymlinks(data); err == nil {
		data = d
	}
	if dir == data || strings.HasPrefix(dir, data+string(filepath.Separator)) {
		return fmt.Errorf("backups: the folder %s is inside the data directory %s", cfg.BackupDir, cfg.DataDir)
	}
	return nil
}

// scheduleBackups arms the first scheduled backup: BackupEvery after the newest one in
// BackupDir (at once when that is past), so a restart keeps the rhythm instead of starting it
// over.
func (s *Server) scheduleBackups() {
	if s.cfg.BackupEvery <= 0 {
		return
	}
	now := s.clock.Now()
	next := now
	if names := s.scheduledBackups(); len(names) > 0 {
		if last, ok := scheduledBackupTime(names[len(names)-1]); ok {
			// Not later than an interval from now: a newest one named after now was written
			// before the clock went back, and its time plus the interval may be days ahead.
			next = minTime(last.Add(s.cfg.BackupEvery), now.Add(s.cfg.BackupEvery))
			// The newest backup in the folder is the last one written, by an earlier process:
			// itx_backup_last_success_timestamp_seconds said 0 after every restart until the
			// next one (up to an interval later), so an alert on its age fired for that long.
			// Its name is when it started, a little before the instant it holds.
			s.metrics.BackupLastOK.Set(float64(last.UnixMilli()) / 1000)
		}
	}
	s.armBackup(next)
}

func (s *Server) armBackup(at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return
	}
	s.backupT = itx.AfterFuncAt(s.clock, at, s.scheduledBackup)
	s.backupsArmed++
}

// scheduledBackup writes one backup, deletes the oldest beyond BackupKeep, and arms the next:
// BackupEvery later, or, after a failure, in a fifth of that (at most 5 minutes).
func (s *Server) scheduledBackup() {
	start := s.clock.Now()
	dest := filepath.Join(s.cfg.BackupDir, scheduledBackupPrefix+start.UTC().Format(scheduledBackupLayout))
	_, err := s.Backup(s.base, scheduledBy, dest)
	next := start.Add(s.cfg.BackupEvery)
	if err != nil {
		if s.base.Err() != nil {
			return
		}
		s.log.Error().Err(err).Str("path", dest).Msg("scheduled backup failed")
		next = s.clock.Now().Add(min(s.cfg.BackupEvery/5, 5*time.Minute))
	} else {
		s.pruneBackups()
	}
	s.armBackup(next)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// scheduledBackups lists the names of the scheduled backups in BackupDir, oldest first: in the
// order of the times they are named by, except that those named after the clock's reading come
// first, in their order. Those were written before the wall clock went back (NTP, an operator,
// a VM restored from a snapshot), so before every backup named since: ordered by name alone,
// each new backup sorted before them and was the one pruned, right after it was written, until
// the clock read their times again.
func (s *Server) scheduledBackups() []string {
	entries, err := os.ReadDir(s.cfg.BackupDir)
	if err != nil {
		s.log.Error().Err(err).Str("dir", s.cfg.BackupDir).Msg("listing the scheduled backups")
		return nil
	}
	var names []string
	for _, e := range entries {
		if _, ok := scheduledBackupTime(e.Name()); ok && e.IsDir() {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	now := s.clock.Now()
	ahead := func(name string) bool {
		t, _ := scheduledBackupTime(name)
		return t.After(now)
	}
	sort.SliceStable(names, func(i, j int) bool { return ahead(names[i]) && !ahead(names[j]) })
	return names
}

func scheduledBackupTime(name string) (time.Time, bool) {
	ts, ok := strings.CutPrefix(name, scheduledBackupPrefix)
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(scheduledBackupLayout, ts)
	return t, err == nil
}

// pruneBackups deletes the oldest scheduled backups beyond BackupKeep, and what a backup into
// BackupDir cut short by a crash left (its hidden temporary folder). It holds the backup lock:
// no backup is being written meanwhile, so every such folder is a leftover.
func (s *Server) pruneBackups() {
	s.backupMu.Lock()
	defer s.backupMu.Unlock()
	names := s.scheduledBackups()
	for len(names) > s.cfg.BackupKeep {
		if err := os.RemoveAll(filepath.Join(s.cfg.BackupDir, names[0])); err != nil {
			s.log.Error().Err(err).Str("path", names[0]).Msg("deleting an old scheduled backup")
			break
		}
		names = names[1:]
	}
	entries, err := os.ReadDir(s.cfg.BackupDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		base, _, ok := strings.Cut(strings.TrimPrefix(e.Name(), "."), ".itx-backup-")
		if _, named := scheduledBackupTime(base); ok && named && e.IsDir() && strings.HasPrefix(e.Name(), ".") {
			os.RemoveAll(filepath.Join(s.cfg.BackupDir, e.Name()))
		}
	}
	syncDir(s.cfg.BackupDir)
}
