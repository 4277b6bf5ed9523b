package processors_test

import (
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
