package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A webhook destination the egress policy refuses when delivery runs is a misconfiguration, not
// an outage: waiting does not make a refused address allowed, so it halts at once, at attempt 1,
// with an error naming the policy, instead of climbing the ~2 h ladder. The subscriptions here
// were configured before the operator restarted itxd with --webhook-deny-private: one names the
// private address literally, one by a name reserved for local use; both are refused before
// anything is dialled. (A public name that resolves to a refused address is refused on the
// address dialled, and halts the same way: server's TestWebhookSender_RefusedAtConnectIsTerminal.)
func TestDelivery_WebhookRefusedByEgressPolicyHalts(t *testing.T) {
	dir := t.TempDir()
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	h := newHook(t, nil)
	ts := startServer(t, server.Config{DataDir: dir, Clock: clock, Random: func() float64 { return 0.5 }})
	e := &subEnv{ts: ts, clock: clock, p: ts.project(t), ctx: ctxT(t)}
	s := stream(t, e.p, "/egress-later")
	byName := strings.Replace(h.url(), "127.0.0.1", "localhost", 1)
	for name, url := range map[string]string{"literal": h.url(), "by-name": byName} {
		e.configure(t, s, client.SubscriptionConfig{Name: name, Start: "now", OnFailingEvent: "skip",
			Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: url}})
	}
	closeCtx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, ts.srv.Close(closeCtx))
	// The first itxd, under no policy, may have delivered one subscription's configured event
	// to the other's webhook; only what the second sends counts.
	before := h.count()

	ts2 := startServer(t, server.Config{DataDir: dir, Clock: clock, Random: func() float64 { return 0.5 },
		Egress: server.EgressPolicy{DenyPrivate: true}})
	e = &subEnv{ts: ts2, clock: clock, p: ts2.project(t), ctx: ctxT(t)}
	s = stream(t, e.p, "/egress-later")
	head := mustAppend(t, s, ev("m", `{}`)).HeadOffset
	for _, name := range []string{"literal", "by-name"} {
		waitUntil(t, name+": the first try ended", func() bool {
			d := e.describe(t, s, name)
			return d.Attempt >= 1 || d.Status == "halted"
		})
		d := e.describe(t, s, name)
		require.Equal(t, "halted", d.Status, "%s: a refused destination halts at once (last error %q)", name, d.LastError)
		require.Equal(t, 1, d.Attempt, name)
		require.Zero(t, d.NextAttemptAt, "%s: no retry scheduled", name)
		require.Contains(t, d.LastError, "--webhook-deny-private", name)
	}
	require.Contains(t, e.describe(t, s, "literal").LastError, "loopback")
	require.Contains(t, e.describe(t, s, "by-name").LastError, "reserved for local use")
	for _, name := range []string{"literal", "by-name"} {
		require.Less(t, e.describe(t, s, name).ConfirmedOffset, head, "%s: nothing skipped", name)
	}
	halts := e.events(t, s, itx.TypeSubscriptionHalted)
	require.Len(t, halts, 2)
	for _, rec := range halts {
		var p itx.HaltedPayload
		require.NoError(t, json.Unmarshal(rec.Payload, &p))
		require.Contains(t, p.Error, "egress policy", p.Name)
	}
	require.Empty(t, e.events(t, s, itx.TypeErrorOccurred), "not the event's fault: nothing skipped")
	require.Equal(t, before, h.count(), "nothing reached the refused address")
}

// maxDeliveryEvents and maxDeliveryBytes bound what a delivery carries, not what was read to
// make it: events the filter passes over use up neither, and the bytes counted are those of
// the events as delivered, after the transform (the first event of a delivery always goes).
func TestDelivery_ControlsCountWhatIsDelivered(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	mount := func(name string) *batchRecorder {
		r := &batchRecorder{}
		h, err := client.MountReceiver(e.ctx, e.p, name, client.ServeReceiver(r.receive))
		require.NoError(t, err)
		t.Cleanup(h.Release)
		return r
	}
	big := `{"p":"` + strings.Repeat("x", 700) + `"}`

	t.Run("filtered events do not count toward maxDeliveryEvents", func(t *testing.T) {
		got := mount("two-a")
		s := stream(t, e.p, "/controls-filtered")
		_, birth := e.configure(t, s, client.SubscriptionConfig{Name: "two-a", Start: "now", MaxDeliveryEvents: 2,
			FilterTypes: []string{"a"}, Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "two-a"}})
		e.waitProcessed(t, s, "two-a", mustAppend(t, s,
			ev("a", `{}`), ev("b", `{}`), ev("b", `{}`), ev("b", `{}`), ev("a", `{}`), ev("a", `{}`)).HeadOffset)
		f := birth + 1
		require.Equal(t, [][]int64{{f, f + 4}, {f + 5}}, got.got())
	})

	t.Run("filtered events do not count toward maxDeliveryBytes", func(t *testing.T) {
		got := mount("small-a")
		s := stream(t, e.p, "/controls-filtered-bytes")
		_, birth := e.configure(t, s, client.SubscriptionConfig{Name: "small-a", Start: "now", MaxDeliveryBytes: 400,
			FilterTypes: []string{"a"}, Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "small-a"}})
		e.waitProcessed(t, s, "small-a", mustAppend(t, s,
			ev("a", `{}`), ev("b", big), ev("a", `{}`), ev("a", `{}`)).HeadOffset)
		f := birth + 1
		require.Equal(t, [][]int64{{f, f + 2, f + 3}}, got.got())
	})

	t.Run("maxDeliveryBytes counts the transformed events", func(t *testing.T) {
		grown, shrunk := mount("grown"), mount("shrunk")
		s, s2 := stream(t, e.p, "/controls-grown"), stream(t, e.p, "/controls-shrunk")
		// Small events made big: at most one per delivery under 800 bytes.
		_, birth := e.configure(t, s, client.SubscriptionConfig{Name: "grown", Start: "now", MaxDeliveryBytes: 800,
			Transform: `{"payload": {"p": $pad("", 700, "x")}}`,
			Receiver:  client.Receiver{Kind: client.ReceiverItxCall, Capability: "grown"}})
		// Big events made small: all of them in one delivery.
		_, birth2 := e.configure(t, s2, client.SubscriptionConfig{Name: "shrunk", Start: "now", MaxDeliveryBytes: 800,
			Transform: `{"payload": {}}`,
			Receiver:  client.Receiver{Kind: client.ReceiverItxCall, Capability: "shrunk"}})
		e.waitProcessed(t, s, "grown", mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`)).HeadOffset)
		e.waitProcessed(t, s2, "shrunk", mustAppend(t, s2, ev("a", big), ev("a", big), ev("a", big)).HeadOffset)
		f, f2 := birth+1, birth2+1
		require.Equal(t, [][]int64{{f}, {f + 1}, {f + 2}}, grown.got())
		require.Equal(t, [][]int64{{f2, f2 + 1, f2 + 2}}, shrunk.got())
	})
}

// reset ends every relayed connection with a TCP reset instead of a FIN: to itxd, as when
// its keepalive or user timeout gives up on a peer that vanished, the connection fails under
// its reads rather than being closed by the peer.
func (px *proxy) reset() {
	px.mu.Lock()
	defer px.mu.Unlock()
	for _, c := range px.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}
	px.conns = nil
}

// A mounted Receiver whose connection fails (a reset, as when --rpc-keepalive's probes or the
// user timeout give up on a vanished machine) is unmounted as if it had closed: presence no
// longer shows it, and the next delivery parks the subscription without burning an attempt.
func TestDelivery_MountEndsWithAFailedConnection(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/vanishing")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "app", Start: "now", FilterTypes: []string{"msg"},
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}})
	px := newProxy(t, e.ts.addr)
	r := newReceiverServer()
	mountReceiver(t, px.addr(), e.ts.creds.ProjectToken, "inbox", r) // never released: the machine vanishes
	e.waitProcessed(t, s, name, mustAppend(t, s, ev("msg", `{}`)).HeadOffset)
	require.Len(t, e.ts.srv.Mounts("default"), 1)

	px.reset()
	waitUntil(t, "unmounted", func() bool { return len(e.ts.srv.Mounts("default")) == 0 })
	confirmed := e.describe(t, s, name).ConfirmedOffset
	mustAppend(t, s, ev("msg", `{}`))
	waitUntil(t, "parked", func() bool { return e.describe(t, s, name).Status == "parked" })
	d := e.describe(t, s, name)
	require.Zero(t, d.Attempt, "parking burns no attempt")
	require.Equal(t, confirmed, d.ConfirmedOffset)
	require.Equal(t, []string{"msg"}, r.types(), "the vanished receiver got only the first")
}

// attempts returns the envelope's attempt of every request so far, in arrival order.
func (h *hook) attempts() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := []int{}
	for _, b := range h.bodies {
		out = append(out, b.Attempt)
	}
	return out
}

// The retry ladder end to end (seed 000): every failed try counts one attempt, shown in describe
// with the time of the next one and carried in the envelope; the count survives a restart; the
// 15th consecutive failure halts, loudly; a resume starts the count over (a receiver still
// failing is at attempt 1 again, backing off 1 s, not halted at once as a 16th), and a success
// resets it.
func TestDelivery_LadderCountsAttemptsEndToEnd(t *testing.T) {
	dir := t.TempDir()
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	var mu sync.Mutex
	status := 503
	h := newHook(t, func(int, itx.WebhookBody) int { mu.Lock(); defer mu.Unlock(); return status })
	setStatus := func(s int) { mu.Lock(); status = s; mu.Unlock() }
	cfg := server.Config{DataDir: dir, Clock: clock, Random: func() float64 { return 0.5 }}
	ts := startServer(t, cfg)
	e := &subEnv{ts: ts, clock: clock, p: ts.project(t), ctx: ctxT(t)}
	s := stream(t, e.p, "/ladder-e2e")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "hook", Start: "now", FilterTypes: []string{"job"},
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	first := mustAppend(t, s, ev("job", `{}`)).HeadOffset

	failed := func(attempt int) {
		t.Helper()
		waitUntil(t, fmt.Sprintf("attempt %d failed", attempt), func() bool { return e.describe(t, s, name).Attempt == attempt })
		d := e.describe(t, s, name)
		require.Equal(t, "active", d.Status)
		require.Equal(t, clock.Now().Add(itx.Backoff(attempt, 0.5)).UnixMilli(), d.NextAttemptAt, "attempt %d: the next attempt's time", attempt)
		require.Contains(t, d.LastError, "503")
		require.Equal(t, first-1, d.ConfirmedOffset)
	}
	for attempt := 1; attempt <= 3; attempt++ {
		failed(attempt)
		if attempt < 3 {
			clock.Advance(itx.Backoff(attempt, 0.5))
		}
	}
	closeCtx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, ts.srv.Close(closeCtx))

	ts = startServer(t, cfg)
	e = &subEnv{ts: ts, clock: clock, p: ts.project(t), ctx: ctxT(t)}
	s = stream(t, e.p, "/ladder-e2e")
	require.Equal(t, 3, e.describe(t, s, name).Attempt, "the count survives a restart")
	clock.Advance(itx.Backoff(3, 0.5))
	for attempt := 4; attempt < itx.MaxDeliveryAttempts; attempt++ {
		failed(attempt)
		clock.Advance(itx.Backoff(attempt, 0.5))
	}
	waitUntil(t, "halted", func() bool { return e.describe(t, s, name).Status == "halted" })
	d := e.describe(t, s, name)
	require.Equal(t, itx.MaxDeliveryAttempts, d.Attempt)
	require.Zero(t, d.NextAttemptAt, "halted: nothing scheduled")
	want := []int{}
	for a := 1; a <= itx.MaxDeliveryAttempts; a++ {
		want = append(want, a)
	}
	require.Equal(t, want, h.attempts(), "the envelope carries the attempt")
	halts := e.events(t, s, itx.TypeSubscriptionHalted)
	require.Len(t, halts, 1)
	var halted itx.HaltedPayload
	require.NoError(t, json.Unmarshal(halts[0].Payload, &halted))
	require.Equal(t, itx.MaxDeliveryAttempts, halted.Attempts)
	require.Equal(t, first-1, halted.AfterOffset)

	// Resumed with the receiver still failing: attempt 1 again, not a 16th that halts at once.
	_, err := client.ResumeSubscription(e.ctx, s, name)
	require.NoError(t, err)
	failed(1)
	require.Equal(t, 1, h.attempts()[len(h.attempts())-1])

	// A success resets the count: the next event's first try is attempt 1.
	setStatus(200)
	clock.Advance(itx.Backoff(1, 0.5))
	e.waitProcessed(t, s, name, first)
	d = e.describe(t, s, name)
	require.Zero(t, d.Attempt)
	require.Zero(t, d.NextAttemptAt)
	require.Empty(t, d.LastError)
	require.Equal(t, 2, h.attempts()[len(h.attempts())-1], "the resumed delivery's second try")
	head := mustAppend(t, s, ev("job", `{}`)).HeadOffset
	e.waitProcessed(t, s, name, head)
	require.Equal(t, 1, h.attempts()[len(h.attempts())-1], "a new delivery after a success starts at 1")
}

// An event the receiver refuses (HTTP 4xx) under the default onFailingEvent "halt" climbs the
// same ladder as an outage, counted against the event too (failingEventAttempt), and halts at
// the 15th try with the refusal; the cursor never passes it and nothing is skipped.
func TestDelivery_RefusedEventHaltsAtTheLadderTop(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := newHook(t, func(int, itx.WebhookBody) int { return http.StatusUnprocessableEntity })
	s := stream(t, e.p, "/refused-event")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "strict", Start: "now", FilterTypes: []string{"job"},
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.url()}})
	off := mustAppend(t, s, ev("job", `{}`)).HeadOffset
	for attempt := 1; attempt < itx.MaxDeliveryAttempts; attempt++ {
		waitUntil(t, fmt.Sprintf("attempt %d", attempt), func() bool { return e.describe(t, s, name).Attempt == attempt })
		d := e.describe(t, s, name)
		require.Equal(t, attempt, d.FailingEventAttempt)
		require.Equal(t, off, d.FailingEventOffset)
		require.Equal(t, e.clock.Now().Add(itx.Backoff(attempt, 0.5)).UnixMilli(), d.NextAttemptAt)
		e.clock.Advance(itx.Backoff(attempt, 0.5))
	}
	waitUntil(t, "halted", func() bool { return e.describe(t, s, name).Status == "halted" })
	d := e.describe(t, s, name)
	require.Equal(t, itx.MaxDeliveryAttempts, d.Attempt)
	require.Equal(t, off-1, d.ConfirmedOffset, "the cursor never passes it")
	require.Contains(t, d.LastError, "422")
	require.Equal(t, itx.MaxDeliveryAttempts, h.count())
	require.Empty(t, e.events(t, s, itx.TypeErrorOccurred), "nothing skipped")
	halts := e.events(t, s, itx.TypeSubscriptionHalted)
	require.Len(t, halts, 1)
	require.Contains(t, string(halts[0].Payload), "422")
}
