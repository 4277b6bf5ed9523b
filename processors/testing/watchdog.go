package proctest

import (
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"time"
)

// DefaultWatchdog is how long, in real time, a harness step may wait for the scenario's
// goroutines to settle before Run gives up on it (Config.Watchdog).
const DefaultWatchdog = 10 * time.Second

// watchdog fails a scenario whose step never settles, in real time, from a goroutine outside
// the synctest bubble (inside it, time stands still while anything runs). A step waits with
// synctest.Wait (or sleeps bubble time), which returns only once every goroutine in the bubble
// is durably blocked; a goroutine blocked on a channel, mutex or WaitGroup made outside the
// bubble never is, so without the watchdog the test hangs until the go test timeout with no
// hint of why.
type watchdog struct {
	bound    time.Duration
	depth    atomic.Int32  // steps in progress (they nest: Append settles)
	progress atomic.Uint64 // bumped as a step starts or ends
	what     atomic.Value  // string: the step in progress, for the message
	stop     chan struct{}
	done     chan struct{}
}

// startWatchdog starts a watchdog; it must be called outside the bubble (Run does), or its
// goroutine would keep bubble time. bound < 0 disables it (nil); 0 is DefaultWatchdog.
func startWatchdog(bound time.Duration) *watchdog {
	if bound < 0 {
		return nil
	}
	if bound == 0 {
		bound = DefaultWatchdog
	}
	w := &watchdog{bound: bound, stop: make(chan struct{}), done: make(chan struct{})}
	w.what.Store("")
	go w.run()
	return w
}

func (w *watchdog) run() {
	defer close(w.done)
	tick := time.NewTicker(max(w.bound/20, time.Millisecond))
	defer tick.Stop()
	last, since := w.progress.Load(), time.Now()
	for {
		select {
		case <-w.stop:
			return
		case now := <-tick.C:
			if p := w.progress.Load(); p != last || w.depth.Load() == 0 {
				last, since = p, now
				continue
			}
			if now.Sub(since) >= w.bound {
				w.fire(now.Sub(since))
			}
		}
	}
}

// fire ends the test binary, as the go test timeout would, but at once and saying why: a
// goroutine other than the test's cannot stop the test, and the stuck one cannot be released.
func (w *watchdog) fire(stuck time.Duration) {
	msg := fmt.Sprintf(`proctest: %s has not settled after %v of real time (Config.Watchdog).
A goroutine of the scenario is blocked on something made outside its testing/synctest bubble:
a channel, mutex or WaitGroup created before proctest.Run (a hanging vendor fake built at package
level, or in the test before calling Run). synctest.Wait cannot tell such a goroutine from one
that is still working, so the step would wait forever. Create the fake's channels inside the
scenario (the body passed to Run, or Config.New), or have it block only on its context
(ctx.Done()), which a Crash and the end of the test cancel.`, w.what.Load(), stuck.Round(time.Millisecond))
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	fmt.Fprintf(os.Stderr, "%s\n\ngoroutines:\n%s\n", msg, buf)
	panic(msg)
}

// enter marks the start of a step; exit its end. Both are safe on a nil watchdog.
func (w *watchdog) enter(what string) {
	if w == nil {
		return
	}
	if w.depth.Add(1) == 1 {
		w.what.Store(what)
	}
	w.progress.Add(1)
}

func (w *watchdog) exit() {
	if w == nil {
		return
	}
	w.depth.Add(-1)
	w.progress.Add(1)
}

// alive records progress within a step. Safe on a nil watchdog.
func (w *watchdog) alive() {
	if w != nil {
		w.progress.Add(1)
	}
}

// close stops the watchdog's goroutine.
func (w *watchdog) close() {
	if w == nil {
		return
	}
	close(w.stop)
	<-w.done
}
