package wire

import (
	"math"
	"unicode/utf8"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
)

// SubscriptionConfigFromSchema decodes a SubscriptionConfig into the configured event's payload.
func SubscriptionConfigFromSchema(c schema.SubscriptionConfig) (itx.SubscriptionConfig, error) {
	var cfg itx.SubscriptionConfig
	var err error
	if cfg.Name, err = c.Name(); err != nil {
		return cfg, err
	}
	if cfg.Description, err = c.Description(); err != nil {
		return cfg, err
	}
	types, err := TextList(c.FilterTypes())
	if err != nil {
		return cfg, err
	}
	cond, err := c.FilterCondition()
	if err != nil {
		return cfg, err
	}
	if len(types) > 0 || cond != "" {
		cfg.Filter = &itx.SubscriptionFilter{EventTypes: types, JSONataCondition: cond}
	}
	cfg.MaxDeliveryEvents, cfg.MaxDeliveryBytes = int(c.MaxDeliveryEvents()), int(c.MaxDeliveryBytes())
	cfg.ConfirmWindow = int(min(c.ConfirmWindow(), math.MaxInt32))
	r := &cfg.Receiver
	if r.JSONataTransform, err = c.Transform(); err != nil {
		return cfg, err
	}
	delivery := &itx.DeliveryPolicy{Start: itx.StartBeginning, OnFailingEvent: itx.OnFailingHalt}
	if c.Start() == schema.StartPosition_now {
		delivery.Start = itx.StartNow
	}
	if c.OnFailingEvent() == schema.FailingEventPolicy_skip {
		delivery.OnFailingEvent = itx.OnFailingSkip
	}
	if delivery.DeadLetterPath, err = c.DeadLetterPath(); err != nil {
		return cfg, err
	}
	recv := c.Receiver()
	switch recv.Which() {
	case schema.SubscriptionConfig_receiver_Which_webhookPost:
		w := recv.WebhookPost()
		r.Action, r.Delivery = itx.KindWebhookPost, delivery
		if r.URL, err = w.Url(); err != nil {
			return cfg, err
		}
		if r.Secret, err = w.Secret(); err != nil {
			return cfg, err
		}
		headers, err := w.Headers()
		if err != nil {
			return cfg, err
		}
		for i := 0; i < headers.Len(); i++ {
			if r.Headers == nil {
				r.Headers = map[string]string{}
			}
			name, _ := headers.At(i).Name()
			value, _ := headers.At(i).Value()
			if _, twice := r.Headers[name]; twice {
				// A map keeps one: the other value would be dropped without a word.
				return cfg, itx.Errorf(itx.EInvalid, "receiver.headers names %q twice", name)
			}
			r.Headers[name] = value
		}
	case schema.SubscriptionConfig_receiver_Which_copyToStream:
		r.Action, r.Delivery = itx.KindCopyToStream, delivery
		if r.ReceivingStreamPath, err = recv.CopyToStream().Path(); err != nil {
			return cfg, err
		}
	case schema.SubscriptionConfig_receiver_Which_itxCall:
		r.Action, r.Delivery = itx.KindITXCall, delivery
		if r.Capability, err = recv.ItxCall().Capability(); err != nil {
			return cfg, err
		}
	case schema.SubscriptionConfig_receiver_Which_processorWake:
		r.Action = itx.KindProcessorWake
		if delivery.DeadLetterPath != "" {
			return cfg, itx.Errorf(itx.EInvalid, "processor-wake receivers take no deadLetterPath: the processor owns its checkpoint")
		}
		// The processorWake arm carries no delivery policy: a start or skip sent with one would be
		// dropped unheard (the enums' defaults are the processor's own behavior).
		if delivery.Start != itx.StartBeginning || delivery.OnFailingEvent != itx.OnFailingHalt {
			return cfg, itx.Errorf(itx.EInvalid, "processor-wake receivers take no start or onFailingEvent: the processor owns its checkpoint")
		}
		if r.Placement, err = recv.ProcessorWake().Placement(); err != nil {
			return cfg, err
		}
		if r.Processor, err = recv.ProcessorWake().Processor(); err != nil {
			return cfg, err
		}
	}
	return cfg, checkUTF8(&cfg)
}

// checkUTF8 refuses a config with invalid UTF-8 in any text: the configured event stores the
// config as JSON, and encoding/json would silently replace the bad bytes with U+FFFD, so the
// name (or header, or URL) stored would not be the one sent.
func checkUTF8(cfg *itx.SubscriptionConfig) error {
	r := &cfg.Receiver
	fields := []struct{ name, v string }{
		{"name", cfg.Name}, {"description", cfg.Description}, {"transform", r.JSONataTransform},
		{"receiver.url", r.URL}, {"receiver.secret", r.Secret}, {"receiver.path", r.ReceivingStreamPath},
		{"receiver.capability", r.Capability}, {"receiver.placement", r.Placement},
		{"receiver.processor", r.Processor},
	}
	if r.Delivery != nil {
		fields = append(fields, struct{ name, v string }{"deadLetterPath", r.Delivery.DeadLetterPath})
	}
	if f := cfg.Filter; f != nil {
		fields = append(fields, struct{ name, v string }{"filterCondition", f.JSONataCondition})
		for _, t := range f.EventTypes {
			fields = append(fields, struct{ name, v string }{"filterTypes", t})
		}
	}
	for k, v := range r.Headers {
		fields = append(fields, struct{ name, v string }{"receiver.headers", k + v})
	}
	for _, f := range fields {
		if !utf8.ValidString(f.v) {
			return itx.Errorf(itx.EInvalid, "subscription %s is not valid UTF-8", f.name)
		}
	}
	return nil
}

// SetSubscriptionConfig encodes a configured payload.
func SetSubscriptionConfig(dst schema.SubscriptionConfig, cfg *itx.SubscriptionConfig) error {
	if err := dst.SetName(cfg.Name); err != nil {
		return err
	}
	if err := dst.SetDescription(cfg.Description); err != nil {
		return err
	}
	if f := cfg.Filter; f != nil {
		if err := SetTextList(f.EventTypes, dst.NewFilterTypes); err != nil {
			return err
		}
		if err := dst.SetFilterCondition(f.JSONataCondition); err != nil {
			return err
		}
	}
	dst.SetMaxDeliveryEvents(uint32(max(0, min(cfg.MaxDeliveryEvents, math.MaxUint32))))
	dst.SetMaxDeliveryBytes(uint32(max(0, min(cfg.MaxDeliveryBytes, math.MaxUint32))))
	dst.SetConfirmWindow(uint32(max(0, min(cfg.ConfirmWindow, math.MaxUint32))))
	r := &cfg.Receiver
	if err := dst.SetTransform(r.JSONataTransform); err != nil {
		return err
	}
	d := r.EffectiveDelivery()
	if d.Start == itx.StartNow {
		dst.SetStart(schema.StartPosition_now)
	}
	if d.OnFailingEvent == itx.OnFailingSkip {
		dst.SetOnFailingEvent(schema.FailingEventPolicy_skip)
	}
	if err := dst.SetDeadLetterPath(d.DeadLetterPath); err != nil {
		return err
	}
	recv := dst.Receiver()
	switch r.Action {
	case itx.KindWebhookPost:
		recv.SetWebhookPost()
		w := recv.WebhookPost()
		if err := w.SetUrl(r.URL); err != nil {
			return err
		}
		if err := w.SetSecret(r.Secret); err != nil {
			return err
		}
		if len(r.Headers) > 0 {
			list, err := w.NewHeaders(int32(len(r.Headers)))
			if err != nil {
				return err
			}
			i := 0
			for k, v := range r.Headers {
				list.At(i).SetName(k)
				list.At(i).SetValue(v)
				i++
			}
		}
	case itx.KindCopyToStream:
		recv.SetCopyToStream()
		return recv.CopyToStream().SetPath(r.ReceivingStreamPath)
	case itx.KindITXCall:
		recv.SetItxCall()
		return recv.ItxCall().SetCapability(r.Capability)
	case itx.KindProcessorWake:
		recv.SetProcessorWake()
		if err := recv.ProcessorWake().SetProcessor(r.Processor); err != nil {
			return err
		}
		return recv.ProcessorWake().SetPlacement(r.Placement)
	}
	return nil
}
