package server

import (
	"errors"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
)

// FuzzPredicate compiles a waitForEvent predicate from fuzzed parts and matches it against an
// event a client could have appended. Properties: a refusal, at compile or at match, is a typed
// error; a predicate without JSONata matches deterministically; a type filter that leaves the
// event's type out never matches it; and every payload contains itself (payloadContains is
// reflexive, within its comparison budget).
func FuzzPredicate(f *testing.F) {
	for _, s := range []struct{ types, contains, where, typ, payload string }{
		{"order", `{"n":1}`, "", "order", `{"n":1.0,"m":2}`},
		{"*", `{"a":[1,{"b":null}]}`, "payload.a[0] = 1", "x", `{"a":[{"b":null,"c":1},1]}`},
		{"", `[]`, "", "x", `{}`},
		{"a,b", `{"n":"1"}`, "", "b", `{"n":1}`},
		{"", `{"n":9007199254740993}`, "", "x", `{"n":9007199254740992}`},
		{"", `{"a":[[[[1]]],[[[1]]],[[[1]]],[[[2]]]]}`, "", "x", `{"a":[[[[1,1,1,1,1,1,1,1]]],[[[1]]],[[[1]]]]}`},
		{"a b", "", "", "x", `{}`},
		{"", `{"a":`, "", "x", `{}`},
		{"", "", "payload.(", "x", `{}`},
		{"", "", `$error("boom")`, "x", `{}`},
		{"", "", `payload.n`, "x", `{"n":true}`},
		{"", "", `type = "x"`, "x", `{"k":"\u2028"}`},
	} {
		f.Add(s.types, []byte(s.contains), s.where, s.typ, []byte(s.payload))
	}
	f.Fuzz(func(t *testing.T, types string, contains []byte, where, typ string, payload []byte) {
		in := itx.EventInput{Type: typ, Payload: payload}
		if in.Normalize() != nil {
			return // never appended
		}
		e := &itx.Event{Offset: 3, Type: in.Type, Payload: in.Payload, CreatedAt: 1000}
		p := itx.Predicate{PayloadContains: contains, Where: where}
		if types != "" {
			p.Types = strings.Split(types, ",")
		}
		c, err := compilePredicate(p)
		if err != nil {
			requireCode(t, err, itx.EInvalid, itx.ETooLarge)
			return
		}
		ok, err := c.match(e)
		if err != nil {
			requireCode(t, err, itx.EInvalid, itx.ELimitExceeded, itx.EUnavailable)
			return
		}
		if where == "" {
			again, err := c.match(e)
			if err != nil || again != ok {
				t.Fatalf("match is not deterministic: %v then %v (%v)", ok, again, err)
			}
		}
		if ok && c.types != nil && !c.types[e.Type] {
			t.Fatalf("type filter %q matched type %q", p.Types, e.Type)
		}
		self, err := compilePredicate(itx.Predicate{PayloadContains: e.Payload})
		if err != nil {
			if itx.ErrorCode(err) == itx.ETooLarge {
				return
			}
			t.Fatalf("a stored payload is refused as a pattern: %v", err)
		}
		if ok, err := self.match(e); !ok && itx.ErrorCode(err) != itx.ELimitExceeded {
			t.Fatalf("payload %s does not contain itself: %v", e.Payload, err)
		}
	})
}

// requireCode fails unless err is an *itx.Error with one of codes.
func requireCode(t *testing.T, err error, codes ...itx.Code) {
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
