package processors_test

import (
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
	proctest "github.com/itx-dev/itx/processors/testing"
)

// Seed 002, "Expose the processor vocabulary directly": a domain object's write door validates
// its runtime boundary with the processor's contract (parseConsumedInput), so what a client sends
// through it is refused with a clear error, and nothing written, unless the processor would
// consume it: an unconsumed type, an ephemeral event, a payload the contract's Validate refuses,
// a payload that is not JSON. What it accepts is appended as parsed and answered.
func TestContract_ParseConsumedInput(t *testing.T) {
	c := Hello()
	for _, tc := range []struct {
		name string
		in   itx.EventInput
		want string // "" accepted; else the error's code and a part of its message
	}{
		{"a greeting", Greeted.Input(Greeting{Name: "ada"}, "k1"), ""},
		{"a type it does not consume", Answered.Input(Greeting{Name: "ada"}, ""), `invalidArgument: processor "hello" does not consume event "hello/answered"`},
		{"ephemeral", itx.EventInput{Type: string(Greeted), Payload: []byte(`{"name":"ada"}`), Ephemeral: true}, `invalidArgument: processor "hello" cannot consume ephemeral event "hello/greeted"`},
		{"a payload Validate refuses", itx.EventInput{Type: string(Greeted), Payload: []byte(`{"name": 5}`)}, `invalidArgument: processor "hello" refuses event "hello/greeted"`},
		{"a payload that is not JSON", itx.EventInput{Type: string(Greeted), Payload: []byte(`{"name":`)}, `invalidArgument: processor "hello": event "hello/greeted": payload is not valid JSON`},
		{"a control event", itx.EventInput{Type: itx.TypeProcessorRevived, Payload: []byte(`{}`)}, `invalidArgument: processor "hello" does not consume event "stream/processor-revived"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := c.ParseConsumedInput(tc.in)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if got.Type != tc.in.Type || string(got.Payload) != string(tc.in.Payload) || got.IdempotencyKey != tc.in.IdempotencyKey {
					t.Errorf("parsed %+v, want %+v", got, tc.in)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted %+v", got)
			}
			if msg := string(itx.ErrorCode(err)) + ": " + itx.ErrorMessage(err); !strings.Contains(msg, tc.want) {
				t.Errorf("error %q, want one containing %q", msg, tc.want)
			}
		})
	}

	// A Validate that panics refuses the input instead of taking the door's caller down.
	panicky := Hello()
	panicky.Validate = func(itx.Event) error { panic("validator bug") }
	if _, err := panicky.ParseConsumedInput(Greeted.Input(Greeting{Name: "ada"}, "")); itx.ErrorCode(err) != itx.EInvalid || !strings.Contains(itx.ErrorMessage(err), "Validate panicked: validator bug") {
		t.Errorf("a panicking Validate at the door: %v, want invalidArgument naming the panic", err)
	}

	// A door that parses its inputs first appends nothing of a call holding one refused input.
	cfg := proctest.Config[int]{New: func(proctest.Env) processors.Contract[int] { return Hello() }, StrictDeliveryErrors: true}
	proctest.Run(t, cfg, func(t *testing.T, h *proctest.Harness[int]) {
		door := func(ins ...itx.EventInput) error {
			parsed := make([]itx.EventInput, 0, len(ins))
			for _, in := range ins {
				p, err := c.ParseConsumedInput(in)
				if err != nil {
					return err
				}
				parsed = append(parsed, p)
			}
			h.Append(parsed...)
			return nil
		}
		if err := door(Greeted.Input(Greeting{Name: "ada"}, ""), itx.EventInput{Type: string(Greeted), Payload: []byte(`{"name": 5}`)}); err == nil {
			t.Fatal("the door took a malformed greeting")
		}
		if err := door(Greeted.Input(Greeting{Name: "bob"}, "")); err != nil {
			t.Fatal(err)
		}
		if got := len(h.Events(string(Greeted))); got != 1 {
			t.Errorf("%d greetings on the stream, want bob's alone", got)
		}
		if got := len(h.Events(string(Answered))); got != 1 {
			t.Errorf("%d answers, want 1", got)
		}
		if got := len(h.Events(itx.TypeErrorOccurred)); got != 0 {
			t.Errorf("%d diagnostics: the door let a malformed event through", got)
		}
	})
}
