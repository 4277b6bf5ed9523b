package server

import (
	"testing"

	"github.com/itx-dev/itx"
)

// FuzzJSONata looks for library defects a user's expression could reach that evalJSONata cannot
// turn into an error: a hang, a stack overflow, memory exhausted (go test -fuzz FuzzJSONata
// ./server/). Panics are recovered there, as in the server. Plain go test runs the seeds and
// every input in testdata/fuzz.
func FuzzJSONata(f *testing.F) {
	for _, s := range []string{
		`payload.items[0]`,
		`$map(payload.items, function($v){$v*2})`,
		`$substring("abc", 1, 2)`,
		`payload.{"a": $}`,
		`$sort(payload.items)`,
		`$split("a,b", ",", 1)`,
		`$formatNumber(12, "#0.00")`,
		`$pad("x", -3)`,
		`payload.items[[1..2]]`,
		`$zip([1],[2])`,
		`$lookup(payload, "total")`,
		`$spread(payload)`,
		`$each(payload, function($v,$k){$k})`,
		`$fromMillis(0, "[Y0001]")`,
		`$toMillis("2020")`,
		`$replace("abc", /b/, "x")`,
		`$match("abc", /b/)`,
		`payload ~> |$|{"x":1}|`,
		"!\u03e500000000000",                         // a lexer panic
		`$formatNumber(0,"#e00")`,                    // an endless loop
		`$map([1..50000], function($v){[1..50000]})`, // 566 MiB before the total budget
	} {
		f.Add(s)
	}
	ev := &itx.Event{Offset: 7, Type: "order", Payload: []byte(`{"total":3,"items":[1,2,3],"s":"héllo"}`)}
	f.Fuzz(func(t *testing.T, src string) {
		expr, err := CompileJSONata(src)
		if err != nil {
			return
		}
		_, _ = evalJSONata("", expr, ev)
	})
}
