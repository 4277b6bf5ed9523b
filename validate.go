package itx

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// ValidateName checks a caller-chosen name (what says which: "subscription name", "mount
// name", ...): 1..MaxSubscriptionNameLength characters of valid UTF-8, no leading or trailing
// whitespace, and no control characters or line separators (NUL, CR, LF, tab, U+2028, ...),
// which would break logs, tables and the REPL's output. Format characters (Unicode Cf, such as
// the zero-width joiner of emoji sequences) are allowed.
func ValidateName(what, name string) error {
	switch {
	case name == "":
		return Errorf(EInvalid, "%s must not be empty", what)
	case !utf8.ValidString(name):
		return Errorf(EInvalid, "%s is not valid UTF-8", what)
	case strings.TrimSpace(name) != name:
		return Errorf(EInvalid, "%s %q must not begin or end with whitespace", what, name)
	}
	n := 0
	for _, r := range name {
		if unicode.IsControl(r) || unicode.In(r, unicode.Zl, unicode.Zp) {
			return Errorf(EInvalid, "%s %q contains the control character %U", what, name, r)
		}
		n++
	}
	if n > MaxSubscriptionNameLength {
		return Errorf(EInvalid, "%s is %d characters, at most %d", what, n, MaxSubscriptionNameLength)
	}
	return nil
}

// ValidateMountName checks the name a Receiver capability is mounted under, and that an itx-call
// receiver names: the rules of a subscription name.
func ValidateMountName(name string) error { return ValidateName("mount name", name) }

// ValidateOffset converts an unsigned offset from the wire, refusing one above the largest
// offset a stream can have (what was sent is reported as sent, not as a negative number).
func ValidateOffset(field string, v uint64) (int64, error) {
	if v > 1<<63-1 {
		return 0, Errorf(EInvalid, "%s is %d, at most %d", field, v, int64(1<<63-1))
	}
	return int64(v), nil
}
