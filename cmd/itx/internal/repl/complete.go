package repl

import (
	"context"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/dop251/goja"
	"github.com/dop251/goja/ast"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
)

// Complete returns the completions of the text before the cursor and the partial word they
// complete. Members come from the schema: the chain before the cursor is followed statically
// (project.streams.get("/a").subscriptions. -> Subscriptions), so completing a member never
// sends a call. A variable is looked up, not evaluated: only its current value is read. A
// stream path being typed is completed from the project's streams, with one bounded call.
func (s *Session) Complete(text string) (candidates []string, partial string) {
	if !s.vmMu.TryLock() {
		return nil, "" // a call is running: keys typed ahead complete nothing
	}
	defer s.vmMu.Unlock()
	if partial, ok := pathArgument(text); ok {
		return s.streamPaths(partial), partial
	}
	if t := strings.TrimLeft(text, " \t"); strings.HasPrefix(t, ".") && !strings.ContainsAny(t, " \t") {
		partial = t[1:]
		for _, c := range Commands() {
			if strings.HasPrefix(c.Name, partial) {
				candidates = append(candidates, c.Name+" ")
			}
		}
		return candidates, partial
	}
	// .help's argument (help's too): the interfaces it knows, as its own usage error lists them.
	if t := strings.TrimLeft(text, " \t"); strings.HasPrefix(t, ".help ") || strings.HasPrefix(t, "help ") {
		_, arg, _ := strings.Cut(t, " ")
		if arg = strings.TrimLeft(arg, " \t"); !strings.ContainsAny(arg, " \t") {
			for _, name := range boundInterfaces() {
				if strings.HasPrefix(name, arg) {
					candidates = append(candidates, name)
				}
			}
			return candidates, arg
		}
		return nil, ""
	}
	segments, ok := splitChain(trailingChain(text))
	if !ok || len(segments) == 0 {
		return nil, ""
	}
	partial = segments[len(segments)-1]
	if !isIdent(partial) && partial != "" {
		return nil, ""
	}
	if len(segments) == 1 {
		return filterPrefix(s.globalNames(), partial), partial
	}
	head := segments[0]
	var iface string
	rest := segments[1 : len(segments)-1]
	switch {
	case strings.HasPrefix(head, "agent("):
		// agent("/a") is {path, processor, subscription, liveState}: sugar for the "agent"
		// subscription.
		if len(segments) == 2 {
			return filterPrefix([]string{"path", "processor", "subscription", "liveState"}, partial), partial
		}
		switch segments[1] {
		case "processor":
			iface = "Processor"
		case "subscription":
			iface = "Subscription"
		default:
			return nil, ""
		}
		rest = segments[2 : len(segments)-1]
	case !isIdent(head):
		return nil, ""
	default:
		v := s.lookup(head)
		if v == nil {
			return nil, ""
		}
		p, isCap := s.capabilityOf(v)
		if !isCap {
			// A plain object (a result kept in a variable): offer its fields.
			if obj, ok := v.(*goja.Object); ok && len(segments) == 2 {
				return filterPrefix(obj.Keys(), partial), partial
			}
			return nil, ""
		}
		iface = p.iface
	}
	for _, seg := range rest {
		name, call := seg, false
		if i := strings.IndexByte(seg, '('); i >= 0 {
			name, call = seg[:i], true
		}
		m, ok := s.ifcs[iface].Method(name)
		if !ok || m.Returns == "" || m.Property == call {
			return nil, ""
		}
		iface = m.Returns
	}
	return filterPrefix(s.members(iface), partial), partial
}

// members are the members a capability of interface iface has at the prompt, sorted; a
// method's name ends in "(".
func (s *Session) members(iface string) []string {
	names := memberNames(s.ifcs[iface])
	for _, m := range promptMethods[iface] {
		names = append(names, m.name+"(")
	}
	switch iface {
	case "Stream":
		names = append(names, "path")
	case "Subscription":
		names = append(names, "name")
	}
	sort.Strings(names)
	return names
}

// pathInString matches a stream path being typed as the argument of streams.get or agent: the
// path so far is its second group.
var pathInString = regexp.MustCompile(`(?:\bstreams\s*\.\s*get|\bagent)\(\s*(["'])([^"'\\]*)$`)

// pathArgument reports whether text ends in a stream path being typed, and the path so far:
// in a string given to streams.get("...") or agent("..."), or as the first argument of a
// dot-command that takes a path or a prefix (.tail /a, .du /agents/).
func pathArgument(text string) (string, bool) {
	if m := pathInString.FindStringSubmatch(text); m != nil {
		return m[2], true
	}
	t := strings.TrimLeft(text, " \t")
	name, rest, ok := strings.Cut(t, " ")
	if !ok || !strings.HasPrefix(name, ".") {
		return "", false
	}
	rest = strings.TrimLeft(rest, " ")
	if strings.ContainsAny(rest, " \t\"'") || strings.HasPrefix(rest, "-") {
		return "", false // a later argument, a flag, or a quoted path: left alone
	}
	for _, c := range Commands() {
		if c.Name == name[1:] && (strings.HasPrefix(c.Args, "<path>") || strings.HasPrefix(c.Args, "[prefix]")) {
			return rest, true
		}
	}
	return "", false
}

// pathCompletionTimeout bounds the one call completing a path sends: a key press waits on it,
// so a slow or absent itxd completes nothing rather than hang the prompt.
const pathCompletionTimeout = 2 * time.Second

// pathCompletionLimit is how many paths one Tab lists at most.
const pathCompletionLimit = 200

// streamPaths are the paths of the project's streams that start with partial (one call to
// Streams.list, unlike member completion, which sends nothing), none while the connection to
// itxd is down.
func (s *Session) streamPaths(partial string) []string {
	if !s.connected() {
		return nil
	}
	ctx, cancel := context.WithTimeout(s.sessionCtx, pathCompletionTimeout)
	defer cancel()
	c := s.client(capPath{iface: "Streams", steps: []step{{method: "streams"}}})
	defer c.Release()
	page, _, err := client.ListStreamsPage(ctx, schema.Streams(c), partial, "", pathCompletionLimit)
	if err != nil {
		return nil
	}
	paths := make([]string, len(page))
	for i, info := range page {
		paths[i] = info.Path
	}
	return paths
}

// lookup reads a global variable's value without running anything else.
func (s *Session) lookup(name string) goja.Value {
	var v goja.Value
	if ex := s.vm.Try(func() {
		var err error
		v, err = s.vm.RunString(name)
		if err != nil {
			v = nil
		}
	}); ex != nil {
		return nil
	}
	return v
}

// globalNames are the names completion offers at the start of an expression.
func (s *Session) globalNames() []string {
	names := []string{"project", "agent(", "print(", "console", "args", "JSON", "Object", "Math", "Date"}
	names = append(names, s.declared...)
	sort.Strings(names)
	return names
}

// noteDeclarations remembers the top-level names a successfully evaluated source declared, for
// completion (let and const live outside the global object, where nothing lists them).
func (s *Session) noteDeclarations(src string) {
	prg, err := goja.Parse("", src)
	if err != nil {
		if stripped, ok := stripAwait(src); ok {
			prg, err = goja.Parse("", stripped)
		}
		if err != nil {
			return
		}
	}
	add := func(id *ast.Identifier) {
		if id == nil {
			return
		}
		name := id.Name.String()
		for _, d := range s.declared {
			if d == name {
				return
			}
		}
		s.declared = append(s.declared, name)
	}
	bindings := func(list []*ast.Binding) {
		for _, b := range list {
			if id, ok := b.Target.(*ast.Identifier); ok {
				add(id)
			}
		}
	}
	for _, st := range prg.Body {
		switch d := st.(type) {
		case *ast.VariableStatement:
			bindings(d.List)
		case *ast.LexicalDeclaration:
			bindings(d.List)
		case *ast.FunctionDeclaration:
			add(d.Function.Name)
		case *ast.ClassDeclaration:
			add(d.Class.Name)
		}
	}
}

func filterPrefix(names []string, prefix string) []string {
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out
}

// trailingChain returns the member chain that ends text: for `x = project.streams.get("/a").su`
// it is `project.streams.get("/a").su`.
func trailingChain(text string) string {
	depth := 0
	for i := len(text); i > 0; i-- {
		c := text[i-1]
		switch {
		case c == ')' || c == ']':
			depth++
		case c == '(' || c == '[':
			if depth == 0 {
				return text[i:]
			}
			depth--
		case depth > 0:
		case isIdentByte(c) || c == '.':
		default:
			return text[i:]
		}
	}
	return text
}

// splitChain splits a chain at its top-level dots: `a.b("x.y").c` -> [a, b("x.y"), c].
func splitChain(chain string) ([]string, bool) {
	var out []string
	depth, start := 0, 0
	var quote byte
	for i := 0; i < len(chain); i++ {
		c := chain[i]
		switch {
		case quote != 0:
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'' || c == '`':
			quote = c
		case c == '(' || c == '[':
			depth++
		case c == ')' || c == ']':
			depth--
		case c == '.' && depth == 0:
			out = append(out, chain[start:i])
			start = i + 1
		}
	}
	if depth != 0 || quote != 0 {
		return nil, false
	}
	return append(out, chain[start:]), true
}

func isIdent(s string) bool {
	if s == "" || ('0' <= s[0] && s[0] <= '9') {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isIdentByte(s[i]) {
			return false
		}
	}
	return true
}
