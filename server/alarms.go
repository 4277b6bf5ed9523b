package server

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/itx-dev/itx"
)

// wakeDue loads every stream whose alarm is due (its deliverers resume the work it owes), then
// arms a timer for the next alarm. It runs at start, so a restarted server resumes deliveries
// and retries without waiting for an append, and again whenever that timer fires.
func (s *Server) wakeDue() {
	if s.enterInflight() != nil {
		return // closing: the directory it reads is about to close
	}
	defer s.inflight.Done()
	ctx := s.base
	now := itx.UnixMilli(s.clock.Now())
	due, err := s.dir.DueAlarms(ctx, now)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error().Err(err).Msg("reading due alarms")
		}
		return
	}
	deferred, unreadable := 0, 0
	var projects []string // of the deferred streams, the first few distinct, for the warning
	for _, d := range due {
		a, err := s.acquire(ctx, StreamRef{ProjectID: d.ProjectID, Path: d.Path})
		if err != nil {
			if itx.ErrorCode(err) == itx.ELimitExceeded {
				deferred++ // --max-held-streams: try again shortly, when streams are released
				if len(projects) < 8 && !slices.Contains(projects, d.ProjectID) {
					projects = append(projects, d.ProjectID)
				}
				continue
			}
			if storeUnreadable(err) {
				// Its file is lost or damaged: noteDamaged logged it, once per stream and
				// cause (logged here too, it came again at every wake-up of any stream). Its
				// alarm stays as recorded, tried at every wake-up and at least every
				// unreadableRetryMs, so the work it owes is done once its file is restored.
				unreadable++
				continue
			}
			if ctx.Err() == nil {
				s.log.Error().Err(err).Str("project", d.ProjectID).Str("path", d.Path).Msg("waking a stream for its alarm")
			}
			continue
		}
		s.release(a)
	}
	// Logged once per crossing, as the shares are: while a project sits at its share this
	// runs every second, and it wrote a warning each time.
	if deferred > 0 {
		if !s.alarmsWaiting.Swap(true) {
			s.log.Warn().Int("streams", deferred).Strs("projects", projects).Int("maxHeldStreams", s.cfg.MaxHeldStreams).
				Msg("streams with work due wait: every loaded stream is in use (--max-held-streams), or their project holds its share of them (--max-held-streams-per-project); retrying every second until they load (logged again only after they did)")
		}
		s.alarmChanged(now + alarmRetryMs)
	} else if s.alarmsWaiting.Swap(false) {
		s.log.Info().Msg("streams with work due load again: the streams that waited for --max-held-streams or --max-held-streams-per-project are loaded")
	}
	if unreadable > 0 {
		s.alarmChanged(now + unreadableRetryMs)
	}
	next, err := s.dir.NextAlarm(ctx, now)
	if err != nil {
		return
	}
	if next > 0 {
		s.alarmChanged(next)
	}
}

// alarmRetryMs is how soon wakeDue tries again for due streams it could not load.
const alarmRetryMs = 1000

// unreadableRetryMs is how soon, at the latest, wakeDue tries again the due streams whose store
// cannot be read (lost or damaged: an operator restores the file, or mends its mode, without
// restarting itxd). Only their due alarms, already in the past, kept them owed, and nothing
// woke them but another stream's alarm or a call.
const unreadableRetryMs = 60_000

// alarmChanged makes sure the alarm timer fires no later than due (epoch ms).
func (s *Server) alarmChanged(due int64) {
	s.alarmMu.Lock()
	defer s.alarmMu.Unlock()
	if s.base.Err() != nil || (s.alarmNext != 0 && s.alarmNext <= due) {
		return
	}
	if s.alarmT != nil {
		s.alarmT.Stop()
	}
	s.alarmNext = due
	s.alarmT = itx.AfterFuncAt(s.clock, time.UnixMilli(due), func() {
		s.alarmMu.Lock()
		s.alarmNext = 0
		s.alarmMu.Unlock()
		s.wakeDue()
	})
}

// procVersionSetting is the directory setting holding the version of the processors the last
// process hosted.
const procVersionSetting = "processors.version"

// checkProcessorsVersion compares the hosted processors' version with the last process's. On a
// new one (the antidote deploy), every stream with an alarm armed is loaded now, whenever it is
// due: its first step fires its in-process alarm slice early, so a processor backing off (up to
// the breaker's 6 h plateau) under the old version is revived at once with a fresh budget. The
// version is recorded once every such stream was loaded: a crash before then does it again.
func (s *Server) checkProcessorsVersion(ctx context.Context) error {
	version := s.cfg.Processors.Version()
	prev, err := s.dir.Setting(ctx, procVersionSetting)
	if err != nil {
		return err
	}
	if prev != nil && string(prev) == version {
		return nil
	}
	s.procVersionChanged = true
	return nil
}

// loadForNewVersion loads every stream with an alarm armed (see checkProcessorsVersion), then
// records version.
func (s *Server) loadForNewVersion(version string) {
	if s.enterInflight() != nil {
		return // closing: the next start does it
	}
	defer s.inflight.Done()
	ctx := s.base
	armed, err := s.dir.DueAlarms(ctx, math.MaxInt64)
	if err != nil {
		return
	}
	for _, d := range armed {
		a, err := s.acquire(ctx, StreamRef{ProjectID: d.ProjectID, Path: d.Path})
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn().Err(err).Str("project", d.ProjectID).Str("path", d.Path).Msg("loading a stream for the processors' new version")
			}
			continue
		}
		s.release(a)
	}
	if err := s.dir.SetSetting(ctx, procVersionSetting, []byte(version)); err != nil && ctx.Err() == nil {
		s.log.Error().Err(err).Msg("recording the processors' version")
	}
}
