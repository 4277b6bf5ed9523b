package itx

import (
	"strings"
	"testing"
)

func TestValidateName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"orders-mirror", true}, {"émoji 👩‍💻 name", true}, {strings.Repeat("é", 500), true},
		{"", false}, {strings.Repeat("é", 501), false}, {"a\x00b", false}, {"a\nb", false},
		{"a\rb", false}, {"a\tb", false}, {"a\x7fb", false}, {"a\u0085b", false}, {"a\u2028b", false},
		{"a\u2029b", false}, {"a\xffb", false}, {" lead", false}, {"trail ", false},
	} {
		err := ValidateName("subscription name", tc.name)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateName(%q) = %v, want ok %v", tc.name, err, tc.ok)
		}
		if err != nil && ErrorCode(err) != EInvalid {
			t.Errorf("ValidateName(%q): code %s, want %s", tc.name, ErrorCode(err), EInvalid)
		}
	}
}

func TestValidateOffset(t *testing.T) {
	if got, err := ValidateOffset("after", 1<<63-1); err != nil || got != 1<<63-1 {
		t.Errorf("got %d, %v; want the largest offset", got, err)
	}
	_, err := ValidateOffset("after", 1<<64-1)
	if want := "after is 18446744073709551615, at most 9223372036854775807"; err == nil || ErrorMessage(err) != want {
		t.Errorf("got %v, want %q", err, want)
	}
}

// A webhook header itxd sets on every delivery cannot be configured: it would be overwritten or
// dropped, and a configured webhook-signature would pass for a signature no secret made. Names
// are case-insensitive. Other headers are taken.
func TestCheckNewSubscriptionConfig_ReservedWebhookHeaders(t *testing.T) {
	for _, name := range []string{"webhook-signature", "Webhook-Id", "WEBHOOK-TIMESTAMP", "Content-Type", "content-length", "Host", "User-Agent"} {
		cfg := &SubscriptionConfig{Name: "h", Receiver: Receiver{Action: KindWebhookPost, URL: "https://example.com/h", Headers: map[string]string{name: "v"}}}
		err := CheckNewSubscriptionConfig(cfg)
		if ErrorCode(err) != EInvalid || !strings.Contains(ErrorMessage(err), "is set by itxd on every delivery") {
			t.Errorf("header %q: got %v, want invalidArgument", name, err)
		}
	}
	cfg := &SubscriptionConfig{Name: "h", Receiver: Receiver{Action: KindWebhookPost, URL: "https://example.com/h", Headers: map[string]string{"Authorization": "Bearer x", "X-Webhook-Signature-Mine": "y"}}}
	if err := CheckNewSubscriptionConfig(cfg); err != nil {
		t.Errorf("other headers: %v", err)
	}
}
