package test

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/schema"
	"github.com/stretchr/testify/require"
)

// loginItxd logs into the default project of a real itxd process.
func loginItxd(t *testing.T, proc *itxdProcess) schema.Project {
	t.Helper()
	p := dial(t, proc.addr).Login(ctxT(t), proc.creds.ProjectToken)
	t.Cleanup(p.Release)
	return p
}

// kill -9 when the last offsets issued were ephemeral: after the restart the head (listed and
// described) still counts them, range reads skip them, and the next append takes the next offset:
// an offset is never reissued.
func TestCrash_Kill9AfterEphemeralTail(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	s := stream(t, loginItxd(t, proc), "/eph")
	mustAppend(t, s, ev("d", `{}`), ev("d", `{}`))
	e1 := ev("e", `{"n":1}`)
	e1.Ephemeral = true
	e2 := ev("e", `{"n":2}`)
	e2.Ephemeral = true
	res := mustAppend(t, s, e1, e2)
	require.Equal(t, int64(4), res.HeadOffset)
	proc.kill9(t)

	proc = startItxd(t, dataDir)
	p := loginItxd(t, proc)
	listed, err := client.ListStreams(ctx, p, "/eph")
	require.NoError(t, err)
	require.Len(t, listed, 1)
	require.Equal(t, int64(4), listed[0].HeadOffset)
	s = stream(t, p, "/eph")
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.Equal(t, int64(4), info.HeadOffset)
	all, err := client.ReadAll(ctx, s, itx.Query{})
	require.NoError(t, err)
	require.Len(t, all, 2)
	res = mustAppend(t, s, ev("d", `{}`))
	require.Equal(t, int64(5), res.HeadOffset, "an ephemeral offset is never reissued")
}

// An append retried with its idempotency key after a kill -9 returns the original offset with
// duplicate: true; another body under the key is a conflict that writes nothing.
func TestCrash_Kill9KeepsIdempotencyKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	s := stream(t, loginItxd(t, proc), "/idem")
	mustAppend(t, s, ev("x", `{}`))
	first := mustAppend(t, s, keyed("k", `{"a":1}`, "key-1"), ev("x", `{}`))
	proc.kill9(t)

	proc = startItxd(t, dataDir)
	s = stream(t, loginItxd(t, proc), "/idem")
	again := mustAppend(t, s, keyed("k", `{"a":1}`, "key-1"))
	require.Equal(t, first.Offsets[0], again.Offsets[0])
	require.True(t, again.Duplicate[0])
	_, err := client.Append(ctx, s, []itx.EventInput{keyed("k", `{"a":2}`, "key-1")}, itx.AppendOptions{})
	requireCode(t, err, itx.EIdempotencyConflict)
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.Equal(t, int64(3), info.HeadOffset)
}

// A halted subscription stays halted across a kill -9, with its error, attempts and cursor, and
// the listing counts it; nothing halts it a second time.
func TestCrash_Kill9KeepsAHalt(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	s := stream(t, loginItxd(t, proc), "/halt")
	mustAppend(t, s, ev("x", `{}`))
	subs := client.Subscriptions(ctx, s)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "nope",
		Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}})
	require.NoError(t, err)
	sub := client.Subscription(ctx, s, "nope")
	var before itx.SubscriptionDescription
	waitUntil(t, "halted", func() bool {
		before, err = client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		return before.Status == "halted"
	})
	proc.kill9(t)

	proc = startItxd(t, dataDir)
	p := loginItxd(t, proc)
	listed, err := client.ListStreams(ctx, p, "/halt")
	require.NoError(t, err)
	require.Equal(t, 1, listed[0].HaltedSubscriptions)
	s = stream(t, p, "/halt")
	sub = client.Subscription(ctx, s, "nope")
	after, err := client.DescribeSubscription(ctx, sub)
	require.NoError(t, err)
	require.Equal(t, "halted", after.Status)
	require.Equal(t, before.LastError, after.LastError)
	require.Equal(t, before.Attempt, after.Attempt)
	require.Equal(t, before.ConfirmedOffset, after.ConfirmedOffset)
	require.Equal(t, 1, countType(t, s, itx.TypeSubscriptionHalted))
}

// The forwarder killed with kill -9 mid-bulk: after the restart every message is forwarded
// exactly once (its stable-keyed appends dedupe the redelivered frame) and the snapshot counts them.
func TestCrash_Kill9ForwarderForwardsOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	args := []string{"--processors", "forwarder"}
	proc := startItxd(t, dataDir, args...)
	ctx := ctxT(t)
	s := stream(t, loginItxd(t, proc), "/fwd")
	configureProcessor(t, s, "forwarder")
	const n = 300
	for i := 0; i < n; i += 50 {
		batch := make([]itx.EventInput, 50)
		for j := range batch {
			batch[j] = examples.InboxMessage.Input(json.RawMessage(fmt.Sprintf(`{"n":%d}`, i+j)), "")
		}
		_, err := client.Append(ctx, s, batch, itx.AppendOptions{})
		require.NoError(t, err)
	}
	waitUntil(t, "forwarding under way", func() bool { return countType(t, s, string(examples.OutboxForwarded)) >= 20 })
	proc.kill9(t)

	proc = startItxd(t, dataDir, args...)
	s = stream(t, loginItxd(t, proc), "/fwd")
	sub, pr := processorOf(t, s, "forwarder")
	waitUntil(t, "all forwarded", func() bool { return countType(t, s, string(examples.OutboxForwarded)) >= n })
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	_, err = client.WaitUntilProcessed(ctx, sub, info.HeadOffset, 20*time.Second)
	require.NoError(t, err)
	require.Equal(t, n, countType(t, s, string(examples.OutboxForwarded)))
	snap, err := client.Snapshot(ctx, pr)
	require.NoError(t, err)
	require.JSONEq(t, fmt.Sprintf(`{"forwarded":%d}`, n), snap.State)
}

// A copy cycle /a -> /b -> /a killed with kill -9 mid-way: after the restart each stream holds
// each event once (redelivered copies dedupe, copies already on their path are dropped) and the
// cycle ends.
func TestCrash_Kill9CopyCycle(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	p := loginItxd(t, proc)
	a, b := stream(t, p, "/a"), stream(t, p, "/b")
	copyCycle(t, a, b)
	const n = 200
	for i := 0; i < n; i += 50 {
		batch := make([]itx.EventInput, 50)
		for j := range batch {
			batch[j] = ev("e", fmt.Sprintf(`{"i":%d}`, i+j))
		}
		_, err := client.Append(ctx, a, batch, itx.AppendOptions{})
		require.NoError(t, err)
	}
	waitUntil(t, "copying under way", func() bool { return countType(t, b, "e") >= 10 })
	proc.kill9(t)

	proc = startItxd(t, dataDir)
	p = loginItxd(t, proc)
	a, b = stream(t, p, "/a"), stream(t, p, "/b")
	waitUntil(t, "all copied", func() bool { return countType(t, b, "e") >= n })
	waitCopyCycle(t, a, b)
	require.Equal(t, n, countType(t, a, "e"))
	require.Equal(t, n, countType(t, b, "e"))
}

// copyCycle configures /a -> /b ("to/b") and /b -> /a ("to/a"), copies of the "e" events: a
// cycle, which provenance ends.
func copyCycle(t *testing.T, a, b schema.Stream) {
	t.Helper()
	ctx := ctxT(t)
	for _, x := range []struct {
		s    schema.Stream
		path string
	}{{a, "/b"}, {b, "/a"}} {
		subs := client.Subscriptions(ctx, x.s)
		_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "to" + x.path, FilterTypes: []string{"e"},
			Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: x.path}})
		require.NoError(t, err)
		subs.Release()
	}
}

// waitCopyCycle waits until both copies of copyCycle have delivered through their streams' heads
// (/a's again after /b's, whose copies into /a it then holds).
func waitCopyCycle(t *testing.T, a, b schema.Stream) {
	t.Helper()
	ctx := ctxT(t)
	for _, x := range []struct {
		s    schema.Stream
		name string
	}{{a, "to/b"}, {b, "to/a"}, {a, "to/b"}} {
		info, err := client.Describe(ctx, x.s)
		require.NoError(t, err)
		sub := client.Subscription(ctx, x.s, x.name)
		_, err = client.WaitUntilProcessed(ctx, sub, info.HeadOffset, 20*time.Second)
		require.NoError(t, err)
		sub.Release()
	}
}

// The guestbook killed with kill -9 under appends mixed with ephemeral events: after the restart
// its snapshot is Reduce folded over the durable log, reduced and processed through one offset.
func TestCrash_Kill9GuestbookSnapshotIsTheFold(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	args := []string{"--processors", "guestbook"}
	proc := startItxd(t, dataDir, args...)
	ctx := ctxT(t)
	s := stream(t, loginItxd(t, proc), "/gb")
	configureProcessor(t, s, "guestbook")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			noise := ev("noise", `{}`)
			noise.Ephemeral = true
			batch := []itx.EventInput{examples.GuestbookSigned.Input(examples.Signed{Name: fmt.Sprintf("g%d", i%7), Message: "hi"}, ""), noise}
			if _, err := client.Append(ctx, s, batch, itx.AppendOptions{}); err != nil {
				return
			}
		}
	}()
	waitUntil(t, "processing under way", func() bool { return countType(t, s, string(examples.GuestbookSigned)) >= 200 })
	proc.kill9(t)
	<-done

	proc = startItxd(t, dataDir, args...)
	s = stream(t, loginItxd(t, proc), "/gb")
	sub, pr := processorOf(t, s, "guestbook")
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	_, err = client.WaitUntilProcessed(ctx, sub, info.HeadOffset, 20*time.Second)
	require.NoError(t, err)
	snap, err := client.Snapshot(ctx, pr)
	require.NoError(t, err)
	require.JSONEq(t, guestbookFold(t, s), snap.State)
	require.GreaterOrEqual(t, snap.ProcessedOffset, info.HeadOffset)
	require.Equal(t, snap.ReducedOffset, snap.ProcessedOffset)
}

// kill -9 while streams with webhook subscriptions load and unload (a short idle timeout, few
// loaded streams) under appends: after the restart the listed heads are true, every event reaches
// the webhook at least once, and every lag returns to zero.
func TestCrash_Kill9DuringUnloadChurn(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	h := newHook(t, nil)
	args := []string{"--idle-timeout", "80ms", "--max-loaded-streams", "4"}
	proc := startItxd(t, dataDir, args...)
	ctx := ctxT(t)
	p := loginItxd(t, proc)
	const n = 12
	for i := 0; i < n; i++ {
		s := client.Stream(ctx, p, fmt.Sprintf("/u/%02d", i))
		subs := client.Subscriptions(ctx, s)
		_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "hook", FilterTypes: []string{"e"},
			Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
		require.NoError(t, err)
		subs.Release()
		s.Release()
	}
	var mu sync.Mutex
	acked := map[string]int64{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			path := fmt.Sprintf("/u/%02d", (i*7)%n)
			s := client.Stream(ctx, p, path)
			res, err := client.Append(ctx, s, []itx.EventInput{ev("e", fmt.Sprintf(`{"i":%d}`, i))}, itx.AppendOptions{})
			s.Release()
			if err != nil {
				return
			}
			mu.Lock()
			acked[path] = res.HeadOffset
			mu.Unlock()
		}
	}()
	waitUntil(t, "deliveries under way", func() bool { return h.count() >= 150 })
	proc.kill9(t)
	<-done

	proc = startItxd(t, dataDir, args...)
	p = loginItxd(t, proc)
	listed, err := client.ListStreams(ctx, p, "/u")
	require.NoError(t, err)
	require.Len(t, listed, n)
	for _, info := range listed {
		require.GreaterOrEqual(t, info.HeadOffset, acked[info.Path], info.Path)
		require.LessOrEqual(t, info.HeadOffset, acked[info.Path]+1, info.Path)
	}
	want := 0
	for _, info := range listed {
		want += int(info.HeadOffset) - 1
	}
	waitUntil(t, "every event delivered", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		seen := map[[2]any]bool{}
		for _, b := range h.bodies {
			seen[[2]any{b.Path, b.Event.Offset}] = true
		}
		return len(seen) >= want
	})
	waitUntil(t, "lags zero", func() bool {
		listed, err := client.ListStreams(ctx, p, "/u")
		require.NoError(t, err)
		for _, info := range listed {
			if info.MaxLag != 0 {
				return false
			}
		}
		return true
	})
}

// kill -9 during a storm of configures, reconfigures, cursor-sets, removes, resumes and appends:
// after the restart the catalog is what the log's control events say, and every subscription
// catches up.
func TestCrash_Kill9DuringControlEvents(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	var healthy atomic.Bool
	h := newHook(t, func(n int, b itx.WebhookBody) int {
		if n%3 == 0 && !healthy.Load() {
			return 503
		}
		return 200
	})
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	p := loginItxd(t, proc)
	s := client.Stream(ctx, p, "/ctl")
	mustAppend(t, s, ev("e", `{}`))
	done := make(chan struct{})
	var ops int
	go func() {
		defer close(done)
		subs := client.Subscriptions(ctx, s)
		for i := 0; ; i++ {
			name := fmt.Sprintf("s%d", i%4)
			var err error
			switch i % 6 {
			case 0, 3:
				_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: name,
					Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: fmt.Sprintf("%s?v=%d", h.url(), i%5)}})
			case 1:
				_, err = client.SetSubscriptionCursor(ctx, s, name, 1)
			case 2:
				_, err = client.RemoveSubscription(ctx, subs, name)
			case 4:
				_, err = client.Append(ctx, s, []itx.EventInput{ev("e", `{}`)}, itx.AppendOptions{})
			case 5:
				_, err = client.ResumeSubscription(ctx, s, name)
			}
			if err != nil && (capnp.IsDisconnected(err) || ctx.Err() != nil) {
				return
			}
			ops = i
		}
	}()
	waitUntil(t, "storm under way", func() bool { return h.count() >= 100 })
	proc.kill9(t)
	<-done
	healthy.Store(true)
	t.Logf("%d ops", ops)

	proc = startItxd(t, dataDir)
	p = loginItxd(t, proc)
	s = stream(t, p, "/ctl")
	events, err := client.ReadAll(ctx, s, itx.Query{})
	require.NoError(t, err)
	want := map[string]int64{}
	for _, e := range events {
		var pl struct{ Name string }
		_ = json.Unmarshal(e.Payload, &pl)
		switch e.Type {
		case itx.TypeSubscriptionConfigured:
			want[pl.Name] = e.Offset
		case itx.TypeSubscriptionRemoved:
			delete(want, pl.Name)
		}
	}
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	list, err := client.ListSubscriptions(ctx, subs)
	require.NoError(t, err)
	got := map[string]int64{}
	for _, l := range list {
		got[l.Name] = l.ConfiguredAtOffset
	}
	require.Equal(t, want, got)
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	for _, l := range list {
		sub := client.Subscription(ctx, s, l.Name)
		_, err := client.WaitUntilProcessed(ctx, sub, info.HeadOffset, 20*time.Second)
		require.NoError(t, err, l.Name)
		sub.Release()
	}
}
