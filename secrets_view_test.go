package itx

import "testing"

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
