package itx_test

import (
	"encoding/json"
	"net/http"
	"reflect"
	"testing"

	"github.com/itx-dev/itx"
)

// FuzzParseSubscriptionConfig checks the configured event's payload as the core reducer parses
// it (after the append's Normalize): a refusal is EInvalid and deterministic; an accepted config
// re-encodes to JSON that parses to the same config (the same JSON) (the catalog checkpoint and an identical
// re-configure depend on it), and its filter and receiver keep their documented rules.
func FuzzParseSubscriptionConfig(f *testing.F) {
	for _, s := range []string{
		`{"name":"a","receiver":{"action":"webhook-post","url":"https://example.com/h","headers":{"X-A":"1"},"secret":"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}`,
		`{"name":"c","filter":{"eventTypes":["order","*"],"jsonataCondition":" payload.n > 1 "},"receiver":{"action":"copy-to-stream","receivingStreamPath":"/b"}}`,
		`{"receiver":{"action":"itx-call","capability":"cap","delivery":{"start":"now","onFailingEvent":"skip","deadLetterPath":"/dl"}},"confirmWindow":10}`,
		`{"name":"p","receiver":{"action":"processor-wake","placement":"facet","processor":"counter"}}`,
		`{"name":"w","maxDeliveryEvents":10,"maxDeliveryBytes":1000,"receiver":{"action":"webhook-post","url":"http://h"}}`,
		`{"name":"x","receiver":{"action":"webhook-post","url":"http://h","secret":"itxsecret:0123456789abcdef0123456789abcdef"}}`,
		`{"name":"s","scope":"/t","receiver":{"action":"itx-call","capability":"c"}}`,
		`{"name":" ","receiver":{"action":"itx-call","capability":"c"}}`,
		`{"filter":{"eventTypes":[]},"receiver":{"action":"itx-call","capability":"c"}}`,
		`{"filter":{"eventTypes":["a b"]},"receiver":{"action":"itx-call","capability":"c"}}`,
		`{"receiver":{"action":"copy-to-stream","receivingStreamPath":"/b","delivery":{"start":"now","onFailingEvent":"skip"}}}`,
		`{"receiver":{"action":"webhook-post","url":"http://h","headers":{"X":"a\r\nb"}}}`,
		`{"receiver":{"action":"webhook-post","url":"http://h","headers":{"X-A":"1","x-a":"2"}}}`,
		`{"Name":"a","name":"b","receiver":{"action":"itx-call","capability":"c"}}`,
		`{"receiver":{"action":"nope"}}`,
		`{"receiver":{}} {}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		in := itx.EventInput{Type: itx.TypeSubscriptionConfigured, Payload: payload}
		if in.Normalize() != nil {
			return // refused by the append before the reducer sees it
		}
		parse := func() (*itx.SubscriptionConfig, error) { // as the reducer takes a client's configure
			cfg, err := itx.ParseSubscriptionConfig(in.Payload)
			if err == nil {
				err = itx.CheckNewSubscriptionConfig(cfg)
			}
			return cfg, err
		}
		cfg, err := parse()
		cfg2, err2 := parse()
		if (err == nil) != (err2 == nil) || (err == nil && !reflect.DeepEqual(cfg, cfg2)) {
			t.Fatalf("ParseSubscriptionConfig is not deterministic: %v / %v", err, err2)
		}
		if err != nil {
			requireTyped(t, err, itx.EInvalid)
			return
		}
		if f := cfg.Filter; f != nil {
			if err := itx.ValidateTypeFilter("filter.eventTypes", f.EventTypes); err != nil {
				t.Fatalf("accepted a filter ValidateTypeFilter refuses: %v", err)
			}
		}
		seen := map[string]bool{}
		for name := range cfg.Receiver.Headers {
			if seen[http.CanonicalHeaderKey(name)] {
				t.Fatalf("accepted the header %q twice (a request carries one of them, which one by chance)", http.CanonicalHeaderKey(name))
			}
			seen[http.CanonicalHeaderKey(name)] = true
		}
		b, err := json.Marshal(cfg)
		if err != nil {
			t.Fatalf("accepted config does not encode: %v", err)
		}
		again, err := itx.ParseSubscriptionConfig(b)
		if err != nil {
			t.Fatalf("accepted config %s re-encoded as %s is refused: %v", in.Payload, b, err)
		}
		// Compared as the catalog compares configs (sameConfig): by their JSON, where an empty
		// map of headers and none are one.
		if b2, err := json.Marshal(again); err != nil || string(b2) != string(b) {
			t.Fatalf("accepted config changes through its JSON:\n%s\n%s", b, b2)
		}
	})
}
