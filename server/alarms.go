package server

import (
	"time"

	"github.com/itx-dev/itx"
)

// wakeDue loads every stream whose alarm is due (its deliverers resume the work it owes), then
// arms a timer for the next alarm. It runs at start, so a restarted server resumes deliveries
// and retries without waiting for an append, and again whenever that timer fires.
func (s *Server) wakeDue() {
	ctx := s.base
	now := itx.UnixMilli(s.clock.Now())
	due, err := s.dir.DueAlarms(ctx, now)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error().Err(err).Msg("reading due alarms")
		}
		return
	}
	for _, d := range due {
		a, err := s.acquire(ctx, StreamRef{ProjectID: d.ProjectID, Path: d.Path})
		if err != nil {
			if ctx.Err() == nil {
				s.log.Error().Err(err).Str("path", d.Path).Msg("waking a stream for its alarm")
			}
			continue
		}
		s.release(a)
	}
	next, err := s.dir.NextAlarm(ctx, now)
	if err != nil {
		return
	}
	if next > 0 {
		s.alarmChanged(next)
	}
}

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
