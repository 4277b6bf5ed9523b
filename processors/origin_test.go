package processors_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
	proctest "github.com/itx-dev/itx/processors/testing"
)

// originLog records where each AppendTo forward says it comes from (itx.ProcessorEffectOutbox).
type originLog struct {
	*proctest.MemoryStream
	mu      sync.Mutex
	origins []itx.EffectOrigin
}

func (l *originLog) AppendToFrom(ctx context.Context, path string, events []itx.EventInput, origin itx.EffectOrigin) (itx.AppendResult, error) {
	l.mu.Lock()
	l.origins = append(l.origins, origin)
	l.mu.Unlock()
	return itx.AppendResult{Offsets: make([]int64, len(events))}, nil
}

// A forward says which event it comes from and the committed cursor then, so the receiving
// stream can keep its key past a trim while a crash would redeliver it: an event's forward names
// the event, the eventless pass's names the offset its frame commits through, and a forward
// made once the frame committed carries the new cursor.
func TestRunner_ForwardsSayWhereTheyComeFrom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture()
		log := &originLog{MemoryStream: f.stream}
		c := processors.Contract[countState]{
			Name:           "fwd",
			ConsumedTypes:  []string{string(added)},
			ReducerVersion: "1",
			InitialState:   func() countState { return countState{} },
			Reduce:         func(s countState, e itx.Event) countState { s.Total++; return s },
			ProcessEvent: func(ctx context.Context, a *processors.Args[countState]) error {
				key := a.IdempotencyKey("pass", nil)
				if a.Event != nil {
					key = a.IdempotencyKey("fwd", a.Event)
				}
				_, err := a.AppendTo(ctx, "/out", echoed.Input(counted{N: 1}, key))
				return err
			},
		}
		r, err := processors.NewRunner(c, processors.RunnerConfig{Path: "/test", Log: log, Progress: f.store, Clock: f.clock, Logf: t.Logf})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Open(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		for _, in := range []itx.EventInput{
			added.Input(counted{N: 1}, ""),              // 1: its forward
			{Type: "noise/ping", Payload: []byte(`{}`)}, // 2: not consumed, the eventless pass
			added.Input(counted{N: 1}, ""),              // 3
		} {
			f.append(t, in)
			if err := r.CatchUp(context.Background()); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
		}
		want := []itx.EffectOrigin{{Offset: 1}, {Offset: 2, ProcessedThrough: 1}, {Offset: 3, ProcessedThrough: 2}}
		log.mu.Lock()
		defer log.mu.Unlock()
		if len(log.origins) != len(want) {
			t.Fatalf("origins %+v, want %+v", log.origins, want)
		}
		for i := range want {
			if log.origins[i] != want[i] {
				t.Errorf("forward %d: origin %+v, want %+v", i, log.origins[i], want[i])
			}
		}
	})
}
