package capability

import (
	"context"

	"capnproto.org/go/capnp/v3/flowcontrol"
)

// pushFlowLimit bounds the bytes the server has in flight toward one capability a client handed
// it (an EventSink, a LiveSubscriber, a mounted Receiver, a processor host): go-capnp applies
// no backpressure of its own.
const pushFlowLimit = 4 << 20

// newPushLimiter is go-capnp's fixed flow limiter of pushFlowLimit bytes, except that a message
// larger than the whole allowance (a connection's batch may be up to 8 MiB plus an event)
// waits until nothing else is in flight toward that capability and then goes alone: the fixed
// limiter panics on it instead, in the sending goroutine, which ended itxd.
func newPushLimiter() flowcontrol.FlowLimiter {
	return clampedLimiter{inner: flowcontrol.NewFixedLimiter(pushFlowLimit), max: pushFlowLimit}
}

type clampedLimiter struct {
	inner flowcontrol.FlowLimiter
	max   uint64
}

func (l clampedLimiter) StartMessage(ctx context.Context, size uint64) (func(), error) {
	return l.inner.StartMessage(ctx, min(size, l.max))
}

func (l clampedLimiter) Release() { l.inner.Release() }
