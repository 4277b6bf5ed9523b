package test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/storage"
	"github.com/stretchr/testify/require"
)

// crashSeed picks a seed for a random kill point and logs it, so a failure names its kill point.
func crashSeed(t *testing.T) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed))
}

// keyedBatch is one append call a worker sent, every event under its own idempotency key, and
// what came back (nil offsets: no answer, the kill came first).
type keyedBatch struct {
	events  []itx.EventInput
	offsets []int64
}

// kill -9 at a random point of a keyed load into a stream that copies itself into a mirror:
// after the restart, every batch sent (answered or not) is sent again under its keys. An answered
// one returns its original offsets, all duplicates; an unanswered one is all duplicates or all new
// (an append is atomic). The log then holds every key exactly once with no gap, and the mirror
// holds every source event exactly once. A conditional append then commits only at the true head.
func TestCrash_Kill9RetriedKeysLandOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	rng := crashSeed(t)
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	p := loginItxd(t, proc)
	src := stream(t, p, "/keys")
	subs := client.Subscriptions(ctx, src)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "mirror", FilterTypes: []string{"k"},
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/keys-mirror"}})
	require.NoError(t, err)
	subs.Release()

	const workers = 6
	warm := 100 + rng.IntN(900)
	sent := make([][]*keyedBatch, workers)
	var mu sync.Mutex
	acked := 0
	running := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := client.Dial(context.Background(), proc.addr)
			if err != nil {
				return
			}
			defer conn.Close()
			pw := conn.Login(context.Background(), proc.creds.ProjectToken)
			defer pw.Release()
			s := client.Stream(context.Background(), pw, "/keys")
			defer s.Release()
			for i := 0; ; i++ {
				b := &keyedBatch{}
				for j := range 1 + i%4 {
					b.events = append(b.events, keyed("k", fmt.Sprintf(`{"w":%d,"i":%d,"j":%d}`, w, i, j), fmt.Sprintf("w%d-i%d-j%d", w, i, j)))
				}
				sent[w] = append(sent[w], b)
				res, err := client.Append(context.Background(), s, b.events, itx.AppendOptions{})
				if err != nil {
					return
				}
				b.offsets = res.Offsets
				mu.Lock()
				acked += len(res.Offsets)
				if acked >= warm {
					once.Do(func() { close(running) })
				}
				mu.Unlock()
			}
		}()
	}
	<-running
	proc.kill9(t)
	wg.Wait()
	t.Logf("killed after %d acknowledged events (warm %d)", acked, warm)

	proc = startItxd(t, dataDir)
	p = loginItxd(t, proc)
	src = stream(t, p, "/keys")
	keys := 0
	for w := range sent {
		for _, b := range sent[w] {
			keys += len(b.events)
			res, err := client.Append(ctx, src, b.events, itx.AppendOptions{})
			require.NoError(t, err)
			if b.offsets != nil {
				require.Equal(t, b.offsets, res.Offsets, "an acknowledged batch retried returns its original offsets")
				require.Equal(t, []bool{true}, compactBools(res.Duplicate), "every event of an acknowledged batch is a duplicate")
				continue
			}
			dup := compactBools(res.Duplicate)
			require.Len(t, dup, 1, "an unanswered batch landed in part: %v", res.Duplicate)
		}
	}
	all, err := client.ReadAll(ctx, src, itx.Query{Types: []string{"k"}})
	require.NoError(t, err)
	require.Len(t, all, keys, "every key exactly once")
	seen := map[string]bool{}
	for _, e := range all {
		require.False(t, seen[e.IdempotencyKey], "key %s twice", e.IdempotencyKey)
		seen[e.IdempotencyKey] = true
	}
	info, err := client.Describe(ctx, src)
	require.NoError(t, err)
	require.Equal(t, int64(keys+1), info.HeadOffset, "no gap: the configure and the keys")

	// Conditional appends go by the head the restart found.
	_, err = client.Append(ctx, src, []itx.EventInput{ev("c", `{}`)}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: info.HeadOffset - 1})
	requireCode(t, err, itx.EOffsetConflict)
	res, err := client.Append(ctx, src, []itx.EventInput{ev("c", `{}`)}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: info.HeadOffset})
	require.NoError(t, err)
	require.Equal(t, []int64{info.HeadOffset + 1}, res.Offsets)
	// A retry whose every event is a duplicate is answered from the log whatever the head.
	first := sent[0][0]
	res, err = client.Append(ctx, src, first.events, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 1})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, compactBools(res.Duplicate))

	// The mirror: each source event exactly once, in source order.
	sub := client.Subscription(ctx, src, "mirror")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, info.HeadOffset, 20*time.Second)
	require.NoError(t, err)
	copies, err := client.ReadAll(ctx, stream(t, p, "/keys-mirror"), itx.Query{Types: []string{"k"}})
	require.NoError(t, err)
	require.Len(t, copies, keys, "each source event copied exactly once")
	for i, c := range copies {
		require.Equal(t, all[i].Offset, c.Provenance[0].Offset, "copies in source order")
	}
}

// compactBools is xs with runs of one value collapsed: [true] says all true.
func compactBools(xs []bool) []bool {
	var out []bool
	for _, x := range xs {
		if len(out) == 0 || out[len(out)-1] != x {
			out = append(out, x)
		}
	}
	return out
}

// kill -9 while an itx-call receiver holds a delivery unanswered: after the restart nothing is
// mounted, so the subscription parks (no attempt burnt, the cursor short of the unanswered event)
// and says why; the next mount resumes it, and every event, the unanswered one included, arrives
// at least once, first deliveries in offset order.
func TestCrash_Kill9ItxCallInFlightIsDeliveredAgain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	s := stream(t, loginItxd(t, proc), "/calls-crash")
	subs := client.Subscriptions(ctx, s)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "app", FilterTypes: []string{"msg"}, MaxDeliveryEvents: 3,
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}})
	require.NoError(t, err)
	subs.Release()
	var offsets []int64
	for i := range 30 {
		offsets = append(offsets, mustAppend(t, s, ev("msg", fmt.Sprintf(`{"i":%d}`, i))).Offsets...)
	}
	hangAt := offsets[17]
	var mu sync.Mutex
	var got []int64
	hung := make(chan struct{})
	var hangOnce sync.Once
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	receive := func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
		mu.Lock()
		for _, e := range b.Events {
			got = append(got, e.Offset)
		}
		mu.Unlock()
		for _, e := range b.Events {
			if e.Offset == hangAt {
				hangOnce.Do(func() { close(hung) })
				select { // the first receiver never answers the batch holding hangAt
				case <-release:
				case <-ctx.Done():
				}
				return 0, ctx.Err()
			}
		}
		return 0, nil
	}
	disconnect := mountReceive(t, proc.addr, proc.creds.ProjectToken, "inbox", receive)
	<-hung
	before := describeSub(t, s, "app")
	require.Less(t, before.ConfirmedOffset, hangAt)
	// Delivery progress is written lazily (a crash only redelivers), so the restart may find the
	// cursor behind what describe said here; never past the unanswered event.
	proc.kill9(t)
	disconnect()
	mu.Lock()
	firstLife := len(got)
	mu.Unlock()

	proc = startItxd(t, dataDir)
	s = stream(t, loginItxd(t, proc), "/calls-crash")
	var parked itx.SubscriptionDescription
	waitUntil(t, "parked: nothing is mounted after the restart", func() bool {
		parked = describeSub(t, s, "app")
		return parked.Status == itx.StatusParked
	})
	require.Zero(t, parked.Attempt, "parking burns no attempt")
	require.NotEmpty(t, parked.LastError)
	require.Less(t, parked.ConfirmedOffset, hangAt, "the unanswered delivery was not confirmed")

	var again []int64
	var mu2 sync.Mutex
	defer mountReceive(t, proc.addr, proc.creds.ProjectToken, "inbox", func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
		mu2.Lock()
		defer mu2.Unlock()
		for _, e := range b.Events {
			again = append(again, e.Offset)
		}
		return 0, nil
	})()
	sub := client.Subscription(ctx, s, "app")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, offsets[len(offsets)-1], 20*time.Second)
	require.NoError(t, err)
	mu2.Lock()
	defer mu2.Unlock()
	require.Equal(t, firstAfter(offsets, parked.ConfirmedOffset), firstOf(again, offsets), "delivery resumes right after the cursor")
	seen := map[int64]bool{}
	for _, o := range again {
		seen[o] = true
	}
	for _, o := range offsets {
		if o > parked.ConfirmedOffset {
			require.True(t, seen[o], "offset %d, after the cursor at the restart, delivered after it", o)
		}
	}
	require.True(t, seen[hangAt], "the unanswered event is delivered again")
	for i := 1; i < len(again); i++ {
		require.Less(t, again[i-1], again[i], "in offset order, once each while nothing fails")
	}
	t.Logf("%d deliveries before the kill, %d after; cursor %d at the restart", firstLife, len(again), parked.ConfirmedOffset)
}

// firstAfter is the first of offsets above after (0: none).
func firstAfter(offsets []int64, after int64) int64 {
	for _, o := range offsets {
		if o > after {
			return o
		}
	}
	return 0
}

// firstOf is the first of got that is one of the offsets wanted (0: none).
func firstOf(got, wanted []int64) int64 {
	for _, g := range got {
		for _, w := range wanted {
			if g == w {
				return g
			}
		}
	}
	return 0
}

// kill -9 at a random point of a storm of cursor-sets on a parked subscription and checkpoint
// moves of a registered reader: after the restart the cursor is where the last answered cursor-set
// put it (or the unanswered one after it), and the checkpoint likewise.
func TestCrash_Kill9KeepsAnsweredCursorSetsAndCheckpoints(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	rng := crashSeed(t)
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	p := loginItxd(t, proc)
	s := stream(t, p, "/seek-crash")
	for range 5 {
		mustAppend(t, s, ev("e", `{}`), ev("e", `{}`), ev("e", `{}`), ev("e", `{}`))
	}
	subs := client.Subscriptions(ctx, s)
	// Nothing is ever mounted under "nobody": the subscription parks and its cursor stays where
	// a cursor-set puts it.
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "seeker",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "nobody"}})
	require.NoError(t, err)
	subs.Release()
	readers := readersOf(ctx, s)
	defer readers.Release()

	kill := 20 + rng.IntN(200)
	type op struct {
		cursor   bool
		to       int64
		answered bool
	}
	var ops []*op
	var mu sync.Mutex
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			o := &op{cursor: i%2 == 0, to: int64(1 + (i*7)%20)}
			mu.Lock()
			ops = append(ops, o)
			mu.Unlock()
			var err error
			if o.cursor {
				_, err = client.SetSubscriptionCursor(ctx, s, "seeker", o.to)
			} else {
				err = client.RegisterReader(ctx, readers, "mirror", o.to)
			}
			if err != nil {
				return
			}
			mu.Lock()
			o.answered = true
			n := len(ops)
			mu.Unlock()
			if n == kill {
				close(stop)
			}
		}
	}()
	<-stop
	proc.kill9(t)
	<-done

	// What each may be: the last answered value, or a later one sent but not answered.
	possible := func(cursor bool) map[int64]bool {
		out := map[int64]bool{}
		for i := len(ops) - 1; i >= 0; i-- {
			if ops[i].cursor != cursor {
				continue
			}
			out[ops[i].to] = true
			if ops[i].answered {
				return out
			}
		}
		return out
	}
	proc = startItxd(t, dataDir)
	p = loginItxd(t, proc)
	s = stream(t, p, "/seek-crash")
	d := describeSub(t, s, "seeker")
	require.True(t, possible(true)[d.ConfirmedOffset], "cursor %d after the restart; the last cursor-sets sent: %v", d.ConfirmedOffset, possible(true))
	readers = readersOf(ctx, s)
	defer readers.Release()
	list, err := client.ListReaders(ctx, readers)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.True(t, possible(false)[list[0].Checkpoint], "checkpoint %d after the restart; the last moves sent: %v", list[0].Checkpoint, possible(false))
	t.Logf("%d ops before the kill", len(ops))
}

// readersOf returns stream.readers() as a pipelined capability. Release it when done.
func readersOf(ctx context.Context, s schema.Stream) schema.Readers {
	fut, release := s.Readers(ctx, nil)
	r := fut.Readers().AddRef()
	release()
	return r
}

// Scheduled appends moved and cancelled just before a kill -9: after the restart the cancelled
// one never lands, the moved one lands once with its new body, and the untouched one once.
func TestCrash_Kill9KeepsScheduleMovesAndCancels(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	s := stream(t, loginItxd(t, proc), "/timers-moves")
	mustAppend(t, s, ev("a", `{}`))
	now := time.Now()
	_, _, err := client.Schedule(ctx, s, keyed("t", `{"v":"cancelled"}`, "cancel-me"), now.Add(400*time.Millisecond))
	require.NoError(t, err)
	_, _, err = client.Schedule(ctx, s, keyed("t", `{"v":1}`, "move-me"), now.Add(300*time.Millisecond))
	require.NoError(t, err)
	_, _, err = client.Schedule(ctx, s, keyed("last", `{}`, "last"), now.Add(900*time.Millisecond))
	require.NoError(t, err)
	_, _, err = client.Schedule(ctx, s, keyed("t", `{"v":2}`, "move-me"), now.Add(600*time.Millisecond))
	require.NoError(t, err)
	found, err := client.CancelScheduled(ctx, s, "cancel-me")
	require.NoError(t, err)
	require.True(t, found)
	proc.kill9(t)

	proc = startItxd(t, dataDir)
	s = stream(t, loginItxd(t, proc), "/timers-moves")
	// "last" is due after the others: once it is in the log, they would be too.
	_, err = client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"last"}}, 0, 20*time.Second)
	require.NoError(t, err)
	got, err := client.ReadAll(ctx, s, itx.Query{Types: []string{"t", "last"}})
	require.NoError(t, err)
	require.Len(t, got, 2, "the moved one and the last, once each; the cancelled one never: %v", got)
	require.Equal(t, "move-me", got[0].IdempotencyKey)
	require.JSONEq(t, `{"v":2}`, string(got[0].Payload), "the moved body")
	list, err := client.ListScheduled(ctx, s)
	require.NoError(t, err)
	require.Empty(t, list)
}

// A processor-wake subscription halted because no contract was hosted under its name stays
// halted across a kill -9 and a restart that now hosts it, saying why; resuming it after the
// restart processes everything owed exactly once.
func TestCrash_Kill9HaltStaysUntilResumed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir, "--processors", "")
	ctx := ctxT(t)
	s := stream(t, loginItxd(t, proc), "/halt-resume")
	configureProcessor(t, s, "forwarder")
	const n = 20
	for i := range n {
		mustAppend(t, s, examples.InboxMessage.Input(json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)), ""))
	}
	var before itx.SubscriptionDescription
	waitUntil(t, "halted", func() bool {
		before = describeSub(t, s, "forwarder")
		return before.Status == itx.StatusHalted
	})
	require.Contains(t, before.LastError, "no processor is registered")
	proc.kill9(t)

	proc = startItxd(t, dataDir, "--processors", "forwarder")
	s = stream(t, loginItxd(t, proc), "/halt-resume")
	after := describeSub(t, s, "forwarder")
	require.Equal(t, itx.StatusHalted, after.Status, "a halt stays until resumed")
	require.Equal(t, before.LastError, after.LastError)
	require.Equal(t, before.ConfirmedOffset, after.ConfirmedOffset)
	require.Zero(t, countType(t, s, string(examples.OutboxForwarded)), "nothing ran while halted")
	_, err := client.ResumeSubscription(ctx, s, "forwarder")
	require.NoError(t, err)
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	sub := client.Subscription(ctx, s, "forwarder")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, info.HeadOffset, 20*time.Second)
	require.NoError(t, err)
	require.Equal(t, n, countType(t, s, string(examples.OutboxForwarded)))
	require.Equal(t, 1, countType(t, s, itx.TypeSubscriptionHalted), "halted once")
}

// kill -9 midway up the ladder of an event a webhook refuses, under onFailingEvent "skip" with a
// dead-letter stream: the restart goes on from the attempts already made (the event is tried
// three times in all, not three more), the letter lands once, and the events after it are
// delivered.
func TestCrash_Kill9MidLadderSkipsOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	h := newHook(t, func(_ int, b itx.WebhookBody) int {
		if string(b.Event.Type) == "poison" {
			return 422
		}
		return 200
	})
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	s := stream(t, loginItxd(t, proc), "/ladder")
	subs := client.Subscriptions(ctx, s)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "hook", Start: "now", OnFailingEvent: "skip",
		DeadLetterPath: "/ladder-dead", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	require.NoError(t, err)
	subs.Release()
	res := mustAppend(t, s, ev("ok", `{}`), ev("poison", `{}`), ev("ok", `{}`))
	poison := res.Offsets[1]
	var before itx.SubscriptionDescription
	waitUntil(t, "the second refusal", func() bool {
		before = describeSub(t, s, "hook")
		return before.FailingEventAttempt == 2
	})
	proc.kill9(t)
	require.Equal(t, poison, before.FailingEventOffset)

	proc = startItxd(t, dataDir)
	p := loginItxd(t, proc)
	s = stream(t, p, "/ladder")
	after := describeSub(t, s, "hook")
	require.Equal(t, before.FailingEventOffset, after.FailingEventOffset)
	require.Equal(t, before.FailingEventAttempt, after.FailingEventAttempt)
	require.Equal(t, before.NextAttemptAt, after.NextAttemptAt)
	sub := client.Subscription(ctx, s, "hook")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, res.HeadOffset, 20*time.Second)
	require.NoError(t, err)
	tries := 0
	for _, o := range h.received() {
		if o == poison {
			tries++
		}
	}
	require.Equal(t, itx.FailingEventConfirmAttempts, tries, "the ladder went on from where it stood")
	letters, err := client.ReadAll(ctx, stream(t, p, "/ladder-dead"), itx.Query{Types: []string{itx.TypeDeadLetter}})
	require.NoError(t, err)
	require.Len(t, letters, 1)
	var letter itx.DeadLetterPayload
	require.NoError(t, json.Unmarshal(letters[0].Payload, &letter))
	require.Equal(t, poison, letter.Offset)
	require.Equal(t, itx.FailingEventConfirmAttempts, letter.Attempts)
	require.Contains(t, h.distinct(), res.Offsets[2])
}

// A barrier waiting when itxd is killed fails (it never answers as if processed); after the
// restart the same barrier resolves once the receiver takes the event.
func TestCrash_Kill9FailsAWaitingBarrier(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	var healthy atomic.Bool
	h := newHook(t, func(_ int, b itx.WebhookBody) int {
		if !healthy.Load() {
			return 503
		}
		return 200
	})
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	s := stream(t, loginItxd(t, proc), "/barrier")
	subs := client.Subscriptions(ctx, s)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "hook", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	require.NoError(t, err)
	subs.Release()
	res := mustAppend(t, s, ev("job", `{}`))
	sub := client.Subscription(ctx, s, "hook")
	waited := make(chan error, 1)
	go func() {
		_, err := client.WaitUntilProcessed(ctx, sub, res.HeadOffset, 20*time.Second)
		waited <- err
	}()
	waitUntil(t, "a refused delivery", func() bool { return h.count() >= 1 })
	proc.kill9(t)
	require.Error(t, <-waited, "the barrier did not resolve")
	sub.Release()

	healthy.Store(true)
	proc = startItxd(t, dataDir)
	s = stream(t, loginItxd(t, proc), "/barrier")
	sub = client.Subscription(ctx, s, "hook")
	defer sub.Release()
	confirmed, err := client.WaitUntilProcessed(ctx, sub, res.HeadOffset, 20*time.Second)
	require.NoError(t, err)
	require.GreaterOrEqual(t, confirmed, res.HeadOffset)
	require.Contains(t, h.distinct(), res.HeadOffset)
}

// kill -9 right after a webhook subscription with a signing secret is configured, and right
// after a second one is reconfigured without its secret: after the restart (whose sweep deletes
// the secrets no subscription references) the first still signs every delivery with its secret.
func TestCrash_Kill9KeepsAConfiguredSecret(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	h := newHook(t, nil)
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	s := stream(t, loginItxd(t, proc), "/signed")
	secret, _ := newSecret(t)
	other, _ := newSecret(t)
	subs := client.Subscriptions(ctx, s)
	for _, c := range []client.SubscriptionConfig{
		{Name: "other", Start: "now", FilterTypes: []string{"never"}, Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url(), Secret: other}},
		{Name: "other", Start: "now", FilterTypes: []string{"never"}, Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}},
		{Name: "signed", Start: "now", FilterTypes: []string{"e"}, Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url(), Secret: secret}},
	} {
		_, _, err := client.ConfigureSubscription(ctx, subs, c)
		require.NoError(t, err)
	}
	subs.Release()
	proc.kill9(t)

	proc = startItxd(t, dataDir)
	s = stream(t, loginItxd(t, proc), "/signed")
	res := mustAppend(t, s, ev("e", `{}`))
	sub := client.Subscription(ctx, s, "signed")
	defer sub.Release()
	_, err := client.WaitUntilProcessed(ctx, sub, res.HeadOffset, 20*time.Second)
	require.NoError(t, err)
	require.True(t, describeSub(t, s, "signed").SecretSet)
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Len(t, h.raw, 1)
	require.NoError(t, client.VerifyWebhook(secret, h.headers[0], h.raw[0], time.Now()), "signed with the secret configured before the kill")
}

// A scheduled append due after the restart, on a stream nothing touches after a kill -9, lands
// on its own (the directory alarm loads the stream) and reaches the stream's webhook once.
func TestCrash_Kill9ScheduledLandsUntouched(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	h := newHook(t, nil)
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	p := loginItxd(t, proc)
	s := stream(t, p, "/timers-untouched")
	subs := client.Subscriptions(ctx, s)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "hook", Start: "now", FilterTypes: []string{"later"},
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	require.NoError(t, err)
	subs.Release()
	_, _, err = client.Schedule(ctx, s, keyed("later", `{}`, "later-1"), time.Now().Add(time.Second))
	require.NoError(t, err)
	s.Release()
	proc.kill9(t)

	proc = startItxd(t, dataDir)
	waitUntil(t, "the scheduled event reached the webhook", func() bool { return h.count() >= 1 })
	p = loginItxd(t, proc)
	s = stream(t, p, "/timers-untouched")
	require.Equal(t, 1, countType(t, s, "later"))
	require.Equal(t, 1, len(h.distinct()))
}

// kill -9 at a random point while a remote forwarder works through a bulk of messages: its host
// reconnects on its own, and every message is forwarded exactly once (a frame cut short is
// delivered again and its stable-keyed appends dedupe).
func TestRemote_Kill9ItxdMidBulkForwardsOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	rng := crashSeed(t)
	dataDir, addr := t.TempDir(), freeAddr(t)
	proc := startItxd(t, dataDir, "--listen", addr, "--processors", "")
	ctx := ctxT(t)
	p := loginItxd(t, proc)
	startRemoteHost(t, addr, proc.creds.ProjectToken, "--name", "forwarders", "--processors", "forwarder")
	awaitContract(t, p, "forwarder")
	s := stream(t, p, "/remote/bulk")
	configureRemote(t, s, "forwarder")
	const n = 400
	for i := 0; i < n; i += 40 {
		batch := make([]itx.EventInput, 40)
		for j := range batch {
			batch[j] = examples.InboxMessage.Input(json.RawMessage(fmt.Sprintf(`{"n":%d}`, i+j)), "")
		}
		_, err := client.Append(ctx, s, batch, itx.AppendOptions{})
		require.NoError(t, err)
	}
	at := 1 + rng.IntN(n/2)
	waitUntil(t, "forwarding under way", func() bool { return countType(t, s, string(examples.OutboxForwarded)) >= at })
	proc.kill9(t)

	proc = startItxd(t, dataDir, "--listen", addr, "--processors", "")
	p = loginItxd(t, proc)
	awaitContract(t, p, "forwarder")
	s = stream(t, p, "/remote/bulk")
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	sub := client.Subscription(ctx, s, "forwarder")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, info.HeadOffset, 25*time.Second)
	require.NoError(t, err)
	require.Equal(t, n, countType(t, s, string(examples.OutboxForwarded)))
}

// offsetSet is a set of offsets a receiver was given, safe for concurrent use.
type offsetSet struct {
	mu   sync.Mutex
	seen map[int64]int
	max  int64
}

func newOffsetSet() *offsetSet { return &offsetSet{seen: map[int64]int{}} }

func (o *offsetSet) add(b itx.DeliveryBatch) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, e := range b.Events {
		o.seen[e.Offset]++
		o.max = max(o.max, e.Offset)
	}
}

func (o *offsetSet) has(off int64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.seen[off] > 0
}

func (o *offsetSet) highest() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.max
}

// Three kill -9s at random points of a load on one stream served at once by a flaky webhook, an
// itx-call receiver, an offset-acking itx-call receiver that confirms in some answers only, a
// copy into a mirror and the forwarder processor, all under way when each kill lands. After the
// last restart: every acknowledged event is in the log; every event of the load reached the
// webhook and both receivers at least once; the mirror and the forwarder hold each exactly once.
func TestCrash_Kill9MixedDeliveriesRounds(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	rng := crashSeed(t)
	const path, typ = "/mixed", string(examples.InboxMessage)
	var reqs sync.Mutex
	n := 0
	h := newHook(t, func(int, itx.WebhookBody) int {
		reqs.Lock()
		defer reqs.Unlock()
		if n++; n%97 == 0 { // an outage now and then: each costs a backoff
			return 503
		}
		return 200
	})
	inbox, acker := newOffsetSet(), newOffsetSet()
	var answers sync.Mutex
	answered := 0
	ackReceive := func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
		acker.add(b)
		answers.Lock()
		defer answers.Unlock()
		if answered++; answered%3 == 0 {
			return 0, nil // this answer confirms nothing: a later one does
		}
		return b.Events[len(b.Events)-1].Offset, nil
	}
	inboxReceive := func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
		inbox.add(b)
		return 0, nil
	}
	dataDir := t.TempDir()
	args := []string{"--processors", "forwarder"}
	acked := map[int64]string{}
	for round := range 4 {
		proc := startItxd(t, dataDir, args...)
		defer mountReceive(t, proc.addr, proc.creds.ProjectToken, "inbox", inboxReceive)()
		defer mountReceive(t, proc.addr, proc.creds.ProjectToken, "acker", ackReceive)()
		ctx := ctxT(t)
		p := loginItxd(t, proc)
		s := stream(t, p, path)
		if round == 0 {
			subs := client.Subscriptions(ctx, s)
			for _, c := range []client.SubscriptionConfig{
				{Name: "hook", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}},
				{Name: "app", MaxDeliveryEvents: 7, Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}},
				{Name: "acks", ConfirmWindow: 16, MaxDeliveryEvents: 5, Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "acker"}},
				{Name: "mirror", Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: path + "-mirror"}},
				{Name: "forwarder", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}},
			} {
				if c.Name != "forwarder" {
					c.FilterTypes = []string{typ}
				}
				_, _, err := client.ConfigureSubscription(ctx, subs, c)
				require.NoError(t, err)
			}
			subs.Release()
		}
		if round == 3 {
			// The last life: no kill. Everything owed is delivered.
			all, err := client.ReadAll(ctx, s, itx.Query{})
			require.NoError(t, err)
			byOffset := map[int64]itx.Event{}
			var load []int64
			for _, e := range all {
				byOffset[e.Offset] = e
				if e.Type == typ {
					load = append(load, e.Offset)
				}
			}
			for off, payload := range acked {
				e, ok := byOffset[off]
				require.True(t, ok, "acknowledged offset %d lost", off)
				require.JSONEq(t, payload, string(e.Payload), "offset %d", off)
			}
			head := all[len(all)-1].Offset
			waitUntil(t, "the acking receiver took everything", func() bool { return acker.highest() >= load[len(load)-1] })
			acks := client.Subscription(ctx, s, "acks")
			// The receiver has the events once its handler runs; itxd counts them delivered once
			// the handler's answer is back, and a confirm that overtakes it is refused
			// (invalidArgument, "not delivered"): confirm once the answer is in.
			last := acker.highest()
			waitUntil(t, "the acking receiver's last answer is in", func() bool {
				d, err := client.DescribeSubscription(ctx, acks)
				return err == nil && d.DeliveredOffset >= last
			})
			_, err = client.ConfirmSubscription(ctx, acks, last)
			require.NoError(t, err)
			acks.Release()
			for _, name := range []string{"hook", "app", "acks", "mirror", "forwarder"} {
				sub := client.Subscription(ctx, s, name)
				_, err := client.WaitUntilProcessed(ctx, sub, head, 20*time.Second)
				require.NoError(t, err, name)
				sub.Release()
			}
			hooked := map[int64]bool{}
			for _, o := range h.received() {
				hooked[o] = true
			}
			for _, off := range load {
				require.True(t, hooked[off], "offset %d never reached the webhook", off)
				require.True(t, inbox.has(off), "offset %d never reached the itx-call receiver", off)
				require.True(t, acker.has(off), "offset %d never reached the offset-acking receiver", off)
			}
			copies, err := client.ReadAll(ctx, stream(t, p, path+"-mirror"), itx.Query{Types: []string{typ}})
			require.NoError(t, err)
			require.Len(t, copies, len(load), "each event copied exactly once")
			for i, c := range copies {
				require.Equal(t, load[i], c.Provenance[0].Offset, "copies in source order")
			}
			require.Equal(t, len(load), countType(t, s, string(examples.OutboxForwarded)), "each event forwarded exactly once")
			t.Logf("%d events of load, %d acknowledged, %d webhook requests", len(load), len(acked), h.count())
			return
		}

		// A load until the kill, at a random point.
		warm := 50 + rng.IntN(250)
		var mu sync.Mutex
		got := 0
		running := make(chan struct{})
		var once sync.Once
		var wg sync.WaitGroup
		for w := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					batch := make([]itx.EventInput, 1+i%5)
					for j := range batch {
						batch[j] = examples.InboxMessage.Input(json.RawMessage(fmt.Sprintf(`{"r":%d,"w":%d,"i":%d,"j":%d}`, round, w, i, j)), "")
					}
					res, err := client.Append(context.Background(), s, batch, itx.AppendOptions{})
					if err != nil {
						return
					}
					mu.Lock()
					for j, off := range res.Offsets {
						acked[off] = string(batch[j].Payload)
					}
					if got += len(batch); got >= warm {
						once.Do(func() { close(running) })
					}
					mu.Unlock()
				}
			}()
		}
		<-running
		proc.kill9(t)
		wg.Wait()
	}
}

// kill -9 at random points of a storm of token creations and revocations: after the restart
// every token the directory holds has its admin/token-created record in /audit, and every one it
// no longer holds that was created has its admin/token-revoked record. The audit trail never
// misses a change that took effect.
func TestCrash_Kill9KeepsTheAuditTrailWhole(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	rng := crashSeed(t)
	dataDir := t.TempDir()
	for round := range 3 {
		proc := startItxd(t, dataDir)
		ctx := ctxT(t)
		root := dial(t, proc.addr).Login(ctx, proc.creds.DeploymentToken)
		admin := client.Admin(ctx, root)
		if round > 0 {
			requireWholeAuditTrail(t, ctx, root, admin, proc.creds.ProjectID)
		}
		kill := 10 + rng.IntN(60)
		var mu sync.Mutex
		ops := 0
		stop := make(chan struct{})
		var once sync.Once
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					_, info, err := client.CreateToken(ctx, admin, proc.creds.ProjectID, client.TokenOptions{Label: fmt.Sprintf("r%d-w%d-%d", round, w, i)})
					if err == nil && i%2 == 0 {
						err = client.RevokeToken(ctx, admin, proc.creds.ProjectID, info.ID)
					}
					if err != nil {
						return
					}
					mu.Lock()
					if ops++; ops >= kill {
						once.Do(func() { close(stop) })
					}
					mu.Unlock()
				}
			}()
		}
		<-stop
		proc.kill9(t)
		wg.Wait()
		admin.Release()
	}
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	root := dial(t, proc.addr).Login(ctx, proc.creds.DeploymentToken)
	admin := client.Admin(ctx, root)
	defer admin.Release()
	requireWholeAuditTrail(t, ctx, root, admin, proc.creds.ProjectID)
}

// requireWholeAuditTrail checks a project's tokens against the deployment's /audit stream.
func requireWholeAuditTrail(t *testing.T, ctx context.Context, root schema.Project, admin schema.Admin, projectID string) {
	t.Helper()
	tokens, err := client.ListTokens(ctx, admin, projectID)
	require.NoError(t, err)
	audit := stream(t, root, server.AuditPath)
	events, err := client.ReadAll(ctx, audit, itx.Query{Types: []string{server.AuditTokenCreated, server.AuditTokenRevoked}})
	require.NoError(t, err)
	created, revoked := map[string]bool{}, map[string]bool{}
	for _, e := range events {
		var p struct{ TokenID string }
		require.NoError(t, json.Unmarshal(e.Payload, &p))
		if e.Type == server.AuditTokenCreated {
			created[p.TokenID] = true
		} else {
			revoked[p.TokenID] = true
		}
	}
	held := map[string]bool{}
	for _, tok := range tokens {
		held[tok.ID] = true
		if tok.ID == "tok_default" {
			continue // the bootstrap's own token, made before /audit
		}
		require.True(t, created[tok.ID], "token %s (%s) is held, but /audit never recorded its creation", tok.ID, tok.Label)
	}
	for id := range created {
		if !held[id] {
			require.True(t, revoked[id], "token %s is gone, but /audit never recorded its revocation", id)
		}
	}
	t.Logf("%d tokens held, %d created and %d revoked in /audit", len(tokens), len(created), len(revoked))
}

// An audit record the /audit stream refuses (its circuit breaker open) is not lost: the change
// stands, and the record lands when itxd starts again.
func TestAudit_RefusedRecordLandsAtTheNextStart(t *testing.T) {
	dir := t.TempDir()
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	cfg := server.Config{DataDir: dir, Clock: clock, BreakerBurst: 1, BreakerRefillPerMinute: 1}
	ts := startServer(t, cfg)
	ctx := ctxT(t)
	root := ts.deployment(t)
	admin := client.Admin(ctx, root)
	var ids []string
	for i := range 2 {
		_, info, err := client.CreateToken(ctx, admin, "default", client.TokenOptions{Label: fmt.Sprintf("t%d", i)})
		require.NoError(t, err, "the change stands whatever happens to its record")
		ids = append(ids, info.ID)
	}
	admin.Release()
	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, ts.srv.Close(closeCtx))

	clock.Advance(time.Minute) // the breaker has a token again
	ts = startServer(t, cfg)
	root = ts.deployment(t)
	events, err := client.ReadAll(ctx, stream(t, root, server.AuditPath), itx.Query{Types: []string{server.AuditTokenCreated}})
	require.NoError(t, err)
	var got []string
	for _, e := range events {
		var p struct{ TokenID string }
		require.NoError(t, json.Unmarshal(e.Payload, &p))
		got = append(got, p.TokenID)
	}
	require.Equal(t, ids, got, "each creation recorded once")
}

// kill -9 at points swept through itxd's very first start, while it writes the credentials file
// and makes the default project and the deployment root: the next start always leaves a data
// directory whose credentials file logs into both. The sweep goes on until three kills in a row
// came after both were made.
func TestCrash_Kill9DuringFirstStart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	cut, after := 0, 0
	for round := 0; after < 3; round++ {
		require.Less(t, round, 200, "no kill came after the first start's projects")
		dataDir := t.TempDir()
		addrFile := filepath.Join(t.TempDir(), "addr")
		cmd := exec.Command(itxdBin, "--listen", "127.0.0.1:0", "--data", dataDir, "--addr-file", addrFile, "--log-level", "warn", "--processors", "")
		require.NoError(t, cmd.Start())
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		// The credentials file is the first thing the first start writes: kill a little later
		// each round.
		creds := filepath.Join(dataDir, server.CredentialsFile)
		for {
			if _, err := os.Stat(creds); err == nil {
				break
			}
			select {
			case <-exited:
				t.Fatal("itxd exited before writing its credentials")
			default:
			}
		}
		for range round * 50 {
			_, _ = os.Stat(addrFile) // a pause, in system calls
		}
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		<-exited
		d, err := storage.OpenDirectory(context.Background(), filepath.Join(dataDir, "directory.db"))
		require.NoError(t, err)
		ps, err := d.Projects(context.Background())
		require.NoError(t, err)
		require.NoError(t, d.Close())
		switch len(ps) {
		case 2:
			after++
		case 1:
			cut++
		default:
			after = 0
		}

		proc := startItxd(t, dataDir, "--processors", "")
		ctx := ctxT(t)
		conn := dial(t, proc.addr)
		for _, tok := range []string{proc.creds.ProjectToken, proc.creds.DeploymentToken} {
			p := conn.Login(ctx, tok)
			_, err := client.DescribeProject(ctx, p)
			require.NoError(t, err, "round %d (%d projects made at the kill): the credentials file's token logs in", round, len(ps))
			p.Release()
		}
		proc.kill9(t)
		conn.Close()
	}
	t.Logf("%d kills between the two projects", cut)
}

// An operator's rewind of a remote processor (setSubscriptionCursor), answered just before a
// kill -9 of itxd, is honored after the restart: the host, reconnected on its own, processes
// every event after the new cursor again.
func TestRemote_Kill9KeepsAnAnsweredRewind(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	ty := &tally{ran: map[int64]int{}}
	dataDir, addr := t.TempDir(), freeAddr(t)
	proc := startItxd(t, dataDir, "--listen", addr, "--processors", "")
	ctx := ctxT(t)
	p := loginItxd(t, proc)
	mounted := runRemoteHost(t, addr, proc.creds.ProjectToken, "tallies", ty.host(t))
	awaitMount(t, mounted)
	s := stream(t, p, "/remote/rewind")
	configureRemote(t, s, "tally")
	var offsets []int64
	for range 10 {
		offsets = append(offsets, mustAppend(t, s, ev("tally/x", `{}`)).Offsets...)
	}
	sub := client.Subscription(ctx, s, "tally")
	_, err := client.WaitUntilProcessed(ctx, sub, offsets[len(offsets)-1], 0)
	require.NoError(t, err)
	sub.Release()
	rewind, err := client.SetSubscriptionCursor(ctx, s, "tally", offsets[3])
	require.NoError(t, err)
	proc.kill9(t)

	proc = startItxd(t, dataDir, "--listen", addr, "--processors", "")
	p = loginItxd(t, proc)
	awaitMount(t, mounted)
	s = stream(t, p, "/remote/rewind")
	sub = client.Subscription(ctx, s, "tally")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, rewind, 20*time.Second)
	require.NoError(t, err)
	for i, o := range offsets {
		if i <= 3 {
			require.Equal(t, 1, ty.count(o), "offset %d, at or before the new cursor: processed once", o)
		} else {
			require.GreaterOrEqual(t, ty.count(o), 2, "offset %d, after the new cursor: processed again", o)
		}
	}
}

// countingVendor is an LLM endpoint that answers at once and counts its calls by request.
type countingVendor struct {
	mu    sync.Mutex
	calls map[string]int
	total int
	log   []string // each call: request, caller's address, time
}

func newCountingVendor(t *testing.T) (*countingVendor, string) {
	v := &countingVendor{calls: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			RequestID string `json:"requestId"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		v.mu.Lock()
		v.calls[req.RequestID]++
		v.total++
		v.log = append(v.log, fmt.Sprintf("%s from %s at %s", req.RequestID, r.RemoteAddr, time.Now().Format("15:04:05.000000")))
		v.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]string{"text": "ok"})
	}))
	t.Cleanup(srv.Close)
	return v, srv.URL
}

func (v *countingVendor) called() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.total
}

// Two kill -9s at random points while the agent works through a stream of messages: after the
// last restart every message's request is settled exactly once, and the vendor was dialed at
// most once per request (its started fact is durable before the call; a revival settles a
// started request it does not drive as orphaned instead of dialing again).
func TestCrash_Kill9AgentDialsEachRequestAtMostOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	rng := crashSeed(t)
	vendor, url := newCountingVendor(t)
	dataDir := t.TempDir()
	args := []string{"--processors", "agent", "--agent-vendor-url", url, "--agent-hesitation", "0s"}
	const path = "/agent-crash"
	var messages []int64
	for round := range 3 {
		proc := startItxd(t, dataDir, args...)
		ctx := ctxT(t)
		s := stream(t, loginItxd(t, proc), path)
		if round == 0 {
			configureProcessor(t, s, "agent")
		}
		if round == 2 {
			waitUntil(t, "every request settled", func() bool {
				return countType(t, s, string(examples.LLMSettled)) >= countType(t, s, string(examples.MessageAdded))
			})
			head := mustAppend(t, s, ev("agent/marker", `{}`)).HeadOffset
			sub := client.Subscription(ctx, s, "agent")
			_, err := client.WaitUntilProcessed(ctx, sub, head, 20*time.Second)
			require.NoError(t, err)
			sub.Release()
			settled, err := client.ReadAll(ctx, s, itx.Query{Types: []string{string(examples.LLMSettled)}})
			require.NoError(t, err)
			byRequest := map[string]int{}
			for _, e := range settled {
				var st examples.LLMSettlement
				require.NoError(t, json.Unmarshal(e.Payload, &st))
				byRequest[st.RequestID]++
			}
			// Every message in the log (the acknowledged ones, and those a kill cut off from
			// their acknowledgement) has its request settled once.
			logged, err := client.ReadAll(ctx, s, itx.Query{Types: []string{string(examples.MessageAdded)}})
			require.NoError(t, err)
			inLog := map[int64]bool{}
			for _, m := range logged {
				inLog[m.Offset] = true
				id := fmt.Sprintf("msg-%d", m.Offset)
				require.Equal(t, 1, byRequest[id], "%s settled once", id)
			}
			for _, m := range messages {
				require.True(t, inLog[m], "acknowledged message %d lost", m)
			}
			require.Len(t, byRequest, len(logged))
			vendor.mu.Lock()
			defer vendor.mu.Unlock()
			for id, n := range vendor.calls {
				if n > 1 {
					// What the stream says of the request, and when each call came, for the report.
					for _, l := range vendor.log {
						if strings.HasPrefix(l, id+" ") {
							t.Logf("vendor call: %s", l)
						}
					}
					all, err := client.ReadAll(ctx, s, itx.Query{})
					require.NoError(t, err)
					for _, e := range all {
						if strings.Contains(string(e.Payload), `"`+id+`"`) || strings.HasPrefix(e.Type, "stream/") {
							t.Logf("%d %s %s", e.Offset, e.Type, e.Payload)
						}
					}
				}
				require.LessOrEqual(t, n, 1, "the vendor was dialed %d times for %s", n, id)
			}
			t.Logf("%d messages (%d acknowledged), %d vendor calls", len(logged), len(messages), vendor.total)
			return
		}
		kill := vendor.called() + 2 + rng.IntN(10)
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := 0; ; i++ {
				res, err := client.Append(context.Background(), s, []itx.EventInput{examples.MessageAdded.Input(examples.Message{Text: fmt.Sprintf("r%d-%d", round, i)}, "")}, itx.AppendOptions{})
				if err != nil {
					return
				}
				messages = append(messages, res.Offsets[0])
				select {
				case <-stop:
					return
				default:
				}
			}
		}()
		waitUntil(t, "the agent at work", func() bool { return vendor.called() >= kill })
		proc.kill9(t)
		t.Logf("round %d: killed at %s", round, time.Now().Format("15:04:05.000000"))
		close(stop)
		<-done
	}
}
