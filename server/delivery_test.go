package server

import (
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/storage"
)

// blockingSender ignores its context, like a write to a receiver whose connection stopped
// reading: it returns only when the test says so.
type blockingSender struct {
	release chan struct{}
	calls   atomic.Int32
}

func (b *blockingSender) send(context.Context, *deliverer, *itx.DeliveryBatch) (int64, error) {
	b.calls.Add(1)
	<-b.release
	return 0, nil
}
func (b *blockingSender) String() string { return "blocking" }

func TestDeliverer_SendThatCannotBeWrittenTimesOut(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	srv := &Server{cfg: Config{DeliveryTimeout: 20 * time.Second}, clock: clock}
	bs := &blockingSender{release: make(chan struct{})}
	d := &deliverer{srv: srv, name: "hook", send: bs, ctx: context.Background()}

	errc := make(chan error, 1)
	go func() { _, err := d.sendWithTimeout(&itx.DeliveryBatch{}); errc <- err }()
	waitArmed(t, clock, errc)
	clock.Advance(20 * time.Second)
	err := <-errc
	if got, want := itx.ErrorCode(err), itx.EDeadlineExceeded; got != want {
		t.Fatalf("got %v, want %s", err, want)
	}
	// The abandoned send still blocks: the next try waits for it, within a delivery timeout of
	// its own, and fails then, without a second write.
	go func() { _, err := d.sendWithTimeout(&itx.DeliveryBatch{}); errc <- err }()
	waitArmed(t, clock, errc)
	clock.Advance(20 * time.Second)
	err = <-errc
	if err == nil || !strings.Contains(err.Error(), "still blocked") || bs.calls.Load() != 1 {
		t.Fatalf("got %v after %d calls, want a failure after 1", err, bs.calls.Load())
	}
	if got := classify(err); got != classOutage {
		t.Fatalf("class %s, want outage", got)
	}
	close(bs.release)
	if _, err := d.sendWithTimeout(&itx.DeliveryBatch{}); err != nil {
		t.Fatalf("got %v, want the receiver written to again once it drained", err)
	}
	if bs.calls.Load() != 2 {
		t.Fatalf("got %d calls, want the receiver written to again once it drained", bs.calls.Load())
	}
}

// A try after a timed-out send that is returning (its context was cancelled with its deadline,
// and it is on its way back) waits for it and then sends: it does not fail as a receiver still
// blocked, which would burn an attempt on a backoff (and keep a receiver mounted in the old
// one's place waiting that backoff out).
func TestDeliverer_TryAfterATimeoutWaitsForTheAbandonedSend(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	srv := &Server{cfg: Config{DeliveryTimeout: 20 * time.Second}, clock: clock}
	bs := &blockingSender{release: make(chan struct{})}
	d := &deliverer{srv: srv, name: "hook", send: bs, ctx: context.Background()}

	errc := make(chan error, 1)
	go func() { _, err := d.sendWithTimeout(&itx.DeliveryBatch{}); errc <- err }()
	waitArmed(t, clock, errc)
	clock.Advance(20 * time.Second)
	if err := <-errc; itx.ErrorCode(err) != itx.EDeadlineExceeded {
		t.Fatalf("got %v, want %s", err, itx.EDeadlineExceeded)
	}
	go func() { _, err := d.sendWithTimeout(&itx.DeliveryBatch{}); errc <- err }()
	waitArmed(t, clock, errc) // the next try waits for the abandoned send
	close(bs.release)         // which returns now
	if err := <-errc; err != nil {
		t.Fatalf("got %v, want the try to send once the abandoned send returned", err)
	}
	if got, want := bs.calls.Load(), int32(2); got != want {
		t.Fatalf("got %d calls, want %d", got, want)
	}
}

// waitArmed waits until a try running on another goroutine has armed its timer on clock; a try
// that returns first fails the test.
func waitArmed(t *testing.T, clock *clocktest.Clock, errc chan error) {
	t.Helper()
	for clock.Pending() == 0 {
		select {
		case err := <-errc:
			t.Fatalf("the try returned before waiting: %v", err)
		default:
		}
		time.Sleep(time.Millisecond) // the try arms its timer on another goroutine
	}
}

func TestDeliverer_ExpressionThatNoLongerCompilesIsTerminal(t *testing.T) {
	ctx := context.Background()
	store, err := storage.CreateStream(ctx, filepath.Join(t.TempDir(), "s.db"), storage.StreamMeta{StreamID: "s", ProjectID: "p", Path: "/s", CreatedAt: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	srv := &Server{cfg: Config{DeliveryTimeout: time.Second}, clock: clocktest.New(time.Unix(0, 0)), recv: receivers{mounts: map[mountKey]*mount{}}}
	entry := &catalogEntry{Config: itx.SubscriptionConfig{Name: "old", Filter: &itx.SubscriptionFilter{JSONataCondition: "payload.("},
		Receiver: itx.Receiver{Action: itx.KindITXCall, Capability: "x"}}, ConfiguredAtOffset: 1}
	d := newDeliverer(ctx, srv, StreamRef{ProjectID: "p", Path: "/s"}, entry)
	out := d.push(pushJob{name: "old", gen: 1, row: storage.CursorRow{ConfiguredAtOffset: 1, CursorChangedAtOffset: 1}, head: 3, limit: 10, maxBytes: itx.DeliveryBatchBytes}, store, "s")
	if out.failure == nil || out.failure.class != classTerminal || !strings.Contains(out.failure.msg, "no longer compiles") {
		t.Fatalf("got %+v, want a terminal failure saying the condition no longer compiles", out.failure)
	}
	dec := decideFailure(storage.CursorRow{}, *out.failure, itx.OnFailingSkip, 0, 0.5)
	if dec.kind != decideHalt || dec.attempt != 1 {
		t.Fatalf("got %s at attempt %d, want a halt at attempt 1", dec.kind, dec.attempt)
	}
}

// A failure of the receiving side as a whole (the server's loaded-stream bound, a full disk) is
// an outage: retried with backoff, never counted against the events (a skip policy must not
// drop events because a target stream could not be loaded).
func TestClassify_ServerBoundsAreOutages(t *testing.T) {
	for _, code := range []itx.Code{itx.ELimitExceeded, itx.EResourceExhausted, itx.EDeadlineExceeded, itx.EUnavailable} {
		if got := classify(itx.Errorf(code, "x")); got != classOutage {
			t.Errorf("%s: class %s, want outage", code, got)
		}
	}
	for _, code := range []itx.Code{itx.EInvalid, itx.ETooLarge, itx.EFailedPrecondition} {
		if got := classify(itx.Errorf(code, "x")); got != classEvent {
			t.Errorf("%s: class %s, want event", code, got)
		}
	}
}
