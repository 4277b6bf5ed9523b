package client

import (
	"context"
	"github.com/itx-dev/itx"
	"time"

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

	Placement string // processor-wake: "in-process" (default) or "remote"
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
	Description     string
}

// SubscriptionSummary is a row of subscriptions.list(): the catalog joined with the cursor row.
type SubscriptionSummary struct {
	Name               string
	Kind               string
	Status             string // "active" or "halted"
	ConfirmedOffset    int64
	Lag                int64 // head - confirmed
	LastError          string
	ConfiguredAtOffset int64
}

// SubscriptionDescription is a subscription's config and its whole cursor row.
type SubscriptionDescription struct {
	Config                            SubscriptionConfig
	Kind                              string
	Status                            string
	ConfiguredAtOffset                int64
	CursorChangedAtOffset             int64
	ConfirmedOffset                   int64
	HeadOffset                        int64
	Attempt                           int
	NextAttemptAt                     int64
	FailingEventOffset                int64
	FailingEventAttempt               int
	FailingEventSkipsSinceLastSuccess int
	LastError                         string
	InFlightDeadlineAt                int64
	InFlightConnectionGeneration      int64
	UpdatedAt                         string
}

// Subscriptions returns stream.subscriptions() as a pipelined capability. Release it when done.
func Subscriptions(ctx context.Context, s schema.Stream) schema.Subscriptions {
	fut, release := s.Subscriptions(ctx, nil)
	subs := fut.Subscriptions().AddRef()
	release()
	return subs
}

// Subscription returns stream.subscriptions().get(name) as a pipelined capability: a name that
// does not exist fails the calls made on it. Release it when done.
func Subscription(ctx context.Context, s schema.Stream, name string) schema.Subscription {
	subs := Subscriptions(ctx, s)
	defer subs.Release()
	fut, release := subs.Get(ctx, func(p schema.Subscriptions_get_Params) error { return p.SetName(name) })
	sub := fut.Subscription().AddRef()
	release()
	return sub
}

// ListSubscriptions lists a stream's subscriptions.
func ListSubscriptions(ctx context.Context, subs schema.Subscriptions) ([]SubscriptionSummary, error) {
	fut, release := subs.List(ctx, nil)
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return nil, err
	}
	list, err := res.Subscriptions()
	if err != nil {
		return nil, err
	}
	out := make([]SubscriptionSummary, list.Len())
	for i := range out {
		s := list.At(i)
		row := SubscriptionSummary{Status: s.Status().String(), ConfirmedOffset: int64(s.ConfirmedOffset()),
			Lag: int64(s.Lag()), ConfiguredAtOffset: int64(s.ConfiguredAtOffset())}
		if row.Name, err = s.Name(); err != nil {
			return nil, err
		}
		if row.Kind, err = s.Kind(); err != nil {
			return nil, err
		}
		if row.LastError, err = s.LastError(); err != nil {
			return nil, err
		}
		out[i] = row
	}
	return out, nil
}

// ConfigureSubscription appends the subscription's configured event and returns its name (the
// generated one when cfg.Name is empty) and the event's offset.
func ConfigureSubscription(ctx context.Context, subs schema.Subscriptions, cfg SubscriptionConfig) (string, int64, error) {
	// Checked before the call: an error from building the arguments reaches the caller as
	// go-capnp's "place arguments" failure, without its code.
	if err := checkSubscriptionConfig(&cfg); err != nil {
		return "", 0, err
	}
	fut, release := subs.Configure(ctx, func(p schema.Subscriptions_configure_Params) error {
		c, err := p.NewConfig()
		if err != nil {
			return err
		}
		return setSubscriptionConfig(c, &cfg)
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return "", 0, err
	}
	name, err := res.Name()
	return name, int64(res.Offset()), err
}

// RemoveSubscription appends stream/subscription-removed and returns its offset.
func RemoveSubscription(ctx context.Context, subs schema.Subscriptions, name string) (int64, error) {
	fut, release := subs.Remove(ctx, func(p schema.Subscriptions_remove_Params) error { return p.SetName(name) })
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return 0, err
	}
	return int64(res.Offset()), nil
}

// DescribeSubscription returns a subscription's config and cursor row.
func DescribeSubscription(ctx context.Context, sub schema.Subscription) (SubscriptionDescription, error) {
	fut, release := sub.Describe(ctx, nil)
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return SubscriptionDescription{}, err
	}
	d, err := res.Description()
	if err != nil {
		return SubscriptionDescription{}, err
	}
	out := SubscriptionDescription{
		Status:                            d.Status().String(),
		ConfiguredAtOffset:                int64(d.ConfiguredAtOffset()),
		CursorChangedAtOffset:             int64(d.CursorChangedAtOffset()),
		ConfirmedOffset:                   int64(d.ConfirmedOffset()),
		HeadOffset:                        int64(d.HeadOffset()),
		Attempt:                           int(d.Attempt()),
		NextAttemptAt:                     d.NextAttemptAt(),
		FailingEventOffset:                int64(d.FailingEventOffset()),
		FailingEventAttempt:               int(d.FailingEventAttempt()),
		FailingEventSkipsSinceLastSuccess: int(d.FailingEventSkipsSinceLastSuccess()),
		InFlightDeadlineAt:                d.InFlightDeadlineAt(),
		InFlightConnectionGeneration:      int64(d.InFlightConnectionGeneration()),
	}
	if out.Kind, err = d.Kind(); err != nil {
		return out, err
	}
	if out.LastError, err = d.LastError(); err != nil {
		return out, err
	}
	if out.UpdatedAt, err = d.UpdatedAt(); err != nil {
		return out, err
	}
	if d.HasConfig() {
		c, err := d.Config()
		if err != nil {
			return out, err
		}
		if out.Config, err = subscriptionConfig(c); err != nil {
			return out, err
		}
	}
	return out, nil
}

// WaitUntilProcessed waits until the subscription has processed through offset and returns its
// confirmed offset; a zero timeout is the server's default (20 s).
func WaitUntilProcessed(ctx context.Context, sub schema.Subscription, offset int64, timeout time.Duration) (int64, error) {
	fut, release := sub.WaitUntilProcessed(ctx, func(p schema.Subscription_waitUntilProcessed_Params) error {
		p.SetOffset(uint64(offset))
		p.SetTimeoutMs(uint32(timeout.Milliseconds()))
		return nil
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return 0, err
	}
	return int64(res.ConfirmedOffset()), nil
}

// SetSubscriptionCursor appends stream/subscription-cursor-set (a seek: delivery resumes after
// afterOffset) and returns the event's offset.
func SetSubscriptionCursor(ctx context.Context, s schema.Stream, name string, afterOffset int64) (int64, error) {
	fut, release := s.SetSubscriptionCursor(ctx, func(p schema.Stream_setSubscriptionCursor_Params) error {
		p.SetAfterOffset(uint64(afterOffset))
		return p.SetName(name)
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return 0, err
	}
	return int64(res.Offset()), nil
}

// ResumeSubscription appends stream/subscription-delivery-resumed for a halted subscription and
// returns the event's offset.
func ResumeSubscription(ctx context.Context, s schema.Stream, name string) (int64, error) {
	fut, release := s.ResumeSubscription(ctx, func(p schema.Stream_resumeSubscription_Params) error { return p.SetName(name) })
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return 0, err
	}
	return int64(res.Offset()), nil
}

// checkSubscriptionConfig refuses the enum strings the schema has no value for, with EInvalid.
func checkSubscriptionConfig(cfg *SubscriptionConfig) error {
	switch cfg.Receiver.Kind {
	case ReceiverWebhookPost, ReceiverCopyToStream, ReceiverItxCall, ReceiverProcessorWake:
	default:
		return itx.Errorf(itx.EInvalid, "receiver kind %q is not one of %s, %s, %s, %s", cfg.Receiver.Kind,
			ReceiverWebhookPost, ReceiverCopyToStream, ReceiverItxCall, ReceiverProcessorWake)
	}
	switch cfg.Start {
	case "", "beginning", "now":
	default:
		return itx.Errorf(itx.EInvalid, "start %q is not beginning or now", cfg.Start)
	}
	switch cfg.OnFailingEvent {
	case "", "halt", "skip":
	default:
		return itx.Errorf(itx.EInvalid, "onFailingEvent %q is not halt or skip", cfg.OnFailingEvent)
	}
	return nil
}

func setSubscriptionConfig(c schema.SubscriptionConfig, cfg *SubscriptionConfig) error {
	if err := c.SetName(cfg.Name); err != nil {
		return err
	}
	r := c.Receiver()
	switch cfg.Receiver.Kind {
	case ReceiverWebhookPost:
		r.SetWebhookPost()
		w := r.WebhookPost()
		if err := w.SetUrl(cfg.Receiver.URL); err != nil {
			return err
		}
		if err := w.SetSecret(cfg.Receiver.Secret); err != nil {
			return err
		}
		if len(cfg.Receiver.Headers) > 0 {
			hs, err := w.NewHeaders(int32(len(cfg.Receiver.Headers)))
			if err != nil {
				return err
			}
			for i, h := range cfg.Receiver.Headers {
				if err := hs.At(i).SetName(h.Name); err != nil {
					return err
				}
				if err := hs.At(i).SetValue(h.Value); err != nil {
					return err
				}
			}
		}
	case ReceiverCopyToStream:
		r.SetCopyToStream()
		if err := r.CopyToStream().SetPath(cfg.Receiver.Path); err != nil {
			return err
		}
	case ReceiverItxCall:
		r.SetItxCall()
		if err := r.ItxCall().SetCapability(cfg.Receiver.Capability); err != nil {
			return err
		}
	case ReceiverProcessorWake:
		r.SetProcessorWake()
		if err := r.ProcessorWake().SetPlacement(cfg.Receiver.Placement); err != nil {
			return err
		}
	default:
		return checkSubscriptionConfig(cfg)
	}
	if err := wire.SetTextList(cfg.FilterTypes, c.NewFilterTypes); err != nil {
		return err
	}
	if err := c.SetFilterCondition(cfg.FilterCondition); err != nil {
		return err
	}
	if err := c.SetTransform(cfg.Transform); err != nil {
		return err
	}
	switch cfg.Start {
	case "", "beginning":
		c.SetStart(schema.StartPosition_beginning)
	case "now":
		c.SetStart(schema.StartPosition_now)
	default:
		return checkSubscriptionConfig(cfg)
	}
	switch cfg.OnFailingEvent {
	case "", "halt":
		c.SetOnFailingEvent(schema.FailingEventPolicy_halt)
	case "skip":
		c.SetOnFailingEvent(schema.FailingEventPolicy_skip)
	default:
		return checkSubscriptionConfig(cfg)
	}
	return c.SetDescription(cfg.Description)
}

func subscriptionConfig(c schema.SubscriptionConfig) (SubscriptionConfig, error) {
	out := SubscriptionConfig{Start: c.Start().String(), OnFailingEvent: c.OnFailingEvent().String()}
	var err error
	if out.Name, err = c.Name(); err != nil {
		return out, err
	}
	r := c.Receiver()
	switch r.Which() {
	case schema.SubscriptionConfig_receiver_Which_webhookPost:
		w := r.WebhookPost()
		out.Receiver.Kind = ReceiverWebhookPost
		if out.Receiver.URL, err = w.Url(); err != nil {
			return out, err
		}
		if out.Receiver.Secret, err = w.Secret(); err != nil {
			return out, err
		}
		hs, err := w.Headers()
		if err != nil {
			return out, err
		}
		for i := 0; i < hs.Len(); i++ {
			name, _ := hs.At(i).Name()
			value, _ := hs.At(i).Value()
			out.Receiver.Headers = append(out.Receiver.Headers, Header{Name: name, Value: value})
		}
	case schema.SubscriptionConfig_receiver_Which_copyToStream:
		out.Receiver.Kind = ReceiverCopyToStream
		if out.Receiver.Path, err = r.CopyToStream().Path(); err != nil {
			return out, err
		}
	case schema.SubscriptionConfig_receiver_Which_itxCall:
		out.Receiver.Kind = ReceiverItxCall
		if out.Receiver.Capability, err = r.ItxCall().Capability(); err != nil {
			return out, err
		}
	case schema.SubscriptionConfig_receiver_Which_processorWake:
		out.Receiver.Kind = ReceiverProcessorWake
		if out.Receiver.Placement, err = r.ProcessorWake().Placement(); err != nil {
			return out, err
		}
	}
	if out.FilterTypes, err = wire.TextList(c.FilterTypes()); err != nil {
		return out, err
	}
	if len(out.FilterTypes) == 0 {
		out.FilterTypes = nil // every type, as in a config that never set it
	}
	if out.FilterCondition, err = c.FilterCondition(); err != nil {
		return out, err
	}
	if out.Transform, err = c.Transform(); err != nil {
		return out, err
	}
	out.Description, err = c.Description()
	return out, err
}
