package repl

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// assemble runs lines through an inputAssembler: the inputs it completes, then what is left.
func assemble(lines []string) []string {
	var a inputAssembler
	var out []string
	for _, l := range lines {
		if in, ok := a.add(l); ok {
			out = append(out, in)
		}
	}
	if len(a.lines) > 0 {
		out = append(out, "LEFT:"+a.pending())
	}
	return out
}

// assembleByParsing is what RunLines did before the assembler: a parse at every line.
func assembleByParsing(lines []string) []string {
	var pending, out []string
	for _, l := range lines {
		pending = append(pending, l)
		if in := strings.Join(pending, "\n"); !Incomplete(in) {
			out = append(out, in)
			pending = nil
		}
	}
	if len(pending) > 0 {
		out = append(out, "LEFT:"+strings.Join(pending, "\n"))
	}
	return out
}

// The assembler completes the same inputs as a parse at every line, whatever the lines hold
// (brackets in strings, templates and comments, a regular expression, a division, a string
// continued over lines, a syntax error, a trailing operator).
func TestInputAssembler_SameInputsAsParsingEveryLine(t *testing.T) {
	for _, src := range []string{
		"let a = [\n1,\n2,\n]\na.length",
		"f({\n  s: \"{[(\",\n  t: '}'\n})",
		"let t = `a ${\n[1, 2].map(x => `${x}}`)\n} b\n{`\nt",
		"g(1, // ) ]\n2)",
		"h(1, /* ) \n ] */ 2)\n3",
		"let r = [\n/[(]/.test('(')\n]\nr",
		"let d = [\n4 / 2,\n]\nd",
		"let s = \"a\\\nb\"\ns",
		"foo bar (\n1 + 1",
		"1 +\n2",
		"[\n\"unterminated\n]\n7",
		"({\n})\n8",
		"`\n}\n`",
		"x = {a: `${ {b: 1}.b }`,\n}\nx",
	} {
		lines := strings.Split(src, "\n")
		require.Equal(t, assembleByParsing(lines), assemble(lines), "%q", src)
	}
}

// A statement spanning many lines is parsed a few times, not once a line.
func TestInputAssembler_ParsesALongStatementAFewTimes(t *testing.T) {
	parses := 0
	incompleteFunc = func(src string) bool { parses++; return Incomplete(src) }
	defer func() { incompleteFunc = Incomplete }()
	lines := []string{"let arr = ["}
	for i := range 2000 {
		lines = append(lines, fmt.Sprintf("  {n: %d, s: \"(%d\"},", i, i))
	}
	lines = append(lines, "]")
	got := assemble(lines)
	require.Len(t, got, 1)
	require.True(t, strings.HasSuffix(got[0], "\n]"))
	require.LessOrEqual(t, parses, 3, "one parse a line made this quadratic")
}
