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

// Numbers cross between JSON and JavaScript here, in both directions, without JSON.parse and
// JSON.stringify: those turn every number into a double, so 9007199254740993 (2^53 + 1) would
// print as ...992 without a word, and a BigInt cannot be encoded at all. An integer that a
// double holds exactly becomes a Number; a larger one becomes a BigInt, and a BigInt encodes as
// its exact digits.

// maxExact is the largest integer a double holds exactly, and every smaller one too.
const maxExact = 1 << 53

// toJS turns a Go result into a plain JavaScript value through JSON, so results are ordinary
// objects (with fields in declaration order) that scripts can keep, change and print.
func (s *Session) toJS(v any) goja.Value {
	if v == nil {
		return goja.Undefined()
	}
	b, err := json.Marshal(v)
	if err != nil {
		panic(s.throw(err))
	}
	out, err := s.parseJSON(b)
	if err != nil {
		panic(s.throw(err))
	}
	return out
}

// parseJSON decodes JSON text into JavaScript values, keeping key order and integer precision.
func (s *Session) parseJSON(text []byte) (goja.Value, error) {
	d := json.NewDecoder(strings.NewReader(string(text)))
	d.UseNumber()
	v, err := readOrdered(d)
	if err != nil {
		return nil, err
	}
	return s.fromOrdered(v), nil
}

func (s *Session) fromOrdered(v any) goja.Value {
	vm := s.vm
	switch x := v.(type) {
	case nil:
		return goja.Null()
	case orderedObject:
		obj := vm.NewObject()
		for _, m := range x {
			obj.Set(m.key, s.fromOrdered(m.value))
		}
		return obj
	case []any:
		items := make([]any, len(x))
		for i, e := range x {
			items[i] = s.fromOrdered(e)
		}
		return vm.NewArray(items...)
	case json.Number:
		return vm.ToValue(numberValue(string(x)))
	}
	return vm.ToValue(v)
}

// numberValue is a JSON number as JavaScript should hold it: int64 or float64 when exact, a
// *big.Int (BigInt) for an integer beyond 2^53.
func numberValue(text string) any {
	if !strings.ContainsAny(text, ".eE") {
		if n, err := strconv.ParseInt(text, 10, 64); err == nil && n <= maxExact && n >= -maxExact {
			return n
		}
		if b, ok := new(big.Int).SetString(text, 10); ok {
			return b
		}
	}
	f, _ := strconv.ParseFloat(text, 64)
	return f
}

// maxJSONDepth bounds nesting, which also ends a cyclic structure.
const maxJSONDepth = 512

// encodeJSON encodes v as JSON.stringify would, except that a BigInt is written as its exact
// digits and a capability as its label. It reports false for a value JSON has no text for
// (undefined, a function, a symbol).
func (s *Session) encodeJSON(v goja.Value) (string, bool, error) {
	var b strings.Builder
	ok, err := s.writeJSON(&b, v, 0)
	return b.String(), ok, err
}

func (s *Session) writeJSON(b *strings.Builder, v goja.Value, depth int) (bool, error) {
	if depth > maxJSONDepth {
		return false, itx.Errorf(itx.EInvalid, "the value is nested too deeply (or refers to itself) to encode as JSON")
	}
	if v == nil || goja.IsUndefined(v) {
		return false, nil
	}
	if goja.IsNull(v) {
		b.WriteString("null")
		return true, nil
	}
	if p, ok := s.capabilityOf(v); ok {
		b.WriteString(strconv.Quote(p.label()))
		return true, nil
	}
	if obj, ok := v.(*goja.Object); ok {
		if _, isFn := goja.AssertFunction(obj); isFn {
			return false, nil
		}
		if toJSON, ok := goja.AssertFunction(obj.Get("toJSON")); ok {
			out, err := toJSON(obj)
			if err != nil {
				return false, err
			}
			if out != obj {
				return s.writeJSON(b, out, depth+1)
			}
		}
		switch obj.ClassName() {
		case "Array":
			b.WriteByte('[')
			n := obj.Get("length").ToInteger()
			for i := int64(0); i < n; i++ {
				if i > 0 {
					b.WriteByte(',')
				}
				ok, err := s.writeJSON(b, obj.Get(strconv.FormatInt(i, 10)), depth+1)
				if err != nil {
					return false, err
				}
				if !ok {
					b.WriteString("null")
				}
			}
			b.WriteByte(']')
			return true, nil
		case "String":
			b.WriteString(quoteJSON(obj.String()))
			return true, nil
		case "Number", "Boolean":
			return s.writeJSON(b, s.vm.ToValue(obj.Export()), depth+1)
		}
		b.WriteByte('{')
		first := true
		for _, k := range obj.Keys() {
			var member strings.Builder
			ok, err := s.writeJSON(&member, obj.Get(k), depth+1)
			if err != nil {
				return false, err
			}
			if !ok {
				continue // undefined, a function: left out, as JSON.stringify does
			}
			if !first {
				b.WriteByte(',')
			}
			first = false
			b.WriteString(quoteJSON(k))
			b.WriteByte(':')
			b.WriteString(member.String())
		}
		b.WriteByte('}')
		return true, nil
	}
	switch x := v.Export().(type) {
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case string:
		b.WriteString(quoteJSON(x))
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			b.WriteString("null")
		} else {
			b.WriteString(v.String()) // JavaScript's own number formatting
		}
	case *big.Int:
		b.WriteString(x.String())
	default:
		return false, nil // a symbol
	}
	return true, nil
}

func quoteJSON(s string) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(s)
	return strings.TrimSuffix(b.String(), "\n")
}
