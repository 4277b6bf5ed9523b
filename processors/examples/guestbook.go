package examples

import (
	"errors"
	"strings"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
)

// Signed is a guestbook signature.
type Signed struct {
	Name    string `json:"name"`
	Message string `json:"message"`
}

// GuestbookSigned is the guestbook's one event type.
const GuestbookSigned = processors.EventType[Signed]("guestbook/signed")

// GuestbookRecent is how many entries the guestbook's state keeps.
const GuestbookRecent = 20

// GuestbookEntry is one signature in the state.
type GuestbookEntry struct {
	Offset  int64  `json:"offset"`
	Name    string `json:"name"`
	Message string `json:"message"`
	At      int64  `json:"at"` // the event's createdAt, epoch ms
}

// GuestbookState is the projection: how many signed, and the most recent entries.
type GuestbookState struct {
	Count  int              `json:"count"`
	Recent []GuestbookEntry `json:"recent"`
}

// Guestbook is a pure projector: Reduce only, no side effects, so it needs no ProcessEvent.
func Guestbook() processors.Contract[GuestbookState] {
	return processors.Contract[GuestbookState]{
		Name:           "guestbook",
		ConsumedTypes:  []string{string(GuestbookSigned)},
		ReducerVersion: "1",
		InitialState:   func() GuestbookState { return GuestbookState{} },
		Validate: func(e itx.Event) error {
			s, err := GuestbookSigned.Decode(e)
			if err == nil && strings.TrimSpace(s.Name) == "" {
				err = errors.New("name must not be empty")
			}
			return err
		},
		Reduce: func(st GuestbookState, e itx.Event) GuestbookState {
			s, _ := GuestbookSigned.Decode(e)
			keep := st.Recent
			if len(keep) >= GuestbookRecent {
				keep = keep[len(keep)-GuestbookRecent+1:]
			}
			// Copy on write: the incoming state may be the committed one.
			recent := make([]GuestbookEntry, len(keep), len(keep)+1)
			copy(recent, keep)
			recent = append(recent, GuestbookEntry{Offset: e.Offset, Name: s.Name, Message: s.Message, At: e.CreatedAt})
			return GuestbookState{Count: st.Count + 1, Recent: recent}
		},
	}
}
