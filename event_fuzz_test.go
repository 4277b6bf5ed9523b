package itx_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/big"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/itx-dev/itx"
)

// requireTyped fails unless err is an *itx.Error with one of codes: a refusal a client can act
// on, never a bare string (which would reach it as internal).
func requireTyped(t *testing.T, err error, codes ...itx.Code) {
	t.Helper()
	var e *itx.Error
	if !errors.As(err, &e) {
		t.Fatalf("refusal is not an *itx.Error: %T %v", err, err)
	}
	for _, c := range codes {
		if e.Code == c {
			return
		}
	}
	t.Fatalf("refusal has code %s, want one of %v: %v", e.Code, codes, err)
}

// FuzzNormalize checks the append path's validation of one event: a refusal is typed and
// deterministic; an accepted event is in stored form (compact JSON objects, a trimmed key,
// within MaxEventBytes), normalizing it again changes nothing, it survives its JSON encoding,
// and it is the same body as itself committed (what an idempotent retry compares).
func FuzzNormalize(f *testing.F) {
	for _, s := range []struct {
		typ, payload, metadata, key string
		ephemeral                   bool
	}{
		{"note", `{"a":1}`, "", "", false},
		{"note", ` { "a" : [1, 2.50, "x"] } `, `{"m":true}`, " k1 ", false},
		{"note", "", "null", "", true},
		{"stream/subscription-configured", `{}`, "", "", true},
		{"a b", `{}`, "", "", false},
		{"note", `[1]`, "", "", false},
		{"note", `{"a":"\ud800"}`, "", "", false},
		{"note", "{\"a\":\"\xff\"}", "", "", false},
		{"note", `{}`, `3`, "", false},
		{"note", `{}`, "", "   ", false},
		{"note", `{}`, "", "k", true},
		{"é", `{"a":1e400}`, `{}`, "itx-internal/x", false},
		{"note", `{} {}`, "", "", false},
	} {
		f.Add(s.typ, []byte(s.payload), []byte(s.metadata), s.key, s.ephemeral)
	}
	f.Fuzz(func(t *testing.T, typ string, payload, metadata []byte, key string, ephemeral bool) {
		mk := func() itx.EventInput {
			return itx.EventInput{Type: typ, Payload: bytes.Clone(payload), Metadata: bytes.Clone(metadata), IdempotencyKey: key, Ephemeral: ephemeral}
		}
		in, again := mk(), mk()
		err, err2 := in.Normalize(), again.Normalize()
		if (err == nil) != (err2 == nil) || (err != nil && err.Error() != err2.Error()) || !reflect.DeepEqual(in, again) {
			t.Fatalf("Normalize is not deterministic: %v / %v", err, err2)
		}
		if err != nil {
			requireTyped(t, err, itx.EInvalid, itx.ETooLarge)
			return
		}
		if itx.ValidateType(in.Type) != nil {
			t.Fatalf("accepted type %q that ValidateType refuses", in.Type)
		}
		for what, raw := range map[string][]byte{"payload": in.Payload, "metadata": in.Metadata} {
			if what == "metadata" && raw == nil {
				continue
			}
			var buf bytes.Buffer
			if !utf8.Valid(raw) || json.Compact(&buf, raw) != nil || !bytes.Equal(buf.Bytes(), raw) || raw[0] != '{' {
				t.Fatalf("accepted %s %q is not a compact JSON object", what, raw)
			}
		}
		if in.IdempotencyKey != strings.TrimSpace(in.IdempotencyKey) || !utf8.ValidString(in.IdempotencyKey) || len(in.IdempotencyKey) > itx.MaxIdempotencyKeyLength {
			t.Fatalf("accepted key %q is not trimmed valid UTF-8 within bounds", in.IdempotencyKey)
		}
		if in.Ephemeral && (in.IdempotencyKey != "" || itx.IsCoreType(in.Type)) {
			t.Fatalf("accepted an ephemeral event with a key or a core type: %+v", in)
		}
		if in.Size() > itx.MaxEventBytes {
			t.Fatalf("accepted %d bytes", in.Size())
		}
		re := in
		if err := re.Normalize(); err != nil || !reflect.DeepEqual(re, in) {
			t.Fatalf("normalizing a normalized event changed it: %v\n%+v\n%+v", err, in, re)
		}
		b, err := json.Marshal(in)
		if err != nil {
			t.Fatalf("accepted event does not encode: %v", err)
		}
		var back itx.EventInput
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("accepted event does not decode: %v", err)
		}
		if err := back.Normalize(); err != nil || !reflect.DeepEqual(back, in) {
			t.Fatalf("accepted event changed through JSON: %v\n%+v\n%+v", err, in, back)
		}
		committed := &itx.Event{Offset: 1, Type: in.Type, Payload: in.Payload, Metadata: in.Metadata, IdempotencyKey: in.IdempotencyKey}
		if !itx.SameBody(committed, &in) {
			t.Fatalf("an event is not the same body as itself committed: %+v", in)
		}
	})
}

var jsonNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$`)

// exactDecimal is a JSON number's exact value as (sign and significant digits, power of ten),
// the power of ten of any size: the reference SameNumber is checked against.
func exactDecimal(num string) (string, *big.Int) {
	neg := strings.HasPrefix(num, "-")
	mant, exp := strings.TrimPrefix(num, "-"), new(big.Int)
	if i := strings.IndexAny(mant, "eE"); i >= 0 {
		exp.SetString(strings.TrimPrefix(mant[i+1:], "+"), 10)
		mant = mant[:i]
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(intPart+frac, "0")
	exp.Sub(exp, big.NewInt(int64(len(frac))))
	if digits == "" {
		return "0", new(big.Int)
	}
	trimmed := strings.TrimRight(digits, "0")
	exp.Add(exp, big.NewInt(int64(len(digits)-len(trimmed))))
	if neg {
		trimmed = "-" + trimmed
	}
	return trimmed, exp
}

// writtenExponent is the exponent a JSON number's text spells (0 if none).
func writtenExponent(num string) *big.Int {
	exp := new(big.Int)
	if i := strings.IndexAny(num, "eE"); i >= 0 {
		exp.SetString(strings.TrimPrefix(num[i+1:], "+"), 10)
	}
	return exp
}

// FuzzSameNumber checks the number comparison idempotent retries and payloadContains use against
// exact decimal arithmetic: it never calls two different values the same (a retry with another
// body would be taken for a duplicate), and two spellings of one value whose written exponents are within
// +-2^62 are the same. Beyond that the comparison may fall back to the text, a conflict rather
// than a silent duplicate.
func FuzzSameNumber(f *testing.F) {
	for _, s := range [][2]string{
		{"1", "1.0"}, {"1", "1e0"}, {"-1.50e1", "-15"}, {"0", "-0.0e5"}, {"100", "1e2"},
		{"9007199254740993", "9007199254740992"}, {"1e400", "10e399"}, {"1E+2", "100"},
		{"1e9223372036854775807", "1e9223372036854775806"},
		{"1.5e-9223372036854775808", "1.5e9223372036854775807"}, {"1.5e-9223372036854775808", "15e9223372036854775807"},
		{"0.001", "1e-3"}, {"1e99999999999999999999", "1.0e99999999999999999999"},
	} {
		f.Add(s[0], s[1])
	}
	limit := new(big.Int).Lsh(big.NewInt(1), 62)
	f.Fuzz(func(t *testing.T, a, b string) {
		if !jsonNumber.MatchString(a) || !jsonNumber.MatchString(b) {
			return
		}
		same := itx.SameNumber(a, b)
		if same != itx.SameNumber(b, a) {
			t.Fatalf("SameNumber(%s, %s) is not symmetric", a, b)
		}
		da, ea := exactDecimal(a)
		db, eb := exactDecimal(b)
		exact := da == db && ea.Cmp(eb) == 0
		if same && !exact {
			t.Fatalf("SameNumber(%s, %s) is true for two different values", a, b)
		}
		if !same && exact && writtenExponent(a).CmpAbs(limit) < 0 && writtenExponent(b).CmpAbs(limit) < 0 {
			t.Fatalf("SameNumber(%s, %s) is false for one value", a, b)
		}
	})
}
