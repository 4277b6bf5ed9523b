package capability

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"capnproto.org/go/capnp/v3/rpc"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/wire"
)

// Version is reported by Gateway.version.
var Version = "itxd (development build)"

// ProtocolVersion increases when the schema gains something a client may need to check for.
// 2: Project.admin, scoped tokens (permissionDenied), Stream.readOnly/appendOnly, secretSet.
const ProtocolVersion = 2

// gateway is the bootstrap capability of one RPC connection. It keeps the connection's
// sessions (one per login): a revoked token ends its sessions at once, and when every session of
// the connection is revoked the connection is closed.
type gateway struct {
	srv           *server.Server
	authenticated func() // raises the connection's flow-control bounds; nil in tests
	// reserveReply reserves room for a large reply on the connection (flowconn's ReserveReply);
	// nil in tests.
	reserveReply func(ctx context.Context, n int64, onWait func()) (release func(), err error)
	// whenAnswered runs f once the connection's calls in flight have their answers written (or
	// after max: flowconn's WhenAnswered); nil in tests.
	whenAnswered func(max time.Duration, f func())

	mu       sync.Mutex
	conn     *rpc.Conn // nil in tests
	sessions []*server.Session
	byToken  map[[32]byte]*server.Session // SHA-256 of the token: a login again reuses its session
	logins   int                          // logins in progress: a revocation does not close the connection under them
	ended    bool
	// projects are those the connection is logged in to, each counted once toward its share of
	// the RPC connections (Server.TakeConnectionShare) until the connection ends.
	projects map[string]bool
	// maxSessions bounds the distinct tokens one connection logs in with (a login with a token
	// already logged in reuses its session, so logging in per request stays bounded); 0:
	// DefaultMaxLoginsPerConnection.
	maxSessions int
}

// DefaultMaxLoginsPerConnection is the default of Listener.SetMaxLoginsPerConnection.
const DefaultMaxLoginsPerConnection = 64

func (g *gateway) setConn(c *rpc.Conn) {
	g.mu.Lock()
	g.conn = c
	g.mu.Unlock()
}

func (g *gateway) Login(ctx context.Context, call schema.Gateway_login) error {
	token, err := call.Args().Token()
	if err != nil {
		return badArgs("token", err)
	}
	key := sha256.Sum256([]byte(token))
	g.mu.Lock()
	x := g.byToken[key]
	if x != nil && x.Check() != nil {
		x = nil // revoked or expired: the login below says which
	}
	maxSessions := g.maxSessions
	if maxSessions <= 0 {
		maxSessions = DefaultMaxLoginsPerConnection
	}
	if x == nil && len(g.sessions) >= maxSessions {
		g.mu.Unlock()
		return fail(itx.Errorf(itx.ELimitExceeded, "a connection logs in with at most %d tokens (--rpc-max-logins-per-connection); log in again with one of them (its project is shared) or open another connection", maxSessions))
	}
	if x == nil {
		g.logins++
	}
	g.mu.Unlock()
	if x == nil {
		var err error
		x, err = g.srv.OpenSession(ctx, token, g.revoked)
		g.mu.Lock()
		g.logins--
		if err != nil {
			g.closeIfAllRevoked()
			g.mu.Unlock()
			return fail(err)
		}
		if g.ended { // the connection ended while logging in
			g.mu.Unlock()
			x.Close()
			return fail(itx.Errorf(itx.ECancelled, "the connection ended"))
		}
		if id := x.Project.ID; !g.projects[id] {
			// The connection's first login to this project: past the project's share of the
			// connections it is refused, and the connection stays as it was (not logged in, it
			// falls under the bounds before login and their login timeout).
			if err := g.srv.TakeConnectionShare(id); err != nil {
				g.mu.Unlock()
				x.Close()
				return fail(err)
			}
			if g.projects == nil {
				g.projects = map[string]bool{}
			}
			g.projects[id] = true
		}
		if g.byToken == nil {
			g.byToken = map[[32]byte]*server.Session{}
		}
		g.byToken[key] = x
		g.sessions = append(g.sessions, x)
		if err := x.Check(); err != nil {
			// Revoked or expired while logging in: its revocation found a login in progress
			// and left the connection; decide now.
			g.closeIfAllRevoked()
			g.mu.Unlock()
			return fail(err)
		}
		g.mu.Unlock()
	}
	if g.authenticated != nil {
		g.authenticated()
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	acc := accessOf(x)
	acc.reserve = g.reserveReply
	impl := &project{srv: g.srv, p: x.Project, acc: acc}
	return res.SetProject(schema.Project(guarded(guardOf(g.srv), impl.acc, schema.Project_Methods(nil, impl), impl)))
}

// revoked runs when one of the connection's sessions is revoked: once none is left valid, the
// connection is closed, so nothing more is pushed to it (connections, live state, receivers).
func (g *gateway) revoked() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closeIfAllRevoked()
}

// closeIfAllRevoked closes the connection when it had sessions, all of them are revoked, and no
// login is in progress (a second login racing the revocation of the first keeps the connection).
// g.mu is held.
func (g *gateway) closeIfAllRevoked() {
	if !g.allRevoked() {
		return
	}
	c := g.conn
	if c == nil {
		return
	}
	if g.whenAnswered == nil {
		go c.Close() // not under a handler of this connection
		return
	}
	// Once the calls in flight are answered: a login that revoked its own token (or a login
	// refused on a connection whose other logins are revoked) hears its answer before the
	// connection ends; go-capnp's Close would drop it. Every call of a revoked login fails
	// meanwhile, so the wait is short; revokedCloseWait bounds it.
	g.whenAnswered(revokedCloseWait, func() { c.Close() })
}

// revokedCloseWait bounds how long a connection whose logins are all revoked stays open for the
// answers of its calls in flight to be written.
const revokedCloseWait = 5 * time.Second

// allRevoked reports whether the connection is left with nothing valid: it had sessions, every
// one of them is revoked, and no login is in progress. g.mu is held.
func (g *gateway) allRevoked() bool {
	if len(g.sessions) == 0 || g.logins > 0 || g.ended {
		return false
	}
	for _, x := range g.sessions {
		if !x.Revoked() {
			return false
		}
	}
	return true
}

// endSessions forgets the connection's sessions once it has ended.
func (g *gateway) endSessions() {
	g.mu.Lock()
	g.ended = true
	sessions, projects := g.sessions, g.projects
	g.sessions, g.byToken, g.projects = nil, nil, nil
	g.mu.Unlock()
	for _, x := range sessions {
		x.Close()
	}
	for id := range projects {
		g.srv.ReleaseConnectionShare(id)
	}
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
	acc access
}

func (p *project) Streams(ctx context.Context, call schema.Project_streams) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	impl := &streams{srv: p.srv, projectID: p.p.ID, acc: p.acc}
	return res.SetStreams(schema.Streams(guarded(guardOf(p.srv), impl.acc, schema.Streams_Methods(nil, impl), impl)))
}

func (p *project) Processors(ctx context.Context, call schema.Project_processors) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	impl := &processorHosts{srv: p.srv, projectID: p.p.ID, acc: p.acc}
	return res.SetProcessors(schema.ProcessorHosts(guarded(guardOf(p.srv), impl.acc, schema.ProcessorHosts_Methods(nil, impl), impl)))
}

func (p *project) Describe(ctx context.Context, call schema.Project_describe) error {
	call.Go()
	now, err := p.srv.Project(ctx, p.p.ID)
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	info, err := res.NewInfo()
	if err != nil {
		return err
	}
	return wire.SetProjectInfo(info, now)
}

// streams is a project's stream collection.
type streams struct {
	srv       *server.Server
	projectID string
	acc       access
}

// pathArg is a call's stream path: valid, and inside the scope.
func (s *streams) pathArg(path string, err error) (string, error) {
	if err != nil {
		return "", badArgs("path", err)
	}
	if err := itx.ValidatePath(path); err != nil {
		return "", fail(err)
	}
	if err := s.acc.reaches(path); err != nil {
		return "", fail(err)
	}
	return path, nil
}

func (s *streams) Get(ctx context.Context, call schema.Streams_get) error {
	path, err := s.pathArg(call.Args().Path())
	if err != nil {
		return err
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	impl := &stream{srv: s.srv, ref: server.StreamRef{ProjectID: s.projectID, Path: path}, acc: s.acc}
	return res.SetStream(schema.Stream(guarded(guardOf(s.srv), impl.acc, schema.Stream_Methods(nil, impl), impl)))
}

func (s *streams) List(ctx context.Context, call schema.Streams_list) error {
	args := call.Args()
	infos, next, err := listPage(ctx, s, call.Go, args.Prefix, args.After, args.Limit(), s.srv.ListStreamsUnder,
		func(info itx.StreamInfo) string { return info.Path })
	if err != nil {
		return err
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

// DiskUsage is List with each stream's files' size (the read right, as List).
func (s *streams) DiskUsage(ctx context.Context, call schema.Streams_diskUsage) error {
	args := call.Args()
	usage, next, err := listPage(ctx, s, call.Go, args.Prefix, args.After, args.Limit(), s.srv.DiskUsageUnder,
		func(u itx.StreamDiskUsage) string { return u.Path })
	if err != nil {
		return err
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	if err := res.SetNextAfter(next); err != nil {
		return err
	}
	list, err := res.NewStreams(int32(len(usage)))
	if err != nil {
		return err
	}
	for i, u := range usage {
		if err := wire.SetStreamDiskUsage(list.At(i), u); err != nil {
			return err
		}
	}
	return nil
}

// listPage reads one page of a listing of the project's streams, validating its arguments: a
// scoped capability lists only under its prefix (and never names a stream outside it).
func listPage[T any](ctx context.Context, s *streams, goFn func(), prefixArg, afterArg func() (string, error), limit uint32,
	list func(ctx context.Context, projectID, scope, prefix, after string, limit int) ([]T, string, error),
	pathOf func(T) string) ([]T, string, error) {
	prefix, err := prefixArg()
	if err != nil {
		return nil, "", badArgs("prefix", err)
	}
	after, err := afterArg()
	if err != nil {
		return nil, "", badArgs("after", err)
	}
	if err := itx.ValidatePathPrefix(prefix); err != nil {
		return nil, "", fail(err)
	}
	// Checked here too: a prefix outside the scope is answered below without the listing.
	if _, err := server.ListLimit(int(limit), server.DefaultListStreams, server.MaxListStreams); err != nil {
		return nil, "", fail(err)
	}
	prefix, overlaps := s.acc.listPrefix(prefix)
	if !overlaps {
		return nil, "", nil
	}
	goFn()
	// The directory reads only the scope's streams, so nextAfter never names another.
	page, next, err := list(ctx, s.projectID, s.acc.prefix, prefix, after, int(limit))
	if err != nil {
		return nil, "", fail(err)
	}
	for _, item := range page {
		if err := s.acc.reaches(pathOf(item)); err != nil {
			return nil, "", fail(itx.Errorf(itx.EInternal, "list: %s is outside the scope", pathOf(item)))
		}
	}
	return page, next, nil
}

// Remove deletes a stream (the admin right, on a path inside the prefix).
func (s *streams) Remove(ctx context.Context, call schema.Streams_remove) error {
	path, err := s.pathArg(call.Args().Path())
	if err != nil {
		return err
	}
	call.Go()
	by := server.Admin{TokenID: s.acc.session.Token.ID, ProjectID: s.projectID}
	gone, err := s.srv.DeleteStream(ctx, by, server.StreamRef{ProjectID: s.projectID, Path: path}, call.Args().Force())
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	res.SetHeadOffset(uint64(gone.HeadOffset))
	res.SetUnread(gone.Unread)
	return res.SetStreamId(gone.StreamID)
}

// stream is one stream of a project. It holds only the stream's name: the stream's actor is
// loaded per call and may be unloaded while a client holds this capability.
type stream struct {
	srv *server.Server
	ref server.StreamRef
	acc access
}

// ReadOnly mints a capability to the same stream that only reads.
func (s *stream) ReadOnly(ctx context.Context, call schema.Stream_readOnly) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return res.SetStream(s.narrowed(rRead))
}

// AppendOnly mints a capability to the same stream that only appends.
func (s *stream) AppendOnly(ctx context.Context, call schema.Stream_appendOnly) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return res.SetStream(s.narrowed(rAppend))
}

// narrowed is this stream limited to keep: the same session (it dies with it), at most this
// capability's rights, and no new token.
func (s *stream) narrowed(keep rightSet) schema.Stream {
	impl := &stream{srv: s.srv, ref: s.ref, acc: s.acc.narrow(keep)}
	return schema.Stream(guarded(guardOf(s.srv), impl.acc, schema.Stream_Methods(nil, impl), impl))
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
	pending, err := s.startAppend(ctx, inputs, opts)
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

// startAppend queues an append as this capability takes it: its control events checked against
// the capability (controlEvents), webhook secrets kept apart from the log.
func (s *stream) startAppend(ctx context.Context, inputs []itx.EventInput, opts itx.AppendOptions) (*server.PendingAppend, error) {
	if err := s.controlEvents(inputs); err != nil {
		return nil, err
	}
	release, err := s.srv.KeepSecretsApart(ctx, s.ref, inputs)
	if err != nil {
		return nil, err
	}
	pending, err := s.srv.StartAppend(ctx, s.ref, inputs, opts)
	if err != nil {
		release()
		return nil, err
	}
	pending.AfterAnswer(release) // committed (its catalog references the secrets) or refused
	return pending, nil
}

// controlEvents holds a raw append of the stream's own control events (stream/*: configure,
// remove, cursor-set, resume) to what the verbs need: the subscribe right, and for a
// copy-to-stream configuration a target inside the prefix.
func (s *stream) controlEvents(inputs []itx.EventInput) error {
	for i, in := range inputs {
		if !itx.IsCoreType(in.Type) {
			continue
		}
		if s.acc.rights&rSubscribe == 0 {
			return itx.Errorf(itx.EPermissionDenied, "event %d: appending %s needs the subscribe right", i, in.Type)
		}
		if in.Type != itx.TypeSubscriptionConfigured {
			continue
		}
		// The subscription reads the stream as this capability does, whatever the event says.
		if scope := s.acc.subscriptionScope(); scope != "" {
			// A payload the append's validation refuses is left to it: decoded and encoded
			// again, invalid UTF-8 would come out as U+FFFD and trailing data would be gone.
			if probe := in; probe.Normalize() != nil {
				continue
			}
			dec := json.NewDecoder(bytes.NewReader(in.Payload))
			dec.UseNumber()
			var m map[string]any
			if dec.Decode(&m) != nil {
				continue // refused by the append's validation
			}
			// Fields match under Unicode case folding ("ſcope" is "scope", and the last of
			// them wins): every spelling goes, so the scope recorded, which picks the mounts
			// the subscription reaches, is this token's.
			for k := range m {
				if strings.EqualFold(k, "scope") {
					delete(m, k)
				}
			}
			m["scope"] = scope
			b, err := json.Marshal(m)
			if err != nil {
				return itx.Errorf(itx.EInvalid, "event %d: %v", i, err)
			}
			inputs[i].Payload = b
		}
		// The targets are checked in the payload as it will be stored: the rewrite above orders
		// keys anew, and keys match case-insensitively with the last one winning, so a field
		// spelt twice could name one target to a check before it and another after.
		var cfg itx.SubscriptionConfig
		if json.Unmarshal(inputs[i].Payload, &cfg) == nil {
			if err := s.acc.reachesTargets(&cfg); err != nil {
				return err
			}
			// The scope picks the mounts the subscription reaches (a tenant's receivers and
			// processor hosts): a whole-project token may place a subscription in a tenant's
			// namespace, but only on a stream of that tenant's, so a tenant's mount is never
			// handed a stream outside its prefix.
			if cfg.Scope != "" && !itx.PathUnder(s.ref.Path, cfg.Scope) {
				return itx.Errorf(itx.EInvalid, "event %d: scope %s does not contain the stream %s", i, cfg.Scope, s.ref.Path)
			}
		}
	}
	return nil
}

func (s *stream) GetEvents(ctx context.Context, call schema.Stream_getEvents) error {
	q, err := s.query(call.Args().Query())
	if err != nil {
		return err
	}
	call.Go()
	release, err := s.acc.reserveReply(ctx, pageReplyBytes(q), nil)
	if err != nil {
		return err
	}
	defer release()
	page, err := s.srv.ReadEvents(ctx, s.ref, q)
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return wire.SetEvents(s.acc.redactEvents(page.Events), res.NewEvents)
}

func (s *stream) GetEventPage(ctx context.Context, call schema.Stream_getEventPage) error {
	q, err := s.query(call.Args().Query())
	if err != nil {
		return err
	}
	call.Go()
	release, err := s.acc.reserveReply(ctx, pageReplyBytes(q), nil)
	if err != nil {
		return err
	}
	defer release()
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
	page.Events = s.acc.redactEvents(page.Events)
	return wire.SetPage(p, page)
}

// eventReplyOverhead is what an event's reply takes beyond its Size (offsets, times, provenance).
const eventReplyOverhead = 256

// matchedAgain reads the event waitForEvent matched at offset at, once its reply has room.
func (s *stream) matchedAgain(ctx context.Context, at int64) (itx.Event, error) {
	page, err := s.srv.ReadEvents(ctx, s.ref, itx.Query{After: at - 1, Limit: 1, IncludeEphemeral: true})
	if err != nil {
		return itx.Event{}, err
	}
	if len(page.Events) == 0 || page.Events[0].Offset != at {
		return itx.Event{}, itx.Errorf(itx.ENotFound, "the event at offset %d matched, but was trimmed before its reply could be sent (the client was not reading its replies): wait again after %d", at, at)
	}
	e := page.Events[0]
	if view := s.acc.viewEvent(); view != nil {
		e = view(e)
	}
	return e, nil
}

// pageReplyBytes is the most a read's reply may take: its events (a page ends after the one
// that brings it to itx.MaxPageBytes) and their encoding.
func pageReplyBytes(q itx.Query) int64 {
	limit := q.Limit
	if limit <= 0 || limit > itx.MaxPageLimit {
		limit = itx.MaxPageLimit
	}
	return min(int64(limit)*(itx.MaxEventBytes+eventReplyOverhead), itx.MaxPageBytes+itx.MaxEventBytes+int64(limit)*eventReplyOverhead)
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
	// The predicate sees the events as this capability reads them: matching cannot find a path
	// the reads hide.
	wctx, settled := s.acc.whileValid(ctx)
	e, err := s.srv.WaitForEventAs(wctx, s.ref, pred, after, timeout, s.acc.viewEvent())
	if verr := settled(); verr != nil {
		return fail(verr) // revoked or expired while waiting: nothing found since is answered
	}
	if err != nil {
		return fail(err)
	}
	// The reply takes its room on the connection first. While a client is not reading its
	// replies, the match is not held (pipelined long polls would each hold up to an event's 1
	// MiB): it is read again once there is room, and was it trimmed meanwhile, the call says so.
	at, dropped := e.Offset, false
	release, err := s.acc.reserveReply(ctx, int64(e.Size())+eventReplyOverhead, func() { e, dropped = itx.Event{}, true })
	if err != nil {
		return err
	}
	defer release()
	if dropped {
		if e, err = s.matchedAgain(ctx, at); err != nil {
			return fail(err)
		}
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
