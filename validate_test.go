package itx

import (
	"strings"
	"testing"
)

func TestValidateName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"orders-mirror", true}, {"émoji 👩‍💻 name", true}, {strings.Repeat("é", 500), true},
		{"", false}, {strings.Repeat("é", 501), false}, {"a\x00b", false}, {"a\nb", false},
		{"a\rb", false}, {"a\tb", false}, {"a\x7fb", false}, {"a\u0085b", false}, {"a\u2028b", false},
		{"a\u2029b", false}, {"a\xffb", false}, {" lead", false}, {"trail ", false},
	} {
		err := ValidateName("subscription name", tc.name)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateName(%q) = %v, want ok %v", tc.name, err, tc.ok)
		}
		if err != nil && ErrorCode(err) != EInvalid {
			t.Errorf("ValidateName(%q): code %s, want %s", tc.name, ErrorCode(err), EInvalid)
		}
	}
}

func TestValidateOffset(t *testing.T) {
	if got, err := ValidateOffset("after", 1<<63-1); err != nil || got != 1<<63-1 {
		t.Errorf("got %d, %v; want the largest offset", got, err)
	}
	_, err := ValidateOffset("after", 1<<64-1)
	if want := "after is 18446744073709551615, at most 9223372036854775807"; err == nil || ErrorMessage(err) != want {
		t.Errorf("got %v, want %q", err, want)
	}
}
