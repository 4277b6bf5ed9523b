package test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// appendLarge appends n events of type typ (default "big") of about 1 MiB each (at most 8 per append, the
// append's byte bound), each payload naming its index, and returns their offsets.
func appendLarge(t *testing.T, s schema.Stream, n int, typ ...string) []int64 {
	t.Helper()
	typ = append(typ, "big")
	var offsets []int64
	for len(offsets) < n {
		var batch []itx.EventInput
		for i := len(offsets); i < n && len(batch) < itx.MaxAppendBytes/itx.MaxEventBytes; i++ {
			batch = append(batch, ev(typ[0], largePayload(i)))
		}
		offsets = append(offsets, mustAppend(t, s, batch...).Offsets...)
	}
	return offsets
}

func largePayload(i int) string {
	head := fmt.Sprintf(`{"i":%d,"pad":"`, i)
	return head + strings.Repeat("x", itx.MaxEventBytes-200-len(head)) + `"}`
}

func pageSize(events []itx.Event) int {
	n := 0
	for i := range events {
		n += events[i].Size()
	}
	return n
}

// requireLarge checks that got are the events at want, in order, each once, with their payloads.
func requireLarge(t *testing.T, want []int64, got []itx.Event) {
	t.Helper()
	require.Equal(t, want, offsetsOf(got))
	for i, e := range got {
		var p struct{ I int }
		require.NoError(t, json.Unmarshal(e.Payload, &p))
		require.Equal(t, i, p.I, "offset %d", e.Offset)
		require.Len(t, e.Payload, len(largePayload(i)))
	}
}

// A page of events of about 1 MiB each is bounded by size as well as by count: 500 of them would
// make a reply of about 500 MiB, past the 64 MiB a go-capnp client decodes, and the client lost
// its connection. Following nextAfter (getEventPage) or continuing after the last offset
// (getEvents) reads every event exactly once, in order, in pages of at most MaxPageBytes plus one
// event.
func TestStream_LargeEventPages(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/large")
	const n = 80
	want := appendLarge(t, s, n)
	small := mustAppend(t, s, ev("small", `{}`), ev("small", `{}`))
	head := small.HeadOffset

	t.Run("getEventPage follows nextAfter", func(t *testing.T) {
		ctx := ctxT(t) // each its own: under -race one read of them all takes seconds
		var got []itx.Event
		q := itx.Query{Limit: itx.MaxPageLimit, Types: []string{"big"}}
		for pages := 0; ; pages++ {
			require.Less(t, pages, n+1, "every page makes progress")
			page, err := client.GetEventPage(ctx, s, q)
			require.NoError(t, err)
			require.LessOrEqual(t, pageSize(page.Events), itx.MaxPageBytes+itx.MaxEventBytes)
			require.Greater(t, page.NextAfter, q.After, "progress")
			if len(page.Events) > 0 {
				require.Equal(t, page.Events[len(page.Events)-1].Offset, page.NextAfter, "a page cut by size continues after its last event")
			}
			got = append(got, page.Events...)
			if page.NextAfter >= page.StreamMaxOffset {
				break
			}
			q.After = page.NextAfter
		}
		requireLarge(t, want, got)
	})
	t.Run("getEvents continues after the last offset", func(t *testing.T) {
		ctx := ctxT(t)
		var got []itx.Event
		for after := int64(0); ; {
			page, err := client.GetEvents(ctx, s, itx.Query{After: after, Limit: itx.MaxPageLimit})
			require.NoError(t, err)
			if len(page) == 0 {
				break
			}
			require.LessOrEqual(t, pageSize(page), itx.MaxPageBytes+itx.MaxEventBytes)
			got = append(got, page...)
			after = page[len(page)-1].Offset
		}
		require.Equal(t, append(append([]int64{}, want...), small.Offsets...), offsetsOf(got))
		requireLarge(t, want, got[:n])
	})
	t.Run("the client's ReadAll", func(t *testing.T) {
		ctx := ctxT(t)
		got, err := client.ReadAll(ctx, s, itx.Query{Types: []string{"big"}})
		require.NoError(t, err)
		requireLarge(t, want, got)
	})
	t.Run("a page of small events past the large ones reaches the head", func(t *testing.T) {
		ctx := ctxT(t)
		page, err := client.GetEventPage(ctx, s, itx.Query{After: want[n-1]})
		require.NoError(t, err)
		require.Equal(t, small.Offsets, offsetsOf(page.Events))
		require.Equal(t, head, page.NextAfter)
	})
	t.Run("waitForEvent pages through them", func(t *testing.T) {
		ctx := ctxT(t)
		e, err := client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"small"}}, 0, 0)
		require.NoError(t, err)
		require.Equal(t, small.Offsets[0], e.Offset)
	})
}

// A connection catching up over large events receives every one, in order, once.
func TestConnection_CatchUpOverLargeEvents(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/large-conn")
	want := appendLarge(t, s, 24)
	sink := newTestSink()
	_, err := openConn(t, s, connOpts{maxEvents: 1000, noState: true}, sink)
	require.NoError(t, err)
	waitUntil(t, "every event", func() bool { return len(sink.offsets()) >= len(want) })
	sink.mu.Lock()
	events := append([]itx.Event(nil), sink.events...)
	sink.mu.Unlock()
	requireLarge(t, want, events)
}

// A copy subscription catching up over large events copies every one, in order, once.
func TestSubscription_CopyOverLargeEvents(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	src, dst := stream(t, e.p, "/large-src"), stream(t, e.p, "/large-dst")
	want := appendLarge(t, src, 24)
	got := copyAll(t, e, src, dst, "/large-dst", "big")
	require.Len(t, got, len(want))
	for i := range got {
		require.Equal(t, want[i], got[i].Provenance[0].Offset)
	}
	for i := range got {
		got[i].Offset = want[i] // compared by source offset above; payloads here
	}
	requireLarge(t, want, got)
}

// forwardedSources are the source offsets of a stream's outbox/forwarded events, in order.
func forwardedSources(t *testing.T, s schema.Stream) []int64 {
	t.Helper()
	events, err := client.ReadAll(ctxT(t), s, itx.Query{Types: []string{string(examples.OutboxForwarded)}})
	require.NoError(t, err)
	out := []int64{}
	for _, e := range events {
		var f examples.Forward
		require.NoError(t, json.Unmarshal(e.Payload, &f))
		out = append(out, f.SourceOffset)
	}
	return out
}

// A processor over large events forwards every one once, in order; rewound to the middle, it
// re-reduces the first half from pages cut by size (the runner follows their scannedThrough) and
// its state counts every event once.
func TestProcessors_ForwarderOverLargeEvents(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "forwarder")})
	ctx := ctxLong(t)
	s := stream(t, ts.project(t), "/processors/large")
	configureProcessor(t, s, "forwarder")
	want := appendLarge(t, s, 24, string(examples.InboxMessage))
	sub, proc := processorOf(t, s, "forwarder")
	_, err := client.WaitUntilProcessed(ctx, sub, want[len(want)-1], 90*time.Second)
	require.NoError(t, err)
	require.Equal(t, want, forwardedSources(t, s))

	at, err := client.SetSubscriptionCursor(ctx, s, "forwarder", want[len(want)/2])
	require.NoError(t, err)
	waitRewound(t, ctx, proc, at)
	snap, err := client.Snapshot(ctx, proc)
	require.NoError(t, err)
	require.JSONEq(t, fmt.Sprintf(`{"forwarded":%d}`, len(want)), snap.State)
	require.Equal(t, want, forwardedSources(t, s), "replayed forwards dedupe on their keys")
}

// A remote host pages a stream of large events over RPC, following nextAfter past pages cut by
// size, and forwards every one once, in order.
func TestRemote_ForwarderOverLargeEvents(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxLong(t)
	s := stream(t, ts.project(t), "/remote/large")
	configureRemote(t, s, "forwarder")
	want := appendLarge(t, s, 24, string(examples.InboxMessage))
	awaitMount(t, runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "worker-1", referenceHost(t, "forwarder")))
	sub, proc := processorOf(t, s, "forwarder")
	_, err := client.WaitUntilProcessed(ctx, sub, want[len(want)-1], 90*time.Second)
	require.NoError(t, err)
	require.Equal(t, want, forwardedSources(t, s))
	snap, err := client.Snapshot(ctx, proc)
	require.NoError(t, err)
	require.JSONEq(t, fmt.Sprintf(`{"forwarded":%d}`, len(want)), snap.State)
}

// appendKeyed appends n events of type "keyed" whose idempotency keys (of the longest length) are
// most of their size, and returns their offsets. A read bounded by size counts keys (Event.Size);
// a delivery batch's own byte cap does not, so a read of these is cut by its size bound long
// before the batch's cap would cut it: what follows must still be read, not skipped.
func appendKeyed(t *testing.T, s schema.Stream, n int, payload string) []int64 {
	t.Helper()
	var offsets []int64
	for len(offsets) < n {
		var batch []itx.EventInput
		for i := len(offsets); i < n && len(batch) < itx.MaxAppendEvents; i++ {
			key := fmt.Sprintf("%06d-", i)
			batch = append(batch, keyed("keyed", payload, key+strings.Repeat("k", itx.MaxIdempotencyKeyLength-len(key))))
		}
		offsets = append(offsets, mustAppend(t, s, batch...).Offsets...)
	}
	return offsets
}

// A connection whose catch-up reads are cut by size (keys and all) well before its batch's byte
// cap receives every event, in order, once.
func TestConnection_CatchUpCutByKeyBytes(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/keyed-conn")
	want := appendKeyed(t, s, 3000, `{}`) // about 1.5 MiB of keys, 40 KiB of the rest
	sink := newTestSink()
	_, err := openConn(t, s, connOpts{maxEvents: server.MaxConnectionBatchEvents, noState: true}, sink)
	require.NoError(t, err)
	waitUntil(t, "every event", func() bool { return len(sink.offsets()) >= len(want) })
	require.Equal(t, want, sink.offsets())
}

// A push whose reads are cut by size (keys and all) before DeliveryBatchBytes would cut its batch
// delivers every event, in order, once.
func TestSubscription_CopyCutByKeyBytes(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	src, dst := stream(t, e.p, "/keyed-src"), stream(t, e.p, "/keyed-dst")
	// About 1,100 bytes an event by Event.Size, 700 by the batch's measure: 1,000 events (a
	// batch's count) pass 1 MiB by the first and not by the second.
	want := appendKeyed(t, src, 1000, `{"p":"`+strings.Repeat("x", 600)+`"}`)
	got := copyAll(t, e, src, dst, "/keyed-dst", "keyed")
	sources := []int64{}
	for _, c := range got {
		sources = append(sources, c.Provenance[0].Offset)
	}
	require.Equal(t, want, sources)
}

// copyAll configures a copy-to-stream subscription of src's events of type typ into dst (at
// dstPath), waits until it has copied through src's head, and returns what dst holds of typ.
func copyAll(t *testing.T, e *subEnv, src, dst schema.Stream, dstPath, typ string) []itx.Event {
	t.Helper()
	name, _ := e.configure(t, src, client.SubscriptionConfig{Name: "copy", FilterTypes: []string{typ},
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: dstPath}})
	head, err := client.Describe(e.ctx, src)
	require.NoError(t, err)
	e.waitProcessed(t, src, name, head.HeadOffset)
	got, err := client.ReadAll(e.ctx, dst, itx.Query{Types: []string{typ}})
	require.NoError(t, err)
	return got
}
