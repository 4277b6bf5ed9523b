package server

import (
	"strings"
	"testing"
)

// An offset-acking webhook's answer: confirmedOffset confirms through it; anything else is the
// whole delivery (0). A confirmedOffset ahead of a long member counts though the answer is cut at
// webhookBodyBytes (and so no longer parses whole); a later confirmedOffset is past the cut.
func TestConfirmedIn(t *testing.T) {
	long := `"` + strings.Repeat("r", webhookBodyBytes) + `"`
	cut := func(s string) []byte { return []byte(s[:min(len(s), webhookBodyBytes)]) }
	for body, want := range map[string]int64{
		`{"confirmedOffset": 7}`:                     7,
		` {"ok": true, "confirmedOffset": 12} `:      12,
		`{"nested": {"confirmedOffset": 3}, "x": 1}`: 0,
		`{"confirmedOffset": -1}`:                    0,
		`{"confirmedOffset": 1.5}`:                   0,
		`{"confirmedOffset": "4"}`:                   0,
		`[{"confirmedOffset": 4}]`:                   0,
		`ok`:                                         0,
		``:                                           0,
		`{"confirmedOffset": 9, "results": ` + long + `}`: 9,
		`{"results": ` + long + `, "confirmedOffset": 9}`: 0,
	} {
		if got := confirmedIn(cut(body)); got != want {
			t.Errorf("%.60q: %d, want %d", body, got, want)
		}
	}
}
