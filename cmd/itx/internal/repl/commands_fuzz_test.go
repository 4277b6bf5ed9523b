package repl

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
)

// quoteWord quotes w so that splitWords reads it back as one word: in '...' unless it holds a
// single quote, else in "..." with \ and " escaped.
func quoteWord(w string) string {
	if !strings.Contains(w, "'") {
		return "'" + w + "'"
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(w) + `"`
}

// FuzzSplitWords checks the REPL's dot-command word splitting. Properties: a refusal is a
// UsageError carrying itx.EInvalid; any words, quoted and joined with spaces, split back into
// exactly those words, byte for byte (so an argument reaches the server as typed, invalid UTF-8
// included, for the server to refuse); and a line of unquoted plain words splits as
// strings.Fields does.
func FuzzSplitWords(f *testing.F) {
	f.Add(`import /a "my file.ndjson"`, "a", "it's", `say "hi" \`)
	f.Add(`tail /a --reader 'r 1'`, "", " ", "\t")
	f.Add(`x"y z"w`, "\xff", "a\xc3", "\xa9b")
	f.Add(`import "/a`, "é", `\"`, `''`)
	f.Fuzz(func(t *testing.T, line, w1, w2, w3 string) {
		got, err := splitWords(line)
		if err != nil {
			var usage *UsageError
			if !errors.As(err, &usage) || itx.ErrorCode(err) != itx.EInvalid {
				t.Fatalf("refusal is not a usage error: %T %v", err, err)
			}
		} else if !strings.ContainsAny(line, `'"`) && !reflect.DeepEqual(got, strings.FieldsFunc(line, func(r rune) bool { return r == ' ' || r == '\t' })) && !(len(got) == 0 && strings.Trim(line, " \t") == "") {
			t.Fatalf("splitWords(%q) = %q", line, got)
		}
		words := []string{w1, w2, w3}
		quoted := make([]string, len(words))
		for i, w := range words {
			quoted[i] = quoteWord(w)
		}
		back, err := splitWords(" " + strings.Join(quoted, " \t") + " ")
		if err != nil || !reflect.DeepEqual(back, words) {
			t.Fatalf("words %q quoted as %q split as %q (%v)", words, quoted, back, err)
		}
	})
}
