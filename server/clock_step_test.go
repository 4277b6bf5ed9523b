package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/storage"
	"github.com/stretchr/testify/require"
)

// stepHook is a webhook receiver that answers 503 (with Retry-After when retryAfter is set) until
// told to accept, and counts the requests it took.
type stepHook struct {
	*httptest.Server
	accept   atomic.Bool
	requests atomic.Int64
	got      chan struct{} // one send per request, never blocking
}

func newStepHook(t *testing.T, retryAfter string) *stepHook {
	h := &stepHook{got: make(chan struct{}, 64)}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.requests.Add(1)
		select {
		case h.got <- struct{}{}:
		default:
		}
		if h.accept.Load() {
			w.WriteHeader(http.StatusOK)
			return
		}
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(h.Close)
	return h
}

// waitRequest waits for the hook's next request, failing the test after bound.
func (h *stepHook) waitRequest(t *testing.T, bound time.Duration, why string) {
	t.Helper()
	select {
	case <-h.got:
	case <-time.After(bound):
		t.Fatalf("%s: no request within %v (%d so far)", why, bound, h.requests.Load())
	}
}

// failOnce configures a webhook subscription on ref and appends one event, which the hook
// refuses: the subscription is left retrying, its NextAttemptAt returned.
func failOnce(t *testing.T, s *Server, ref StreamRef, h *stepHook) int64 {
	t.Helper()
	ctx := context.Background()
	_, _, err := s.ConfigureSubscription(ctx, ref, itx.SubscriptionConfig{Name: "hook", Receiver: itx.Receiver{
		Action: itx.KindWebhookPost, URL: h.URL, Delivery: &itx.DeliveryPolicy{Start: itx.StartNow, OnFailingEvent: itx.OnFailingHalt}}}, "")
	require.NoError(t, err)
	_, err = s.Append(ctx, ref, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
	require.NoError(t, err)
	h.waitRequest(t, 10*time.Second, "the first try")
	require.NoError(t, s.Settle(ctx, ref))
	d, err := s.DescribeSubscription(ctx, ref, "hook")
	require.NoError(t, err)
	require.Equal(t, storage.StatusActive, d.Status)
	require.Equal(t, 1, d.Attempt, d.LastError)
	return d.NextAttemptAt
}

// A retry waits the time the ladder set, not that plus however far the wall clock went back
// meanwhile: the wake timer fires on the monotonic clock, and the step then read the retry
// time, a wall time, as a day ahead (the step back) and waited for it. A step back of minutes
// is found by the server within alarmSleep (noteClock), and the retry is done then.
func TestClockStep_RetryOfALoadedStreamAfterTheClockWentBack(t *testing.T) {
	for _, c := range []struct {
		back, within time.Duration
	}{{24 * time.Hour, time.Second}, {10 * time.Minute, time.Second + alarmSleep}} {
		t.Run(c.back.String(), func(t *testing.T) {
			clock := clocktest.New(time.Unix(1_800_000_000, 0))
			s, projectID := mustOpen(t, Config{DataDir: t.TempDir(), Clock: clock, Random: func() float64 { return 0.5 }})
			ref := StreamRef{ProjectID: projectID, Path: "/a"}
			h := newStepHook(t, "")
			next := failOnce(t, s, ref, h)
			require.Equal(t, clock.Now().Add(time.Second).UnixMilli(), next, "the ladder's first rung")

			h.accept.Store(true)
			clock.Jump(-c.back)
			clock.Advance(c.within)
			h.waitRequest(t, 10*time.Second, "the retry")
			require.NoError(t, s.Settle(context.Background(), ref))
			d, err := s.DescribeSubscription(context.Background(), ref, "hook")
			require.NoError(t, err)
			require.Zero(t, d.Attempt, d.LastError)
			require.Zero(t, d.NextAttemptAt)
		})
	}
}

// An unloaded stream's retry (its alarm in the directory) is woken when the clock goes back,
// while itxd runs and across a restart: its alarm, a wall time, lay a day ahead.
func TestClockStep_RetryOfAnUnloadedStreamAfterTheClockWentBack(t *testing.T) {
	for _, restart := range []bool{false, true} {
		name := "running"
		if restart {
			name = "restart"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			clock := clocktest.New(time.Unix(1_800_000_000, 0))
			dir := t.TempDir()
			s, err := Open(ctx, Config{DataDir: dir, Clock: clock, Random: func() float64 { return 0.5 }})
			require.NoError(t, err)
			creds, err := ReadCredentials(dir)
			require.NoError(t, err)
			proj, err := s.Login(ctx, creds.ProjectToken)
			require.NoError(t, err)
			ref := StreamRef{ProjectID: proj.ID, Path: "/a"}
			h := newStepHook(t, "1800") // Retry-After: the ladder waits 30 min
			next := failOnce(t, s, ref, h)
			require.Equal(t, clock.Now().Add(30*time.Minute).UnixMilli(), next)
			clock.Advance(s.cfg.IdleTimeout + time.Minute) // unloads /a
			require.Eventually(t, func() bool { return s.LoadedStreams() == 0 }, 10*time.Second, time.Millisecond)
			h.accept.Store(true)
			if restart {
				require.NoError(t, s.Close(ctx))
				clock.Jump(-24 * time.Hour)
				s, err = Open(ctx, Config{DataDir: dir, Clock: clock, Random: func() float64 { return 0.5 }})
				require.NoError(t, err)
			} else {
				clock.Jump(-24 * time.Hour)
				clock.Advance(alarmSleep)
			}
			t.Cleanup(func() { mustClose(t, s) })
			h.waitRequest(t, 10*time.Second, "the retry")
			require.Eventually(t, func() bool {
				d, err := s.DescribeSubscription(ctx, ref, "hook")
				return err == nil && d.ConfirmedOffset == 2 && d.Attempt == 0
			}, 10*time.Second, time.Millisecond)
		})
	}
}

// A scheduled append is an appointment on the wall clock: after the clock stepped forward past
// its due time it lands within alarmSleep, loaded or not (the timers, on the monotonic clock,
// were armed a day ahead); after the clock stepped back it keeps its time, though the step woke
// its stream, and lands once.
func TestClockStep_ScheduledAppend(t *testing.T) {
	ctx := context.Background()
	clock := clocktest.New(time.Unix(1_800_000_000, 0))
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir(), Clock: clock})
	events := func(ref StreamRef) []string {
		page, err := s.ReadEvents(ctx, ref, itx.Query{})
		require.NoError(t, err)
		var types []string
		for _, e := range page.Events {
			types = append(types, e.Type)
		}
		return types
	}
	// prepare makes ref with one event and schedules "due" at due, then holds it loaded (as a
	// call or a connection does) or lets it unload.
	prepare := func(t *testing.T, ref StreamRef, due time.Time, loaded bool) {
		_, err := s.Append(ctx, ref, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
		require.NoError(t, err)
		if loaded {
			held, err := s.acquire(ctx, ref)
			require.NoError(t, err)
			t.Cleanup(func() { s.release(held) })
		}
		_, _, err = s.Schedule(ctx, ref, itx.EventInput{Type: "due", IdempotencyKey: "k"}, due.UnixMilli())
		require.NoError(t, err)
		if !loaded {
			clock.Advance(s.cfg.IdleTimeout + time.Minute)
			require.Eventually(t, func() bool {
				s.mu.Lock()
				defer s.mu.Unlock()
				return s.actors[ref] == nil
			}, 10*time.Second, time.Millisecond)
		}
	}
	for _, loaded := range []bool{true, false} {
		name := "unloaded"
		if loaded {
			name = "loaded"
		}
		t.Run(name+"/forward", func(t *testing.T) {
			ref := StreamRef{ProjectID: projectID, Path: "/forward-" + name}
			prepare(t, ref, clock.Now().Add(24*time.Hour), loaded)
			clock.Jump(25 * time.Hour)
			clock.Advance(alarmSleep)
			if !loaded {
				// Woken by its alarm, not by the reads below (each loads it).
				require.Eventually(t, func() bool {
					s.mu.Lock()
					defer s.mu.Unlock()
					return s.actors[ref] != nil
				}, 10*time.Second, time.Millisecond, "woken within alarmSleep")
			}
			require.Eventually(t, func() bool { return len(events(ref)) == 2 }, 10*time.Second, time.Millisecond,
				"lands within alarmSleep")
			clock.Advance(alarmSleep)
			require.NoError(t, s.Settle(ctx, ref))
			require.Equal(t, []string{"x", "due"}, events(ref), "once")
		})
		t.Run(name+"/back", func(t *testing.T) {
			ref := StreamRef{ProjectID: projectID, Path: "/back-" + name}
			prepare(t, ref, clock.Now().Add(time.Hour), loaded)
			// Back two hours: the step wakes the stream (its alarm is within the horizon), and
			// the append due in an hour is due in three.
			clock.Jump(-2 * time.Hour)
			clock.Advance(2 * alarmSleep)
			require.NoError(t, s.Settle(ctx, ref))
			require.Equal(t, []string{"x"}, events(ref), "nothing lands early")
			clock.Advance(3 * time.Hour)
			require.Eventually(t, func() bool { return len(events(ref)) == 2 }, 10*time.Second, time.Millisecond)
			clock.Advance(alarmSleep)
			require.NoError(t, s.Settle(ctx, ref))
			require.Equal(t, []string{"x", "due"}, events(ref), "once")
		})
	}
}

// Scheduled backups go on when the wall clock went back: the backups named after the clock's
// reading were written before the step, so they are the oldest and pruned first (by name alone,
// each new backup sorted before them and was deleted right after it was written), and a restart
// on a clock set back backs up an interval on, not an interval after the newest name.
func TestClockStep_ScheduledBackups(t *testing.T) {
	ctx := context.Background()
	clock := clocktest.New(time.Date(2026, 12, 5, 20, 0, 0, 0, time.UTC))
	dir := t.TempDir()
	cfg := Config{DataDir: t.TempDir(), Clock: clock, BackupDir: dir, BackupEvery: time.Hour, BackupKeep: 2}
	s, err := Open(ctx, cfg)
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
	require.Eventually(t, armed(s, 2), 10*time.Second, time.Millisecond) // the first, at once
	clock.Advance(time.Hour)
	require.Equal(t, []string{"itx-backup-20261205T200000.000Z", "itx-backup-20261205T210000.000Z"}, names())

	clock.Jump(-24 * time.Hour)
	clock.Advance(time.Hour)
	require.Equal(t, []string{"itx-backup-20261204T220000.000Z", "itx-backup-20261205T210000.000Z"}, names(),
		"the new one kept, the oldest written deleted")
	clock.Advance(time.Hour)
	require.Equal(t, []string{"itx-backup-20261204T220000.000Z", "itx-backup-20261204T230000.000Z"}, names())

	// Stopped, the clock set back another day, started: the next is an hour on.
	require.NoError(t, s.Close(ctx))
	clock.Jump(-24 * time.Hour)
	s, err = Open(ctx, cfg)
	require.NoError(t, err)
	defer mustClose(t, s)
	require.Eventually(t, armed(s, 1), 10*time.Second, time.Millisecond)
	clock.Advance(time.Hour)
	require.Equal(t, []string{"itx-backup-20261204T000000.000Z", "itx-backup-20261204T230000.000Z"}, names(),
		"an hour on; the oldest written deleted")
}

// A session ends when the wall clock reads its token's expiry: after a step forward past it
// within alarmSleep (its timer, on the monotonic clock, was armed a day ahead, and its
// connections went on pushing), and after a step back not before it (the timer ended it an
// hour early).
func TestClockStep_TokenExpiry(t *testing.T) {
	ctx := context.Background()
	clock := clocktest.New(time.Unix(1_800_000_000, 0))
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir(), Clock: clock})
	session := func(expires time.Duration) (*Session, chan struct{}) {
		token, _, err := s.CreateToken(ctx, Admin{ProjectID: projectID}, projectID, "expiring", clock.Now().Add(expires).UnixMilli(),
			itx.Scope{Rights: []itx.Right{itx.RightRead}})
		require.NoError(t, err)
		ended := make(chan struct{})
		x, err := s.OpenSession(ctx, token, func() { close(ended) })
		require.NoError(t, err)
		t.Cleanup(x.Close)
		return x, ended
	}
	isEnded := func(ended chan struct{}) bool {
		select {
		case <-ended:
			return true
		default:
			return false
		}
	}

	t.Run("forward", func(t *testing.T) {
		x, ended := session(24 * time.Hour)
		clock.Jump(25 * time.Hour)
		clock.Advance(alarmSleep)
		require.Eventually(t, func() bool { return isEnded(ended) }, 10*time.Second, time.Millisecond, "ended within alarmSleep")
		require.Error(t, x.Check())
	})
	t.Run("back", func(t *testing.T) {
		x, ended := session(time.Hour)
		clock.Jump(-2 * time.Hour)
		clock.Advance(time.Hour + alarmSleep)
		require.False(t, isEnded(ended), "not before its expiry")
		require.NoError(t, x.Check())
		clock.Advance(2 * time.Hour)
		require.Eventually(t, func() bool { return isEnded(ended) }, 10*time.Second, time.Millisecond)
	})
}

// A retention age is an appointment on the wall clock too: a stream held loaded (a connection,
// a live view) trims the event a step forward aged past the limit within alarmSleep, not when
// the timer armed for the whole wait (the limit: an hour here) runs out.
func TestClockStep_RetentionAgeOfAHeldStream(t *testing.T) {
	ctx := context.Background()
	clock := clocktest.New(time.Unix(1_800_000_000, 0))
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir(), Clock: clock})
	ref := StreamRef{ProjectID: projectID, Path: "/aged"}
	_, err := s.Append(ctx, ref, []itx.EventInput{{Type: "x"}, {Type: "x"}}, itx.AppendOptions{})
	require.NoError(t, err)
	held, err := s.acquire(ctx, ref)
	require.NoError(t, err)
	defer s.release(held)
	require.NoError(t, s.SetRetention(ctx, Admin{ProjectID: projectID}, ref, time.Hour.Milliseconds(), 0, 0))
	info, err := s.Describe(ctx, ref)
	require.NoError(t, err)
	require.Zero(t, info.TrimmedThrough)

	clock.Jump(2 * time.Hour)
	clock.Advance(alarmSleep)
	require.Eventually(t, func() bool {
		info, err := s.Describe(ctx, ref)
		return err == nil && info.TrimmedThrough == 2
	}, 10*time.Second, time.Millisecond, "trimmed within alarmSleep")
}
