package capability

import (
	"context"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/wire"
)

// Version is reported by Gateway.version.
var Version = "itxd (development build)"

// ProtocolVersion increases when the schema gains something a client may need to check for.
const ProtocolVersion = 1

// gateway is the bootstrap capability of one RPC connection.
type gateway struct {
	srv           *server.Server
	authenticated func() // raises the connection's flow-control bounds; nil in tests
}

func (g *gateway) Login(ctx context.Context, call schema.Gateway_login) error {
	token, err := call.Args().Token()
	if err != nil {
		return badArgs("token", err)
	}
	p, err := g.srv.Login(ctx, token)
	if err != nil {
		return fail(err)
	}
	if g.authenticated != nil {
		g.authenticated()
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	impl := &project{srv: g.srv, p: p}
	return res.SetProject(schema.Project(guarded(guardOf(g.srv), schema.Project_Methods(nil, impl), impl)))
}

func (g *gateway) Version(ctx context.Context, call schema.Gateway_version) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	res.SetProtocol(ProtocolVersion)
	return res.SetServer(Version)
}

// project is a logged-in project root.
type project struct {
	srv *server.Server
	p   itx.ProjectInfo
}

func (p *project) Streams(ctx context.Context, call schema.Project_streams) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	impl := &streams{srv: p.srv, projectID: p.p.ID}
	return res.SetStreams(schema.Streams(guarded(guardOf(p.srv), schema.Streams_Methods(nil, impl), impl)))
}

func (p *project) Processors(ctx context.Context, call schema.Project_processors) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	impl := &processorHosts{srv: p.srv, projectID: p.p.ID}
	return res.SetProcessors(schema.ProcessorHosts(guarded(guardOf(p.srv), schema.ProcessorHosts_Methods(nil, impl), impl)))
}

func (p *project) Describe(ctx context.Context, call schema.Project_describe) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	info, err := res.NewInfo()
	if err != nil {
		return err
	}
	return wire.SetProjectInfo(info, p.p)
}

// streams is a project's stream collection.
type streams struct {
	srv       *server.Server
	projectID string
}

func (s *streams) Get(ctx context.Context, call schema.Streams_get) error {
	path, err := call.Args().Path()
	if err != nil {
		return badArgs("path", err)
	}
	if err := itx.ValidatePath(path); err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	impl := &stream{srv: s.srv, ref: server.StreamRef{ProjectID: s.projectID, Path: path}}
	return res.SetStream(schema.Stream(guarded(guardOf(s.srv), schema.Stream_Methods(nil, impl), impl)))
}

func (s *streams) List(ctx context.Context, call schema.Streams_list) error {
	args := call.Args()
	prefix, err := args.Prefix()
	if err != nil {
		return badArgs("prefix", err)
	}
	after, err := args.After()
	if err != nil {
		return badArgs("after", err)
	}
	call.Go()
	infos, next, err := s.srv.ListStreams(ctx, s.projectID, prefix, after, int(args.Limit()))
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	if err := res.SetNextAfter(next); err != nil {
		return err
	}
	list, err := res.NewStreams(int32(len(infos)))
	if err != nil {
		return err
	}
	for i, info := range infos {
		if err := wire.SetStreamInfo(list.At(i), info); err != nil {
			return err
		}
	}
	return nil
}

// stream is one stream of a project. It holds only the stream's name: the stream's actor is
// loaded per call and may be unloaded while a client holds this capability.
type stream struct {
	srv *server.Server
	ref server.StreamRef
}

func (s *stream) Append(ctx context.Context, call schema.Stream_append) error {
	args := call.Args()
	list, err := args.Events()
	if err != nil {
		return badArgs("events", err)
	}
	inputs, err := wire.EventInputsFromSchema(list)
	if err != nil {
		return badArgs("events", err)
	}
	var opts itx.AppendOptions
	if args.HasOptions() {
		o, err := args.Options()
		if err != nil {
			return badArgs("options", err)
		}
		if _, err := itx.ValidateOffset("options.expectedHeadOffset", o.ExpectedHeadOffset()); err != nil {
			return fail(err)
		}
		opts = wire.AppendOptionsFromSchema(o)
	}
	// Queue before releasing the call queue: appends sent on one capability commit in order.
	pending, err := s.srv.StartAppend(ctx, s.ref, inputs, opts)
	if err != nil {
		return fail(err)
	}
	call.Go()
	result, err := pending.Wait(ctx)
	if err != nil {
		return fail(err)
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

func (s *stream) GetEvents(ctx context.Context, call schema.Stream_getEvents) error {
	q, err := s.query(call.Args().Query())
	if err != nil {
		return err
	}
	call.Go()
	page, err := s.srv.ReadEvents(ctx, s.ref, q)
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return wire.SetEvents(page.Events, res.NewEvents)
}

func (s *stream) GetEventPage(ctx context.Context, call schema.Stream_getEventPage) error {
	q, err := s.query(call.Args().Query())
	if err != nil {
		return err
	}
	call.Go()
	page, err := s.srv.ReadEvents(ctx, s.ref, q)
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	p, err := res.NewPage()
	if err != nil {
		return err
	}
	return wire.SetPage(p, page)
}

func (s *stream) query(q schema.EventQuery, err error) (itx.Query, error) {
	if err != nil {
		return itx.Query{}, badArgs("query", err)
	}
	rq, err := wire.QueryFromSchema(q)
	if err != nil {
		if itx.ErrorCode(err) == itx.EInvalid {
			return rq, fail(err)
		}
		return rq, badArgs("query", err)
	}
	return rq, nil
}

func (s *stream) WaitForEvent(ctx context.Context, call schema.Stream_waitForEvent) error {
	args := call.Args()
	var pred itx.Predicate
	if args.HasPredicate() {
		p, err := args.Predicate()
		if err != nil {
			return badArgs("predicate", err)
		}
		if pred, err = wire.PredicateFromSchema(p); err != nil {
			return badArgs("predicate", err)
		}
	}
	after, err := itx.ValidateOffset("after", args.After())
	if err != nil {
		return fail(err)
	}
	timeout := time.Duration(args.TimeoutMs()) * time.Millisecond
	call.Go()
	e, err := s.srv.WaitForEvent(ctx, s.ref, pred, after, timeout)
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	ev, err := res.NewEvent()
	if err != nil {
		return err
	}
	return wire.SetEvent(ev, &e)
}

func (s *stream) Describe(ctx context.Context, call schema.Stream_describe) error {
	call.Go()
	info, err := s.srv.Describe(ctx, s.ref)
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	i, err := res.NewInfo()
	if err != nil {
		return err
	}
	return wire.SetStreamInfo(i, info)
}
