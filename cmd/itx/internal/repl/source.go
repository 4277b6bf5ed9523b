package repl

import (
	"strings"

	"github.com/dop251/goja"
	"github.com/dop251/goja/ast"
)

// compile compiles a REPL line, an -e expression or a script.
//
// Two conveniences keep pasted TypeScript-surface snippets working:
//   - a line that is an object literal ({a: 1}) is an expression, not a block, as in node's REPL;
//   - `await` is accepted at the top level. Every itx call already returns its result
//     synchronously, so awaiting it is a no-op: when the source does not compile and uses
//     `await`, it is compiled again with the top-level awaits removed.
func compile(name, src string) (*goja.Program, error) {
	if t := strings.TrimSpace(src); strings.HasPrefix(t, "{") && strings.HasSuffix(t, "}") {
		if prg, err := goja.Compile(name, "("+src+"\n)", false); err == nil {
			return prg, nil
		}
	}
	prg, err := goja.Compile(name, src, false)
	if err == nil {
		return prg, nil
	}
	if stripped, ok := stripAwait(src); ok {
		if prg, err2 := goja.Compile(name, stripped, false); err2 == nil {
			return prg, nil
		}
	}
	return nil, err
}

// Incomplete reports whether src ends before its statement does (an open brace, parenthesis,
// template or trailing operator): the REPL then asks for another line.
func Incomplete(src string) bool {
	if strings.TrimSpace(src) == "" {
		return false
	}
	_, err := goja.Parse("", src)
	if err == nil {
		return false
	}
	if stripped, ok := stripAwait(src); ok {
		if _, err = goja.Parse("", stripped); err == nil {
			return false
		}
	}
	return strings.Contains(err.Error(), "Unexpected end of input")
}

// stripAwait removes the `await` keywords of src that are outside strings, templates and
// comments. It reports whether it removed any.
func stripAwait(src string) (string, bool) {
	var b strings.Builder
	removed := false
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(src) && src[j] != c {
				if src[j] == '\\' {
					j++
				}
				j++
			}
			if j < len(src) {
				j++
			}
			b.WriteString(src[i:j])
			i = j
		case c == '/' && i+1 < len(src) && src[i+1] == '/':
			j := strings.IndexByte(src[i:], '\n')
			if j < 0 {
				j = len(src) - i
			}
			b.WriteString(src[i : i+j])
			i += j
		case c == '/' && i+1 < len(src) && src[i+1] == '*':
			j := strings.Index(src[i+2:], "*/")
			if j < 0 {
				j = len(src) - i - 2
			} else {
				j += 2
			}
			b.WriteString(src[i : i+2+j])
			i += 2 + j
		case isIdentByte(c):
			j := i
			for j < len(src) && isIdentByte(src[j]) {
				j++
			}
			word := src[i:j]
			prevDot := i > 0 && src[i-1] == '.'
			if word == "await" && !prevDot && j < len(src) && (src[j] == ' ' || src[j] == '\t' || src[j] == '(' || src[j] == '\n') {
				removed = true
				for j < len(src) && (src[j] == ' ' || src[j] == '\t') {
					j++
				}
			} else {
				b.WriteString(word)
			}
			i = j
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String(), removed
}

func isIdentByte(c byte) bool {
	return c == '_' || c == '$' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c >= 0x80
}

// redeclarable rewrites the top-level let and const declarations of one prompt input as var
// (const padded to its length, so positions in errors stay right). Each input is its own
// program, and a top-level let lives in the session's global scope: `let c = a.openConnection(x)`
// whose call threw left c declared and never initialized, so every later use said "Cannot access
// a variable before initialization" and `let c = ...` again "Identifier 'c' has already been
// declared" for the rest of the session; so did running one tour line twice. A var is declared
// again freely, as a browser console lets a let be. Nested declarations (blocks, functions,
// for (let ...)) keep their scope; a source that does not parse is returned as it is.
func redeclarable(src string) string {
	prg, err := goja.Parse("", src)
	if err != nil {
		stripped, ok := stripAwait(src)
		if !ok {
			return src
		}
		if prg, err = goja.Parse("", stripped); err != nil {
			return src
		}
		src = stripped
	}
	b := []byte(src)
	for _, st := range prg.Body {
		d, ok := st.(*ast.LexicalDeclaration)
		if !ok {
			continue
		}
		at := int(d.Idx) - 1     // the keyword's offset in src (goja counts from 1)
		word := d.Token.String() // "let" or "const"
		if at < 0 || at+len(word) > len(b) || string(b[at:at+len(word)]) != word {
			return src // not where the parser said: leave the input alone
		}
		copy(b[at:], "var"+strings.Repeat(" ", len(word)-len("var")))
	}
	return string(b)
}
