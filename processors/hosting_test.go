package processors_test

import (
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
)

// Add refuses a nil build with invalidArgument rather than panicking on it.
func TestAdd_NilBuild(t *testing.T) {
	err := processors.Add[int](processors.NewHost("v1"), nil)
	if itx.ErrorCode(err) != itx.EInvalid {
		t.Fatalf("got %v, want invalidArgument", err)
	}
}

// Add refuses a contract whose name no subscription can carry: spaces around it (a subscription's
// name is trimmed, so it would never run), or a name a subscription may not have.
func TestAdd_NameASubscriptionCanCarry(t *testing.T) {
	contract := func(name string) func() processors.Contract[int] {
		return func() processors.Contract[int] {
			return processors.Contract[int]{Name: name, ConsumedTypes: []string{"x"}, ReducerVersion: "1",
				InitialState: func() int { return 0 }, Reduce: func(n int, _ itx.Event) int { return n + 1 }}
		}
	}
	for name, want := range map[string]string{
		" padded":                 "spaces around it",
		"tab\tinside":             "subscription name",
		strings.Repeat("n", 501):  "subscription name",
		"ok/with-slash:and.dots~": "",
	} {
		err := processors.Add(processors.NewHost("v1"), contract(name))
		if want == "" {
			if err != nil {
				t.Errorf("%q: %v", name, err)
			}
			continue
		}
		if itx.ErrorCode(err) != itx.EInvalid || !strings.Contains(itx.ErrorMessage(err), want) {
			t.Errorf("%.20q: got %v, want invalidArgument naming %q", name, err, want)
		}
	}
}
