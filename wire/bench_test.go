package wire

import (
	"encoding/json"
	"fmt"
	"testing"

	"capnproto.org/go/capnp/v3"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
)

// BenchmarkSetDeliveryBatch encodes a 1,000-event page as a connection pushes it (ns/op per
// page).
func BenchmarkSetDeliveryBatch(b *testing.B) {
	events := make([]itx.Event, 1000)
	for i := range events {
		events[i] = itx.Event{Offset: int64(i + 1), Type: "bench.event", CreatedAt: 1_700_000_000_000,
			Payload: json.RawMessage(fmt.Sprintf(`{"seq":%d,"user":"u-%04d","action":"clicked","target":"button-checkout","ok":true}`, i, i%1000))}
	}
	batch := &itx.DeliveryBatch{DeliveryEnvelope: itx.DeliveryEnvelope{StreamID: "s", Path: "/p", HeadOffset: 1000, Attempt: 1}, Events: events}
	b.ReportAllocs()
	for b.Loop() {
		_, seg, err := capnp.NewMessage(capnp.MultiSegment(nil))
		if err != nil {
			b.Fatal(err)
		}
		dst, err := schema.NewRootDeliveryBatch(seg)
		if err != nil {
			b.Fatal(err)
		}
		if err := SetDeliveryBatch(dst, batch); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSetEvent_PointerIndexes checks that SetEvent's payload and metadata pointer indexes are the
// ones the generated setters use.
func TestSetEvent_PointerIndexes(t *testing.T) {
	_, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := schema.NewRootEvent(seg)
	if err := a.SetPayload(`{"p":1}`); err != nil {
		t.Fatal(err)
	}
	if err := a.SetMetadata(`{"m":1}`); err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		i    uint16
		want string
	}{{eventPayloadPtr, `{"p":1}`}, {eventMetadataPtr, `{"m":1}`}} {
		p, err := capnp.Struct(a).Ptr(f.i)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Text(); got != f.want {
			t.Errorf("pointer %d: got %q, want %q", f.i, got, f.want)
		}
	}
	// And SetEvent round-trips through the generated getters, empty metadata staying absent.
	e := itx.Event{Offset: 7, Type: "t", Payload: json.RawMessage(`{"x":2}`), Metadata: json.RawMessage(`{"y":3}`)}
	b, _ := schema.NewEvent(seg)
	if err := SetEvent(b, &e); err != nil {
		t.Fatal(err)
	}
	got, err := EventFromSchema(b)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Payload) != `{"x":2}` || string(got.Metadata) != `{"y":3}` || got.Type != "t" || got.Offset != 7 {
		t.Errorf("got %+v, want %+v", got, e)
	}
}

// BenchmarkEventInputsFromSchema decodes a 100-event append as the server does (ns/op per call).
func BenchmarkEventInputsFromSchema(b *testing.B) {
	_, seg, err := capnp.NewMessage(capnp.MultiSegment(nil))
	if err != nil {
		b.Fatal(err)
	}
	args, err := schema.NewRootStream_append_Params(seg)
	if err != nil {
		b.Fatal(err)
	}
	list, err := args.NewEvents(100)
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < list.Len(); i++ {
		in := itx.EventInput{Type: "bench.event", Payload: json.RawMessage(fmt.Sprintf(`{"seq":%d,"user":"u-%04d","action":"clicked","target":"button-checkout","ok":true}`, i, i%1000))}
		if err := SetEventInput(list.At(i), &in); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		seg.Message().ResetReadLimit(1 << 40) // reading one message over and over exhausts its limit
		if _, err := EventInputsFromSchema(list); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEventsFromSchema decodes a 1,000-event page as a client's sink does (ns/op per page).
func BenchmarkEventsFromSchema(b *testing.B) {
	events := make([]itx.Event, 1000)
	for i := range events {
		events[i] = itx.Event{Offset: int64(i + 1), Type: "bench.event", CreatedAt: 1_700_000_000_000,
			Payload: json.RawMessage(fmt.Sprintf(`{"seq":%d,"user":"u-%04d","action":"clicked","target":"button-checkout","ok":true}`, i, i%1000))}
	}
	_, seg, err := capnp.NewMessage(capnp.MultiSegment(nil))
	if err != nil {
		b.Fatal(err)
	}
	dst, err := schema.NewRootDeliveryBatch(seg)
	if err != nil {
		b.Fatal(err)
	}
	if err := SetEvents(events, dst.NewEvents); err != nil {
		b.Fatal(err)
	}
	list, err := dst.Events()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		seg.Message().ResetReadLimit(1 << 40)
		if _, err := EventsFromSchema(list); err != nil {
			b.Fatal(err)
		}
	}
}
