package test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/stretchr/testify/require"
)

// ack is one acknowledged event: what the client was promised.
type ack struct {
	offset  int64
	payload string
}

// appendUntilFailure runs workers that each append small batches (waiting for each ack) until
// an append fails, e.g. because the server died. It returns every acknowledged event by worker,
// and signals on `running` once `warm` acks have arrived in total.
func appendUntilFailure(t *testing.T, addr, token, path string, workers, warm int, round int, running chan<- struct{}) [][]ack {
	acks := make([][]ack, workers)
	var mu sync.Mutex
	total := 0
	var once sync.Once
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := client.Dial(context.Background(), addr)
			if err != nil {
				return
			}
			defer conn.Close()
			p := conn.Login(context.Background(), token)
			defer p.Release()
			s := client.Stream(context.Background(), p, path)
			defer s.Release()
			for i := 0; ; i++ {
				n := 1 + i%3
				batch := make([]itx.EventInput, n)
				payloads := make([]string, n)
				for j := range batch {
					payloads[j] = fmt.Sprintf(`{"round":%d,"w":%d,"i":%d,"j":%d}`, round, w, i, j)
					batch[j] = itx.EventInput{Type: "crash", Payload: json.RawMessage(payloads[j])}
					if j == 0 {
						batch[j].IdempotencyKey = fmt.Sprintf("r%d-w%d-i%d", round, w, i)
					}
				}
				res, err := client.Append(context.Background(), s, batch, itx.AppendOptions{})
				if err != nil {
					return
				}
				for j, off := range res.Offsets {
					acks[w] = append(acks[w], ack{off, payloads[j]})
				}
				mu.Lock()
				total += n
				if total >= warm {
					once.Do(func() { close(running) })
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	once.Do(func() { close(running) }) // never reached warm: let the caller proceed and fail
	return acks
}

// kill -9 during a stream of appends, restart, and every acknowledged event is there, in order,
// with no gap; three rounds on one data directory.
func TestCrash_Kill9KeepsEveryAcknowledgedAppend(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	const path = "/crash"
	var acked []ack
	for round := 0; round < 3; round++ {
		proc := startItxd(t, dataDir)
		running := make(chan struct{})
		done := make(chan [][]ack, 1)
		go func() {
			done <- appendUntilFailure(t, proc.addr, proc.creds.ProjectToken, path, 8, 1500, round, running)
		}()
		<-running
		proc.kill9(t)
		for w, worker := range <-done {
			require.NotEmpty(t, worker, "round %d: a worker got no ack before the kill", round)
			// A worker waits for each ack before its next append, so its offsets must grow.
			for i := 1; i < len(worker); i++ {
				require.Less(t, worker[i-1].offset, worker[i].offset, "round %d worker %d: out of order", round, w)
			}
			acked = append(acked, worker...)
		}

		proc = startItxd(t, dataDir)
		ctx := ctxT(t)
		p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
		listed, err := client.ListStreams(ctx, p, path) // before anything loads the stream
		require.NoError(t, err)
		s := client.Stream(ctx, p, path)
		all, err := client.ReadAll(ctx, s, itx.Query{})
		require.NoError(t, err)
		s.Release()
		p.Release()
		require.Len(t, listed, 1)
		require.False(t, listed[0].Loaded)
		require.Equal(t, int64(len(all)), listed[0].HeadOffset, "round %d: the listed head is the log's, not a stale summary", round)

		// No gap: offsets are exactly 1..len (no ephemeral events were written).
		for i, e := range all {
			require.Equal(t, int64(i+1), e.Offset, "round %d: gap or reorder at index %d", round, i)
		}
		// Every acknowledged event is there with its body.
		byOffset := make(map[int64]string, len(all))
		for _, e := range all {
			byOffset[e.Offset] = string(e.Payload)
		}
		for _, a := range acked {
			got, ok := byOffset[a.offset]
			require.True(t, ok, "round %d: acknowledged offset %d lost", round, a.offset)
			require.JSONEq(t, a.payload, got, "round %d: offset %d", round, a.offset)
		}
		proc.kill9(t)
		t.Logf("round %d: %d acknowledged so far, %d events in the log", round, len(acked), len(all))
	}
}

// SIGTERM during a stream of appends: in-flight appends finish, itxd exits cleanly, and every
// acknowledged event is there after a restart.
func TestShutdown_SIGTERMFinishesInFlightAppends(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	running := make(chan struct{})
	done := make(chan [][]ack, 1)
	go func() { done <- appendUntilFailure(t, proc.addr, proc.creds.ProjectToken, "/term", 8, 500, 0, running) }()
	<-running
	require.NoError(t, proc.stop(t), "itxd exits 0 on SIGTERM")
	var acked []ack
	for _, worker := range <-done {
		acked = append(acked, worker...)
	}

	proc = startItxd(t, dataDir)
	ctx := ctxT(t)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	defer p.Release()
	s := client.Stream(ctx, p, "/term")
	defer s.Release()
	all, err := client.ReadAll(ctx, s, itx.Query{})
	require.NoError(t, err)
	byOffset := map[int64]string{}
	for i, e := range all {
		require.Equal(t, int64(i+1), e.Offset)
		byOffset[e.Offset] = string(e.Payload)
	}
	for _, a := range acked {
		require.JSONEq(t, a.payload, byOffset[a.offset], "offset %d", a.offset)
	}
}

// Streams.list reads unloaded streams from summaries refreshed on unload; a kill -9 skips the
// unload, and the restarted server must still list true heads and subscription counts.
func TestCrash_Kill9ListsTrueSummaries(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	for i := 0; i < 3; i++ {
		mustAppend(t, client.Stream(ctx, p, "/plain"), ev("e", `{}`))
	}
	watched := client.Stream(ctx, p, "/watched")
	subs := client.Subscriptions(ctx, watched)
	for _, name := range []string{"one", "two"} {
		_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: name, FilterTypes: []string{"never"},
			Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "absent"}})
		require.NoError(t, err)
	}
	mustAppend(t, watched, ev("e", `{}`))
	before, err := client.ListStreams(ctx, p, "")
	require.NoError(t, err)
	proc.kill9(t)

	proc = startItxd(t, dataDir)
	p = dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	after, err := client.ListStreams(ctx, p, "")
	require.NoError(t, err)
	require.Len(t, after, 2)
	for i := range after {
		require.Equal(t, before[i].Path, after[i].Path)
		require.Equal(t, before[i].HeadOffset, after[i].HeadOffset, after[i].Path)
		require.Equal(t, before[i].SubscriptionCount, after[i].SubscriptionCount, after[i].Path)
		require.Equal(t, before[i].LastAppendAt, after[i].LastAppendAt, after[i].Path)
	}
	require.Equal(t, "/plain", after[0].Path)
	require.Equal(t, int64(3), after[0].HeadOffset)
	require.False(t, after[0].Loaded, "nothing loaded /plain: its head came from the refreshed summary")
	require.Equal(t, 2, after[1].SubscriptionCount)
}

// kill -9 with open connections and registered readers: the readers' checkpoints survive; the
// connections are simply gone (their sinks learn it from the lost session), and a new one opens.
func TestCrash_Kill9WithConnectionsAndReaders(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	s := client.Stream(ctx, p, "/crash-live")
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`), ev("a", `{}`))
	rf, release := s.Readers(ctx, nil)
	fut, rel := rf.Readers().Register(ctx, func(r schema.Readers_register_Params) error {
		r.SetCheckpoint(2)
		return r.SetName("mirror")
	})
	_, err := fut.Struct()
	require.NoError(t, err)
	rel()
	release()
	sink := newTestSink()
	c, err := openConn(t, s, connOpts{key: "tab", noState: true}, sink)
	require.NoError(t, err)
	waitUntil(t, "caught up", func() bool { return len(sink.offsets()) == 3 })
	proc.kill9(t)
	_, _, err = ping(t, c)
	require.Error(t, err, "the connection died with the server")

	proc = startItxd(t, dataDir)
	p = dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	s = client.Stream(ctx, p, "/crash-live")
	rf, release = s.Readers(ctx, nil)
	defer release()
	lf, rel := rf.Readers().List(ctx, nil)
	defer rel()
	res, err := lf.Struct()
	require.NoError(t, err)
	list, err := res.Readers()
	require.NoError(t, err)
	require.Equal(t, 1, list.Len())
	name, _ := list.At(0).Name()
	require.Equal(t, "mirror", name)
	require.Equal(t, uint64(2), list.At(0).Checkpoint())
	require.Equal(t, uint64(1), list.At(0).Lag())

	again := newTestSink()
	_, err = openConn(t, s, connOpts{key: "tab", after: 1, noState: true}, again)
	require.NoError(t, err, "no connection survived to hold the key")
	waitUntil(t, "caught up again", func() bool { return len(again.offsets()) == 2 })
}

// kill -9 while streams are being created: a creation cut short (the directory entry, or the
// database file, made; its first commit not) must leave no stream (not listed; its path takes a
// first append after the restart), never a path refused forever; every acknowledged stream is
// listed with its true head. TestCrash_UnfinishedCreationsDoNotExist hits each window for sure.
func TestCrash_Kill9DuringStreamCreation(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real itxd processes")
	}
	dataDir := t.TempDir()
	proc := startItxd(t, dataDir)
	ctx := ctxT(t)
	var mu sync.Mutex
	acked := map[string]bool{}
	started := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := client.Dial(ctx, proc.addr)
			if err != nil {
				return
			}
			defer conn.Close()
			p := conn.Login(ctx, proc.creds.ProjectToken)
			for i := 0; ; i++ {
				path := fmt.Sprintf("/c/w%d-%d", w, i)
				s := client.Stream(ctx, p, path)
				_, err := client.Append(ctx, s, []itx.EventInput{ev("x", `{}`)}, itx.AppendOptions{})
				s.Release()
				if err != nil {
					return
				}
				mu.Lock()
				acked[path] = true
				if len(acked) >= 30 {
					once.Do(func() { close(started) })
				}
				mu.Unlock()
			}
		}()
	}
	<-started
	proc.kill9(t)
	wg.Wait()

	proc = startItxd(t, dataDir)
	p := dial(t, proc.addr).Login(ctx, proc.creds.ProjectToken)
	defer p.Release()
	listed, err := client.ListStreams(ctx, p, "/c")
	require.NoError(t, err)
	heads := map[string]int64{}
	for _, info := range listed {
		heads[info.Path] = info.HeadOffset
	}
	for path := range acked {
		require.Equal(t, int64(1), heads[path], "%s: acknowledged, listed with head %d", path, heads[path])
	}
	cut := 0
	for _, info := range listed {
		if !acked[info.Path] {
			cut++ // committed, its acknowledgement lost to the kill
		}
		require.NotEmpty(t, info.StreamID, "%s: listed, so it exists", info.Path)
		require.GreaterOrEqual(t, info.HeadOffset, int64(1), "%s: a creation cut short before its first commit is not listed", info.Path)
		s := client.Stream(ctx, p, info.Path)
		res, err := client.Append(ctx, s, []itx.EventInput{ev("x", `{}`)}, itx.AppendOptions{})
		s.Release()
		require.NoError(t, err, "%s (listed with head %d) takes an append after the restart", info.Path, info.HeadOffset)
		require.Equal(t, info.HeadOffset+1, res.HeadOffset, info.Path)
	}
	t.Logf("%d streams acknowledged, %d listed, %d committed without their acknowledgement", len(acked), len(listed), cut)
}
