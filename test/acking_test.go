package test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// ackingReceiver is a Receiver that takes batches and confirms what confirm says: 0 (nothing
// yet) unless set.
type ackingReceiver struct {
	mu      sync.Mutex
	offsets []int64
	batches [][]int64
	confirm func(last int64) int64
}

func (r *ackingReceiver) receive(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var batch []int64
	for _, e := range b.Events {
		batch = append(batch, e.Offset)
	}
	r.offsets = append(r.offsets, batch...)
	r.batches = append(r.batches, batch)
	if r.confirm != nil {
		return r.confirm(batch[len(batch)-1]), nil
	}
	return 0, nil
}

func (r *ackingReceiver) got() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int64(nil), r.offsets...)
}

func (r *ackingReceiver) gotBatches() [][]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]int64(nil), r.batches...)
}

func mountAcking(t *testing.T, e *subEnv, name string, r *ackingReceiver) (disconnect func()) {
	return mountReceive(t, e.ts.addr, e.ts.creds.ProjectToken, name, r.receive)
}

func offsetsFrom(first, last int64) []int64 {
	var out []int64
	for o := first; o <= last; o++ {
		out = append(out, o)
	}
	return out
}

// An offset-acking subscription (confirmWindow) delivers ahead of its confirmed cursor, at most a
// window of unconfirmed events at a time; the receiver confirms later through
// Subscription.confirm, or in its answers; what it took and did not confirm goes again to the
// next receiver mounted under the name. describe, list and live state show where it stands:
// delivered and confirmed apart.
func TestSubscription_OffsetAckingDeliversAheadOfConfirmation(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks")
	name, birth := e.configure(t, s, client.SubscriptionConfig{Name: "warehouse", Start: "now", ConfirmWindow: 3, MaxDeliveryEvents: 2,
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "loader"}})
	require.Equal(t, 3, e.describe(t, s, name).Config.ConfirmWindow)
	first := &ackingReceiver{}
	disconnect := mountAcking(t, e, "loader", first)
	mustAppend(t, s, ev("row", `{}`), ev("row", `{}`), ev("row", `{}`), ev("row", `{}`), ev("row", `{}`), ev("row", `{}`))
	b := birth

	// Three events go (a batch of 2, then 1: the window's room), then nothing until a confirm.
	waitUntil(t, "the window delivered", func() bool { return len(first.got()) == 3 })
	e.settle(t, "/acks")
	require.Equal(t, offsetsFrom(b+1, b+3), first.got())
	require.Equal(t, [][]int64{{b + 1, b + 2}, {b + 3}}, first.gotBatches())
	d := e.describe(t, s, name)
	require.Equal(t, b, d.ConfirmedOffset, "an answer of 0 confirms nothing")
	require.Equal(t, b+3, d.DeliveredOffset)
	list := e.list(t, s)
	require.Equal(t, []int64{b, b + 3}, []int64{list[0].ConfirmedOffset, list[0].DeliveredOffset})
	view := &liveView{}
	subscribeLive(t, s, view)
	waitUntil(t, "live state shows delivered and confirmed", func() bool {
		_, doc := view.state()
		subs, _ := doc["subscriptions"].(map[string]any)
		row, _ := subs[name].(map[string]any)
		return row != nil && row["delivered"] == float64(b+3) && row["confirmed"] == float64(b)
	})

	// Confirming frees the window: two more go.
	sub := client.Subscription(e.ctx, s, name)
	defer sub.Release()
	_, err := client.ConfirmSubscription(e.ctx, sub, b+4)
	requireCode(t, err, itx.EInvalid) // not delivered yet
	confirmed, err := client.ConfirmSubscription(e.ctx, sub, b+2)
	require.NoError(t, err)
	require.Equal(t, b+2, confirmed)
	waitUntil(t, "the freed window delivered", func() bool { return len(first.got()) == 5 })
	e.settle(t, "/acks")
	require.Equal(t, offsetsFrom(b+1, b+5), first.got())
	confirmed, err = client.ConfirmSubscription(e.ctx, sub, b+1) // behind the cursor: no change
	require.NoError(t, err)
	require.Equal(t, b+2, confirmed)
	require.Equal(t, b+2, e.describe(t, s, name).ConfirmedOffset)

	// The receiver goes away with b+3..b+5 unconfirmed; the next one mounted under the name gets
	// them again, and confirms in its answers.
	disconnect()
	waitUntil(t, "unmounted", func() bool { return len(e.ts.srv.Mounts("default")) == 0 })
	second := &ackingReceiver{confirm: func(last int64) int64 { return last }}
	defer mountAcking(t, e, "loader", second)()
	e.waitProcessed(t, s, name, b+6)
	require.Equal(t, offsetsFrom(b+3, b+6), second.got(), "the unconfirmed window, then the rest")
	d = e.describe(t, s, name)
	require.Equal(t, []int64{b + 6, b + 6}, []int64{d.ConfirmedOffset, d.DeliveredOffset})
}

// confirmWindow is for receivers that confirm offsets, within bounds; confirm is for offset-acking
// subscriptions only.
func TestSubscription_OffsetAckingRefusals(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks-refused")
	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	for _, cfg := range []client.SubscriptionConfig{
		{Name: "copy", ConfirmWindow: 5, Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/elsewhere"}},
		{Name: "proc", ConfirmWindow: 5, Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}},
		{Name: "huge", ConfirmWindow: itx.MaxConfirmWindow + 1, Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "x"}},
	} {
		_, _, err := client.ConfigureSubscription(e.ctx, subs, cfg)
		requireCode(t, err, itx.EInvalid)
	}
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "plain", Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "x"}})
	for _, c := range []struct {
		name string
		code itx.Code
	}{{name, itx.EFailedPrecondition}, {"missing", itx.ENotFound}} {
		sub := client.Subscription(e.ctx, s, c.name)
		_, err := client.ConfirmSubscription(e.ctx, sub, 1)
		sub.Release()
		requireCode(t, err, c.code)
	}
}

// Across a restart an offset-acking subscription keeps its confirmed cursor and how far it had
// delivered, and delivers again what was delivered and not confirmed (at least once).
func TestSubscription_OffsetAckingRedeliversTheUnconfirmedAfterARestart(t *testing.T) {
	dir := t.TempDir()
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	h := newHook(t, nil) // answers 200 without a body: confirms nothing
	ts := startServer(t, server.Config{DataDir: dir, Clock: clock, Random: func() float64 { return 0.5 }})
	e := &subEnv{ts: ts, clock: clock, p: ts.project(t), ctx: ctxT(t)}
	s := stream(t, e.p, "/acks-restart")
	name, b := e.configure(t, s, client.SubscriptionConfig{Name: "hook", Start: "now", ConfirmWindow: 10,
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	mustAppend(t, s, ev("a", `{}`), ev("b", `{}`), ev("c", `{}`))
	waitUntil(t, "three delivered", func() bool { return h.count() == 3 })
	sub := client.Subscription(e.ctx, s, name)
	confirmed, err := client.ConfirmSubscription(e.ctx, sub, b+1)
	sub.Release()
	require.NoError(t, err)
	require.Equal(t, b+1, confirmed)
	e.settle(t, "/acks-restart")
	closeCtx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, ts.srv.Close(closeCtx))

	ts2 := startServer(t, server.Config{DataDir: dir, Clock: clock, Random: func() float64 { return 0.5 }})
	e2 := &subEnv{ts: ts2, clock: clock, p: ts2.project(t), ctx: ctxT(t)}
	s2 := stream(t, e2.p, "/acks-restart")
	d := e2.describe(t, s2, name)
	require.Equal(t, b+1, d.ConfirmedOffset)
	require.Equal(t, b+3, d.DeliveredOffset, "the delivered offset survives with the row")
	waitUntil(t, "the unconfirmed delivered again", func() bool { return h.count() == 5 })
	require.Equal(t, []int64{b + 1, b + 2, b + 3, b + 2, b + 3}, h.received())
}

// The server keeps a mark per unconfirmed delivery: however wide the window, at most
// MaxAckingDeliveries deliveries are out unconfirmed at a time.
func TestSubscription_OffsetAckingBoundsItsDeliveries(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/acks-bound")
	name, b := e.configure(t, s, client.SubscriptionConfig{Name: "single", Start: "now", ConfirmWindow: itx.MaxConfirmWindow, MaxDeliveryEvents: 1,
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "single"}})
	r := &ackingReceiver{}
	defer mountAcking(t, e, "single", r)()
	n := server.MaxAckingDeliveries + 20
	batch := make([]itx.EventInput, n)
	for i := range batch {
		batch[i] = ev("row", `{}`)
	}
	mustAppend(t, s, batch...)
	waitUntil(t, "the bound's worth delivered", func() bool { return len(r.got()) == server.MaxAckingDeliveries })
	e.settle(t, "/acks-bound")
	require.Len(t, r.got(), server.MaxAckingDeliveries)
	sub := client.Subscription(e.ctx, s, name)
	defer sub.Release()
	_, err := client.ConfirmSubscription(e.ctx, sub, b+10)
	require.NoError(t, err)
	waitUntil(t, "ten more", func() bool { return len(r.got()) == server.MaxAckingDeliveries+10 })
}
