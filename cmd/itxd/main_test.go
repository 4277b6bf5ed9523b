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

// The default of --max-held-streams leaves the descriptors the other bounds' sockets may take:
// 8 per held stream, within the open-file limit with every socket open.
func TestHeldStreamsLeaveRoomForSockets(t *testing.T) {
	const sockets = 4096 + 1024 + 64 // the defaults of --rpc-max-connections, --webhook-max-in-flight, --metrics-max-connections
	for _, limit := range []int64{20_000, 65_536, 1 << 20} {
		held := heldStreamsFor(limit, sockets)
		if used := int64(held)*8 + sockets + 1024; used > limit && held > 256 {
			t.Errorf("limit %d: %d held streams and %d sockets take %d descriptors", limit, held, sockets, used)
		}
	}
	if got := heldStreamsFor(4096, sockets); got != 256 {
		t.Errorf("a small limit still allows the floor of 256, got %d", got)
	}
	if got := heldStreamsFor(1<<30, sockets); got != 16384 {
		t.Errorf("a huge limit is capped at 16384, got %d", got)
	}
}
