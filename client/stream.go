package client

import (
	"context"
	"errors"
	"math"
	"net"
	"regexp"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/exc"
	"capnproto.org/go/capnp/v3/rpc"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/wire"
)

// Stream returns project.streams().get(path) at once, without waiting for an answer: the two
// calls are pipelined, and so is whatever is called on the stream before they are answered (a
// Login, Stream and Append cost one round trip). A path that cannot be opened fails the calls
// made on it. Release it when done.
//
// go-capnp deadlocks if a pipelined accessor is called twice on one unresolved future, so each
// accessor here is called exactly once and its result kept.
func Stream(ctx context.Context, project schema.Project, path string) schema.Stream {
	ctx = lasting(ctx)
	sf, releaseStreams := project.Streams(ctx, nil)
	streams := sf.Streams()
	gf, releaseGet := streams.Get(ctx, func(p schema.Streams_get_Params) error { return p.SetPath(path) })
	return keepAnswers(gf.Stream().AddRef(), releaseGet, releaseStreams)
}

// Streams returns project.streams() at once, pipelined (see Stream): the capability that
// ListStreamsPage, ListStreamsIn, DiskUsagePage and DeleteStreamIn take. Release it when done.
func Streams(ctx context.Context, project schema.Project) schema.Streams {
	fut, release := project.Streams(lasting(ctx), nil)
	return keepAnswers(fut.Streams().AddRef(), release)
}

// lasting is the context the calls that make a capability (Login, Stream, Subscriptions, ...)
// are sent under: ctx's values without its end. What they return is used until released, and
// go-capnp breaks a pipelined capability whose call's context ends before the answer came: a
// setup under a timeout with a deferred cancel, returning the project or stream it made, left
// them failing every call ("returned no capabilities to pipeline on", "Gateway.login: ...
// context canceled"). Nothing waits on these calls: the calls made on what they return wait,
// each under its own ctx.
func lasting(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

// keepAnswers ties the answers of the calls that made c (a reference of the caller's own, taken
// with AddRef) to c, and returns c: they are released when c is, once answered, off the
// releasing goroutine.
// The helpers that return a capability do this, so they return at once and calls made on what
// they return are pipelined behind theirs.
//
// Released any earlier, an answer's results would be freed while a call on c that set out
// before c learnt its resolution could still read them (go-capnp's pipelined client reads the
// capability out of the answer's results): a panic under load. Never released, an answer holds
// the capability its results carry, exported by itxd however often the caller releases c.
// go-capnp's release of an answer waits for it; a lost connection answers every call.
func keepAnswers[C ~capnp.ClientKind](c C, releases ...func()) C {
	release := func() {
		go func() {
			for _, release := range releases {
				release()
			}
		}()
	}
	if capnp.Client(c).AttachReleaser(release) {
		release() // c was released already
	}
	return c
}

// Append appends events atomically and returns once they are durable.
func Append(ctx context.Context, s schema.Stream, events []itx.EventInput, opts itx.AppendOptions) (itx.AppendResult, error) {
	if err := checkAppend(events, opts); err != nil {
		return itx.AppendResult{}, err
	}
	if ctx.Err() != nil {
		// Said so: given up after sending, the append may have committed.
		return itx.AppendResult{}, cancelled(ctx, "append not sent")
	}
	fut, release := sendAppend(ctx, s, events, opts)
	defer ReleaseAfter(ctx, release)
	return awaitAppend(ctx, fut)
}

// CheckAppendSize is checkAppendSize for callers building their own append-like calls (a remote
// processor's AppendTo).
func CheckAppendSize(events []itx.EventInput) error { return checkAppendSize(events) }

// checkAppendSize refuses, before anything is sent, an append itxd would refuse as too large
// (itx.MaxAppendEvents, itx.MaxAppendBytes, measured as itxd measures them, after
// normalizing): refused here, it costs no round trip, and one far above the bounds can never
// reach itxd's bound on one message (--rpc-max-message-bytes), which ends the whole RPC
// connection instead of failing the call.
func checkAppendSize(events []itx.EventInput) error {
	if len(events) > itx.MaxAppendEvents {
		return itx.ErrAppendTooManyEvents(len(events))
	}
	total := 0
	for i := range events {
		total += events[i].Size()
	}
	if total <= itx.MaxAppendBytes {
		return nil // the common case (normalizing shrinks an event, or adds the 2 bytes of an
		// absent payload's {}: itxd answers those few itself)
	}
	total = 0
	for i := range events {
		e := events[i] // a copy: normalizing compacts its payload and metadata
		if e.Normalize() != nil {
			return nil // itxd names what is wrong with it
		}
		total += e.Size()
	}
	if total > itx.MaxAppendBytes {
		return itx.ErrAppendTooLarge(total)
	}
	return nil
}

// sendAppend sends an append call without waiting for its answer: calls on one capability reach
// itxd in the order they are sent, and itxd commits them in that order.
func sendAppend(ctx context.Context, s schema.Stream, events []itx.EventInput, opts itx.AppendOptions) (schema.Stream_append_Results_Future, func()) {
	return s.Append(ctx, func(p schema.Stream_append_Params) error {
		if err := wire.SetEventInputs(p.NewEvents, events); err != nil {
			return err
		}
		if opts.Conditional {
			o, err := p.NewOptions()
			if err != nil {
				return err
			}
			wire.SetAppendOptions(o, opts)
		}
		return nil
	})
}

func awaitAppend(ctx context.Context, fut schema.Stream_append_Results_Future) (itx.AppendResult, error) {
	res, err := Await(ctx, fut)
	if err != nil {
		return itx.AppendResult{}, err
	}
	r, err := res.Result()
	if err != nil {
		return itx.AppendResult{}, err
	}
	return wire.AppendResultFromSchema(r)
}

// offsetArg refuses a negative offset before it is sent: on the wire (unsigned) it would reach
// itxd as 18446744073709551615 and be refused under that name, or be taken for 0.
func offsetArg(name string, offset int64) error {
	if offset < 0 {
		return itx.Errorf(itx.EInvalid, "%s must not be negative (got %d)", name, offset)
	}
	return nil
}

// queryArg refuses a query's negative offsets (see offsetArg) and a negative limit (0 is the
// default page; on the wire a negative one was taken for 0 without a word).
func queryArg(q itx.Query) error {
	if err := offsetArg("Query.After", q.After); err != nil {
		return err
	}
	if q.Limit < 0 {
		return itx.Errorf(itx.EInvalid, "Query.Limit must not be negative (got %d; 0: the default page)", q.Limit)
	}
	return offsetArg("Query.Before", q.Before)
}

// checkAppend is checkAppendSize plus a conditional append's expected head, refused when
// negative before it is sent (see offsetArg): itxd would name it 18446744073709551615.
func checkAppend(events []itx.EventInput, opts itx.AppendOptions) error {
	if opts.Conditional {
		if err := offsetArg("AppendOptions.ExpectedHeadOffset", opts.ExpectedHeadOffset); err != nil {
			return err
		}
	}
	return checkAppendSize(events)
}

// GetEventPage reads one page.
func GetEventPage(ctx context.Context, s schema.Stream, query itx.Query) (itx.Page, error) {
	if err := queryArg(query); err != nil {
		return itx.Page{}, err
	}
	if err := NotSent(ctx, "GetEventPage"); err != nil {
		return itx.Page{}, err
	}
	fut, release := s.GetEventPage(ctx, func(p schema.Stream_getEventPage_Params) error {
		q, err := p.NewQuery()
		if err != nil {
			return err
		}
		return wire.SetQuery(q, query)
	})
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return itx.Page{}, err
	}
	pg, err := res.Page()
	if err != nil {
		return itx.Page{}, err
	}
	return wire.PageFromSchema(pg)
}

// GetEvents reads one page of events without the envelope: at most itx.MaxPageLimit whatever
// query.Limit asks (itxd caps it), and a short page is not the end. To page, use GetEventPage,
// whose NextAfter and StreamMaxOffset say where to go on.
func GetEvents(ctx context.Context, s schema.Stream, query itx.Query) ([]itx.Event, error) {
	if err := queryArg(query); err != nil {
		return nil, err
	}
	if err := NotSent(ctx, "GetEvents"); err != nil {
		return nil, err
	}
	fut, release := s.GetEvents(ctx, func(p schema.Stream_getEvents_Params) error {
		q, err := p.NewQuery()
		if err != nil {
			return err
		}
		return wire.SetQuery(q, query)
	})
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return nil, err
	}
	list, err := res.Events()
	if err != nil {
		return nil, err
	}
	return wire.EventsFromSchema(list)
}

// ReadAll pages through every event after `after` up to the head at the time of the last page.
// The pages are of one stream: when the stream is deleted between two (and perhaps created
// again, its offsets starting over), ReadAll returns the events read before with notFound.
func ReadAll(ctx context.Context, s schema.Stream, query itx.Query) ([]itx.Event, error) {
	var all []itx.Event
	streamID, first := "", true
	for {
		page, err := GetEventPage(ctx, s, query)
		if err != nil {
			return all, err
		}
		if first {
			streamID, first = page.StreamID, false
		} else if page.StreamID != streamID {
			now := "no stream is there now"
			if page.StreamID != "" {
				now = "its path holds another stream now (id " + page.StreamID + ")"
			}
			return all, itx.Errorf(itx.ENotFound, "the stream read (id %s) was deleted after offset %d: %s", streamID, query.After, now)
		}
		all = append(all, page.Events...)
		if page.NextAfter >= page.StreamMaxOffset || page.NextAfter == query.After {
			return all, nil
		}
		query.After = page.NextAfter
	}
}

// barrierTimeoutMs is a barrier's timeout as the wire carries it (0: the server's default). One
// the server would refuse is refused here, before its milliseconds wrap in 32 bits into another
// timeout; a positive one under a millisecond waits one.
func barrierTimeoutMs(timeout time.Duration) (uint32, error) {
	switch {
	case timeout < 0:
		return 0, itx.Errorf(itx.EInvalid, "timeout must not be negative")
	case timeout > itx.MaxWaitTimeout:
		return 0, itx.Errorf(itx.EInvalid, "timeout must be at most %s", itx.MaxWaitTimeout)
	case timeout > 0 && timeout < time.Millisecond:
		return 1, nil
	}
	return uint32(timeout.Milliseconds()), nil
}

// WaitForEvent waits for the first event after `after` matching pred; a zero timeout is the
// server's default (20 s).
func WaitForEvent(ctx context.Context, s schema.Stream, pred itx.Predicate, after int64, timeout time.Duration) (itx.Event, error) {
	ms, err := barrierTimeoutMs(timeout)
	if err == nil {
		err = offsetArg("after", after)
	}
	if err != nil {
		return itx.Event{}, err
	}
	if err := NotSent(ctx, "WaitForEvent"); err != nil {
		return itx.Event{}, err
	}
	fut, release := s.WaitForEvent(ctx, func(p schema.Stream_waitForEvent_Params) error {
		p.SetAfter(uint64(after))
		p.SetTimeoutMs(ms)
		pr, err := p.NewPredicate()
		if err != nil {
			return err
		}
		return wire.SetPredicate(pr, pred)
	})
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return itx.Event{}, err
	}
	e, err := res.Event()
	if err != nil {
		return itx.Event{}, err
	}
	return wire.EventFromSchema(e)
}

// Describe describes a stream.
func Describe(ctx context.Context, s schema.Stream) (itx.StreamInfo, error) {
	if err := NotSent(ctx, "Describe"); err != nil {
		return itx.StreamInfo{}, err
	}
	fut, release := s.Describe(ctx, nil)
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return itx.StreamInfo{}, err
	}
	i, err := res.Info()
	if err != nil {
		return itx.StreamInfo{}, err
	}
	return wire.StreamInfoFromSchema(i)
}

// ListStreams lists a project's streams under prefix.
func ListStreams(ctx context.Context, project schema.Project, prefix string) ([]itx.StreamInfo, error) {
	sf, releaseStreams := project.Streams(ctx, nil)
	defer releaseStreams()
	return ListStreamsIn(ctx, sf.Streams(), prefix)
}

// DeletedStream is what DeleteStream removed: the stream's id and its head when deleted.
type DeletedStream struct {
	StreamID   string
	HeadOffset int64
	// Unread: the stream's database could not be opened or read (lost or damaged), and the
	// forced delete took it unread; HeadOffset is the head its directory entry last recorded.
	Unread bool
}

// DeleteStream deletes the stream at path for good (the admin right): its events,
// subscriptions, readers and scheduled appends. Refused with failedPrecondition while it has
// subscriptions, registered readers or open connections, unless force; notFound when there is
// no stream at path. The next append to path creates a new stream from offset 1. A stream whose
// database cannot be read (lost or damaged) is refused with failedPrecondition unless force,
// and deleted unread with it.
func DeleteStream(ctx context.Context, project schema.Project, path string, force bool) (DeletedStream, error) {
	sf, releaseStreams := project.Streams(ctx, nil)
	defer releaseStreams()
	return DeleteStreamIn(ctx, sf.Streams(), path, force)
}

// DeleteStreamIn is DeleteStream on a Streams capability already at hand.
func DeleteStreamIn(ctx context.Context, streams schema.Streams, path string, force bool) (DeletedStream, error) {
	if err := NotSent(ctx, "DeleteStream"); err != nil {
		return DeletedStream{}, err
	}
	fut, release := streams.Remove(ctx, func(p schema.Streams_remove_Params) error {
		p.SetForce(force)
		return p.SetPath(path)
	})
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return DeletedStream{}, err
	}
	id, err := res.StreamId()
	if err != nil {
		return DeletedStream{}, err
	}
	return DeletedStream{StreamID: id, HeadOffset: int64(res.HeadOffset()), Unread: res.Unread()}, nil
}

// ListStreamsIn lists every stream of a Streams capability already at hand under prefix, page
// by page.
func ListStreamsIn(ctx context.Context, streams schema.Streams, prefix string) ([]itx.StreamInfo, error) {
	var all []itx.StreamInfo
	for after := ""; ; {
		page, next, err := ListStreamsPage(ctx, streams, prefix, after, 0)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if next == "" {
			return all, nil
		}
		after = next
	}
}

// DiskUsage lists every stream under prefix with the size of its files on disk, read now (the
// read right, as ListStreams).
func DiskUsage(ctx context.Context, project schema.Project, prefix string) ([]itx.StreamDiskUsage, error) {
	sf, releaseStreams := project.Streams(ctx, nil)
	defer releaseStreams()
	return DiskUsageIn(ctx, sf.Streams(), prefix)
}

// DiskUsageIn is DiskUsage on a Streams capability at hand.
func DiskUsageIn(ctx context.Context, streams schema.Streams, prefix string) ([]itx.StreamDiskUsage, error) {
	var all []itx.StreamDiskUsage
	for after := ""; ; {
		page, next, err := DiskUsagePage(ctx, streams, prefix, after)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if next == "" {
			return all, nil
		}
		after = next
	}
}

// DiskUsagePage is one page of DiskUsageIn, after the path after (exclusive); next is where the
// following page starts, empty on the last page.
func DiskUsagePage(ctx context.Context, streams schema.Streams, prefix, after string) (page []itx.StreamDiskUsage, next string, err error) {
	if err := NotSent(ctx, "DiskUsage"); err != nil {
		return nil, "", err
	}
	fut, release := streams.DiskUsage(ctx, func(p schema.Streams_diskUsage_Params) error {
		if err := p.SetPrefix(prefix); err != nil {
			return err
		}
		return p.SetAfter(after)
	})
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return nil, "", err
	}
	list, err := res.Streams()
	if err != nil {
		return nil, "", err
	}
	if page, err = fromList(list, wire.StreamDiskUsageFromSchema); err != nil {
		return nil, "", err
	}
	next, err = res.NextAfter()
	return page, next, err
}

// ListStreamsPage lists one page of streams under prefix, after the path after (exclusive),
// at most limit (0: the server's default). next is where the following page starts, empty on
// the last page.
func ListStreamsPage(ctx context.Context, streams schema.Streams, prefix, after string, limit int) (page []itx.StreamInfo, next string, err error) {
	if err := NotSent(ctx, "ListStreams"); err != nil {
		return nil, "", err
	}
	fut, release := streams.List(ctx, func(p schema.Streams_list_Params) error {
		if err := p.SetPrefix(prefix); err != nil {
			return err
		}
		p.SetLimit(limitArg(limit))
		return p.SetAfter(after)
	})
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return nil, "", err
	}
	list, err := res.Streams()
	if err != nil {
		return nil, "", err
	}
	if page, err = fromList(list, wire.StreamInfoFromSchema); err != nil {
		return nil, "", err
	}
	next, err = res.NextAfter()
	return page, next, err
}

// fromList converts a list read from a result, stopping at its first element that does not
// convert.
func fromList[T any, S ~capnp.StructKind](list capnp.StructList[S], conv func(S) (T, error)) ([]T, error) {
	out := make([]T, list.Len())
	for i := range out {
		var err error
		if out[i], err = conv(list.At(i)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ReleaseAfter releases a call's answer; when ctx ended first, off this goroutine: go-capnp's
// release waits for the answer, which a closing connection gives only once its callers let go.
func ReleaseAfter(ctx context.Context, release func()) {
	if ctx.Err() != nil {
		go release()
		return
	}
	release()
}

// Await waits for a call's answer, or for ctx to end: go-capnp's Struct() does not watch the
// context, and a caller that must give up (a host shutting down mid-call) would wait forever.
// A call given up because ctx ended fails with code cancelled (itx.ErrorCode), saying it may or
// may not have taken effect (even when ctx had ended before the call: check NotSent before
// sending to say it was not sent), and errors.Is(err, context.Canceled) or
// context.DeadlineExceeded holds. A call whose connection
// was lost before its answer fails with code disconnected (itx.EDisconnected: it may or may not
// have taken effect), and capnp.IsDisconnected holds. Pair it with ReleaseAfter.
func Await[T any](ctx context.Context, fut interface {
	Done() <-chan struct{}
	Struct() (T, error)
}) (T, error) {
	select {
	case <-fut.Done():
	case <-ctx.Done():
		var zero T
		return zero, unanswered(ctx)
	}
	res, err := fut.Struct()
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) && itx.ErrorCode(err) == itx.EInternal {
		// go-capnp gave the call up for ctx itself: its error has no code.
		return res, unanswered(ctx)
	}
	return res, disconnected(err)
}

// callDisconnected is a call whose RPC connection was lost before its answer: code
// disconnected, and go-capnp's exception for errors.As.
type callDisconnected struct {
	coded *itx.Error
	cause error
}

func (e *callDisconnected) Error() string   { return e.coded.Error() }
func (e *callDisconnected) Unwrap() []error { return []error{e.coded, e.cause} }

// rpcPrefixes are what go-capnp puts before a lost connection's reason: the method of each
// pipelined call it crossed ("itx.capnp:Readers.register: itx.capnp:Stream.readers: "), "rpc: ".
// go-capnp's "rpc: " also comes inside the reason, where it wraps one of its own errors ("rpc:
// send message: rpc: connection closed"): every one goes.
var rpcPrefixes = regexp.MustCompile(`^([\w.]+\.capnp:\w+\.\w+: |rpc: )*|\brpc: `)

// disconnected gives err the code itx.EDisconnected when it is go-capnp's disconnected
// exception without a code of its own, which is what a call on a lost connection fails with
// (in flight then, or made after). go-capnp's own words ("rpc: connection closed") say
// nothing of what became of the call, and without a code it read as internal. A disconnected
// exception naming a code came from itxd (a Receiver or host it called went away): kept.
//
// A call whose message could not be sent because the socket broke or the connection closed
// meanwhile ("rpc: send message: ... writev: broken pipe", "rpc: send message: rpc:
// connection closed") fails with go-capnp's type failed, not disconnected; the network error,
// or rpc.ErrConnClosed, in its chain tells it.
func disconnected(err error) error {
	if err == nil || itx.Coded(err) {
		return err
	}
	var why string
	if opErr, ok := errors.AsType[*net.OpError](err); ok {
		why = opErr.Err.Error()
	} else if capnp.IsDisconnected(err) || errors.Is(err, rpc.ErrConnClosed) {
		why = rpcPrefixes.ReplaceAllString(err.Error(), "")
	} else {
		return err
	}
	// Itself a disconnected exception: capnp.IsDisconnected looks at err, not at its chain.
	return &exc.Exception{Type: exc.Disconnected, Cause: &callDisconnected{
		coded: itx.Errorf(itx.EDisconnected, "the connection to itxd was lost before the call was answered (%s): it may or may not have taken effect", why),
		cause: err,
	}}
}

// callCancelled is a call given up because its context ended: code cancelled, and its
// context's error (context.Canceled, context.DeadlineExceeded) for errors.Is.
type callCancelled struct {
	coded *itx.Error
	cause error
}

func (e *callCancelled) Error() string   { return e.coded.Error() }
func (e *callCancelled) Unwrap() []error { return []error{e.coded, e.cause} }

// unanswered is the error of a call sent and given up because ctx ended before its answer:
// itxd may have run it all the same (an append it queued commits), so a caller that retries
// one that must happen once sends it with an idempotency key.
func unanswered(ctx context.Context) error {
	return &callCancelled{coded: itx.Errorf(itx.ECancelled, "%v before the answer came: the call may or may not have taken effect", ctx.Err()), cause: ctx.Err()}
}

// NotSent is, code cancelled, the error of a call not made because ctx had ended before it
// (nil while ctx lives): the helpers check before they send, so a call refused so certainly did
// not take effect, and may be made again under a live context as it is. (go-capnp would not send
// it either, but the call would fail as one given up after sending: it may or may not have taken
// effect.) call names the call: "Describe not sent: context canceled".
func NotSent(ctx context.Context, call string) error {
	if ctx.Err() == nil {
		return nil
	}
	return cancelled(ctx, call+" not sent")
}

// cancelled is the error of what ctx's end gave up (what, when set, says what).
func cancelled(ctx context.Context, what string) error {
	msg := ctx.Err().Error()
	if what != "" {
		msg = what + ": " + msg
	}
	return &callCancelled{coded: itx.Errorf(itx.ECancelled, "%s", msg), cause: ctx.Err()}
}

// Schedule asks the stream to append in at dueAt (a time past means at once), exactly once and
// surviving restarts: a durable timer. in.IdempotencyKey names it; scheduling the key again
// moves it. When the key is already in the log nothing is scheduled and appended is its offset.
func Schedule(ctx context.Context, s schema.Stream, in itx.EventInput, dueAt time.Time) (due time.Time, appended int64, err error) {
	if err := NotSent(ctx, "Schedule"); err != nil {
		return time.Time{}, 0, err
	}
	fut, release := s.Schedule(ctx, func(p schema.Stream_schedule_Params) error {
		ev, err := p.NewEvent()
		if err != nil {
			return err
		}
		p.SetDueAt(dueAt.UnixMilli())
		return wire.SetEventInput(ev, &in)
	})
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return time.Time{}, 0, err
	}
	return time.UnixMilli(res.DueAt()), int64(res.AppendedOffset()), nil
}

// CancelScheduled drops the scheduled append named key and reports whether there was one.
func CancelScheduled(ctx context.Context, s schema.Stream, key string) (bool, error) {
	if err := NotSent(ctx, "CancelScheduled"); err != nil {
		return false, err
	}
	fut, release := s.CancelScheduled(ctx, func(p schema.Stream_cancelScheduled_Params) error { return p.SetKey(key) })
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return false, err
	}
	return res.Cancelled(), nil
}

// ListScheduled lists the stream's pending scheduled appends in due order.
func ListScheduled(ctx context.Context, s schema.Stream) ([]itx.ScheduledEvent, error) {
	if err := NotSent(ctx, "ListScheduled"); err != nil {
		return nil, err
	}
	fut, release := s.ListScheduled(ctx, nil)
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return nil, err
	}
	list, err := res.Scheduled()
	if err != nil {
		return nil, err
	}
	out := make([]itx.ScheduledEvent, list.Len())
	for i := range out {
		item := list.At(i)
		ev, err := item.Event()
		if err != nil {
			return nil, err
		}
		if out[i].Event, err = wire.EventInputFromSchema(ev); err != nil {
			return nil, err
		}
		out[i].DueAt = item.DueAt()
	}
	return out, nil
}

// TrimResult answers Trim: how far the stream is trimmed now, and the events this call deleted.
type TrimResult struct {
	TrimmedThrough int64
	Deleted        int64
}

// Trim deletes the stream's events through throughOffset for good (retention; the admin
// right), except its stream/* records, never past what every consumer holds (the lowest
// confirmed offset of its subscriptions, checkpoint of its registered readers and delivered
// offset of its open connections). Offsets are never reissued; reads pass the gap; the
// idempotency keys of deleted events are forgotten.
func Trim(ctx context.Context, s schema.Stream, throughOffset int64) (TrimResult, error) {
	return TrimWith(ctx, s, TrimOptions{ThroughOffset: throughOffset})
}

// TrimOptions bound what Trim deletes: events through ThroughOffset and/or created before
// CreatedBefore (zero: no such bound; at least one is needed).
type TrimOptions struct {
	ThroughOffset int64
	CreatedBefore time.Time
}

// TrimWith is Trim with a time bound as well: TrimWith(ctx, s, TrimOptions{CreatedBefore:
// time.Now().Add(-30 * 24 * time.Hour)}) keeps the last 30 days.
func TrimWith(ctx context.Context, s schema.Stream, o TrimOptions) (TrimResult, error) {
	if o.ThroughOffset < 0 {
		return TrimResult{}, itx.Errorf(itx.EInvalid, "throughOffset %d is negative", o.ThroughOffset)
	}
	var before int64
	if !o.CreatedBefore.IsZero() {
		if before = o.CreatedBefore.UnixMilli(); before <= 0 {
			return TrimResult{}, itx.Errorf(itx.EInvalid, "createdBefore %s is not after 1970", o.CreatedBefore)
		}
	}
	if err := NotSent(ctx, "TrimWith"); err != nil {
		return TrimResult{}, err
	}
	fut, release := s.Trim(ctx, func(p schema.Stream_trim_Params) error {
		p.SetThroughOffset(uint64(o.ThroughOffset))
		p.SetCreatedBefore(before)
		return nil
	})
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return TrimResult{}, err
	}
	return TrimResult{TrimmedThrough: int64(res.TrimmedThrough()), Deleted: int64(res.Deleted())}, nil
}

// Retention is a stream's own retention policy: the events created more than MaxAge ago, those
// more than MaxEvents offsets below the head, and the oldest ones while the events a trim could
// delete come to more than MaxBytes (type, payload, metadata and idempotency key) go (zero: no
// such bound; all zero clears it), never past what a consumer holds, as Trim.
type Retention struct {
	MaxAge    time.Duration
	MaxEvents int64
	MaxBytes  int64
}

// SetRetention stores the stream's retention policy and applies it at once (the admin right);
// the stream applies it again when it loads and at most once a minute while it is appended to.
func SetRetention(ctx context.Context, s schema.Stream, r Retention) error {
	if r.MaxAge < 0 || r.MaxEvents < 0 || r.MaxBytes < 0 {
		return itx.Errorf(itx.EInvalid, "retention: maxAge, maxEvents and maxBytes cannot be negative")
	}
	if err := NotSent(ctx, "SetRetention"); err != nil {
		return err
	}
	fut, release := s.SetRetention(ctx, func(p schema.Stream_setRetention_Params) error {
		p.SetMaxAgeMs(r.MaxAge.Milliseconds())
		p.SetMaxEvents(uint64(r.MaxEvents))
		p.SetMaxBytes(uint64(r.MaxBytes))
		return nil
	})
	defer ReleaseAfter(ctx, release)
	_, err := Await(ctx, fut)
	return err
}

// limitArg is a listing's limit on the wire: a negative one is 0 (the server's default page) and
// one past 32 bits the largest, which the server refuses, rather than wrapped to another limit.
func limitArg(limit int) uint32 { return uint32(min(max(limit, 0), math.MaxUint32)) }
