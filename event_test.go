package itx_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
)

func TestEventInput_Normalize(t *testing.T) {
	big := `{"x":"` + strings.Repeat("a", itx.MaxEventBytes) + `"}`
	for _, tc := range []struct {
		name string
		in   itx.EventInput
		code itx.Code // "" = valid
	}{
		{"minimal", itx.EventInput{Type: "note"}, ""},
		{"object payload", itx.EventInput{Type: "note", Payload: json.RawMessage(` { "a" : 1 } `)}, ""},
		{"empty type", itx.EventInput{Type: ""}, itx.EInvalid},
		{"space in type", itx.EventInput{Type: "a b"}, itx.EInvalid},
		{"control char in type", itx.EventInput{Type: "a\x01"}, itx.EInvalid},
		{"long type", itx.EventInput{Type: strings.Repeat("t", itx.MaxTypeLength+1)}, itx.EInvalid},
		{"payload not JSON", itx.EventInput{Type: "t", Payload: json.RawMessage(`{nope`)}, itx.EInvalid},
		{"payload array", itx.EventInput{Type: "t", Payload: json.RawMessage(`[1]`)}, itx.EInvalid},
		{"payload string", itx.EventInput{Type: "t", Payload: json.RawMessage(`"s"`)}, itx.EInvalid},
		{"metadata not object", itx.EventInput{Type: "t", Metadata: json.RawMessage(`3`)}, itx.EInvalid},
		{"metadata bad JSON", itx.EventInput{Type: "t", Metadata: json.RawMessage(`{`)}, itx.EInvalid},
		{"blank key", itx.EventInput{Type: "t", IdempotencyKey: "  "}, itx.EInvalid},
		{"ephemeral with key", itx.EventInput{Type: "t", IdempotencyKey: "k", Ephemeral: true}, itx.EInvalid},
		{"ephemeral core event", itx.EventInput{Type: "stream/error-occurred", Ephemeral: true}, itx.EInvalid},
		{"oversize", itx.EventInput{Type: "t", Payload: json.RawMessage(big)}, itx.ETooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.in
			err := in.Normalize()
			if tc.code == "" {
				require.NoError(t, err)
				return
			}
			require.Equal(t, tc.code, itx.ErrorCode(err), "error: %v", err)
		})
	}

	t.Run("stored form", func(t *testing.T) {
		in := itx.EventInput{Type: "t", Payload: json.RawMessage(" {\n \"a\": [1, 2] } "), Metadata: json.RawMessage("null"), IdempotencyKey: " k "}
		require.NoError(t, in.Normalize())
		require.Equal(t, `{"a":[1,2]}`, string(in.Payload))
		require.Nil(t, in.Metadata)
		require.Equal(t, "k", in.IdempotencyKey)

		empty := itx.EventInput{Type: "t"}
		require.NoError(t, empty.Normalize())
		require.Equal(t, `{}`, string(empty.Payload))
	})
}

// Numbers compare by exact value on their text, whatever the exponent's size.
func TestSameBody_Numbers(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"1", "1.0", true}, {"100", "1e2", true}, {"1.5e1", "15", true}, {"-0", "0", true},
		{"0.001", "1e-3", true}, {"-15", "-1.50e+1", true}, {"1e999999999", "1e999999999", true},
		{"9007199254740993", "9007199254740992", false}, {"1", "-1", false}, {"1e999999999", "1e999999998", false},
		{"1e99999999999999999999", "1e99999999999999999998", false},
	} {
		e := &itx.Event{Type: "t", Payload: json.RawMessage(`{"n":` + tc.a + `}`)}
		in := &itx.EventInput{Type: "t", Payload: json.RawMessage(`{"n":` + tc.b + `}`)}
		require.Equal(t, tc.want, itx.SameBody(e, in), "%s vs %s", tc.a, tc.b)
	}
}

func TestSameBody(t *testing.T) {
	committed := &itx.Event{Type: "t", Payload: json.RawMessage(`{"a":1,"b":[1,2]}`), Metadata: json.RawMessage(`{"m":true}`)}
	for _, tc := range []struct {
		name string
		in   itx.EventInput
		want bool
	}{
		{"identical", itx.EventInput{Type: "t", Payload: json.RawMessage(`{"a":1,"b":[1,2]}`), Metadata: json.RawMessage(`{"m":true}`)}, true},
		{"key order", itx.EventInput{Type: "t", Payload: json.RawMessage(`{"b":[1,2],"a":1}`), Metadata: json.RawMessage(`{"m":true}`)}, true},
		{"other type", itx.EventInput{Type: "u", Payload: json.RawMessage(`{"a":1,"b":[1,2]}`), Metadata: json.RawMessage(`{"m":true}`)}, false},
		{"array order", itx.EventInput{Type: "t", Payload: json.RawMessage(`{"a":1,"b":[2,1]}`), Metadata: json.RawMessage(`{"m":true}`)}, false},
		{"missing metadata", itx.EventInput{Type: "t", Payload: json.RawMessage(`{"a":1,"b":[1,2]}`)}, false},
		{"other number", itx.EventInput{Type: "t", Payload: json.RawMessage(`{"a":2,"b":[1,2]}`), Metadata: json.RawMessage(`{"m":true}`)}, false},
		{"number spelled otherwise", itx.EventInput{Type: "t", Payload: json.RawMessage(`{"a":1.0,"b":[1e0,2.00]}`), Metadata: json.RawMessage(`{"m":true}`)}, true},
		{"another large integer", itx.EventInput{Type: "t", Payload: json.RawMessage(`{"a":9007199254740993,"b":[1,2]}`), Metadata: json.RawMessage(`{"m":true}`)}, false},
		{"number as a string", itx.EventInput{Type: "t", Payload: json.RawMessage(`{"a":"1","b":[1,2]}`), Metadata: json.RawMessage(`{"m":true}`)}, false},
		{"extra key", itx.EventInput{Type: "t", Payload: json.RawMessage(`{"a":1,"b":[1,2],"c":null}`), Metadata: json.RawMessage(`{"m":true}`)}, false},
		{"null for a value", itx.EventInput{Type: "t", Payload: json.RawMessage(`{"a":null,"b":[1,2]}`), Metadata: json.RawMessage(`{"m":true}`)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, itx.SameBody(committed, &tc.in))
		})
	}
}

func TestValidatePath(t *testing.T) {
	for _, ok := range []string{"/", "/a", "/agents/a1", "/a-b_c.d~e:f@g+h=i", "/A/B"} {
		require.NoError(t, itx.ValidatePath(ok), ok)
	}
	for _, bad := range []string{"", "a", "/a/", "//a", "/a//b", "/./a", "/a/..", "/a b", "/a?b", "/a#b", "/é",
		"/" + strings.Repeat("a", itx.MaxPathLength), strings.Repeat("/a", itx.MaxPathSegments+1)} {
		err := itx.ValidatePath(bad)
		require.Equal(t, itx.EInvalid, itx.ErrorCode(err), "path %q: %v", bad, err)
	}
	// The character refused is named whole, not as the first byte of its UTF-8 encoding
	// ("character 'Ã'" for é); a byte that is not UTF-8 is named as a byte.
	for path, want := range map[string]string{
		"/a b":    `stream path "/a b": character ' ' is not allowed`,
		"/é":      `stream path "/é": character 'é' is not allowed`,
		"/ok/日本":  `stream path "/ok/日本": character '日' is not allowed`,
		"/a\xffb": `stream path "/a\xffb": byte 0xff is not allowed (not UTF-8)`,
	} {
		require.Equal(t, want, itx.ErrorMessage(itx.ValidatePath(path)), "path %q", path)
	}
}

func TestErrorCode(t *testing.T) {
	local := itx.Errorf(itx.EOffsetConflict, "expected head offset %d", 3)
	require.Equal(t, itx.EOffsetConflict, itx.ErrorCode(fmt.Errorf("append: %w", local)))

	// As a client sees it: the reason text, annotated by the RPC layer.
	remote := errors.New("itx.capnp:Stream.append: itx.capnp:Streams.get: itx.invalidArgument: stream path \"a\" must start with /")
	require.Equal(t, itx.EInvalid, itx.ErrorCode(remote))
	require.Equal(t, `stream path "a" must start with /`, itx.ErrorMessage(remote))

	require.Equal(t, itx.EInternal, itx.ErrorCode(errors.New("itx.nonsense: x")))
	require.Equal(t, itx.Code(""), itx.ErrorCode(nil))
	for _, c := range itx.Codes {
		require.Equal(t, c, itx.ErrorCode(errors.New((&itx.Error{Code: c, Message: "m"}).Error())))
	}
	// The Go client's own code survives a trip through a string too.
	require.Equal(t, itx.EDisconnected, itx.ErrorCode(errors.New("x: itx.disconnected: lost")))

	require.True(t, itx.Coded(remote))
	require.True(t, itx.Coded(errors.New("itx.internal: named")))
	require.False(t, itx.Coded(errors.New("rpc: connection closed")))
	require.False(t, itx.Coded(nil))
}

// A payload or metadata nesting MaxJSONDepth levels is taken; one level more is refused
// invalidArgument, brackets inside strings (escaped quotes too) not counted.
func TestEventInput_NormalizeBoundsDepth(t *testing.T) {
	nest := func(depth int) string { // depth levels: objects around an array
		return strings.Repeat(`{"a":`, depth-1) + `["\"[{", "\\", "]"]` + strings.Repeat("}", depth-1)
	}
	for _, field := range []string{"payload", "metadata"} {
		for _, depth := range []int{1, 2, itx.MaxJSONDepth - 1, itx.MaxJSONDepth, itx.MaxJSONDepth + 1, 10_000} {
			raw := json.RawMessage(nest(depth))
			if depth == 1 {
				raw = json.RawMessage(`{"s":"[[[{{{\"["}`)
			}
			in := itx.EventInput{Type: "t"}
			if field == "payload" {
				in.Payload = raw
			} else {
				in.Metadata = raw
			}
			err := in.Normalize()
			if depth <= itx.MaxJSONDepth {
				require.NoError(t, err, "%s at depth %d", field, depth)
				continue
			}
			require.Equal(t, itx.EInvalid, itx.ErrorCode(err), "%s at depth %d: %v", field, depth, err)
			require.ErrorContains(t, err, fmt.Sprintf("%s nests %d levels deep, at most %d", field, depth, itx.MaxJSONDepth))
		}
	}
}
