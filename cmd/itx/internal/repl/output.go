package repl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"

	"capnproto.org/go/capnp/v3/exc"
	"github.com/dop251/goja"
	"github.com/itx-dev/itx"
	"golang.org/x/text/width"
)

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }

// Print prints a result in the session's format; undefined prints nothing.
func (s *Session) Print(v goja.Value) {
	if v == nil || goja.IsUndefined(v) {
		return
	}
	text := s.format(v, true)
	if s.longerThanScreen(text) && s.page(text) {
		return
	}
	fmt.Fprintln(s.cfg.Out, text)
}

// pagerMissing are the exit statuses with which sh says it could not run the pager's command
// (126: not executable, 127: not found).
var pagerMissing = map[int]bool{126: true, 127: true}

// longerThanScreen reports whether text would scroll off a terminal that has a pager.
func (s *Session) longerThanScreen(text string) bool {
	if s.cfg.Pager == "" || s.cfg.Size == nil || !s.cfg.TTY {
		return false
	}
	_, rows := s.cfg.Size()
	return rows > 0 && strings.Count(text, "\n")+2 > rows
}

// page shows text through the pager command (run by sh, as $PAGER is), on the terminal. It
// reports whether the pager ran: false only when it could not be started, and the text is
// then printed as it is. A pager that ran and ended otherwise (Ctrl-C, which reaches it too,
// or an error of its own) has shown what the person wanted to see: printing the whole text
// after it poured out what Ctrl-C was pressed to stop.
func (s *Session) page(text string) bool {
	cmd := exec.Command("sh", "-c", s.cfg.Pager)
	cmd.Stdin = strings.NewReader(text + "\n")
	cmd.Stdout, cmd.Stderr = s.cfg.PagerOut, s.cfg.PagerOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return true
	case errors.As(err, &exit):
		return !pagerMissing[exit.ExitCode()]
	}
	return false
}

// note tells the person something about a result (a page was cut, a list continues) on the
// error output, in parentheses, so it never mixes with results a program reads.
func (s *Session) note(format string, args ...any) {
	fmt.Fprintf(s.cfg.Err, "("+format+")\n", args...)
}

// printValues is print() and console.log(): strings as they are (JSON documents in the JSON
// format), everything else as a result.
func (s *Session) printValues(values []goja.Value) {
	if s.cfg.Format == FormatJSON {
		for _, v := range values {
			fmt.Fprintln(s.cfg.Out, s.format(v, true))
		}
		return
	}
	parts := make([]string, len(values))
	for i, v := range values {
		parts[i] = s.format(v, false)
	}
	fmt.Fprintln(s.cfg.Out, strings.Join(parts, " "))
}

// asJSONString is text standing for a value JSON cannot encode (a function, a cycle): a JSON
// string in the JSON format, where every result is a JSON document, the text elsewhere.
func (s *Session) asJSONString(text string) string {
	if s.cfg.Format == FormatJSON {
		return quoteJSON(text)
	}
	return text
}

// format renders v. A result (asResult) shows strings as JSON strings, so "1" and 1 differ; a
// print() argument shows them bare. Control characters are escaped (see controls.go), except
// in a string print() shows bare.
func (s *Session) format(v goja.Value, asResult bool) string {
	if _, ok := v.Export().(string); ok && !asResult && s.cfg.Format != FormatJSON {
		return s.render(v, asResult)
	}
	return escapeJSONControls(s.render(v, asResult))
}

func (s *Session) render(v goja.Value, asResult bool) string {
	if v == nil || goja.IsUndefined(v) {
		return "undefined"
	}
	if p, ok := s.capabilityOf(v); ok {
		if s.cfg.Format == FormatJSON {
			return quoteJSON(p.label())
		}
		return p.label()
	}
	if label, ok := s.labelOf(v); ok {
		if s.cfg.Format == FormatJSON {
			return quoteJSON(label)
		}
		return label
	}
	if str, ok := v.Export().(string); ok && !asResult && s.cfg.Format != FormatJSON {
		return str
	}
	if obj, ok := v.(*goja.Object); ok {
		if _, isFn := goja.AssertFunction(obj); isFn {
			return s.asJSONString("[Function " + obj.Get("name").String() + "]")
		}
	}
	if s.cfg.Format == FormatTable || (s.cfg.Format == FormatAuto && s.cfg.TTY) {
		if t, ok := s.table(v); ok {
			return t
		}
	}
	// Fields print in the order the script sees them; integers beyond 2^53 (BigInts) exactly.
	out, ok, err := s.encodeJSON(v)
	if err != nil || !ok {
		return s.asJSONString(v.String()) // a cycle, a symbol...
	}
	if s.cfg.Format == FormatJSON {
		return out
	}
	pretty, err := prettyJSON(out)
	if err != nil {
		return out
	}
	return pretty
}

// table renders an array of records as aligned columns, in the order the fields first appear
// (events: offset, createdAt, type, payload first), a nested value as compact JSON on one line,
// and a row count under it. On a terminal of known width the widest columns are cut with an
// ellipsis until the table fits, unless the output is wide (--wide, .output wide).
func (s *Session) table(v goja.Value) (string, bool) {
	arr, ok := v.(*goja.Object)
	if !ok || arr.ClassName() != "Array" {
		return "", false
	}
	idx := arr.Keys()
	if len(idx) == 0 {
		return "", false
	}
	var cols []string
	seen := map[string]bool{}
	rows := make([]*goja.Object, len(idx))
	for i, k := range idx {
		row, ok := arr.Get(k).(*goja.Object)
		if !ok || row.ClassName() != "Object" {
			return "", false
		}
		if _, isCap := s.capabilityOf(row); isCap {
			return "", false
		}
		for _, c := range row.Keys() {
			if !seen[c] {
				seen[c] = true
				cols = append(cols, c)
			}
		}
		rows[i] = row
	}
	if seen["offset"] && seen["type"] && seen["payload"] && seen["createdAt"] {
		cols = append([]string{"offset", "createdAt", "type", "payload"}, without(cols, "offset", "createdAt", "type", "payload")...)
	}
	cells := make([][]string, len(rows)+1)
	cells[0] = cols
	for r, row := range rows {
		cells[r+1] = make([]string, len(cols))
		for i, c := range cols {
			cells[r+1][i] = s.cell(c, row.Get(c))
		}
	}
	widths := make([]int, len(cols))
	for _, line := range cells {
		for i, c := range line {
			widths[i] = max(widths[i], displayWidth(c))
		}
	}
	shown := len(cols)
	if width := s.width(); width > 0 && !s.cfg.Wide {
		shown = fitColumns(widths, width)
	}
	var b strings.Builder
	for _, line := range cells {
		for i, c := range line[:shown] {
			c = truncate(c, widths[i])
			b.WriteString(c)
			if i < shown-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-displayWidth(c)+columnGap))
			}
		}
		b.WriteByte('\n')
	}
	if len(rows) == 1 {
		b.WriteString("(1 row)")
	} else {
		fmt.Fprintf(&b, "(%d rows)", len(rows))
	}
	if shown < len(cols) {
		fmt.Fprintf(&b, " not shown: %s (.output wide shows every column)", strings.Join(cols[shown:], ", "))
	}
	return b.String(), true
}

const (
	columnGap      = 2
	minColumnWidth = 6 // a column is cut no narrower than this (or its natural width)
)

// fitColumns narrows the widest columns, one character at a time, until the row fits width.
// When every column is as narrow as it goes and the row still does not fit, the last columns
// are left out (at least one stays). It returns how many columns to show.
func fitColumns(widths []int, width int) int {
	shown := len(widths)
	total := columnGap * (shown - 1)
	for _, w := range widths {
		total += w
	}
	for total > width {
		widest := -1
		for i, w := range widths[:shown] {
			if w > minColumnWidth && (widest < 0 || w > widths[widest]) {
				widest = i
			}
		}
		if widest >= 0 {
			widths[widest]--
			total--
			continue
		}
		if shown == 1 {
			break // one column as narrow as it goes: the terminal wraps
		}
		shown--
		total -= widths[shown] + columnGap
	}
	return shown
}

// truncate cuts s to width columns of a terminal, the last one an ellipsis.
func truncate(s string, width int) string {
	if displayWidth(s) <= width {
		return s
	}
	var b strings.Builder
	used := 0
	for _, r := range s {
		w := runeWidth(r)
		if used+w > width-1 {
			break
		}
		b.WriteRune(r)
		used += w
	}
	return b.String() + "…"
}

// displayWidth is how many columns of a terminal s takes: a wide character (CJK, most emoji)
// two, a combining mark or format character (a variation selector, a zero-width joiner) none.
// Counting runes instead put a table of emoji past the terminal's edge, each row wrapped.
func displayWidth(s string) int {
	n := 0
	for _, r := range s {
		n += runeWidth(r)
	}
	return n
}

func runeWidth(r rune) int {
	switch {
	case unicode.In(r, unicode.Mn, unicode.Me, unicode.Cf):
		return 0
	}
	switch width.LookupRune(r).Kind() {
	case width.EastAsianWide, width.EastAsianFullwidth:
		return 2
	}
	return 1
}

func without(list []string, drop ...string) []string {
	var out []string
	for _, x := range list {
		if !contains(drop, x) {
			out = append(out, x)
		}
	}
	return out
}

// width is the terminal's width, 0 when unknown or not a terminal.
func (s *Session) width() int {
	if s.cfg.Size == nil || !s.cfg.TTY {
		return 0
	}
	w, _ := s.cfg.Size()
	return w
}

func (s *Session) cell(column string, v goja.Value) string {
	if isAbsent(v) {
		return "-"
	}
	if _, nested := v.(*goja.Object); nested {
		text, ok, err := s.encodeJSON(v)
		if err != nil || !ok {
			return escapeText(v.String(), false)
		}
		return text
	}
	switch x := v.Export().(type) {
	case string:
		if x == "" {
			return "-"
		}
		if rel, ok := s.relative(column, x); ok {
			return rel
		}
		return escapeText(x, false)
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	}
	return escapeText(v.String(), false)
}

// relative shows a time field (a key ending in "At" holding an ISO-8601 time) relative to now
// when .time relative is on.
func (s *Session) relative(key, value string) (string, bool) {
	if !s.relativeTimes || !strings.HasSuffix(key, "At") {
		return "", false
	}
	at, err := time.Parse(time.RFC3339Nano, value)
	if err != nil {
		return "", false
	}
	d := time.Since(at)
	suffix := " ago"
	if d < 0 {
		d, suffix = -d, " from now"
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds%s", int(d.Seconds()), suffix), true
	case d < time.Hour:
		return fmt.Sprintf("%dm%s", int(d.Minutes()), suffix), true
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%s", int(d.Hours()), suffix), true
	}
	return fmt.Sprintf("%dd%s", int(d.Hours()/24), suffix), true
}

// Failure is an error as itx shows it: "<code>: <message>". Code is an itx error code
// (invalidArgument, notFound...), a transport condition (unimplemented, disconnected,
// cancelled) or, for an error raised by the script itself, its JavaScript name (TypeError).
type Failure struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (f Failure) String() string { return f.Code + ": " + f.Message }

// rejection is an async function's rejected promise.
type rejection struct{ value goja.Value }

func (r *rejection) Error() string { return "rejected: " + r.value.String() }

// scriptError is an error a script threw, with where: its file, line and column.
type scriptError struct {
	err error
	at  string
}

func (e *scriptError) Error() string { return e.err.Error() + " (at " + e.at + ")" }
func (e *scriptError) Unwrap() error { return e.err }

// AtScriptLine adds to err, which running the script named name returned, the line it was
// thrown at, so an error in a long script says which call failed. A syntax error says its line
// already; an error without a frame in the script is returned as it is.
func AtScriptLine(err error, name string) error {
	var ex *goja.Exception
	if errors.As(err, &ex) {
		for _, f := range ex.Stack() {
			if p := f.Position(); f.SrcName() == name && p.Line > 0 {
				return &scriptError{err: err, at: fmt.Sprintf("%s:%d:%d", name, p.Line, p.Column)}
			}
		}
		return err
	}
	// An async function's rejection: its Error's stack ("Error: x\n\tat script.js:3:9(12)").
	if obj, ok := rejectedObject(err); ok {
		if stack, ok := obj.Get("stack").Export().(string); ok {
			for _, line := range strings.Split(stack, "\n") {
				if at, ok := strings.CutPrefix(strings.TrimSpace(line), "at "+name+":"); ok {
					if i := strings.IndexByte(at, '('); i > 0 {
						at = at[:i]
					}
					return &scriptError{err: err, at: name + ":" + at}
				}
			}
		}
	}
	return err
}

// rejectedObject is the object an async function's promise was rejected with, when err is
// such a rejection and the object has a stack.
func rejectedObject(err error) (*goja.Object, bool) {
	var rej *rejection
	if !errors.As(err, &rej) || rej.value == nil {
		return nil, false
	}
	obj, ok := rej.value.(*goja.Object)
	return obj, ok && obj.Get("stack") != nil
}

// Describe classifies any error an evaluation returns.
func Describe(err error) Failure {
	var se *scriptError
	if errors.As(err, &se) {
		f := Describe(se.err)
		f.Message += " (at " + se.at + ")"
		return f
	}
	var interrupted *goja.InterruptedError
	if errors.As(err, &interrupted) {
		return Failure{Code: "cancelled", Message: "interrupted"}
	}
	var overflow *goja.StackOverflowError
	if errors.As(err, &overflow) {
		return Failure{Code: "RangeError", Message: "Maximum call stack size exceeded"}
	}
	var rej *rejection
	if errors.As(err, &rej) {
		return describeThrown(rej.value)
	}
	var ex *goja.Exception
	if errors.As(err, &ex) {
		if inner := ex.Unwrap(); inner != nil {
			return describeGo(inner)
		}
		return describeThrown(ex.Value())
	}
	return describeGo(err)
}

// describeThrown describes a value a script threw: an Error object by its name and message.
func describeThrown(v goja.Value) Failure {
	if obj, ok := v.(*goja.Object); ok {
		if inner := obj.Get("value"); inner != nil {
			if err, ok := inner.Export().(error); ok {
				return describeGo(err)
			}
		}
		name, msg := obj.Get("name"), obj.Get("message")
		if !isAbsent(name) && !isAbsent(msg) {
			f := Failure{Code: name.String(), Message: msg.String()}
			if f.Code == "TypeError" && strings.HasSuffix(f.Message, "has no member 'then'") {
				// Written for a client whose calls return promises (capnweb's RpcPromise).
				f.Message += ": itx calls return their results, not promises (use the result as it is; await is accepted)"
			}
			return f
		}
	}
	if v == nil {
		return Failure{Code: "Error", Message: "unknown error"}
	}
	return Failure{Code: "Uncaught", Message: v.String()}
}

// describeGo describes an error from Go: a call's remote exception, a cancelled context, an
// argument refused before sending.
func describeGo(err error) Failure {
	var (
		e      *itx.Error
		syntax *goja.CompilerSyntaxError
		ref    *goja.CompilerReferenceError
	)
	switch {
	case errors.As(err, &syntax):
		return Failure{Code: "SyntaxError", Message: syntax.Message}
	case errors.As(err, &ref):
		return Failure{Code: "ReferenceError", Message: ref.Message}
	case errors.Is(err, context.Canceled):
		// (Before an *itx.Error: the client's calls given up for their context carry one too.)
		return Failure{Code: string(itx.ECancelled), Message: "call cancelled"}
	case errors.Is(err, context.DeadlineExceeded):
		return Failure{Code: string(itx.EDeadlineExceeded), Message: "call timed out"}
	case errors.As(err, &e):
		return Failure{Code: string(e.Code), Message: e.Message}
	case exc.IsType(err, exc.Unimplemented):
		return Failure{Code: "unimplemented", Message: itx.ErrorMessage(errors.New(exceptionMessage(err)))}
	case exc.IsType(err, exc.Disconnected):
		// go-capnp's own words ("rpc: connection closed") say nothing of what became of the call.
		return Failure{Code: "disconnected", Message: "the connection to itxd was lost before the call was answered (" +
			strings.TrimPrefix(exceptionMessage(err), "rpc: ") + "): it may or may not have taken effect"}
	}
	// A remote itx error names its code in its reason; anything else is internal.
	f := itx.AsError(err)
	return Failure{Code: string(f.Code), Message: f.Message}
}

// callPrefixes matches the method names the RPC layer prefixes to a reason, one per pipelined
// step it crossed ("itx.capnp:Subscriptions.list: itx.capnp:Stream.subscriptions: ...").
var callPrefixes = regexp.MustCompile(`^([\w.]+\.capnp:\w+\.\w+: )+`)

// exceptionMessage is an exception's reason without the RPC layer's prefixes.
func exceptionMessage(err error) string {
	msg := err.Error()
	var x *exc.Exception
	if errors.As(err, &x) && x.Cause != nil {
		msg = x.Cause.Error()
	}
	return callPrefixes.ReplaceAllString(msg, "")
}

// throw makes a JavaScript Error from a Go error: its name is the code, so String(e) and an
// uncaught error both read "<code>: <message>", and e.code is there for scripts that branch on it.
func (s *Session) throw(err error) goja.Value {
	s.awaitLoss(err)
	f := describeGo(err)
	obj := s.vm.NewGoError(err)
	obj.Set("name", f.Code)
	obj.Set("message", f.Message)
	obj.Set("code", f.Code)
	return obj
}

// lostWait bounds awaitLoss: go-capnp closes a connection's Done once its shutdown is over, a
// little after the calls in flight on it failed.
const lostWait = 5 * time.Second

// awaitLoss waits, after a call failed because the connection to itxd was lost, until the
// session sees that connection end (at most lostWait), so that the next call reconnects,
// waiting for itxd, instead of going out on the dead connection: a script's statement right
// after the one an itxd restart cut short failed disconnected too.
func (s *Session) awaitLoss(err error) {
	if itx.ErrorCode(err) != itx.EDisconnected || !strings.Contains(itx.ErrorMessage(err), "the connection to itxd was lost") {
		return
	}
	t := time.NewTimer(lostWait)
	defer t.Stop()
	select {
	case <-s.Done():
	case <-t.C:
	case <-s.ctx().Done():
	}
}

// PrintError prints an evaluation's error: "<code>: <message>", red on a terminal, or a JSON
// document {"error": {code, message}} in the JSON format.
func (s *Session) PrintError(err error) {
	printFailure(s.cfg.Err, s.withNameHint(WithTokenHint(Describe(err), s.cfg.TokenHint)), s.cfg.Format == FormatJSON, s.cfg.Color)
}

// WithTokenHint adds hint to an unauthenticated failure: "unknown token" alone did not say
// which token, and one read from a credentials file may have been revoked since.
func WithTokenHint(f Failure, hint string) Failure {
	if hint != "" && f.Code == string(itx.EUnauthenticated) {
		f.Message += " (" + hint + ")"
	}
	return f
}

func printFailure(w io.Writer, f Failure, asJSON, color bool) {
	if asJSON {
		// Not HTML-escaped: a message's "<" and ">" read as themselves, as in results.
		var b strings.Builder
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		enc.Encode(struct {
			Error Failure `json:"error"`
		}{f})
		io.WriteString(w, escapeJSONControls(b.String()))
		return
	}
	// A message can quote what someone else wrote (a receiver's refusal, an event's key).
	f.Code, f.Message = escapeText(f.Code, true), escapeText(f.Message, true)
	if color {
		fmt.Fprintf(w, "\x1b[31m%s\x1b[0m\n", f)
	} else {
		fmt.Fprintln(w, f)
	}
}

// PrintFailure prints an error that did not come from an evaluation (a failed connect).
func PrintFailure(w io.Writer, err error, asJSON, color bool) {
	printFailure(w, Describe(err), asJSON, color)
}

// PrintFailureHinted is PrintFailure with WithTokenHint.
func PrintFailureHinted(w io.Writer, err error, asJSON, color bool, hint string) {
	printFailure(w, WithTokenHint(Describe(err), hint), asJSON, color)
}
