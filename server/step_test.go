package server

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/step/*.txt with the output the step gives today")

// stepScript drives the pure step with a script of inputs and prints the effects of each: no
// storage, no goroutines, no TCP. Keys are looked up among the events the script committed.
type stepScript struct {
	t      *testing.T
	st     *streamState
	now    time.Time
	log    []itx.Event // every committed event
	pushes map[string]pushJob
	limits map[string]int
	kv     map[string][]byte            // every committed kv value
	mount  uint64                       // the generation of the receiver mounted now (0: none)
	full   bool                         // room answers resourceExhausted (the disk reserve)
	rows   map[string]storage.CursorRow // every cursor row as last written (what a restart reads)
	out    strings.Builder
}

func newStepScript(t *testing.T) *stepScript {
	now := time.Unix(1_700_000_000, 0)
	st := newStreamState(newTokenBucket(itx.BreakerBurst, itx.BreakerRefillPerMinute, now))
	st.streamID, st.created, st.born = "stream-1", true, true
	return &stepScript{t: t, st: st, now: now, pushes: map[string]pushJob{}, limits: map[string]int{}, kv: map[string][]byte{},
		rows: map[string]storage.CursorRow{}}
}

func (s *stepScript) env() stepEnv {
	return stepEnv{
		rc: reduceContext{path: "/s", projectID: "p", maxSubs: 8,
			compile: func(src string) error { _, err := CompileJSONata(src); return err }},
		lookupKeys: func(keys []string) (map[string]*itx.Event, error) {
			found := map[string]*itx.Event{}
			for _, k := range keys {
				for i := range s.log {
					if s.log[i].IdempotencyKey == k {
						found[k] = &s.log[i]
					}
				}
			}
			return found, nil
		},
		loadKV:          func(key string) ([]byte, error) { return s.kv[key], nil },
		maxProcKVKeys:   3,
		maxProcKVBytes:  40,
		random:          func() float64 { return 0.5 },
		flushDelay:      200 * time.Millisecond,
		deliveryTimeout: 20 * time.Second,
		batchLimits: func(name string) int {
			if n := s.limits[name]; n > 0 {
				return n
			}
			return itx.DeliveryBatchEvents
		},
		mountedNow: func(*catalogEntry) uint64 { return s.mount },
		room: func() error {
			if s.full {
				return itx.Errorf(itx.EResourceExhausted, "below the disk reserve")
			}
			return nil
		},
	}
}

// run executes one script line and prints what the step did.
func (s *stepScript) run(line string) {
	fields := strings.Fields(line)
	args := map[string]string{}
	for _, f := range fields[1:] {
		k, v, _ := strings.Cut(f, "=")
		args[k] = v
	}
	num := func(k string) int64 {
		n, _ := strconv.ParseInt(args[k], 10, 64)
		return n
	}
	var in stepInput
	sub := args["sub"]
	if sub == "" {
		sub = "hook"
	}
	switch fields[0] {
	case "configure":
		r := itx.Receiver{Action: args["kind"]}
		switch r.Action {
		case itx.KindWebhookPost:
			r.URL = "https://example.com/hook"
			if args["url"] != "" {
				r.URL = args["url"]
			}
		case itx.KindITXCall:
			r.Capability = "inbox"
		case itx.KindCopyToStream:
			r.ReceivingStreamPath = "/copy"
		case itx.KindProcessorWake:
			r.Placement = args["placement"]
		}
		if args["policy"] != "" || args["start"] != "" {
			r.Delivery = &itx.DeliveryPolicy{Start: itx.StartBeginning, OnFailingEvent: itx.OnFailingHalt}
			if args["start"] != "" {
				r.Delivery.Start = args["start"]
			}
			if args["policy"] != "" {
				r.Delivery.OnFailingEvent = args["policy"]
			}
			r.Delivery.DeadLetterPath = args["deadletter"]
		}
		if args["limit"] != "" {
			s.limits[sub] = int(num("limit"))
		}
		cfg := itx.SubscriptionConfig{Name: sub, Receiver: r, ConfirmWindow: int(num("window"))}
		if args["types"] != "" {
			cfg.Filter = &itx.SubscriptionFilter{EventTypes: strings.Split(args["types"], ",")}
		}
		b, _ := json.Marshal(cfg)
		in.appends = []*appendReq{{inputs: []itx.EventInput{{Type: itx.TypeSubscriptionConfigured, Payload: b}}, reply: make(chan appendReply, 1)}}
	case "append":
		n := max(1, int(num("n")))
		var inputs []itx.EventInput
		for i := 0; i < n; i++ {
			inputs = append(inputs, itx.EventInput{Type: args["type"], Payload: json.RawMessage(`{}`)})
		}
		in.appends = []*appendReq{{inputs: inputs, reply: make(chan appendReply, 1)}}
	case "control":
		var payload any
		typ := map[string]string{"cursor-set": itx.TypeSubscriptionCursorSet, "resume": itx.TypeSubscriptionResumed, "remove": itx.TypeSubscriptionRemoved, "revive": itx.TypeProcessorRevived}[args["op"]]
		switch args["op"] {
		case "cursor-set":
			payload = itx.CursorSetPayload{Name: sub, AfterOffset: num("after")}
		case "resume":
			payload = itx.NamePayload{Name: sub}
		case "remove":
			payload = itx.RemovedPayload{Name: sub, Reason: "requested"}
		case "revive":
			payload = map[string]any{"processorSlug": sub, "revivals": 1, "version": "v1"}
		}
		b, _ := json.Marshal(payload)
		in.appends = []*appendReq{{inputs: []itx.EventInput{{Type: typ, Payload: b}}, reply: make(chan appendReply, 1)}}
	case "ok", "fail", "late":
		job, ok := s.pushes[sub]
		if !ok {
			s.t.Fatalf("%s: no push in flight for %s", line, sub)
		}
		if fields[0] != "late" {
			delete(s.pushes, sub)
		}
		o := deliveryOutcome{name: sub, gen: job.gen, birth: job.row.ConfiguredAtOffset, seek: job.row.CursorChangedAtOffset,
			acking: job.acking, resets: job.resets}
		if fields[0] == "late" {
			o.gen = -1
		}
		// An offset-acking try: last= is the last event it carried, confirmed= what the answer
		// confirmed, stale=1 that it was started before a reset (a mount) of its subscription.
		o.lastEvent, o.confirmed = num("last"), num("confirmed")
		if args["stale"] != "" {
			o.resets--
		}
		if args["through"] != "" {
			o.through, o.delivered = num("through"), args["watermark"] == ""
		}
		if job.acking && o.lastEvent > 0 {
			// The events it carried, as the deliverer lists them: those its filter passes, after
			// where it read from, through the last one.
			var types []string
			if f := s.st.core.Subscriptions[sub].Config.Filter; f != nil {
				types = f.EventTypes
			}
			for _, e := range s.log {
				if e.Offset > job.after && e.Offset <= o.lastEvent && !e.Ephemeral && (types == nil || slices.Contains(types, e.Type)) {
					o.offsets = append(o.offsets, e.Offset)
				}
			}
		}
		if fields[0] == "fail" {
			class := map[string]failureClass{"event": classEvent, "outage": classOutage, "absent": classAbsent, "terminal": classTerminal}[args["class"]]
			f := &deliveryFailure{class: class, count: int(num("count")), last: num("last"), eventOffset: num("offset"), expression: args["expr"] != "", msg: args["class"] + " failure",
				mount: uint64(num("mount")), processorEvent: args["proc"] != "", deadLettered: args["dead"] != "", refolded: args["refold"] != ""}
			o.failure = f
			if job.acking {
				// As the deliverer reports it: the events before the failing one end where the try
				// read from, or (before=) where the events it carried before it end.
				o.before = job.after
				if args["before"] != "" {
					o.before = num("before")
				}
			}
		}
		in.outcomes = []deliveryOutcome{o}
	case "confirm":
		// Subscription.confirm through=N; the reply is the confirmed cursor, once written.
		in.readers = []readerOp{{name: sub, checkpoint: num("through"), confirm: true, confirmed: new(int64), reply: make(chan error, 1)}}
	case "mount":
		in.mounted = []string{"inbox"}
		if args["gen"] != "" {
			s.mount = uint64(num("gen"))
		}
	case "unmount":
		// The receiver's mount went away; gen names what is mounted now (0: nothing).
		in.unmounted = []string{"inbox"}
		s.mount = 0
		if args["gen"] != "" {
			s.mount = uint64(num("gen"))
		}
	case "advance":
		d, err := time.ParseDuration(args["by"])
		if err != nil {
			s.t.Fatal(err)
		}
		s.now = s.now.Add(d)
	case "flush":
		in.flush = true
	case "restart":
		// A crash and a reload: the rows as last written, every subscription's runtime new
		// (nothing in flight, an offset-acking one sending from its cursor), then a first step.
		s.st.rows, s.st.dirty, s.pushes = map[string]*storage.CursorRow{}, map[string]bool{}, map[string]pushJob{}
		for name, r := range s.rows {
			s.st.rows[name] = &r
		}
		for name := range s.st.subs {
			s.st.subs[name] = s.st.newRuntime()
		}
	case "disk":
		// The disk reserve: disk full (room refuses) or disk room.
		s.full = args["full"] == "true"
		fmt.Fprintf(&s.out, "> %s\n", line)
		return
	case "kv":
		// Processor KV puts, one step, in line order: key=value-length.
		for _, f := range fields[1:] {
			k, n, _ := strings.Cut(f, "=")
			size, _ := strconv.Atoi(n)
			in.procOps = append(in.procOps, procOp{kvKey: k, kvVal: []byte(strings.Repeat("v", size))})
		}
	default:
		s.t.Fatalf("unknown script command %q", fields[0])
	}
	eff, err := step(s.st, in, s.now, s.env())
	fmt.Fprintf(&s.out, "> %s\n", line)
	if err != nil {
		fmt.Fprintf(&s.out, "  error: %v\n", err)
		return
	}
	s.log = append(s.log, eff.commit.Events...)
	for k, v := range eff.commit.KV {
		s.kv[k] = v
	}
	for _, rr := range eff.readerReplies {
		if rr.op.confirm && rr.err != nil {
			fmt.Fprintf(&s.out, "  confirm refused: %v\n", rr.err)
		} else if rr.op.confirm {
			fmt.Fprintf(&s.out, "  confirm answers %d (written: %v)\n", *rr.op.confirmed, eff.flushed)
		}
	}
	for _, a := range eff.procAnswers {
		if a.reply.err != nil {
			fmt.Fprintf(&s.out, "  kv %s refused: %v\n", a.op.kvKey, a.reply.err)
		}
	}
	if len(in.procOps) > 0 {
		fmt.Fprintf(&s.out, "  kv holds %d keys, %d bytes\n", s.st.procKVKeys, s.st.procKVBytes)
	}
	for _, rb := range eff.replies {
		for i, r := range rb.plan.Replies {
			if r.err != nil {
				fmt.Fprintf(&s.out, "  refused: %v\n", r.err)
			} else if r.result.Duplicate[0] {
				fmt.Fprintf(&s.out, "  duplicate of %d\n", rb.plan.Replies[i].result.Offsets[0])
			}
		}
	}
	for _, e := range eff.commit.Events {
		fmt.Fprintf(&s.out, "  event %d %s%s\n", e.Offset, e.Type, summarize(e))
	}
	for _, name := range eff.commit.CursorDeletes {
		delete(s.rows, name)
	}
	for _, r := range eff.commit.CursorUpserts {
		s.rows[r.Name] = r
		fmt.Fprintf(&s.out, "  write %s\n", rowString(r))
	}
	if !eff.flushed {
		names := make([]string, 0, len(s.st.rows))
		for name := range s.st.rows {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			fmt.Fprintf(&s.out, "  row %s\n", rowString(*s.st.rows[name]))
		}
	}
	for _, p := range eff.pushes {
		s.pushes[p.name] = p
		from := ""
		if p.acking {
			from = fmt.Sprintf(" from=%d", p.after) // an offset-acking push reads after here
		}
		fmt.Fprintf(&s.out, "  push %s after=%d%s head=%d limit=%d attempt=%d\n", p.name, p.row.ConfirmedOffset, from, p.head, p.limit, p.row.Attempt+1)
	}
	if eff.wakeAt > 0 {
		fmt.Fprintf(&s.out, "  wake in %s\n", time.Duration(eff.wakeAt-itx.UnixMilli(s.now))*time.Millisecond)
	}
	if eff.lateOutcomes > 0 {
		fmt.Fprintf(&s.out, "  late outcomes refused: %d\n", eff.lateOutcomes)
	}
}

func summarize(e itx.Event) string {
	var p map[string]any
	_ = json.Unmarshal(e.Payload, &p)
	switch e.Type {
	case itx.TypeSubscriptionHalted:
		return fmt.Sprintf(" attempts=%v after=%v error=%q", p["attempts"], p["afterOffset"], p["error"])
	case itx.TypeErrorOccurred:
		return fmt.Sprintf(" %q key=%v", p["message"], e.IdempotencyKey != "")
	}
	return ""
}

func rowString(r storage.CursorRow) string {
	delivered := ""
	if r.DeliveredOffset > 0 {
		delivered = fmt.Sprintf(" delivered=%d", r.DeliveredOffset) // offset-acking subscriptions only
	}
	return fmt.Sprintf("%s birth=%d seek=%d confirmed=%d%s %s attempt=%d next=%d failing=%d/%d skips=%d err=%q",
		r.Name, r.ConfiguredAtOffset, r.CursorChangedAtOffset, r.ConfirmedOffset, delivered, r.Status, r.Attempt,
		r.NextAttemptAt, r.FailingEventOffset, r.FailingEventAttempt, r.FailingEventSkips, r.LastError)
}

// TestStep_Scripts runs every testdata/step/*.txt script: lines starting "> " are inputs, the
// indented lines under each are the effects expected. go test -run TestStep_Scripts -rewrite
// regenerates them; read the diff before committing it.
func TestStep_Scripts(t *testing.T) {
	files, err := filepath.Glob("testdata/step/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			raw, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			s := newStepScript(t)
			var header strings.Builder
			for _, line := range strings.Split(string(raw), "\n") {
				switch {
				case strings.HasPrefix(line, "> "):
					s.run(strings.TrimPrefix(line, "> "))
				case strings.HasPrefix(line, "#") && s.out.Len() == 0:
					header.WriteString(line + "\n")
				case strings.HasPrefix(line, "#"):
					s.out.WriteString(line + "\n")
				}
			}
			got := header.String() + s.out.String()
			if *rewrite {
				if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if got != string(raw) {
				t.Errorf("%s: the step's effects changed (rerun with -rewrite and read the diff)\n--- got\n%s", file, got)
			}
		})
	}
}
