// Package wire converts between the itx domain types and their Cap'n Proto structs. The server's
// capability layer and every Go client share it, so both sides agree on one encoding.
package wire

import (
	"bytes"
	"encoding/json"

	"capnproto.org/go/capnp/v3"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
)

// SetEvent encodes e into dst.
func SetEvent(dst schema.Event, e *itx.Event) error {
	dst.SetOffset(uint64(e.Offset))
	dst.SetCreatedAt(e.CreatedAt)
	dst.SetEphemeral(e.Ephemeral)
	if err := dst.SetType(e.Type); err != nil {
		return err
	}
	// From the bytes: string(e.Payload) would copy every payload once more on the heap before
	// capnp copies it into the message (1,000 allocations per catch-up page).
	if err := setTextBytes(capnp.Struct(dst), eventPayloadPtr, e.Payload); err != nil {
		return err
	}
	if e.IdempotencyKey != "" {
		if err := dst.SetIdempotencyKey(e.IdempotencyKey); err != nil {
			return err
		}
	}
	if len(e.Metadata) > 0 {
		if err := setTextBytes(capnp.Struct(dst), eventMetadataPtr, e.Metadata); err != nil {
			return err
		}
	}
	if len(e.Provenance) > 0 {
		hops, err := dst.NewProvenance(int32(len(e.Provenance)))
		if err != nil {
			return err
		}
		for i, h := range e.Provenance {
			d := hops.At(i)
			d.SetOffset(uint64(h.Offset))
			d.SetCursorChangedAtOffset(uint64(h.CursorChangedAtOffset))
			for _, set := range []struct {
				f func(string) error
				v string
			}{{d.SetStreamId, h.StreamID}, {d.SetPath, h.Path}, {d.SetSubscription, h.Subscription}, {d.SetType, h.Type}} {
				if err := set.f(set.v); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// The pointer fields of schema.Event that SetEvent writes from bytes, as the generated SetPayload
// and SetMetadata number them (TestSetEvent_PointerIndexes checks they still agree).
const (
	eventPayloadPtr  = 1
	eventMetadataPtr = 3
)

// setTextBytes is Struct.SetText from bytes: empty is null, as SetText makes it.
func setTextBytes(s capnp.Struct, i uint16, v []byte) error {
	if len(v) == 0 {
		return s.SetText(i, "")
	}
	return s.SetTextFromBytes(i, v)
}

// SetEvents encodes events into a new list made by newList.
func SetEvents(events []itx.Event, newList func(int32) (schema.Event_List, error)) error {
	list, err := newList(int32(len(events)))
	if err != nil {
		return err
	}
	for i := range events {
		if err := SetEvent(list.At(i), &events[i]); err != nil {
			return err
		}
	}
	return nil
}

// EventFromSchema decodes a committed event (clients and receivers use it too).
func EventFromSchema(src schema.Event) (itx.Event, error) {
	e := itx.Event{Offset: int64(src.Offset()), CreatedAt: src.CreatedAt(), Ephemeral: src.Ephemeral()}
	var err error
	if e.Type, err = src.Type(); err != nil {
		return e, err
	}
	payload, err := src.PayloadBytes() // copied once, not twice through a string
	if err != nil {
		return e, err
	}
	e.Payload = append(json.RawMessage{}, payload...)
	if e.IdempotencyKey, err = src.IdempotencyKey(); err != nil {
		return e, err
	}
	if src.HasMetadata() {
		m, err := src.MetadataBytes()
		if err != nil {
			return e, err
		}
		if len(m) > 0 {
			e.Metadata = bytes.Clone(m)
		}
	}
	if src.HasProvenance() {
		hops, err := src.Provenance()
		if err != nil {
			return e, err
		}
		for i := 0; i < hops.Len(); i++ {
			h := hops.At(i)
			hop := itx.Hop{Offset: int64(h.Offset()), CursorChangedAtOffset: int64(h.CursorChangedAtOffset())}
			hop.StreamID, _ = h.StreamId()
			hop.Path, _ = h.Path()
			hop.Subscription, _ = h.Subscription()
			hop.Type, _ = h.Type()
			e.Provenance = append(e.Provenance, hop)
		}
	}
	return e, nil
}

// EventsFromSchema decodes a list of events.
func EventsFromSchema(list schema.Event_List) ([]itx.Event, error) {
	out := make([]itx.Event, list.Len())
	for i := range out {
		e, err := EventFromSchema(list.At(i))
		if err != nil {
			return nil, err
		}
		out[i] = e
	}
	return out, nil
}

func eventList(list schema.Event_List, err error) ([]itx.Event, error) {
	if err != nil {
		return nil, err
	}
	return EventsFromSchema(list)
}

// EventInputsFromSchema copies append inputs out of the call message: the server keeps them past
// the point where the message may be released.
func EventInputsFromSchema(list schema.EventInput_List) ([]itx.EventInput, error) {
	out := make([]itx.EventInput, list.Len())
	for i := range out {
		if err := eventInputFrom(&out[i], list.At(i)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// EventInputFromSchema copies one event input out of its message.
func EventInputFromSchema(src schema.EventInput) (itx.EventInput, error) {
	var in itx.EventInput
	err := eventInputFrom(&in, src)
	return in, err
}

func eventInputFrom(in *itx.EventInput, src schema.EventInput) error {
	var err error
	if in.Type, err = src.Type(); err != nil {
		return err
	}
	// One copy out of the message (which is released when the call returns), not two
	// through a string.
	p, err := src.PayloadBytes()
	if err != nil {
		return err
	}
	in.Payload = append(json.RawMessage{}, p...)
	if in.IdempotencyKey, err = src.IdempotencyKey(); err != nil {
		return err
	}
	m, err := src.MetadataBytes()
	if err != nil {
		return err
	}
	if len(m) > 0 {
		in.Metadata = bytes.Clone(m)
	}
	in.Ephemeral = src.Ephemeral()
	return nil
}

func TextList(list capnp.TextList, err error) ([]string, error) {
	if err != nil {
		return nil, err
	}
	out := make([]string, list.Len())
	for i := range out {
		if out[i], err = list.At(i); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// SetEventInputs allocates a list of len(events) with newList (a params struct's NewEvents) and
// encodes each event into it.
func SetEventInputs(newList func(int32) (schema.EventInput_List, error), events []itx.EventInput) error {
	list, err := newList(int32(len(events)))
	if err != nil {
		return err
	}
	for i := range events {
		if err := SetEventInput(list.At(i), &events[i]); err != nil {
			return err
		}
	}
	return nil
}

// SetEventInput encodes an event to append.
func SetEventInput(dst schema.EventInput, in *itx.EventInput) error {
	if err := dst.SetType(in.Type); err != nil {
		return err
	}
	if len(in.Payload) > 0 {
		if err := dst.SetPayload(string(in.Payload)); err != nil {
			return err
		}
	}
	if in.IdempotencyKey != "" {
		if err := dst.SetIdempotencyKey(in.IdempotencyKey); err != nil {
			return err
		}
	}
	if len(in.Metadata) > 0 {
		if err := dst.SetMetadata(string(in.Metadata)); err != nil {
			return err
		}
	}
	dst.SetEphemeral(in.Ephemeral)
	return nil
}

// SetTextList fills a new text list made by newList.
func SetTextList(values []string, newList func(int32) (capnp.TextList, error)) error {
	if len(values) == 0 {
		return nil
	}
	list, err := newList(int32(len(values)))
	if err != nil {
		return err
	}
	for i, v := range values {
		if err := list.Set(i, v); err != nil {
			return err
		}
	}
	return nil
}
