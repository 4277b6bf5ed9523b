package repl

import "strings"

// incompleteFunc is Incomplete, swapped in tests to count the parses.
var incompleteFunc = Incomplete

// inputAssembler gathers piped lines into inputs, as the prompt does: an input is complete once
// it is a whole statement. Whether it is takes a parse of everything gathered, so parsing at
// every line made a statement spanning n lines cost n parses of up to n lines: piping a 5,000
// line array literal took seconds, 50,000 lines the better part of an hour. The assembler
// follows the lines' brackets, strings, templates and comments as they come, and while a
// bracket, a template or a block comment it has seen open is still open, and a parse has
// already said the input goes on, it skips the parse: the input cannot be whole yet.
type inputAssembler struct {
	lines  []string
	open   openBrackets
	goesOn bool // a parse said the gathered lines are the start of a statement
}

// add takes the next line. It returns the input once it is whole, or ok false while it goes on.
func (a *inputAssembler) add(line string) (input string, ok bool) {
	a.lines = append(a.lines, line)
	a.open.feed(line)
	if a.goesOn && a.open.certainlyOpen() {
		return "", false
	}
	input = strings.Join(a.lines, "\n")
	if incompleteFunc(input) {
		a.goesOn = true
		return "", false
	}
	a.reset()
	return input, true
}

// pending is what was gathered of an input that has not ended.
func (a *inputAssembler) pending() string { return strings.Join(a.lines, "\n") }

func (a *inputAssembler) reset() { *a = inputAssembler{} }

// openBrackets follows JavaScript source line by line, well enough to know when something
// opened is certainly not closed yet. A slash that is neither comment (a division or a regular
// expression, which would take a parser to tell apart) or anything it cannot follow makes it
// unsure for the rest of the input, and then it never claims anything is open.
type openBrackets struct {
	frames []frame // innermost last; the first is the input's own code
	quote  byte    // inside a '...' or "..." string continued by a backslash at a line's end
	block  bool    // inside /* ... */
	unsure bool
}

// frame is code (brackets counted in depth) or a template literal; code inside a template's
// ${...} is a frame of its own, closed by the } that brings its depth below zero.
type frame struct {
	template bool
	depth    int
}

func (o *openBrackets) feed(line string) {
	if o.unsure {
		return
	}
	if len(o.frames) == 0 {
		o.frames = []frame{{}}
	}
	continued := false // the line ends in a backslash that continues a string
	for i := 0; i < len(line); i++ {
		c := line[i]
		top := &o.frames[len(o.frames)-1]
		switch {
		case o.block:
			if c == '*' && i+1 < len(line) && line[i+1] == '/' {
				o.block = false
				i++
			}
		case o.quote != 0:
			switch c {
			case '\\':
				continued = i+1 == len(line)
				i++
			case o.quote:
				o.quote = 0
			}
		case top.template:
			switch {
			case c == '\\':
				i++
			case c == '`':
				o.frames = o.frames[:len(o.frames)-1]
			case c == '$' && i+1 < len(line) && line[i+1] == '{':
				o.frames = append(o.frames, frame{})
				i++
			}
		default:
			switch c {
			case '"', '\'':
				o.quote = c
			case '`':
				o.frames = append(o.frames, frame{template: true})
			case '/':
				switch {
				case i+1 < len(line) && line[i+1] == '/':
					i = len(line) // a comment to the line's end
				case i+1 < len(line) && line[i+1] == '*':
					o.block = true
					i++
				default:
					o.unsure = true
					return
				}
			case '(', '[', '{':
				top.depth++
			case ')', ']':
				top.depth--
			case '}':
				top.depth--
				if top.depth < 0 && len(o.frames) > 1 {
					o.frames = o.frames[:len(o.frames)-1] // the end of a template's ${...}
					continue
				}
			}
			if top.depth < 0 {
				o.unsure = true
				return
			}
		}
	}
	if o.quote != 0 && !continued {
		o.unsure = true // a string the line ended in: a syntax error the parse will report
	}
}

// certainlyOpen reports whether something opened before is still open, so that the input
// cannot be a whole statement yet.
func (o *openBrackets) certainlyOpen() bool {
	if o.unsure {
		return false
	}
	if o.block || o.quote != 0 || len(o.frames) > 1 {
		return true
	}
	return len(o.frames) == 1 && o.frames[0].depth > 0
}
