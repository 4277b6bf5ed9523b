package repl

import (
	"fmt"
	"io"
	"strings"
)

// An event's strings are written by anyone who may append to its stream, and itx shows them
// on the reader's terminal: a control character shown as it is is a command to that terminal
// (ESC [2J clears the screen, ESC ]0; retitles the window, CR overwrites the line, and U+009B
// is ESC [ to a terminal that honors C1 controls). So everything itx prints of a result, an
// event or an error shows control characters escaped, as JSON writes them (\u001b), never
// raw. print() and console.log() of a string are the exception: a script prints what it
// means to.

// isControl reports whether r is a control character: C0, DEL or C1 (Unicode's Cc).
func isControl(r rune) bool { return r < 0x20 || (r >= 0x7f && r <= 0x9f) }

// escapeJSONControls escapes the control characters encoding/json leaves raw in JSON text
// (DEL and the C1 range; it escapes C0 itself). Outside strings JSON text holds none of them,
// so the result is the same JSON document. Raw C0 other than whitespace cannot be in valid
// JSON; it is escaped too, so text that is not valid JSON cannot carry one either.
func escapeJSONControls(text string) string {
	if !strings.ContainsFunc(text, needsJSONEscape) {
		return text
	}
	var b strings.Builder
	for _, r := range text {
		if needsJSONEscape(r) {
			fmt.Fprintf(&b, `\u%04x`, r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// needsJSONEscape is a control character other than the whitespace that separates JSON tokens.
func needsJSONEscape(r rune) bool { return isControl(r) && r != '\n' && r != '\t' && r != '\r' }

// escapeText shows a control character in text as \u00XX, keeping line breaks and tabs when
// keepLines (an error's message may run over lines), otherwise showing them as a space (a
// table cell stays on its row).
func escapeText(text string, keepLines bool) string {
	if !strings.ContainsFunc(text, isControl) {
		return text
	}
	var b strings.Builder
	for _, r := range text {
		switch {
		case (r == '\n' || r == '\t') && keepLines:
			b.WriteRune(r)
		case r == '\n' || r == '\t':
			b.WriteByte(' ')
		case isControl(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// jsonControlWriter escapes control characters (escapeJSONControls) in the JSON documents
// written through it. Each Write must hold whole documents, as a json.Encoder's do.
type jsonControlWriter struct{ w io.Writer }

func (c jsonControlWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(c.w, escapeJSONControls(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}
