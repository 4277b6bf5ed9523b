package repl

import (
	"encoding/json"
	"math"
	"math/big"
	"strconv"
	"strings"

	"github.com/dop251/goja"
	"github.com/itx-dev/itx"
)

// options reads one JavaScript options object ({after: 3, types: ["a"]}). A key it does not
// know is refused, naming the keys it does know: a typo must not silently read the whole
// stream.
type options struct {
	s         *Session
	what      string // "getEvents" or "getEvents: event 2", for messages
	obj       *goja.Object
	known     []string
	spellings spellings
	errors    []string
}

// spellings maps another name of an option to the name this prompt reads it under.
type spellings map[string]string

// readSpellings and connectionSpellings are the TypeScript itx surface's names for options this
// prompt spells shorter: its read window (StreamEventReadInput: afterOffset, beforeOffset,
// eventTypes, also waitForEvent's) and openConnection's replayAfterOffset (or afterOffset, as
// the reads spell it), eventTypes and connectionKey, so an expression copied from there runs as
// written. Each is
// one option under two names: both given is refused rather than one silently winning. One
// difference stays: eventTypes: [] reads every type here (as types: [] does), where the
// TypeScript matches none.
var (
	readSpellings       = spellings{"afterOffset": "after", "beforeOffset": "before", "eventTypes": "types"}
	connectionSpellings = spellings{"replayAfterOffset": "after", "afterOffset": "after", "eventTypes": "types", "connectionKey": "key"}
)

// opts reads v as an options object; undefined and null read as an empty one.
func (s *Session) opts(what string, v goja.Value, known ...string) (*options, error) {
	return s.optsSpelled(what, v, nil, known...)
}

// optsSpelled is opts also taking each option under the other names sp gives it.
func (s *Session) optsSpelled(what string, v goja.Value, sp spellings, known ...string) (*options, error) {
	o := &options{s: s, what: what, known: known, spellings: sp}
	if isAbsent(v) {
		return o, nil
	}
	obj, ok := v.(*goja.Object)
	if !ok || obj.ClassName() == "Array" || obj.ClassName() == "Function" {
		return nil, itx.Errorf(itx.EInvalid, "%s: expected an options object {%s}, got %s", what, strings.Join(known, ", "), describeValue(v))
	}
	for _, k := range obj.Keys() {
		if name, ok := sp[k]; ok && contains(known, name) {
			for _, other := range obj.Keys() {
				if other != k && (other == name || sp[other] == name) && !isAbsent(obj.Get(other)) && !isAbsent(obj.Get(k)) {
					return nil, itx.Errorf(itx.EInvalid, "%s: %s and %s are one option (%s is the TypeScript surface's name for %s); give one", what, k, other, k, name)
				}
			}
			continue
		}
		if !contains(known, k) {
			return nil, itx.Errorf(itx.EInvalid, "%s: unknown option %q (known: %s)", what, k, strings.Join(known, ", "))
		}
	}
	o.obj = obj
	return o, nil
}

func isAbsent(v goja.Value) bool {
	return v == nil || goja.IsUndefined(v) || goja.IsNull(v)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func describeValue(v goja.Value) string {
	if v == nil {
		return "undefined" // an argument the caller left out
	}
	if isAbsent(v) {
		return v.String()
	}
	if obj, ok := v.(*goja.Object); ok {
		class := strings.ToLower(obj.ClassName())
		if class != "" && strings.ContainsAny(class[:1], "aeiou") {
			return "an " + class
		}
		return "a " + class
	}
	switch v.Export().(type) {
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case int64, float64:
		return "a number"
	}
	return v.String()
}

func (o *options) get(key string) goja.Value {
	if o.obj == nil {
		return nil
	}
	v := o.obj.Get(o.given(key))
	if isAbsent(v) {
		return nil
	}
	return v
}

// given is the name the caller gave option key under: key, or another spelling of it.
func (o *options) given(key string) string {
	if o.obj != nil && isAbsent(o.obj.Get(key)) {
		for other, name := range o.spellings {
			if name == key && !isAbsent(o.obj.Get(other)) {
				return other
			}
		}
	}
	return key
}

func (o *options) fail(key, format string, args ...any) {
	o.errors = append(o.errors, o.given(key)+": "+sprintf(format, args...))
}

// err reports every problem found, in one error.
func (o *options) err() error {
	if len(o.errors) == 0 {
		return nil
	}
	return itx.Errorf(itx.EInvalid, "%s: %s", o.what, strings.Join(o.errors, "; "))
}

func (o *options) has(key string) bool { return o.get(key) != nil }

// uint reads a non-negative integer (offsets, limits, timeouts).
func (o *options) uint(key string) int64 {
	v := o.get(key)
	if v == nil {
		return 0
	}
	n, ok := toUint(v)
	if !ok {
		if tooLarge(v) {
			o.fail(key, "expected a non-negative integer up to %d, got %s", int64(math.MaxInt64), describeNumber(v))
		} else {
			o.fail(key, "expected a non-negative integer, got %s", describeNumber(v))
		}
	}
	return n
}

// tooLarge reports whether v is a whole number above what an int64 holds (2**64, 1e20, a
// BigInt): refused for its size, not its kind, and the refusal says so.
func tooLarge(v goja.Value) bool {
	switch n := v.Export().(type) {
	case float64:
		return n >= 1<<63 && !math.IsInf(n, 1) && n == math.Trunc(n)
	case *big.Int:
		return n.Sign() > 0 && !n.IsInt64()
	}
	return false
}

// describeNumber shows a value given where a number belongs: a number as itself (-1, 1.5), a
// string quoted ("10" (a string), not 10, which reads as if the number were refused), anything
// else by its kind.
func describeNumber(v goja.Value) string {
	switch x := v.Export().(type) {
	case int64, float64, *big.Int:
		return v.String()
	case string:
		return strconv.Quote(x) + " (a string)"
	}
	return describeValue(v)
}

func toUint(v goja.Value) (int64, bool) {
	switch n := v.Export().(type) {
	case int64:
		return n, n >= 0
	case float64:
		if n >= 0 && n == math.Trunc(n) && n < 1<<63 {
			return int64(n), true
		}
	case *big.Int: // an offset beyond 2^53, exact: getEvents({after: 9007199254740993n})
		if n.IsInt64() && n.Sign() >= 0 {
			return n.Int64(), true
		}
	}
	return 0, false
}

func (o *options) str(key string) string {
	v := o.get(key)
	if v == nil {
		return ""
	}
	s, ok := v.Export().(string)
	if !ok {
		o.fail(key, "expected a string, got %s", describeValue(v))
	}
	return s
}

func (o *options) bool(key string) bool {
	v := o.get(key)
	if v == nil {
		return false
	}
	b, ok := v.Export().(bool)
	if !ok {
		o.fail(key, "expected true or false, got %s", describeValue(v))
	}
	return b
}

// strings reads a list of strings; a lone string reads as a list of one.
func (o *options) strings(key string) []string {
	v := o.get(key)
	if v == nil {
		return nil
	}
	if s, ok := v.Export().(string); ok {
		return []string{s}
	}
	arr, ok := v.(*goja.Object)
	if !ok || arr.ClassName() != "Array" {
		o.fail(key, "expected an array of strings, got %s", describeValue(v))
		return nil
	}
	var out []string
	for _, k := range arr.Keys() {
		s, ok := arr.Get(k).Export().(string)
		if !ok {
			o.fail(key, "expected an array of strings, element %s is %s", k, describeValue(arr.Get(k)))
			return nil
		}
		out = append(out, s)
	}
	return out
}

// json reads a value sent as JSON text: an object is encoded as JSON.stringify would (its key
// order kept), a string is taken to be JSON text already.
func (o *options) json(key string) json.RawMessage {
	v := o.get(key)
	if v == nil {
		return nil
	}
	raw, err := o.s.jsonText(v)
	if err != nil {
		o.fail(key, "%s", itx.ErrorMessage(err)) // its code is the options error's
	}
	return raw
}

// jsonText encodes v as JSON text; a string is passed through as JSON text.
func (s *Session) jsonText(v goja.Value) (json.RawMessage, error) {
	if str, ok := v.Export().(string); ok {
		if !json.Valid([]byte(str)) {
			// Said here, before the server's "not valid JSON: invalid character", which does
			// not tell that the string was read as JSON text rather than as a string.
			q := quoteJSON(truncate(str, 40))
			return nil, itx.Errorf(itx.EInvalid, "a string is read as JSON text, and %s is not JSON: give an object, such as {text: %s}", q, q)
		}
		return json.RawMessage(str), nil
	}
	out, ok, err := s.encodeJSON(v)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, itx.Errorf(itx.EInvalid, "%s cannot be encoded as JSON", describeValue(v))
	}
	return json.RawMessage(out), nil
}

// stringArg reads a positional string argument, or the named key of an options object:
// remove("agent") and remove({name: "agent"}) are the same call.
// It is the method's last argument: a value after it is refused, as params refuses one past its
// positional ones, so resumeSubscription("m", 1) does not run as resumeSubscription("m"). An
// options object may follow it, as after any method's values, but it has nothing left to say:
// its key is given twice, any other is unknown.
func (s *Session) stringArg(what string, args []goja.Value, i int, key string) (string, error) {
	for j := i + 1; j < len(args); j++ {
		extra := args[j]
		if isAbsent(extra) {
			continue
		}
		if obj, ok := extra.(*goja.Object); ok && obj.ClassName() == "Object" && j == len(args)-1 {
			if _, isCap := s.capabilityOf(extra); !isCap {
				o, err := s.opts(what, extra, key)
				if err != nil {
					return "", err
				}
				if o.has(key) && !isAbsent(arg(args, i)) {
					return "", itx.Errorf(itx.EInvalid, "%s: %s is given twice, as an argument and as an option", what, key)
				}
				continue
			}
		}
		return "", itx.Errorf(itx.EInvalid, "%s: too many arguments (takes %s, or an options object {%s}), got %s after it", what, key, key, describeValue(extra))
	}
	var v goja.Value
	if i < len(args) {
		v = args[i]
	}
	if str, ok := exportString(v); ok {
		return str, nil
	}
	if isAbsent(v) {
		return "", itx.Errorf(itx.EInvalid, "%s: %s is required (a string), got %s", what, key, describeValue(v))
	}
	if obj, ok := v.(*goja.Object); ok && obj.ClassName() == "Object" {
		o, err := s.opts(what, v, key)
		if err != nil {
			return "", err
		}
		if !o.has(key) {
			return "", itx.Errorf(itx.EInvalid, "%s: %s is required (a string)", what, key)
		}
		str := o.str(key)
		return str, o.err()
	}
	return "", itx.Errorf(itx.EInvalid, "%s: expected %s as a string, got %s", what, key, describeValue(v))
}

func exportString(v goja.Value) (string, bool) {
	if isAbsent(v) {
		return "", false
	}
	if _, isSymbol := v.(*goja.Symbol); isSymbol {
		return "", false // a symbol exports as its description: not a string the caller wrote
	}
	s, ok := v.Export().(string)
	return s, ok
}

func arg(args []goja.Value, i int) goja.Value {
	if i < len(args) {
		return args[i]
	}
	return goja.Undefined()
}

// params reads a method's arguments in either of the two styles every method accepts: values in
// the order of positional (getEvents(5, 10)), or one options object ({after: 5, limit: 10}),
// or positional values followed by one options object for the rest (getEvents(5, {types:
// "note"})). known lists every key the options object may hold, positional ones included.
func (s *Session) params(what string, args []goja.Value, positional []string, known ...string) (*options, error) {
	return s.paramsSpelled(what, args, positional, nil, known...)
}

// paramsSpelled is params also taking each option under the other names sp gives it.
func (s *Session) paramsSpelled(what string, args []goja.Value, positional []string, sp spellings, known ...string) (*options, error) {
	merged := s.vm.NewObject()
	for i, v := range args {
		if isAbsent(v) {
			continue
		}
		if obj, ok := v.(*goja.Object); ok && obj.ClassName() == "Object" && i == len(args)-1 {
			if _, isCap := s.capabilityOf(v); !isCap {
				for _, k := range obj.Keys() {
					if merged.Get(k) != nil {
						return nil, itx.Errorf(itx.EInvalid, "%s: %s is given twice, as an argument and as an option", what, k)
					}
					merged.Set(k, obj.Get(k))
				}
				continue
			}
		}
		if i >= len(positional) {
			return nil, itx.Errorf(itx.EInvalid, "%s: too many arguments (takes %s, then an options object {%s})",
				what, strings.Join(positional, ", "), strings.Join(known, ", "))
		}
		merged.Set(positional[i], v)
	}
	return s.optsSpelled(what, merged, sp, known...)
}
