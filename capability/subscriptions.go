package capability

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"capnproto.org/go/capnp/v3"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/wire"
)

// subscriptions is a stream's subscription catalog.
type subscriptions struct {
	srv *server.Server
	ref server.StreamRef
	acc access
}

func (s *stream) Subscriptions(ctx context.Context, call schema.Stream_subscriptions) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	impl := &subscriptions{srv: s.srv, ref: s.ref, acc: s.acc}
	return res.SetSubscriptions(schema.Subscriptions(guarded(guardOf(s.srv), impl.acc, schema.Subscriptions_Methods(nil, impl), impl)))
}

func (s *stream) SetSubscriptionCursor(ctx context.Context, call schema.Stream_setSubscriptionCursor) error {
	name, err := call.Args().Name()
	if err != nil {
		return badArgs("name", err)
	}
	after, err := itx.ValidateOffset("afterOffset", call.Args().AfterOffset())
	if err != nil {
		return fail(err)
	}
	// Queued before the call queue is released: verbs (and appends) sent on one capability
	// commit in the order sent.
	pending, err := s.srv.StartSetSubscriptionCursor(ctx, s.ref, name, after)
	if err != nil {
		return fail(err)
	}
	call.Go()
	_, off, err := pending.Wait(ctx)
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	res.SetOffset(uint64(off))
	return nil
}

func (s *stream) ResumeSubscription(ctx context.Context, call schema.Stream_resumeSubscription) error {
	name, err := call.Args().Name()
	if err != nil {
		return badArgs("name", err)
	}
	pending, err := s.srv.StartResumeSubscription(ctx, s.ref, name)
	if err != nil {
		return fail(err)
	}
	call.Go()
	_, off, err := pending.Wait(ctx)
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	res.SetOffset(uint64(off))
	return nil
}

func (s *subscriptions) List(ctx context.Context, call schema.Subscriptions_list) error {
	call.Go()
	list, err := s.srv.ListSubscriptions(ctx, s.ref)
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	out, err := res.NewSubscriptions(int32(len(list)))
	if err != nil {
		return err
	}
	for i, sum := range list {
		if err := wire.SetSubscriptionSummary(out.At(i), sum); err != nil {
			return err
		}
	}
	return nil
}

func (s *subscriptions) Get(ctx context.Context, call schema.Subscriptions_get) error {
	name, err := call.Args().Name()
	if err != nil {
		return badArgs("name", err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	// The name is resolved per call, so a subscription configured after this get is found.
	impl := &subscription{srv: s.srv, ref: s.ref, name: name, acc: s.acc}
	return res.SetSubscription(schema.Subscription(guarded(guardOf(s.srv), impl.acc, schema.Subscription_Methods(nil, impl), impl)))
}

func (s *subscriptions) Configure(ctx context.Context, call schema.Subscriptions_configure) error {
	c, err := call.Args().Config()
	if err != nil {
		return badArgs("config", err)
	}
	cfg, err := wire.SubscriptionConfigFromSchema(c)
	if err != nil {
		return badArgs("config", err)
	}
	// The subscription reads the stream as this capability does.
	cfg.Scope = s.acc.subscriptionScope()
	// A copy or a dead letter writes into another stream: that one must be inside the scope too.
	if err := s.acc.reachesTargets(&cfg); err != nil {
		return fail(err)
	}
	key, err := call.Args().IdempotencyKey()
	if err != nil {
		return badArgs("idempotencyKey", err)
	}
	pending, err := s.srv.StartConfigureSubscription(ctx, s.ref, cfg, key)
	if err != nil {
		return fail(err)
	}
	call.Go()
	name, off, err := pending.Wait(ctx)
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	res.SetOffset(uint64(off))
	return res.SetName(name)
}

func (s *subscriptions) Remove(ctx context.Context, call schema.Subscriptions_remove) error {
	name, err := call.Args().Name()
	if err != nil {
		return badArgs("name", err)
	}
	pending, err := s.srv.StartRemoveSubscription(ctx, s.ref, name)
	if err != nil {
		return fail(err)
	}
	call.Go()
	_, off, err := pending.Wait(ctx)
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	res.SetOffset(uint64(off))
	return nil
}

// subscription is one subscription, addressed by name.
type subscription struct {
	srv  *server.Server
	ref  server.StreamRef
	name string
	acc  access
}

func (s *subscription) Describe(ctx context.Context, call schema.Subscription_describe) error {
	call.Go()
	d, err := s.srv.DescribeSubscription(ctx, s.ref, s.name)
	if err != nil {
		return fail(err)
	}
	// A copy into a stream outside this capability's prefix (configured by a wider token) is
	// shown without the stream's path.
	d.Config.Receiver.ReceivingStreamPath = s.acc.shown(d.Config.Receiver.ReceivingStreamPath)
	// A webhook's header values and URL credentials are the stream administrator's.
	d.Config.Receiver = s.acc.redactReceiver(d.Config.Receiver)
	// So is a dead-letter stream (the policy is copied: the catalog's config may be shared).
	if dl := d.Config.Receiver.Delivery; dl != nil && dl.DeadLetterPath != "" {
		shown := *dl
		shown.DeadLetterPath = s.acc.shown(dl.DeadLetterPath)
		d.Config.Receiver.Delivery = &shown
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	out, err := res.NewDescription()
	if err != nil {
		return err
	}
	return wire.SetSubscriptionDescription(out, &d)
}

func (s *subscription) WaitUntilProcessed(ctx context.Context, call schema.Subscription_waitUntilProcessed) error {
	offset, err := itx.ValidateOffset("offset", call.Args().Offset())
	if err != nil {
		return fail(err)
	}
	timeout := time.Duration(call.Args().TimeoutMs()) * time.Millisecond
	call.Go()
	wctx, settled := s.acc.whileValid(ctx)
	confirmed, err := s.srv.WaitUntilProcessed(wctx, s.ref, s.name, offset, timeout)
	if verr := settled(); verr != nil {
		return fail(verr)
	}
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	res.SetConfirmedOffset(uint64(confirmed))
	return nil
}

// Confirm confirms an offset-acking subscription's deliveries through an offset. Queued on the
// stream in the order sent (the call queue is released only once it is), so confirmations sent
// on one capability never move the cursor back and forth.
func (s *subscription) Confirm(ctx context.Context, call schema.Subscription_confirm) error {
	offset, err := itx.ValidateOffset("offset", call.Args().Offset())
	if err != nil {
		return fail(err)
	}
	pending, err := s.srv.StartConfirm(ctx, s.ref, s.name, offset)
	if err != nil {
		return fail(err)
	}
	call.Go()
	confirmed, err := pending.Wait(ctx)
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	res.SetConfirmedOffset(uint64(confirmed))
	return nil
}

func (s *subscription) Processor(ctx context.Context, call schema.Subscription_processor) error {
	d, err := s.srv.DescribeSubscription(ctx, s.ref, s.name)
	if err != nil {
		return fail(err)
	}
	if d.Kind != itx.KindProcessorWake {
		return fail(itx.Errorf(itx.EFailedPrecondition, "subscription %q is a %s subscription: only processor-wake subscriptions have a processor", s.name, d.Kind))
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	impl := &processor{srv: s.srv, ref: s.ref, name: s.name, acc: s.acc}
	return res.SetProcessor(schema.Processor(guarded(guardOf(s.srv), s.acc, schema.Processor_Methods(nil, impl), impl)))
}

// processor is a processor-wake subscription's processor: its committed state and its runtime.
type processor struct {
	srv  *server.Server
	ref  server.StreamRef
	name string
	acc  access
}

func (p *processor) Snapshot(ctx context.Context, call schema.Processor_snapshot) error {
	// A remote processor's host is asked (within the delivery timeout): what it answers after the
	// session ended is not the session's to see.
	wctx, settled := p.acc.whileValid(ctx)
	state, reduced, processed, err := p.srv.ProcessorSnapshot(wctx, p.ref, p.name)
	if verr := settled(); verr != nil {
		return fail(verr)
	}
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	res.SetReducedOffset(uint64(reduced))
	res.SetProcessedOffset(uint64(processed))
	return res.SetState(string(state))
}

func (p *processor) GetRuntimeState(ctx context.Context, call schema.Processor_getRuntimeState) error {
	call.Go() // a remote processor's host is asked: the capability's other calls do not wait
	wctx, settled := p.acc.whileValid(ctx)
	state, err := p.srv.ProcessorRuntimeState(wctx, p.ref, p.name)
	if verr := settled(); verr != nil {
		return fail(verr)
	}
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return res.SetState(string(state))
}

func (p *processor) LiveState(ctx context.Context, call schema.Processor_liveState) error {
	if !call.Args().Subscriber().IsValid() {
		return errNoSubscriber()
	}
	sub := call.Args().Subscriber().AddRef() // the argument is released when this returns
	call.Go()
	h, err := attachLive(p.srv, p.acc, sub, func(sink server.LiveSink) (func(), error) {
		return p.srv.SubscribeProcessorLive(ctx, p.ref, p.name, sink)
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

// --- mounted capabilities ------------------------------------------------------------------

// capabilities is a project's registry of mounted Receivers.
type capabilities struct {
	srv       *server.Server
	projectID string
	acc       access
}

func (p *project) Capabilities(ctx context.Context, call schema.Project_capabilities) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	impl := &capabilities{srv: p.srv, projectID: p.p.ID, acc: p.acc}
	return res.SetCapabilities(schema.Capabilities(guarded(guardOf(p.srv), impl.acc, schema.Capabilities_Methods(nil, impl), impl)))
}

// Mount mounts a Receiver under a name in the namespace of this capability's scope (see
// access.mountScope): only subscriptions configured under the same scope deliver to it.
func (c *capabilities) Mount(ctx context.Context, call schema.Capabilities_mount) error {
	name, err := call.Args().Name()
	if err != nil {
		return badArgs("name", err)
	}
	if !call.Args().Receiver().IsValid() {
		return fail(itx.Errorf(itx.EInvalid, "receiver: a mount needs a Receiver"))
	}
	// The argument is released when this method returns: keep our own reference.
	rc := call.Args().Receiver().AddRef()
	// Bound what the server queues toward one receiver (go-capnp has no backpressure by default).
	rc.SetFlowLimiter(newPushLimiter())
	r := &remoteReceiver{client: rc}
	unmount, err := c.srv.MountReceiverAs(c.caller(), c.projectID, c.acc.mountScope(), name, r)
	if err != nil {
		rc.Release()
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		unmount()
		rc.Release()
		return err
	}
	return res.SetHandle(newEndHandle(c.srv, c.acc, func() { unmount(); rc.Release() }))
}

// Unmount removes the Receiver mounted under a name in this capability's scope's namespace.
func (c *capabilities) Unmount(ctx context.Context, call schema.Capabilities_unmount) error {
	name, err := call.Args().Name()
	if err != nil {
		return badArgs("name", err)
	}
	return fail(c.srv.UnmountReceiverAs(c.caller(), c.projectID, c.acc.mountScope(), name))
}

// caller is who mounts and unmounts through this capability (server.MountCaller).
func (c *capabilities) caller() server.MountCaller {
	by := server.MountCaller{Admin: c.acc.rights&rAdmin != 0}
	if c.acc.session != nil {
		by.TokenID = c.acc.session.Token.Principal() // a rotated token keeps its mounts
	}
	return by
}

// List lists the mounts of this capability's scope, or of every scope (each with its scope) for
// the whole project.
func (c *capabilities) List(ctx context.Context, call schema.Capabilities_list) error {
	mounts := server.MountsIn(c.srv.Mounts(c.projectID), c.acc.mountScope())
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return wire.SetMountInfos(mounts, res.NewMounts)
}

// endHandle is a Handle whose end runs once: on cancel(), on releasing it, or on losing the
// connection that holds it (Shutdown). Mounts unmount with it (a Receiver, a processor host:
// an eviction of its processors); live-state subscriptions detach.
type endHandle struct {
	once sync.Once
	end  func()
}

func (h *endHandle) Cancel(ctx context.Context, call schema.Handle_cancel) error {
	h.once.Do(h.end)
	return nil
}

// Shutdown runs when the last reference to the handle is gone.
func (h *endHandle) Shutdown() { h.once.Do(h.end) }

// newEndHandle serves a Handle that runs end once, under acc: when it is cancelled or released,
// or when acc's session ends (its token revoked or expired), whichever comes first; in that last
// case accessEnded (if given) first tells the other side why.
func newEndHandle(srv *server.Server, acc access, end func(), accessEnded ...func()) schema.Handle {
	h := &endHandle{}
	var mu sync.Mutex
	var forget func()
	h.end = func() {
		end()
		mu.Lock()
		f := forget
		mu.Unlock()
		if f != nil {
			f()
		}
	}
	if acc.session != nil {
		f := acc.session.OnEnd(func() {
			h.once.Do(func() {
				for _, tell := range accessEnded {
					tell()
				}
				h.end()
			})
		})
		mu.Lock()
		forget = f
		mu.Unlock()
	}
	return schema.Handle(guarded(guardOf(srv), acc, schema.Handle_Methods(nil, h), h))
}

// remoteReceiver adapts a client's Receiver capability to server.Receiver.
type remoteReceiver struct {
	client schema.Receiver
	ended  atomic.Bool // End ran: the registry let it go, its capability released
}

// End releases the Receiver once the registry let it go by name (replaced by another mount of
// its name, or unmounted by name), so its client learns it as the capability's last reference
// going (go-capnp's Shutdown, a C++ destructor) rather than never: the mount's handle, which
// releases it too, may be held for as long as the client's connection lasts.
func (r *remoteReceiver) End() {
	r.ended.Store(true)
	r.client.Release()
}

// Receive sends a batch. A receiver whose session is gone is absent (capabilityOffline: the
// subscription parks until the next mount); an exception carrying an itx code keeps it (a
// receiver that says unavailable is an outage); any other exception is the receiver refusing
// these events (failedPrecondition).
func (r *remoteReceiver) Receive(ctx context.Context, b *itx.DeliveryBatch) (int64, error) {
	fut, release := r.client.Receive(ctx, func(p schema.Receiver_receive_Params) error {
		batch, err := p.NewBatch()
		if err != nil {
			return err
		}
		return wire.SetDeliveryBatch(batch, b)
	})
	defer release()
	res, err := fut.Struct()
	switch {
	case err != nil && r.ended.Load():
		// Let go by name meanwhile (End): the call failed on the released capability, no
		// verdict on these events. Absent: the name's next mount, or the one that replaced
		// this, takes them.
		return 0, itx.Errorf(itx.ECapabilityOffline, "the mounted receiver was unmounted or replaced: %v", err)
	case err == nil && !resultsAreStruct(fut.Future):
		// go-capnp reads a text, list or capability where the results struct belongs as an
		// empty struct (confirmedOffset 0: the whole batch taken); no acknowledgement, an outage.
		return 0, itx.Errorf(itx.EUnavailable, "the mounted receiver answered with results that are not a struct")
	case err == nil:
		return int64(res.ConfirmedOffset()), nil
	case capnp.IsDisconnected(err):
		return 0, itx.Errorf(itx.ECapabilityOffline, "the mounted receiver disconnected: %v", err)
	case ctx.Err() != nil:
		return 0, itx.Errorf(itx.EDeadlineExceeded, "the mounted receiver did not answer: %v", err)
	case strings.Contains(err.Error(), "itx."):
		e := itx.AsError(err)
		if e.Code == itx.ECapabilityOffline {
			// Parking waits for the next mount; this receiver is mounted and answering, so
			// its "offline" is an outage: back off and try again.
			return 0, itx.Errorf(itx.EUnavailable, "the mounted receiver says it is offline: %s", e.Message)
		}
		if e.Code != itx.EInternal {
			return 0, e
		}
	}
	return 0, itx.Errorf(itx.EFailedPrecondition, "the receiver refused the batch: %v", err)
}

// resultsAreStruct reports whether a returned call's results are a struct (or null, the empty
// struct), not another kind of pointer.
func resultsAreStruct(fut *capnp.Future) bool {
	p, err := fut.Ptr()
	return err == nil && (!p.IsValid() || p.Struct().IsValid())
}

// --- scheduled appends (durable timers) ---------------------------------------------------

func (s *stream) Schedule(ctx context.Context, call schema.Stream_schedule) error {
	src, err := call.Args().Event()
	return s.schedule(ctx, src, err, call.Args().DueAt(), call.Go, func() (scheduleResults, error) { return call.AllocResults() })
}

// scheduleResults are Stream.schedule's results, and ProcessorPorts.schedule's (the same fields).
type scheduleResults interface {
	SetDueAt(int64)
	SetAppendedOffset(uint64)
}

// schedule is Stream.schedule once its arguments are read (src, or srcErr reading it), for it and
// for a remote processor's ProcessorPorts.schedule: goOn releases the call queue, alloc the results.
func (s *stream) schedule(ctx context.Context, src schema.EventInput, srcErr error, dueAt int64, goOn func(), alloc func() (scheduleResults, error)) error {
	if srcErr != nil {
		return badArgs("event", srcErr)
	}
	in, err := wire.EventInputFromSchema(src)
	if err != nil {
		return badArgs("event", err)
	}
	// Queued before the call queue is released: schedules and cancels sent on one capability
	// apply in the order sent.
	pending, err := s.srv.StartSchedule(ctx, s.ref, in, dueAt)
	if err != nil {
		return fail(err)
	}
	goOn()
	due, appended, err := pending.WaitSchedule(ctx)
	if err != nil {
		return fail(err)
	}
	res, err := alloc()
	if err != nil {
		return err
	}
	res.SetDueAt(due)
	res.SetAppendedOffset(uint64(appended))
	return nil
}

func (s *stream) CancelScheduled(ctx context.Context, call schema.Stream_cancelScheduled) error {
	key, err := call.Args().Key()
	if err != nil {
		return badArgs("key", err)
	}
	pending, err := s.srv.StartCancelScheduled(ctx, s.ref, key)
	if err != nil {
		return fail(err)
	}
	call.Go()
	found, err := pending.WaitCancel(ctx)
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	res.SetCancelled(found)
	return nil
}

func (s *stream) ListScheduled(ctx context.Context, call schema.Stream_listScheduled) error {
	call.Go()
	// A page of scheduled events is as large as a read's (500 events or 4 MiB): it reserves its
	// room as a read does, or listScheduled calls pipelined by a client reading no replies each
	// queued their page, whatever --rpc-max-reply-bytes.
	release, err := s.acc.reserveReply(ctx, pageReplyBytes(itx.Query{}), nil)
	if err != nil {
		return err
	}
	defer release()
	list, err := s.srv.ListScheduled(ctx, s.ref)
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	out, err := res.NewScheduled(int32(len(list)))
	if err != nil {
		return err
	}
	for i := range list {
		item := out.At(i)
		item.SetDueAt(list[i].DueAt)
		ev, err := item.NewEvent()
		if err != nil {
			return err
		}
		if err := wire.SetEventInput(ev, &list[i].Event); err != nil {
			return err
		}
	}
	return nil
}

// by names who asks, for the audit: the session's token.
func (s *stream) by() server.Admin {
	if s.acc.session == nil {
		return server.Admin{ProjectID: s.ref.ProjectID}
	}
	return server.Admin{TokenID: s.acc.session.Token.ID, ProjectID: s.ref.ProjectID}
}

// Trim deletes the stream's events through an offset (retention; the admin right).
func (s *stream) Trim(ctx context.Context, call schema.Stream_trim) error {
	through, err := itx.ValidateOffset("throughOffset", call.Args().ThroughOffset())
	if err != nil {
		return fail(err)
	}
	call.Go()
	r, err := s.srv.TrimStream(ctx, s.by(), s.ref, through, call.Args().CreatedBefore())
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	res.SetTrimmedThrough(uint64(r.TrimmedThrough))
	res.SetDeleted(uint64(r.Deleted))
	return nil
}

// SetRetention stores the stream's retention policy (the admin right).
func (s *stream) SetRetention(ctx context.Context, call schema.Stream_setRetention) error {
	maxEvents, err := itx.ValidateOffset("maxEvents", call.Args().MaxEvents())
	if err != nil {
		return fail(err)
	}
	maxBytes, err := itx.ValidateOffset("maxBytes", call.Args().MaxBytes())
	if err != nil {
		return fail(err)
	}
	call.Go()
	return fail(s.srv.SetRetention(ctx, s.by(), s.ref, call.Args().MaxAgeMs(), maxEvents, maxBytes))
}
