package examples_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors/examples"
	proctest "github.com/itx-dev/itx/processors/testing"
)

// TestForwarder_Simulation drives the forwarder through seeded random scenarios: appends
// delivered or only committed, crashes, time passing, and forward appends that fail before they
// commit or commit and lose their answer. Whatever happened, once the faults stop every inbox
// message has exactly one forward.
func TestForwarder_Simulation(t *testing.T) {
	for seed := uint64(1); seed <= 25; seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			proctest.Run(t, forwarderConfig, func(t *testing.T, h *proctest.Harness[examples.ForwarderState]) {
				simulateForwarder(t, h, rand.New(rand.NewPCG(seed, 0)))
			})
		})
	}
}

func simulateForwarder(t *testing.T, h *proctest.Harness[examples.ForwarderState], rng *rand.Rand) {
	isForward := func(in itx.EventInput) bool { return in.Type == string(examples.OutboxForwarded) }
	n := 0
	for range 40 {
		switch rng.IntN(8) {
		case 0, 1:
			n++
			h.Append(inbox(n))
		case 2:
			n++
			if _, err := h.Stream.Append(t.Context(), []itx.EventInput{inbox(n)}); err != nil {
				t.Fatal(err)
			}
		case 3:
			h.Crash()
		case 4:
			h.AdvanceTime(time.Duration(1+rng.IntN(120)) * time.Second)
		case 5: // failure before commit
			h.Stream.FailAppends(func(in itx.EventInput) error {
				if isForward(in) && rng.IntN(2) == 0 {
					return itx.Errorf(itx.EUnavailable, "injected")
				}
				return nil
			})
		case 6: // failure after commit, the answer lost
			h.Stream.LoseAcks(func(in itx.EventInput) bool { return isForward(in) && rng.IntN(2) == 0 })
		case 7:
			h.Stream.FailAppends(nil)
			h.Stream.LoseAcks(nil)
			h.Wake()
		}
	}
	h.Stream.FailAppends(nil)
	h.Stream.LoseAcks(nil)
	// Every failure so far was an injected fault; once the faults stop, nothing fails (the
	// harness fails the test on a failure it was not given).
	takeInjected(t, h)
	h.AdvanceTime(7 * time.Hour) // every revival the breaker still owes
	h.Wake()

	var sources, forwarded []int64
	for _, e := range h.Events(string(examples.InboxMessage)) {
		sources = append(sources, e.Offset)
	}
	for _, e := range h.Events(string(examples.OutboxForwarded)) {
		f, _ := examples.OutboxForwarded.Decode(e)
		forwarded = append(forwarded, f.SourceOffset)
	}
	slices.Sort(forwarded)
	if !slices.Equal(sources, forwarded) {
		t.Errorf("inbox %v, forwarded %v: want each source exactly once", sources, forwarded)
	}
	if got := h.State().Forwarded; got != len(sources) {
		t.Errorf("state counts %d forwards, want %d", got, len(sources))
	}
	if got, head := h.Runner().ProcessedThrough(), h.Stream.Head(); got != head {
		t.Errorf("cursor %d, head %d", got, head)
	}
}
