package itx_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"unicode/utf8"

	"github.com/itx-dev/itx"
)

// FuzzParseProcessorProgress checks the progress record a remote processor host commits
// (ProcessorPorts.commit), decoded as itxd decodes it. Properties: a refusal is EInvalid and
// deterministic; an accepted record is exactly one JSON value of valid UTF-8 (nothing after it),
// its offsets are not negative, and it survives its JSON encoding (the stored record).
func FuzzParseProcessorProgress(f *testing.F) {
	for _, s := range []string{
		`{"reducerVersion":"v1","contract":"c","reducedThrough":3,"state":{"n":1},"processedThrough":3,"cursorRevision":0}`,
		`{"reducerVersion":"v1","reducedThrough":0,"state":null,"processedThrough":0,"cursorRevision":2}`,
		`{}`,
		`{"reducerVersion":"v1"}]`,
		`{"reducerVersion":"v1"} {}`,
		`{"processedThrough":-1}`,
		"{\"state\":\"\xff\"}",
		`{"nope":1}`,
		`{"state":[1,2,{"a":"b"}]}  `,
		`[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		p, err := itx.ParseProcessorProgress(raw)
		p2, err2 := itx.ParseProcessorProgress(raw)
		if (err == nil) != (err2 == nil) || (err == nil && !reflect.DeepEqual(p, p2)) {
			t.Fatalf("ParseProcessorProgress is not deterministic: %v / %v", err, err2)
		}
		if err != nil {
			requireTyped(t, err, itx.EInvalid)
			return
		}
		if !json.Valid(raw) || !utf8.Valid(raw) {
			t.Fatalf("accepted %q, which is not one JSON value of valid UTF-8", raw)
		}
		if p.ReducedThrough < 0 || p.ProcessedThrough < 0 || p.CursorRevision < 0 {
			t.Fatalf("accepted negative offsets: %+v", p)
		}
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatalf("accepted progress does not encode: %v", err)
		}
		back, err := itx.ParseProcessorProgress(b)
		if err != nil {
			t.Fatalf("accepted progress re-encoded as %s is refused: %v", b, err)
		}
		if b2, _ := json.Marshal(back); string(b2) != string(b) {
			t.Fatalf("progress changes through its JSON:\n%s\n%s", b, b2)
		}
	})
}
