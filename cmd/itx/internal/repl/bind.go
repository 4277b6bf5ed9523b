package repl

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"time"

	"capnproto.org/go/capnp/v3"
	"github.com/dop251/goja"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
)

// A binding is the JavaScript side of one schema method. Navigation steps (a method whose
// result is one capability, such as Streams.get or Stream.subscriptions) need no entry: they
// are bound from the schema through navigators. Everything else is a terminal call here.
type binding struct {
	usage string // how to call it from JavaScript, for .help
	call  func(ctx context.Context, s *Session, c capnp.Client, p capPath, args []goja.Value) (any, error)
}

// run calls the binding. A Go runtime fault in it (a nil dereference, an index out of range:
// a bug) becomes an internal error the script can catch, instead of unwinding through the
// JavaScript runtime; a thrown JavaScript value passes through.
func (b binding) run(ctx context.Context, s *Session, c capnp.Client, p capPath, args []goja.Value) (v any, err error) {
	defer func() {
		if x := recover(); x != nil {
			if _, fault := x.(runtime.Error); !fault {
				panic(x)
			}
			v, err = nil, panicError(x)
		}
	}()
	if name, _, ok := strings.Cut(b.usage, "()"); ok && !strings.ContainsAny(name, "( ") {
		// A method that takes nothing refuses what it is given, as an unknown option is
		// refused: list("mirror") must not list every subscription as if it had filtered.
		for _, a := range args {
			if !isAbsent(a) {
				return nil, itx.Errorf(itx.EInvalid, "%s.%s: takes no arguments, got %s", p.iface, name, describeValue(a))
			}
		}
	}
	return b.call(ctx, s, c, p, args)
}

// bindings covers every method of the bound interfaces that is not a navigation step; a test
// checks the two together against the schema.
var bindings = map[string]map[string]binding{
	"Project": {
		"describe": {"describe() -> {id, name, deployment}", projectDescribe},
	},
	"Streams": {
		"list":      {"list(prefix?, after?, limit?) or list({prefix, after, limit}) -> [{path, streamId, headOffset, ...}] (every page unless limit is given)", streamsList},
		"diskUsage": {"diskUsage(prefix?) or diskUsage({prefix}) -> [{path, streamId, diskBytes, size, headOffset}] (every stream under prefix with its files' size on disk, largest first; itx du)", streamsDiskUsage},
		"remove":    {"remove(path, force?) or remove({path, force}) -> {streamId, headOffset} (deletes the stream for good, the admin right; force: also while it has subscriptions, registered readers or open connections)", streamsRemove},
	},
	"Stream": {
		"append":                {"append(event | [events], {expectedHeadOffset, conditional}?) -> {offsets, duplicate, headOffset, streamId} (an expectedHeadOffset makes it conditional: offsetConflict unless the head is that offset; conditional: true alone expects an empty stream, false turns it off)", streamAppend},
		"getEvents":             {"getEvents(after?, limit?) or getEvents({after, before, limit, types, includeEphemeral, subscription, all}) -> [events] (one page of at most 500 events or 4 MiB; all: true reads every page; afterOffset, beforeOffset and eventTypes, the TypeScript surface's names, are taken too)", streamGetEvents},
		"getEventPage":          {"getEventPage(after?, limit?) or getEventPage({after, before, limit, types, includeEphemeral, subscription}) -> {events, streamId, streamMaxOffset, nextAfter} (afterOffset, beforeOffset and eventTypes are taken too)", streamGetEventPage},
		"waitForEvent":          {"waitForEvent(types?, after?, timeoutMs?) or waitForEvent({types, payloadContains, where, after, timeoutMs, includeEphemeral}) -> event (afterOffset and eventTypes are taken too)", streamWaitForEvent},
		"describe":              {"describe() -> {path, streamId, headOffset, createdAt, ...}", streamDescribe},
		"setSubscriptionCursor": {"setSubscriptionCursor(name, afterOffset) or setSubscriptionCursor({name, afterOffset}) -> {offset}", streamSetSubscriptionCursor},
		"resumeSubscription":    {"resumeSubscription(name) or resumeSubscription({name}) -> {offset}", streamResumeSubscription},
		"openConnection":        {"openConnection(after?) or openConnection({after, types, maxDeliveryEvents, maxDeliveryBytes, noState (or state: false), openedBy, key, includeEphemeral, expectedStreamId}) -> connection {take(min?, timeoutMs?), ping(), key(), close(reason)} (the TypeScript surface's replayAfterOffset or afterOffset, eventTypes or filter: {eventTypes}, connectionKey, and openedBy: {description} are taken too)", streamOpenConnection},
		"liveState":             {"liveState() -> live view {snapshot(), patches(min?, timeoutMs?), cancel()} (returns once the first snapshot is in)", streamLiveState},
		"schedule":              {"schedule(event, dueAt) or schedule({event, dueAt}) -> {dueAt, appendedOffset?} (dueAt null when the key is already in the log at appendedOffset; a durable timer: event, with its idempotencyKey, is appended at dueAt: a Date, an ISO-8601 time, epoch ms or a duration from now like \"10m\")", streamSchedule},
		"cancelScheduled":       {"cancelScheduled(key) or cancelScheduled({key}) -> {cancelled}", streamCancelScheduled},
		"listScheduled":         {"listScheduled() -> [{dueAt, type, idempotencyKey, payload}]", streamListScheduled},
		"setRetention":          {"setRetention({maxAge, maxEvents, maxBytes}) (the admin right: the stream keeps this policy and trims itself as trim does: events older than maxAge (\"30d\", \"12h\" or ms), more than maxEvents offsets below the head, and the oldest while its events come to more than maxBytes (\"10GiB\" or bytes) go, when it loads and at most once a minute while appended to; {} clears it; describe() shows it)", streamSetRetention},
		"trim":                  {"trim(throughOffset) or trim({throughOffset, createdBefore}) -> {trimmedThrough, deleted} (retention, the admin right: deletes the events through the offset and/or created before the time (\"30d\" ago, a Date, an ISO-8601 time, epoch ms) for good, its stream/* records kept, never past what its subscriptions confirmed, its readers' checkpoints and its open connections delivered; the deleted events' idempotency keys are forgotten)", streamTrim},
	},
	"Subscriptions": {
		"list":      {"list() -> [{name, kind, status, confirmedOffset, deliveredOffset, lag, lastError, configuredAtOffset}]", subscriptionsList},
		"configure": {"configure(name, receiver, {...}?) or configure({name, receiver, filterTypes, filterCondition, transform, start, onFailingEvent, deadLetterPath, description, idempotencyKey, maxDeliveryEvents, maxDeliveryBytes, confirmWindow}) -> {name, offset} (receiver: {type: \"webhook-post\", url, headers, secret}, {type: \"copy-to-stream\", path}, {type: \"itx-call\", capability} (the name a client mounted its Receiver under) or {type: \"processor-wake\", placement, processor}; start: \"beginning\", the default, includes the stream's own stream/* records; deadLetterPath (onFailingEvent \"skip\") lands each skipped event in that stream as an itx.dead-letter event; a nameless configure needs an idempotencyKey (its retry returns the first) and is named subscription:<offset>; maxDeliveryEvents/maxDeliveryBytes narrow each delivery of a push receiver; a processor-wake receiver's processor runs another contract under this name; confirmWindow (itx-call, webhook-post) makes it offset-acking: an answer marks a batch delivered and confirms only the offset it names, subscription.confirm(offset) confirms later, and at most confirmWindow events are out unconfirmed; the configured event's own shape, as itxd stores it, is taken too, so a payload read back configures again: filter: {eventTypes, jsonataCondition}, receiver: {action, receivingStreamPath, jsonataTransform, delivery: {start, onFailingEvent, deadLetterPath}}, a field given under both its names must say the same)", subscriptionsConfigure},
		"remove":    {"remove(name) or remove({name}) -> {offset}", subscriptionsRemove},
	},
	"Subscription": {
		"describe":           {"describe() -> {config, secretSet, kind, status, confirmedOffset, ...}", subscriptionDescribe},
		"waitUntilProcessed": {"waitUntilProcessed(offset, timeoutMs?) or waitUntilProcessed({offset, timeoutMs}) -> {confirmedOffset}", subscriptionWaitUntilProcessed},
		"confirm":            {"confirm(offset) or confirm({offset}) -> {confirmedOffset} (an offset-acking subscription: confirms what its receiver made durable, at most deliveredOffset)", subscriptionConfirm},
	},
	"Capabilities": {
		"list":    {"list() -> [{name, mountedAt, scope}]", capabilitiesList},
		"unmount": {"unmount(name) or unmount({name})", capabilitiesUnmount},
		"mount":   {"mount(name) or mount({name}) -> receiver {take(min?, timeoutMs?), unmount()} (serves a Receiver under name for itx-call subscriptions, {type: \"itx-call\", capability: name}: each batch they deliver is confirmed as it arrives (an offset-acking one's, confirmWindow, only delivered: subscription.confirm(offset) confirms it) and held for take() -> {batches: [{path, subscription, events, ...}]}; unmount() or leaving itx unmounts it, which parks them)", capabilitiesMount},
	},
	"ProcessorHosts": {
		"list":  {"list() -> [{name, mountedAt, scope, contracts: [{name, reducerVersion, consumedTypes}]}]", processorHostsList},
		"mount": {"mount(name, host): not available here (a ProcessorHost is served by an SDK client)", mountUnavailable},
	},
	"Readers": {
		"register": {"register(name, checkpoint) or register({name, checkpoint})", readersRegister},
		"list":     {"list() -> [{name, checkpoint, lag, updatedAt}]", readersList},
		"remove":   {"remove(name) or remove({name})", readersRemove},
	},
	"Processor": {
		"snapshot":        {"snapshot() -> {state, reducedOffset, processedOffset, offset} (offset: reducedOffset, the TypeScript surface's name)", processorSnapshot},
		"getRuntimeState": {"getRuntimeState() -> state", processorRuntimeState},
		"liveState":       {"liveState() -> live view {snapshot(), patches(min?, timeoutMs?), cancel()} (returns once the first snapshot is in)", processorLiveState},
	},
}

// proxy builds the JavaScript object for the capability at p. Navigation members send their
// pipelined call when they are evaluated and return another proxy; terminal members wait.
func (s *Session) proxy(p capPath) *goja.Object {
	vm := s.vm
	// A function object: navigation reads as the schema writes it, both as a property
	// (stream.readOnly) and called (stream.readOnly(), project.streams()), the call giving back
	// the capability itself.
	var self *goja.Object
	obj := vm.ToValue(func(goja.FunctionCall) goja.Value { return self }).(*goja.Object)
	obj.DefineDataPropertySymbol(s.capSym, vm.ToValue(&p), goja.FLAG_FALSE, goja.FLAG_FALSE, goja.FLAG_FALSE)
	hidden := func(name string, fn func(goja.FunctionCall) goja.Value) {
		obj.DefineDataProperty(name, s.method(name, fn), goja.FLAG_FALSE, goja.FLAG_FALSE, goja.FLAG_FALSE)
	}
	label := p.label()
	hidden("toString", func(goja.FunctionCall) goja.Value { return vm.ToValue(label) })
	hidden("toJSON", func(goja.FunctionCall) goja.Value { return vm.ToValue(label) })
	switch p.iface {
	case "Stream":
		obj.DefineDataProperty("path", vm.ToValue(p.steps[len(p.steps)-1].arg), goja.FLAG_FALSE, goja.FLAG_FALSE, goja.FLAG_TRUE)
	case "Subscription":
		obj.DefineDataProperty("name", vm.ToValue(p.steps[len(p.steps)-1].arg), goja.FLAG_FALSE, goja.FLAG_FALSE, goja.FLAG_TRUE)
	}
	ifc := s.ifcs[p.iface]
	for _, m := range ifc.Methods {
		if b, ok := bindings[p.iface][m.Name]; ok {
			hidden(m.Name, func(call goja.FunctionCall) goja.Value { return s.invoke(p, b, call.Arguments) })
			continue
		}
		if _, ok := navigators[p.iface+"."+m.Name]; !ok {
			continue // a test keeps this from happening
		}
		if m.Property {
			getter := vm.ToValue(func(goja.FunctionCall) goja.Value {
				return s.navigate(p.child(m.Returns, m.Name, ""))
			})
			obj.DefineAccessorProperty(m.Name, getter, nil, goja.FLAG_FALSE, goja.FLAG_FALSE)
			continue
		}
		hidden(m.Name, func(call goja.FunctionCall) goja.Value {
			key := "name"
			if len(m.Params) == 1 {
				key = m.Params[0]
			}
			arg, err := s.stringArg(p.iface+"."+m.Name, call.Arguments, 0, key)
			if err != nil {
				panic(s.throw(err))
			}
			return s.navigate(p.child(m.Returns, m.Name, arg))
		})
	}
	for _, m := range promptMethods[p.iface] {
		hidden(m.name, func(call goja.FunctionCall) goja.Value { return s.invoke(p, m.binding, call.Arguments) })
	}
	self = s.strictMembers(obj, p.iface)
	return self
}

// promptMethods are methods the prompt gives a capability's object beyond its schema
// interface's.
var promptMethods = map[string][]struct {
	name string
	binding
}{
	"Processor": {{"waitUntilProcessed", binding{"waitUntilProcessed(offset, timeoutMs?) or waitUntilProcessed({offset, timeoutMs}) -> {confirmedOffset} (its subscription's barrier, as the TypeScript processor surface has it)", processorWaitUntilProcessed}}},
}

// processorWaitUntilProcessed is the TypeScript processor surface's waitUntilProcessed({offset,
// timeoutMs}): the barrier of the processor-wake subscription p was reached from, which follows
// the processing cursor. Like the processor's own methods, it refuses a subscription of another
// kind (failedPrecondition), which has no processor.
func processorWaitUntilProcessed(ctx context.Context, s *Session, _ capnp.Client, p capPath, args []goja.Value) (any, error) {
	sub := p.parent(s.ifcs)
	c := s.client(sub)
	defer c.Release()
	d, err := client.DescribeSubscription(ctx, schema.Subscription(c))
	if err != nil {
		return nil, err
	}
	if d.Kind != itx.KindProcessorWake {
		return nil, itx.Errorf(itx.EFailedPrecondition, "subscription %q is a %s subscription: only processor-wake subscriptions have a processor", d.Config.Name, d.Kind)
	}
	return subscriptionWaitUntilProcessed(ctx, s, c, sub, args)
}

// invoke calls the method b binds on the capability at p, waiting for its answer: a JavaScript
// value, or a thrown error with the call's code.
func (s *Session) invoke(p capPath, b binding, args []goja.Value) goja.Value {
	if err := s.ensureConnected(s.ctx()); err != nil {
		panic(s.throw(err))
	}
	c := s.client(p)
	defer c.Release()
	v, err := b.run(s.ctx(), s, c, p, args)
	if err != nil {
		panic(s.throw(err))
	}
	if jv, ok := v.(goja.Value); ok {
		return jv
	}
	return s.toJS(v)
}

// method is fn as a JavaScript function named name, so a.describe read without calling it
// prints as [Function describe], not as the Go closure behind it.
func (s *Session) method(name string, fn func(goja.FunctionCall) goja.Value) goja.Value {
	f := s.vm.ToValue(fn).(*goja.Object)
	f.DefineDataProperty("name", s.vm.ToValue(name), goja.FLAG_FALSE, goja.FLAG_FALSE, goja.FLAG_TRUE)
	return f
}

// strictMembers wraps a capability's object so that reading a member it does not have throws
// a TypeError naming the interface and the member: a.subscription.get("x") says that Stream
// has no member 'subscription' instead of "Cannot read property 'get' of undefined", and
// a.subscription alone is no silent undefined. What the object or its prototype has (toString,
// hasOwnProperty, a value the script set on it) reads as usual, and "then" is undefined, so a
// promise resolved with a capability takes it as a value. Outside an evaluation (itx itself
// describing a thrown capability, printing a result) a missing member is only missing: a
// TypeError thrown there would escape the runtime.
func (s *Session) strictMembers(obj *goja.Object, iface string) *goja.Object {
	vm := s.vm
	proxy := vm.NewProxy(obj, &goja.ProxyTrapConfig{
		Get: func(target *goja.Object, property string, receiver goja.Value) goja.Value {
			if v := target.Get(property); v != nil || property == "then" || !s.evaluating.Load() {
				return v
			}
			hint := ""
			var names []string
			for _, n := range s.members(iface) {
				names = append(names, strings.TrimSuffix(n, "("))
			}
			if guess := nearest(property, names); guess != "" {
				hint = "did you mean " + guess + "? "
			}
			panic(vm.NewTypeError("%s has no member '%s' (%s.help %s lists its methods)", iface, property, hint, iface))
		},
	})
	return vm.ToValue(proxy).(*goja.Object)
}

// navigate sends the pipelined call that reaches p (nothing waits for it) and returns p's proxy.
func (s *Session) navigate(p capPath) goja.Value {
	if err := s.ensureConnected(s.ctx()); err != nil {
		panic(s.throw(err))
	}
	s.client(p).Release()
	return s.proxy(p)
}

// capabilityOf returns the path of a proxy, if v is one.
func (s *Session) capabilityOf(v goja.Value) (*capPath, bool) {
	obj, ok := v.(*goja.Object)
	if !ok {
		return nil, false
	}
	v = obj.GetSymbol(s.capSym)
	if v == nil {
		return nil, false
	}
	p, ok := v.Export().(*capPath)
	return p, ok
}

// setLabel makes obj (a connection, a live view, a mounted receiver: objects the prompt makes,
// not capability proxies) print as label, as a capability prints as its path: [Connection /a],
// not the JSON string "[Connection /a]".
func (s *Session) setLabel(obj *goja.Object, label string) {
	vm := s.vm
	obj.Set("toString", s.method("toString", func(goja.FunctionCall) goja.Value { return vm.ToValue(label) }))
	obj.Set("toJSON", s.method("toJSON", func(goja.FunctionCall) goja.Value { return vm.ToValue(label) }))
	obj.DefineDataPropertySymbol(s.labelSym, vm.ToValue(label), goja.FLAG_FALSE, goja.FLAG_FALSE, goja.FLAG_FALSE)
}

// labelOf returns the label setLabel gave v, if it gave one.
func (s *Session) labelOf(v goja.Value) (string, bool) {
	obj, ok := v.(*goja.Object)
	if !ok {
		return "", false
	}
	l := obj.GetSymbol(s.labelSym)
	if l == nil {
		return "", false
	}
	label, ok := l.Export().(string)
	return label, ok
}

// isCapability reports whether v is a capability's proxy.
func (s *Session) isCapability(v goja.Value) bool {
	_, ok := s.capabilityOf(v)
	return ok
}

// rawJSON embeds JSON text as a value; text that is not JSON becomes a string.
func rawJSON(text string) json.RawMessage {
	if text == "" {
		return nil
	}
	if json.Valid([]byte(text)) {
		return json.RawMessage(text)
	}
	b, _ := json.Marshal(text)
	return b
}

// --- result shapes (field order is print order) ---

// msTime is a time the server sends as epoch milliseconds. itx shows every time the same way,
// as an ISO-8601 string in UTC (2026-12-01T16:25:40.123Z), which new Date() reads back; 0
// (not set) is null.
type msTime int64

func (t msTime) MarshalJSON() ([]byte, error) {
	if t == 0 {
		return []byte("null"), nil
	}
	return json.Marshal(isoTime(time.UnixMilli(int64(t))))
}

// dueTime is a time that is always one, as a scheduled append's dueAt: 0 is the epoch, not
// "none" as for msTime.
type dueTime int64

func (t dueTime) MarshalJSON() ([]byte, error) {
	return json.Marshal(isoTime(time.UnixMilli(int64(t))))
}

// textTime is a time the server sends as text (SQLite's "2006-01-02 15:04:05" or RFC 3339),
// shown like msTime.
type textTime string

func (t textTime) MarshalJSON() ([]byte, error) {
	if t == "" {
		return []byte("null"), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02 15:04:05.999999999", "2006-01-02T15:04:05.999999999"} {
		if at, err := time.Parse(layout, string(t)); err == nil {
			return json.Marshal(isoTime(at))
		}
	}
	return json.Marshal(string(t))
}

func isoTime(at time.Time) string { return at.UTC().Format("2006-01-02T15:04:05.000Z07:00") }

type eventJS struct {
	Offset         int64           `json:"offset"`
	Type           string          `json:"type"`
	Payload        json.RawMessage `json:"payload"`
	CreatedAt      msTime          `json:"createdAt"`
	IdempotencyKey string          `json:"idempotencyKey,omitempty"`
	Metadata       json.RawMessage `json:"metadata,omitempty"`
	Ephemeral      bool            `json:"ephemeral,omitempty"`
	Provenance     []itx.Hop       `json:"provenance,omitempty"`
}

func eventsJS(events []itx.Event) []eventJS {
	out := make([]eventJS, len(events))
	for i, e := range events {
		out[i] = eventJS{Offset: e.Offset, Type: e.Type, Payload: rawJSON(string(e.Payload)), CreatedAt: msTime(e.CreatedAt),
			IdempotencyKey: e.IdempotencyKey, Metadata: rawJSON(string(e.Metadata)), Ephemeral: e.Ephemeral, Provenance: e.Provenance}
		if out[i].Payload == nil {
			out[i].Payload = json.RawMessage("{}")
		}
	}
	return out
}

type streamInfoJS struct {
	Path              string `json:"path"`
	StreamID          string `json:"streamId"`
	HeadOffset        int64  `json:"headOffset"`
	CreatedAt         msTime `json:"createdAt"`
	LastAppendAt      msTime `json:"lastAppendAt"`
	SubscriptionCount int    `json:"subscriptionCount"`
	// Where the stream's consumers stand (as of its last unload when not loaded).
	HaltedSubscriptions int   `json:"haltedSubscriptions"`
	ParkedSubscriptions int   `json:"parkedSubscriptions"`
	MaxLag              int64 `json:"maxLag"`
	ReaderCount         int   `json:"readerCount"`
	Loaded              bool  `json:"loaded"`
	// Stream.trim's reach and setRetention's policy: shown by describe once set.
	TrimmedThrough     int64 `json:"trimmedThrough,omitempty"`
	RetentionMaxAgeMs  int64 `json:"retentionMaxAgeMs,omitempty"`
	RetentionMaxEvents int64 `json:"retentionMaxEvents,omitempty"`
	RetentionMaxBytes  int64 `json:"retentionMaxBytes,omitempty"`
	// Why itxd cannot serve the stream from its database (lost, damaged): shown by list then.
	Unavailable string `json:"unavailable,omitempty"`
}

func streamInfoOf(i itx.StreamInfo) streamInfoJS {
	return streamInfoJS{Path: i.Path, StreamID: i.StreamID, HeadOffset: i.HeadOffset, CreatedAt: msTime(i.CreatedAt),
		LastAppendAt: msTime(i.LastAppendAt), SubscriptionCount: i.SubscriptionCount,
		HaltedSubscriptions: i.HaltedSubscriptions, ParkedSubscriptions: i.ParkedSubscriptions, MaxLag: i.MaxLag,
		ReaderCount: i.Readers, Loaded: i.Loaded, TrimmedThrough: i.TrimmedThrough,
		RetentionMaxAgeMs: i.RetentionMaxAgeMs, RetentionMaxEvents: i.RetentionMaxEvents,
		RetentionMaxBytes: i.RetentionMaxBytes, Unavailable: i.Unavailable}
}

type offsetJS struct {
	Offset int64 `json:"offset"`
}

type mountJS struct {
	Name      string              `json:"name"`
	MountedAt msTime              `json:"mountedAt"`
	Contracts []itx.ProcessorInfo `json:"contracts,omitempty"` // a processor host's
	Scope     string              `json:"scope"`               // the mounting session's prefix ("": the whole project's)
}

func mountsJS(ms []itx.MountInfo) []mountJS {
	out := make([]mountJS, len(ms))
	for i, m := range ms {
		out[i] = mountJS{Name: m.Name, MountedAt: msTime(m.MountedAt), Contracts: m.Contracts, Scope: m.Scope}
	}
	return out
}

// --- Project, Streams ---

func projectDescribe(ctx context.Context, s *Session, c capnp.Client, _ capPath, _ []goja.Value) (any, error) {
	info, err := client.DescribeProject(ctx, schema.Project(c))
	if err != nil {
		return nil, err
	}
	return struct {
		ID         string `json:"id"`
		Name       string `json:"name"`
		Deployment bool   `json:"deployment"`
	}{info.ID, info.Name, info.Deployment}, nil
}

func streamsList(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	o, err := s.params("Streams.list", args, []string{"prefix", "after", "limit"}, "prefix", "after", "limit")
	if err != nil {
		return nil, err
	}
	prefix, after, limit := o.str("prefix"), o.str("after"), o.uint("limit")
	if err := o.err(); err != nil {
		return nil, err
	}
	// The pipelined Streams capability is already at hand: list on it directly. With a limit,
	// one page; without, every page after `after`.
	list, err := pages(after, limit, func(after string) ([]itx.StreamInfo, string, error) {
		return client.ListStreamsPage(ctx, schema.Streams(c), prefix, after, int(limit))
	}, func(shown int, next string) {
		s.note("%s shown; more follow: list(%q, %q, %d) for the next page, or leave out the limit for all",
			plural(shown, "stream"), prefix, next, limit)
	})
	if err != nil {
		return nil, err
	}
	out := make([]streamInfoJS, len(list))
	for i, info := range list {
		out[i] = streamInfoOf(info)
	}
	return out, nil
}

func streamsRemove(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	o, err := s.params("Streams.remove", args, []string{"path", "force"}, "path", "force")
	if err != nil {
		return nil, err
	}
	path, force := o.str("path"), o.bool("force")
	if err := o.err(); err != nil {
		return nil, err
	}
	gone, err := client.DeleteStreamIn(ctx, schema.Streams(c), path, force)
	if err != nil {
		return nil, err
	}
	return struct {
		StreamID   string `json:"streamId"`
		HeadOffset int64  `json:"headOffset"`
		Unread     bool   `json:"unread,omitempty"`
	}{gone.StreamID, gone.HeadOffset, gone.Unread}, nil
}

// --- Stream ---

func streamSetRetention(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	if len(args) > 1 {
		return nil, itx.Errorf(itx.EInvalid, "setRetention: takes one options object {maxAge, maxEvents}")
	}
	var v goja.Value
	if len(args) == 1 {
		v = args[0]
	}
	o, err := s.opts("setRetention", v, "maxAge", "maxEvents", "maxBytes")
	if err != nil {
		return nil, err
	}
	var r client.Retention
	if age := o.get("maxAge"); age != nil {
		if r.MaxAge, err = durationArg("setRetention: maxAge", age); err != nil {
			return nil, err
		}
	}
	if b := o.get("maxBytes"); b != nil {
		if r.MaxBytes, err = bytesArg("setRetention: maxBytes", b); err != nil {
			return nil, err
		}
	}
	r.MaxEvents = o.uint("maxEvents")
	if err := o.err(); err != nil {
		return nil, err
	}
	return nil, client.SetRetention(ctx, schema.Stream(c), r)
}

// bytesArg reads a size: a number of bytes, or a string with a unit ("512KiB", "10MiB", "1GiB",
// "2TiB", or the decimal "1GB"; "B" for bytes).
func bytesArg(what string, v goja.Value) (int64, error) {
	if n, ok := toUint(v); ok {
		return n, nil
	}
	if x, ok := v.Export().(string); ok {
		units := []struct {
			suffix string
			scale  int64
		}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}}
		for _, u := range units {
			if num, found := strings.CutSuffix(strings.TrimSpace(x), u.suffix); found {
				n, err := strconv.ParseUint(strings.TrimSpace(num), 10, 63)
				if err == nil && n <= uint64(math.MaxInt64/u.scale) {
					return int64(n) * u.scale, nil
				}
				break
			}
		}
	}
	return 0, itx.Errorf(itx.EInvalid, "%s: expected a size (\"10MiB\", \"1GiB\") or a number of bytes, got %s", what, describeValue(v))
}

// durationArg reads a duration: "30d", a Go duration ("12h", "90m") or milliseconds.
func durationArg(what string, v goja.Value) (time.Duration, error) {
	switch x := v.Export().(type) {
	case int64:
		if x >= 0 {
			return time.Duration(x) * time.Millisecond, nil
		}
	case float64:
		if x >= 0 && x < 9e12 {
			return time.Duration(x) * time.Millisecond, nil
		}
	case string:
		if days, found := strings.CutSuffix(x, "d"); found {
			if n, err := strconv.ParseUint(days, 10, 16); err == nil {
				return time.Duration(n) * 24 * time.Hour, nil
			}
		}
		if d, err := time.ParseDuration(x); err == nil && d >= 0 {
			return d, nil
		}
	}
	return 0, itx.Errorf(itx.EInvalid, "%s: expected a duration (\"30d\", \"12h\") or milliseconds, got %s", what, describeValue(v))
}

func streamTrim(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	o, err := s.params("Stream.trim", args, []string{"throughOffset"}, "throughOffset", "createdBefore")
	if err != nil {
		return nil, err
	}
	through := o.uint("throughOffset")
	if err := o.err(); err != nil {
		return nil, err
	}
	var before time.Time
	if v := o.get("createdBefore"); v != nil {
		if before, err = s.agoArg("trim: createdBefore", v); err != nil {
			return nil, err
		}
	}
	r, err := client.TrimWith(ctx, schema.Stream(c), client.TrimOptions{ThroughOffset: int64(through), CreatedBefore: before})
	if err != nil {
		return nil, err
	}
	return struct {
		TrimmedThrough int64 `json:"trimmedThrough"`
		Deleted        int64 `json:"deleted"`
	}{r.TrimmedThrough, r.Deleted}, nil
}

var eventKeys = []string{"type", "payload", "idempotencyKey", "metadata", "ephemeral"}

func (s *Session) eventInput(what string, v goja.Value) (itx.EventInput, error) {
	o, err := s.opts(what, v, eventKeys...)
	if err != nil {
		return itx.EventInput{}, err
	}
	if isAbsent(v) {
		return itx.EventInput{}, itx.Errorf(itx.EInvalid, "%s: expected an event {type, payload}, got %s", what, describeValue(v))
	}
	in := itx.EventInput{Type: o.str("type"), Payload: o.json("payload"), IdempotencyKey: o.str("idempotencyKey"),
		Metadata: o.json("metadata"), Ephemeral: o.bool("ephemeral")}
	return in, o.err()
}

func streamAppend(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	var inputs []itx.EventInput
	first := arg(args, 0)
	if obj, ok := first.(*goja.Object); ok && obj.ClassName() == "Array" {
		for _, k := range obj.Keys() {
			in, err := s.eventInput("append: event "+k, obj.Get(k))
			if err != nil {
				return nil, err
			}
			inputs = append(inputs, in)
		}
	} else {
		in, err := s.eventInput("append", first)
		if err != nil {
			return nil, err
		}
		inputs = []itx.EventInput{in}
	}
	for _, extra := range args[min(2, len(args)):] {
		if !isAbsent(extra) {
			return nil, itx.Errorf(itx.EInvalid, "append: too many arguments (takes an event or an array of events, then options {expectedHeadOffset, conditional}), got %s after them", describeValue(extra))
		}
	}
	if second, ok := arg(args, 1).(*goja.Object); ok && second.ClassName() == "Object" && !s.isCapability(second) && !isAbsent(second.Get("type")) {
		// TypeScript's append(e1, e2) appends both; here they go as an array.
		return nil, itx.Errorf(itx.EInvalid, `append: the second argument is options {expectedHeadOffset, conditional}, not another event: append several as an array, append([{type: "a"}, {type: "b"}])`)
	}
	o, err := s.opts("append options", arg(args, 1), "expectedHeadOffset", "conditional")
	if err != nil {
		return nil, err
	}
	// An expected head alone asks for a conditional append; conditional, when given, decides,
	// as AppendOptions.Conditional does in Go.
	opts := itx.AppendOptions{Conditional: o.has("expectedHeadOffset"), ExpectedHeadOffset: o.uint("expectedHeadOffset")}
	if o.has("conditional") {
		opts.Conditional = o.bool("conditional")
	}
	if err := o.err(); err != nil {
		return nil, err
	}
	res, err := client.Append(ctx, schema.Stream(c), inputs, opts)
	if err != nil {
		return nil, err
	}
	return struct {
		Offsets    []int64 `json:"offsets"`
		Duplicate  []bool  `json:"duplicate"`
		HeadOffset int64   `json:"headOffset"`
		StreamID   string  `json:"streamId"`
	}{res.Offsets, res.Duplicate, res.HeadOffset, res.StreamID}, nil
}

var queryKeys = []string{"after", "before", "limit", "types", "includeEphemeral", "subscription"}

func (s *Session) query(what string, args []goja.Value, extra ...string) (itx.Query, *options, error) {
	o, err := s.paramsSpelled(what, args, []string{"after", "limit"}, readSpellings, append(queryKeys, extra...)...)
	if err != nil {
		return itx.Query{}, nil, err
	}
	q := itx.Query{After: o.uint("after"), Before: o.uint("before"), Limit: int(o.uint("limit")),
		Types: o.strings("types"), IncludeEphemeral: o.bool("includeEphemeral"), Subscription: o.str("subscription")}
	return q, o, o.err()
}

// queryJS writes q as the options object of a getEvents call ({after: 5, types: ["note"]}),
// for a hint the caller can paste: every option of the query is repeated, so following it reads
// what the original call would have read next.
func queryJS(q itx.Query, all bool) string {
	var parts []string
	if q.After > 0 {
		parts = append(parts, fmt.Sprintf("after: %d", q.After))
	}
	if q.Before > 0 {
		parts = append(parts, fmt.Sprintf("before: %d", q.Before))
	}
	if q.Limit > 0 {
		parts = append(parts, fmt.Sprintf("limit: %d", q.Limit))
	}
	if len(q.Types) > 0 {
		types, _ := json.Marshal(q.Types)
		parts = append(parts, "types: "+string(types))
	}
	if q.IncludeEphemeral {
		parts = append(parts, "includeEphemeral: true")
	}
	if q.Subscription != "" {
		name, _ := json.Marshal(q.Subscription)
		parts = append(parts, "subscription: "+string(name))
	}
	if all {
		parts = append(parts, "all: true")
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// plural is "1 event", "2 events".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// maxAllEvents bounds getEvents({all: true}): everything it reads is held in memory at once.
const maxAllEvents = 100_000

func streamGetEvents(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	q, o, err := s.query("getEvents", args, "all")
	if err != nil {
		return nil, err
	}
	all := o.bool("all")
	if err := o.err(); err != nil {
		return nil, err
	}
	// A page holds at most MaxPageLimit events whatever the limit asks: the "more follow" hint
	// says the limit the server keeps to.
	q.Limit = min(q.Limit, itx.MaxPageLimit)
	var events []itx.Event
	for {
		page, err := client.GetEventPage(ctx, schema.Stream(c), q)
		if err != nil {
			return nil, asGetEvents(err)
		}
		events = append(events, page.Events...)
		more := page.NextAfter > q.After && page.NextAfter < page.StreamMaxOffset && (q.Before == 0 || page.NextAfter < q.Before-1)
		if !more {
			break
		}
		if !all {
			// A full page may hide the rest of the stream: say so, with how to go on.
			if len(page.Events) > 0 {
				next, every := q, q
				next.After = page.NextAfter
				every.Limit = 0
				s.note("%s shown, more follow: getEvents(%s) for the next page, or getEvents(%s) for every one",
					plural(len(events), "event"), queryJS(next, false), queryJS(every, true))
			}
			break
		}
		if len(events) >= maxAllEvents {
			next := q
			next.After = page.NextAfter
			s.note("stopped after %s; go on with getEvents(%s)", plural(len(events), "event"), queryJS(next, true))
			break
		}
		q.After = page.NextAfter
	}
	return eventsJS(events), nil
}

// asGetEvents words a refusal of the page read getEvents makes as getEvents' own: getEvents reads
// its pages through Stream.getEventPage (whose envelope says whether more follow), and the two
// need the same right, so the refusal is the one a Stream.getEvents call would get. Named after
// getEventPage, it sent whoever called getEvents looking for a call they never made.
func asGetEvents(err error) error {
	if itx.ErrorCode(err) != itx.EPermissionDenied {
		return err
	}
	if rest, ok := strings.CutPrefix(itx.ErrorMessage(err), "Stream.getEventPage "); ok {
		return itx.Errorf(itx.EPermissionDenied, "Stream.getEvents %s", rest)
	}
	return err
}

func streamGetEventPage(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	q, _, err := s.query("getEventPage", args)
	if err != nil {
		return nil, err
	}
	page, err := client.GetEventPage(ctx, schema.Stream(c), q)
	if err != nil {
		return nil, err
	}
	return struct {
		Events          []eventJS `json:"events"`
		StreamID        string    `json:"streamId"`
		StreamMaxOffset int64     `json:"streamMaxOffset"`
		NextAfter       int64     `json:"nextAfter"`
	}{eventsJS(page.Events), page.StreamID, page.StreamMaxOffset, page.NextAfter}, nil
}

func streamWaitForEvent(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	o, err := s.paramsSpelled("waitForEvent", args, []string{"types", "after", "timeoutMs"}, readSpellings, "types", "payloadContains", "where", "after", "timeoutMs", "includeEphemeral")
	if err != nil {
		return nil, err
	}
	pred := itx.Predicate{Types: o.strings("types"), PayloadContains: o.json("payloadContains"),
		Where: o.str("where"), IncludeEphemeral: o.bool("includeEphemeral")}
	after, timeout := o.uint("after"), msDuration(o.uint("timeoutMs"))
	if err := o.err(); err != nil {
		return nil, err
	}
	e, err := client.WaitForEvent(ctx, schema.Stream(c), pred, after, timeout)
	if err != nil {
		return nil, err
	}
	return eventsJS([]itx.Event{e})[0], nil
}

func streamDescribe(ctx context.Context, s *Session, c capnp.Client, _ capPath, _ []goja.Value) (any, error) {
	info, err := client.Describe(ctx, schema.Stream(c))
	if err != nil {
		return nil, err
	}
	return streamInfoOf(info), nil
}

func streamSetSubscriptionCursor(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	o, err := s.params("setSubscriptionCursor", args, []string{"name", "afterOffset"}, "name", "afterOffset")
	if err != nil {
		return nil, err
	}
	name, after := o.str("name"), o.uint("afterOffset")
	if !o.has("name") {
		o.fail("name", "required")
	}
	if !o.has("afterOffset") {
		o.fail("afterOffset", "required")
	}
	if err := o.err(); err != nil {
		return nil, err
	}
	off, err := client.SetSubscriptionCursor(ctx, schema.Stream(c), name, after)
	if err != nil {
		return nil, err
	}
	return offsetJS{off}, nil
}

func streamResumeSubscription(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	name, err := s.stringArg("resumeSubscription", args, 0, "name")
	if err != nil {
		return nil, err
	}
	off, err := client.ResumeSubscription(ctx, schema.Stream(c), name)
	if err != nil {
		return nil, err
	}
	return offsetJS{off}, nil
}

// msDuration is a count of milliseconds as a duration; one too large for a duration is the
// largest, which the barriers refuse as past their bound (the product would wrap).
func msDuration(ms int64) time.Duration {
	if ms > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}

// --- Subscriptions, Subscription ---

type subscriptionRowJS struct {
	Name               string `json:"name"`
	Kind               string `json:"kind"`
	Status             string `json:"status"`
	ConfirmedOffset    int64  `json:"confirmedOffset"`
	DeliveredOffset    int64  `json:"deliveredOffset"`
	Lag                int64  `json:"lag"`
	LastError          string `json:"lastError"`
	ConfiguredAtOffset int64  `json:"configuredAtOffset"`
	Attempt            int    `json:"attempt"`
	NextAttemptAt      msTime `json:"nextAttemptAt"`
}

func subscriptionsList(ctx context.Context, s *Session, c capnp.Client, _ capPath, _ []goja.Value) (any, error) {
	rows, err := client.ListSubscriptions(ctx, schema.Subscriptions(c))
	if err != nil {
		return nil, err
	}
	out := make([]subscriptionRowJS, len(rows))
	for i, r := range rows {
		out[i] = subscriptionRowJS{r.Name, r.Kind, r.Status, r.ConfirmedOffset, r.DeliveredOffset, r.Lag, r.LastError, r.ConfiguredAtOffset, r.Attempt, msTime(r.NextAttemptAt)}
	}
	return out, nil
}

type receiverJS struct {
	Type       string     `json:"type"`
	URL        string     `json:"url,omitempty"`
	Headers    []headerJS `json:"headers,omitempty"`
	Secret     string     `json:"secret,omitempty"`
	Path       string     `json:"path,omitempty"`
	Capability string     `json:"capability,omitempty"`
	Placement  string     `json:"placement,omitempty"`
	Processor  string     `json:"processor,omitempty"`
}

type headerJS struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type subscriptionConfigJS struct {
	Name            string     `json:"name"`
	Receiver        receiverJS `json:"receiver"`
	FilterTypes     []string   `json:"filterTypes"`
	FilterCondition string     `json:"filterCondition"`
	Transform       string     `json:"transform"`
	Start           string     `json:"start"`
	OnFailingEvent  string     `json:"onFailingEvent"`
	Description     string     `json:"description"`
	// The delivery controls show only when set (0: the kind's default).
	MaxDeliveryEvents int    `json:"maxDeliveryEvents,omitempty"`
	MaxDeliveryBytes  int    `json:"maxDeliveryBytes,omitempty"`
	DeadLetterPath    string `json:"deadLetterPath,omitempty"`
	ConfirmWindow     int    `json:"confirmWindow,omitempty"`
}

// receiverKeys are the keys each receiver type takes besides its kind (type, or action as the
// configured event spells it) and the keys every kind takes (receiverCommonKeys). A copy's
// receiving stream is path, or receivingStreamPath as the configured event spells it.
var receiverKeys = map[string][]string{
	client.ReceiverWebhookPost:   {"url", "headers", "secret"},
	client.ReceiverCopyToStream:  {"path", "receivingStreamPath"},
	client.ReceiverItxCall:       {"capability"},
	client.ReceiverProcessorWake: {"placement", "processor"},
}

// receiverCommonKeys are the configured event's receiver keys for what the prompt's shorthand
// gives at the top (transform; start, onFailingEvent and deadLetterPath). processor-wake is
// refused them as it is refused their shorthand, by the same checks.
var receiverCommonKeys = []string{"type", "action", "jsonataTransform", "delivery"}

// misplacedConfigKeys are keys of a configured event (or of a config written for one) that
// configure cannot take where they stand, with why: refused by name, not as an unknown option.
var misplacedConfigKeys = map[string]string{
	"scope": "itxd records the scope of the token that configures (this session's) and takes none from the caller; " +
		"leave it out (a whole-project token places a subscription in another scope by appending its stream/subscription-configured event)",
	"delivery": "the configured event keeps it in the receiver: receiver: {..., delivery: {start, onFailingEvent, deadLetterPath}}, " +
		"or give start, onFailingEvent and deadLetterPath at the top",
}

// subscriptionConfig reads configure's options in either of two shapes, or a mix: the prompt's
// shorthand ({name, receiver: {type, path}, filterTypes, transform, start, ...}, as describe
// shows a config) and the configured event's own payload, as itxd stores it (itx.SubscriptionConfig:
// {name, filter: {eventTypes, jsonataCondition}, receiver: {action, receivingStreamPath,
// jsonataTransform, delivery: {start, onFailingEvent, deadLetterPath}}, ...}), so an event read
// back from a stream configures again as it is. A field given under both its names must say the
// same under each.
func (s *Session) subscriptionConfig(v goja.Value) (client.SubscriptionConfig, error) {
	if obj, ok := v.(*goja.Object); ok && obj.ClassName() == "Object" {
		for _, k := range obj.Keys() {
			if why, ok := misplacedConfigKeys[k]; ok {
				return client.SubscriptionConfig{}, itx.Errorf(itx.EInvalid, "configure: %s is not an option here: %s", k, why)
			}
		}
	}
	o, err := s.opts("configure", v, "name", "receiver", "filterTypes", "filterCondition", "filter", "transform", "start", "onFailingEvent", "description", "idempotencyKey", "maxDeliveryEvents", "maxDeliveryBytes", "deadLetterPath", "confirmWindow")
	if err != nil {
		return client.SubscriptionConfig{}, err
	}
	filter, err := s.opts("configure: filter", o.get("filter"), "eventTypes", "jsonataCondition")
	if err != nil {
		return client.SubscriptionConfig{}, err
	}
	cfg := client.SubscriptionConfig{Name: o.str("name"), Description: o.str("description"), IdempotencyKey: o.str("idempotencyKey"),
		MaxDeliveryEvents: int(min(o.uint("maxDeliveryEvents"), math.MaxInt32)), MaxDeliveryBytes: int(min(o.uint("maxDeliveryBytes"), math.MaxInt32)),
		ConfirmWindow: int(min(o.uint("confirmWindow"), math.MaxInt32))}
	if filter.has("eventTypes") && len(filter.strings("eventTypes")) == 0 && filter.err() == nil {
		// Refused as itxd refuses it in a raw append. The shorthand's filterTypes: [] stays
		// accepted: it is how describe shows a config with no filter.
		filter.fail("eventTypes", "must list at least one type (or \"*\")")
	}
	if err := errorsOf(o, filter); err != nil {
		return cfg, err
	}
	rv := o.get("receiver")
	if rv == nil {
		return cfg, itx.Errorf(itx.EInvalid, "configure: receiver is required: {type: \"webhook-post\" | \"copy-to-stream\" | \"itx-call\" | \"processor-wake\", ...}")
	}
	obj, ok := rv.(*goja.Object)
	if !ok || obj.ClassName() != "Object" {
		return cfg, itx.Errorf(itx.EInvalid, "configure: receiver: expected an object {type: \"webhook-post\" | \"copy-to-stream\" | \"itx-call\" | \"processor-wake\", ...}, got %s", describeValue(rv))
	}
	// The kind is type at the prompt, action in the configured event's own JSON.
	kindKey := "type"
	typ, _ := exportString(obj.Get("type"))
	if action, _ := exportString(obj.Get("action")); typ == "" && action != "" {
		typ, kindKey = action, "action"
	} else if action != "" && action != typ {
		return cfg, itx.Errorf(itx.EInvalid, "configure: receiver.type %q and receiver.action %q differ: they name one thing, give one of them", typ, action)
	}
	keys, ok := receiverKeys[typ]
	if !ok {
		return cfg, itx.Errorf(itx.EInvalid, "configure: receiver.%s must be \"webhook-post\", \"copy-to-stream\", \"itx-call\" or \"processor-wake\", got %q", kindKey, typ)
	}
	r, err := s.opts("configure: receiver", rv, append(append([]string{}, receiverCommonKeys...), keys...)...)
	if err != nil {
		return cfg, err
	}
	delivery, err := s.opts("configure: receiver.delivery", r.get("delivery"), "start", "onFailingEvent", "deadLetterPath")
	if err != nil {
		return cfg, err
	}
	var both aliases
	cfg.FilterTypes = aliased(&both, (*options).strings, field{o, "filterTypes", ""}, field{filter, "eventTypes", "filter."})
	cfg.FilterCondition = aliased(&both, (*options).str, field{o, "filterCondition", ""}, field{filter, "jsonataCondition", "filter."})
	cfg.Transform = aliased(&both, (*options).str, field{o, "transform", ""}, field{r, "jsonataTransform", "receiver."})
	cfg.Start = aliased(&both, (*options).str, field{o, "start", ""}, field{delivery, "start", "receiver.delivery."})
	cfg.OnFailingEvent = aliased(&both, (*options).str, field{o, "onFailingEvent", ""}, field{delivery, "onFailingEvent", "receiver.delivery."})
	cfg.DeadLetterPath = aliased(&both, (*options).str, field{o, "deadLetterPath", ""}, field{delivery, "deadLetterPath", "receiver.delivery."})
	path := field{r, "path", "receiver."}
	cfg.Receiver = client.Receiver{Kind: typ, URL: r.str("url"), Secret: r.str("secret"),
		Path:       aliased(&both, (*options).str, path, field{r, "receivingStreamPath", "receiver."}),
		Capability: r.str("capability"), Placement: r.str("placement"), Processor: r.str("processor")}
	if err := errorsOf(o, filter, r, delivery); err != nil {
		return cfg, err
	}
	if err := both.err(); err != nil {
		return cfg, err
	}
	if typ == client.ReceiverCopyToStream {
		// itxd checks the same, but its error says receivingStreamPath whatever the caller
		// wrote; this one names the key that was written.
		if err := itx.ValidatePath(strings.TrimSpace(cfg.Receiver.Path)); err != nil {
			if !r.has("path") && r.has("receivingStreamPath") {
				path.key = "receivingStreamPath"
			}
			r.fail(path.key, "%s", itx.ErrorMessage(err))
		}
	}
	if hv := r.get("headers"); hv != nil {
		headers, err := s.headers(hv)
		if err != nil {
			return cfg, err
		}
		cfg.Receiver.Headers = headers
	}
	return cfg, r.err()
}

// errorsOf is the first of the options' errors, each of which reports all of its own.
func errorsOf(opts ...*options) error {
	for _, o := range opts {
		if err := o.err(); err != nil {
			return err
		}
	}
	return nil
}

// field is a key of one options object, and where that object sits in configure's ("filter.").
type field struct {
	o      *options
	key    string
	prefix string
}

func (f field) String() string { return f.prefix + f.key }

// aliases collects the fields given under both their names with two different values.
type aliases []string

func (a aliases) err() error {
	if len(a) == 0 {
		return nil
	}
	return itx.Errorf(itx.EInvalid, "configure: %s", strings.Join(a, "; "))
}

// aliased reads a field that has two names, the prompt's shorthand and the configured event's
// (filterTypes and filter.eventTypes): either will do, and given under both it must be the same
// value, else it is refused rather than one of them silently winning.
func aliased[T any](conflicts *aliases, read func(*options, string) T, short, stored field) T {
	a, b := read(short.o, short.key), read(stored.o, stored.key)
	if !short.o.has(short.key) {
		return b
	}
	if stored.o.has(stored.key) {
		ja, _ := json.Marshal(a)
		jb, _ := json.Marshal(b)
		if string(ja) != string(jb) {
			*conflicts = append(*conflicts, fmt.Sprintf("%s %s and %s %s differ: they name one thing, give one of them", short, ja, stored, jb))
		}
	}
	return a
}

// headers reads {"X-A": "1"} or [{name: "X-A", value: "1"}].
func (s *Session) headers(v goja.Value) ([]client.Header, error) {
	obj, ok := v.(*goja.Object)
	if !ok {
		return nil, itx.Errorf(itx.EInvalid, "configure: receiver.headers: expected an object or an array of {name, value}")
	}
	var out []client.Header
	if obj.ClassName() == "Array" {
		for _, k := range obj.Keys() {
			h, err := s.opts("configure: receiver.headers["+k+"]", obj.Get(k), "name", "value")
			if err != nil {
				return nil, err
			}
			out = append(out, client.Header{Name: h.str("name"), Value: h.str("value")})
			if err := h.err(); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	for _, k := range obj.Keys() {
		value, ok := exportString(obj.Get(k))
		if !ok {
			return nil, itx.Errorf(itx.EInvalid, "configure: receiver.headers.%s: expected a string", k)
		}
		out = append(out, client.Header{Name: k, Value: value})
	}
	return out, nil
}

func configJS(c client.SubscriptionConfig) subscriptionConfigJS {
	out := subscriptionConfigJS{Name: c.Name, FilterTypes: c.FilterTypes, FilterCondition: c.FilterCondition,
		Transform: c.Transform, Start: c.Start, OnFailingEvent: c.OnFailingEvent, Description: c.Description,
		MaxDeliveryEvents: c.MaxDeliveryEvents, MaxDeliveryBytes: c.MaxDeliveryBytes, DeadLetterPath: c.DeadLetterPath, ConfirmWindow: c.ConfirmWindow,
		Receiver: receiverJS{Type: c.Receiver.Kind, URL: c.Receiver.URL, Secret: c.Receiver.Secret, Path: c.Receiver.Path,
			Capability: c.Receiver.Capability, Placement: c.Receiver.Placement, Processor: c.Receiver.Processor}}
	if out.FilterTypes == nil {
		out.FilterTypes = []string{}
	}
	for _, h := range c.Receiver.Headers {
		out.Receiver.Headers = append(out.Receiver.Headers, headerJS{h.Name, h.Value})
	}
	return out
}

func subscriptionsConfigure(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	v := arg(args, 0)
	_, positional := exportString(v)
	takes := 1 // configure({...})
	if positional {
		takes = 3 // configure(name, receiver, {...}?)
	}
	for _, extra := range args[min(takes, len(args)):] {
		if !isAbsent(extra) {
			return nil, itx.Errorf(itx.EInvalid, "configure: too many arguments (takes name, receiver, then an options object {...}, or one options object {name, receiver, ...}), got %s after them", describeValue(extra))
		}
	}
	if positional {
		// configure(name, receiver, {...}?): the receiver is an object too, so the options
		// object can only be the third argument.
		merged := s.vm.NewObject()
		if extra, ok := arg(args, 2).(*goja.Object); ok {
			for _, k := range extra.Keys() {
				if (k == "name" || (k == "receiver" && !isAbsent(arg(args, 1)))) && !isAbsent(extra.Get(k)) {
					return nil, itx.Errorf(itx.EInvalid, "configure: %s is given twice, as an argument and as an option", k)
				}
				merged.Set(k, extra.Get(k))
			}
		} else if !isAbsent(arg(args, 2)) {
			return nil, itx.Errorf(itx.EInvalid, "configure: the third argument must be an options object, got %s", describeValue(arg(args, 2)))
		}
		merged.Set("name", v)
		if !isAbsent(arg(args, 1)) {
			merged.Set("receiver", arg(args, 1))
		}
		v = merged
	}
	cfg, err := s.subscriptionConfig(v)
	if err != nil {
		return nil, err
	}
	name, off, err := client.ConfigureSubscription(ctx, schema.Subscriptions(c), cfg)
	if err != nil {
		return nil, err
	}
	return struct {
		Name   string `json:"name"`
		Offset int64  `json:"offset"`
	}{name, off}, nil
}

func subscriptionsRemove(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	name, err := s.stringArg("Subscriptions.remove", args, 0, "name")
	if err != nil {
		return nil, err
	}
	off, err := client.RemoveSubscription(ctx, schema.Subscriptions(c), name)
	if err != nil {
		return nil, err
	}
	return offsetJS{off}, nil
}

func subscriptionDescribe(ctx context.Context, s *Session, c capnp.Client, _ capPath, _ []goja.Value) (any, error) {
	d, err := client.DescribeSubscription(ctx, schema.Subscription(c))
	if err != nil {
		return nil, err
	}
	return struct {
		Config                            subscriptionConfigJS `json:"config"`
		SecretSet                         bool                 `json:"secretSet"` // a webhook secret is set (config shows only its reference)
		Kind                              string               `json:"kind"`
		Status                            string               `json:"status"`
		ConfiguredAtOffset                int64                `json:"configuredAtOffset"`
		CursorChangedAtOffset             int64                `json:"cursorChangedAtOffset"`
		ConfirmedOffset                   int64                `json:"confirmedOffset"`
		DeliveredOffset                   int64                `json:"deliveredOffset"`
		HeadOffset                        int64                `json:"headOffset"`
		Attempt                           int                  `json:"attempt"`
		NextAttemptAt                     msTime               `json:"nextAttemptAt"`
		FailingEventOffset                int64                `json:"failingEventOffset"`
		FailingEventAttempt               int                  `json:"failingEventAttempt"`
		FailingEventSkipsSinceLastSuccess int                  `json:"failingEventSkipsSinceLastSuccess"`
		LastError                         string               `json:"lastError"`
		InFlightDeadlineAt                msTime               `json:"inFlightDeadlineAt"`
		InFlightConnectionGeneration      int64                `json:"inFlightConnectionGeneration"`
		UpdatedAt                         textTime             `json:"updatedAt"`
	}{configJS(client.ConfigOf(d.Config)), d.SecretSet, d.Kind, d.Status, d.ConfiguredAtOffset, d.CursorChangedAtOffset, d.ConfirmedOffset, d.DeliveredOffset, d.HeadOffset,
		d.Attempt, msTime(d.NextAttemptAt), d.FailingEventOffset, d.FailingEventAttempt, d.FailingEventSkips,
		d.LastError, msTime(d.InFlightDeadlineAt), d.InFlightConnectionGeneration, textTime(d.UpdatedAt)}, nil
}

func subscriptionWaitUntilProcessed(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	o, err := s.params("waitUntilProcessed", args, []string{"offset", "timeoutMs"}, "offset", "timeoutMs")
	if err != nil {
		return nil, err
	}
	if !o.has("offset") {
		o.fail("offset", "required")
	}
	offset, timeoutMs := o.uint("offset"), o.uint("timeoutMs")
	if err := o.err(); err != nil {
		return nil, err
	}
	confirmed, err := client.WaitUntilProcessed(ctx, schema.Subscription(c), offset, msDuration(timeoutMs))
	if err != nil {
		return nil, err
	}
	return struct {
		ConfirmedOffset int64 `json:"confirmedOffset"`
	}{confirmed}, nil
}

func subscriptionConfirm(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	o, err := s.params("confirm", args, []string{"offset"}, "offset")
	if err != nil {
		return nil, err
	}
	if !o.has("offset") {
		o.fail("offset", "required")
	}
	offset := o.uint("offset")
	if err := o.err(); err != nil {
		return nil, err
	}
	confirmed, err := client.ConfirmSubscription(ctx, schema.Subscription(c), offset)
	if err != nil {
		return nil, err
	}
	return struct {
		ConfirmedOffset int64 `json:"confirmedOffset"`
	}{confirmed}, nil
}

// --- Capabilities, ProcessorHosts, Readers, Processor ---

func capabilitiesList(ctx context.Context, s *Session, c capnp.Client, _ capPath, _ []goja.Value) (any, error) {
	ms, err := client.ListMounts(ctx, schema.Capabilities(c))
	if err != nil {
		return nil, err
	}
	return mountsJS(ms), nil
}

func capabilitiesUnmount(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	name, err := s.stringArg("Capabilities.unmount", args, 0, "name")
	if err != nil {
		return nil, err
	}
	if err := client.Unmount(ctx, schema.Capabilities(c), name); err != nil {
		return nil, err
	}
	s.endMounts(name, &itx.Error{Code: itx.ECancelled, Message: "unmounted"})
	return nil, nil
}

func processorHostsList(ctx context.Context, s *Session, c capnp.Client, _ capPath, _ []goja.Value) (any, error) {
	ms, err := client.ListProcessorHosts(ctx, schema.ProcessorHosts(c))
	if err != nil {
		return nil, err
	}
	return mountsJS(ms), nil
}

// mountUnavailable: a processor host runs contracts, which a program built with the Go SDK
// has and a REPL line has not. (A Receiver is served from the prompt: capabilitiesMount.)
func mountUnavailable(context.Context, *Session, capnp.Client, capPath, []goja.Value) (any, error) {
	return nil, itx.Errorf(itx.EFailedPrecondition, "mount is not available from itx: mount a ProcessorHost from a program using the Go SDK (package processors/remote)")
}

func readersRegister(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	o, err := s.params("Readers.register", args, []string{"name", "checkpoint"}, "name", "checkpoint")
	if err != nil {
		return nil, err
	}
	name, checkpoint := o.str("name"), o.uint("checkpoint")
	if !o.has("name") {
		o.fail("name", "required")
	}
	if !o.has("checkpoint") {
		o.fail("checkpoint", "required") // 0 would move a registered reader back to the start
	}
	if err := o.err(); err != nil {
		return nil, err
	}
	return nil, client.RegisterReader(ctx, schema.Readers(c), name, checkpoint)
}

func readersList(ctx context.Context, s *Session, c capnp.Client, _ capPath, _ []goja.Value) (any, error) {
	rs, err := client.ListReaders(ctx, schema.Readers(c))
	if err != nil {
		return nil, err
	}
	type readerJS struct {
		Name       string `json:"name"`
		Checkpoint int64  `json:"checkpoint"`
		Lag        int64  `json:"lag"`
		UpdatedAt  msTime `json:"updatedAt"`
	}
	out := make([]readerJS, len(rs))
	for i, r := range rs {
		out[i] = readerJS{r.Name, r.Checkpoint, r.Lag, msTime(r.UpdatedAt)}
	}
	return out, nil
}

func readersRemove(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	name, err := s.stringArg("Readers.remove", args, 0, "name")
	if err != nil {
		return nil, err
	}
	return nil, client.RemoveReader(ctx, schema.Readers(c), name)
}

func processorSnapshot(ctx context.Context, s *Session, c capnp.Client, _ capPath, _ []goja.Value) (any, error) {
	snap, err := client.Snapshot(ctx, schema.Processor(c))
	if err != nil {
		return nil, err
	}
	// offset is the TypeScript surface's name (ProcessorSnapshot {offset, state}) for the offset
	// the state is folded through: reducedOffset.
	return struct {
		State           json.RawMessage `json:"state"`
		ReducedOffset   int64           `json:"reducedOffset"`
		ProcessedOffset int64           `json:"processedOffset"`
		Offset          int64           `json:"offset"`
	}{rawJSON(snap.State), snap.ReducedOffset, snap.ProcessedOffset, snap.ReducedOffset}, nil
}

func processorRuntimeState(ctx context.Context, s *Session, c capnp.Client, _ capPath, _ []goja.Value) (any, error) {
	state, err := client.RuntimeState(ctx, schema.Processor(c))
	if err != nil {
		return nil, err
	}
	return rawJSON(state), nil
}

// --- scheduled appends ---

type scheduledJS struct {
	DueAt          dueTime         `json:"dueAt"`
	Type           string          `json:"type"`
	IdempotencyKey string          `json:"idempotencyKey"`
	Payload        json.RawMessage `json:"payload"`
	Metadata       json.RawMessage `json:"metadata,omitempty"`
}

// timeArg reads a time: a Date, an ISO-8601 string (UTC when it names no zone), epoch
// milliseconds, or a duration from now ("90s", "10m", "2h").
func (s *Session) timeArg(what string, v goja.Value) (time.Time, error) {
	if isAbsent(v) {
		return time.Time{}, itx.Errorf(itx.EInvalid, "%s is required: a Date, an ISO-8601 time, epoch milliseconds or a duration from now (\"10m\")", what)
	}
	switch x := v.Export().(type) {
	case time.Time:
		return x, nil
	case int64:
		return time.UnixMilli(x), nil
	case float64:
		// Within what a time holds (about ±292 million years): int64(x) of anything larger is
		// not defined.
		if !math.IsNaN(x) && math.Abs(x) < 9e18 {
			return time.UnixMilli(int64(x)), nil
		}
	case string:
		// ISO-8601 with a zone, or without one (UTC, as itx shows every time), or a date alone.
		for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999", "2006-01-02"} {
			if at, err := time.ParseInLocation(layout, x, time.UTC); err == nil {
				return at, nil
			}
		}
		if d, err := time.ParseDuration(x); err == nil {
			return time.Now().Add(d), nil
		}
	}
	return time.Time{}, itx.Errorf(itx.EInvalid, "%s: expected a Date, an ISO-8601 time, epoch milliseconds or a duration from now (\"10m\"), got %s", what, describeValue(v))
}

// agoArg reads a time in the past: a duration ago ("30d", "12h", "90m") or, as timeArg reads
// it, a Date, an ISO-8601 time or epoch milliseconds.
func (s *Session) agoArg(what string, v goja.Value) (time.Time, error) {
	if _, ok := v.Export().(string); ok {
		if d, err := durationArg(what, v); err == nil {
			return time.Now().Add(-d), nil
		}
	}
	at, err := s.timeArg(what, v)
	if err != nil {
		return time.Time{}, itx.Errorf(itx.EInvalid, "%s: expected a duration ago (\"30d\", \"12h\"), a Date, an ISO-8601 time or epoch milliseconds, got %s", what, describeValue(v))
	}
	return at, nil
}

func streamSchedule(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	for _, extra := range args[min(2, len(args)):] {
		if !isAbsent(extra) {
			return nil, itx.Errorf(itx.EInvalid, "schedule: too many arguments (takes event, dueAt, or an options object {event, dueAt}), got %s after them", describeValue(extra))
		}
	}
	evV, dueV := arg(args, 0), arg(args, 1)
	if obj, ok := evV.(*goja.Object); ok && len(args) == 1 && obj.Get("event") != nil {
		o, err := s.opts("schedule", evV, "event", "dueAt")
		if err != nil {
			return nil, err
		}
		evV, dueV = o.get("event"), o.get("dueAt")
	}
	in, err := s.eventInput("schedule: event", evV)
	if err != nil {
		return nil, err
	}
	at, err := s.timeArg("schedule: dueAt", dueV)
	if err != nil {
		return nil, err
	}
	due, appended, err := client.Schedule(ctx, schema.Stream(c), in, at)
	if err != nil {
		return nil, err
	}
	// A key already in the log schedules nothing: no time (null), its offset.
	var dueAt *dueTime
	if appended == 0 {
		d := dueTime(due.UnixMilli())
		dueAt = &d
	}
	return struct {
		DueAt          *dueTime `json:"dueAt"`
		AppendedOffset int64    `json:"appendedOffset,omitempty"`
	}{dueAt, appended}, nil
}

func streamCancelScheduled(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	key, err := s.stringArg("cancelScheduled", args, 0, "key")
	if err != nil {
		return nil, err
	}
	found, err := client.CancelScheduled(ctx, schema.Stream(c), key)
	if err != nil {
		return nil, err
	}
	return struct {
		Cancelled bool `json:"cancelled"`
	}{found}, nil
}

func streamListScheduled(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	if len(args) > 0 {
		return nil, itx.Errorf(itx.EInvalid, "listScheduled takes no arguments")
	}
	list, err := client.ListScheduled(ctx, schema.Stream(c))
	if err != nil {
		return nil, err
	}
	out := make([]scheduledJS, len(list))
	for i, sc := range list {
		out[i] = scheduledJS{DueAt: dueTime(sc.DueAt), Type: sc.Event.Type, IdempotencyKey: sc.Event.IdempotencyKey,
			Payload: sc.Event.Payload, Metadata: sc.Event.Metadata}
	}
	return out, nil
}
