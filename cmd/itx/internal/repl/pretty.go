package repl

import (
	"bytes"
	"encoding/json"
	"strings"
)

// prettyWidth is the widest an array of scalars may be to stay on one line.
const prettyWidth = 80

// prettyJSON indents compact JSON text for a person: objects one field per line, in their
// order; arrays of scalars that fit on one line ([1, 2, 3], ["note"]) stay on it.
func prettyJSON(compact string) (string, error) {
	d := json.NewDecoder(strings.NewReader(compact))
	d.UseNumber()
	v, err := readOrdered(d)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	writePretty(&b, v, "")
	return b.String(), nil
}

// ordered values: member lists keep key order, unlike map[string]any.
type (
	orderedObject []member
	member        struct {
		key   string
		value any
	}
)

func readOrdered(d *json.Decoder) (any, error) {
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		if t == '{' {
			obj := orderedObject{}
			for d.More() {
				k, err := d.Token()
				if err != nil {
					return nil, err
				}
				v, err := readOrdered(d)
				if err != nil {
					return nil, err
				}
				obj = append(obj, member{k.(string), v})
			}
			_, err := d.Token()
			return obj, err
		}
		arr := []any{}
		for d.More() {
			v, err := readOrdered(d)
			if err != nil {
				return nil, err
			}
			arr = append(arr, v)
		}
		_, err := d.Token()
		return arr, err
	}
	return tok, nil
}

func scalarJSON(v any) string {
	if n, ok := v.(json.Number); ok {
		return n.String()
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
	return strings.TrimSuffix(buf.String(), "\n")
}

func writePretty(b *strings.Builder, v any, indent string) {
	switch x := v.(type) {
	case orderedObject:
		if len(x) == 0 {
			b.WriteString("{}")
			return
		}
		b.WriteString("{\n")
		for i, m := range x {
			b.WriteString(indent + "  ")
			b.WriteString(scalarJSON(m.key))
			b.WriteString(": ")
			writePretty(b, m.value, indent+"  ")
			if i < len(x)-1 {
				b.WriteByte(',')
			}
			b.WriteByte('\n')
		}
		b.WriteString(indent + "}")
	case []any:
		if len(x) == 0 {
			b.WriteString("[]")
			return
		}
		if line, ok := inlineArray(x); ok && len(indent)+len(line) <= prettyWidth {
			b.WriteString(line)
			return
		}
		b.WriteString("[\n")
		for i, e := range x {
			b.WriteString(indent + "  ")
			writePretty(b, e, indent+"  ")
			if i < len(x)-1 {
				b.WriteByte(',')
			}
			b.WriteByte('\n')
		}
		b.WriteString(indent + "]")
	default:
		b.WriteString(scalarJSON(x))
	}
}

// inlineArray renders an array of scalars on one line.
func inlineArray(arr []any) (string, bool) {
	parts := make([]string, len(arr))
	for i, e := range arr {
		switch e.(type) {
		case orderedObject, []any:
			return "", false
		}
		parts[i] = scalarJSON(e)
	}
	return "[" + strings.Join(parts, ", ") + "]", true
}
