package processors

import (
	"fmt"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
)

// renderPlan prints a plan one line per event, then the frame outcome.
func renderPlan(p framePlan, err error) string {
	if err != nil {
		return "error " + string(itx.ErrorCode(err))
	}
	var b strings.Builder
	for _, pe := range p.events {
		fmt.Fprintf(&b, "%d %s %s", pe.event.Offset, pe.event.Type, pe.kind)
		if pe.caughtUp {
			b.WriteString(" caughtUp")
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "through=%d head=%d eventless=%v commit=%v", p.through, p.head, p.eventless, p.commit)
	return b.String()
}

func TestPlanFrame(t *testing.T) {
	classify := func(e itx.Event) eventKind {
		switch {
		case strings.HasPrefix(e.Type, "bad"):
			return kindMalformed
		case strings.HasPrefix(e.Type, "c"):
			return kindDeliver
		}
		return kindSkip
	}
	ev := func(off int64, typ string) itx.Event { return itx.Event{Offset: off, Type: typ} }
	eph := func(off int64, typ string) itx.Event { e := ev(off, typ); e.Ephemeral = true; return e }
	tests := []struct {
		name      string
		committed int64
		observed  int64
		frame     Frame
		want      string
	}{
		{"whole stream at head: the last consumed event is caught up", 0, 0,
			Frame{Events: []itx.Event{ev(1, "c1"), ev(2, "x"), ev(3, "c2"), ev(4, "x")}, ScannedThrough: 4, Head: 4},
			"1 c1 deliver\n2 x skip\n3 c2 deliver caughtUp\n4 x skip\nthrough=4 head=4 eventless=false commit=true"},
		{"behind the head: nothing is caught up", 0, 0,
			Frame{Events: []itx.Event{ev(1, "c1")}, ScannedThrough: 1, Head: 9},
			"1 c1 deliver\nthrough=1 head=9 eventless=false commit=true"},
		{"filtered frame: the scanned range reaches the head without its rows", 0, 0,
			Frame{Events: []itx.Event{ev(2, "c1")}, ScannedThrough: 7, Head: 7},
			"2 c1 deliver caughtUp\nthrough=7 head=7 eventless=false commit=true"},
		{"an unconsumed tail at the head owes the eventless pass", 0, 0,
			Frame{Events: []itx.Event{ev(1, "x"), ev(2, "x")}, ScannedThrough: 2, Head: 2},
			"1 x skip\n2 x skip\nthrough=2 head=2 eventless=true commit=true"},
		{"an empty scanned range still moves the cursor and reaches the head", 3, 3,
			Frame{ScannedAfter: 3, ScannedThrough: 5, Head: 5},
			"through=5 head=5 eventless=true commit=true"},
		{"a malformed last event does not take the flag", 0, 0,
			Frame{Events: []itx.Event{ev(1, "c1"), ev(2, "bad")}, ScannedThrough: 2, Head: 2},
			"1 c1 deliver caughtUp\n2 bad malformed\nthrough=2 head=2 eventless=false commit=true"},
		{"ephemeral events are never delivered", 0, 0,
			Frame{Events: []itx.Event{ev(1, "c1"), eph(2, "c2")}, ScannedThrough: 2, Head: 2},
			"1 c1 deliver caughtUp\n2 c2 skip\nthrough=2 head=2 eventless=false commit=true"},
		{"redelivered offsets are dropped", 2, 2,
			Frame{Events: []itx.Event{ev(1, "c1"), ev(2, "c2"), ev(3, "c3")}, ScannedThrough: 3, Head: 3},
			"3 c3 deliver caughtUp\nthrough=3 head=3 eventless=false commit=true"},
		{"a wholly redelivered frame commits nothing", 5, 5,
			Frame{Events: []itx.Event{ev(4, "c1")}, ScannedAfter: 3, ScannedThrough: 4, Head: 5},
			"through=5 head=5 eventless=false commit=false"},
		{"the processor's own appends raise the head a stale frame claims", 0, 6,
			Frame{Events: []itx.Event{ev(1, "c1")}, ScannedThrough: 1, Head: 1},
			"1 c1 deliver\nthrough=1 head=6 eventless=false commit=true"},
		{"a frame past the cursor is a gap", 1, 1,
			Frame{Events: []itx.Event{ev(3, "c1")}, ScannedAfter: 2, ScannedThrough: 3, Head: 3},
			"error failedPrecondition"},
		{"events out of order are refused", 0, 0,
			Frame{Events: []itx.Event{ev(2, "c1"), ev(1, "c1")}, ScannedThrough: 2, Head: 2},
			"error invalidArgument"},
		{"an event beyond the scan is refused", 0, 0,
			Frame{Events: []itx.Event{ev(3, "c1")}, ScannedThrough: 2, Head: 3},
			"error invalidArgument"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := renderPlan(planFrame(tt.committed, tt.observed, tt.frame, classify))
			if got != tt.want {
				t.Errorf("got\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}
