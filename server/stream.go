package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

// PendingAppend is an append queued to its stream; Wait returns its outcome.
type PendingAppend struct {
	srv   *Server
	actor *actor
	req   *appendReq
	after func()
}

// AfterAnswer runs f once the stream has answered the append (committed or refused), even when
// Wait gave up first: what must outlive the append's outcome, such as the hold on a webhook
// secret it references, is let go only then. Call it before Wait.
func (p *PendingAppend) AfterAnswer(f func()) { p.after = f }

func (p *PendingAppend) answered() {
	p.srv.release(p.actor)
	if p.after != nil {
		p.after()
	}
}

// StartAppend validates an append and queues it on the stream. Bad input is refused here, before
// anything is queued, so it writes nothing. Appends queued on one stream commit in queue order;
// the caller may release its RPC call queue (call.Go) only after StartAppend returns.
func (s *Server) StartAppend(ctx context.Context, ref StreamRef, inputs []itx.EventInput, opts itx.AppendOptions) (*PendingAppend, error) {
	return s.startClientAppend(ctx, ref, inputs, opts, nil)
}

// startClientAppend is StartAppend of a processor's effect stamped with where it comes from
// (nil: a plain client append).
func (s *Server) startClientAppend(ctx context.Context, ref StreamRef, inputs []itx.EventInput, opts itx.AppendOptions, effect *effectStamp) (*PendingAppend, error) {
	if err := itx.ValidatePath(ref.Path); err != nil {
		return nil, err
	}
	if err := validateAppend(inputs, authClient); err != nil {
		s.metrics.AppendCalls.WithLabelValues(string(itx.ErrorCode(err))).Inc() // refused before queueing
		return nil, err
	}
	if err := serverWritten(ref); err != nil {
		for i := range inputs {
			if !itx.IsCoreType(inputs[i].Type) { // a subscription's control events configure one reading it
				return nil, err
			}
		}
	}
	return s.startAppend(ctx, ref, &appendReq{inputs: inputs, opts: opts, authority: authClient, effect: effect})
}

// serverWritten refuses what a client (its appends, scheduled appends, copies and dead letters)
// would write into the deployment's audit stream: its records are the server's alone, as for a
// processor's AppendTo.
func serverWritten(ref StreamRef) error {
	if ref.ProjectID == DeploymentProjectID && ref.Path == AuditPath {
		return itx.Errorf(itx.EPermissionDenied, "%s is written by the server only", AuditPath)
	}
	return nil
}

func (s *Server) startAppend(ctx context.Context, ref StreamRef, req *appendReq) (*PendingAppend, error) {
	a, err := s.acquire(ctx, ref)
	if err != nil {
		return nil, err
	}
	req.queued, req.reply = time.Now(), make(chan appendReply, 1)
	if err := a.submit(ctx, req); err != nil {
		s.release(a)
		return nil, err
	}
	return &PendingAppend{srv: s, actor: a, req: req}, nil
}

// Wait blocks until the append's group commit is durable (or refused). If ctx ends first the
// append may still commit; the caller simply never learns its offsets.
func (p *PendingAppend) Wait(ctx context.Context) (itx.AppendResult, error) {
	select {
	case r := <-p.req.reply:
		p.answered()
		return r.result, r.err
	case <-ctx.Done():
		// Keep the reference until the actor answers, so the stream is not unloaded under it.
		go func() { <-p.req.reply; p.answered() }()
		return itx.AppendResult{}, itx.Errorf(itx.ECancelled, "append: %v", ctx.Err())
	}
}

// Append validates, queues and waits: StartAppend followed by Wait.
func (s *Server) Append(ctx context.Context, ref StreamRef, inputs []itx.EventInput, opts itx.AppendOptions) (itx.AppendResult, error) {
	p, err := s.StartAppend(ctx, ref, inputs, opts)
	if err != nil {
		return itx.AppendResult{}, err
	}
	return p.Wait(ctx)
}

// appendAs appends with the server's own authority (halts, skip records) or as a copy.
func (s *Server) appendAs(ctx context.Context, ref StreamRef, inputs []itx.EventInput, auth authority, stamp *copyStamp) (itx.AppendResult, error) {
	if auth == authCopy {
		if err := serverWritten(ref); err != nil {
			return itx.AppendResult{}, err
		}
	}
	if err := validateAppend(inputs, auth); err != nil {
		return itx.AppendResult{}, err
	}
	p, err := s.startAppend(ctx, ref, &appendReq{inputs: inputs, authority: auth, copy: stamp})
	if err != nil {
		return itx.AppendResult{}, err
	}
	return p.Wait(ctx)
}

// validateAppend normalizes every input in place; the first bad one refuses the whole call.
// Provenance and the internal idempotency-key namespace belong to the server.
func validateAppend(inputs []itx.EventInput, auth authority) error {
	if len(inputs) == 0 {
		return itx.Errorf(itx.EInvalid, "append needs at least one event")
	}
	if len(inputs) > itx.MaxAppendEvents {
		return itx.ErrAppendTooManyEvents(len(inputs))
	}
	total := 0
	for i := range inputs {
		if err := inputs[i].Normalize(); err != nil {
			e := itx.AsError(err)
			return &itx.Error{Code: e.Code, Message: fmt.Sprintf("event %d: %s", i, e.Message)}
		}
		if auth == authClient {
			if len(inputs[i].Provenance) > 0 {
				return itx.Errorf(itx.EInvalid, "event %d: provenance is written only by copy-to-stream", i)
			}
			if strings.HasPrefix(inputs[i].IdempotencyKey, itx.InternalKeyPrefix) {
				return itx.Errorf(itx.EInvalid, "event %d: idempotency keys starting %q are the server's", i, itx.InternalKeyPrefix)
			}
			canonicalizeControlName(&inputs[i])
		}
		total += inputs[i].Size()
	}
	if total > itx.MaxAppendBytes {
		return itx.ErrAppendTooLarge(total)
	}
	return nil
}

// canonicalizeControlName trims the subscription name of a client's subscription control event,
// as the verbs do before they append theirs, so the log records the name the subscription has,
// not the caller's spacing: a reader of the log (the birth event's receiver, an export) finds
// the subscription by the name it reads. It runs before the idempotency lookup, so a retry
// spaced as the first try matches the stored event. Only the name changes, and only when
// trimming changes it (a blank one is left for the reducer to refuse as written); copies never
// come here and keep their body verbatim.
func canonicalizeControlName(in *itx.EventInput) {
	switch in.Type {
	case itx.TypeSubscriptionConfigured, itx.TypeSubscriptionCursorSet, itx.TypeSubscriptionResumed, itx.TypeSubscriptionRemoved:
	default:
		return
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(in.Payload, &fields) != nil {
		return // the reducer refuses it with the decoding error
	}
	var name string
	if json.Unmarshal(fields["name"], &name) != nil {
		return
	}
	trimmed := strings.TrimSpace(name)
	if trimmed == name || trimmed == "" {
		return
	}
	fields["name"], _ = json.Marshal(trimmed)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // the other fields keep their bytes: "<" stays "<"
	if enc.Encode(fields) != nil {
		return
	}
	in.Payload = bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

func normalizeQuery(q *itx.Query) error {
	switch {
	case q.After < 0 || q.Before < 0:
		return itx.Errorf(itx.EInvalid, "offsets must not be negative")
	case q.Limit < 0:
		return itx.Errorf(itx.EInvalid, "limit must not be negative")
	case q.Limit > itx.MaxPageLimit:
		q.Limit = itx.MaxPageLimit // the schema's "capped at 500": the page says where to go on
	case q.Limit == 0:
		q.Limit = itx.DefaultPageLimit
	}
	if err := itx.ValidateTypeFilter("types", q.Types); err != nil {
		return err
	}
	name := strings.TrimSpace(q.Subscription)
	if name == "" && q.Subscription != "" {
		// Blank is not left out: a read that dropped the filter would hand the caller events
		// the subscription never delivers.
		return itx.Errorf(itx.EInvalid, "subscription %q is blank: leave it out to read without a subscription's filter", q.Subscription)
	}
	q.Subscription = name
	for _, t := range q.Types {
		if t == "*" {
			q.Types = nil
			break
		}
	}
	return nil
}

// ReadEvents reads a page of a stream. A stream that never had an append reads as empty.
func (s *Server) ReadEvents(ctx context.Context, ref StreamRef, q itx.Query) (itx.Page, error) {
	if err := itx.ValidatePath(ref.Path); err != nil {
		return itx.Page{}, err
	}
	if err := normalizeQuery(&q); err != nil {
		return itx.Page{}, err
	}
	a, err := s.acquire(ctx, ref)
	if err != nil {
		if itx.ErrorCode(err) == itx.EResourceExhausted && q.Subscription == "" {
			return s.readWhileFull(ctx, ref, q, err)
		}
		return itx.Page{}, err
	}
	defer s.release(a)
	return s.readPage(ctx, ref.ProjectID, a.view(), q)
}

// readPage reads one page from a snapshot of a stream of project; the head is taken before the
// rows, so every returned offset is at most StreamMaxOffset.
func (s *Server) readPage(ctx context.Context, project string, v view, q itx.Query) (itx.Page, error) {
	if q.Subscription != "" {
		return s.readPageAs(ctx, project, v, q)
	}
	var events func(context.Context, storage.Query) ([]itx.Event, error)
	if v.store != nil {
		events = v.store.Events
	}
	return s.readRange(ctx, events, v.streamID, v.head, q)
}

// readRange reads one page of q from events (nil: the stream has no store yet) for a stream at
// head.
func (s *Server) readRange(ctx context.Context, read func(context.Context, storage.Query) ([]itx.Event, error), streamID string, head int64, q itx.Query) (itx.Page, error) {
	page := itx.Page{StreamID: streamID, StreamMaxOffset: head, NextAfter: q.After}
	upTo := head
	if q.Before > 0 && q.Before-1 < upTo {
		upTo = q.Before - 1
	}
	if read == nil || q.After >= upTo {
		page.NextAfter = max(q.After, upTo)
		return page, nil
	}
	sq := storage.Query{After: q.After, UpTo: upTo, Limit: q.Limit, MaxBytes: itx.MaxPageBytes, Types: q.Types, IncludeEphemeral: q.IncludeEphemeral}
	events, err := read(ctx, sq)
	if err != nil {
		return itx.Page{}, s.readFailure(streamID, err)
	}
	page.Events = events
	if sq.Cut(events) { // full, or cut by size: the next page starts after its last event
		page.NextAfter = events[len(events)-1].Offset
	} else {
		page.NextAfter = upTo
	}
	s.metrics.ReadEvents.Add(float64(len(events)))
	return page, nil
}

// readPageAs reads one page as the subscription q.Subscription is delivered (seed 000: a
// processor's announced consumes compose with its subscription's filter, wherever it is placed):
// its filter types and condition on top of q.Types, no ephemeral event. NextAfter passes what
// the filter drops, so the reader's cursor is a watermark as the subscription's is. A condition
// that fails on an event ends the page before it; failing on the page's first event, the read
// fails with the error, as a delivery of that event would. The condition is evaluated in the
// turn of project, the stream's (jsonataTurns), as the subscription's deliveries are: in a turn
// of no project, one project's pages read with a heavy condition put every other project's
// such pages behind all of theirs, and filled that turn's share of the waiting room for them.
func (s *Server) readPageAs(ctx context.Context, project string, v view, q itx.Query) (itx.Page, error) {
	entry, err := v.core.existing(q.Subscription)
	if err != nil {
		return itx.Page{}, err
	}
	q.Subscription, q.IncludeEphemeral = "", false
	var cond *jsonataRef
	if f := entry.Config.Filter; f != nil {
		types, none := intersectTypes(q.Types, f.EventTypes)
		if none {
			upTo := v.head
			if q.Before > 0 && q.Before-1 < upTo {
				upTo = q.Before - 1
			}
			return itx.Page{StreamID: v.streamID, StreamMaxOffset: v.head, NextAfter: max(q.After, upTo)}, nil
		}
		q.Types = types
		if f.JSONataCondition != "" {
			if cond, err = newJSONataRef(f.JSONataCondition, project); err != nil {
				return itx.Page{}, itx.Errorf(itx.EFailedPrecondition, "subscription %q: the filter condition no longer compiles: %s", entry.Config.Name, itx.ErrorMessage(err))
			}
			defer cond.release()
		}
	}
	page, err := s.readPage(ctx, project, v, q)
	if err != nil || cond == nil {
		return page, err
	}
	kept := page.Events[:0:0]
	for i := range page.Events {
		e := &page.Events[i]
		// The condition sees the event as the subscription's deliveries do (under its scope, a
		// webhook's credentials redacted), never as stored: a reader paging by a condition it
		// configured must not learn, one event kept or dropped at a time, what it cannot read.
		shown := *e
		if v, changed := itx.ScopedEvent(entry.Config.Scope, shown); changed {
			shown = v
		}
		if v, changed := itx.RedactedEvent(shown); changed {
			shown = v
		}
		ok, err := cond.holds(&shown)
		if err != nil {
			if e.Offset-1 <= q.After && errors.Is(err, errJSONataBusy) {
				return itx.Page{}, err // the server's overload: unavailable, try again
			}
			if e.Offset-1 <= q.After {
				return itx.Page{}, itx.Errorf(itx.EInvalid, "subscription %q: filter condition failed on offset %d: %s", entry.Config.Name, e.Offset, itx.ErrorMessage(err))
			}
			page.NextAfter = e.Offset - 1
			break
		}
		if ok {
			kept = append(kept, *e)
		}
	}
	page.Events = kept
	return page, nil
}

// intersectTypes is the type filter passing what both filters pass (nil: every type); none says
// that no type passes both.
func intersectTypes(a, b []string) (types []string, none bool) {
	sa, sb := typeSet(a), typeSet(b)
	switch { // a nil set passes every type (its list may hold "*", which no event has)
	case sa == nil && sb == nil:
		return nil, false
	case sa == nil:
		return b, false
	case sb == nil:
		return a, false
	}
	for t := range sa {
		if sb[t] {
			types = append(types, t)
		}
	}
	sort.Strings(types)
	return types, len(types) == 0
}

// WaitForEvent returns the first event after `after` that matches pred, waiting for new commits
// until timeout (0: itx.DefaultWaitTimeout). It is a one-shot, in-memory barrier.
func (s *Server) WaitForEvent(ctx context.Context, ref StreamRef, pred itx.Predicate, after int64, timeout time.Duration) (itx.Event, error) {
	return s.WaitForEventAs(ctx, ref, pred, after, timeout, nil)
}

// WaitForEventAs is WaitForEvent for a caller that reads events through view (nil: as stored):
// the predicate is matched against, and the event returned as, what view makes of each event,
// so a predicate cannot find what the caller would not be shown.
func (s *Server) WaitForEventAs(ctx context.Context, ref StreamRef, pred itx.Predicate, after int64, timeout time.Duration, view func(itx.Event) itx.Event) (itx.Event, error) {
	if err := itx.ValidatePath(ref.Path); err != nil {
		return itx.Event{}, err
	}
	compiled, err := compilePredicate(pred)
	if err != nil {
		return itx.Event{}, err
	}
	defer compiled.where.release()
	if compiled.where != nil {
		compiled.where.project = ref.ProjectID
	}
	if timeout, err = waitTimeout(timeout); err != nil {
		return itx.Event{}, err
	}
	if after < 0 {
		return itx.Event{}, itx.Errorf(itx.EInvalid, "after must not be negative")
	}
	a, err := s.acquire(ctx, ref)
	if err != nil {
		return itx.Event{}, err
	}
	defer s.release(a)
	headAtCall := a.view().head
	if after > headAtCall {
		return itx.Event{}, itx.Errorf(itx.EInvalid, "after %d is beyond the stream's head offset %d", after, headAtCall)
	}

	expired := make(chan struct{})
	timer := s.clock.AfterFunc(timeout, func() { close(expired) })
	defer timer.Stop()

	// Ephemeral events appended while the call waits always match, as on a live connection;
	// includeEphemeral asks for the ones already buffered when it started too.
	q := itx.Query{After: after, Limit: itx.MaxPageLimit, IncludeEphemeral: true}
	var seen int
	var recent []string
	for {
		// Take the change signal before reading, so a commit between the read and the wait
		// still wakes us.
		v := a.view()
		page, err := s.readPage(ctx, ref.ProjectID, v, q)
		if err != nil {
			return itx.Event{}, err
		}
		for _, e := range page.Events {
			// Each match may cost up to a JSONata evaluation: the deadline holds per event,
			// not per page of 500.
			select {
			case <-expired:
				return itx.Event{}, itx.Errorf(itx.EDeadlineExceeded, "timed out after %dms scanning for a matching event (saw %d events)", timeout.Milliseconds(), seen)
			case <-ctx.Done():
				return itx.Event{}, itx.Errorf(itx.ECancelled, "waitForEvent: %v", ctx.Err())
			default:
			}
			if e.Ephemeral && e.Offset <= headAtCall && !pred.IncludeEphemeral {
				continue
			}
			if view != nil {
				e = view(e)
			}
			ok, err := compiled.match(&e)
			if err != nil {
				return itx.Event{}, err
			}
			if ok {
				return e, nil
			}
			seen++
			if recent = append(recent, e.Type); len(recent) > 20 {
				recent = recent[1:]
			}
		}
		q.After = page.NextAfter
		// Catching up on the log (the next page is already there) is bounded by the same
		// timeout as waiting for new events: a long log and an expensive predicate must not
		// keep one call scanning for longer than it asked to wait.
		var more chan struct{}
		if q.After < v.head {
			more = closedChan
		}
		select {
		case <-more:
			select { // a page is ready, but time may be up
			case <-expired:
			case <-ctx.Done():
			default:
				continue
			}
		case <-v.changed:
			continue
		case <-expired:
		case <-ctx.Done():
		case <-a.dctx.Done():
			return itx.Event{}, a.ended()
		}
		if ctx.Err() != nil {
			return itx.Event{}, itx.Errorf(itx.ECancelled, "waitForEvent: %v", ctx.Err())
		}
		types := strings.Join(recent, ", ")
		if types == "" {
			types = "none"
		}
		return itx.Event{}, itx.Errorf(itx.EDeadlineExceeded,
			"timed out after %dms waiting for a matching event (saw %d events; recent types: %s)", timeout.Milliseconds(), seen, types)
	}
}

// closedChan is always ready.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func waitTimeout(d time.Duration) (time.Duration, error) {
	switch {
	case d < 0:
		return 0, itx.Errorf(itx.EInvalid, "timeout must not be negative")
	case d == 0:
		return itx.DefaultWaitTimeout, nil
	case d > itx.MaxWaitTimeout:
		return 0, itx.Errorf(itx.EInvalid, "timeout must be at most %s", itx.MaxWaitTimeout)
	}
	return d, nil
}

// Describe describes one stream (loading it).
func (s *Server) Describe(ctx context.Context, ref StreamRef) (itx.StreamInfo, error) {
	if err := itx.ValidatePath(ref.Path); err != nil {
		return itx.StreamInfo{}, err
	}
	a, err := s.acquire(ctx, ref)
	if err != nil {
		if itx.ErrorCode(err) == itx.EResourceExhausted {
			return s.describeWhileFull(ctx, ref, err)
		}
		return itx.StreamInfo{}, err
	}
	defer s.release(a)
	return s.describeLoaded(a)
}

// describeLoaded describes a loaded stream.
func (s *Server) describeLoaded(a *actor) (itx.StreamInfo, error) {
	return describeView(a.ref, a.view(), true), nil
}

// describeView describes a stream from a view of its state.
func describeView(ref StreamRef, v view, loaded bool) itx.StreamInfo {
	if v.streamID == "" {
		// No first commit yet: no stream, so none loaded either (its database is not held
		// open, and Streams.list does not show it), whatever actor answered.
		return itx.StreamInfo{Path: ref.Path}
	}
	info := itx.StreamInfo{Path: ref.Path, StreamID: v.streamID, HeadOffset: v.head, CreatedAt: v.info.createdAt,
		LastAppendAt: v.info.lastAppendAt, TrimmedThrough: v.info.trimmed, Loaded: loaded,
		RetentionMaxAgeMs: v.info.retention.MaxAgeMs, RetentionMaxEvents: v.info.retention.MaxEvents,
		RetentionMaxBytes: v.info.retention.MaxBytes}
	standing(v.head, v.core.Subscriptions, valueRow(v.rows), v.readers).setIn(&info)
	return info
}

// summaryInfo is an unloaded stream as its directory summary shows it.
func summaryInfo(e *storage.StreamEntry) itx.StreamInfo {
	info := itx.StreamInfo{Path: e.Path, StreamID: e.StreamID, HeadOffset: e.HeadOffset, CreatedAt: e.CreatedAt,
		LastAppendAt: e.LastAppendAt}
	summaryStanding(e).setIn(&info)
	return info
}

// DiskUsageUnder is ListStreamsUnder's page with each stream's files' size read now.
func (s *Server) DiskUsageUnder(ctx context.Context, projectID, scope, prefix, after string, limit int) ([]itx.StreamDiskUsage, string, error) {
	page, next, err := s.ListStreamsUnder(ctx, projectID, scope, prefix, after, limit)
	if err != nil {
		return nil, "", err
	}
	out := make([]itx.StreamDiskUsage, len(page))
	for i, info := range page {
		out[i] = itx.StreamDiskUsage{Path: info.Path, StreamID: info.StreamID, HeadOffset: info.HeadOffset,
			DiskBytes: s.backend.DiskBytes(info.StreamID)}
	}
	return out, next, nil
}

// DefaultListStreams and MaxListStreams bound one page of Streams.list.
const (
	DefaultListStreams = 1_000
	MaxListStreams     = 10_000
)

// ListLimit is the page size of a listing asked for limit: 0 is def, and one past max (or
// negative) is refused with invalidArgument. A caller that answers some pages without asking
// the server (an empty one outside a token's scope, a project admin's own project) checks the
// limit with it first, so every caller is refused alike.
func ListLimit(limit, def, max int) (int, error) {
	switch {
	case limit == 0:
		return def, nil
	case limit < 0 || limit > max:
		return 0, itx.Errorf(itx.EInvalid, "limit must be between 1 and %d (0: %d)", max, def)
	}
	return limit, nil
}

// ListStreams lists a page of a project's streams under a path prefix, after the path after,
// without loading them: heads of loaded streams are live, the others come from the directory's
// summary. next is the page's last path when more follow, empty on the last page.
func (s *Server) ListStreams(ctx context.Context, projectID, prefix, after string, limit int) (page []itx.StreamInfo, next string, err error) {
	return s.ListStreamsUnder(ctx, projectID, "", prefix, after, limit)
}

// ListStreamsUnder is ListStreams for a capability scoped to the path scope: only streams at or
// under it are read, so neither the page nor its nextAfter names one outside it.
func (s *Server) ListStreamsUnder(ctx context.Context, projectID, scope, prefix, after string, limit int) (page []itx.StreamInfo, next string, err error) {
	if err := itx.ValidatePathPrefix(prefix); err != nil {
		return nil, "", err
	}
	if limit, err = ListLimit(limit, DefaultListStreams, MaxListStreams); err != nil {
		return nil, "", err
	}
	// The streams loaded or unloading are taken before the directory is read: each answers from
	// its actor's view below, and a stream whose unload finished before this has its summary in
	// the directory already. The other way round, an unload finishing in between (its actor
	// gone from both sets, its summary written after the read) would list the summary from
	// before its load: an older head, or no stream at all.
	type held struct{ loaded, unloading *actor }
	s.mu.Lock()
	actors := map[string]held{}
	under := func(ref StreamRef) bool {
		return ref.ProjectID == projectID && strings.HasPrefix(ref.Path, scope) && strings.HasPrefix(ref.Path, prefix)
	}
	for ref, a := range s.actors {
		if under(ref) {
			actors[ref.Path] = held{loaded: a}
		}
	}
	for ref, a := range s.unloading {
		if under(ref) {
			h := actors[ref.Path]
			h.unloading = a
			actors[ref.Path] = h
		}
	}
	s.mu.Unlock()
	entries, err := s.dir.ListStreamsUnder(ctx, projectID, scope, prefix, after, limit+1)
	if err != nil {
		return nil, "", itx.Errorf(itx.EInternal, "%v", err)
	}
	if len(entries) > limit {
		entries = entries[:limit]
		next = entries[limit-1].Path
	}
	out := make([]itx.StreamInfo, 0, len(entries))
	for _, e := range entries {
		info := summaryInfo(&e)
		born := e.Born
		h := actors[e.Path]
		a := h.loaded
		if a != nil && (!isClosed(a.ready) || a.loadErr != nil) {
			a = nil // still loading (after any unload taken above), or failed to
		}
		if a == nil {
			a = h.unloading // its last view: the summary it is writing
		}
		if a != nil {
			v := a.view()
			info.HeadOffset, info.LastAppendAt, info.Loaded = v.head, v.info.lastAppendAt, a == h.loaded
			standing(v.head, v.core.Subscriptions, valueRow(v.rows), v.readers).setIn(&info)
			born = v.streamID != ""
		}
		if !born {
			// A creation whose first commit has not landed (in flight, or failed): the stream
			// does not exist yet, as describe says. One whose first commit registered a reader
			// exists at head 0.
			continue
		}
		if why, ok := s.damaged.Load(e.StreamID); ok {
			info.Unavailable = why.(string)
		}
		out = append(out, info)
	}
	return out, next, nil
}
