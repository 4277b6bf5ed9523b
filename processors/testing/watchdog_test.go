package proctest_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
	proctest "github.com/itx-dev/itx/processors/testing"
)

// outsideGate is a hanging vendor fake written the natural, wrong way: its channel is made
// before proctest.Run, outside the synctest bubble, so an attempt waiting on it is never
// durably blocked and no step can settle.
func outsideGate(gate <-chan struct{}) func(proctest.Env) processors.Contract[tally] {
	return func(env proctest.Env) processors.Contract[tally] {
		return processors.Contract[tally]{
			Name: "outside", ConsumedTypes: []string{"job/queued"}, ReducerVersion: "1",
			InitialState: func() tally { return tally{} },
			Reduce:       func(s tally, e itx.Event) tally { return tally{N: s.N + 1} },
			ProcessEvent: func(ctx context.Context, a *processors.Args[tally]) error {
				if a.Event != nil {
					// Droppable: the test is about the harness noticing the hang.
					a.RunInBackground(func(ctx context.Context) error { <-gate; return nil })
				}
				return nil
			},
		}
	}
}

const watchdogChild = "PROCTEST_WATCHDOG_CHILD"

// A scenario whose vendor fake blocks on a channel made outside the bubble would hang until the
// go test timeout; Run's real-time watchdog ends it instead, saying what is wrong and how to fix
// it. The hang runs in a child process of this test binary, which the watchdog ends.
func TestRun_WatchdogExplainsAnOutsideChannel(t *testing.T) {
	if os.Getenv(watchdogChild) == "1" {
		gate := make(chan struct{}) // outside the bubble: the mistake under test
		cfg := proctest.Config[tally]{New: outsideGate(gate), Watchdog: 200 * time.Millisecond}
		proctest.Run(t, cfg, func(t *testing.T, h *proctest.Harness[tally]) {
			h.Append(itx.EventInput{Type: "job/queued"}) // never settles
		})
		t.Fatal("Run returned: the watchdog did not fire")
	}
	if testing.Short() {
		t.Skip("runs a child test binary")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRun_WatchdogExplainsAnOutsideChannel$", "-test.timeout=60s")
	cmd.Env = append(os.Environ(), watchdogChild+"=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the child passed, want it ended by the watchdog:\n%s", out)
	}
	for _, want := range []string{
		"proctest: a Settle has not settled after",
		"made outside its testing/synctest bubble",
		"before proctest.Run",
		"channels inside the",
		"Config.Watchdog",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("child output lacks %q:\n%.3000s", want, out)
		}
	}
	if strings.Contains(string(out), "test timed out") {
		t.Errorf("the go test timeout ended the child, not the watchdog:\n%.2000s", out)
	}
}

// A channel made inside the scenario is the fix: the same hanging fake settles (durably
// blocked), and the watchdog stays quiet.
func TestRun_WatchdogQuietForAFakeMadeInside(t *testing.T) {
	var gate chan struct{}
	cfg := proctest.Config[tally]{Watchdog: 200 * time.Millisecond, New: func(env proctest.Env) processors.Contract[tally] {
		return outsideGate(gate)(env)
	}}
	proctest.Run(t, cfg, func(t *testing.T, h *proctest.Harness[tally]) {
		gate = make(chan struct{}) // inside the bubble
		h.Crash()                  // the successor's New sees the gate
		h.Append(itx.EventInput{Type: "job/queued"})
		if got := h.State().N; got != 1 {
			t.Errorf("state %d, want 1", got)
		}
		close(gate)
	})
}
