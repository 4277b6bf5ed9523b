package wire

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"capnproto.org/go/capnp/v3"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
)

// requireTyped fails unless err is an *itx.Error with code: the refusal a client can act on.
func requireTyped(t *testing.T, err error, code itx.Code) {
	t.Helper()
	var e *itx.Error
	if !errors.As(err, &e) || e.Code != code {
		t.Fatalf("refusal is not an itx.%s error: %T %v", code, err, err)
	}
}

func newSegment(t *testing.T) *capnp.Segment {
	t.Helper()
	_, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	if err != nil {
		t.Fatal(err)
	}
	return seg
}

// FuzzEventInputFromSchema builds an append's EventInput from fuzzed fields (any bytes in the
// texts), decodes it as itxd does and normalizes it. Properties: the decoded input is what was
// sent, byte for byte; a refusal is typed; an accepted input encodes and decodes back to itself.
func FuzzEventInputFromSchema(f *testing.F) {
	f.Add("note", `{"a":1}`, "", "", false)
	f.Add("note", "", "k", `{"m":1}`, false)
	f.Add("e", `{}`, "", "", true)
	f.Add("bad\xff", "{\"a\":\"\xfe\"}", "k\xff", "{\"\xff\":1}", false)
	f.Add("t", `{}`, " ", " null ", true)
	f.Fuzz(func(t *testing.T, typ, payload, key, metadata string, ephemeral bool) {
		src, err := schema.NewRootEventInput(newSegment(t))
		if err != nil {
			t.Fatal(err)
		}
		sent := itx.EventInput{Type: typ, Payload: json.RawMessage(payload), IdempotencyKey: key, Metadata: json.RawMessage(metadata), Ephemeral: ephemeral}
		if err := SetEventInput(src, &sent); err != nil {
			t.Fatal(err)
		}
		got, err := EventInputFromSchema(src)
		if err != nil {
			t.Fatal(err)
		}
		if got.Type != typ || string(got.Payload) != payload || got.IdempotencyKey != key || string(got.Metadata) != metadata || got.Ephemeral != ephemeral {
			t.Fatalf("decoded %+v, sent %+v", got, sent)
		}
		if err := got.Normalize(); err != nil {
			if itx.ErrorCode(err) == itx.ETooLarge {
				requireTyped(t, err, itx.ETooLarge)
			} else {
				requireTyped(t, err, itx.EInvalid)
			}
			return
		}
		dst, err := schema.NewRootEventInput(newSegment(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := SetEventInput(dst, &got); err != nil {
			t.Fatal(err)
		}
		back, err := EventInputFromSchema(dst)
		if err != nil {
			t.Fatal(err)
		}
		if err := back.Normalize(); err != nil || !reflect.DeepEqual(back, got) {
			t.Fatalf("accepted input changes through the wire: %v\n%+v\n%+v", err, got, back)
		}
	})
}

// FuzzSubscriptionConfigFromSchema builds Subscriptions.configure's SubscriptionConfig from
// fuzzed fields and runs it as itxd does: decode, the configured event's JSON, Normalize and the
// core reducer's parse. Properties: a refusal is EInvalid; nothing sent is silently dropped or
// rewritten (each header sent is kept, texts arrive as sent, spaces trimmed where the config
// trims them); and the config a client reads back (SetSubscriptionConfig, decoded again)
// configures exactly the same config.
func FuzzSubscriptionConfigFromSchema(f *testing.F) {
	f.Add(uint8(0), "w", "", "https://example.com/h", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "X-A", "1", "X-B", "2", uint8(2), "order,*", "payload.n > 1", "", false, false, "", uint32(0), uint32(0), uint32(0))
	f.Add(uint8(0), "w", "", "http://h", "", "X-A", "1", "x-a", "2", uint8(2), "", "", "", true, true, "/dl", uint32(10), uint32(1000), uint32(5))
	f.Add(uint8(0), "w", "", "http://h", "", "X-A", "1", "X-A", "2", uint8(2), "", "", "", false, false, "", uint32(0), uint32(0), uint32(0))
	f.Add(uint8(1), " c ", "d", " /b ", "", "", "", "", "", uint8(0), "a", "", "$", true, false, "", uint32(0), uint32(0), uint32(0))
	f.Add(uint8(2), "", "", "cap", "", "", "", "", "", uint8(0), "", "", "", false, true, "/dl", uint32(0), uint32(0), uint32(10))
	f.Add(uint8(3), "p", "", "facet", "counter", "", "", "", "", uint8(0), "", "", "", false, false, "", uint32(0), uint32(0), uint32(0))
	f.Add(uint8(3), "p", "", "remote", "", "", "", "", "", uint8(0), "", "", "", false, false, "/dl", uint32(0), uint32(0), uint32(0))
	f.Add(uint8(2), "n\xff", "", "cap", "", "", "", "", "", uint8(0), "a b", "", "", false, false, "", uint32(0), uint32(0), uint32(1<<31))
	f.Fuzz(func(t *testing.T, kind uint8, name, description, a, b, h1, v1, h2, v2 string, nHeaders uint8,
		types, cond, transform string, now, skip bool, deadLetter string, maxEvents, maxBytes, window uint32) {
		src, err := schema.NewRootSubscriptionConfig(newSegment(t))
		if err != nil {
			t.Fatal(err)
		}
		must := func(err error) {
			if err != nil {
				t.Fatal(err)
			}
		}
		must(src.SetName(name))
		must(src.SetDescription(description))
		var sentTypes []string
		if types != "" {
			sentTypes = strings.Split(types, ",")
			must(SetTextList(sentTypes, src.NewFilterTypes))
		}
		must(src.SetFilterCondition(cond))
		must(src.SetTransform(transform))
		if now {
			src.SetStart(schema.StartPosition_now)
		}
		if skip {
			src.SetOnFailingEvent(schema.FailingEventPolicy_skip)
		}
		must(src.SetDeadLetterPath(deadLetter))
		src.SetMaxDeliveryEvents(maxEvents)
		src.SetMaxDeliveryBytes(maxBytes)
		src.SetConfirmWindow(window)
		recv := src.Receiver()
		sentHeaders := 0
		switch kind % 4 {
		case 0:
			recv.SetWebhookPost()
			w := recv.WebhookPost()
			must(w.SetUrl(a))
			must(w.SetSecret(b))
			if sentHeaders = int(nHeaders % 3); sentHeaders > 0 {
				list, err := w.NewHeaders(int32(sentHeaders))
				must(err)
				for i, h := range [][2]string{{h1, v1}, {h2, v2}}[:sentHeaders] {
					must(list.At(i).SetName(h[0]))
					must(list.At(i).SetValue(h[1]))
				}
			}
		case 1:
			recv.SetCopyToStream()
			must(recv.CopyToStream().SetPath(a))
		case 2:
			recv.SetItxCall()
			must(recv.ItxCall().SetCapability(a))
		case 3:
			recv.SetProcessorWake()
			must(recv.ProcessorWake().SetPlacement(a))
			must(recv.ProcessorWake().SetProcessor(b))
		}
		cfg, err := SubscriptionConfigFromSchema(src)
		if err != nil {
			requireTyped(t, err, itx.EInvalid)
			return
		}
		parsed, err := configure(cfg)
		if err != nil {
			requireTyped(t, err, itx.EInvalid)
			return
		}
		r := &parsed.Receiver
		if len(r.Headers) != sentHeaders {
			t.Fatalf("sent %d headers, the config keeps %v", sentHeaders, r.Headers)
		}
		if parsed.Name != "" && parsed.Name != strings.TrimSpace(name) || parsed.Description != strings.TrimSpace(description) {
			t.Fatalf("name %q description %q arrived as %q %q", name, description, parsed.Name, parsed.Description)
		}
		if f := parsed.Filter; f != nil && len(f.EventTypes) != len(sentTypes) {
			t.Fatalf("sent the types %q, the filter keeps %q", sentTypes, f.EventTypes)
		}
		if r.Action == itx.KindWebhookPost && (r.URL != a || r.Secret != b) {
			t.Fatalf("url %q secret %q arrived as %q %q", a, b, r.URL, r.Secret)
		}
		// What a client reads back and sends again configures the same subscription.
		dst, err := schema.NewRootSubscriptionConfig(newSegment(t))
		if err != nil {
			t.Fatal(err)
		}
		must(SetSubscriptionConfig(dst, parsed))
		readBack, err := SubscriptionConfigFromSchema(dst)
		if err != nil {
			t.Fatalf("the config read back does not decode: %v", err)
		}
		again, err := configure(readBack)
		if err != nil {
			t.Fatalf("the config read back is refused: %v", err)
		}
		if !reflect.DeepEqual(canonical(parsed), canonical(again)) {
			t.Fatalf("the config read back configures another config:\n%+v\n%+v", parsed, again)
		}
	})
}

// configure is what itxd does with a decoded config before it is in the catalog: the name
// trimmed (Server.StartConfigureSubscription), the configured event's JSON, the append's
// Normalize and the core reducer's parse.
func configure(cfg itx.SubscriptionConfig) (*itx.SubscriptionConfig, error) {
	name := strings.TrimSpace(cfg.Name)
	if name == "" && cfg.Name != "" {
		return nil, itx.Errorf(itx.EInvalid, "blank name")
	}
	cfg.Name = name
	payload, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	in := itx.EventInput{Type: itx.TypeSubscriptionConfigured, Payload: payload}
	if err := in.Normalize(); err != nil {
		return nil, err
	}
	return itx.ParseSubscriptionConfig(in.Payload)
}

// canonical spells out the defaults a read-back config states: the delivery policy (the wire
// always carries one for the push kinds) and an empty filter as none.
func canonical(c *itx.SubscriptionConfig) itx.SubscriptionConfig {
	out := *c
	if out.Receiver.Action != itx.KindProcessorWake {
		d := out.Receiver.EffectiveDelivery()
		out.Receiver.Delivery = &d
	}
	if f := out.Filter; f != nil && len(f.EventTypes) == 0 && f.JSONataCondition == "" {
		out.Filter = nil
	}
	return out
}
