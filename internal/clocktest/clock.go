// Package clocktest is a virtual itx.Clock for tests: time moves only when the test says so.
package clocktest

import (
	"sort"
	"sync"
	"time"

	"github.com/itx-dev/itx"
)

// Clock is a virtual clock. Advance fires the timers it passes one after another, in due order
// (ties in the order they were armed), on the caller's goroutine, before it returns: a test that
// advanced the clock knows every callback that came due has run.
//
// Like the system's, it has two readings: the wall clock Now returns, which Jump steps (as NTP,
// an operator or a VM resumed from a snapshot step a machine's), and the monotonic time that
// timers run on, which only Advance moves. A timer armed for an instant (AfterFuncAt) is armed
// for the monotonic time the instant lies ahead of the wall clock then, as time.AfterFunc is: a
// Jump neither fires nor moves it. One difference remains: the system clock's readings carry
// the monotonic time, so a duration between two of them (t.Sub(u), time.Since) ignores a step,
// while between two of this clock's readings it includes the Jumps in between; between two of
// Monotonic's (what itx.Monotonic reads) it does not.
type Clock struct {
	mu     sync.Mutex
	now    time.Time     // the monotonic time, timers' base
	skew   time.Duration // what Jump added to the wall clock: Now is now+skew
	seq    int
	timers []*timer
	fire   sync.Mutex // one Advance fires at a time, so due order holds across callers
}

type timer struct {
	c       *Clock
	due     time.Time
	seq     int
	f       func()
	stopped bool
}

// New returns a clock reading start.
func New(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the virtual time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now.Add(c.skew)
}

// Monotonic returns the monotonic time, which only Advance moves: durations between its readings
// leave out the Jumps, as those between the system clock's readings do (see itx.Monotonic).
func (c *Clock) Monotonic() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Jump steps the wall clock by d (back when negative), leaving the monotonic time and every
// armed timer where they are: nothing fires.
func (c *Clock) Jump(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.skew += d
}

// AfterFunc schedules f at Now()+d. A timer already due (d <= 0) fires at once on its own
// goroutine, as with the system clock: its caller may hold locks f needs.
func (c *Clock) AfterFunc(d time.Duration, f func()) itx.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.arm(c.now.Add(d), f)
}

// AfterFuncAt schedules f at the instant at, read against the clock in the same step that arms
// the timer (see itx.AfterFuncAt); an instant already passed fires at once.
func (c *Clock) AfterFuncAt(at time.Time, f func()) itx.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.arm(at.Add(-c.skew), f)
}

// arm adds a timer due at due. Called with c.mu held.
func (c *Clock) arm(due time.Time, f func()) itx.Timer {
	c.seq++
	t := &timer{c: c, due: due, seq: c.seq, f: f}
	if !due.After(c.now) {
		t.stopped = true
		go f()
		return t
	}
	c.timers = append(c.timers, t)
	return t
}

// Stop cancels the timer if it has not fired.
func (t *timer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.stopped {
		return false
	}
	t.stopped = true
	return true
}

// Advance moves time forward by d and runs every timer that comes due, in due order. Time
// moves to each timer's due time before it runs, so a callback that arms another timer inside
// the advanced span sees it fire in turn.
func (c *Clock) Advance(d time.Duration) {
	c.fire.Lock()
	defer c.fire.Unlock()
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		var next *timer
		for _, t := range c.timers {
			if t.stopped || t.due.After(end) {
				continue
			}
			if next == nil || t.due.Before(next.due) || (t.due.Equal(next.due) && t.seq < next.seq) {
				next = t
			}
		}
		if next == nil {
			c.now = end
			c.compact()
			c.mu.Unlock()
			return
		}
		next.stopped = true
		if next.due.After(c.now) {
			c.now = next.due
		}
		c.mu.Unlock()
		next.f()
	}
}

// AdvanceEach moves time forward by d as Advance does, but one due instant at a time, calling
// settle after each instant's timers have run (and once at the end). On a real clock the work a
// fire releases on other goroutines (a revival's redelivery, the frame it runs) takes
// microseconds of a timer's seconds; within one Advance it races the span's later timers (the
// frame's deadline, the confirming fire), which fire as fast as the loop can call them. settle
// waits for that work (e.g. Server.Settle), so it runs at its fire's time.
func (c *Clock) AdvanceEach(d time.Duration, settle func()) {
	end := c.Now().Add(d)
	for {
		next, ok := c.Next()
		if !ok || next.After(end) {
			c.Advance(end.Sub(c.Now()))
			settle()
			return
		}
		c.Advance(max(0, next.Sub(c.Now())))
		settle()
	}
}

// compact drops fired and stopped timers. Called with c.mu held.
func (c *Clock) compact() {
	kept := c.timers[:0]
	for _, t := range c.timers {
		if !t.stopped {
			kept = append(kept, t)
		}
	}
	clear(c.timers[len(kept):])
	c.timers = kept
	sort.SliceStable(c.timers, func(i, j int) bool { return c.timers[i].seq < c.timers[j].seq })
}

// Next is the due time of the earliest armed timer on the wall clock (false when none is
// armed): a driver that must let the work a timer releases run at the timer's time advances to
// it, not past it.
func (c *Clock) Next() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var next time.Time
	found := false
	for _, t := range c.timers {
		if !t.stopped && (!found || t.due.Before(next)) {
			next, found = t.due, true
		}
	}
	return next.Add(c.skew), found
}

// Pending reports how many timers are armed (tests wait on it instead of sleeping).
func (c *Clock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if !t.stopped {
			n++
		}
	}
	return n
}
