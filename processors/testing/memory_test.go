package proctest_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/itxtest"
	proctest "github.com/itx-dev/itx/processors/testing"
)

// The in-memory stream refuses the stream/* events itxd refuses from a processor's append (the
// cases TestProcessors_ControlEventAppendsAsTheHarnessJudgesThem, in test/, sends a real itxd),
// so a processor that appends one fails in the harness rather than first in production, where
// its frame would fail at every redelivery. Before, it took any stream/* type but the two the
// SDK writes without a look.
func TestMemoryStream_RefusesControlEventsItxdRefuses(t *testing.T) {
	for _, tc := range itxtest.ControlAppendCases {
		t.Run(tc.Name, func(t *testing.T) {
			s := proctest.NewMemoryStream("/m", itx.SystemClock{})
			// The subscription the control events name exists, as in the itxd test.
			if _, err := s.Append(t.Context(), []itx.EventInput{{Type: itx.TypeSubscriptionConfigured,
				Payload: []byte(`{"name":"hook","receiver":{"action":"processor-wake"}}`)}}); err != nil {
				t.Fatal(err)
			}
			_, err := s.Append(t.Context(), []itx.EventInput{{Type: tc.Type, Payload: []byte(tc.Payload)}})
			if tc.OK {
				if err != nil {
					t.Errorf("refused: %v", err)
				}
				return
			}
			if got, want := itx.ErrorCode(err), itx.EInvalid; got != want {
				t.Errorf("code %q (%v), want %q", got, err, want)
			}
			if got := s.Head(); got != 1 {
				t.Errorf("head %d after a refused append, want 1", got)
			}
		})
	}
}

// The bounds of one append call hold in the harness as in itxd: a processor's batch past them,
// or carrying what only itxd writes (provenance, a server key), is refused whole.
func TestMemoryStream_RefusesAppendsPastItxdsBounds(t *testing.T) {
	big := make([]byte, 900<<10)
	for i := range big {
		big[i] = 'x'
	}
	bigPayload := []byte(`{"s":"` + string(big) + `"}`)
	many := make([]itx.EventInput, itx.MaxAppendEvents+1)
	for i := range many {
		many[i] = itx.EventInput{Type: "x/y"}
	}
	heavy := make([]itx.EventInput, 10) // 10 x 900 KiB: each under the event bound, past the batch's
	for i := range heavy {
		heavy[i] = itx.EventInput{Type: "x/y", Payload: bigPayload}
	}
	for _, tc := range []struct {
		name   string
		inputs []itx.EventInput
		want   itx.Code
	}{
		{"no event", nil, itx.EInvalid},
		{"too many events", many, itx.ETooLarge},
		{"too many bytes", heavy, itx.ETooLarge},
		{"provenance", []itx.EventInput{{Type: "x/y", Provenance: []itx.Hop{{Path: "/a", Offset: 1}}}}, itx.EInvalid},
		{"a server key", []itx.EventInput{{Type: "x/y", IdempotencyKey: itx.InternalKeyPrefix + "k"}}, itx.EInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := proctest.NewMemoryStream("/m", itx.SystemClock{})
			_, err := s.Append(t.Context(), tc.inputs)
			if got := itx.ErrorCode(err); got != tc.want {
				t.Errorf("code %q (%v), want %q", got, err, tc.want)
			}
			if s.Head() != 0 {
				t.Errorf("head %d after a refused append", s.Head())
			}
		})
	}
	// At the bounds, taken.
	s := proctest.NewMemoryStream("/m", itx.SystemClock{})
	if _, err := s.Append(t.Context(), many[:itx.MaxAppendEvents]); err != nil {
		t.Errorf("%d events: %v", itx.MaxAppendEvents, err)
	}
	if _, err := s.Append(t.Context(), heavy[:9]); err != nil {
		t.Errorf("9 x 900 KiB: %v", err)
	}
}

// The in-memory stream holds at most itxd's default number of pending scheduled appends: one
// more key is refused with limitExceeded, as itxd refuses it (--max-scheduled-per-stream), while
// moving a pending key is not a new one. Before, it took any number, so a processor that leaves
// a timer behind per event passed its harness tests and failed its frames first in production.
func TestMemoryStream_SchedulesUpToItxdsBound(t *testing.T) {
	s := proctest.NewMemoryStream("/m", itx.SystemClock{})
	at := time.Now().Add(time.Hour)
	timer := func(i int) itx.EventInput {
		return itx.EventInput{Type: "x/timer", IdempotencyKey: fmt.Sprintf("t-%d", i)}
	}
	for i := range itx.MaxScheduledPerStream {
		if err := s.Schedule(t.Context(), timer(i), at); err != nil {
			t.Fatalf("timer %d: %v", i, err)
		}
	}
	err := s.Schedule(t.Context(), timer(itx.MaxScheduledPerStream), at)
	if got := itx.ErrorCode(err); got != itx.ELimitExceeded {
		t.Errorf("one timer past the bound: code %q (%v), want %q", got, err, itx.ELimitExceeded)
	}
	if err := s.Schedule(t.Context(), timer(0), at.Add(time.Minute)); err != nil {
		t.Errorf("moving a pending timer at the bound: %v", err)
	}
	if n := len(s.Scheduled()); n != itx.MaxScheduledPerStream {
		t.Errorf("%d pending, want %d", n, itx.MaxScheduledPerStream)
	}
}
