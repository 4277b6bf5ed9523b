package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A processor-wake subscription owns no delivery policy: the processor keeps its own checkpoint
// (the seed's receiver union has no delivery field on that arm). A start or failing-event policy
// asked of one is refused, writing nothing, instead of being dropped on the way: a processor
// asked to start "now" would otherwise run every effect over the whole history.
func TestEval_ProcessorWakeRefusesADeliveryPolicy(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var pw = project.streams.get("/pw"); pw.append({type: "note"})`)
	for _, src := range []string{
		`pw.subscriptions.configure({name: "guestbook", receiver: {type: "processor-wake"}, start: "now"})`,
		`pw.subscriptions.configure({name: "guestbook", receiver: {type: "processor-wake"}, onFailingEvent: "skip"})`,
	} {
		f := s.failure(t, src)
		require.Equal(t, "invalidArgument", f.Code, "%s: %s", src, f.Message)
		require.Contains(t, f.Message, "processor-wake", src)
	}
	require.Equal(t, 1.0, s.mustEval(t, `pw.describe().headOffset`), "a refused configure writes nothing")
	require.Empty(t, arr(t, s.mustEval(t, `pw.subscriptions.list()`)))

	// The defaults, spelled out, are what a processor does anyway.
	born := obj(t, s.mustEval(t, `pw.subscriptions.configure({name: "guestbook", receiver: {type: "processor-wake"}, start: "beginning", onFailingEvent: "halt"})`))
	require.Equal(t, 2.0, born["offset"])
}

// A rewind (setSubscriptionCursor) moves a halted subscription's cursor but does not un-halt it
// (resumeSubscription does): list and describe go on saying why it is halted, as the seed's
// list row (status, lag, lastError) and describe (retry state) promise.
func TestEval_RewindKeepsWhyHalted(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	// No processor is hosted: a processor-wake subscription halts at once, loudly.
	s.mustEval(t, `var h = project.streams.get("/halted"); h.append([{type: "note"}, {type: "note"}])`)
	s.mustEval(t, `h.subscriptions.configure({name: "nobody", receiver: {type: "processor-wake"}})`)
	s.mustEval(t, `h.waitForEvent({types: ["stream/subscription-delivery-halted"], timeoutMs: 20000})`)

	require.Equal(t, 5.0, obj(t, s.mustEval(t, `h.setSubscriptionCursor("nobody", 1)`))["offset"])
	row := obj(t, arr(t, s.mustEval(t, `h.subscriptions.list()`))[0])
	require.Equal(t, "halted", row["status"])
	require.Equal(t, 1.0, row["confirmedOffset"], "the rewind moved the cursor")
	require.Contains(t, row["lastError"], "no processor is registered", "list says why it is halted")
	d := obj(t, s.mustEval(t, `h.subscriptions.get("nobody").describe()`))
	require.Equal(t, "halted", d["status"])
	require.Equal(t, 5.0, d["cursorChangedAtOffset"])
	require.Contains(t, d["lastError"], "no processor is registered", "describe says why it is halted")
}

// A registered reader is a name plus a declared checkpoint. register without the checkpoint is
// refused as setSubscriptionCursor without afterOffset is, instead of declaring 0: that moved
// an existing reader back to the start (its lag the whole stream, the ephemeral sweep's floor
// lowered with it).
func TestEval_ReaderRegisterNeedsACheckpoint(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var r = project.streams.get("/readers"); r.append([{type: "note"}, {type: "note"}, {type: "note"}])`)
	s.mustEval(t, `r.readers.register("mirror", 3)`)
	for _, src := range []string{`r.readers.register("mirror")`, `r.readers.register({name: "mirror"})`, `r.readers.register("fresh")`} {
		f := s.failure(t, src)
		require.Equal(t, "invalidArgument", f.Code, src)
		require.Contains(t, f.Message, "checkpoint", src)
	}
	rows := arr(t, s.mustEval(t, `r.readers.list()`))
	require.Len(t, rows, 1, "nothing registered")
	require.Equal(t, 3.0, obj(t, rows[0])["checkpoint"], "the checkpoint stays where it was declared")
	s.mustEval(t, `r.readers.register({name: "fresh", checkpoint: 0})`)
	require.Len(t, arr(t, s.mustEval(t, `r.readers.list()`)), 2)
}

// A barrier's timeout beyond its bound (10 minutes) is refused with invalidArgument whatever
// its size: one past 2^32 ms wrapped on the way to the wire's 32 bits and waited a fraction of
// a second (2^32 + 100 ms: 100 ms) or the 20 s default instead.
func TestEval_BarrierTimeoutsBeyondTheBoundAreRefused(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var b = project.streams.get("/barrier"); b.append({type: "note"})`)
	s.mustEval(t, `b.subscriptions.configure({name: "mirror", receiver: {type: "copy-to-stream", path: "/barrier-mirror"}})`)
	for _, src := range []string{
		`b.subscriptions.get("mirror").waitUntilProcessed(99, 600001)`,
		`b.subscriptions.get("mirror").waitUntilProcessed(99, 4294967396)`,
		`b.subscriptions.get("mirror").waitUntilProcessed({offset: 99, timeoutMs: 1e17})`,
		`b.waitForEvent({types: ["never"], timeoutMs: 4294967396})`,
		`b.waitForEvent({types: ["never"], timeoutMs: 1e17})`,
	} {
		f := s.failure(t, src)
		require.Equal(t, "invalidArgument", f.Code, "%s: %s", src, f.Message)
		require.Contains(t, f.Message, "at most 10m", src)
	}
}

// A connection's delivery controls (the seed's per-connection maxDeliveryEvents and
// maxDeliveryBytes) out of range are refused, however large: past 2^32 they wrapped on the way to
// the wire's 32 bits into another, valid, value (2^32 + 1 events: batches of one).
func TestEval_ConnectionControlsOutOfRangeAreRefused(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var oc = project.streams.get("/controls"); oc.append({type: "note"})`)
	for _, src := range []string{
		`oc.openConnection({maxDeliveryEvents: 4294967297})`,
		`oc.openConnection({maxDeliveryBytes: 4294967297})`,
	} {
		f := s.failure(t, src)
		require.Equal(t, "invalidArgument", f.Code, "%s: %s", src, f.Message)
	}
}

// A page limit past the bound (500), 32 bits included, is capped at the bound instead of wrapping
// into a small one (2^32 + 1: a page of one event); a stream listing's past its bound is refused.
func TestEval_PageLimitPast32BitsIsRefused(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var pl = project.streams.get("/limits"); pl.append([{type: "note"}, {type: "note"}, {type: "note"}])`)
	for _, src := range []string{`project.streams.list("", "", 10001)`, `project.streams.list("", "", 4294967297)`} {
		f := s.failure(t, src)
		require.Equal(t, "invalidArgument", f.Code, "%s: %s", src, f.Message)
	}
	for _, src := range []string{`pl.getEventPage({after: 0, limit: 501}).events.length`, `pl.getEventPage({after: 0, limit: 4294967297}).events.length`, `pl.getEvents({limit: 4294967297}).length`} {
		require.EqualValues(t, 3, s.mustEval(t, src), "%s: capped at the page's bound, not wrapped", src)
	}
}

// openConnection takes the seed's spelling of the live-state switch, state: false, beside the
// schema's noState; the two saying the opposite is refused.
func TestEval_ConnectionTakesTheSeedsStateSwitch(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var sc = project.streams.get("/state-switch"); sc.append({type: "note"})`)
	require.Equal(t, "quiet", s.mustEval(t, `sc.openConnection({state: false, key: "quiet"}).key()`))
	require.Equal(t, "told", s.mustEval(t, `sc.openConnection({state: true, noState: false, key: "told"}).key()`))
	f := s.failure(t, `sc.openConnection({state: true, noState: true})`)
	require.Equal(t, "invalidArgument", f.Code, f.Message)
	require.Contains(t, f.Message, "state")
}

// An offset-acking subscription from the REPL: configure takes confirmWindow, describe and list
// show deliveredOffset beside confirmedOffset, and the subscription's confirm is callable.
func TestEval_OffsetAckingSubscription(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var sa = project.streams.get("/acking"); sa.append({type: "note"})`)
	s.mustEval(t, `sa.subscriptions.configure({name: "loader", receiver: {type: "itx-call", capability: "loader"}, confirmWindow: 5})`)
	require.Equal(t, float64(5), s.mustEval(t, `sa.subscriptions.get("loader").describe().config.confirmWindow`))
	require.Equal(t, float64(0), s.mustEval(t, `sa.subscriptions.list()[0].deliveredOffset`))
	f := s.failure(t, `sa.subscriptions.get("loader").confirm(3)`)
	require.Equal(t, "invalidArgument", f.Code, f.Message)
	require.Contains(t, f.Message, "not delivered")
	require.Equal(t, float64(0), s.mustEval(t, `sa.subscriptions.get("loader").confirm({offset: 0}).confirmedOffset`))
}
