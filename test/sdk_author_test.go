package test

// Three processors written as an engineer using the SDK would write them, from its documentation
// only (README, processors/README.md, the package docs, processors/examples): an answerer that
// asks an external HTTP API (an LLM stand-in) once per question, a reducer that keeps per-key
// aggregates and appends a summary every N samples (or a minute after the first sample a summary
// has not covered), and a reminder service that schedules delayed appends and cancels them.
// sdk_author_process_test.go runs them in a real itxd, in-process and on a remote host, and
// kills both with kill -9 along the way.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
)

// ---- (a) the answerer: one vendor call per question, never two ----

// The answerer's vocabulary: a question opens an obligation, its answer settles it.
const (
	QAAsked    = processors.EventType[QAQuestion]("qa/asked")
	QAAnswered = processors.EventType[QAAnswer]("qa/answered")
)

// QAQuestion is a question for the vendor.
type QAQuestion struct {
	Question string `json:"question"`
}

// QAAnswer settles the question asked at AskedOffset.
type QAAnswer struct {
	AskedOffset int64  `json:"askedOffset"`
	Text        string `json:"text"`
}

// qaState holds the questions not answered yet, by the offset they were asked at.
type qaState struct {
	Open     map[string]string `json:"open"` // askedOffset (decimal) -> question
	Answered int               `json:"answered"`
}

// qaVendor asks the external API: key is the idempotency key it passes on, so the vendor runs a
// request it has seen under that key only once (it answers a repeat from what it kept).
type qaVendor func(ctx context.Context, key, question string) (string, error)

// Answerer asks vendor once per qa/asked and appends its answer as qa/answered. The vendor call
// is an obligation (seed 002): it is too long for BlockProcessorWhile, so it runs as a
// RunInBackground attempt, started from the reduced state at the head; an attempt lost to a crash
// is started again by the next caught-up pass (the keepalive revives the processor for it), under
// the same vendor idempotency key, so the vendor acts once however many times it is dialed.
func Answerer(vendor qaVendor) processors.Contract[qaState] {
	var mu sync.Mutex
	live := map[string]bool{} // the attempts this incarnation drives
	return processors.Contract[qaState]{
		Name:           "answerer",
		ConsumedTypes:  []string{string(QAAsked), string(QAAnswered)},
		ReducerVersion: "1",
		InitialState:   func() qaState { return qaState{Open: map[string]string{}} },
		Validate: func(e itx.Event) error {
			if e.Type == string(QAAsked) {
				_, err := QAAsked.Decode(e)
				return err
			}
			_, err := QAAnswered.Decode(e)
			return err
		},
		Reduce: func(s qaState, e itx.Event) qaState {
			open := maps.Clone(s.Open)
			switch e.Type {
			case string(QAAsked):
				q, _ := QAAsked.Decode(e)
				open[strconv.FormatInt(e.Offset, 10)] = q.Question
			case string(QAAnswered):
				a, _ := QAAnswered.Decode(e)
				k := strconv.FormatInt(a.AskedOffset, 10)
				if _, ok := open[k]; ok {
					delete(open, k)
					s.Answered++
				}
			}
			s.Open = open
			return s
		},
		ProcessEvent: func(ctx context.Context, a *processors.Args[qaState]) error {
			if !a.Delivery.CaughtUp {
				return nil // behind the head an answer may be in a page not read yet
			}
			for _, k := range slices.Sorted(maps.Keys(a.State.Open)) {
				mu.Lock()
				driving := live[k]
				live[k] = true // before RunInBackground, so the next pass never starts it twice
				mu.Unlock()
				if driving {
					continue
				}
				offset, _ := strconv.ParseInt(k, 10, 64)
				question := a.State.Open[k]
				answerKey := a.IdempotencyKey("answer@"+k, nil)
				// Droppable: if this attempt dies with the incarnation, the question stays open in
				// the reduced state and the next caught-up pass (a revival's) starts it again.
				a.RunInBackground(func(ctx context.Context) error {
					defer func() { mu.Lock(); delete(live, k); mu.Unlock() }()
					text, err := vendor(ctx, answerKey, question)
					if err != nil {
						return err
					}
					_, err = a.Append(ctx, QAAnswered.Input(QAAnswer{AskedOffset: offset, Text: text}, answerKey))
					if itx.ErrorCode(err) == itx.EIdempotencyConflict {
						return nil // another attempt settled it first: settled is settled
					}
					return err
				})
			}
			return nil
		},
	}
}

// ---- (b) the reducer: per-key aggregates, a summary every N samples or a minute on ----

// The reducer's vocabulary.
const (
	MetricSample  = processors.EventType[MetricSampleP]("metric/sample")
	MetricFlush   = processors.EventType[MetricFlushP]("metric/flush-due")
	MetricSummary = processors.EventType[MetricSummaryP]("metric/summary")
)

// MetricSampleP is one measurement.
type MetricSampleP struct {
	Key   string `json:"key"`
	Value int64  `json:"value"`
}

// MetricFlushP is the timer a batch's first sample sets: Batch is the batch it flushes.
type MetricFlushP struct {
	Batch int `json:"batch"`
}

// MetricAgg aggregates one key.
type MetricAgg struct {
	Count int   `json:"count"`
	Sum   int64 `json:"sum"`
	Min   int64 `json:"min"`
	Max   int64 `json:"max"`
}

// MetricSummaryP is the aggregates after Total samples.
type MetricSummaryP struct {
	Total int                  `json:"total"`
	Aggs  map[string]MetricAgg `json:"aggs"`
}

// metricState is every key's aggregate and how many samples there were.
type metricState struct {
	Aggs  map[string]MetricAgg `json:"aggs"`
	Total int                  `json:"total"`
}

// metricEvery is how many samples a summary covers at most.
const metricEvery = 5

// Summarizer keeps per-key aggregates of metric/sample and appends metric/summary after every
// metricEvery-th sample, and flushAfter the first sample of a batch that has not filled by
// then (a metric/flush-due timer, ScheduleAppend). Every append's body is a function of the
// event-time state, keyed by the event it comes from, so a redelivery or a replay dedupes.
func Summarizer(flushAfter time.Duration) processors.Contract[metricState] {
	return processors.Contract[metricState]{
		Name:           "summarizer",
		ConsumedTypes:  []string{string(MetricSample), string(MetricFlush)},
		ReducerVersion: "1",
		InitialState:   func() metricState { return metricState{Aggs: map[string]MetricAgg{}} },
		Validate: func(e itx.Event) error {
			if e.Type == string(MetricFlush) {
				_, err := MetricFlush.Decode(e)
				return err
			}
			m, err := MetricSample.Decode(e)
			if err == nil && m.Key == "" {
				err = itx.Errorf(itx.EInvalid, "a sample needs a key")
			}
			return err
		},
		Reduce: func(s metricState, e itx.Event) metricState {
			if e.Type != string(MetricSample) {
				return s
			}
			m, _ := MetricSample.Decode(e)
			aggs := maps.Clone(s.Aggs) // Reduce must not change the state it was given
			g, seen := aggs[m.Key]
			if !seen || m.Value < g.Min {
				g.Min = m.Value
			}
			if !seen || m.Value > g.Max {
				g.Max = m.Value
			}
			g.Count++
			g.Sum += m.Value
			aggs[m.Key] = g
			return metricState{Aggs: aggs, Total: s.Total + 1}
		},
		ProcessEvent: func(ctx context.Context, a *processors.Args[metricState]) error {
			if a.Event == nil {
				return nil
			}
			summary := MetricSummary.Input(MetricSummaryP{Total: a.State.Total, Aggs: a.State.Aggs}, a.IdempotencyKey("summary", a.Event))
			switch a.Event.Type {
			case string(MetricSample):
				if a.State.Total%metricEvery == 1 || metricEvery == 1 {
					// The batch's deadline, from the event's own time so a redelivery sets the same.
					at := time.UnixMilli(a.Event.CreatedAt).Add(flushAfter)
					flush := MetricFlush.Input(MetricFlushP{Batch: a.State.Total / metricEvery}, a.IdempotencyKey("flush", a.Event))
					if err := a.ScheduleAppend(ctx, at, flush); err != nil {
						return err
					}
				}
				if a.State.Total%metricEvery == 0 {
					_, err := a.Append(ctx, summary)
					return err
				}
			case string(MetricFlush):
				f, _ := MetricFlush.Decode(*a.Event)
				// A batch that filled has had its summary; a flush of it lands late and does nothing.
				if f.Batch == a.State.Total/metricEvery && a.State.Total%metricEvery != 0 {
					_, err := a.Append(ctx, summary)
					return err
				}
			}
			return nil
		},
	}
}

// ---- (c) reminders: delayed appends, and their cancellation ----

// The reminder vocabulary.
const (
	ReminderSet       = processors.EventType[ReminderSetP]("reminder/set")
	ReminderCancelled = processors.EventType[ReminderRef]("reminder/cancelled")
	ReminderDue       = processors.EventType[ReminderDueP]("reminder/due")
	ReminderFired     = processors.EventType[ReminderFiredP]("reminder/fired")
)

// ReminderSetP sets (or moves) reminder ID to In milliseconds after the event.
type ReminderSetP struct {
	ID   string `json:"id"`
	Text string `json:"text"`
	InMs int64  `json:"inMs"`
}

// ReminderRef names a reminder.
type ReminderRef struct {
	ID string `json:"id"`
}

// ReminderDueP is the timer of the reminder set at SetOffset.
type ReminderDueP struct {
	ID        string `json:"id"`
	SetOffset int64  `json:"setOffset"`
}

// ReminderFiredP is a reminder going off.
type ReminderFiredP struct {
	ID        string `json:"id"`
	Text      string `json:"text"`
	SetOffset int64  `json:"setOffset"`
}

// reminder is a pending one.
type reminder struct {
	Text      string `json:"text"`
	SetOffset int64  `json:"setOffset"`
}

type reminderState struct {
	Pending map[string]reminder `json:"pending"`
	Fired   int                 `json:"fired"`
}

// Reminders schedules a reminder/due for each reminder/set (ScheduleAppend, keyed by the set
// event), and turns a due timer into one reminder/fired when the reminder it belongs to is still
// pending: a cancel, or a later set of the same id, leaves its timer to land and do nothing.
func Reminders() processors.Contract[reminderState] {
	return processors.Contract[reminderState]{
		Name:           "reminders",
		ConsumedTypes:  []string{string(ReminderSet), string(ReminderCancelled), string(ReminderDue)},
		ReducerVersion: "1",
		InitialState:   func() reminderState { return reminderState{Pending: map[string]reminder{}} },
		Validate: func(e itx.Event) error {
			var err error
			switch e.Type {
			case string(ReminderSet):
				var r ReminderSetP
				if r, err = ReminderSet.Decode(e); err == nil && (r.ID == "" || r.InMs < 0) {
					err = itx.Errorf(itx.EInvalid, "a reminder needs an id and inMs >= 0")
				}
			case string(ReminderCancelled):
				_, err = ReminderCancelled.Decode(e)
			case string(ReminderDue):
				_, err = ReminderDue.Decode(e)
			}
			return err
		},
		Reduce: func(s reminderState, e itx.Event) reminderState {
			pending := maps.Clone(s.Pending)
			switch e.Type {
			case string(ReminderSet):
				r, _ := ReminderSet.Decode(e)
				pending[r.ID] = reminder{Text: r.Text, SetOffset: e.Offset}
			case string(ReminderCancelled):
				r, _ := ReminderCancelled.Decode(e)
				delete(pending, r.ID)
			case string(ReminderDue):
				d, _ := ReminderDue.Decode(e)
				if p, ok := pending[d.ID]; ok && p.SetOffset == d.SetOffset {
					delete(pending, d.ID)
					s.Fired++
				}
			}
			s.Pending = pending
			return s
		},
		ProcessEvent: func(ctx context.Context, a *processors.Args[reminderState]) error {
			if a.Event == nil {
				return nil
			}
			// timer is the due event of the reminder set at setOffset, keyed by that set event.
			timer := func(id string, setOffset int64) itx.EventInput {
				return ReminderDue.Input(ReminderDueP{ID: id, SetOffset: setOffset}, a.IdempotencyKey("due", &itx.Event{Offset: setOffset}))
			}
			// withdraw moves the timer of a reminder this event replaces or cancels to now, so it
			// lands at once (and does nothing) instead of holding one of the stream's pending
			// places until its time.
			withdraw := func(id string) error {
				p, ok := a.PreviousState.Pending[id]
				if !ok {
					return nil
				}
				return a.ScheduleAppend(ctx, time.UnixMilli(a.Event.CreatedAt), timer(id, p.SetOffset))
			}
			switch a.Event.Type {
			case string(ReminderSet):
				r, _ := ReminderSet.Decode(*a.Event)
				if err := withdraw(r.ID); err != nil {
					return err
				}
				at := time.UnixMilli(a.Event.CreatedAt).Add(time.Duration(r.InMs) * time.Millisecond)
				return a.ScheduleAppend(ctx, at, timer(r.ID, a.Event.Offset))
			case string(ReminderCancelled):
				r, _ := ReminderCancelled.Decode(*a.Event)
				return withdraw(r.ID)
			case string(ReminderDue):
				d, _ := ReminderDue.Decode(*a.Event)
				p, ok := a.PreviousState.Pending[d.ID]
				if !ok || p.SetOffset != d.SetOffset {
					return nil // cancelled, or moved by a later set: this timer is stale
				}
				fired := ReminderFired.Input(ReminderFiredP{ID: d.ID, Text: p.Text, SetOffset: d.SetOffset}, a.IdempotencyKey("fired", a.Event))
				_, err := a.Append(ctx, fired)
				return err
			}
			return nil
		},
	}
}

// sdkAuthorHost registers the three processors (the summarizer flushing a batch after a second).
func sdkAuthorHost(version string, vendor qaVendor) (*processors.Host, error) {
	h := processors.NewHost(version)
	if err := processors.Add(h, func() processors.Contract[qaState] { return Answerer(vendor) }); err != nil {
		return nil, err
	}
	if err := processors.Add(h, func() processors.Contract[metricState] { return Summarizer(time.Second) }); err != nil {
		return nil, err
	}
	if err := processors.Add(h, Reminders); err != nil {
		return nil, err
	}
	return h, nil
}

// mustJSON is the JSON of v (a test's payload).
func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("mustJSON: %v", err))
	}
	return b
}
