package test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Scheduling a key already in the log answers as an append of that key would: the same body
// names its offset, another body is an idempotencyConflict naming the offset, and nothing is
// scheduled either way.
func TestScheduled_KeyInTheLogWithAnotherBodyIsAConflict(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	ts := startServer(t, server.Config{Clock: clock})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/timers-conflict")
	first := mustAppend(t, s, keyed("reminder", `{"n":1}`, "remind-1"))

	_, appended, err := client.Schedule(ctx, s, keyed("reminder", `{"n":1}`, "remind-1"), clock.Now().Add(time.Minute))
	require.NoError(t, err)
	require.Equal(t, first.Offsets[0], appended, "the same body: its offset")

	_, _, err = client.Schedule(ctx, s, keyed("reminder", `{"n":2}`, "remind-1"), clock.Now().Add(time.Minute))
	requireCode(t, err, itx.EIdempotencyConflict)
	require.Contains(t, itx.ErrorMessage(err), "offset 1")
	_, _, err = client.Schedule(ctx, s, keyed("other", `{"n":1}`, "remind-1"), clock.Now().Add(time.Minute))
	requireCode(t, err, itx.EIdempotencyConflict)

	list, err := client.ListScheduled(ctx, s)
	require.NoError(t, err)
	require.Empty(t, list, "nothing scheduled")
}

// A raw append of a subscription control event is canonicalized as the verb's event is: the log
// records the name the subscription has, not the caller's spacing, so a reader of the log (a
// receiver of the birth event, an export) finds the subscription by the name it reads. A retry
// under the same idempotency key, spaced the same, is a duplicate.
func TestSubscription_RawControlEventRecordsTheTrimmedName(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/raw-names")
	mustAppend(t, s, ev("a", `{}`))

	configure := keyed(itx.TypeSubscriptionConfigured,
		`{"name":"  raw ","receiver":{"action":"copy-to-stream","receivingStreamPath":"/raw-names-copy"},"description":"kept"}`, "cfg-1")
	first := mustAppend(t, s, configure)
	retry := mustAppend(t, s, configure)
	require.Equal(t, first.Offsets, retry.Offsets)
	require.Equal(t, []bool{true}, retry.Duplicate)
	mustAppend(t, s, ev(itx.TypeSubscriptionCursorSet, `{"name":"\traw","afterOffset":1}`))
	mustAppend(t, s, ev(itx.TypeSubscriptionRemoved, `{"name":"raw ","reason":"requested"}`))

	all, err := client.ReadAll(ctx, s, itx.Query{Types: []string{
		itx.TypeSubscriptionConfigured, itx.TypeSubscriptionCursorSet, itx.TypeSubscriptionRemoved}})
	require.NoError(t, err)
	require.Len(t, all, 3)
	for _, e := range all {
		var p struct {
			Name string `json:"name"`
		}
		require.NoError(t, json.Unmarshal(e.Payload, &p))
		require.Equal(t, "raw", p.Name, "%s: %s", e.Type, e.Payload)
	}
	require.JSONEq(t, `{"name":"raw","receiver":{"action":"copy-to-stream","receivingStreamPath":"/raw-names-copy"},"description":"kept"}`,
		string(all[0].Payload), "only the name is rewritten")
}

// kill -9 of itxd after a copy committed in the receiving stream and before the source learned
// it: the copy is delivered again under the same keys, and its transform (here reading
// $random(), as one reading $now() or $millis() would) makes another body. The receiving stream
// takes it as the copy it already holds, as it would an unchanged one: the key names the copy's
// source coordinates (subscription, epoch, source stream and offset), so one is the same copy
// whatever its body. Refusing it as an idempotencyConflict left the subscription retrying, then
// halted, over a copy that had landed.
func TestCrash_CopyRedeliveredWithAnotherBodyIsTheSameCopy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxdKilledAt(t, dataDir, "copy-committed")
	ctx := ctxT(t)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	src := client.Stream(ctx, p, "/src")
	subs := client.Subscriptions(ctx, src)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "mirror",
		Start: "now", FilterTypes: []string{"e"}, Transform: `{"type": type, "payload": {"n": payload.n, "r": $random()}}`,
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/dst"}})
	require.NoError(t, err)
	subs.Release()
	res, err := client.Append(ctx, src, []itx.EventInput{ev("e", `{"n":1}`)}, itx.AppendOptions{})
	require.NoError(t, err)
	proc.requireKilledAtThePoint(t)

	proc = startItxd(t, dataDir)
	p2 := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	defer p2.Release()
	src2, dst := stream(t, p2, "/src"), stream(t, p2, "/dst")
	copies, err := client.ReadAll(ctx, dst, itx.Query{Types: []string{"e"}})
	require.NoError(t, err)
	require.Len(t, copies, 1, "the copy landed before the kill")
	sub := client.Subscription(ctx, src2, "mirror")
	defer sub.Release()
	_, waitErr := client.WaitUntilProcessed(ctx, sub, res.HeadOffset, 10*time.Second)
	d, err := client.DescribeSubscription(ctx, sub)
	require.NoError(t, err)
	require.NoError(t, waitErr, "the redelivered copy is acknowledged (last error: %s)", d.LastError)
	require.Empty(t, d.LastError)
	again, err := client.ReadAll(ctx, dst, itx.Query{Types: []string{"e"}})
	require.NoError(t, err)
	require.Equal(t, copies, again, "copied once, kept as first written")
}

// cancelScheduled names a schedule by its key as schedule does: trimmed, as every idempotency
// key is, so the key a schedule was given (spacing and all) cancels it.
func TestScheduled_CancelTrimsTheKeyAsScheduleDoes(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	ts := startServer(t, server.Config{Clock: clock})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/timers-trim")
	mustAppend(t, s, ev("a", `{}`))
	_, _, err := client.Schedule(ctx, s, keyed("reminder", `{}`, " remind-1 "), clock.Now().Add(time.Hour))
	require.NoError(t, err)
	list, err := client.ListScheduled(ctx, s)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "remind-1", list[0].Event.IdempotencyKey)

	found, err := client.CancelScheduled(ctx, s, " remind-1 ")
	require.NoError(t, err)
	require.True(t, found, "the key as given to schedule cancels it")
	list, err = client.ListScheduled(ctx, s)
	require.NoError(t, err)
	require.Empty(t, list)
	_, err = client.CancelScheduled(ctx, s, "   ")
	requireCode(t, err, itx.EInvalid)
}

// kill -9 of itxd after a dead letter committed and before the skip it allows was taken: the
// failing event is tried again after the restart, fails with another error, and its letter is
// built again with that error. The dead-letter stream takes it as the letter it holds (the key
// names the subscription's epochs and the offset): the event is skipped once, with one letter,
// as the first written. Refused as an idempotencyConflict, the letter could never land again
// and the skip waited on the ladder.
func TestCrash_DeadLetterWrittenAgainWithAnotherErrorIsTheSameLetter(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	// Every answer is another 4xx (an event-specific failure with another message).
	h := newHook(t, func(n int, _ itx.WebhookBody) int { return 400 + n%30 })
	dataDir := t.TempDir()
	proc := startItxdKilledAt(t, dataDir, "dead-letter-committed")
	ctx := ctxT(t)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	src := client.Stream(ctx, p, "/orders")
	subs := client.Subscriptions(ctx, src)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "mailer", Start: "now",
		OnFailingEvent: "skip", FilterTypes: []string{"e"}, DeadLetterPath: "/orders-dead",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	require.NoError(t, err)
	subs.Release()
	res, err := client.Append(ctx, src, []itx.EventInput{ev("e", `{"n":1}`)}, itx.AppendOptions{})
	require.NoError(t, err)
	proc.requireKilledAtThePoint(t)
	tries := h.count()

	proc = startItxd(t, dataDir)
	p2 := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	defer p2.Release()
	src2, dead := stream(t, p2, "/orders"), stream(t, p2, "/orders-dead")
	letters, err := client.ReadAll(ctx, dead, itx.Query{Types: []string{itx.TypeDeadLetter}})
	require.NoError(t, err)
	require.Len(t, letters, 1, "the letter landed before the kill")
	sub := client.Subscription(ctx, src2, "mailer")
	defer sub.Release()
	_, waitErr := client.WaitUntilProcessed(ctx, sub, res.HeadOffset, 20*time.Second)
	d, err := client.DescribeSubscription(ctx, sub)
	require.NoError(t, err)
	require.NoError(t, waitErr, "the event is skipped (last error: %s)", d.LastError)
	require.Greater(t, h.count(), tries, "tried again after the restart, with another error")
	again, err := client.ReadAll(ctx, dead, itx.Query{Types: []string{itx.TypeDeadLetter}})
	require.NoError(t, err)
	require.Equal(t, letters, again, "one letter, as first written")
}

// A filter condition that fails with another message at each try (here $error over $random();
// one reading $now() or timing out on one try and not the next does the same) climbs the ladder
// and is skipped like any failing event. The evidence of an expression failure is written once
// per failing event, keyed by it: the retry's record, with its other message, is that same
// evidence. Refused as an idempotencyConflict, the server's record failed the whole step (and
// the appends committing with it): the try never counted, and the event was retried forever.
func TestSubscription_ExpressionFailingWithAnotherMessageEachTryIsSkipped(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := newHook(t, nil)
	s := stream(t, e.p, "/flaky-filter")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "mailer", Start: "now", OnFailingEvent: "skip",
		FilterTypes: []string{"e"}, FilterCondition: `$error("boom " & $string($random()))`,
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	res := mustAppend(t, s, ev("e", `{}`))
	e.refuseUntilSkipped(t, "/flaky-filter", name, res.HeadOffset)

	records, err := client.ReadAll(e.ctx, s, itx.Query{Types: []string{itx.TypeErrorOccurred}})
	require.NoError(t, err)
	var failed, skipped int
	for _, r := range records {
		switch p := string(r.Payload); {
		case strings.Contains(p, "skipped failing event"):
			skipped++
		case strings.Contains(p, "filter condition failed"):
			failed++
		}
	}
	require.Equal(t, 1, failed, "the expression's failure recorded once: %v", records)
	require.Equal(t, 1, skipped, "then the skip: %v", records)
	require.Zero(t, h.count(), "nothing delivered: the filter never held")
}

// A copy delivered again after its acknowledgement was lost, into a receiving stream that
// trimmed the first copy meanwhile (and its idempotency key with it): still the copy already
// taken, not a second one. itxd is killed after the copies committed and before the source
// learned it; the next itxd trims them from the receiving stream while its circuit breaker holds
// the redelivery back; the one after that delivers again, and the receiving stream's inbound
// fence (the highest source offset it took under the subscription's stamp) answers the batch as
// duplicates. Without it every event was copied a second time.
func TestCrash_CopyRedeliveredAfterTheTargetTrimmedItIsNotCopiedAgain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxdKilledAt(t, dataDir, "copy-committed")
	ctx := ctxT(t)
	p := loginItxd(t, proc)
	src := stream(t, p, "/src")
	subs := client.Subscriptions(ctx, src)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "mirror", Start: "now", FilterTypes: []string{"e"},
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/dst"}})
	require.NoError(t, err)
	subs.Release()
	batch := make([]itx.EventInput, 50)
	for i := range batch {
		batch[i] = ev("e", fmt.Sprintf(`{"i":%d}`, i))
	}
	res, err := client.Append(ctx, src, batch, itx.AppendOptions{})
	require.NoError(t, err)
	proc.requireKilledAtThePoint(t)

	// The copies are in /dst; the source's cursor is before them. A breaker of one event holds
	// the redelivery back while /dst is trimmed.
	proc = startItxd(t, dataDir, "--breaker-burst", "1", "--breaker-refill-per-minute", "1")
	p = loginItxd(t, proc)
	dst := stream(t, p, "/dst")
	trimmed, err := client.Trim(ctx, dst, 50)
	require.NoError(t, err)
	require.Equal(t, int64(50), trimmed.Deleted, "the copies, trimmed")
	info, err := client.Describe(ctx, dst)
	require.NoError(t, err)
	head := info.HeadOffset
	proc.kill9(t)

	proc = startItxd(t, dataDir)
	p = loginItxd(t, proc)
	src, dst = stream(t, p, "/src"), stream(t, p, "/dst")
	sub := client.Subscription(ctx, src, "mirror")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, res.HeadOffset, 10*time.Second)
	require.NoError(t, err, "last error: %s", describeSub(t, src, "mirror").LastError)
	info, err = client.Describe(ctx, dst)
	require.NoError(t, err)
	require.Equal(t, head, info.HeadOffset, "nothing copied a second time")
	again, err := client.ReadAll(ctx, dst, itx.Query{Types: []string{"e"}})
	require.NoError(t, err)
	require.Empty(t, again)
}

// kill -9 after a dead letter committed and before the skip it allows was taken, and the
// dead-letter stream trimmed (its letter's key with it) before the event is tried again: the
// letter written again is the letter the stream took, not a second one. The dead-letter stream's
// inbound fence keeps the highest offset it took letters for from the subscription (as for
// copies); without it the event had two letters. The same for an offset-acking subscription,
// whose letters the fence knows by their offsets and its confirmed cursor (its letters were not
// fenced at all: the event had two letters).
func TestCrash_DeadLetterWrittenAgainAfterATrimIsTheSameLetter(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	t.Run("acknowledged by the answer", func(t *testing.T) { deadLetterWrittenAgainAfterATrim(t, 0) })
	t.Run("offset-acking", func(t *testing.T) { deadLetterWrittenAgainAfterATrim(t, 10) })
}

func deadLetterWrittenAgainAfterATrim(t *testing.T, confirmWindow int) {
	var hold atomic.Bool
	held := make(chan struct{})
	h := newHook(t, func(int, itx.WebhookBody) int {
		if hold.Load() {
			<-held // in flight while itxd is trimmed and killed: no verdict on the event
		}
		return 422
	})
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(held) }) }) // before the hook's server closes
	dataDir := t.TempDir()
	proc := startItxdKilledAt(t, dataDir, "dead-letter-committed")
	ctx := ctxT(t)
	p := loginItxd(t, proc)
	src := stream(t, p, "/orders")
	subs := client.Subscriptions(ctx, src)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "mailer", Start: "now",
		OnFailingEvent: "skip", FilterTypes: []string{"e"}, DeadLetterPath: "/orders-dead", ConfirmWindow: confirmWindow,
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	require.NoError(t, err)
	subs.Release()
	res, err := client.Append(ctx, src, []itx.EventInput{ev("e", `{"n":1}`)}, itx.AppendOptions{})
	require.NoError(t, err)
	proc.requireKilledAtThePoint(t)

	// The receiver holds the try (no verdict on the event) while the letter is trimmed.
	hold.Store(true)
	proc = startItxd(t, dataDir)
	p = loginItxd(t, proc)
	dead := stream(t, p, "/orders-dead")
	trimmed, err := client.Trim(ctx, dead, 1)
	require.NoError(t, err)
	require.Equal(t, int64(1), trimmed.Deleted, "the letter, trimmed")
	proc.kill9(t)

	hold.Store(false)
	release.Do(func() { close(held) }) // the killed itxd's try is answered to nobody
	proc = startItxd(t, dataDir)
	p = loginItxd(t, proc)
	src, dead = stream(t, p, "/orders"), stream(t, p, "/orders-dead")
	sub := client.Subscription(ctx, src, "mailer")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, res.HeadOffset, 20*time.Second)
	require.NoError(t, err, "the event is skipped (last error: %s)", describeSub(t, src, "mailer").LastError)
	info, err := client.Describe(ctx, dead)
	require.NoError(t, err)
	require.Equal(t, int64(1), info.HeadOffset, "no second letter")
}
