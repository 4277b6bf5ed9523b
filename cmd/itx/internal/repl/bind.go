package repl

import (
	"context"
	"encoding/json"
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

// bindings covers every method of the bound interfaces that is not a navigation step; a test
// checks the two together against the schema.
var bindings = map[string]map[string]binding{
	"Project": {
		"describe": {"describe() -> {id, name, deployment}", projectDescribe},
	},
	"Streams": {
		"list": {"list(prefix?) -> [{path, streamId, headOffset, ...}]", streamsList},
	},
	"Stream": {
		"append":                {"append(event | [events], {expectedHeadOffset}?) -> {offsets, duplicate, headOffset, streamId}", streamAppend},
		"getEvents":             {"getEvents({after, before, limit, types, includeEphemeral}?) -> [events]", streamGetEvents},
		"getEventPage":          {"getEventPage({after, before, limit, types, includeEphemeral}?) -> {events, streamId, streamMaxOffset, nextAfter}", streamGetEventPage},
		"waitForEvent":          {"waitForEvent({types, payloadContains, where, after, timeoutMs, includeEphemeral}) -> event", streamWaitForEvent},
		"describe":              {"describe() -> {path, streamId, headOffset, createdAt, ...}", streamDescribe},
		"setSubscriptionCursor": {"setSubscriptionCursor({name, afterOffset}) -> {offset}", streamSetSubscriptionCursor},
		"resumeSubscription":    {"resumeSubscription({name}) -> {offset}", streamResumeSubscription},
		"openConnection":        {"openConnection({after, types, maxDeliveryEvents, maxDeliveryBytes, noState, openedBy}?) -> connection {take(), ping(), close(reason)}", streamOpenConnection},
		"liveState":             {"liveState() -> live view {snapshot(), patches(), cancel()}", streamLiveState},
	},
	"Subscriptions": {
		"list":      {"list() -> [{name, kind, status, confirmedOffset, lag, lastError, configuredAtOffset}]", subscriptionsList},
		"configure": {"configure({name, receiver: {type: \"webhook-post\", url, ...}, filterTypes, filterCondition, transform, start, onFailingEvent, description}) -> {name, offset}", subscriptionsConfigure},
		"remove":    {"remove(name) -> {offset}", subscriptionsRemove},
	},
	"Subscription": {
		"describe":           {"describe() -> {config, kind, status, confirmedOffset, ...}", subscriptionDescribe},
		"waitUntilProcessed": {"waitUntilProcessed({offset, timeoutMs}) -> {confirmedOffset}", subscriptionWaitUntilProcessed},
	},
	"Capabilities": {
		"list":    {"list() -> [{name, mountedAt}]", capabilitiesList},
		"unmount": {"unmount(name)", capabilitiesUnmount},
		"mount":   {"mount(name, receiver): not available here (a Receiver is served by an SDK client)", mountUnavailable},
	},
	"ProcessorHosts": {
		"list":  {"list() -> [{name, mountedAt}]", processorHostsList},
		"mount": {"mount(name, host): not available here (a ProcessorHost is served by an SDK client)", mountUnavailable},
	},
	"Readers": {
		"register": {"register({name, checkpoint})", readersRegister},
		"list":     {"list() -> [{name, checkpoint, lag, updatedAt}]", readersList},
		"remove":   {"remove(name)", readersRemove},
	},
	"Processor": {
		"snapshot":        {"snapshot() -> {state, reducedOffset, processedOffset}", processorSnapshot},
		"getRuntimeState": {"getRuntimeState() -> state", processorRuntimeState},
		"liveState":       {"liveState() -> live view {snapshot(), patches(), cancel()}", processorLiveState},
	},
}

// proxy builds the JavaScript object for the capability at p. Navigation members send their
// pipelined call when they are evaluated and return another proxy; terminal members wait.
func (s *Session) proxy(p capPath) *goja.Object {
	vm := s.vm
	obj := vm.NewObject()
	obj.DefineDataPropertySymbol(s.capSym, vm.ToValue(&p), goja.FLAG_FALSE, goja.FLAG_FALSE, goja.FLAG_FALSE)
	hidden := func(name string, fn func(goja.FunctionCall) goja.Value) {
		obj.DefineDataProperty(name, vm.ToValue(fn), goja.FLAG_FALSE, goja.FLAG_FALSE, goja.FLAG_FALSE)
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
			hidden(m.Name, func(call goja.FunctionCall) goja.Value {
				c := s.client(p)
				defer c.Release()
				v, err := b.call(s.ctx(), s, c, p, call.Arguments)
				if err != nil {
					panic(s.throw(err))
				}
				if jv, ok := v.(goja.Value); ok {
					return jv
				}
				return s.toJS(v)
			})
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
	return obj
}

// navigate sends the pipelined call that reaches p (nothing waits for it) and returns p's proxy.
func (s *Session) navigate(p capPath) goja.Value {
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

// toJS turns a Go result into a plain JavaScript value through JSON, so results are ordinary
// objects (with fields in declaration order) that scripts can keep, change and print.
func (s *Session) toJS(v any) goja.Value {
	if v == nil {
		return goja.Undefined()
	}
	b, err := json.Marshal(v)
	if err != nil {
		panic(s.throw(err))
	}
	out, err := s.parse(goja.Undefined(), s.vm.ToValue(string(b)))
	if err != nil {
		panic(s.throw(err))
	}
	return out
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

type eventJS struct {
	Offset         int64           `json:"offset"`
	Type           string          `json:"type"`
	Payload        json.RawMessage `json:"payload"`
	CreatedAt      int64           `json:"createdAt"`
	IdempotencyKey string          `json:"idempotencyKey,omitempty"`
	Metadata       json.RawMessage `json:"metadata,omitempty"`
	Ephemeral      bool            `json:"ephemeral,omitempty"`
	Provenance     []itx.Hop       `json:"provenance,omitempty"`
}

func eventsJS(events []itx.Event) []eventJS {
	out := make([]eventJS, len(events))
	for i, e := range events {
		out[i] = eventJS{Offset: e.Offset, Type: e.Type, Payload: rawJSON(string(e.Payload)), CreatedAt: e.CreatedAt,
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
	CreatedAt         int64  `json:"createdAt"`
	LastAppendAt      int64  `json:"lastAppendAt"`
	SubscriptionCount int    `json:"subscriptionCount"`
	Loaded            bool   `json:"loaded"`
}

func streamInfoOf(i itx.StreamInfo) streamInfoJS {
	return streamInfoJS{Path: i.Path, StreamID: i.StreamID, HeadOffset: i.HeadOffset, CreatedAt: i.CreatedAt,
		LastAppendAt: i.LastAppendAt, SubscriptionCount: i.SubscriptionCount, Loaded: i.Loaded}
}

type offsetJS struct {
	Offset int64 `json:"offset"`
}

type mountJS struct {
	Name      string `json:"name"`
	MountedAt int64  `json:"mountedAt"`
}

func mountsJS(ms []itx.MountInfo) []mountJS {
	out := make([]mountJS, len(ms))
	for i, m := range ms {
		out[i] = mountJS{Name: m.Name, MountedAt: m.MountedAt}
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
	prefix := ""
	if v := arg(args, 0); !isAbsent(v) {
		var err error
		if prefix, err = s.stringArg("Streams.list", args, 0, "prefix"); err != nil {
			return nil, err
		}
	}
	// The pipelined Streams capability is already at hand: list on it directly.
	list, err := client.ListStreamsIn(ctx, schema.Streams(c), prefix)
	if err != nil {
		return nil, err
	}
	out := make([]streamInfoJS, len(list))
	for i, info := range list {
		out[i] = streamInfoOf(info)
	}
	return out, nil
}

// --- Stream ---

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
	o, err := s.opts("append options", arg(args, 1), "expectedHeadOffset", "conditional")
	if err != nil {
		return nil, err
	}
	opts := itx.AppendOptions{Conditional: o.has("expectedHeadOffset") || o.bool("conditional"), ExpectedHeadOffset: o.uint("expectedHeadOffset")}
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

func (s *Session) query(what string, v goja.Value) (itx.Query, error) {
	o, err := s.opts(what, v, "after", "before", "limit", "types", "includeEphemeral")
	if err != nil {
		return itx.Query{}, err
	}
	q := itx.Query{After: o.uint("after"), Before: o.uint("before"), Limit: int(o.uint("limit")),
		Types: o.strings("types"), IncludeEphemeral: o.bool("includeEphemeral")}
	return q, o.err()
}

func streamGetEvents(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	q, err := s.query("getEvents", arg(args, 0))
	if err != nil {
		return nil, err
	}
	events, err := client.GetEvents(ctx, schema.Stream(c), q)
	if err != nil {
		return nil, err
	}
	return eventsJS(events), nil
}

func streamGetEventPage(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	q, err := s.query("getEventPage", arg(args, 0))
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
	o, err := s.opts("waitForEvent", arg(args, 0), "types", "payloadContains", "where", "after", "timeoutMs", "includeEphemeral")
	if err != nil {
		return nil, err
	}
	pred := itx.Predicate{Types: o.strings("types"), PayloadContains: o.json("payloadContains"),
		Where: o.str("where"), IncludeEphemeral: o.bool("includeEphemeral")}
	after, timeout := o.uint("after"), time.Duration(o.uint("timeoutMs"))*time.Millisecond
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
	o, err := s.opts("setSubscriptionCursor", arg(args, 0), "name", "afterOffset")
	if err != nil {
		return nil, err
	}
	name, after := o.str("name"), o.uint("afterOffset")
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

// --- Subscriptions, Subscription ---

type subscriptionRowJS struct {
	Name               string `json:"name"`
	Kind               string `json:"kind"`
	Status             string `json:"status"`
	ConfirmedOffset    int64  `json:"confirmedOffset"`
	Lag                int64  `json:"lag"`
	LastError          string `json:"lastError"`
	ConfiguredAtOffset int64  `json:"configuredAtOffset"`
}

func subscriptionsList(ctx context.Context, s *Session, c capnp.Client, _ capPath, _ []goja.Value) (any, error) {
	rows, err := client.ListSubscriptions(ctx, schema.Subscriptions(c))
	if err != nil {
		return nil, err
	}
	out := make([]subscriptionRowJS, len(rows))
	for i, r := range rows {
		out[i] = subscriptionRowJS{r.Name, r.Kind, r.Status, r.ConfirmedOffset, r.Lag, r.LastError, r.ConfiguredAtOffset}
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
}

// receiverKeys are the keys each receiver type takes besides type.
var receiverKeys = map[string][]string{
	client.ReceiverWebhookPost:   {"url", "headers", "secret"},
	client.ReceiverCopyToStream:  {"path"},
	client.ReceiverItxCall:       {"capability"},
	client.ReceiverProcessorWake: {"placement"},
}

func (s *Session) subscriptionConfig(v goja.Value) (client.SubscriptionConfig, error) {
	o, err := s.opts("configure", v, "name", "receiver", "filterTypes", "filterCondition", "transform", "start", "onFailingEvent", "description")
	if err != nil {
		return client.SubscriptionConfig{}, err
	}
	cfg := client.SubscriptionConfig{Name: o.str("name"), FilterTypes: o.strings("filterTypes"), FilterCondition: o.str("filterCondition"),
		Transform: o.str("transform"), Start: o.str("start"), OnFailingEvent: o.str("onFailingEvent"), Description: o.str("description")}
	if err := o.err(); err != nil {
		return cfg, err
	}
	rv := o.get("receiver")
	if rv == nil {
		return cfg, itx.Errorf(itx.EInvalid, "configure: receiver is required: {type: \"webhook-post\" | \"copy-to-stream\" | \"itx-call\" | \"processor-wake\", ...}")
	}
	typ, kindKey := "", "type"
	if obj, ok := rv.(*goja.Object); ok {
		typ, _ = exportString(obj.Get("type"))
		if typ == "" {
			// The configured event's own JSON names the kind "action": accept it too.
			if typ, _ = exportString(obj.Get("action")); typ != "" {
				kindKey = "action"
			}
		}
	}
	keys, ok := receiverKeys[typ]
	if !ok {
		return cfg, itx.Errorf(itx.EInvalid, "configure: receiver.type must be \"webhook-post\", \"copy-to-stream\", \"itx-call\" or \"processor-wake\", got %q", typ)
	}
	r, err := s.opts("configure: receiver", rv, append([]string{kindKey}, keys...)...)
	if err != nil {
		return cfg, err
	}
	cfg.Receiver = client.Receiver{Kind: typ, URL: r.str("url"), Secret: r.str("secret"), Path: r.str("path"),
		Capability: r.str("capability"), Placement: r.str("placement")}
	if hv := r.get("headers"); hv != nil {
		headers, err := s.headers(hv)
		if err != nil {
			return cfg, err
		}
		cfg.Receiver.Headers = headers
	}
	return cfg, r.err()
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
		Receiver: receiverJS{Type: c.Receiver.Kind, URL: c.Receiver.URL, Secret: c.Receiver.Secret, Path: c.Receiver.Path,
			Capability: c.Receiver.Capability, Placement: c.Receiver.Placement}}
	if out.FilterTypes == nil {
		out.FilterTypes = []string{}
	}
	for _, h := range c.Receiver.Headers {
		out.Receiver.Headers = append(out.Receiver.Headers, headerJS{h.Name, h.Value})
	}
	return out
}

func subscriptionsConfigure(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	cfg, err := s.subscriptionConfig(arg(args, 0))
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
		Kind                              string               `json:"kind"`
		Status                            string               `json:"status"`
		ConfiguredAtOffset                int64                `json:"configuredAtOffset"`
		CursorChangedAtOffset             int64                `json:"cursorChangedAtOffset"`
		ConfirmedOffset                   int64                `json:"confirmedOffset"`
		HeadOffset                        int64                `json:"headOffset"`
		Attempt                           int                  `json:"attempt"`
		NextAttemptAt                     int64                `json:"nextAttemptAt"`
		FailingEventOffset                int64                `json:"failingEventOffset"`
		FailingEventAttempt               int                  `json:"failingEventAttempt"`
		FailingEventSkipsSinceLastSuccess int                  `json:"failingEventSkipsSinceLastSuccess"`
		LastError                         string               `json:"lastError"`
		InFlightDeadlineAt                int64                `json:"inFlightDeadlineAt"`
		InFlightConnectionGeneration      int64                `json:"inFlightConnectionGeneration"`
		UpdatedAt                         string               `json:"updatedAt"`
	}{configJS(client.ConfigOf(d.Config)), d.Kind, d.Status, d.ConfiguredAtOffset, d.CursorChangedAtOffset, d.ConfirmedOffset, d.HeadOffset,
		d.Attempt, d.NextAttemptAt, d.FailingEventOffset, d.FailingEventAttempt, d.FailingEventSkips,
		d.LastError, d.InFlightDeadlineAt, d.InFlightConnectionGeneration, d.UpdatedAt}, nil
}

func subscriptionWaitUntilProcessed(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	var offset, timeoutMs int64
	if n, ok := toUint(arg(args, 0)); ok && !isAbsent(arg(args, 0)) {
		offset = n // waitUntilProcessed(12)
	} else {
		o, err := s.opts("waitUntilProcessed", arg(args, 0), "offset", "timeoutMs")
		if err != nil {
			return nil, err
		}
		if !o.has("offset") {
			o.fail("offset", "required")
		}
		offset, timeoutMs = o.uint("offset"), o.uint("timeoutMs")
		if err := o.err(); err != nil {
			return nil, err
		}
	}
	confirmed, err := client.WaitUntilProcessed(ctx, schema.Subscription(c), offset, time.Duration(timeoutMs)*time.Millisecond)
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
	return nil, client.Unmount(ctx, schema.Capabilities(c), name)
}

func processorHostsList(ctx context.Context, s *Session, c capnp.Client, _ capPath, _ []goja.Value) (any, error) {
	ms, err := client.ListProcessorHosts(ctx, schema.ProcessorHosts(c))
	if err != nil {
		return nil, err
	}
	return mountsJS(ms), nil
}

// errMountUnavailable: a mount hands the server a capability this process would have to serve
// for as long as it is mounted, which is an SDK program's job, not a REPL line's.
func mountUnavailable(context.Context, *Session, capnp.Client, capPath, []goja.Value) (any, error) {
	return nil, itx.Errorf(itx.EFailedPrecondition, "mount is not available from itx: mount a Receiver or ProcessorHost from a program using the Go SDK (package client)")
}

func readersRegister(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	var name string
	var checkpoint int64
	if str, ok := exportString(arg(args, 0)); ok {
		name = str // register("mirror", 12)
		n, ok := toUint(arg(args, 1))
		if !ok {
			return nil, itx.Errorf(itx.EInvalid, "Readers.register: checkpoint: expected a non-negative integer")
		}
		checkpoint = n
	} else {
		o, err := s.opts("Readers.register", arg(args, 0), "name", "checkpoint")
		if err != nil {
			return nil, err
		}
		name, checkpoint = o.str("name"), o.uint("checkpoint")
		if err := o.err(); err != nil {
			return nil, err
		}
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
		UpdatedAt  int64  `json:"updatedAt"`
	}
	out := make([]readerJS, len(rs))
	for i, r := range rs {
		out[i] = readerJS{r.Name, r.Checkpoint, r.Lag, r.UpdatedAt}
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
	return struct {
		State           json.RawMessage `json:"state"`
		ReducedOffset   int64           `json:"reducedOffset"`
		ProcessedOffset int64           `json:"processedOffset"`
	}{rawJSON(snap.State), snap.ReducedOffset, snap.ProcessedOffset}, nil
}

func processorRuntimeState(ctx context.Context, s *Session, c capnp.Client, _ capPath, _ []goja.Value) (any, error) {
	state, err := client.RuntimeState(ctx, schema.Processor(c))
	if err != nil {
		return nil, err
	}
	return rawJSON(state), nil
}
