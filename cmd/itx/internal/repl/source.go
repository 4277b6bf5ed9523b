package repl

import (
	"reflect"
	"strings"

	"github.com/dop251/goja"
	"github.com/dop251/goja/ast"
)

// compile compiles a REPL line, an -e expression or a script.
//
// Two conveniences keep pasted TypeScript-surface snippets working:
//   - a line that is an object literal ({a: 1}) is an expression, not a block, as in node's REPL;
//   - `await` is accepted at the top level. Every itx call already returns its result
//     synchronously, so awaiting it is a no-op: a source with top-level awaits is compiled
//     with them removed (those inside async functions stay, as they wait for real promises).
func compile(name, src string) (*goja.Program, error) {
	if t := strings.TrimSpace(src); strings.HasPrefix(t, "{") && strings.HasSuffix(t, "}") {
		if prg, err := goja.Compile(name, "("+src+"\n)", false); err == nil {
			return prg, nil
		}
	}
	// The top-level awaits go first even when the source compiles with them: `await (f)()` and
	// `await\nx` are valid JavaScript outside a module (a call of a function named await, an
	// expression statement), which then fails as "await is not defined".
	if stripped, ok := stripAwait(src); ok {
		if prg, err := goja.Compile(name, stripped, false); err == nil {
			return prg, nil
		}
	}
	return goja.Compile(name, src, false)
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

// stripAwait removes the top-level `await` keywords of src (outside strings, templates and
// comments). It reports whether it removed any. An await inside an async function stays: there
// it waits for a real promise (Promise.all, another async function's result), and without it
// the promise itself would be used as the value.
func stripAwait(src string) (string, bool) {
	all, sites := scanAwait(src, nil)
	if len(sites) == 0 {
		return src, false
	}
	prg, err := goja.Parse("", all)
	if err != nil {
		return all, true
	}
	var bodies [][2]int // offsets in all
	asyncFunctions(reflect.ValueOf(prg), func(from, to int) { bodies = append(bodies, [2]int{from, to}) })
	if len(bodies) == 0 {
		return all, true
	}
	out, _ := scanAwait(src, func(i int) bool {
		for _, r := range bodies {
			if r[0] <= sites[i] && sites[i] < r[1] {
				return true
			}
		}
		return false
	})
	return out, out != src
}

// asyncFunctions calls found with the source range (0-based offsets, end exclusive) of every
// async function and async arrow function under v, a node of a goja AST.
func asyncFunctions(v reflect.Value, found func(from, to int)) {
	switch v.Kind() {
	case reflect.Interface, reflect.Pointer:
		if v.IsNil() {
			return
		}
		switch n := v.Interface().(type) {
		case *ast.FunctionLiteral:
			if n.Async {
				found(int(n.Idx0())-1, int(n.Idx1())-1)
			}
		case *ast.ArrowFunctionLiteral:
			if n.Async {
				found(int(n.Idx0())-1, int(n.Idx1())-1)
			}
		}
		asyncFunctions(v.Elem(), found)
	case reflect.Struct:
		if v.Type().PkgPath() != astPackage {
			return // file.File and the like: no functions below
		}
		for i := range v.NumField() {
			if f := v.Field(i); v.Type().Field(i).IsExported() {
				asyncFunctions(f, found)
			}
		}
	case reflect.Slice:
		for i := range v.Len() {
			asyncFunctions(v.Index(i), found)
		}
	}
}

var astPackage = reflect.TypeOf(ast.Program{}).PkgPath()

// scanAwait returns src without its `await` keywords outside strings, templates and comments,
// except the i-th (from 0) of those for which keep(i) is true, and where each await stood in
// the result were every one of them removed (keep nil).
func scanAwait(src string, keep func(i int) bool) (string, []int) {
	var b strings.Builder
	var sites []int
	removedLen := 0 // bytes of kept awaits written so far: the offsets are those of the all-removed text
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
			// A backslash ending the source (a line continuing its string, typed at the
			// prompt: "a\) takes j past the end; the string then runs to the end.
			j = min(j+1, len(src))
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
				n := len(sites)
				sites = append(sites, b.Len()-removedLen)
				k := j
				for k < len(src) && (src[k] == ' ' || src[k] == '\t') {
					k++
				}
				if keep != nil && keep(n) {
					b.WriteString(src[i:k])
					removedLen += k - i
				}
				j = k
			} else {
				b.WriteString(word)
			}
			i = j
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String(), sites
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
