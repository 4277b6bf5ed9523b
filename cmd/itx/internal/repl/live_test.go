package repl

import (
	"encoding/json"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/stretchr/testify/require"
)

// isoTimes turns only the numbers under keys ending in "At" into times, whatever the
// subscription, reader or connection names are; order, big offsets and text stay as sent, and a
// patch rewritten the same way still applies to the rewritten snapshot.
func TestIsoTimes(t *testing.T) {
	snapshot := `{"path":"/a","head":9007199254740993,"lastAppendAt":1700000000000,` +
		`"subscriptions":{"sentAt":{"lag":2,"lastError":"503 <html>","nextAttemptAt":1700000001000}},"readers":{}}`
	got := isoTimes(json.RawMessage(snapshot), "")
	want := `{"path":"/a","head":9007199254740993,"lastAppendAt":"2023-11-14T22:13:20.000Z",` +
		`"subscriptions":{"sentAt":{"lag":2,"lastError":"503 <html>","nextAttemptAt":"2023-11-14T22:13:21.000Z"}},"readers":{}}`
	require.Equal(t, want, string(got))

	patch := `[{"op":"replace","path":"/lastAppendAt","value":1700000002000},` +
		`{"op":"add","path":"/readers/syncAt","value":{"checkpoint":1,"lag":5}},` +
		`{"op":"replace","path":"/subscriptions/sentAt","value":{"lag":0,"nextAttemptAt":1700000003000}},` +
		`{"op":"remove","path":"/head"}]`
	p, err := jsonpatch.DecodePatch(isoTimesInPatch(json.RawMessage(patch)))
	require.NoError(t, err)
	doc, err := p.Apply(got)
	require.NoError(t, err)
	require.JSONEq(t, `{"path":"/a","lastAppendAt":"2023-11-14T22:13:22.000Z",`+
		`"subscriptions":{"sentAt":{"lag":0,"nextAttemptAt":"2023-11-14T22:13:23.000Z"}},"readers":{"syncAt":{"checkpoint":1,"lag":5}}}`, string(doc))
}
