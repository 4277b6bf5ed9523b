// Package clocktest is a virtual itx.Clock for tests: time moves only when the test says so.
package clocktest

import (
	"sort"
	"sync"
	"time"

	"github.com/itx-dev/itx"
)

// Clock is a virtual clock. AfterFunc callbacks run in their own goroutine when Advance passes
// their due time, as with the system clock.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*timer
}

type timer struct {
	c       *Clock
	due     time.Time
	f       func()
	stopped bool
}

// New returns a clock reading start.
func New(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the virtual time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc schedules f at Now()+d. A timer already due (d <= 0) fires at once, as with the
// system clock, rather than waiting for the next Advance.
func (c *Clock) AfterFunc(d time.Duration, f func()) itx.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &timer{c: c, due: c.now.Add(d), f: f}
	if d <= 0 {
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

// Advance moves time forward by d and fires every timer that came due, in due order.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*timer
	kept := c.timers[:0]
	for _, t := range c.timers {
		switch {
		case t.stopped:
		case !t.due.After(c.now):
			t.stopped = true
			due = append(due, t)
		default:
			kept = append(kept, t)
		}
	}
	c.timers = kept
	c.mu.Unlock()
	sort.Slice(due, func(i, j int) bool { return due[i].due.Before(due[j].due) })
	for _, t := range due {
		go t.f()
	}
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
