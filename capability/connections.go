package capability

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"

	"capnproto.org/go/capnp/v3"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/wire"
	"github.com/rs/zerolog"
)

// --- connections -----------------------------------------------------------------------------

func (s *stream) OpenConnection(ctx context.Context, call schema.Stream_openConnection) error {
	o, err := call.Args().Options()
	if err != nil {
		return badArgs("options", err)
	}
	opts := server.ConnectionOptions{After: int64(o.After()), MaxDeliveryEvents: int(o.MaxDeliveryEvents()),
		MaxDeliveryBytes: int(o.MaxDeliveryBytes()), NoState: o.NoState(), IncludeEphemeral: o.IncludeEphemeral()}
	if opts.Key, err = o.Key(); err != nil {
		return badArgs("options.key", err)
	}
	if opts.OpenedBy, err = o.OpenedBy(); err != nil {
		return badArgs("options.openedBy", err)
	}
	if opts.ExpectedStreamID, err = o.ExpectedStreamId(); err != nil {
		return badArgs("options.expectedStreamId", err)
	}
	types, err := o.Types()
	if err != nil {
		return badArgs("options.types", err)
	}
	if opts.Types, err = wire.TextList(types, nil); err != nil {
		return badArgs("options.types", err)
	}
	if int64(o.After()) < 0 {
		return fail(itx.Errorf(itx.EInvalid, "after %d is out of range", o.After()))
	}
	// Counted against the login that opens it by the stream's actor, once the open is decided:
	// a replace under a key the login holds takes over that connection's place.
	opts.Opener = s.acc.session
	opts.NoHold = s.acc.rights&(rSubscribe|rAdmin) == 0
	if !call.Args().Sink().IsValid() {
		// Checked before anything is decided: an open that can never deliver must not replace
		// the connection open under its key.
		return fail(itx.Errorf(itx.EInvalid, "sink: an open connection needs an EventSink"))
	}
	// The argument is released when this method returns: keep our own reference.
	sinkCap := call.Args().Sink().AddRef()
	limiter := newPushLimiter()
	sinkCap.SetFlowLimiter(limiter)
	// Queued before the call queue is released: opens sent on one capability are decided in the
	// order sent (of two under one key, the later replaces the earlier).
	pending, err := s.srv.StartOpenConnection(ctx, s.ref, opts, &eventSink{client: sinkCap, limiter: limiter, acc: s.acc})
	if err != nil {
		sinkCap.Release()
		return fail(err)
	}
	call.Go()
	conn, err := pending.Wait(ctx)
	if err != nil {
		sinkCap.Release()
		return fail(err)
	}
	forget := func() {}
	if x := s.acc.session; x != nil {
		// The connection ends with the session that opened it (revoked or expired), even if
		// another login keeps the RPC connection. The end returns once the client has been
		// told: a revocation that leaves the RPC connection no valid login closes it next.
		forget = x.OnEnd(func() {
			conn.Close(server.CloseAccessEnded, "the token that opened it was revoked or expired")
			<-conn.Told()
		})
	}
	go func() { <-conn.Done(); forget() }()
	res, err := call.AllocResults()
	if err != nil {
		conn.Close(server.CloseConnectionLost, err.Error())
		return err
	}
	impl := &connection{c: conn}
	return res.SetConnection(schema.Connection(guarded(guardOf(s.srv), s.acc, schema.Connection_Methods(nil, impl), impl)))
}

// connection serves a server.Connection; losing the last reference to it (the client released
// it or its RPC session ended) closes it.
type connection struct{ c *server.Connection }

func (c *connection) Close(ctx context.Context, call schema.Connection_close) error {
	reason, err := call.Args().Reason()
	if err != nil {
		return badArgs("reason", err)
	}
	// Answered once the stream has let the connection go, so the client's next call (a
	// subscription under its key, a live view) sees it closed.
	return fail(c.c.CloseAndLeave(ctx, server.CloseByClient, reason))
}

func (c *connection) Ping(ctx context.Context, call schema.Connection_ping) error {
	call.Go() // it may wait for the sink's answers (server.PingSettleWait): close goes on meanwhile
	head, delivered, err := c.c.Ping(ctx)
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	res.SetHeadOffset(uint64(head))
	res.SetDeliveredOffset(uint64(delivered))
	return nil
}

func (c *connection) Key(ctx context.Context, call schema.Connection_key) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return res.SetKey(c.c.Key())
}

// Shutdown runs when the last reference is gone, including when the session died.
func (c *connection) Shutdown() {
	c.c.Close(server.CloseConnectionLost, "the client's reference to the connection is gone")
}

// eventSink adapts a client's EventSink capability to server.ConnectionSink.
type eventSink struct {
	client  schema.EventSink
	limiter *pushLimiter // client's
	acc     access       // the opening capability's: the events are read as it may read them
	once    sync.Once
}

// TryDeliver is Deliver for a caller that must not wait: it sends only if the bytes in flight
// toward the sink leave room for the batch.
func (k *eventSink) TryDeliver(ctx context.Context, b *itx.DeliveryBatch) (func() error, bool) {
	size := 256
	for i := range b.Events {
		e := &b.Events[i]
		size += len(e.Type) + len(e.Payload) + len(e.Metadata) + len(e.IdempotencyKey) + 128
	}
	ctx, ok := k.limiter.tryReserve(ctx, size)
	if !ok {
		return nil, false
	}
	return k.Deliver(ctx, b), true
}

func (k *eventSink) Deliver(ctx context.Context, b *itx.DeliveryBatch) func() error {
	if events := k.acc.redactEvents(b.Events); len(events) > 0 && &events[0] != &b.Events[0] {
		c := *b // the batch is the connection's own; only its events slice is replaced
		c.Events = events
		b = &c
	}
	fut, release := k.client.Deliver(ctx, func(p schema.EventSink_deliver_Params) error {
		batch, err := p.NewBatch()
		if err != nil {
			return err
		}
		return wire.SetDeliveryBatch(batch, b)
	})
	return func() error {
		defer release()
		_, err := fut.Struct()
		return sinkError(err)
	}
}

func (k *eventSink) State(ctx context.Context, f server.LiveFrame) error {
	fut, release := k.client.State(ctx, func(p schema.EventSink_state_Params) error {
		p.SetRevision(f.Revision)
		p.SetSnapshot(f.Snapshot)
		return p.SetJson(string(f.JSON))
	})
	defer release()
	_, err := fut.Struct()
	return sinkError(err)
}

// closeReasons maps the server's reasons onto the schema's enum and an error code.
var closeReasons = map[server.CloseReason]struct {
	why  schema.CloseReason
	code itx.Code
}{
	server.CloseByClient:            {schema.CloseReason_closedByClient, itx.ECancelled},
	server.CloseReplaced:            {schema.CloseReason_replaced, itx.EFailedPrecondition},
	server.CloseShuttingDown:        {schema.CloseReason_serverShuttingDown, itx.EUnavailable},
	server.CloseStreamRemoved:       {schema.CloseReason_streamRemoved, itx.ENotFound},
	server.CloseSlowConsumer:        {schema.CloseReason_slowConsumer, itx.EDeadlineExceeded},
	server.CloseDeliveryFailed:      {schema.CloseReason_deliveryFailed, itx.EInternal},
	server.CloseConnectionLost:      {schema.CloseReason_connectionLost, itx.EUnavailable},
	server.CloseAccessEnded:         {schema.CloseReason_accessEnded, itx.EUnauthenticated},
	server.CloseSubscriptionRemoved: {schema.CloseReason_subscriptionRemoved, itx.ENotFound},
}

// closedParams are the arguments of a closed call (an EventSink's, a LiveSubscriber's).
type closedParams interface {
	SetWhy(schema.CloseReason)
	NewReason() (schema.Error, error)
}

// setClosed fills a closed call's arguments: the reason to switch on, and an error whose code
// and message say the same for a human.
func setClosed(p closedParams, reason server.CloseReason, message string) error {
	r := closeReasons[reason]
	p.SetWhy(r.why)
	e, err := p.NewReason()
	if err != nil {
		return err
	}
	e.SetCode(schema.ErrorCodeFromString(string(r.code)))
	return e.SetMessage_(reason.Said(message))
}

func (k *eventSink) Closed(ctx context.Context, reason server.CloseReason, message string) {
	k.once.Do(func() {
		defer k.client.Release()
		// Also for connectionLost: a client that released the Connection capability but kept
		// its session hears it; on a session that died the call fails at once.
		fut, release := k.client.Closed(ctx, func(p schema.EventSink_closed_Params) error {
			return setClosed(p, reason, message)
		})
		defer release()
		_, _ = fut.Struct()
	})
}

// sinkError makes a client's failure matchable: a vanished client is capabilityOffline. An
// exception the client threw keeps its code, except capabilityOffline: a client that answers is
// there, so its exception is a refusal, not its session ending.
func sinkError(err error) error {
	switch {
	case err == nil:
		return nil
	case capnp.IsDisconnected(err):
		return itx.Errorf(itx.ECapabilityOffline, "the client is gone: %v", err)
	case strings.Contains(err.Error(), "itx."):
		if e := itx.AsError(err); e.Code != itx.ECapabilityOffline {
			return e
		}
	}
	return itx.Errorf(itx.EFailedPrecondition, "the client refused the batch: %v", err)
}

// --- readers ---------------------------------------------------------------------------------

func (s *stream) Readers(ctx context.Context, call schema.Stream_readers) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	impl := &readers{srv: s.srv, ref: s.ref, acc: s.acc}
	return res.SetReaders(schema.Readers(guarded(guardOf(s.srv), s.acc, schema.Readers_Methods(nil, impl), impl)))
}

type readers struct {
	srv *server.Server
	ref server.StreamRef
	acc access
}

// caller is who moves readers through this capability: its token, and whether it may move
// those another token registered (the admin right; never through readOnly).
func (r *readers) caller() server.ReaderCaller {
	var c server.ReaderCaller
	if r.acc.session != nil {
		c.TokenID, c.Principal = r.acc.session.Token.ID, r.acc.session.Token.Principal()
	}
	c.Admin = r.acc.rights&rAdmin != 0
	c.NoHold = r.acc.rights&(rSubscribe|rAdmin) == 0
	return c
}

func (r *readers) Register(ctx context.Context, call schema.Readers_register) error {
	name, err := call.Args().Name()
	if err != nil {
		return badArgs("name", err)
	}
	checkpoint := call.Args().Checkpoint()
	if int64(checkpoint) < 0 {
		return fail(itx.Errorf(itx.EInvalid, "checkpoint %d is out of range", checkpoint))
	}
	// Queued before the call queue is released: calls on one Readers apply in the order sent.
	pending, err := r.srv.StartRegisterReaderAs(ctx, r.caller(), r.ref, name, int64(checkpoint))
	if err != nil {
		return fail(err)
	}
	call.Go()
	return fail(pending.Wait(ctx))
}

func (r *readers) Remove(ctx context.Context, call schema.Readers_remove) error {
	name, err := call.Args().Name()
	if err != nil {
		return badArgs("name", err)
	}
	pending, err := r.srv.StartRemoveReaderAs(ctx, r.caller(), r.ref, name)
	if err != nil {
		return fail(err)
	}
	call.Go()
	return fail(pending.Wait(ctx))
}

func (r *readers) List(ctx context.Context, call schema.Readers_list) error {
	list, err := r.srv.ListReaders(ctx, r.ref)
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return wire.SetReaderInfos(list, res.NewReaders)
}

// --- live state ------------------------------------------------------------------------------

func (s *stream) LiveState(ctx context.Context, call schema.Stream_liveState) error {
	if !call.Args().Subscriber().IsValid() {
		return errNoSubscriber()
	}
	sub := call.Args().Subscriber().AddRef() // the argument is released when this returns
	call.Go()
	h, err := attachLive(s.srv, s.acc, sub, func(sink server.LiveSink) (func(), error) {
		return s.srv.SubscribeLive(ctx, s.ref, sink)
	})
	if err != nil {
		return err
	}
	res, err := call.AllocResults()
	if err != nil {
		h.Release()
		return err
	}
	return res.SetHandle(h)
}

// errNoSubscriber refuses a live view with no LiveSubscriber to push to.
func errNoSubscriber() error {
	return fail(itx.Errorf(itx.EInvalid, "subscriber: a live view needs a LiveSubscriber"))
}

// attachLive subscribes a client's LiveSubscriber (its own reference, which it takes over), with
// a bound on the bytes in flight toward it, and returns the Handle that detaches it. The caller
// has called call.Go: frames are pushed while the call is still answering.
func attachLive(srv *server.Server, acc access, sub schema.LiveSubscriber, subscribe func(server.LiveSink) (func(), error)) (schema.Handle, error) {
	untake, err := takeLive(acc)
	if err != nil {
		sub.Release()
		return schema.Handle{}, fail(err)
	}
	sub.SetFlowLimiter(newPushLimiter())
	var released sync.Once
	let := func() { released.Do(sub.Release); untake() }
	// A view the server ended (its stream removed, its subscription removed, a frame refused)
	// gives back its place under the login's bound and the subscriber's reference at once:
	// they were held until the client released its handle, so a client that kept the handles
	// of ended views was refused new ones (limitExceeded) with none open.
	ls := &liveSubscriber{client: sub, log: srv.Log(), ended: let}
	cancel, err := subscribe(ls)
	if err != nil {
		let()
		return schema.Handle{}, fail(err)
	}
	return newEndHandle(srv, acc, func() { cancel(); let() }, func() {
		// The session that opened it ended (revoked or expired): say so, bounded.
		ctx, stop := context.WithTimeout(context.Background(), itx.DeliveryTimeout)
		defer stop()
		ls.Closed(ctx, server.CloseAccessEnded, "the token that opened this live view was revoked or expired")
	}), nil
}

// takeLive counts a live connection or view against the login that opens it (see
// server.Session.TakeLive); the returned func gives it back, once.
func takeLive(acc access) (func(), error) {
	if acc.session == nil {
		return func() {}, nil
	}
	return acc.session.TakeLive()
}

// liveSubscriber adapts a client's LiveSubscriber capability to server.LiveSink.
type liveSubscriber struct {
	client schema.LiveSubscriber
	// told is set by the first closed(): the view ends once, for one reason. (A project's
	// delete ends its streams, whose views hear streamRemoved, and then its sessions, whose
	// ending would tell the same view accessEnded after it.)
	told atomic.Bool
	log  zerolog.Logger
	// ended lets go of the view's place and the subscriber's reference, once.
	ended func()
}

// Ended runs once the server has stopped the view, whoever ended it (server.LiveEnder).
func (l *liveSubscriber) Ended() { l.ended() }

func (l *liveSubscriber) Send(ctx context.Context, f server.LiveFrame) error {
	if f.Snapshot {
		fut, release := l.client.Snapshot(ctx, func(p schema.LiveSubscriber_snapshot_Params) error {
			p.SetRevision(f.Revision)
			return p.SetState(string(f.JSON))
		})
		defer release()
		_, err := fut.Struct()
		return sinkError(err)
	}
	fut, release := l.client.Patch(ctx, func(p schema.LiveSubscriber_patch_Params) error {
		p.SetRevision(f.Revision)
		return p.SetOps(string(f.JSON))
	})
	defer release()
	_, err := fut.Struct()
	return sinkError(err)
}

// Closed tells the subscriber why the server ended its view (server.LiveCloser).
func (l *liveSubscriber) Closed(ctx context.Context, reason server.CloseReason, message string) {
	if l.told.Swap(true) {
		return
	}
	fut, release := l.client.Closed(ctx, func(p schema.LiveSubscriber_closed_Params) error {
		return setClosed(p, reason, message)
	})
	defer release()
	if _, err := fut.Struct(); err != nil {
		// Told once whatever the outcome (there is no second reason to give), but a notice that
		// failed leaves a trace: a client gone is routine, any other failure is a view that was
		// ended without hearing why.
		ev := l.log.Warn()
		if capnp.IsDisconnected(err) {
			ev = l.log.Debug()
		}
		ev.Err(err).Str("reason", string(reason)).Msg("live view: the closed notice failed")
	}
}
