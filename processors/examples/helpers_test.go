package examples_test

import (
	"strings"
	"time"

	"github.com/itx-dev/itx"
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
