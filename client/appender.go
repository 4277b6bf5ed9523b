package client

import (
	"context"
	"sync"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
)

// Appender keeps up to a bound of append calls in flight on one stream capability, so a single
// producer shares group commits instead of paying a round trip and an fsync per call. Calls on
// one capability reach itxd in the order they were sent and commit in that order, so events
// appended through one Appender land in the order of its Append calls.
//
// A failed call does not stop the ones sent after it: they may commit. A producer that must
// not leave a gap sets idempotency keys, and after a failure sends again from the failed call
// on: the calls that did commit come back as duplicates with their original offsets.
type Appender struct {
	s     schema.Stream
	slots chan struct{} // one per unanswered call, given back once its answer is recorded

	mu    sync.Mutex
	first error // the first failure since the last Flush
}

// NewAppender returns an Appender over s with at most maxInFlight calls unanswered (at least 1).
// itxd reads at most 128 calls per connection before it stops reading (--rpc-max-calls): more
// in flight only queue in the socket.
func NewAppender(s schema.Stream, maxInFlight int) *Appender {
	return &Appender{s: s, slots: make(chan struct{}, max(1, maxInFlight))}
}

// AppendFuture is one append call's answer, once it arrives.
type AppendFuture struct {
	done chan struct{}
	res  itx.AppendResult
	err  error
}

// Done is closed when the answer has arrived.
func (f *AppendFuture) Done() <-chan struct{} { return f.done }

// Wait returns the call's result once its group commit is durable, or its failure. A ctx that
// ends first gives up the wait only (code cancelled): the append may still commit, and Done
// tells when its answer came.
func (f *AppendFuture) Wait(ctx context.Context) (itx.AppendResult, error) {
	select {
	case <-f.done:
		return f.res, f.err
	case <-ctx.Done():
		return itx.AppendResult{}, cancelled(ctx, "stopped waiting: the append may still commit")
	}
}

// Append sends one atomic append, waiting first for a free slot when maxInFlight calls are
// unanswered, and returns its future without waiting for the answer. ctx bounds the wait for a
// slot, and gives the call its values: once sent, the call is not cancelled when ctx ends, and
// holds its slot until itxd answers it or the connection is lost. itxd queues an append as it
// arrives and commits it whatever becomes of the caller, so a call cancelled would still be
// in flight there, past the bound, and its future would say cancelled of an append that
// committed; the future says what became of it. An append itxd would refuse as too large is
// refused here, before it is sent (as Append does).
func (a *Appender) Append(ctx context.Context, events []itx.EventInput, opts itx.AppendOptions) (*AppendFuture, error) {
	if err := checkAppend(events, opts); err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		// Not sent: a free slot must not win the select below over an ended ctx.
		return nil, cancelled(ctx, "append not sent")
	}
	select {
	case a.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, cancelled(ctx, "append not sent")
	}
	f := &AppendFuture{done: make(chan struct{})}
	// Not cancelled with ctx: the slot is given back only once itxd answered (see above).
	call := lasting(ctx)
	fut, release := sendAppend(call, a.s, events, opts)
	go func() {
		f.res, f.err = awaitAppend(call, fut)
		release()
		if f.err != nil {
			a.mu.Lock()
			if a.first == nil {
				a.first = f.err
			}
			a.mu.Unlock()
		}
		close(f.done)
		<-a.slots
	}()
	return f, nil
}

// Flush waits until every call sent before it is answered (it takes every slot, which each call
// holds until its answer is recorded) and returns the first failure among the calls answered
// since the last Flush (nil: all of them committed).
func (a *Appender) Flush(ctx context.Context) error {
	held := 0
	defer func() {
		for ; held > 0; held-- {
			<-a.slots
		}
	}()
	for held < cap(a.slots) {
		select {
		case a.slots <- struct{}{}:
			held++
		case <-ctx.Done():
			return cancelled(ctx, "flush")
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	err := a.first
	a.first = nil
	return err
}
