package client

import (
	"context"
	"sort"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/wire"
)

// Receiver kinds, as SubscriptionSummary.Kind and Receiver.Kind spell them.
const (
	ReceiverWebhookPost   = "webhook-post"
	ReceiverCopyToStream  = "copy-to-stream"
	ReceiverItxCall       = "itx-call"
	ReceiverProcessorWake = "processor-wake"
)

// Receiver is the one arm of a subscription's receiver union that Kind selects; the fields of
// the other arms are ignored.
type Receiver struct {
	Kind string // one of the Receiver* constants

	URL     string   // webhook-post
	Headers []Header // webhook-post
	Secret  string   // webhook-post: Standard Webhooks signing secret; empty: unsigned

	Path string // copy-to-stream: the receiving stream in the same project

	Capability string // itx-call: the name a Receiver is mounted under

	Placement string // processor-wake: "in-process" (default; the seed's "facet" is taken for it) or "remote"
	// Processor (processor-wake): the registered contract this instance runs; empty: the
	// subscription's name. Two names may run one contract, each with its own progress.
	Processor string
}

// Header is one HTTP header of a webhook-post receiver.
type Header struct {
	Name  string
	Value string
}

// SubscriptionConfig is what Subscriptions.configure appends as the birth (or reconfiguration)
// event. Start is "beginning" (the default) or "now"; OnFailingEvent is "halt" (the default) or
// "skip".
type SubscriptionConfig struct {
	Name            string // empty: generated as "subscription:<birth offset>"
	Receiver        Receiver
	FilterTypes     []string
	FilterCondition string // JSONata; must evaluate to exactly true
	Transform       string // JSONata over the event
	Start           string
	OnFailingEvent  string
	// DeadLetterPath (OnFailingEvent "skip" only) is a stream of the project where each skipped
	// event lands, once, as an itx.TypeDeadLetter event, before the cursor moves past it.
	DeadLetterPath string
	Description    string
	// MaxDeliveryEvents and MaxDeliveryBytes narrow each delivery (0: the kind's default: 1,000
	// events, one for webhook-post; 1 MiB). A webhook asking for more than one event gets them
	// as an "events" array (itx.WebhookBatchBody).
	MaxDeliveryEvents int
	MaxDeliveryBytes  int
	// ConfirmWindow makes an itx-call or webhook-post subscription offset-acking (0: off): the
	// receiver's answer marks a batch delivered and confirms through the offset it names (0:
	// nothing yet); ConfirmSubscription confirms later. At most ConfirmWindow events (1..10,000)
	// are delivered and unconfirmed at a time; they go again after a failure, a new mount of the
	// receiver's name or a restart.
	ConfirmWindow int
	// IdempotencyKey makes a configure retry-safe; required when Name is empty (a retry with it
	// returns the original event and generated name). Not part of the stored config.
	IdempotencyKey string
}

// Subscriptions returns stream.subscriptions() at once, pipelined (see Stream). Release it when
// done.
func Subscriptions(ctx context.Context, s schema.Stream) schema.Subscriptions {
	fut, release := s.Subscriptions(lasting(ctx), nil)
	return keepAnswers(fut.Subscriptions().AddRef(), release)
}

// Subscription returns stream.subscriptions().get(name) at once, pipelined (see Stream): a name
// that does not exist fails the calls made on it. Release it when done.
func Subscription(ctx context.Context, s schema.Stream, name string) schema.Subscription {
	ctx = lasting(ctx)
	sf, releaseSubs := s.Subscriptions(ctx, nil)
	fut, release := sf.Subscriptions().Get(ctx, func(p schema.Subscriptions_get_Params) error { return p.SetName(name) })
	return keepAnswers(fut.Subscription().AddRef(), release, releaseSubs)
}

// Processor returns subscription.processor() at once, pipelined (see Stream): the processor
// instance a processor-wake subscription runs, for Snapshot, RuntimeState and WatchProcessor.
// On a subscription of another kind the calls made on it fail. Release it when done.
func Processor(ctx context.Context, sub schema.Subscription) schema.Processor {
	fut, release := sub.Processor(lasting(ctx), nil)
	return keepAnswers(fut.Processor().AddRef(), release)
}

// ListSubscriptions lists a stream's subscriptions.
func ListSubscriptions(ctx context.Context, subs schema.Subscriptions) ([]itx.SubscriptionSummary, error) {
	if err := NotSent(ctx, "ListSubscriptions"); err != nil {
		return nil, err
	}
	fut, release := subs.List(ctx, nil)
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return nil, err
	}
	list, err := res.Subscriptions()
	if err != nil {
		return nil, err
	}
	return fromList(list, wire.SubscriptionSummaryFromSchema)
}

// ConfigureSubscription appends the subscription's configured event and returns its name (the
// generated one when cfg.Name is empty) and the event's offset.
func ConfigureSubscription(ctx context.Context, subs schema.Subscriptions, cfg SubscriptionConfig) (string, int64, error) {
	// Checked before the call: an error from building the arguments reaches the caller as
	// go-capnp's "place arguments" failure, without its code.
	ic, err := cfg.Config()
	if err != nil {
		return "", 0, err
	}
	if err := NotSent(ctx, "ConfigureSubscription"); err != nil {
		return "", 0, err
	}
	fut, release := subs.Configure(ctx, func(p schema.Subscriptions_configure_Params) error {
		c, err := p.NewConfig()
		if err != nil {
			return err
		}
		if err := p.SetIdempotencyKey(cfg.IdempotencyKey); err != nil {
			return err
		}
		return wire.SetSubscriptionConfig(c, &ic)
	})
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return "", 0, err
	}
	name, err := res.Name()
	return name, int64(res.Offset()), err
}

// RemoveSubscription appends stream/subscription-removed and returns its offset.
func RemoveSubscription(ctx context.Context, subs schema.Subscriptions, name string) (int64, error) {
	if err := NotSent(ctx, "RemoveSubscription"); err != nil {
		return 0, err
	}
	fut, release := subs.Remove(ctx, func(p schema.Subscriptions_remove_Params) error { return p.SetName(name) })
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return 0, err
	}
	return int64(res.Offset()), nil
}

// DescribeSubscription returns a subscription's config and cursor row.
func DescribeSubscription(ctx context.Context, sub schema.Subscription) (itx.SubscriptionDescription, error) {
	if err := NotSent(ctx, "DescribeSubscription"); err != nil {
		return itx.SubscriptionDescription{}, err
	}
	fut, release := sub.Describe(ctx, nil)
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return itx.SubscriptionDescription{}, err
	}
	d, err := res.Description()
	if err != nil {
		return itx.SubscriptionDescription{}, err
	}
	return wire.SubscriptionDescriptionFromSchema(d)
}

// WaitUntilProcessed waits until the subscription has processed through offset and returns its
// confirmed offset; a zero timeout is the server's default (20 s).
func WaitUntilProcessed(ctx context.Context, sub schema.Subscription, offset int64, timeout time.Duration) (int64, error) {
	ms, err := barrierTimeoutMs(timeout)
	if err == nil {
		err = offsetArg("offset", offset)
	}
	if err != nil {
		return 0, err
	}
	if err := NotSent(ctx, "WaitUntilProcessed"); err != nil {
		return 0, err
	}
	fut, release := sub.WaitUntilProcessed(ctx, func(p schema.Subscription_waitUntilProcessed_Params) error {
		p.SetOffset(uint64(offset))
		p.SetTimeoutMs(ms)
		return nil
	})
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return 0, err
	}
	return int64(res.ConfirmedOffset()), nil
}

// ConfirmSubscription confirms an offset-acking subscription's deliveries through offset (at most
// what was delivered) and returns its confirmed cursor, once written. A batch counts as delivered
// once the receiver's answer for it is back at itxd: a confirm sent from elsewhere while the
// handler that received the batch has not returned yet can overtake that answer and be refused
// (invalidArgument, "was not delivered"); confirm after the handler returned, or try again.
func ConfirmSubscription(ctx context.Context, sub schema.Subscription, offset int64) (int64, error) {
	if err := offsetArg("offset", offset); err != nil {
		return 0, err
	}
	if err := NotSent(ctx, "ConfirmSubscription"); err != nil {
		return 0, err
	}
	fut, release := sub.Confirm(ctx, func(p schema.Subscription_confirm_Params) error {
		p.SetOffset(uint64(offset))
		return nil
	})
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return 0, err
	}
	return int64(res.ConfirmedOffset()), nil
}

// SetSubscriptionCursor appends stream/subscription-cursor-set (a seek: delivery resumes after
// afterOffset) and returns the event's offset.
func SetSubscriptionCursor(ctx context.Context, s schema.Stream, name string, afterOffset int64) (int64, error) {
	if err := offsetArg("afterOffset", afterOffset); err != nil {
		return 0, err
	}
	if err := NotSent(ctx, "SetSubscriptionCursor"); err != nil {
		return 0, err
	}
	fut, release := s.SetSubscriptionCursor(ctx, func(p schema.Stream_setSubscriptionCursor_Params) error {
		p.SetAfterOffset(uint64(afterOffset))
		return p.SetName(name)
	})
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return 0, err
	}
	return int64(res.Offset()), nil
}

// ResumeSubscription appends stream/subscription-delivery-resumed for a halted subscription and
// returns the event's offset.
func ResumeSubscription(ctx context.Context, s schema.Stream, name string) (int64, error) {
	if err := NotSent(ctx, "ResumeSubscription"); err != nil {
		return 0, err
	}
	fut, release := s.ResumeSubscription(ctx, func(p schema.Stream_resumeSubscription_Params) error { return p.SetName(name) })
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return 0, err
	}
	return int64(res.Offset()), nil
}

// Config is cfg in the domain's form, what the configured event stores. It refuses a receiver
// kind, start or failing-event policy it does not know; the server checks the rest.
func (cfg *SubscriptionConfig) Config() (itx.SubscriptionConfig, error) {
	out := itx.SubscriptionConfig{Name: cfg.Name, Description: cfg.Description,
		MaxDeliveryEvents: cfg.MaxDeliveryEvents, MaxDeliveryBytes: cfg.MaxDeliveryBytes, ConfirmWindow: cfg.ConfirmWindow}
	if len(cfg.FilterTypes) > 0 || cfg.FilterCondition != "" {
		out.Filter = &itx.SubscriptionFilter{EventTypes: cfg.FilterTypes, JSONataCondition: cfg.FilterCondition}
	}
	start, err := oneOf("start", cfg.Start, itx.StartBeginning, itx.StartNow)
	if err != nil {
		return out, err
	}
	onFailing, err := oneOf("onFailingEvent", cfg.OnFailingEvent, itx.OnFailingHalt, itx.OnFailingSkip)
	if err != nil {
		return out, err
	}
	delivery := &itx.DeliveryPolicy{Start: start, OnFailingEvent: onFailing, DeadLetterPath: cfg.DeadLetterPath}
	r, in := &out.Receiver, cfg.Receiver
	if in.Processor != "" && in.Kind != ReceiverProcessorWake {
		return out, itx.Errorf(itx.EInvalid, "receiver.processor is a field of a %s receiver, not of %s", ReceiverProcessorWake, in.Kind)
	}
	r.Action, r.JSONataTransform, r.Delivery = in.Kind, cfg.Transform, delivery
	switch in.Kind {
	case ReceiverWebhookPost:
		r.URL, r.Secret = in.URL, in.Secret
		for _, h := range in.Headers {
			if r.Headers == nil {
				r.Headers = map[string]string{}
			}
			r.Headers[h.Name] = h.Value
		}
	case ReceiverCopyToStream:
		r.ReceivingStreamPath = in.Path
	case ReceiverItxCall:
		r.Capability = in.Capability
	case ReceiverProcessorWake:
		if cfg.DeadLetterPath != "" {
			return out, itx.Errorf(itx.EInvalid, "deadLetterPath is not for %s receivers: the processor owns its checkpoint", in.Kind)
		}
		// Dropped here, a start or skip would go unheard: the processor would run from its own
		// checkpoint (the beginning) and never skip.
		if start != itx.StartBeginning || onFailing != itx.OnFailingHalt {
			return out, itx.Errorf(itx.EInvalid, "%s receivers take no start or onFailingEvent: the processor owns its checkpoint", in.Kind)
		}
		r.Placement, r.Processor, r.Delivery = in.Placement, in.Processor, nil // the processor owns its checkpoint
	default:
		return out, itx.Errorf(itx.EInvalid, "receiver kind %q is not one of %s, %s, %s, %s", in.Kind,
			ReceiverWebhookPost, ReceiverCopyToStream, ReceiverItxCall, ReceiverProcessorWake)
	}
	return out, nil
}

// oneOf is v if it is def or other, def if it is empty.
func oneOf(field, v, def, other string) (string, error) {
	switch v {
	case "":
		return def, nil
	case def, other:
		return v, nil
	}
	return "", itx.Errorf(itx.EInvalid, "%s %q is not %s or %s", field, v, def, other)
}

// ConfigOf is c in the client's flat form, as describe reports it: defaults are spelled out and
// headers are sorted by name.
func ConfigOf(c itx.SubscriptionConfig) SubscriptionConfig {
	d := c.Receiver.EffectiveDelivery()
	out := SubscriptionConfig{Name: c.Name, Description: c.Description, Transform: c.Receiver.JSONataTransform,
		Start: d.Start, OnFailingEvent: d.OnFailingEvent, DeadLetterPath: d.DeadLetterPath, MaxDeliveryEvents: c.MaxDeliveryEvents, MaxDeliveryBytes: c.MaxDeliveryBytes,
		ConfirmWindow: c.ConfirmWindow}
	if f := c.Filter; f != nil {
		out.FilterCondition = f.JSONataCondition
		if len(f.EventTypes) > 0 { // none: every type, as in a config that never set it
			out.FilterTypes = f.EventTypes
		}
	}
	r := c.Receiver
	out.Receiver = Receiver{Kind: r.Action, URL: r.URL, Secret: r.Secret, Path: r.ReceivingStreamPath,
		Capability: r.Capability, Placement: r.Placement, Processor: r.Processor}
	for name, value := range r.Headers {
		out.Receiver.Headers = append(out.Receiver.Headers, Header{Name: name, Value: value})
	}
	sort.Slice(out.Receiver.Headers, func(i, j int) bool { return out.Receiver.Headers[i].Name < out.Receiver.Headers[j].Name })
	return out
}
