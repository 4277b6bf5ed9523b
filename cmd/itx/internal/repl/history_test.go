package repl

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// historyEntries keeps an input as it was typed: one line as it is, several joined by a space
// when every break is between tokens, otherwise each line apart.
func TestHistoryEntries(t *testing.T) {
	for _, c := range []struct {
		src  string
		want []string
	}{
		{`"a    b"`, []string{`"a    b"`}},
		{"s.append({type: \"x\",\n    payload: {text: \"two  spaces\"}})", []string{`s.append({type: "x", payload: {text: "two  spaces"}})`}},
		{"f(1, /* a\n b */ 2)", []string{"f(1, /* a b */ 2)"}},
		{"let a = 1 // one\n+ 2", []string{"let a = 1 // one", "+ 2"}},
		{"`line one\nline two`", []string{"`line one", "line two`"}},
		{"\"abc\\\ndef\"", []string{"\"abc\\", "def\""}},
		{"f(\"http://x\",\n 2)", []string{`f("http://x", 2)`}},
		{"f(1,\n\n 2)", []string{"f(1, 2)"}},
	} {
		require.Equal(t, c.want, historyEntries(c.src), "%q", c.src)
	}
}
