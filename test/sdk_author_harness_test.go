package test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
	proctest "github.com/itx-dev/itx/processors/testing"
)

// fakeQAVendor is the answerer's vendor in the harness: it answers from what it kept for a key it
// has seen (a vendor honouring idempotency keys), so executions counts the side effects and calls
// the requests. While hold is set, a new key's request blocks until its context ends (a vendor
// that has not answered).
type fakeQAVendor struct {
	mu         sync.Mutex
	kept       map[string]string
	calls      []string // keys, in call order
	executions int
	hold       bool
}

func (v *fakeQAVendor) ask(ctx context.Context, key, question string) (string, error) {
	v.mu.Lock()
	v.calls = append(v.calls, key)
	if text, ok := v.kept[key]; ok {
		v.mu.Unlock()
		return text, nil
	}
	if v.hold {
		v.mu.Unlock()
		<-ctx.Done()
		return "", ctx.Err()
	}
	if v.kept == nil {
		v.kept = map[string]string{}
	}
	v.executions++
	text := "A: " + question
	v.kept[key] = text
	v.mu.Unlock()
	return text, nil
}

func (v *fakeQAVendor) counts() (calls, executions int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.calls), v.executions
}

func (v *fakeQAVendor) setHold(hold bool) {
	v.mu.Lock()
	v.hold = hold
	v.mu.Unlock()
}

func question(q string) itx.EventInput { return QAAsked.Input(QAQuestion{Question: q}, "") }

// payloadsOf decodes the payloads of events of type t.
func payloadsOf[P any](t *testing.T, t2 processors.EventType[P], events []itx.Event) []P {
	t.Helper()
	var out []P
	for _, e := range events {
		if e.Type != string(t2) {
			continue
		}
		p, err := t2.Decode(e)
		if err != nil {
			t.Fatalf("decode %s at %d: %v", e.Type, e.Offset, err)
		}
		out = append(out, p)
	}
	return out
}

// The answerer asks once per question and settles each once; a crash while the vendor has not
// answered loses the attempt, and the revival the keepalive owes starts it again under the same
// vendor key, so the vendor acts once; a full replay dials nothing and appends nothing.
func TestSDKAuthor_Answerer(t *testing.T) {
	t.Run("one call per question", func(t *testing.T) {
		v := &fakeQAVendor{}
		cfg := proctest.Config[qaState]{New: func(proctest.Env) processors.Contract[qaState] { return Answerer(v.ask) }, StrictDeliveryErrors: true}
		proctest.Run(t, cfg, func(t *testing.T, h *proctest.Harness[qaState]) {
			h.Append(question("one"), question("two"))
			h.Append(question("three"))
			answers := payloadsOf(t, QAAnswered, h.Events())
			if len(answers) != 3 {
				t.Fatalf("%d answers, want 3: %+v", len(answers), answers)
			}
			if calls, execs := v.counts(); calls != 3 || execs != 3 {
				t.Errorf("vendor: %d calls, %d executions; want 3, 3", calls, execs)
			}
			if s := h.State(); len(s.Open) != 0 || s.Answered != 3 {
				t.Errorf("state %+v, want nothing open and 3 answered", s)
			}
		})
	})
	t.Run("crash mid-call, then replay", func(t *testing.T) {
		v := &fakeQAVendor{}
		cfg := proctest.Config[qaState]{New: func(proctest.Env) processors.Contract[qaState] { return Answerer(v.ask) }, StrictDeliveryErrors: true}
		proctest.Run(t, cfg, func(t *testing.T, h *proctest.Harness[qaState]) {
			v.setHold(true)
			h.Append(question("slow"))
			if calls, _ := v.counts(); calls != 1 {
				t.Fatalf("%d vendor calls before the crash, want 1", calls)
			}
			h.Crash()
			v.setHold(false)
			h.AdvanceTime(2 * processors.KeepaliveLead) // the keepalive's alarm revives the processor
			if n := len(h.Events(itx.TypeProcessorRevived)); n != 1 {
				t.Errorf("%d revivals, want 1", n)
			}
			answers := payloadsOf(t, QAAnswered, h.Events())
			if len(answers) != 1 || answers[0].Text != "A: slow" {
				t.Fatalf("answers %+v, want one", answers)
			}
			if calls, execs := v.counts(); calls != 2 || execs != 1 {
				t.Errorf("vendor: %d calls, %d executions; want 2 calls (the lost attempt's and the revival's) under one key, 1 execution", calls, execs)
			}
			v.mu.Lock()
			keys := slices.Compact(slices.Clone(v.calls))
			v.mu.Unlock()
			if len(keys) != 1 {
				t.Errorf("vendor keys %q, want one key", keys)
			}
			head := h.Stream.Head()
			live := h.State()

			replay := &fakeQAVendor{}
			rcfg := proctest.Config[qaState]{New: func(proctest.Env) processors.Contract[qaState] {
				return Answerer(func(ctx context.Context, key, q string) (string, error) {
					t.Errorf("the replay dialed the vendor for %q", q)
					return replay.ask(ctx, key, q)
				})
			}, Substrate: h.Substrate(), StrictDeliveryErrors: true}
			r := proctest.New(t, rcfg)
			r.Wake()
			if h.Stream.Head() != head {
				t.Errorf("the replay appended: head %d, want %d", h.Stream.Head(), head)
			}
			if got := r.State(); fmt.Sprint(got) != fmt.Sprint(live) {
				t.Errorf("replayed state %+v, live %+v", got, live)
			}
		})
	})
}

// metricFlushAfter is the summarizer's flush in the harness, on its virtual clock.
const metricFlushAfter = time.Minute

func sample(key string, v int64) itx.EventInput {
	return MetricSample.Input(MetricSampleP{Key: key, Value: v}, "")
}

// summaryTotals lists the totals of the summaries on the stream, in order.
func summaryTotals(t *testing.T, events []itx.Event) []int {
	var out []int
	for _, s := range payloadsOf(t, MetricSummary, events) {
		out = append(out, s.Total)
	}
	return out
}

// The summarizer appends a summary after every 5th sample and one a minute after the first
// sample of a batch that did not fill (its flush timer, a scheduled append, landing under the
// virtual clock); a crash between commits changes nothing; the outcome is the same however the
// stream is cut into frames, and a replay appends nothing.
func TestSDKAuthor_Summarizer(t *testing.T) {
	inputs := []itx.EventInput{}
	for i := range 12 {
		inputs = append(inputs, sample([]string{"cpu", "mem", "disk"}[i%3], int64(i*7%11)))
	}
	run := func(t *testing.T, cfg proctest.Config[metricState]) (events []itx.Event, state metricState) {
		cfg.New = func(proctest.Env) processors.Contract[metricState] { return Summarizer(metricFlushAfter) }
		cfg.StrictDeliveryErrors = true
		proctest.Run(t, cfg, func(t *testing.T, h *proctest.Harness[metricState]) {
			if _, err := h.Stream.Append(t.Context(), inputs[:7]); err != nil {
				t.Fatal(err)
			}
			h.Wake()
			h.Crash()
			if _, err := h.Stream.Append(t.Context(), inputs[7:]); err != nil {
				t.Fatal(err)
			}
			h.Wake()
			if got := summaryTotals(t, h.Events()); !slices.Equal(got, []int{5, 10}) {
				t.Errorf("summaries before the minute %v, want [5 10]", got)
			}
			if n := len(h.Stream.Scheduled()); n != 3 {
				t.Errorf("%d flush timers pending, want 3 (one per batch)", n)
			}
			h.AdvanceTime(metricFlushAfter)
			if got := summaryTotals(t, h.Events()); !slices.Equal(got, []int{5, 10, 12}) {
				t.Errorf("summaries after the minute %v, want [5 10 12]", got)
			}
			if n := len(h.Stream.Scheduled()); n != 0 {
				t.Errorf("%d flush timers still pending, want 0", n)
			}
			events, state = h.Events(), h.State()

			head := h.Stream.Head()
			r := proctest.New(t, proctest.Config[metricState]{New: cfg.New, Substrate: h.Substrate(), StrictDeliveryErrors: true})
			r.Wake()
			if h.Stream.Head() != head || len(h.Stream.Scheduled()) != 0 {
				t.Errorf("the replay appended or scheduled: head %d (want %d), %d pending", h.Stream.Head(), head, len(h.Stream.Scheduled()))
			}
		})
		return events, state
	}
	var want []itx.Event
	var wantState metricState
	t.Run("one batch", func(t *testing.T) { want, wantState = run(t, proctest.Config[metricState]{PageSize: 100}) })
	last := payloadsOf(t, MetricSummary, want)
	if len(last) != 3 || last[2].Aggs["cpu"] != (MetricAgg{Count: 4, Sum: 0 + 10 + 9 + 8, Min: 0, Max: 10}) {
		t.Errorf("the last summary %+v", last)
	}
	strip := func(events []itx.Event) string {
		var b []string
		for _, e := range events {
			b = append(b, fmt.Sprintf("%d %s %s %s", e.Offset, e.Type, e.Payload, e.IdempotencyKey))
		}
		j, _ := json.Marshal(b)
		return string(j)
	}
	for _, cfg := range []proctest.Config[metricState]{{PageSize: 1}, {PageSize: 4, PartitionSeed: 7}, {PageSize: 9, PartitionSeed: 99}} {
		t.Run(fmt.Sprintf("page %d seed %d", cfg.PageSize, cfg.PartitionSeed), func(t *testing.T) {
			got, state := run(t, cfg)
			if strip(got) != strip(want) {
				t.Errorf("events differ from one batch's:\n got %s\nwant %s", strip(got), strip(want))
			}
			if fmt.Sprint(state) != fmt.Sprint(wantState) {
				t.Errorf("state %+v, one batch's %+v", state, wantState)
			}
		})
	}
}

func setReminder(id, text string, in time.Duration) itx.EventInput {
	return ReminderSet.Input(ReminderSetP{ID: id, Text: text, InMs: in.Milliseconds()}, "")
}

func cancelReminder(id string) itx.EventInput {
	return ReminderCancelled.Input(ReminderRef{ID: id}, "")
}

// firedIDs lists the ids of the reminders that fired, in order.
func firedIDs(t *testing.T, events []itx.Event) []string {
	var out []string
	for _, f := range payloadsOf(t, ReminderFired, events) {
		out = append(out, f.ID)
	}
	return out
}

// Reminders fire once each at their time, across a crash; a cancelled one's timer and a moved
// one's first land at once and fire nothing; a replay schedules and appends nothing.
func TestSDKAuthor_Reminders(t *testing.T) {
	cfg := proctest.Config[reminderState]{New: func(proctest.Env) processors.Contract[reminderState] { return Reminders() }, StrictDeliveryErrors: true}
	proctest.Run(t, cfg, func(t *testing.T, h *proctest.Harness[reminderState]) {
		h.Append(setReminder("a", "stand up", 10*time.Minute), setReminder("b", "water", 5*time.Minute))
		h.Append(cancelReminder("b"), setReminder("c", "call", 2*time.Minute))
		h.Append(setReminder("c", "call later", 20*time.Minute)) // moves c
		if n := len(h.Stream.Scheduled()); n != 2 {
			t.Errorf("%d timers pending, want 2 (a and the moved c: the cancelled b's and c's first landed at once)", n)
		}
		if n := len(h.Events(string(ReminderDue))); n != 2 {
			t.Errorf("%d timers landed at the cancel and the move, want 2", n)
		}
		h.AdvanceTime(6 * time.Minute)
		if got := firedIDs(t, h.Events()); len(got) != 0 {
			t.Errorf("fired %v by 6 min, want none (b cancelled, c moved)", got)
		}
		h.Crash()
		h.AdvanceTime(5 * time.Minute)
		if got := firedIDs(t, h.Events()); !slices.Equal(got, []string{"a"}) {
			t.Errorf("fired %v by 11 min, want [a]", got)
		}
		h.AdvanceTime(10 * time.Minute)
		if got := firedIDs(t, h.Events()); !slices.Equal(got, []string{"a", "c"}) {
			t.Errorf("fired %v by 21 min, want [a c]", got)
		}
		fired := payloadsOf(t, ReminderFired, h.Events())
		if fired[1].Text != "call later" {
			t.Errorf("c fired with %q, want its moved text", fired[1].Text)
		}
		if n := len(h.Events(string(ReminderDue))); n != 4 {
			t.Errorf("%d timers landed, want 4", n)
		}
		head := h.Stream.Head()
		r := proctest.New(t, proctest.Config[reminderState]{New: cfg.New, Substrate: h.Substrate(), StrictDeliveryErrors: true})
		r.Wake()
		if h.Stream.Head() != head || len(h.Stream.Scheduled()) != 0 {
			t.Errorf("the replay appended or scheduled: head %d (want %d), %d pending", h.Stream.Head(), head, len(h.Stream.Scheduled()))
		}
		if got := r.State(); fmt.Sprint(got) != fmt.Sprint(h.State()) {
			t.Errorf("replayed state %+v, live %+v", got, h.State())
		}
	})
}
