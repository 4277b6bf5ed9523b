package itx

import "time"

// Clock is the only source of time in core code; tests inject a virtual one.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed on this clock.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc.
type Timer interface {
	// Stop prevents the call if it has not started; it reports whether it did.
	Stop() bool
}

// SystemClock is the wall clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// AfterFunc wraps time.AfterFunc.
func (SystemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// AfterFuncAt calls f in its own goroutine once c reads at or later. A clock that can arm a timer
// at an instant (a virtual clock, whose time jumps) does so in one step; otherwise the delay is
// taken from c.Now() at once. A delay computed from an earlier reading would fire late by however
// far the clock moved in between.
func AfterFuncAt(c Clock, at time.Time, f func()) Timer {
	if ac, ok := c.(interface {
		AfterFuncAt(at time.Time, f func()) Timer
	}); ok {
		return ac.AfterFuncAt(at, f)
	}
	return c.AfterFunc(max(at.Sub(c.Now()), 0), f)
}

// Monotonic returns a reading of c for measuring how long something has run: the difference of
// two readings (t.Sub(u)) is the time that passed on the monotonic clock timers run on, which a
// step of the wall clock (NTP, an operator, a VM resumed from a snapshot) does not move. The
// system clock's Now carries that reading already; a virtual clock whose wall clock steps gives
// its own (Monotonic() time.Time). Only for durations: it is no wall time, and a reading whose
// monotonic part was stripped (Round(0), UTC(), a round trip through UnixMilli) measures on the
// wall clock again.
func Monotonic(c Clock) time.Time {
	if mc, ok := c.(interface{ Monotonic() time.Time }); ok {
		return mc.Monotonic()
	}
	return c.Now()
}

// UnixMilli is the epoch-milliseconds form used for createdAt and every stored time.
func UnixMilli(t time.Time) int64 { return t.UnixMilli() }
