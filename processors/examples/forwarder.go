package examples

import (
	"context"
	"encoding/json"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
)

// InboxMessage is what the forwarder consumes: any payload.
const InboxMessage = processors.EventType[json.RawMessage]("inbox/message")

// Forward is the forwarder's output: the source offset and its payload.
type Forward struct {
	SourceOffset int64           `json:"sourceOffset"`
	Payload      json.RawMessage `json:"payload"`
}

// OutboxForwarded is the forwarder's one output type.
const OutboxForwarded = processors.EventType[Forward]("outbox/forwarded")

// ForwarderState counts forwards reduced from the consumed events.
type ForwarderState struct {
	Forwarded int `json:"forwarded"`
}

// Forwarder is a durable message queue: every inbox/message becomes exactly one
// outbox/forwarded, whatever crashes in between. Each forward is a per-event append under a key
// derived from the event and a body that is a function of the event alone, so a redelivery or a
// full replay re-dials it and the stream dedupes.
func Forwarder() processors.Contract[ForwarderState] {
	return processors.Contract[ForwarderState]{
		Name:           "forwarder",
		ConsumedTypes:  []string{string(InboxMessage)},
		ReducerVersion: "1",
		InitialState:   func() ForwarderState { return ForwarderState{} },
		Reduce: func(st ForwarderState, e itx.Event) ForwarderState {
			return ForwarderState{Forwarded: st.Forwarded + 1}
		},
		ProcessEvent: func(ctx context.Context, a *processors.Args[ForwarderState]) error {
			if a.Event == nil {
				return nil // the eventless pass: a queue has no state-derived work
			}
			e := a.Event
			fwd := OutboxForwarded.Input(Forward{SourceOffset: e.Offset, Payload: e.Payload}, a.IdempotencyKey("forward", e))
			// Blocking: the forward is this event's whole consequence; dropped, it is lost forever.
			a.BlockProcessorWhile("forward", func(ctx context.Context) error {
				_, err := a.Append(ctx, fwd)
				return err
			})
			return nil
		},
	}
}
