package test

import (
	"strings"
	"testing"
)

// itxd says so at start when --idle-timeout is under the processors' keepalive lead (10 s):
// their busy fires are what keep a stream with work in flight loaded, and under the lead an
// in-process attempt longer than the idle timeout was cancelled at every revival, in silence
// (a 6 s vendor call under --idle-timeout 2s: three calls, no settlement in 45 s).
func TestItxd_IdleTimeoutUnderTheKeepaliveLeadIsSaid(t *testing.T) {
	const said = "under the processors' keepalive lead"
	for _, tc := range []struct {
		name string
		args []string
		want bool
	}{
		{"under the lead", []string{"--idle-timeout", "2s"}, true},
		{"the default", nil, false},
		{"no processors hosted", []string{"--idle-timeout", "2s", "--processors", ""}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startItxd(t, t.TempDir(), tc.args...)
			if got := strings.Contains(p.logs.String(), said); got != tc.want {
				t.Errorf("warned %v, want %v; log:\n%s", got, tc.want, p.logs.String())
			}
		})
	}
}
