package clocktest

import (
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
)

// A timer armed at an instant fires when the clock reaches it, however far the clock moved
// between the caller reading it and arming: a delay computed from the earlier reading would
// have been late by the move.
func TestAfterFuncAt_FiresAtTheInstant(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	c := New(start)
	due := start.Add(time.Second)
	c.Advance(400 * time.Millisecond) // the clock moves after the caller computed due
	fired := make(chan time.Time, 1)
	itx.AfterFuncAt(c, due, func() { fired <- c.Now() })
	c.Advance(600 * time.Millisecond)
	require.Len(t, fired, 1, "fired at the instant, not 400 ms later")
	require.Equal(t, due, <-fired)
}

// An instant already passed fires at once, on its own goroutine.
func TestAfterFuncAt_PassedInstantFiresAtOnce(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	c := New(start)
	c.Advance(time.Second)
	fired := make(chan struct{})
	itx.AfterFuncAt(c, start, func() { close(fired) })
	select {
	case <-fired:
	case <-time.After(10 * time.Second):
		t.Fatal("a passed instant did not fire")
	}
	require.Equal(t, 0, c.Pending())
}

// The system clock takes the delay from its own reading.
func TestAfterFuncAt_SystemClock(t *testing.T) {
	fired := make(chan struct{})
	itx.AfterFuncAt(itx.SystemClock{}, time.Now().Add(-time.Second), func() { close(fired) })
	select {
	case <-fired:
	case <-time.After(10 * time.Second):
		t.Fatal("a passed instant did not fire")
	}
}

// Next is the earliest armed timer's due time; stopped and fired timers do not count.
func TestClock_Next(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	c := New(start)
	_, ok := c.Next()
	require.False(t, ok, "no timer armed")
	late := c.AfterFunc(3*time.Second, func() {})
	c.AfterFunc(5*time.Second, func() {})
	early := c.AfterFunc(time.Second, func() {})
	next, ok := c.Next()
	require.True(t, ok)
	require.Equal(t, start.Add(time.Second), next)
	early.Stop()
	next, _ = c.Next()
	require.Equal(t, start.Add(3*time.Second), next)
	_ = late
	c.Advance(4 * time.Second)
	next, _ = c.Next()
	require.Equal(t, start.Add(5*time.Second), next)
}

// AdvanceEach lets the work a fire releases on another goroutine run at the fire's time: a fire
// at 1 s hands a job to a worker, and a deadline at 2 s finds it done, where within one Advance
// the deadline fired while the job was still on its way.
func TestClock_AdvanceEach(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	c := New(start)
	jobs, ran := make(chan struct{}, 1), make(chan time.Time, 1)
	go func() {
		for range jobs {
			ran <- c.Now()
		}
	}()
	defer close(jobs)
	var dispatched, done int
	var at []time.Time
	deadlineSawDone := false
	c.AfterFunc(time.Second, func() { dispatched++; jobs <- struct{}{} })
	c.AfterFunc(2*time.Second, func() { deadlineSawDone = done == dispatched })
	settles := 0
	c.AdvanceEach(10*time.Second, func() {
		settles++
		for done < dispatched { // wait for the released work, as Server.Settle does
			at = append(at, <-ran)
			done++
		}
	})
	require.True(t, deadlineSawDone, "the 2 s deadline fired after the 1 s fire's work was done")
	require.Equal(t, []time.Time{start.Add(time.Second)}, at, "the released work ran at its fire's time")
	require.Equal(t, 3, settles, "once after each due instant (1 s, 2 s) and once at the end")
	require.Equal(t, start.Add(10*time.Second), c.Now())
}
