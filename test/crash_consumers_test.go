package test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/stretchr/testify/require"
)

// A stream deleted for good and made anew at its path (its first append answered), then kill -9:
// the restart's removal of what the deletion left spares the new stream, its events and keys.
func TestCrash_Kill9AfterDeleteAndRecreate(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	p := loginItxd(t, proc)
	s := stream(t, p, "/re")
	mustAppend(t, s, ev("old", `{}`), ev("old", `{}`))
	_, err := client.DeleteStream(ctx, p, "/re", true)
	require.NoError(t, err)
	s2 := stream(t, p, "/re")
	res := mustAppend(t, s2, keyed("new", `{}`, "k1"))
	require.Equal(t, int64(1), res.HeadOffset)
	proc.kill9(t)

	proc = startItxd(t, dataDir)
	p = loginItxd(t, proc)
	s = stream(t, p, "/re")
	all, err := client.ReadAll(ctx, s, itx.Query{})
	require.NoError(t, err)
	require.Len(t, all, 1)
	require.Equal(t, "new", all[0].Type)
	again := mustAppend(t, s, keyed("new", `{}`, "k1"))
	require.True(t, again.Duplicate[0])
}

// A nameless configure under an idempotency key, retried after a kill -9, returns the generated
// name and offset of the first: one subscription.
func TestCrash_Kill9NamelessConfigureRetried(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	s := stream(t, loginItxd(t, proc), "/nameless")
	mustAppend(t, s, ev("x", `{}`))
	cfg := client.SubscriptionConfig{IdempotencyKey: "ensure-1", Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/nameless-copy"}}
	subs := client.Subscriptions(ctx, s)
	n1, o1, err := client.ConfigureSubscription(ctx, subs, cfg)
	require.NoError(t, err)
	subs.Release()
	proc.kill9(t)

	proc = startItxd(t, dataDir)
	s = stream(t, loginItxd(t, proc), "/nameless")
	subs = client.Subscriptions(ctx, s)
	defer subs.Release()
	n2, o2, err := client.ConfigureSubscription(ctx, subs, cfg)
	require.NoError(t, err)
	require.Equal(t, n1, n2)
	require.Equal(t, o1, o2)
	list, err := client.ListSubscriptions(ctx, subs)
	require.NoError(t, err)
	require.Len(t, list, 1)
}

// An offset-acking webhook: kill -9 right after a confirm was answered; the cursor is there after
// the restart, and the events after it, taken before and not confirmed, are delivered again first.
func TestCrash_Kill9AfterAnsweredConfirm(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	var mu sync.Mutex
	var got []int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var b itx.WebhookBatchBody
		_ = json.Unmarshal(raw, &b)
		mu.Lock()
		for _, e := range b.Events {
			got = append(got, e.Offset)
		}
		mu.Unlock()
		w.WriteHeader(200)
		w.Write([]byte(`{"confirmedOffset":0}`))
	}))
	defer srv.Close()
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	s := stream(t, loginItxd(t, proc), "/acking")
	subs := client.Subscriptions(ctx, s)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "loader", Start: "now", FilterTypes: []string{"e"},
		MaxDeliveryEvents: 10, ConfirmWindow: 100, Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: srv.URL}})
	require.NoError(t, err)
	subs.Release()
	res := mustAppend(t, s, ev("e", `{}`), ev("e", `{}`), ev("e", `{}`), ev("e", `{}`))
	waitUntil(t, "all delivered", func() bool { return describeSub(t, s, "loader").DeliveredOffset == res.HeadOffset })
	sub := client.Subscription(ctx, s, "loader")
	c, err := client.ConfirmSubscription(ctx, sub, res.Offsets[1])
	require.NoError(t, err)
	require.Equal(t, res.Offsets[1], c)
	proc.kill9(t)
	mu.Lock()
	got = nil
	mu.Unlock()

	proc = startItxd(t, dataDir)
	s = stream(t, loginItxd(t, proc), "/acking")
	d := describeSub(t, s, "loader")
	require.Equal(t, res.Offsets[1], d.ConfirmedOffset)
	waitUntil(t, "redelivered", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= 2 })
	mu.Lock()
	require.Equal(t, []int64{res.Offsets[2], res.Offsets[3]}, got[:2])
	mu.Unlock()
}

// An itx-call subscription parked and its stream idled out (the directory records it parked),
// then kill -9: after the restart the listing counts it parked, and a mount of the capability
// loads the stream and delivers what it owes, in order.
func TestCrash_Kill9ParkedUnloadedResumesOnMount(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir, "--idle-timeout", "300ms")
	ctx := ctxT(t)
	p := loginItxd(t, proc)
	s := stream(t, p, "/parked")
	subs := client.Subscriptions(ctx, s)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "rx", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "rx-cap"}})
	require.NoError(t, err)
	subs.Release()
	res := mustAppend(t, s, ev("e", `{}`), ev("e", `{}`))
	waitUntil(t, "parked", func() bool { return describeSub(t, s, "rx").Status == itx.StatusParked })
	s.Release()
	waitUntil(t, "unloaded", func() bool {
		l, err := client.ListStreams(ctx, p, "/parked")
		require.NoError(t, err)
		return len(l) == 1 && !l[0].Loaded
	})
	proc.kill9(t)

	proc = startItxd(t, dataDir, "--idle-timeout", "300ms")
	p = loginItxd(t, proc)
	l, err := client.ListStreams(ctx, p, "/parked")
	require.NoError(t, err)
	require.Equal(t, 1, l[0].ParkedSubscriptions)
	var mu sync.Mutex
	var got []int64
	h, err := client.MountReceiver(ctx, p, "rx-cap", client.ServeReceiver(func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range b.Events {
			got = append(got, e.Offset)
		}
		return 0, nil
	}))
	require.NoError(t, err)
	defer h.Release()
	waitUntil(t, "delivered after the mount", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= 2 })
	mu.Lock()
	require.Equal(t, res.Offsets, got)
	mu.Unlock()
}

// A webhook halted at once by the egress policy, then kill -9: halted after the restart (without
// the policy) with its error and attempt, nothing sent; resumed, then kill -9 right after the
// answer: active after the next restart, and it delivers what it owed, halted once in all.
func TestCrash_Kill9HaltThenResume(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	h := newHook(t, nil)
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	s := stream(t, loginItxd(t, proc), "/halt-resume-kill")
	subs := client.Subscriptions(ctx, s)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "hook", Start: "now", FilterTypes: []string{"job"},
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	require.NoError(t, err)
	subs.Release()
	proc.kill9(t)

	proc = startItxd(t, dataDir, "--webhook-deny-private")
	s = stream(t, loginItxd(t, proc), "/halt-resume-kill")
	res := mustAppend(t, s, ev("job", `{}`))
	var before itx.SubscriptionDescription
	waitUntil(t, "halted", func() bool { before = describeSub(t, s, "hook"); return before.Status == itx.StatusHalted })
	proc.kill9(t)

	proc = startItxd(t, dataDir)
	s = stream(t, loginItxd(t, proc), "/halt-resume-kill")
	after := describeSub(t, s, "hook")
	require.Equal(t, itx.StatusHalted, after.Status)
	require.Equal(t, before.LastError, after.LastError)
	require.Equal(t, before.Attempt, after.Attempt)
	require.Zero(t, h.count())
	_, err = client.ResumeSubscription(ctx, s, "hook")
	require.NoError(t, err)
	proc.kill9(t)

	proc = startItxd(t, dataDir)
	s = stream(t, loginItxd(t, proc), "/halt-resume-kill")
	sub := client.Subscription(ctx, s, "hook")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, res.HeadOffset, 10*time.Second)
	require.NoError(t, err)
	require.Contains(t, h.distinct(), res.HeadOffset)
	require.Equal(t, 1, countType(t, s, itx.TypeSubscriptionHalted))
}
