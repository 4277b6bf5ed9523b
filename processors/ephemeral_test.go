package processors_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"testing/synctest"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
)

// recorder is a processor that only records its passes: the offsets ProcessEvent saw (0 for the
// eventless pass) and which of them were CaughtUp. It appends nothing, so the head is the test's.
func recorder(rec *calls) processors.Contract[countState] {
	c := counter(nil, "v1", nil)
	c.Reduce = func(s countState, e itx.Event) countState {
		p, _ := added.Decode(e)
		return countState{Total: s.Total + p.N, Seen: append(slices.Clone(s.Seen), e.Offset)}
	}
	c.ProcessEvent = func(ctx context.Context, a *processors.Args[countState]) error {
		off := int64(0)
		if a.Event != nil {
			off = a.Event.Offset
		}
		rec.events = append(rec.events, off)
		if a.Delivery.CaughtUp {
			rec.caughtUp = append(rec.caughtUp, off)
		}
		return nil
	}
	return c
}

// Seed 002: ephemeral appends "never reach processor delivery at all" (the TS runner never runs a
// batch that carries no durable event). A range that holds only ephemeral offsets moves the
// processing cursor (no phantom lag) but runs no pass, unless the state there has not yet had its
// pass at the head: then it gets the eventless pass a filtered durable tail would get.
func TestRunner_EphemeralOnlyRange(t *testing.T) {
	eph := func(t *testing.T, f *fixture) int64 {
		in := added.Input(counted{N: 100}, "")
		in.Ephemeral = true
		return f.append(t, in)[0].Offset
	}
	t.Run("after a pass at the head: no pass, the cursor moves", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture()
			var rec calls
			r := f.runner(t, recorder(&rec))
			f.append(t, added.Input(counted{N: 1}, ""))
			drain(t, f, r)
			for range 3 {
				eph(t, f)
				drain(t, f, r)
			}
			if !slices.Equal(rec.events, []int64{1}) || !slices.Equal(rec.caughtUp, []int64{1}) {
				t.Errorf("passes %v (caught up %v), want only event 1's", rec.events, rec.caughtUp)
			}
			if got, want := r.ProcessedThrough(), f.stream.Head(); got != want {
				t.Errorf("cursor %d, want the head %d (no phantom lag)", got, want)
			}
		})
	})
	t.Run("a frame the host marks ephemeral-only", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture()
			var rec calls
			r := f.runner(t, recorder(&rec))
			d1 := f.append(t, added.Input(counted{N: 1}, ""))[0]
			e2 := eph(t, f)
			deliver := func(fr processors.Frame) {
				t.Helper()
				if err := r.Deliver(context.Background(), fr); err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
			}
			// Cut behind the head (a full page): event 1 is not caught up, so the
			// ephemeral-only rest still owes the eventless pass.
			deliver(processors.Frame{Events: []itx.Event{d1}, ScannedAfter: 0, ScannedThrough: 1, Head: e2, Continued: true})
			deliver(processors.Frame{ScannedAfter: 1, ScannedThrough: e2, Head: e2, Continued: true, EphemeralOnly: true})
			e3 := eph(t, f)
			deliver(processors.Frame{ScannedAfter: e2, ScannedThrough: e3, Head: e3, Continued: true, EphemeralOnly: true})
			if want := []int64{1, 0}; !slices.Equal(rec.events, want) || !slices.Equal(rec.caughtUp, []int64{0}) {
				t.Errorf("passes %v (caught up %v), want %v with the eventless pass caught up", rec.events, rec.caughtUp, want)
			}
			if got := r.ProcessedThrough(); got != e3 {
				t.Errorf("cursor %d, want %d", got, e3)
			}
			// A durable unconsumed tail still gets its pass (a revival fact the processor does
			// not consume, say).
			noise := f.append(t, itx.EventInput{Type: "noise/ping", Payload: json.RawMessage(`{}`)})[0].Offset
			deliver(processors.Frame{ScannedAfter: e3, ScannedThrough: noise, Head: noise, Continued: true})
			if want := []int64{1, 0, 0}; !slices.Equal(rec.events, want) {
				t.Errorf("passes %v, want %v", rec.events, want)
			}
		})
	})
}
