package examples_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/examples"
	proctest "github.com/itx-dev/itx/processors/testing"
)

var forwarderConfig = proctest.Config[examples.ForwarderState]{
	Path: "/inbox",
	// Every failed frame a scenario provokes is one it injected and takes (takeInjected).
	StrictDeliveryErrors: true,
	New:                  func(proctest.Env) processors.Contract[examples.ForwarderState] { return examples.Forwarder() },
}

func inbox(i int) itx.EventInput {
	return examples.InboxMessage.Input(json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), "")
}

// forwards renders the forwards on the stream in order, as source offsets.
func forwards(t *testing.T, h *proctest.Harness[examples.ForwarderState]) string {
	t.Helper()
	var out []string
	for _, e := range h.Events(string(examples.OutboxForwarded)) {
		f, err := examples.OutboxForwarded.Decode(e)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprint(f.SourceOffset))
	}
	return strings.Join(out, " ")
}

func refuseForwards(h *proctest.Harness[examples.ForwarderState]) {
	h.Stream.FailAppends(injectFault(string(examples.OutboxForwarded), "the outbox is down"))
}

func TestForwarder_EveryEventForwardedOnce(t *testing.T) {
	proctest.Run(t, forwarderConfig, func(t *testing.T, h *proctest.Harness[examples.ForwarderState]) {
		h.Append(inbox(1), inbox(2))
		h.Append(inbox(3))
		if got, want := forwards(t, h), "1 2 5"; got != want { // 3 and 4 are the first forwards
			t.Errorf("forwards %q, want %q", got, want)
		}
		if got := h.Events(string(examples.OutboxForwarded))[0].IdempotencyKey; got != "forwarder/forward@/inbox:1" {
			t.Errorf("forward key %q, want forwarder/forward@/inbox:1", got)
		}
	})
}

func TestForwarder_EvictionMidForward(t *testing.T) {
	proctest.Run(t, forwarderConfig, func(t *testing.T, h *proctest.Harness[examples.ForwarderState]) {
		h.Append(inbox(1))
		// The second event's forward fails mid-frame; the incarnation dies before a retry.
		refuseForwards(h)
		h.Append(inbox(2), inbox(3))
		if got := h.Runner().ProcessedThrough(); got != 2 {
			t.Fatalf("cursor %d after a failed forward, want it held at 2", got)
		}
		if errs := takeInjected(t, h); len(errs) != 1 || !strings.Contains(errs[0].Error(), "event 3 ") {
			t.Errorf("delivery failures %v, want the one frame failing at the forward of event 3 (inbox 2)", errs)
		}
		h.Crash()
		h.Stream.FailAppends(nil)
		// The failed frame armed the keepalive; its fire revives the successor, and delivery
		// redelivers the held events.
		h.AdvanceTime(processors.KeepaliveLead)
		if got, want := forwards(t, h), "1 3 4"; got != want {
			t.Errorf("forwards %q, want %q (each source once)", got, want)
		}
		if got := h.State().Forwarded; got != 3 {
			t.Errorf("forwarded %d, want 3", got)
		}
	})
}

func TestForwarder_Replay(t *testing.T) {
	proctest.Run(t, forwarderConfig, func(t *testing.T, h *proctest.Harness[examples.ForwarderState]) {
		h.Append(inbox(1), inbox(2), inbox(3))
		head := h.Stream.Head()
		cfg := forwarderConfig
		cfg.Substrate = h.Substrate()
		replay := proctest.New(t, cfg)
		replay.Wake()
		// Every forward is re-dialed with its stable key and body, and every one collapses.
		if got := replay.Stream.Head(); got != head {
			t.Errorf("the replay appended %d events", got-head)
		}
		if got, want := replay.State(), h.State(); got != want {
			t.Errorf("replayed state %+v, want %+v", got, want)
		}
	})
}

func TestForwarder_CrashLoopBreaker(t *testing.T) {
	proctest.Run(t, forwarderConfig, func(t *testing.T, h *proctest.Harness[examples.ForwarderState]) {
		refuseForwards(h) // the poison: every delivery of event 1 fails
		h.Append(inbox(1))
		h.AdvanceTime(40 * time.Minute)
		if got, want := revivalGaps(h.Events(itx.TypeProcessorRevived)), "10s 1m0s 5m0s 30m0s"; got != want {
			t.Errorf("gaps between revivals %q, want %q", got, want)
		}
		if forwards(t, h) != "" || h.Runner().ProcessedThrough() != 0 {
			t.Fatalf("a poisoned frame moved: forwards %q cursor %d", forwards(t, h), h.Runner().ProcessedThrough())
		}
		// Every delivery failed on the poison: the first one, and at least one after each of the
		// five revivals (the harness also retries the frame at its other stops, so the count is
		// not the breaker's).
		errs := takeInjected(t, h)
		if revivals := len(h.Events(itx.TypeProcessorRevived)); len(errs) < 1+revivals {
			t.Errorf("%d delivery failures, want at least %d: the first delivery and one per revival", len(errs), 1+revivals)
		}
		for _, err := range errs {
			if !strings.Contains(err.Error(), "event 1 ") {
				t.Errorf("delivery failed with %v, want only event 1's forward", err)
			}
		}
		// The fault is gone: the next revival on the backoff delivers the held event.
		h.Stream.FailAppends(nil)
		h.AdvanceTime(6 * time.Hour)
		if got := forwards(t, h); got != "1" {
			t.Errorf("forwards after the antidote %q, want 1", got)
		}
	})
}
