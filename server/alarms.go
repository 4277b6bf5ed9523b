package server

import (
	"context"
	"math"
	"slices"
	"strconv"
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
	s.noteClock(ctx, now)
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
		ref := StreamRef{ProjectID: d.ProjectID, Path: d.Path}
		s.mu.Lock()
		_, loaded := s.actors[ref]
		s.mu.Unlock()
		if loaded {
			// Its alarm reads "due now" while it is loaded (a crash leaves it owed a load), and
			// it keeps its own timers. A load here would count as a use: wakeDue runs every
			// alarmSleep, so no stream with an alarm would ever idle out.
			continue
		}
		a, err := s.acquire(ctx, ref)
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
	if next == 0 {
		next = now + alarmSleep.Milliseconds() // to look at the clock again (noteClock)
	}
	s.alarmChanged(next)
}

// alarmRetryMs is how soon wakeDue tries again for due streams it could not load.
const alarmRetryMs = 1000

// unreadableRetryMs is how soon, at the latest, wakeDue tries again the due streams whose store
// cannot be read (lost or damaged: an operator restores the file, or mends its mode, without
// restarting itxd). Only their due alarms, already in the past, kept them owed, and nothing
// woke them but another stream's alarm or a call.
const unreadableRetryMs = 60_000

// alarmSleep is the longest the alarm timer sleeps: it runs on the monotonic clock, so after the
// wall clock stepped forward (NTP, an operator, a VM resumed from a snapshot) it would fire as
// far ahead as it was armed (a day, for a scheduled append due tomorrow) while the alarms it
// serves, wall times, are already due; and a wakeDue notices a step back (noteClock).
const alarmSleep = time.Minute

// relativeAlarmHorizon is the furthest ahead of its setting that a stream's alarm marks a wait
// rather than an appointment: the crash-loop breaker's 6 h plateau (the ladder waits at most
// maxRetryWait, a processor's keepalive 10 s ahead). A scheduled append's due time is an
// appointment on the wall clock, kept whatever the clock does.
const relativeAlarmHorizon = 6*time.Hour + time.Minute

// clockStepSlack is how far back the wall clock may read from one wakeDue to the next before it
// counts as having gone back (noteClock).
const clockStepSlack = time.Second

// clockSeenSetting is the directory setting holding the wall clock's reading at a recent
// wakeDue (at most clockSeenEvery old), so a start on a clock set back finds it went back.
const clockSeenSetting = "clock.seen"

const clockSeenEvery = time.Minute

// noteClock compares the wall clock (now, epoch ms) with its reading at the last wakeDue, the
// last process's at the first. When it reads less, the clock went back (stepped by NTP or an
// operator, a VM restored from a snapshot), and every wait a stream armed before (a retry, a
// processor's keepalive or backoff: alarms of wall times) lies that much further ahead: each
// would be done as long after as the clock went back. The streams whose alarms lie within
// relativeAlarmHorizon of the last reading are woken now instead: loaded, each takes its waits
// again against the clock as it reads now (a retry at once, see retryHorizon; a processor's
// keepalive by its registry), and arms its alarm anew when it unloads. The streams loaded are
// told how far it went back (stepInput.clockBack). Logged once per step.
func (s *Server) noteClock(ctx context.Context, now int64) {
	s.alarmMu.Lock()
	seen, first := s.alarmSeen, s.alarmSeen == 0
	s.alarmMu.Unlock()
	if first {
		if v, err := s.dir.Setting(ctx, clockSeenSetting); err == nil && v != nil {
			seen, _ = strconv.ParseInt(string(v), 10, 64)
		}
	}
	back := seen - now
	stepped := back > clockStepSlack.Milliseconds()
	s.alarmMu.Lock()
	if first {
		s.alarmSeenSaved = seen
	}
	s.alarmSeen = now
	save := stepped || now-s.alarmSeenSaved >= clockSeenEvery.Milliseconds()
	if save {
		s.alarmSeenSaved = now
	}
	s.alarmMu.Unlock()
	if stepped {
		n, err := s.dir.PullAlarms(ctx, now, seen+relativeAlarmHorizon.Milliseconds())
		ev := s.log.Warn()
		if err != nil {
			ev = s.log.Error().Err(err)
		}
		s.mu.Lock()
		loaded := make([]*actor, 0, len(s.actors))
		for _, a := range s.actors {
			loaded = append(loaded, a)
		}
		s.mu.Unlock()
		ev.Dur("back", time.Duration(back)*time.Millisecond).Int64("streams", n).Int("loaded", len(loaded)).
			Msg("the wall clock went back since it was last read: the streams with a retry or a processor's alarm set before are woken now, to wait again from the clock as it reads now; scheduled appends keep their due times")
		for _, a := range loaded {
			a.post(actorMsg{clockBack: back})
		}
	}
	if save {
		// Best effort: a full disk leaves the last reading, and a step is then found against it.
		_ = s.dir.SetSetting(ctx, clockSeenSetting, []byte(strconv.FormatInt(now, 10)))
	}
}

// alarmChanged makes sure the alarm timer fires no later than due (epoch ms), and within
// alarmSleep.
func (s *Server) alarmChanged(due int64) {
	s.alarmMu.Lock()
	defer s.alarmMu.Unlock()
	due = min(due, itx.UnixMilli(s.clock.Now().Add(alarmSleep)))
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
