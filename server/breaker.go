package server

import "time"

// tokenBucket is a stream's circuit breaker: a runaway producer drains it and is refused with
// ERateLimited until it refills. It is owned by the actor goroutine; now is always passed in.
type tokenBucket struct {
	burst     float64
	perSecond float64
	tokens    float64
	last      time.Time
}

func newTokenBucket(burst, refillPerMinute int, now time.Time) *tokenBucket {
	return &tokenBucket{burst: float64(burst), perSecond: float64(refillPerMinute) / 60, tokens: float64(burst), last: now}
}

// take removes n tokens if that many are available after refilling up to now.
func (b *tokenBucket) take(n int, now time.Time) bool {
	if elapsed := now.Sub(b.last).Seconds(); elapsed > 0 {
		b.tokens = min(b.burst, b.tokens+elapsed*b.perSecond)
		b.last = now
	}
	if float64(n) > b.tokens {
		return false
	}
	b.tokens -= float64(n)
	return true
}
