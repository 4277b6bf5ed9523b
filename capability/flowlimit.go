package capability

import (
	"context"

	"capnproto.org/go/capnp/v3/flowcontrol"
	"golang.org/x/sync/semaphore"
)

// pushFlowLimit bounds the bytes the server has in flight toward one capability a client handed
// it (an EventSink, a LiveSubscriber, a mounted Receiver, a processor host): go-capnp applies
// no backpressure of its own. SetPushFlowLimit sets it.
var pushFlowLimit int64 = DefaultPushFlowLimit

// DefaultPushFlowLimit is the default of SetPushFlowLimit.
const DefaultPushFlowLimit = 4 << 20

// SetPushFlowLimit sets, process-wide, the bytes in flight toward one capability a client handed
// itxd (itxd --rpc-max-push-bytes; 0: DefaultPushFlowLimit); a message larger than that waits
// until nothing else is in flight toward it and goes alone. Call it before serving.
func SetPushFlowLimit(n int64) {
	if n <= 0 {
		n = DefaultPushFlowLimit
	}
	pushFlowLimit = n
}

// newPushLimiter is a fixed flow limiter of pushFlowLimit bytes, as go-capnp's, except that a
// message larger than the whole allowance (a connection's batch may be up to 8 MiB plus an event)
// waits until nothing else is in flight toward that capability and then goes alone (go-capnp's
// fixed limiter panics on it instead, in the sending goroutine, which ended itxd), and that a
// sender that must not wait can reserve room first (tryReserve).
func newPushLimiter() *pushLimiter {
	return &pushLimiter{sem: semaphore.NewWeighted(pushFlowLimit), max: pushFlowLimit}
}

var _ flowcontrol.FlowLimiter = (*pushLimiter)(nil)

type pushLimiter struct {
	sem *semaphore.Weighted
	max int64
}

// reservation is room taken by tryReserve, carried in the call's context to StartMessage.
type reservation struct {
	l *pushLimiter
	n int64
}

type reservationKey struct{}

// tryReserve takes room for a message of about size bytes without waiting; ok is false when
// there is none. The returned context is for the one call that uses the room: go-capnp asks the
// limiter after sending it, and the limiter then waits for nothing.
func (l *pushLimiter) tryReserve(ctx context.Context, size int) (context.Context, bool) {
	n := min(int64(size), l.max)
	if !l.sem.TryAcquire(n) {
		return ctx, false
	}
	return context.WithValue(ctx, reservationKey{}, &reservation{l: l, n: n}), true
}

func (l *pushLimiter) StartMessage(ctx context.Context, size uint64) (func(), error) {
	if r, ok := ctx.Value(reservationKey{}).(*reservation); ok && r.l == l {
		return func() { l.sem.Release(r.n) }, nil
	}
	n := min(int64(size), l.max)
	if err := l.sem.Acquire(ctx, n); err != nil {
		return nil, err
	}
	return func() { l.sem.Release(n) }, nil
}

func (l *pushLimiter) Release() {}
