package itx

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Event is a committed event: what readers, connections and receivers see.
type Event struct {
	Offset         int64           `json:"offset"`
	Type           string          `json:"type"`
	Payload        json.RawMessage `json:"payload"`
	CreatedAt      int64           `json:"createdAt"` // epoch ms, server clock
	IdempotencyKey string          `json:"idempotencyKey,omitempty"`
	Metadata       json.RawMessage `json:"metadata,omitempty"` // a JSON object, or nil
	Ephemeral      bool            `json:"ephemeral,omitempty"`
	Provenance     []Hop           `json:"provenance,omitempty"` // set on copies, oldest first
}

// Size is the bytes a read measures an event by (pages are bounded by it): type, payload,
// metadata and idempotency key. Unlike EventInput.Size it counts a key the server derived too:
// those bytes travel with the event all the same.
func (e *Event) Size() int {
	return len(e.Type) + len(e.Payload) + len(e.Metadata) + len(e.IdempotencyKey)
}

// Hop is one step of a copied event's provenance.
type Hop struct {
	StreamID              string `json:"streamId"`
	Path                  string `json:"path"`
	Offset                int64  `json:"offset"`
	Subscription          string `json:"subscription"`
	CursorChangedAtOffset int64  `json:"cursorChangedAtOffset"`
	Type                  string `json:"type"`
}

// EventInput is an event to append.
type EventInput struct {
	Type           string          `json:"type"`
	Payload        json.RawMessage `json:"payload,omitempty"`
	IdempotencyKey string          `json:"idempotencyKey,omitempty"`
	Metadata       json.RawMessage `json:"metadata,omitempty"`
	Ephemeral      bool            `json:"ephemeral,omitempty"`
	Provenance     []Hop           `json:"provenance,omitempty"` // set by copy-to-stream only
}

// CoreTypePrefix marks the stream's own control events, reduced by the core processor.
const CoreTypePrefix = "stream/"

// IsCoreType reports whether typ is a stream/* control event type.
func IsCoreType(typ string) bool { return strings.HasPrefix(typ, CoreTypePrefix) }

// Size is the byte count limits are measured in: the user's bytes. A key the server derived (a
// copy's, a server record's) and provenance do not count, so an event accepted at its source can
// always be copied.
func (in *EventInput) Size() int {
	n := len(in.Type) + len(in.Payload) + len(in.Metadata)
	if !strings.HasPrefix(in.IdempotencyKey, InternalKeyPrefix) {
		n += len(in.IdempotencyKey)
	}
	return n
}

var (
	jsonNull        = json.RawMessage("null")
	jsonEmptyObject = json.RawMessage("{}")
)

// Normalize validates in and puts it in stored form: payload and metadata compacted, an absent
// payload as {}, absent metadata as nil, the idempotency key trimmed. It never touches the store,
// so a batch is refused whole before anything is written.
func (in *EventInput) Normalize() error {
	if err := ValidateType(in.Type); err != nil {
		return err
	}
	if len(bytes.TrimSpace(in.Payload)) == 0 {
		in.Payload = jsonEmptyObject
	} else {
		if !utf8.Valid(in.Payload) {
			return Errorf(EInvalid, "payload is not valid UTF-8")
		}
		p, err := compactJSON(in.Payload)
		if err != nil {
			return Errorf(EInvalid, "payload is not valid JSON: %v", err)
		}
		if p[0] != '{' {
			return Errorf(EInvalid, "payload must be a JSON object")
		}
		if d := JSONDepth(p); d > MaxJSONDepth {
			return Errorf(EInvalid, "payload nests %d levels deep, at most %d", d, MaxJSONDepth)
		}
		in.Payload = p
	}
	if len(bytes.TrimSpace(in.Metadata)) == 0 || bytes.Equal(bytes.TrimSpace(in.Metadata), jsonNull) {
		in.Metadata = nil
	} else {
		if !utf8.Valid(in.Metadata) {
			return Errorf(EInvalid, "metadata is not valid UTF-8")
		}
		m, err := compactJSON(in.Metadata)
		if err != nil {
			return Errorf(EInvalid, "metadata is not valid JSON: %v", err)
		}
		if m[0] != '{' {
			return Errorf(EInvalid, "metadata must be a JSON object")
		}
		if d := JSONDepth(m); d > MaxJSONDepth {
			return Errorf(EInvalid, "metadata nests %d levels deep, at most %d", d, MaxJSONDepth)
		}
		in.Metadata = m
	}
	if in.IdempotencyKey != "" {
		if in.IdempotencyKey = strings.TrimSpace(in.IdempotencyKey); in.IdempotencyKey == "" {
			return Errorf(EInvalid, "idempotency key must not be blank")
		}
		if in.Ephemeral {
			return Errorf(EInvalid, "ephemeral events cannot carry an idempotency key")
		}
		if len(in.IdempotencyKey) > MaxIdempotencyKeyLength || !utf8.ValidString(in.IdempotencyKey) {
			return Errorf(EInvalid, "idempotency key must be valid UTF-8 of at most %d bytes", MaxIdempotencyKeyLength)
		}
	}
	if in.Ephemeral && IsCoreType(in.Type) {
		return Errorf(EInvalid, "%s events cannot be ephemeral", CoreTypePrefix+"*")
	}
	if len(in.Provenance) > MaxProvenanceHops {
		return Errorf(EInvalid, "provenance has %d hops, at most %d", len(in.Provenance), MaxProvenanceHops)
	}
	for i, h := range in.Provenance {
		if !utf8.ValidString(h.StreamID + h.Path + h.Subscription + h.Type) {
			return Errorf(EInvalid, "provenance[%d] is not valid UTF-8", i)
		}
	}
	if n := in.Size(); n > MaxEventBytes {
		return Errorf(ETooLarge, "event is %d bytes, at most %d", n, MaxEventBytes)
	}
	return nil
}

// MaxProvenanceHops bounds a copy chain.
const MaxProvenanceHops = 32

// ValidateType checks an event type: 1..MaxTypeLength bytes of printable UTF-8 without spaces.
func ValidateType(typ string) error {
	switch {
	case typ == "":
		return Errorf(EInvalid, "type must not be empty")
	case len(typ) > MaxTypeLength:
		return Errorf(EInvalid, "type is %d bytes, at most %d", len(typ), MaxTypeLength)
	case !utf8.ValidString(typ):
		return Errorf(EInvalid, "type is not valid UTF-8")
	}
	for _, r := range typ {
		if unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return Errorf(EInvalid, "type %q contains whitespace or a control character", typ)
		}
	}
	return nil
}

// MaxTypeFilter bounds a list of event types a client filters by (a read, a connection, a
// waitForEvent predicate, a processor contract's consumed types).
const MaxTypeFilter = 1000

// ValidateTypeFilter checks a type filter: at most MaxTypeFilter entries, each "*" or a valid
// event type. field names the list in the error.
func ValidateTypeFilter(field string, types []string) error {
	if len(types) > MaxTypeFilter {
		return Errorf(EInvalid, "%s lists %d types, at most %d", field, len(types), MaxTypeFilter)
	}
	for i, t := range types {
		if t == "*" {
			continue
		}
		if err := ValidateType(t); err != nil {
			return Errorf(EInvalid, "%s[%d]: %s", field, i, ErrorMessage(err))
		}
	}
	return nil
}

// JSONDepth is how deep valid JSON nests: 0 for a scalar, 1 for {} or [], 2 for {"a":[]}.
func JSONDepth(b []byte) int {
	depth, deepest, inString := 0, 0, false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case inString:
			if c == '\\' {
				i++ // the escaped byte ('"' or '\\' included) ends nothing
			} else if c == '"' {
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			if depth++; depth > deepest {
				deepest = depth
			}
		case c == '}' || c == ']':
			depth--
		}
	}
	return deepest
}

func compactJSON(raw []byte) (json.RawMessage, error) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// SameBody reports whether a retried append of in matches the committed event e: the test an
// idempotency key uses. Payload and metadata compare as JSON values, so key order, whitespace
// and a number's spelling (1, 1.0, 1e0) do not matter: numbers compare by exact decimal value,
// so a client whose serializer writes a float differently on a retry is not refused, while two
// large integers that one float64 would confuse stay apart.
func SameBody(e *Event, in *EventInput) bool {
	return e.Type == in.Type && jsonEqual(e.Payload, in.Payload) && sameMetadata(e.Metadata, in.Metadata)
}

// sameMetadata is jsonEqual where no metadata and an empty object are the same, as an omitted
// payload and {} are: a retry that sends "metadata": {} where the first try sent none (or the
// other way round) is the same event, not an idempotencyConflict.
func sameMetadata(a, b json.RawMessage) bool {
	empty := func(m json.RawMessage) bool { return len(m) == 0 || bytes.Equal(m, jsonEmptyObject) }
	return (empty(a) && empty(b)) || jsonEqual(a, b)
}

func jsonEqual(a, b json.RawMessage) bool {
	if bytes.Equal(a, b) {
		return true
	}
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	va, errA := decodeNumbers(a)
	vb, errB := decodeNumbers(b)
	return errA == nil && errB == nil && sameValue(va, vb)
}

func decodeNumbers(raw json.RawMessage) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

// sameValue compares decoded JSON values; numbers by their text, then by their float64 value.
func sameValue(a, b any) bool {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !sameValue(v, w) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !sameValue(x[i], y[i]) {
				return false
			}
		}
		return true
	case json.Number:
		y, ok := b.(json.Number)
		if !ok {
			return false
		}
		return SameNumber(string(x), string(y))
	default: // string, bool, nil
		return a == b
	}
}

// SameNumber reports whether two JSON number texts are one exact decimal value: 1, 1.0 and 1e0
// are; two integers past 2^53 that round to one float64 are not. Idempotent bodies and
// waitForEvent's payloadContains compare numbers with it.
func SameNumber(a, b string) bool { return a == b || decimalKey(a) == decimalKey(b) }

// decimalKey is a JSON number's exact value as sign, significant digits and power of ten
// ("-1.50e1" and "-15" give "-15e0"), computed on the text without arithmetic, so an exponent of
// any size costs nothing. A number it cannot read keeps its text, and so does one whose exponent
// is beyond +-MaxInt/2: adjusting it by the digits' count could overflow, and a wrapped exponent
// would make two different values one (1.5e-9223372036854775808 and 15e9223372036854775807).
func decimalKey(num string) string {
	neg := strings.HasPrefix(num, "-")
	mant, exp := strings.TrimPrefix(num, "-"), 0
	if i := strings.IndexAny(mant, "eE"); i >= 0 {
		e, err := strconv.Atoi(strings.TrimPrefix(mant[i+1:], "+"))
		if err != nil || e > math.MaxInt/2 || e < math.MinInt/2 {
			return num
		}
		mant, exp = mant[:i], e
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(intPart+frac, "0")
	exp -= len(frac)
	if digits == "" {
		return "0"
	}
	trimmed := strings.TrimRight(digits, "0")
	exp += len(digits) - len(trimmed)
	sign := ""
	if neg {
		sign = "-"
	}
	return sign + trimmed + "e" + strconv.Itoa(exp)
}
