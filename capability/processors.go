package capability

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strings"

	"capnproto.org/go/capnp/v3"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/wire"
)

// processorHosts is a project's registry of mounted remote processor hosts.
type processorHosts struct {
	srv       *server.Server
	projectID string
	acc       access
}

// Mount mounts a processor host in the namespace of this capability's scope (see
// access.mountScope): it is woken only for processor-wake subscriptions configured under the
// same scope, which are on streams inside it, and handed capabilities no wider than this one.
func (p *processorHosts) Mount(ctx context.Context, call schema.ProcessorHosts_mount) error {
	name, err := call.Args().Name()
	if err != nil {
		return badArgs("name", err)
	}
	list, err := call.Args().Contracts()
	if err != nil {
		return badArgs("contracts", err)
	}
	contracts, err := wire.ProcessorContractsFromSchema(list)
	if err != nil {
		return badArgs("contracts", err)
	}
	if !call.Args().Host().IsValid() {
		return fail(itx.Errorf(itx.EInvalid, "host: a mount needs a ProcessorHost"))
	}
	// The argument is released when this method returns: keep our own reference.
	hc := call.Args().Host().AddRef()
	hc.SetFlowLimiter(newPushLimiter())
	h := &remoteHost{srv: p.srv, client: hc, acc: p.acc}
	tokenID := ""
	if p.acc.session != nil {
		tokenID = p.acc.session.Token.Principal() // a rotated token keeps its hosts
	}
	unmount, err := p.srv.MountProcessorHostAs(tokenID, p.projectID, p.acc.mountScope(), name, h, contracts)
	if err != nil {
		hc.Release()
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		unmount()
		hc.Release()
		return err
	}
	return res.SetHandle(newEndHandle(p.srv, p.acc, func() { unmount(); hc.Release() }))
}

func (p *processorHosts) List(ctx context.Context, call schema.ProcessorHosts_list) error {
	mounts := server.MountsIn(p.srv.ProcessorHostMounts(p.projectID), p.acc.mountScope())
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return wire.SetMountInfos(mounts, res.NewMounts)
}

// remoteHost adapts a client's ProcessorHost capability to server.RemoteProcessorHost. Each wake
// carries the home stream and the processor's ports as capabilities of this server.
type remoteHost struct {
	srv    *server.Server
	client schema.ProcessorHost
	acc    access // the mounting session's: the stream and ports it is handed carry no more
}

func (h *remoteHost) Wake(ctx context.Context, w server.RemoteWake) (int64, int64, error) {
	st := &stream{srv: h.srv, ref: w.Ref, acc: h.acc}
	ports := &processorPorts{p: w.Ports, acc: h.acc, home: st}
	fut, release := h.client.Wake(ctx, func(p schema.ProcessorHost_wake_Params) error {
		req, err := p.NewRequest()
		if err != nil {
			return err
		}
		if err := req.SetStreamId(w.StreamID); err != nil {
			return err
		}
		if err := req.SetPath(w.Ref.Path); err != nil {
			return err
		}
		if err := req.SetName(w.Name); err != nil {
			return err
		}
		if w.Processor != w.Name { // empty: the instance runs the contract of its own name
			if err := req.SetProcessor(w.Processor); err != nil {
				return err
			}
		}
		req.SetHeadOffset(uint64(max(w.Head, 0)))
		req.SetGeneration(w.Generation())
		req.SetAlarm(w.Alarm)
		req.SetReprocessFrom(uint64(max(w.ReprocessFrom, 0)))
		req.SetProgressGeneration(uint64(max(w.ProgressGeneration, 0)))
		if err := req.SetStream(schema.Stream(guarded(guardOf(h.srv), h.acc, schema.Stream_Methods(nil, st), st))); err != nil {
			return err
		}
		return req.SetPorts(schema.ProcessorPorts(guarded(guardOf(h.srv), h.acc, schema.ProcessorPorts_Methods(nil, ports), ports)))
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return 0, 0, hostError(ctx, err)
	}
	report, err := res.Report()
	if err != nil {
		return 0, 0, itx.Errorf(itx.EInvalid, "the host's wake report: %v", err)
	}
	if failure, err := report.Failure(); err != nil {
		return 0, 0, itx.Errorf(itx.EInvalid, "the host's wake report: failure: %v", err)
	} else if failure != "" || report.FailingEventOffset() != 0 {
		if failure == "" {
			failure = "the processor failed on the event"
		}
		// The host's words, with their code when they name one (as an exception's reason).
		return 0, 0, &itx.ProcessorEventError{Offset: int64(min(report.FailingEventOffset(), math.MaxInt64)), Err: hostError(ctx, errors.New(failure))}
	}
	return int64(report.ProcessedOffset()), int64(report.ReducedOffset()), nil
}

func (h *remoteHost) RuntimeState(ctx context.Context, streamID, path, name string) (json.RawMessage, error) {
	fut, release := h.client.GetRuntimeState(ctx, func(p schema.ProcessorHost_getRuntimeState_Params) error {
		if err := p.SetStreamId(streamID); err != nil {
			return err
		}
		if err := p.SetPath(path); err != nil {
			return err
		}
		return p.SetName(name)
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return nil, hostError(ctx, err)
	}
	state, err := res.State()
	if err != nil || !json.Valid([]byte(state)) {
		return nil, itx.Errorf(itx.EInvalid, "the host's runtime state is not JSON")
	}
	return json.RawMessage(state), nil
}

func (h *remoteHost) Stop(ctx context.Context, streamID, name string) error {
	fut, release := h.client.Stop(ctx, func(p schema.ProcessorHost_stop_Params) error {
		if err := p.SetStreamId(streamID); err != nil {
			return err
		}
		return p.SetName(name)
	})
	defer release()
	if _, err := fut.Struct(); err != nil {
		return hostError(ctx, err)
	}
	return nil
}

// hostError maps a failed call on a host: a host whose session is gone is absent (its
// subscriptions park until a host mounts the contract again); an exception carrying an itx code
// keeps it, except capabilityOffline (a host that answers is mounted: its "offline" is an
// outage, as for a mounted Receiver); anything else is the host failing (an outage: back off
// and retry).
func hostError(ctx context.Context, err error) error {
	switch {
	case capnp.IsDisconnected(err):
		return itx.Errorf(itx.ECapabilityOffline, "the processor host disconnected: %v", err)
	case ctx.Err() != nil:
		return itx.Errorf(itx.EDeadlineExceeded, "the processor host did not answer: %v", err)
	case strings.Contains(err.Error(), "itx."):
		e := itx.AsError(err)
		if e.Code == itx.ECapabilityOffline {
			return itx.Errorf(itx.EUnavailable, "the processor host says it is offline: %s", e.Message)
		}
		return e
	}
	return itx.Errorf(itx.EUnavailable, "the processor host failed: %v", err)
}

// processorPorts serves server.ProcessorPorts to a host.
type processorPorts struct {
	p    *server.ProcessorPorts
	acc  access  // the mounting session's: AppendTo reaches its prefix only
	home *stream // the processor's home stream, as the wake hands it to the host
}

func (pp *processorPorts) Claim(ctx context.Context, call schema.ProcessorPorts_claim) error {
	name, err := call.Args().Name()
	if err != nil {
		return badArgs("name", err)
	}
	call.Go()
	progress, gen, err := pp.p.Claim(ctx, name)
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	res.SetGeneration(uint64(gen))
	if progress == nil {
		return nil
	}
	b, err := json.Marshal(progress)
	if err != nil {
		return err
	}
	return res.SetProgress(string(b))
}

func (pp *processorPorts) Commit(ctx context.Context, call schema.ProcessorPorts_commit) error {
	name, err := call.Args().Name()
	if err != nil {
		return badArgs("name", err)
	}
	raw, err := call.Args().Progress()
	if err != nil {
		return badArgs("progress", err)
	}
	if len(raw) > itx.MaxEventBytes { // before decoding it
		return fail(itx.Errorf(itx.ETooLarge, "a processor's progress record is at most %d bytes", itx.MaxEventBytes))
	}
	progress, err := itx.ParseProcessorProgress([]byte(raw))
	if err != nil {
		return fail(err)
	}
	call.Go()
	return fail(pp.p.Commit(ctx, name, int64(call.Args().Generation()), progress))
}

func (pp *processorPorts) KvGet(ctx context.Context, call schema.ProcessorPorts_kvGet) error {
	key, err := call.Args().Key()
	if err != nil {
		return badArgs("key", err)
	}
	call.Go()
	value, found, err := pp.p.KVGet(ctx, key)
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	res.SetFound(found)
	return res.SetValue(value)
}

func (pp *processorPorts) KvPut(ctx context.Context, call schema.ProcessorPorts_kvPut) error {
	key, err := call.Args().Key()
	if err != nil {
		return badArgs("key", err)
	}
	value, err := call.Args().Value()
	if err != nil {
		return badArgs("value", err)
	}
	call.Go()
	return fail(pp.p.KVPut(ctx, key, append([]byte(nil), value...)))
}

func (pp *processorPorts) SetAlarm(ctx context.Context, call schema.ProcessorPorts_setAlarm) error {
	at := call.Args().At()
	call.Go()
	return fail(pp.p.SetAlarm(ctx, at))
}

func (pp *processorPorts) Check(ctx context.Context, call schema.ProcessorPorts_check) error {
	name, err := call.Args().Name()
	if err != nil {
		return badArgs("name", err)
	}
	call.Go()
	return fail(pp.p.Check(ctx, name, int64(call.Args().Generation())))
}

func (pp *processorPorts) AppendTo(ctx context.Context, call schema.ProcessorPorts_appendTo) error {
	path, err := call.Args().Path()
	if err != nil {
		return badArgs("path", err)
	}
	if err := pp.acc.reaches(path); err != nil {
		return fail(err)
	}
	list, err := call.Args().Events()
	if err != nil {
		return badArgs("events", err)
	}
	inputs, err := wire.EventInputsFromSchema(list)
	if err != nil {
		return badArgs("events", err)
	}
	var result itx.AppendResult
	if path == pp.home.ref.Path {
		// The home stream, appended to as Stream.append does, but fenced as the processor's
		// other writes: a host whose mount was taken over (frozen mid-frame, say) appends
		// nothing more, where the plain stream capability would still take its events; and
		// held to the processor, reviving no other.
		if err := pp.p.CheckHomeAppend(inputs); err != nil {
			return fail(err)
		}
		pending, err := pp.home.startAppend(ctx, inputs, itx.AppendOptions{})
		if err != nil {
			return fail(err)
		}
		call.Go()
		if result, err = pending.Wait(ctx); err != nil {
			return fail(err)
		}
	} else {
		// Where the forward comes from, when the host says (0: it does not; an older host).
		from, cursor := call.Args().SourceOffset(), call.Args().ProcessedThrough()
		if from > math.MaxInt64 || cursor > math.MaxInt64 {
			return fail(itx.Errorf(itx.EInvalid, "sourceOffset (%d) and processedThrough (%d) are offsets: at most %d", from, cursor, int64(math.MaxInt64)))
		}
		call.Go()
		if from > 0 {
			result, err = pp.p.AppendToFrom(ctx, path, inputs, itx.EffectOrigin{Offset: int64(from), ProcessedThrough: int64(cursor)})
		} else {
			result, err = pp.p.AppendTo(ctx, path, inputs)
		}
		if err != nil {
			return fail(err)
		}
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	r, err := res.NewResult()
	if err != nil {
		return err
	}
	return wire.SetAppendResult(r, result)
}

// Schedule is the processor's ScheduleAppend on its home stream: Stream.schedule, fenced.
func (pp *processorPorts) Schedule(ctx context.Context, call schema.ProcessorPorts_schedule) error {
	if err := pp.p.CheckFence(); err != nil {
		return fail(err)
	}
	src, err := call.Args().Event()
	return pp.home.schedule(ctx, src, err, call.Args().DueAt(), call.Go, func() (scheduleResults, error) { return call.AllocResults() })
}

func (pp *processorPorts) KvDelete(ctx context.Context, call schema.ProcessorPorts_kvDelete) error {
	key, err := call.Args().Key()
	if err != nil {
		return badArgs("key", err)
	}
	call.Go()
	return fail(pp.p.KVDelete(ctx, key))
}
