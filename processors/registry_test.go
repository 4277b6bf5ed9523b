package processors_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
	proctest "github.com/itx-dev/itx/processors/testing"
)

// hosting is one incarnation of a stream's processors over shared durable parts.
type hosting struct {
	reg     *processors.Registry
	runners []*processors.Runner[countState]
}

func host(t *testing.T, f *fixture, kv *proctest.MemoryKV, alarm *proctest.MemoryAlarm, version string, names ...string) *hosting {
	t.Helper()
	reg, err := processors.NewRegistry(processors.RegistryConfig{
		Path: "/test", Log: f.stream, KV: kv, Alarm: alarm, Clock: f.clock, Version: version, Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	h := &hosting{reg: reg}
	for _, name := range names {
		c := counter(t, "v1", nil)
		c.Name = name
		c.ProcessEvent = func(ctx context.Context, a *processors.Args[countState]) error {
			if a.Event != nil {
				// A droppable attempt that never finishes in this incarnation.
				a.RunInBackground(func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
			}
			return nil
		}
		r, err := processors.Register(context.Background(), reg, c, f.store)
		if err != nil {
			t.Fatal(err)
		}
		h.runners = append(h.runners, r)
	}
	t.Cleanup(reg.Close)
	return h
}

func TestRegistry_HandleAlarm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture()
		kv, alarm := proctest.NewMemoryKV(), &proctest.MemoryAlarm{}
		first := host(t, f, kv, alarm, "build-1", "alpha", "beta")
		f.append(t, added.Input(counted{N: 1}, ""))
		for _, r := range first.runners {
			if err := r.CatchUp(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		if got, want := alarm.At(), t0.Add(processors.KeepaliveLead); !got.Equal(want) {
			t.Fatalf("alarm at %v with work in flight, want %v", got, want)
		}

		// Eviction: the process dies owing work; a fresh one loads the stream's processors.
		first.reg.Close()
		second := host(t, f, kv, alarm, "build-1", "alpha", "beta")
		f.clock.Advance(processors.KeepaliveLead)
		out, err := second.reg.HandleAlarm(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if got, want := fmt.Sprint(out), "[{alpha revived} {beta revived}]"; got != want {
			t.Errorf("one fire: %s, want %s", got, want)
		}
		revived := f.stream.Events(itx.TypeProcessorRevived)
		if len(revived) != 2 {
			t.Fatalf("revived facts %v, want one per processor", revived)
		}
		for i, name := range []string{"alpha", "beta"} {
			var p struct {
				ProcessorSlug string `json:"processorSlug"`
				Revivals      int    `json:"revivals"`
			}
			if err := json.Unmarshal(revived[i].Payload, &p); err != nil || p.ProcessorSlug != name || p.Revivals != 1 {
				t.Errorf("revived[%d] = %s, want processorSlug %q revivals 1", i, revived[i].Payload, name)
			}
		}
		// The breaker is marked in KV before the revival, below the reduction.
		raw, _, _ := kv.Get(context.Background(), processors.KeepaliveKey("alpha"))
		var rec processors.KeepaliveRecord
		if err := json.Unmarshal(raw, &rec); err != nil || rec.Revivals != 1 || rec.Version != "build-1" {
			t.Errorf("alpha's keepalive record %s", raw)
		}
		// Ordinary delivery carries the fact to the processors: the unconsumed fact at the head
		// gives each one its eventless pass, which settles cleanly.
		for _, r := range second.runners {
			if err := r.CatchUp(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got, want := r.ProcessedThrough(), f.stream.Head(); got != want {
				t.Errorf("%s processed through %d, want %d", r.Name(), got, want)
			}
		}
		f.clock.Advance(processors.KeepaliveLead)
		out, err = second.reg.HandleAlarm(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if got, want := fmt.Sprint(out), "[{alpha clean-disarm} {beta clean-disarm}]"; got != want {
			t.Errorf("confirmation fire: %s, want %s", got, want)
		}
		if !alarm.At().IsZero() {
			t.Errorf("alarm still armed at %v after a quiet clean fire", alarm.At())
		}
	})
}

func TestRegistry_Register(t *testing.T) {
	f := newFixture()
	reg, err := processors.NewRegistry(processors.RegistryConfig{
		Path: "/test", Log: f.stream, KV: proctest.NewMemoryKV(), Alarm: &proctest.MemoryAlarm{}, Clock: f.clock, Version: "v",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	if _, err := processors.Register(context.Background(), reg, counter(t, "v1", nil), f.store); err != nil {
		t.Fatal(err)
	}
	if _, err := processors.Register(context.Background(), reg, counter(t, "v1", nil), f.store); itx.ErrorCode(err) != itx.EInvalid {
		t.Errorf("second registration of one name: %v, want %s", err, itx.EInvalid)
	}
	if _, err := processors.NewRegistry(processors.RegistryConfig{Log: f.stream, KV: proctest.NewMemoryKV(), Alarm: &proctest.MemoryAlarm{}, Clock: f.clock}); itx.ErrorCode(err) != itx.EInvalid {
		t.Errorf("registry without a version: %v, want %s", err, itx.EInvalid)
	}
}

// Registering under a new version a processor whose keepalive record holds the old version's
// backoff arms its revival now with a fresh budget (the antidote deploy retries immediately): a
// remote host's new build does it on its first wake, itxd on its first fire after a restart.
func TestRegistry_NewVersionRevivesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture()
		kv, alarm := proctest.NewMemoryKV(), &proctest.MemoryAlarm{}
		plateau := f.clock.Now().Add(processors.RevivalPlateau).UnixMilli()
		raw, _ := json.Marshal(processors.KeepaliveRecord{Revivals: 7, LastRevivalAt: f.clock.Now().UnixMilli(), Version: "build-1", ArmedAt: plateau})
		if err := kv.Put(context.Background(), processors.KeepaliveKey("alpha"), raw); err != nil {
			t.Fatal(err)
		}
		same := host(t, f, kv, alarm, "build-1", "alpha")
		if got := alarm.At().UnixMilli(); got != plateau {
			t.Fatalf("same build: alarm at %d, want the plateau %d", got, plateau)
		}
		same.reg.Close()
		same.reg.Remove("alpha")

		next := host(t, f, kv, alarm, "build-2", "alpha")
		if at := alarm.At(); at.After(f.clock.Now()) {
			t.Fatalf("new build: alarm at %v, want now (%v)", at, f.clock.Now())
		}
		out, err := next.reg.HandleAlarm(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(out) != 1 || out[0].Action != processors.ActionRevived {
			t.Fatalf("new build's first fire: %+v, want alpha revived", out)
		}
		if rec, _ := next.reg.Keepalive("alpha"); rec.Revivals != 1 || rec.Version != "build-2" {
			t.Errorf("record %+v, want a fresh budget under build-2 (revivals 1)", rec)
		}
	})
}

// A keepalive record written before the wall clock went back a day (an alarm 10 s ahead then,
// a revival marked then) is taken again from the clock as it reads at registration: the alarm
// is due now, not in a day, and a crash loop backs off from now.
func TestRegistry_RecordFromBeforeTheClockWentBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture()
		kv, alarm := proctest.NewMemoryKV(), &proctest.MemoryAlarm{}
		before := f.clock.Now().Add(24 * time.Hour).UnixMilli()
		for _, c := range []struct {
			name string
			rec  processors.KeepaliveRecord
			want time.Time
		}{
			{"lead", processors.KeepaliveRecord{Version: "build-1", ArmedAt: before + 10_000}, f.clock.Now()},
			{"backoff", processors.KeepaliveRecord{Version: "build-1", Revivals: 5, LastRevivalAt: before, ArmedAt: before + processors.RevivalPlateau.Milliseconds()}, f.clock.Now()},
		} {
			raw, _ := json.Marshal(c.rec)
			if err := kv.Put(context.Background(), processors.KeepaliveKey(c.name), raw); err != nil {
				t.Fatal(err)
			}
			h := host(t, f, kv, alarm, "build-1", c.name)
			if at := alarm.At(); at.After(c.want) {
				t.Errorf("%s: alarm at %v, want %v", c.name, at, c.want)
			}
			if rec, _ := h.reg.Keepalive(c.name); rec.LastRevivalAt > f.clock.Now().UnixMilli() {
				t.Errorf("%s: last revival at %d, after now %d", c.name, rec.LastRevivalAt, f.clock.Now().UnixMilli())
			}
			h.reg.Close()
			h.reg.Remove(c.name)
		}
	})
}

// Crash-loop evidence is one stream/error-occurred fact per host version per stream, keyed
// processor-host-crash-loop:<version> (seed 002), naming in its payload the processor that
// looped first. A second processor looping on the same stream and version is revived all the
// same: the taken key is that evidence standing, not a failed revival.
func TestRegistry_CrashLoopEvidenceOncePerVersion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture()
		reg, err := processors.NewRegistry(processors.RegistryConfig{
			Path: "/test", Log: f.stream, KV: proctest.NewMemoryKV(), Alarm: &proctest.MemoryAlarm{}, Clock: f.clock, Version: "build-1", Logf: t.Logf,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer reg.Close()
		var runners []*processors.Runner[countState]
		for _, name := range []string{"alpha", "beta"} {
			c := counter(t, "v1", nil)
			c.Name = name
			c.ProcessEvent = func(ctx context.Context, a *processors.Args[countState]) error {
				if a.Event != nil {
					return fmt.Errorf("%s: poisoned", name)
				}
				return nil
			}
			r, err := processors.Register(context.Background(), reg, c, f.store)
			if err != nil {
				t.Fatal(err)
			}
			runners = append(runners, r)
		}
		f.append(t, added.Input(counted{N: 1}, ""))
		deliver := func() {
			for _, r := range runners {
				_ = r.CatchUp(context.Background()) // the poison fails its frame: the loop
			}
		}
		deliver()
		for fire := 1; ; fire++ {
			rec, _ := reg.Keepalive("alpha")
			if rec.Revivals == processors.CrashLoopEvidenceAt || fire > 20 {
				break
			}
			f.clock.Advance(time.UnixMilli(rec.ArmedAt).Sub(f.clock.Now()))
			out, err := reg.HandleAlarm(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			// The two loop in step: whatever one fire does to alpha, it does to beta.
			if len(out) != 2 || out[0].Name != "alpha" || out[1].Name != "beta" || out[0].Action != out[1].Action {
				t.Fatalf("fire %d: %v, want alpha and beta alike", fire, out)
			}
			deliver()
		}
		for _, name := range []string{"alpha", "beta"} {
			if rec, _ := reg.Keepalive(name); rec.Revivals != processors.CrashLoopEvidenceAt {
				t.Errorf("%s: keepalive %+v, want %d revivals", name, rec, processors.CrashLoopEvidenceAt)
			}
		}
		if got, want := len(f.stream.Events(itx.TypeProcessorRevived)), 2*processors.CrashLoopEvidenceAt; got != want {
			t.Errorf("%d revival facts, want %d (every revival of both landed)", got, want)
		}
		evidence := f.stream.Events(itx.TypeErrorOccurred)
		if len(evidence) != 1 {
			t.Fatalf("%d crash-loop facts, want 1 per version per stream", len(evidence))
		}
		if got, want := evidence[0].IdempotencyKey, "processor-host-crash-loop:build-1"; got != want {
			t.Errorf("evidence key %q, want %q", got, want)
		}
		var p itx.ErrorOccurredPayload
		var detail struct {
			ProcessorSlug string `json:"processorSlug"`
			Version       string `json:"version"`
			Revivals      int    `json:"revivals"`
			Message       string `json:"message"` // the TypeScript schema's required error.message
		}
		if err := json.Unmarshal(evidence[0].Payload, &p); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(p.Error, &detail); err != nil || detail.ProcessorSlug != "alpha" || detail.Version != "build-1" || detail.Revivals != processors.CrashLoopEvidenceAt || detail.Message == "" {
			t.Errorf("evidence detail %s, want alpha on build-1 at %d revivals", p.Error, processors.CrashLoopEvidenceAt)
		}
	})
}

// Crash-loop evidence does not wait on the revival that reaches the threshold: recorded first,
// it stands even when that revival's fact cannot be appended (the stream refusing it, say), and
// would otherwise never be recorded for the version, the threshold being reached once.
func TestRegistry_CrashLoopEvidenceWhenTheRevivalCannotAppend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture()
		reg, err := processors.NewRegistry(processors.RegistryConfig{
			Path: "/test", Log: f.stream, KV: proctest.NewMemoryKV(), Alarm: &proctest.MemoryAlarm{}, Clock: f.clock, Version: "build-1", Logf: t.Logf,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer reg.Close()
		c := counter(t, "v1", nil)
		c.ProcessEvent = func(ctx context.Context, a *processors.Args[countState]) error {
			if a.Event != nil {
				return errors.New("poisoned")
			}
			return nil
		}
		r, err := processors.Register(context.Background(), reg, c, f.store)
		if err != nil {
			t.Fatal(err)
		}
		f.append(t, added.Input(counted{N: 1}, ""))
		f.stream.FailAppends(func(in itx.EventInput) error {
			if in.Type == itx.TypeProcessorRevived {
				return itx.Errorf(itx.EUnavailable, "the stream refuses revivals")
			}
			return nil
		})
		_ = r.CatchUp(context.Background())
		for fire := 1; ; fire++ {
			rec, _ := reg.Keepalive(c.Name)
			if rec.Revivals >= processors.CrashLoopEvidenceAt || fire > 20 {
				break
			}
			f.clock.Advance(time.UnixMilli(rec.ArmedAt).Sub(f.clock.Now()))
			_, _ = reg.HandleAlarm(context.Background())
			_ = r.CatchUp(context.Background())
		}
		if rec, _ := reg.Keepalive(c.Name); rec.Revivals != processors.CrashLoopEvidenceAt {
			t.Fatalf("keepalive %+v, want %d revivals", rec, processors.CrashLoopEvidenceAt)
		}
		if n := len(f.stream.Events(itx.TypeProcessorRevived)); n != 0 {
			t.Fatalf("%d revival facts landed, want none (refused)", n)
		}
		evidence := f.stream.Events(itx.TypeErrorOccurred)
		if len(evidence) != 1 || evidence[0].IdempotencyKey != processors.CrashLoopEvidenceKey("build-1") {
			t.Fatalf("crash-loop evidence %+v, want one fact keyed %q", evidence, processors.CrashLoopEvidenceKey("build-1"))
		}
	})
}
