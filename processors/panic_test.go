package processors_test

import (
	"context"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
	proctest "github.com/itx-dev/itx/processors/testing"
)

// A panic in a processor's hooks fails the frame with an error that names the hook and the
// event, as a returned error names the event: which code panicked on what.
func TestRunner_PanicNamesTheHookAndTheEvent(t *testing.T) {
	contract := func(proctest.Env) processors.Contract[int] {
		return processors.Contract[int]{
			Name: "pan", ConsumedTypes: []string{"p/reduce", "p/process", "p/blocker"}, ReducerVersion: "1",
			InitialState: func() int { return 0 },
			Reduce: func(n int, e itx.Event) int {
				if e.Type == "p/reduce" {
					panic("reduce boom")
				}
				return n + 1
			},
			ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
				switch {
				case a.Event == nil:
				case a.Event.Type == "p/process":
					panic("process boom")
				case a.Event.Type == "p/blocker":
					a.BlockProcessorWhile("blk", func(ctx context.Context) error { panic("blocker boom") })
				}
				return nil
			},
		}
	}
	for typ, want := range map[string]string{
		"p/reduce":  `processor "pan": Reduce panicked on event 1 (p/reduce): reduce boom`,
		"p/process": `processor "pan": ProcessEvent panicked on event 1 (p/process): process boom`,
		"p/blocker": `processor "pan": event 1 (p/blocker): blocker "blk": itx.internal: blocker panicked: blocker boom`,
	} {
		cfg := proctest.Config[int]{New: contract, StrictDeliveryErrors: true}
		proctest.Run(t, cfg, func(t *testing.T, h *proctest.Harness[int]) {
			h.Append(itx.EventInput{Type: typ})
			errs := h.TakeDeliveryErrors()
			if len(errs) == 0 || !strings.Contains(errs[0].Error(), want) {
				t.Errorf("%s: errors %v, want one containing %q", typ, errs, want)
			}
		})
	}
}
