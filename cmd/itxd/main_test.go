package main

import "testing"

// The address itxd suggests and records for clients on this machine: a wildcard listen address
// is dialled on loopback; anything else as bound.
func TestDialable(t *testing.T) {
	for in, want := range map[string]string{
		"0.0.0.0:7000":   "127.0.0.1:7000",
		"[::]:7000":      "127.0.0.1:7000",
		"127.0.0.1:7000": "127.0.0.1:7000",
		"[::1]:7000":     "[::1]:7000",
		"10.1.2.3:7000":  "10.1.2.3:7000",
		"host:7000":      "host:7000",
		"garbage":        "garbage",
	} {
		if got := dialable(in); got != want {
			t.Errorf("dialable(%q) = %q, want %q", in, got, want)
		}
	}
}
