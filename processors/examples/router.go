package examples

import (
	"context"
	"strings"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
)

// Routed is a message naming the thread it belongs to.
type Routed struct {
	Thread string `json:"thread"`
	Text   string `json:"text,omitempty"`
}

// RouterMessage is what the router consumes.
const RouterMessage = processors.EventType[Routed]("router/message")

// ThreadMessage is what the router appends to a thread's stream: the source offset and payload.
const ThreadMessage = processors.EventType[Forward]("thread/message")

// RouterState counts the messages routed and those naming no usable thread.
type RouterState struct {
	Routed     int `json:"routed"`
	Unroutable int `json:"unroutable"`
}

// ThreadPath is the stream a thread's messages go to: <home>/threads/<thread>, or "" when the
// thread is not one path segment.
func ThreadPath(home, thread string) string {
	if thread == "" || strings.Contains(thread, "/") {
		return ""
	}
	p := strings.TrimSuffix(home, "/") + "/threads/" + thread
	if itx.ValidatePath(p) != nil {
		return ""
	}
	return p
}

// Router is a durable fan-out to other streams: every router/message becomes exactly one
// thread/message on its thread's own stream (Args.AppendTo), whatever crashes in between. The
// forward is keyed by the source event (IdempotencyKey: its @<path>:<offset> keeps two routers of
// different streams apart on one thread), so a redelivery or a replay forwards nothing twice.
func Router() processors.Contract[RouterState] {
	return processors.Contract[RouterState]{
		Name:           "router",
		ConsumedTypes:  []string{string(RouterMessage)},
		ReducerVersion: "1",
		InitialState:   func() RouterState { return RouterState{} },
		Reduce: func(st RouterState, e itx.Event) RouterState {
			m, err := RouterMessage.Decode(e)
			if err != nil || ThreadPath("/", m.Thread) == "" {
				st.Unroutable++
				return st
			}
			st.Routed++
			return st
		},
		ProcessEvent: func(ctx context.Context, a *processors.Args[RouterState]) error {
			if a.Event == nil {
				return nil
			}
			e := a.Event
			m, err := RouterMessage.Decode(*e)
			path := ThreadPath(a.Path, m.Thread)
			if err != nil || path == "" {
				return nil // counted as unroutable by the reducer: nothing to forward
			}
			fwd := ThreadMessage.Input(Forward{SourceOffset: e.Offset, Payload: e.Payload}, a.IdempotencyKey("route", e))
			// Blocking: the forward is this event's whole consequence; dropped, it is lost forever.
			a.BlockProcessorWhile("route", func(ctx context.Context) error {
				_, err := a.AppendTo(ctx, path, fwd)
				return err
			})
			return nil
		},
	}
}
