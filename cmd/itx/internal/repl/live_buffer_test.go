package repl

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/itx-dev/itx"
)

// bigEvents are n events from offset from with about size bytes of payload each.
func bigEvents(from int64, n, size int) []itx.Event {
	pad := strings.Repeat("x", size)
	out := make([]itx.Event, n)
	for i := range out {
		out[i] = itx.Event{Offset: from + int64(i), Type: "big", Payload: json.RawMessage(`{"p":"` + pad + `"}`)}
	}
	return out
}

// A connection's unread events are bounded by their bytes as well as their count: large events
// reach the byte bound long before 10,000 of them are held.
func TestEventSink_BoundedByBytes(t *testing.T) {
	const size = 1 << 20 // 1 MiB each: 64 fit
	t.Run("drop oldest", func(t *testing.T) {
		k := newEventSink()
		k.add(bigEvents(1, 100, size))
		events, dropped, _ := k.take()
		require.Less(t, len(events), 64)
		require.Greater(t, len(events), 60)
		require.Equal(t, 100, dropped+len(events))
		require.Equal(t, int64(100), events[len(events)-1].Offset, "the newest are kept")
		total := 0
		for i := range events {
			total += events[i].Size()
		}
		require.LessOrEqual(t, total, maxBufferedBytes)
	})
	t.Run("keep oldest", func(t *testing.T) {
		k := newEventSink()
		k.keepOldest = true
		k.add(bigEvents(1, 30, size))
		k.add(bigEvents(31, 70, size))
		events, dropped, _ := k.take()
		require.Equal(t, int64(1), events[0].Offset, "the oldest are kept")
		for i := range events {
			require.Equal(t, int64(i+1), events[i].Offset, "a run without a gap")
		}
		require.Less(t, len(events), 64)
		require.Equal(t, 100, dropped+len(events))
		k.add(bigEvents(101, 1, 10))
		events, dropped, _ = k.take()
		require.Empty(t, events, "once full nothing more is kept: the tail opens again")
		require.Equal(t, 1, dropped)
	})
	t.Run("one event always fits", func(t *testing.T) {
		k := newEventSink()
		k.add(bigEvents(1, 1, 2*maxBufferedBytes))
		events, dropped, _ := k.take()
		require.Len(t, events, 1)
		require.Zero(t, dropped)
	})
	t.Run("small events are bounded by count", func(t *testing.T) {
		k := newEventSink()
		k.add(bigEvents(1, maxBuffered+5, 10))
		events, dropped, _ := k.take()
		require.Len(t, events, maxBuffered)
		require.Equal(t, 5, dropped)
		require.Equal(t, int64(6), events[0].Offset)
	})
}
