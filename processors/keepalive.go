package processors

import (
	"time"
)

// The keepalive's constants (DESIGN.md "Constants").
const (
	// KeepaliveLead is how far ahead of in-flight work the alarm sits: it bounds how late a
	// processor that died owing work is revived.
	KeepaliveLead = 10 * time.Second
	// RevivalPlateau is the crash-loop breaker's longest interval (about four wakes a day).
	RevivalPlateau = 6 * time.Hour
	// BusyFireCap is how many lead intervals in-flight work may run before it counts as wedged
	// (90 fires at the lead, 15 minutes: past any legitimate tracked work's deadline). A wedge
	// stops re-arming at the lead and decays along the revival backoff.
	BusyFireCap = 90
	// WedgedAfter is BusyFireCap lead intervals.
	WedgedAfter = BusyFireCap * KeepaliveLead
	// CrashLoopEvidenceAt is the revival count at which the breaker records stream evidence.
	CrashLoopEvidenceAt = 3
)

var revivalBackoff = [...]time.Duration{10 * time.Second, time.Minute, 5 * time.Minute, 30 * time.Minute}

// RevivalBackoff is the least time after the n-th consecutive revival (1-based) before the next
// one: 10 s, 1 m, 5 m, 30 m, then RevivalPlateau forever.
func RevivalBackoff(n int) time.Duration {
	if n >= 1 && n <= len(revivalBackoff) {
		return revivalBackoff[n-1]
	}
	return RevivalPlateau
}

// KeepaliveRecord is one processor's durable keepalive mark, stored in KV below the reduction:
// the breaker must not depend on the reduction it protects. Times are epoch ms; ArmedAt 0 means
// disarmed.
type KeepaliveRecord struct {
	Revivals      int    `json:"revivals"`      // consecutive revivals without a quiet clean fire
	LastRevivalAt int64  `json:"lastRevivalAt"` // when the last revival was marked
	Version       string `json:"version"`       // the host version that wrote the marks
	ArmedAt       int64  `json:"armedAt"`       // this keepalive's alarm desire
}

// keepaliveMemory is what one incarnation knows; it dies with the incarnation, which is exactly
// why a fresh incarnation's first fire revives.
type keepaliveMemory struct {
	inFlight int
	// oldest is when the oldest in-flight work started, an itx.Monotonic reading (the caller
	// keeps it current): how long work has run is measured on the monotonic clock, so a step of
	// the wall clock does not make running work look wedged and revive it while it runs.
	oldest     time.Time
	sawClean   bool // some tracked work settled cleanly since the last fire that looked
	sawFailure bool // some tracked work failed: an obligation may be unsettled
	reviving   bool // a revival pass is running; its backoff governs the alarm
	// owed: this incarnation found the alarm armed by one before it (which died owing work, or
	// before its confirming fire), so its first due fire revives even if work of its own has
	// settled cleanly by then. Itxd delivers to a stream's processors whenever the stream loads
	// (its stream/woken), so a fresh incarnation often settles the dead one's obligation before
	// the fire; it owes the revival's mark and fact all the same (seed 002: a fresh incarnation
	// fired for a dead one's work revives).
	owed bool
	// epoch counts this incarnation's revivals: work tracked since the last one (onTrack leaves
	// it in the memory for the caller to hand back to onSettle) is that revival's pass.
	epoch uint64
	// passPending: a revival was marked and no work of its epoch has settled yet. The fact it
	// appends reaches the processor by ordinary delivery (a frame, or the eventless pass), on
	// its own time: the confirming fire waits for that pass, up to WedgedAfter from the
	// revival's fact (revivedAt, an itx.Monotonic reading), so a pass delayed past the lead (a loaded
	// host, a project at its share of held streams) is not mistaken for a quiet clean window
	// that resets the budget, letting a poison's crash loop start again at 10 s. A pass that
	// never comes within the bound leaves the window unconfirmed: the backoff stands.
	passPending bool
	revivedAt   time.Time
}

// wedged reports whether the oldest in-flight work has run past WedgedAfter at mono (an
// itx.Monotonic reading): a hung call no deadline owns. Short work overlapping continuously
// never looks wedged.
func (m keepaliveMemory) wedged(mono time.Time) bool {
	return m.inFlight > 0 && mono.Sub(m.oldest) >= WedgedAfter
}

// AlarmAction is what one fire decided.
type AlarmAction string

// The outcomes of a keepalive fire.
const (
	ActionNotDue       AlarmAction = "not-due"       // not this keepalive's time
	ActionBusyRearmed  AlarmAction = "busy-rearmed"  // work still in flight: pushed ahead
	ActionAwaitingPass AlarmAction = "awaiting-pass" // the last revival's pass has not run yet
	ActionCleanDisarm  AlarmAction = "clean-disarm"  // quiet and clean: disarmed, budget reset
	ActionBackoffWait  AlarmAction = "backoff-wait"  // a revival is owed but the breaker says not yet
	ActionRevive       AlarmAction = "revive"        // marked; the revival pass runs now
	ActionRevived      AlarmAction = "revived"       // the pass appended its fact
	ActionReviveFailed AlarmAction = "revive-failed" // the pass failed; the marked backoff retries
)

// afterClockStepBack takes back, at ms, what the wall clock going back (stepped by NTP or an
// operator, a VM restored from a snapshot) left in rec (pure). Its times are wall times: an
// alarm armed a lead or a backoff ahead would otherwise fire as long after as the clock went
// back, and a revival marked "later than now" would hold the next one back by the step too. An
// alarm further ahead than the record ever arms it (the lead, or the backoff its revivals
// reached) is due now; a revival marked later than now counts as marked now, so a crash loop
// still waits its whole backoff, no more.
func afterClockStepBack(rec KeepaliveRecord, ms int64) KeepaliveRecord {
	if rec.LastRevivalAt > ms {
		rec.LastRevivalAt = ms
	}
	horizon := KeepaliveLead
	if rec.Revivals > 0 {
		horizon = RevivalBackoff(rec.Revivals)
	}
	if rec.ArmedAt > ms+horizon.Milliseconds() {
		rec.ArmedAt = ms
	}
	return rec
}

// onFire is the breaker's policy for one alarm fire at now (pure); mono is the same instant's
// itx.Monotonic reading, which times in-flight work (now is the wall clock the record holds).
// The mark is written before the revival runs: a crash anywhere after it leaves the incremented
// count and a retry armed at the backoff, so a crash loop can only decay. Revivals are spaced by
// the record, not by whoever armed the alarm last, so work pulling the alarm back to the lead
// cannot tighten the loop.
func onFire(rec KeepaliveRecord, mem keepaliveMemory, now, mono time.Time, version string) (AlarmAction, KeepaliveRecord, keepaliveMemory) {
	ms := now.UnixMilli()
	rec = afterClockStepBack(rec, ms)
	if rec.ArmedAt == 0 || ms < rec.ArmedAt {
		return ActionNotDue, rec, mem
	}
	if rec.Version != version {
		// A new version (the antidote deploy) starts from a fresh budget.
		rec = KeepaliveRecord{Version: version, ArmedAt: rec.ArmedAt}
	}
	if mem.reviving || (mem.inFlight > 0 && !mem.wedged(mono)) {
		// Still working (or a pass is running, whose own mark governs): push ahead.
		rec.ArmedAt = ms + KeepaliveLead.Milliseconds()
		return ActionBusyRearmed, rec, mem
	}
	if mem.passPending && mem.inFlight == 0 {
		if mono.Sub(mem.revivedAt) < WedgedAfter {
			rec.ArmedAt = ms + KeepaliveLead.Milliseconds()
			return ActionAwaitingPass, rec, mem
		}
		// The revival's pass never came: nothing confirms the revival, so the backoff stands.
		mem.passPending, mem.sawClean = false, false
	}
	if mem.inFlight == 0 && mem.sawClean && !mem.sawFailure && !mem.owed {
		mem.sawClean = false
		return ActionCleanDisarm, KeepaliveRecord{Version: version}, mem
	}
	if rec.Revivals > 0 {
		if next := rec.LastRevivalAt + RevivalBackoff(rec.Revivals).Milliseconds(); ms < next {
			rec.ArmedAt = next
			return ActionBackoffWait, rec, mem
		}
	}
	rec.Revivals++
	rec.LastRevivalAt = ms
	rec.ArmedAt = ms + RevivalBackoff(rec.Revivals).Milliseconds()
	mem.sawClean, mem.sawFailure, mem.reviving, mem.owed = false, false, true, false
	mem.epoch++
	mem.passPending = true
	return ActionRevive, rec, mem
}

// afterRevival is the policy once the revival pass ended (pure). A pass that appended its fact is
// settled work: the alarm comes back to the lead for a confirmation fire, which resets the budget
// once the fact's delivery settled cleanly (passPending) and the window stays quiet; a wedged
// window keeps the backoff instead. A failed pass keeps the backoff armed by the mark. mono is
// now's itx.Monotonic reading (see onFire).
func afterRevival(rec KeepaliveRecord, mem keepaliveMemory, now, mono time.Time, passErr error) (AlarmAction, KeepaliveRecord, keepaliveMemory) {
	mem.reviving = false
	if passErr != nil {
		mem.sawFailure, mem.passPending = true, false // no fact: no pass to wait for
		return ActionReviveFailed, rec, mem
	}
	mem.sawClean = true
	mem.revivedAt = mono
	if !mem.wedged(mono) {
		rec.ArmedAt = min(rec.ArmedAt, now.UnixMilli()+KeepaliveLead.Milliseconds())
	}
	return ActionRevived, rec, mem
}

// onTrack is the policy when work starts (pure): the alarm moves to the lead ahead of it, never
// later, and not while a revival pass runs or a crash loop backs off (revivals not yet confirmed
// clean): then the alarm is the breaker's. The work a revival brings (its redelivery) would
// otherwise pull the alarm back to the lead in every incarnation a poison takes down, and the
// poison would run every lead interval forever.
func onTrack(rec KeepaliveRecord, mem keepaliveMemory, now time.Time, version string) (KeepaliveRecord, keepaliveMemory) {
	mem.inFlight++
	if mem.reviving {
		return rec, mem
	}
	if rec.Version != version {
		rec = KeepaliveRecord{Version: version, ArmedAt: rec.ArmedAt}
	}
	if rec.Revivals > 0 && rec.ArmedAt != 0 {
		return rec, mem
	}
	at := now.UnixMilli() + KeepaliveLead.Milliseconds()
	if rec.ArmedAt == 0 || rec.ArmedAt > at {
		rec.ArmedAt = at
	}
	return rec, mem
}

// onSettle is the policy when tracked work ends (pure); epoch is the memory's epoch when the
// work was tracked. The caller updates oldest.
func onSettle(mem keepaliveMemory, err error, epoch uint64) keepaliveMemory {
	mem.inFlight--
	if epoch == mem.epoch {
		mem.passPending = false
	}
	if err != nil {
		mem.sawFailure = true
	} else {
		mem.sawClean = true
	}
	return mem
}
