package examples_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/examples"
	proctest "github.com/itx-dev/itx/processors/testing"
)

var guestbookConfig = proctest.Config[examples.GuestbookState]{
	Path: "/guestbook",
	// A projector's frame never fails.
	StrictDeliveryErrors: true,
	New:                  func(proctest.Env) processors.Contract[examples.GuestbookState] { return examples.Guestbook() },
}

func sign(name string) itx.EventInput {
	return examples.GuestbookSigned.Input(examples.Signed{Name: name, Message: "hello from " + name}, "")
}

func TestGuestbook_Projection(t *testing.T) {
	proctest.Run(t, guestbookConfig, func(t *testing.T, h *proctest.Harness[examples.GuestbookState]) {
		for i := range examples.GuestbookRecent + 5 {
			h.Append(sign(fmt.Sprintf("guest-%d", i)))
		}
		st := h.State()
		if st.Count != examples.GuestbookRecent+5 || len(st.Recent) != examples.GuestbookRecent {
			t.Fatalf("count %d, %d recent; want %d and %d", st.Count, len(st.Recent), examples.GuestbookRecent+5, examples.GuestbookRecent)
		}
		if got := st.Recent[len(st.Recent)-1].Name; got != fmt.Sprintf("guest-%d", examples.GuestbookRecent+4) {
			t.Errorf("latest entry %q", got)
		}
		if got := len(h.Events()); got != examples.GuestbookRecent+5 {
			t.Errorf("a pure projector appended: %d events", got-examples.GuestbookRecent-5)
		}
	})
}

func TestGuestbook_CrashAndReplay(t *testing.T) {
	proctest.Run(t, guestbookConfig, func(t *testing.T, h *proctest.Harness[examples.GuestbookState]) {
		h.Append(sign("ada"), sign("grace"))
		// An ephemeral signature never reaches the projection.
		h.Append(itx.EventInput{Type: string(examples.GuestbookSigned), Payload: json.RawMessage(`{"name":"ghost"}`), Ephemeral: true})
		// A malformed one is skipped with one diagnostic.
		h.Append(itx.EventInput{Type: string(examples.GuestbookSigned), Payload: json.RawMessage(`{"name":""}`)})
		if _, err := h.Stream.Append(t.Context(), []itx.EventInput{sign("linus")}); err != nil {
			t.Fatal(err)
		}
		h.Crash()
		h.Wake()
		if got := h.State().Count; got != 3 {
			t.Errorf("count %d after the crash, want 3", got)
		}
		if got := len(h.Events(itx.TypeErrorOccurred)); got != 1 {
			t.Errorf("%d diagnostics, want 1", got)
		}
		cfg := guestbookConfig
		cfg.Substrate = h.Substrate()
		replay := proctest.New(t, cfg)
		replay.Wake()
		want, _ := json.Marshal(h.State())
		got, _ := json.Marshal(replay.State())
		if string(got) != string(want) {
			t.Errorf("replayed %s, want %s", got, want)
		}
		if got := len(h.Events(itx.TypeErrorOccurred)); got != 1 {
			t.Errorf("%d diagnostics after the replay, want 1", got)
		}
	})
}
