package itx

import (
	"strings"
	"testing"
)

func TestRedactURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"https://example.com/hook", "https://example.com/hook"},
		{"https://bob:pw@example.com/hook", "https://redacted@example.com/hook"},
		{"https://tok@example.com/hook", "https://redacted@example.com/hook"},
		{"https://example.com/hook?token=abc&token=def&x=", "https://example.com/hook?token=redacted&token=redacted&x=redacted"},
		{"https://example.com/hook?%zz", "https://example.com/hook?redacted"},
		{"https://example.com/hook#frag", "https://example.com/hook"},
		{"https:user:pw@example.com", Redacted},
		{"http://[::1", Redacted},
	} {
		if got := RedactURL(tc.in); got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestRedactedEvent(t *testing.T) {
	ref := SecretRefPrefix + "0123456789abcdef0123456789abcdef"
	in := Event{Type: TypeSubscriptionConfigured, Payload: []byte(`{"name":"a","receiver":{"action":"webhook-post",` +
		`"url":"https://u:p@h/x?t=1","Headers":{"Authorization":"Bearer s"},"secret":"whsec_legacy"}}`)}
	got, changed := RedactedEvent(in)
	want := `{"name":"a","receiver":{"Headers":{"Authorization":"(redacted)"},"action":"webhook-post","secret":"(redacted)","url":"https://redacted@h/x?t=redacted"}}`
	if !changed || string(got.Payload) != want {
		t.Fatalf("RedactedEvent = %s, %v; want %s", got.Payload, changed, want)
	}
	kept := Event{Type: TypeSubscriptionConfigured, Payload: []byte(`{"name":"a","receiver":{"action":"webhook-post","url":"https://h/x","secret":"` + ref + `"}}`)}
	if got, changed := RedactedEvent(kept); changed {
		t.Fatalf("RedactedEvent changed %s to %s: nothing in it is a credential", kept.Payload, got.Payload)
	}
	letter := Event{Type: TypeDeadLetter, Payload: []byte(`{"offset":3,"event":{"offset":3,"type":"stream/subscription-configured","payload":` + string(in.Payload) + `}}`)}
	got, changed = RedactedEvent(letter)
	if !changed || strings.Contains(string(got.Payload), "Bearer s") || strings.Contains(string(got.Payload), "whsec_legacy") {
		t.Fatalf("a dead letter's event is not redacted: %s", got.Payload)
	}
}
