package test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// Stream.trim deletes events through an offset, never past what a registered reader or a
// subscription holds; the stream/* records stay (the catalog survives an unload and reload);
// reads and a connection opened at 0 pass the gap; the head and offsets stay; describe shows the
// reach, also after a reload; a deleted event's idempotency key is forgotten.
func TestStream_TrimKeepsWhatConsumersHold(t *testing.T) {
	e := newSubEnv(t, server.Config{IdleTimeout: time.Minute})
	ctx := e.ctx
	s := stream(t, e.p, "/trimmed")
	for i := 1; i <= 10; i++ {
		in := ev("e", fmt.Sprintf(`{"i":%d}`, i))
		if i == 2 {
			in.IdempotencyKey = "k2"
		}
		mustAppend(t, s, in)
	}
	_, configured := e.configure(t, s, client.SubscriptionConfig{Name: "copy",
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/trimmed-copy"}})
	require.Equal(t, int64(11), configured)
	e.waitProcessed(t, s, "copy", 11)
	registerReader(t, s, "mirror", 4)

	r, err := client.Trim(ctx, s, 100)
	require.NoError(t, err)
	require.Equal(t, client.TrimResult{TrimmedThrough: 4, Deleted: 4}, r, "the reader holds 5 on")
	events, err := client.ReadAll(ctx, s, itx.Query{})
	require.NoError(t, err)
	require.Equal(t, []int64{5, 6, 7, 8, 9, 10, 11}, offsetsOf(events))

	registerReader(t, s, "mirror", 8)
	r, err = client.Trim(ctx, s, 6)
	require.NoError(t, err)
	require.Equal(t, client.TrimResult{TrimmedThrough: 6, Deleted: 2}, r, "as far as asked")
	r, err = client.Trim(ctx, s, 3)
	require.NoError(t, err)
	require.Equal(t, client.TrimResult{TrimmedThrough: 6}, r, "never back")

	rf, releaseReaders := s.Readers(ctx, nil)
	require.NoError(t, client.RemoveReader(ctx, rf.Readers(), "mirror"))
	releaseReaders()
	r, err = client.Trim(ctx, s, 100)
	require.NoError(t, err)
	require.Equal(t, client.TrimResult{TrimmedThrough: 11, Deleted: 4}, r, "the subscription confirmed through the head")
	events, err = client.ReadAll(ctx, s, itx.Query{})
	require.NoError(t, err)
	require.Len(t, events, 1)
	require.Equal(t, itx.TypeSubscriptionConfigured, events[0].Type, "stream/* records stay")

	// A connection opened at 0 passes the gap.
	sink := newTestSink()
	conn, err := openConn(t, s, connOpts{noState: true}, sink)
	require.NoError(t, err)
	waitUntil(t, "caught up", func() bool { return len(sink.offsets()) == 1 })
	require.Equal(t, []int64{11}, sink.offsets())
	fut, release := conn.Close(ctx, func(p schema.Connection_close_Params) error { return p.SetReason("done") })
	_, err = fut.Struct()
	release()
	require.NoError(t, err)

	// Offsets go on from the head; the trimmed key is new again.
	res := mustAppend(t, s, keyed("e", `{"i":"again"}`, "k2"))
	require.Equal(t, []int64{12}, res.Offsets)
	require.Equal(t, []bool{false}, res.Duplicate)
	e.waitProcessed(t, s, "copy", 12)
	copied, err := client.ReadAll(ctx, stream(t, e.p, "/trimmed-copy"), itx.Query{Types: []string{"e"}})
	require.NoError(t, err)
	require.Len(t, copied, 11, "the copy was made before the trim")

	// Unloaded and loaded again: the catalog and the reach are read back from the stream.
	waitUntil(t, "the idle stream unloaded", func() bool {
		e.clock.Advance(2 * time.Minute)
		e.ts.srv.Sweep()
		return e.ts.srv.LoadedStreams() == 0
	})
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.Equal(t, int64(11), info.TrimmedThrough)
	require.Equal(t, int64(12), info.HeadOffset)
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	list, err := client.ListSubscriptions(ctx, subs)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "copy", list[0].Name)

	// Each trim that deleted events is audited, and counted.
	trims := audited(t, e.ts.deployment(t), server.AuditStreamTrimmed)
	require.Len(t, trims, 3)
	require.Equal(t, "/trimmed", trims[2]["path"])
	require.EqualValues(t, 11, trims[2]["trimmedThrough"])
	require.EqualValues(t, 4, trims[2]["deleted"])
	require.Equal(t, 10.0, testutil.ToFloat64(e.ts.srv.Metrics().TrimmedEvents))

	_, err = client.Trim(ctx, stream(t, e.p, "/never"), 5)
	requireCode(t, err, itx.ENotFound)
	_, err = client.Trim(ctx, s, -1)
	requireCode(t, err, itx.EInvalid)
}

// An open connection holds what it has not been delivered, and a subscription what it has not
// confirmed (one whose receiver is absent holds everything).
func TestStream_TrimKeepsWhatConnectionsAndParkedSubscriptionsHold(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	ctx := e.ctx
	s := stream(t, e.p, "/held")
	for i := 1; i <= 5; i++ {
		mustAppend(t, s, ev("e", fmt.Sprintf(`{"i":%d}`, i)))
	}
	sink := newTestSink()
	sink.block = make(chan struct{})
	_, err := openConn(t, s, connOpts{noState: true, maxEvents: 2}, sink)
	require.NoError(t, err)
	r, err := client.Trim(ctx, s, 5)
	require.NoError(t, err)
	require.Equal(t, client.TrimResult{}, r, "the connection has been delivered nothing")
	close(sink.block)
	waitUntil(t, "delivered", func() bool { return len(sink.offsets()) == 5 })
	waitUntil(t, "trimmed", func() bool {
		r, err = client.Trim(ctx, s, 5)
		require.NoError(t, err)
		return r.TrimmedThrough == 5
	})

	parked := stream(t, e.p, "/parked")
	for i := 1; i <= 3; i++ {
		mustAppend(t, parked, ev("e", `{}`))
	}
	e.configure(t, parked, client.SubscriptionConfig{Name: "inbox",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "nobody"}})
	r, err = client.Trim(ctx, parked, 3)
	require.NoError(t, err)
	require.Equal(t, client.TrimResult{}, r)
	events, err := client.ReadAll(ctx, parked, itx.Query{})
	require.NoError(t, err)
	require.Len(t, events, 4)
}

// trim with createdBefore deletes the events created before a time (the server's clock at their
// commit), an offset bound and the floor still applying.
func TestStream_TrimByAge(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	ctx := e.ctx
	s := stream(t, e.p, "/aged")
	for i := 1; i <= 5; i++ {
		mustAppend(t, s, ev("old", fmt.Sprintf(`{"i":%d}`, i)))
	}
	cut := e.clock.Now().Add(30 * time.Minute)
	e.clock.Advance(time.Hour)
	for i := 6; i <= 10; i++ {
		mustAppend(t, s, ev("new", fmt.Sprintf(`{"i":%d}`, i)))
	}
	r, err := client.TrimWith(ctx, s, client.TrimOptions{CreatedBefore: cut, ThroughOffset: 3})
	require.NoError(t, err)
	require.Equal(t, client.TrimResult{TrimmedThrough: 3, Deleted: 3}, r, "the offset bound is the nearer")
	r, err = client.TrimWith(ctx, s, client.TrimOptions{CreatedBefore: cut})
	require.NoError(t, err)
	require.Equal(t, client.TrimResult{TrimmedThrough: 5, Deleted: 2}, r)
	r, err = client.TrimWith(ctx, s, client.TrimOptions{CreatedBefore: e.clock.Now().Add(time.Minute)})
	require.NoError(t, err)
	require.Equal(t, client.TrimResult{TrimmedThrough: 10, Deleted: 5}, r)
	_, err = client.TrimWith(ctx, s, client.TrimOptions{})
	requireCode(t, err, itx.EInvalid)
}

// payloadI reads the "i" of the events whose type is typ, in order.
func payloadI(t *testing.T, events []itx.Event, typ string) []int {
	t.Helper()
	var out []int
	for _, e := range events {
		if e.Type != typ {
			continue
		}
		var p struct{ I int }
		require.NoError(t, json.Unmarshal(e.Payload, &p))
		out = append(out, p.I)
	}
	return out
}

// Trims racing appends and every kind of consumer lose no event a consumer still needed: a
// copy-to-stream subscription, a connection opened at 0 and a registered reader paging behind
// the head each see every appended event once, in order, while trims at random offsets delete
// what all of them hold.
func TestStream_TrimRacingConsumersLosesNothing(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	ctx := e.ctx
	s := stream(t, e.p, "/race-trim")
	e.configure(t, s, client.SubscriptionConfig{Name: "copy",
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/race-trim-copy"}})
	registerReader(t, s, "pager", 0)
	sink := newTestSink()
	_, err := openConn(t, s, connOpts{noState: true, maxEvents: 7}, sink)
	require.NoError(t, err)

	const n = 1500
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed) // the batch sizes and trim offsets; the interleaving is the scheduler's
	rng := rand.New(rand.NewPCG(seed, 7))
	trimRng := rand.New(rand.NewPCG(seed, 8))
	var (
		wg       sync.WaitGroup
		appended atomic.Int64 // events appended so far
		head     atomic.Int64
		deleted  atomic.Int64
		readErr  error
		read     []int
	)
	wg.Add(3)
	go func() { // the appender
		defer wg.Done()
		for i := 0; i < n; {
			k := min(1+rng.IntN(20), n-i)
			batch := make([]itx.EventInput, k)
			for j := range batch {
				batch[j] = ev("e", fmt.Sprintf(`{"i":%d}`, i+j))
			}
			res, err := client.Append(ctx, s, batch, itx.AppendOptions{})
			if err != nil {
				t.Errorf("append: %v", err)
				return
			}
			i += k
			head.Store(res.HeadOffset)
			appended.Store(int64(i))
		}
	}()
	go func() { // the trimmer
		defer wg.Done()
		for appended.Load() < n {
			h := head.Load()
			if h == 0 {
				runtime.Gosched() // the first append is under way
				continue
			}
			r, err := client.Trim(ctx, s, 1+trimRng.Int64N(h))
			if err != nil {
				t.Errorf("trim: %v", err)
				return
			}
			deleted.Add(r.Deleted)
		}
	}()
	go func() { // the registered reader, paging and moving its checkpoint
		defer wg.Done()
		rf, release := s.Readers(ctx, nil)
		defer release()
		after := int64(0)
		for len(read) < n {
			page, err := client.GetEventPage(ctx, s, itx.Query{After: after, Limit: 50})
			if err != nil {
				readErr = err
				return
			}
			read = append(read, payloadI(t, page.Events, "e")...)
			if page.NextAfter > after {
				after = page.NextAfter
				if err := client.RegisterReader(ctx, rf.Readers(), "pager", after); err != nil {
					readErr = err
					return
				}
			}
		}
	}()
	wg.Wait()
	require.NoError(t, readErr)
	want := make([]int, n)
	for i := range want {
		want[i] = i
	}
	require.Equal(t, want, read, "the reader read every event once, in order")
	h := head.Load()
	e.waitProcessed(t, s, "copy", h)
	copied, err := client.ReadAll(ctx, stream(t, e.p, "/race-trim-copy"), itx.Query{Types: []string{"e"}})
	require.NoError(t, err)
	require.Equal(t, want, payloadI(t, copied, "e"), "the subscription copied every event once, in order")
	waitUntil(t, "the connection caught up", func() bool {
		got := sink.offsets()
		return len(got) > 0 && got[len(got)-1] == h
	})
	sink.mu.Lock()
	got := payloadI(t, sink.events, "e")
	sink.mu.Unlock()
	require.Equal(t, want, got, "the connection was delivered every event once, in order")
	require.Positive(t, deleted.Load(), "trims deleted events while the consumers ran")
}

// A stream keeps the retention policy set on it and trims itself: at once, then at most once a
// minute while appended to, and when it loads; by count and by age, never past a consumer's
// floor; describe shows the policy, which survives a reload; an empty one clears it.
func TestStream_RetentionPolicy(t *testing.T) {
	e := newSubEnv(t, server.Config{IdleTimeout: 10 * time.Minute})
	ctx := e.ctx
	s := stream(t, e.p, "/kept-short")
	for i := 1; i <= 10; i++ {
		mustAppend(t, s, ev("e", fmt.Sprintf(`{"i":%d}`, i)))
	}
	trimmed := func() int64 {
		info, err := client.Describe(ctx, s)
		require.NoError(t, err)
		return info.TrimmedThrough
	}
	registerReader(t, s, "slow", 5)
	require.NoError(t, client.SetRetention(ctx, s, client.Retention{MaxEvents: 4}))
	waitUntil(t, "trimmed at once, to the reader's checkpoint", func() bool { return trimmed() == 5 })
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.Equal(t, int64(4), info.RetentionMaxEvents)
	require.Zero(t, info.RetentionMaxAgeMs)

	mustAppend(t, s, ev("e", `{"i":11}`), ev("e", `{"i":12}`))
	registerReader(t, s, "slow", 12)
	require.Equal(t, int64(5), trimmed(), "not again within the minute")
	e.clock.Advance(2 * time.Minute)
	mustAppend(t, s, ev("e", `{"i":13}`))
	waitUntil(t, "trimmed as appended to", func() bool { return trimmed() == 9 }) // head 13 - 4

	// By age: everything older than an hour, the policy replaced.
	require.NoError(t, client.SetRetention(ctx, s, client.Retention{MaxAge: time.Hour}))
	e.clock.Advance(2 * time.Hour)
	mustAppend(t, s, ev("e", `{"i":14}`))
	registerReader(t, s, "slow", 13)
	e.clock.Advance(2 * time.Minute)
	mustAppend(t, s, ev("e", `{"i":15}`))
	waitUntil(t, "trimmed by age", func() bool { return trimmed() == 13 })
	events, err := client.ReadAll(ctx, s, itx.Query{Types: []string{"e"}})
	require.NoError(t, err)
	require.Equal(t, []int{14, 15}, payloadI(t, events, "e"))

	// Kept with the stream: unloaded, loaded again, it trims at load.
	registerReader(t, s, "slow", 15)
	waitUntil(t, "the idle stream unloaded", func() bool {
		e.clock.Advance(20 * time.Minute)
		e.ts.srv.Sweep()
		return e.ts.srv.LoadedStreams() == 0
	})
	e.clock.Advance(2 * time.Hour)
	info, err = client.Describe(ctx, s) // loads it
	require.NoError(t, err)
	require.Equal(t, time.Hour.Milliseconds(), info.RetentionMaxAgeMs)
	waitUntil(t, "trimmed at load", func() bool { return trimmed() == 15 })

	require.NoError(t, client.SetRetention(ctx, s, client.Retention{}))
	info, err = client.Describe(ctx, s)
	require.NoError(t, err)
	require.Zero(t, info.RetentionMaxAgeMs)
	require.Zero(t, info.RetentionMaxEvents)
	set := audited(t, e.ts.deployment(t), server.AuditRetentionSet)
	require.Len(t, set, 3, "each policy set is audited")
	require.EqualValues(t, time.Hour.Milliseconds(), set[1]["maxAgeMs"])
	err = client.SetRetention(ctx, s, client.Retention{MaxAge: 30 * time.Second})
	requireCode(t, err, itx.EInvalid)
	require.Contains(t, itx.ErrorMessage(err), "maxAgeMs 30000 (30s) is under a minute", "the age is said as a duration too, so a caller who gave one reads it back")
	requireCode(t, client.SetRetention(ctx, s, client.Retention{MaxAge: 200 * 365 * 24 * time.Hour}), itx.EInvalid)
	requireCode(t, client.SetRetention(ctx, stream(t, e.p, "/none"), client.Retention{MaxEvents: 1}), itx.ENotFound)
}

// kill -9 of itxd right after a trim's first chunk committed (of several): after the restart
// the stream is trimmed through that chunk and no further, every event above it is there, the
// head is kept, and a trim again finishes the job.
func TestCrash_Kill9BetweenTrimChunks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxdKilledAt(t, dataDir, "trim-chunk-committed")
	ctx := ctxT(t)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	s := stream(t, p, "/long")
	const n = 12_000 // three chunks
	for i := 0; i < n; i += 1000 {
		batch := make([]itx.EventInput, 1000)
		for j := range batch {
			batch[j] = ev("e", fmt.Sprintf(`{"i":%d}`, i+j))
		}
		mustAppend(t, s, batch...)
	}
	_, err := client.Trim(ctx, s, 11_000)
	require.Error(t, err, "itxd died before answering")
	proc.requireKilledAtThePoint(t)

	proc = startItxd(t, dataDir)
	p = dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	s = stream(t, p, "/long")
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.Equal(t, int64(5000), info.TrimmedThrough, "the first chunk, and no further")
	require.Equal(t, int64(n), info.HeadOffset)
	events, err := client.ReadAll(ctx, s, itx.Query{})
	require.NoError(t, err)
	want := make([]int, 0, n-5000)
	for i := 5000; i < n; i++ {
		want = append(want, i)
	}
	require.Equal(t, want, payloadI(t, events, "e"))
	r, err := client.Trim(ctx, s, 11_000)
	require.NoError(t, err)
	require.Equal(t, client.TrimResult{TrimmedThrough: 11_000, Deleted: 6000}, r)
}

// kill -9 of itxd in a Stream.trim: between its chunks, right after its last chunk (before its
// audit record was appended), and right after the record was appended (before the stream forgot
// its pending copy). After the restart, with nothing touching the stream, /audit holds exactly
// one admin/stream-trimmed record of the trim, saying what its committed chunks deleted. The
// record commits pending in the stream with each chunk, the stream's alarm is due before, so the
// restart loads it and appends what is pending; the record's id keys the append, so one
// appended before the crash is not appended twice. Before, the record was appended only once
// the last chunk committed: a crash anywhere in between deleted events with no record.
func TestCrash_Kill9InATrimKeepsItsAuditRecord(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	for _, c := range []struct {
		name, point      string
		events, through  int
		trimmed, deleted int64 // in the record
	}{
		{"between chunks", "trim-chunk-committed", 12_000, 11_000, 5000, 5000},
		{"after the last chunk", "trim-chunk-committed", 3000, 2000, 2000, 2000},
		{"after the audit append", "trim-audited", 3000, 2000, 2000, 2000},
	} {
		t.Run(c.name, func(t *testing.T) {
			dataDir := t.TempDir()
			proc := startItxdKilledAt(t, dataDir, c.point)
			ctx := ctxT(t)
			p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
			s := stream(t, p, "/long")
			for i := 0; i < c.events; i += 1000 {
				batch := make([]itx.EventInput, 1000)
				for j := range batch {
					batch[j] = ev("e", fmt.Sprintf(`{"i":%d}`, i+j))
				}
				mustAppend(t, s, batch...)
			}
			_, err := client.Trim(ctx, s, int64(c.through))
			require.Error(t, err, "itxd died before answering")
			proc.requireKilledAtThePoint(t)

			proc = startItxd(t, dataDir)
			waitUntil(t, "the untouched stream loaded by its alarm and its pending audit record appended", func() bool {
				return pendingAuditRecords(t, dataDir) == 0
			})
			root := dial(t, proc.addr).Login(ctx, proc.creds.DeploymentToken)
			defer root.Release()
			trims := audited(t, root, server.AuditStreamTrimmed)
			require.Len(t, trims, 1, "one record of the trim")
			require.Equal(t, "/long", trims[0]["path"])
			require.NotEmpty(t, trims[0]["projectId"])
			require.EqualValues(t, c.trimmed, trims[0]["trimmedThrough"])
			require.EqualValues(t, c.deleted, trims[0]["deleted"])
			by, _ := trims[0]["by"].(map[string]any)
			require.NotEmpty(t, by["tokenId"], "the token that asked")

			p = dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
			info, err := client.Describe(ctx, stream(t, p, "/long"))
			require.NoError(t, err)
			require.Equal(t, c.trimmed, info.TrimmedThrough, "what the record says is what is trimmed")
		})
	}
}

// pendingAuditRecords counts the audit records the streams of a data directory hold pending
// (audit/pending in their KV), read while itxd runs.
func pendingAuditRecords(t *testing.T, dataDir string) int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dataDir, "streams", "*.db"))
	require.NoError(t, err)
	n := 0
	for _, f := range files {
		db, err := sql.Open("sqlite3", "file:"+f+"?mode=ro&_busy_timeout=10000")
		require.NoError(t, err)
		var raw []byte
		err = db.QueryRow(`select value from kv where key = 'audit/pending'`).Scan(&raw)
		db.Close()
		if errors.Is(err, sql.ErrNoRows) || err != nil && strings.Contains(err.Error(), "no such table") {
			continue // none pending, or a stream being created (/audit's, by the first record)
		}
		require.NoError(t, err)
		var recs []json.RawMessage
		require.NoError(t, json.Unmarshal(raw, &recs))
		n += len(recs)
	}
	return n
}

// A retention policy trims past either of its limits, and by age with nobody appending: a
// loaded stream as its oldest event passes the limit, an unloaded one loaded for it by its alarm.
func TestStream_RetentionTrimsAsEventsAge(t *testing.T) {
	trimmedOf := func(ctx context.Context, t *testing.T, s schema.Stream) int64 {
		info, err := client.Describe(ctx, s)
		require.NoError(t, err)
		return info.TrimmedThrough
	}
	t.Run("either limit, then by age while loaded", func(t *testing.T) {
		e := newSubEnv(t, server.Config{IdleTimeout: 1000 * time.Hour})
		s := stream(t, e.p, "/loaded")
		for i := 1; i <= 10; i++ {
			mustAppend(t, s, ev("e", fmt.Sprintf(`{"i":%d}`, i)))
		}
		require.NoError(t, client.SetRetention(e.ctx, s, client.Retention{MaxEvents: 6, MaxAge: time.Hour}))
		waitUntil(t, "the count limit trims fresh events", func() bool { return trimmedOf(e.ctx, t, s) == 4 })
		e.clock.Advance(30 * time.Minute)
		mustAppend(t, s, ev("e", `{"i":11}`))
		require.NoError(t, client.SetRetention(e.ctx, s, client.Retention{MaxAge: time.Hour}))
		e.clock.Advance(31 * time.Minute) // 5..10 are past the hour, 11 is not
		waitUntil(t, "trimmed by age, nobody appending", func() bool { return trimmedOf(e.ctx, t, s) == 10 })
		events, err := client.ReadAll(e.ctx, s, itx.Query{Types: []string{"e"}})
		require.NoError(t, err)
		require.Equal(t, []int{11}, payloadI(t, events, "e"))
	})
	t.Run("unloaded, loaded by its alarm", func(t *testing.T) {
		e := newSubEnv(t, server.Config{IdleTimeout: 10 * time.Minute})
		s := stream(t, e.p, "/unloaded")
		t0 := e.clock.Now()
		for i := 1; i <= 3; i++ {
			mustAppend(t, s, ev("e", fmt.Sprintf(`{"i":%d}`, i)))
		}
		// A day: the unloading below moves the clock a few times 11 minutes.
		require.NoError(t, client.SetRetention(e.ctx, s, client.Retention{MaxAge: 24 * time.Hour}))
		waitUntil(t, "the idle stream unloaded", func() bool {
			e.clock.Advance(11 * time.Minute)
			e.ts.srv.Sweep()
			return e.ts.srv.LoadedStreams() == 0
		})
		require.Zero(t, trimmedOf(e.ctx, t, s), "nothing a day old yet") // loads it again
		waitUntil(t, "unloaded again", func() bool {
			e.clock.Advance(11 * time.Minute)
			e.ts.srv.Sweep()
			return e.ts.srv.LoadedStreams() == 0
		})
		// To the instant the first event is a day old (further, and the loaded stream would
		// idle out again).
		e.clock.Advance(t0.Add(24*time.Hour + time.Millisecond).Sub(e.clock.Now()))
		// Loaded by nothing else: the trim at load may load /audit too.
		waitUntil(t, "its alarm loaded it", func() bool { return e.ts.srv.LoadedStreams() >= 1 })
		waitUntil(t, "trimmed", func() bool { return trimmedOf(e.ctx, t, s) == 3 })
	})
}

// sizedEvent is an event of type "e" whose size as retention counts it (type, payload, metadata,
// key) is exactly 1,000 bytes.
func sizedEvent(i int) itx.EventInput {
	body := fmt.Sprintf(`{"i":%d,"pad":""}`, i)
	return ev("e", fmt.Sprintf(`{"i":%d,"pad":"%s"}`, i, strings.Repeat("x", 999-len(body))))
}

// A retention policy's maxBytes keeps the newest events whose sizes come to at most that: at
// once, then at most once a minute while appended to, never past a consumer's floor, and after a
// reload (the size read again from the log); describe shows it, and the audit records it.
func TestStream_RetentionByBytes(t *testing.T) {
	e := newSubEnv(t, server.Config{IdleTimeout: 10 * time.Minute})
	ctx := e.ctx
	s := stream(t, e.p, "/sized")
	for i := 1; i <= 100; i++ {
		mustAppend(t, s, sizedEvent(i))
	}
	trimmed := func() int64 {
		info, err := client.Describe(ctx, s)
		require.NoError(t, err)
		return info.TrimmedThrough
	}
	kept := func() []int {
		events, err := client.ReadAll(ctx, s, itx.Query{})
		require.NoError(t, err)
		var size int
		for _, ev := range events {
			size += len(ev.Type) + len(ev.Payload) + len(ev.Metadata) + len(ev.IdempotencyKey)
		}
		require.LessOrEqual(t, size, 30_000, "no more than maxBytes kept")
		return payloadI(t, events, "e")
	}
	require.NoError(t, client.SetRetention(ctx, s, client.Retention{MaxBytes: 30_000}))
	waitUntil(t, "trimmed at once to the newest 30 events", func() bool { return trimmed() == 70 })
	require.Equal(t, seq(71, 100), kept())
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.Equal(t, int64(30_000), info.RetentionMaxBytes)

	// Appended to: kept by the commits' sizes, trimmed at the next pass; a reader holds it back.
	registerReader(t, s, "slow", 75)
	for i := 101; i <= 110; i++ {
		mustAppend(t, s, sizedEvent(i))
	}
	e.clock.Advance(2 * time.Minute)
	mustAppend(t, s, sizedEvent(111))
	waitUntil(t, "trimmed to the reader's checkpoint", func() bool { return trimmed() == 75 })
	registerReader(t, s, "slow", 111)
	e.clock.Advance(2 * time.Minute)
	mustAppend(t, s, sizedEvent(112))
	waitUntil(t, "trimmed as appended to", func() bool { return trimmed() == 82 })
	require.Equal(t, seq(83, 112), kept())

	// Kept with the stream: unloaded, loaded again, it measures the log afresh.
	waitUntil(t, "the idle stream unloaded", func() bool {
		e.clock.Advance(20 * time.Minute)
		e.ts.srv.Sweep()
		return e.ts.srv.LoadedStreams() == 0
	})
	for i := 113; i <= 120; i++ {
		mustAppend(t, s, sizedEvent(i)) // the first loads it and applies the policy
	}
	e.clock.Advance(2 * time.Minute)
	registerReader(t, s, "slow", 120)
	mustAppend(t, s, sizedEvent(121))
	waitUntil(t, "trimmed after the reload", func() bool { return trimmed() == 91 })
	require.Equal(t, seq(92, 121), kept())

	set := audited(t, e.ts.deployment(t), server.AuditRetentionSet)
	require.Len(t, set, 1)
	require.EqualValues(t, 30_000, set[0]["maxBytes"])
	requireCode(t, client.SetRetention(ctx, s, client.Retention{MaxBytes: -1}), itx.EInvalid)
}

func seq(from, to int) []int {
	out := []int{}
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// kill -9 of itxd right after a retention policy committed and before the call was answered (so
// before its audit record was appended): after the restart the policy is there, the stream is
// loaded by its alarm with nothing touching it (so the policy applies), and the change is in
// /audit once. The record commits with the policy and the alarm is due before it, so the load
// appends it; before, the change had no audit record, and a stream with no subscriptions had no
// alarm either, so an untouched stream was never loaded to apply its policy.
func TestCrash_Kill9AfterRetentionSetKeepsItsAuditAndAlarm(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxdKilledAt(t, dataDir, "retention-set-committed")
	ctx := ctxT(t)
	s := stream(t, loginItxd(t, proc), "/kept-policy")
	for range 5 {
		mustAppend(t, s, ev("x", `{}`))
	}
	err := client.SetRetention(ctx, s, client.Retention{MaxAge: time.Hour, MaxEvents: 2})
	require.Error(t, err, "killed before the answer")
	proc.requireKilledAtThePoint(t)

	metrics := freeAddr(t)
	proc = startItxd(t, dataDir, "--metrics", metrics)
	waitUntil(t, "the untouched stream loaded by its alarm and trimmed by its policy", func() bool {
		return scrapeMetric(t, metrics, "itx_trimmed_events_total") == 3
	})
	root := dial(t, proc.addr).Login(ctx, proc.creds.DeploymentToken)
	defer root.Release()
	var set []map[string]any
	waitUntil(t, "the policy's audit record", func() bool {
		set = audited(t, root, server.AuditRetentionSet)
		return len(set) > 0
	})
	require.Len(t, set, 1)
	require.Equal(t, "/kept-policy", set[0]["path"])
	require.EqualValues(t, time.Hour.Milliseconds(), set[0]["maxAgeMs"])
	info, err := client.Describe(ctx, stream(t, loginItxd(t, proc), "/kept-policy"))
	require.NoError(t, err)
	require.Equal(t, time.Hour.Milliseconds(), info.RetentionMaxAgeMs)
	require.Equal(t, int64(3), info.TrimmedThrough)
}
