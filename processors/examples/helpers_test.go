package examples_test

import (
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	proctest "github.com/itx-dev/itx/processors/testing"
)

// revivalGaps renders the time between consecutive stream/processor-revived facts.
func revivalGaps(events []itx.Event) string {
	var gaps []string
	for i := 1; i < len(events); i++ {
		gaps = append(gaps, (time.Duration(events[i].CreatedAt-events[i-1].CreatedAt) * time.Millisecond).String())
	}
	return strings.Join(gaps, " ")
}

// injectFault returns a FailAppends hook refusing every event of type typ.
func injectFault(typ, why string) func(in itx.EventInput) error {
	return func(in itx.EventInput) error {
		if in.Type == typ {
			return itx.Errorf(itx.EUnavailable, "injected: %s", why)
		}
		return nil
	}
}

// takeInjected takes the harness's delivery failures, the ones a scenario provoked with
// injectFault or MemoryStream.LoseAcks, and fails the test on any that is not such a fault: the
// scenario expected those and only those. It returns them, for the caller to count.
func takeInjected[S any](t *testing.T, h *proctest.Harness[S]) []error {
	t.Helper()
	return onlyInjected(t, "delivery", h.TakeDeliveryErrors())
}

// takeInjectedBackground is takeInjected for failed background attempts.
func takeInjectedBackground[S any](t *testing.T, h *proctest.Harness[S]) []error {
	t.Helper()
	return onlyInjected(t, "background attempt", h.TakeBackgroundErrors())
}

func onlyInjected(t *testing.T, what string, errs []error) []error {
	t.Helper()
	for _, err := range errs {
		if itx.ErrorCode(err) != itx.EUnavailable || !strings.Contains(err.Error(), "injected") {
			t.Errorf("%s failed with %v, want only the injected faults (%s)", what, err, itx.EUnavailable)
		}
	}
	return errs
}
