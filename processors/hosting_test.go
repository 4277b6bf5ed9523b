package processors_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
	proctest "github.com/itx-dev/itx/processors/testing"
)

// Add refuses a nil build with invalidArgument rather than panicking on it.
func TestAdd_NilBuild(t *testing.T) {
	err := processors.Add[int](processors.NewHost("v1"), nil)
	if itx.ErrorCode(err) != itx.EInvalid {
		t.Fatalf("got %v, want invalidArgument", err)
	}
}

// Add refuses a contract whose name no subscription can carry: spaces around it (a subscription's
// name is trimmed, so it would never run), or a name a subscription may not have.
func TestAdd_NameASubscriptionCanCarry(t *testing.T) {
	contract := func(name string) func() processors.Contract[int] {
		return func() processors.Contract[int] {
			return processors.Contract[int]{Name: name, ConsumedTypes: []string{"x"}, ReducerVersion: "1",
				InitialState: func() int { return 0 }, Reduce: func(n int, _ itx.Event) int { return n + 1 }}
		}
	}
	for name, want := range map[string]string{
		" padded":                 "spaces around it",
		"tab\tinside":             "subscription name",
		strings.Repeat("n", 501):  "subscription name",
		"ok/with-slash:and.dots~": "",
	} {
		err := processors.Add(processors.NewHost("v1"), contract(name))
		if want == "" {
			if err != nil {
				t.Errorf("%q: %v", name, err)
			}
			continue
		}
		if itx.ErrorCode(err) != itx.EInvalid || !strings.Contains(itx.ErrorMessage(err), want) {
			t.Errorf("%.20q: got %v, want invalidArgument naming %q", name, err, want)
		}
	}
}

// One processor's start that refolds a long history (a new ReducerVersion) holds up no other
// processor of the stream: each wake Starts its runner, and Start held one lock for the stream
// across the whole refold, so every processor on the stream stood still until it ended.
func TestHost_AStartRefoldingHoldsUpNoOtherProcessor(t *testing.T) {
	ctx := t.Context()
	stream := proctest.NewMemoryStream("/refold", itx.SystemClock{})
	for range 3 {
		if _, err := stream.Append(ctx, []itx.EventInput{{Type: "x"}}); err != nil {
			t.Fatal(err)
		}
	}
	progress := proctest.NewMemoryProgressStore()
	// "slow" processed the stream under reducer version 0: version 1 refolds it when it opens.
	_, gen, _ := progress.Claim(ctx, "slow")
	if err := progress.Commit(ctx, "slow", gen, processors.Progress{ReducerVersion: "0", Contract: "slow", ReducedThrough: 3, ProcessedThrough: 3, State: []byte("0")}); err != nil {
		t.Fatal(err)
	}
	folding, unblock := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := processors.NewHost("v1")
	for _, name := range []string{"slow", "fast"} {
		if err := processors.Add(h, func() processors.Contract[int] {
			return processors.Contract[int]{Name: name, ConsumedTypes: []string{"x"}, ReducerVersion: "1",
				InitialState: func() int { return 0 },
				Reduce: func(n int, e itx.Event) int {
					if name == "slow" {
						once.Do(func() { close(folding) })
						<-unblock // a refold that takes long
					}
					return n + 1
				}}
		}); err != nil {
			t.Fatal(err)
		}
	}
	ps, err := h.Open(ctx, itx.ProcessorPorts{Path: "/refold", Log: stream, Progress: progress, KV: proctest.NewMemoryKV(),
		Alarm: &proctest.MemoryAlarm{}, Clock: itx.SystemClock{}, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	slowDone := make(chan error, 1)
	go func() { _, err := ps.Start(ctx, "slow", ""); slowDone <- err }()
	<-folding
	fastDone := make(chan error, 1)
	go func() { _, err := ps.Start(ctx, "fast", ""); fastDone <- err }()
	select {
	case err := <-fastDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		close(unblock)
		t.Fatal("another processor's Start waited for the refold")
	}
	// The same instance's Start waits for the one in progress, and finds its runner.
	again := make(chan error, 1)
	go func() { _, err := ps.Start(ctx, "slow", ""); again <- err }()
	select {
	case err := <-again:
		t.Fatalf("a second Start of the instance did not wait for the first: %v", err)
	default:
	}
	close(unblock)
	if err := <-slowDone; err != nil {
		t.Fatal(err)
	}
	if err := <-again; err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"slow", "fast"} {
		r, ok := ps.Runner(name)
		if !ok || r.ProcessedThrough() != map[string]int64{"slow": 3, "fast": 0}[name] {
			t.Errorf("%s: runner %v registered %v", name, r, ok)
		}
	}
}
