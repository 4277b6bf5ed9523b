package server

import (
	"encoding/json"
	"testing"

	"github.com/itx-dev/itx"
)

// A payloadContains that holds more than one JSON value is not valid JSON: refused, not taken
// as its first value with the rest dropped (`{}}` would then match every payload).
func TestCompilePredicate_PayloadContainsWithTrailingData(t *testing.T) {
	for _, contains := range []string{`{}}`, `{}]`, `{"a":1} x`, `{}{}`, `1 2`, "{}\ufeff"} {
		_, err := compilePredicate(itx.Predicate{PayloadContains: json.RawMessage(contains)})
		if got := itx.ErrorCode(err); got != itx.EInvalid {
			t.Errorf("payloadContains %q: got %v (code %q), want invalidArgument", contains, err, got)
		}
	}
	for _, contains := range []string{`{}`, " {\"a\":1}\n\t", `[1]`, `"s"`} {
		if _, err := compilePredicate(itx.Predicate{PayloadContains: json.RawMessage(contains)}); err != nil {
			t.Errorf("payloadContains %q: %v", contains, err)
		}
	}
}
