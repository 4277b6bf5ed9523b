package processors

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// runKeepaliveScript drives the keepalive policy through a script, one command a line, and
// renders what each step left behind. Times are offsets from t0.
//
//	track | ok | fail          work starts, settles cleanly, fails
//	fire <dur>                 the alarm fires at t0+dur
//	pass ok | pass fail        the revival pass ended
//	version <v>                the host restarts on version v (memory is lost)
//	crash                      the incarnation dies (memory is lost, the record stays)
func runKeepaliveScript(t *testing.T, script string) string {
	t.Helper()
	t0 := time.UnixMilli(1_000_000_000_000)
	version := "v1"
	var rec KeepaliveRecord
	var mem keepaliveMemory
	var epochs []uint64 // the epochs of the work in flight, oldest first
	now := t0
	var out strings.Builder
	for _, line := range strings.Split(strings.TrimSpace(script), "\n") {
		f := strings.Fields(line)
		action := AlarmAction("")
		switch f[0] {
		case "track":
			rec, mem = onTrack(rec, mem, now, version)
			epochs = append(epochs, mem.epoch)
			if mem.inFlight == 1 {
				mem.oldest = now
			}
		case "ok", "fail":
			var err error
			if f[0] == "fail" {
				err = errors.New("boom")
			}
			if len(epochs) == 0 {
				t.Fatalf("%q: no work in flight", line)
			}
			mem, epochs = onSettle(mem, err, epochs[0]), epochs[1:]
			if mem.inFlight == 0 {
				mem.oldest = time.Time{}
			}
		case "fire":
			d, err := time.ParseDuration(f[1])
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			now = t0.Add(d)
			action, rec, mem = onFire(rec, mem, now, now, version)
		case "pass":
			var err error
			if f[1] == "fail" {
				err = errors.New("append failed")
			}
			action, rec, mem = afterRevival(rec, mem, now, now, err)
		case "version":
			version, mem, epochs = f[1], keepaliveMemory{}, nil
		case "crash":
			mem, epochs = keepaliveMemory{}, nil
		default:
			t.Fatalf("unknown command %q", line)
		}
		armed := "off"
		if rec.ArmedAt != 0 {
			armed = "+" + (time.Duration(rec.ArmedAt-t0.UnixMilli()) * time.Millisecond).String()
		}
		fmt.Fprintf(&out, "%-12s", line)
		if action != "" {
			fmt.Fprintf(&out, " %s", action)
		}
		fmt.Fprintf(&out, " revivals=%d armed=%s\n", rec.Revivals, armed)
	}
	return out.String()
}

func TestKeepalive_Policy(t *testing.T) {
	tests := []struct{ name, script, want string }{
		{
			name: "the redelivery of a poison that takes each incarnation down does not pull the alarm back to the lead",
			script: `
track
crash
fire 10s
pass ok
track
crash
fire 20s
pass ok
track
crash
fire 30s
track
crash
fire 1m20s`,
			want: `
track        revivals=0 armed=+10s
crash        revivals=0 armed=+10s
fire 10s     revive revivals=1 armed=+20s
pass ok      revived revivals=1 armed=+20s
track        revivals=1 armed=+20s
crash        revivals=1 armed=+20s
fire 20s     revive revivals=2 armed=+1m20s
pass ok      revived revivals=2 armed=+30s
track        revivals=2 armed=+30s
crash        revivals=2 armed=+30s
fire 30s     backoff-wait revivals=2 armed=+1m20s
track        revivals=2 armed=+1m20s
crash        revivals=2 armed=+1m20s
fire 1m20s   revive revivals=3 armed=+6m20s`,
		},
		{
			name: "work that settles cleanly is confirmed and disarmed",
			script: `
track
ok
fire 10s`,
			want: `
track        revivals=0 armed=+10s
ok           revivals=0 armed=+10s
fire 10s     clean-disarm revivals=0 armed=off`,
		},
		{
			name: "an incarnation that died owing work is revived, then confirmed once the revival's pass settled",
			script: `
track
crash
fire 10s
pass ok
fire 20s
fire 30s
track
ok
fire 40s`,
			want: `
track        revivals=0 armed=+10s
crash        revivals=0 armed=+10s
fire 10s     revive revivals=1 armed=+20s
pass ok      revived revivals=1 armed=+20s
fire 20s     awaiting-pass revivals=1 armed=+30s
fire 30s     awaiting-pass revivals=1 armed=+40s
track        revivals=1 armed=+40s
ok           revivals=1 armed=+40s
fire 40s     clean-disarm revivals=0 armed=off`,
		},
		{
			// The delayed pass is the poison's: the quiet window before it is no evidence.
			name: "a revival's pass delayed past the lead that then fails keeps the backoff",
			script: `
track
crash
fire 10s
pass ok
track
crash
fire 20s
pass ok
fire 30s
fire 40s
track
fail
fire 1m20s`,
			want: `
track        revivals=0 armed=+10s
crash        revivals=0 armed=+10s
fire 10s     revive revivals=1 armed=+20s
pass ok      revived revivals=1 armed=+20s
track        revivals=1 armed=+20s
crash        revivals=1 armed=+20s
fire 20s     revive revivals=2 armed=+1m20s
pass ok      revived revivals=2 armed=+30s
fire 30s     awaiting-pass revivals=2 armed=+40s
fire 40s     awaiting-pass revivals=2 armed=+50s
track        revivals=2 armed=+50s
fail         revivals=2 armed=+50s
fire 1m20s   revive revivals=3 armed=+6m20s`,
		},
		{
			name: "a revival whose pass never comes within the wedge bound is not confirmed: the backoff stands",
			script: `
track
crash
fire 10s
pass ok
fire 20s
fire 15m9s
fire 15m19s`,
			want: `
track        revivals=0 armed=+10s
crash        revivals=0 armed=+10s
fire 10s     revive revivals=1 armed=+20s
pass ok      revived revivals=1 armed=+20s
fire 20s     awaiting-pass revivals=1 armed=+30s
fire 15m9s   awaiting-pass revivals=1 armed=+15m19s
fire 15m19s  revive revivals=2 armed=+16m19s`,
		},
		{
			name: "work still in flight pushes the alarm ahead",
			script: `
track
fire 10s
fire 20s
ok
fire 30s`,
			want: `
track        revivals=0 armed=+10s
fire 10s     busy-rearmed revivals=0 armed=+20s
fire 20s     busy-rearmed revivals=0 armed=+30s
ok           revivals=0 armed=+30s
fire 30s     clean-disarm revivals=0 armed=off`,
		},
		{
			name: "a crash loop decays along 10s, 1m, 5m, 30m, then the 6h plateau",
			script: `
track
fail
fire 10s
pass ok
track
fail
fire 20s
pass ok
track
fail
fire 30s
fire 1m20s
pass ok
track
fail
fire 1m30s
fire 6m20s
pass ok
track
fail
fire 36m20s
pass ok
track
fail
fire 6h36m20s
pass ok
track
fail
fire 12h36m20s`,
			want: `
track        revivals=0 armed=+10s
fail         revivals=0 armed=+10s
fire 10s     revive revivals=1 armed=+20s
pass ok      revived revivals=1 armed=+20s
track        revivals=1 armed=+20s
fail         revivals=1 armed=+20s
fire 20s     revive revivals=2 armed=+1m20s
pass ok      revived revivals=2 armed=+30s
track        revivals=2 armed=+30s
fail         revivals=2 armed=+30s
fire 30s     backoff-wait revivals=2 armed=+1m20s
fire 1m20s   revive revivals=3 armed=+6m20s
pass ok      revived revivals=3 armed=+1m30s
track        revivals=3 armed=+1m30s
fail         revivals=3 armed=+1m30s
fire 1m30s   backoff-wait revivals=3 armed=+6m20s
fire 6m20s   revive revivals=4 armed=+36m20s
pass ok      revived revivals=4 armed=+6m30s
track        revivals=4 armed=+6m30s
fail         revivals=4 armed=+6m30s
fire 36m20s  revive revivals=5 armed=+6h36m20s
pass ok      revived revivals=5 armed=+36m30s
track        revivals=5 armed=+36m30s
fail         revivals=5 armed=+36m30s
fire 6h36m20s revive revivals=6 armed=+12h36m20s
pass ok      revived revivals=6 armed=+6h36m30s
track        revivals=6 armed=+6h36m30s
fail         revivals=6 armed=+6h36m30s
fire 12h36m20s revive revivals=7 armed=+18h36m20s`,
		},
		{
			name: "a failed revival pass keeps the backoff armed by the mark",
			script: `
track
crash
fire 10s
pass fail
fire 20s
pass ok`,
			want: `
track        revivals=0 armed=+10s
crash        revivals=0 armed=+10s
fire 10s     revive revivals=1 armed=+20s
pass fail    revive-failed revivals=1 armed=+20s
fire 20s     revive revivals=2 armed=+1m20s
pass ok      revived revivals=2 armed=+30s`,
		},
		{
			name: "only a quiet clean fire resets the budget",
			script: `
track
crash
fire 10s
pass ok
track
ok
fire 20s`,
			want: `
track        revivals=0 armed=+10s
crash        revivals=0 armed=+10s
fire 10s     revive revivals=1 armed=+20s
pass ok      revived revivals=1 armed=+20s
track        revivals=1 armed=+20s
ok           revivals=1 armed=+20s
fire 20s     clean-disarm revivals=0 armed=off`,
		},
		{
			name: "a new version revives at once with a fresh budget",
			script: `
track
crash
fire 10s
pass fail
fire 20s
pass fail
version v2
fire 1m20s
pass ok`,
			want: `
track        revivals=0 armed=+10s
crash        revivals=0 armed=+10s
fire 10s     revive revivals=1 armed=+20s
pass fail    revive-failed revivals=1 armed=+20s
fire 20s     revive revivals=2 armed=+1m20s
pass fail    revive-failed revivals=2 armed=+1m20s
version v2   revivals=2 armed=+1m20s
fire 1m20s   revive revivals=1 armed=+1m30s
pass ok      revived revivals=1 armed=+1m30s`,
		},
		{
			name: "a fire before the armed time is not due",
			script: `
track
fire 5s`,
			want: `
track        revivals=0 armed=+10s
fire 5s      not-due revivals=0 armed=+10s`,
		},
		{
			// The alarm, a wall time 10 s ahead, read as a day and 10 s ahead: the revival
			// waited a day (or until the stream's next load).
			name: "after the clock went back a day, a revival owed is due at once",
			script: `
track
crash
fire -24h`,
			want: `
track        revivals=0 armed=+10s
crash        revivals=0 armed=+10s
fire -24h    revive revivals=1 armed=+-23h59m50s`,
		},
		{
			name: "after the clock went back a day, a crash loop waits its backoff from now, not the step too",
			script: `
track
crash
fire 10s
pass ok
track
crash
fire 20s
pass ok
crash
fire -24h
fire -23h59m`,
			want: `
track        revivals=0 armed=+10s
crash        revivals=0 armed=+10s
fire 10s     revive revivals=1 armed=+20s
pass ok      revived revivals=1 armed=+20s
track        revivals=1 armed=+20s
crash        revivals=1 armed=+20s
fire 20s     revive revivals=2 armed=+1m20s
pass ok      revived revivals=2 armed=+30s
crash        revivals=2 armed=+30s
fire -24h    backoff-wait revivals=2 armed=+-23h59m0s
fire -23h59m revive revivals=3 armed=+-23h54m0s`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := strings.TrimSpace(runKeepaliveScript(t, tt.script))
			// Columns are padded; compare field by field.
			if norm(got) != norm(tt.want) {
				t.Errorf("got\n%s\nwant\n%s", got, strings.TrimSpace(tt.want))
			}
		})
	}
}

func norm(s string) string {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	return strings.Join(lines, "\n")
}

func TestKeepalive_Wedged(t *testing.T) {
	t0 := time.UnixMilli(1_000_000_000_000)
	var rec KeepaliveRecord
	var mem keepaliveMemory
	rec, mem = onTrack(rec, mem, t0, "v1") // wedged work: it never settles
	mem.oldest = t0
	var action AlarmAction
	fires := 0
	for now := t0.Add(KeepaliveLead); ; now = time.UnixMilli(rec.ArmedAt) {
		action, rec, mem = onFire(rec, mem, now, now, "v1")
		fires++
		if action != ActionBusyRearmed {
			break
		}
	}
	if fires != BusyFireCap || action != ActionRevive {
		t.Fatalf("got %s after %d fires, want %s after %d", action, fires, ActionRevive, BusyFireCap)
	}
	if got, want := time.Duration(rec.LastRevivalAt-t0.UnixMilli())*time.Millisecond, 15*time.Minute; got != want {
		t.Errorf("wedge detected after %v, want %v", got, want)
	}
	// Other work settling meanwhile (the revival's own delivery) does not hide the wedge: the
	// cadence decays along the backoff instead of returning to the lead.
	var gaps []string
	last := rec.LastRevivalAt
	for range 4 {
		rec, mem = onTrack(rec, mem, time.UnixMilli(rec.LastRevivalAt), "v1")
		mem = onSettle(mem, nil, mem.epoch)
		at := time.UnixMilli(rec.LastRevivalAt)
		action, rec, mem = afterRevival(rec, mem, at, at, nil)
		if action != ActionRevived {
			t.Fatalf("pass: %s", action)
		}
		for action = ActionBackoffWait; action == ActionBackoffWait; {
			at := time.UnixMilli(rec.ArmedAt)
			action, rec, mem = onFire(rec, mem, at, at, "v1")
		}
		if action != ActionRevive {
			t.Fatalf("wedged fire: %s, want %s", action, ActionRevive)
		}
		gaps = append(gaps, (time.Duration(rec.LastRevivalAt-last) * time.Millisecond).String())
		last = rec.LastRevivalAt
	}
	if got, want := strings.Join(gaps, " "), "10s 1m0s 5m0s 30m0s"; got != want {
		t.Errorf("gaps between wedged revivals %q, want %q", got, want)
	}
}
