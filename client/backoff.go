package client

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Backoff paces the reconnection attempts of a long-lived client (Follow, a remote processor
// host, itx's tail and watch): the waits double from min up to max, each jittered by ±50% so
// clients that lost the same itxd do not all come back at once, and start over from min after
// an attempt that stayed up longer than max (it was connected for a while: a fresh outage).
// It is not safe for concurrent use.
type Backoff struct {
	b   backoff.ExponentialBackOff
	max time.Duration
}

// NewBackoff returns a Backoff from lo to hi (hi below lo is taken as lo).
func NewBackoff(lo, hi time.Duration) *Backoff {
	hi = max(lo, hi)
	b := &Backoff{max: hi, b: backoff.ExponentialBackOff{
		InitialInterval: lo, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: hi}}
	b.b.Reset()
	return b
}

// Next is the wait before the next attempt, after one that lasted ranFor.
func (b *Backoff) Next(ranFor time.Duration) time.Duration {
	if ranFor > b.max {
		b.b.Reset()
	}
	return b.b.NextBackOff()
}

// Sleep waits d, or until ctx ends, and then returns ctx's error.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
