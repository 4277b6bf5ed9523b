package test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/schema"
	"github.com/stretchr/testify/require"
)

// Hostile and abusive peers over ONE long-lived connection, against itxd as a separate process.
// The other hostile tests close their connection after each round, so whatever go-capnp's
// per-connection tables (questions, answers, exports, imports, embargoes) or itxd's sessions keep
// goes away with it; here one connection stays up for many rounds, and itxd's heap and goroutines
// are read from its /metrics.

// longPeer is a logged-in raw connection kept up for many rounds. A goroutine of its own reads
// what itxd sends (and never answers itxd's calls).
type longPeer struct {
	*loggedIn

	mu       sync.Mutex
	returns  map[uint32]itxtest.Received // answer id -> its Return, until the peer finishes it
	calls    int                         // itxd's calls on capabilities the peer passed
	asked    []uint32                    // their question ids, until the peer returns them
	releases int                         // itxd's Releases of them
	ended    string                      // how the connection ended, once it did
	done     chan struct{}
}

func startLongPeer(t *testing.T, addr, token string, seed int64, path string) *longPeer {
	t.Helper()
	p := &longPeer{loggedIn: rawLogin(t, addr, token, seed, path), returns: map[uint32]itxtest.Received{}, done: make(chan struct{})}
	go p.read()
	return p
}

func (p *longPeer) read() {
	defer close(p.done)
	for {
		m, err := p.r.RecvMsg()
		p.mu.Lock()
		switch {
		case err != nil:
			p.ended = "closed: " + err.Error()
		case m.Which == rpccp.Message_Which_abort:
			p.ended = "aborted: " + m.Reason
		case m.Which == rpccp.Message_Which_return:
			p.returns[m.Answer] = m
		case m.Which == rpccp.Message_Which_call:
			p.calls++
			p.asked = append(p.asked, m.Question)
		case m.Which == rpccp.Message_Which_release:
			p.releases++
		}
		ended := p.ended != ""
		p.mu.Unlock()
		if ended {
			return
		}
	}
}

// end says how the connection ended ("" while it is up).
func (p *longPeer) end() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ended
}

// callCount is how many calls itxd made on the peer's capabilities.
func (p *longPeer) callCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

// sync asks itxd for its version and waits for the answer: itxd has read everything sent before.
func (p *longPeer) sync(t *testing.T) {
	t.Helper()
	q := p.newQ()
	p.r.Call(q, qBoot, schema.Gateway_TypeID, 1, 0, nil)
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.mu.Lock()
		_, ok := p.returns[q]
		delete(p.returns, q)
		ended := p.ended
		p.mu.Unlock()
		require.Empty(t, ended, "the long connection ended")
		if ok {
			return
		}
		require.True(t, time.Now().Before(deadline), "itxd did not answer a version call in 10s")
		time.Sleep(200 * time.Microsecond)
	}
}

// finishFrom finishes the questions from through to that the steps left unfinished (keeping
// their results' capabilities, then releasing each, or releasing them with the Finish when
// their Return has not come yet), and releases the capabilities of those the steps finished
// without releasing: what the peer held of those questions is then given back.
func (p *longPeer) finishFrom(from, to uint32) {
	for q := from; q <= to; q++ {
		p.mu.Lock()
		ret, returned := p.returns[q]
		delete(p.returns, q)
		p.mu.Unlock()
		releasing, finished := p.finished[q]
		delete(p.finished, q)
		switch {
		case finished && !releasing && returned:
			for _, id := range ret.Exports {
				p.release(id, 1)
			}
		case finished:
		case returned && len(ret.Exports) > 0:
			p.r.Finish(q)
			for _, id := range ret.Exports {
				p.release(id, 1)
			}
		default:
			p.r.FinishReleasing(q)
		}
	}
}

// returnAsked returns every call itxd made on the peer's capabilities so far, with an
// exception: a peer that answers late (itxd cancelled most of them long before).
func (p *longPeer) returnAsked() {
	p.mu.Lock()
	asked := p.asked
	p.asked = nil
	p.mu.Unlock()
	for _, q := range asked {
		p.r.Return(q, func(ret rpccp.Return) error {
			e, err := ret.NewException()
			if err != nil {
				return err
			}
			return e.SetReason("late")
		})
	}
}

// senderHosted is a capability descriptor naming the peer's own export id.
func senderHosted(id uint32) func(rpccp.CapDescriptor) error {
	return func(d rpccp.CapDescriptor) error { d.SetSenderHosted(id); return nil }
}

// appendKeyed appends one event with key to the login's stream.
func (p *longPeer) appendKeyed(key string) uint32 {
	q := p.newQ()
	p.r.CallMsg(itxtest.RawCall{Q: q, Target: itxtest.OnAnswer(qStream, 0), Iface: schema.Stream_TypeID, Method: 0,
		Size: capnp.ObjectSize{PointerCount: 2}, Set: func(s capnp.Struct) error {
			evs, err := schema.Stream_append_Params(s).NewEvents(1)
			if err != nil {
				return err
			}
			e := evs.At(0)
			if err := e.SetType("long/keyed"); err != nil {
				return err
			}
			if err := e.SetPayload(`{"key":"` + key + `"}`); err != nil {
				return err
			}
			return e.SetIdempotencyKey(key)
		}})
	return q
}

// legitimateRound is what a client may do and leave for later: an append with an idempotency key
// (one of 64), Stream.openConnection with an EventSink that never answers, a liveState view
// whose subscriber never answers, and streams.get(path) with describe pipelined on its promise.
// The peer keeps each answer (and what it holds: the connection, the view's handle, the
// stream) until it finishes it, rounds later.
func (p *longPeer) legitimateRound(i int) {
	p.appendKeyed(fmt.Sprintf("k%d", i%64))
	p.withCallbackKind(0, senderHosted(1000+uint32(i)))
	p.withCallbackKind(1, senderHosted(1<<20+uint32(i)))
	g := p.newQ()
	path := fmt.Sprintf("/hostile/long%d", i%8)
	p.r.CallMsg(itxtest.RawCall{Q: g, Target: itxtest.OnAnswer(qStreams, 0), Iface: schema.Streams_TypeID, Method: 0,
		Size: capnp.ObjectSize{PointerCount: 1}, Set: func(s capnp.Struct) error { return s.SetNewText(0, path) }})
	p.r.CallMsg(itxtest.RawCall{Q: p.newQ(), Target: itxtest.OnAnswer(g, 0), Iface: schema.Stream_TypeID, Method: 4})
}

// itxdMemory is a separate itxd's live heap and goroutines, the least of three samples. The live
// heap is the HeapAlloc that its --pprof heap profile (gc=1, debug=1) reports: read right after
// the GC it forces, it is the bytes of the objects alive then, plus the profile's own few
// records. (/metrics's go_memstats_heap_inuse_bytes counts whole spans, which move by hundreds
// of KiB with fragmentation, and both it and go_memstats_heap_alloc_bytes count what the
// requests allocated since that GC.)
// goroutinesOf counts itxd's goroutines from its goroutine profile (taken with the world
// stopped; the request's own handler is one of them). Not go_goroutines: a /metrics scrape
// counts the workers the Prometheus registry starts for that same scrape, from one to about
// twenty depending on scheduling, so a busy machine read a few goroutines above the truth
// (a dump taken while TestItxd_HostileUnreturnedCallsBound saw 27 showed the baseline's 24).
func goroutinesOf(t *testing.T, s *benchItxd) float64 {
	t.Helper()
	prof := goroutineProfile(t, s)
	var n float64
	_, err := fmt.Sscanf(prof, "goroutine profile: total %g", &n)
	require.NoError(t, err, "itxd's goroutine profile began %.40q", prof)
	return n
}

// connGoroutinesOf counts the goroutines of itxd's goroutine profile that are not a loaded
// stream's (its actor, its live engine, its databases' openers) nor the metrics server's own:
// what connections and calls hold. A hostile peer's views start its stream's live engine, which
// lives as long as the stream stays loaded, and a scrape runs HTTP goroutines of its own.
func connGoroutinesOf(t *testing.T, s *benchItxd) int {
	t.Helper()
	n := 0
	// The profile's first line is its header ("goroutine profile: total N"), then one record a
	// stack, biggest count first. (Splitting on blank lines alone left the header in front of the
	// first record, which was then skipped: whether a group of goroutines counted depended on
	// whether another group outnumbered it.)
	prof := goroutineProfile(t, s)
	if _, body, ok := strings.Cut(prof, "\n"); ok && strings.HasPrefix(prof, "goroutine profile:") {
		prof = body
	}
	for _, rec := range strings.Split(prof, "\n\n") {
		var count int
		if _, err := fmt.Sscanf(strings.TrimSpace(rec), "%d @", &count); err != nil {
			continue // the profile's end
		}
		resident := false
		for _, frame := range []string{"server.(*actor).run", "server.(*liveEngine).run", "database/sql.(*DB).connectionOpener", "net/http."} {
			resident = resident || strings.Contains(rec, frame)
		}
		if !resident {
			n += count
		}
	}
	return n
}

// goroutineProfile is itxd's goroutine profile, grouped by stack (for a failure's log).
func goroutineProfile(t *testing.T, s *benchItxd) string {
	t.Helper()
	resp, err := http.Get("http://" + s.metrics + "/debug/pprof/goroutine?debug=1")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

func itxdMemory(t *testing.T, s *benchItxd) (heap, goroutines float64) {
	t.Helper()
	for i := range 3 {
		b := heapProfileText(t, s)
		m := regexp.MustCompile(`(?m)^# HeapAlloc = (\d+)$`).FindStringSubmatch(b)
		require.NotNil(t, m, "no HeapAlloc in itxd's heap profile")
		h, err := strconv.ParseFloat(m[1], 64)
		require.NoError(t, err)
		g := goroutinesOf(t, s)
		if i == 0 || h < heap {
			heap = h
		}
		if i == 0 || g < goroutines {
			goroutines = g
		}
		time.Sleep(20 * time.Millisecond)
	}
	return heap, goroutines
}

// heapProfileText is itxd's heap profile after a GC, as text (debug=1).
func heapProfileText(t *testing.T, s *benchItxd) string {
	t.Helper()
	resp, err := http.Get("http://" + s.metrics + "/debug/pprof/heap?gc=1&debug=1")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// heldByCalls is the live heap (after a GC; the least of three looks) allocated under go-capnp's
// or itx's code, from itxd's heap profile with every allocation profiled
// (startLongItxdProfiled). The whole heap moved with the machine's load, not with what a client
// held: it was 266-280 KiB above its baseline in 4 of 10 runs of TestItxd_HostileUnreturned-
// CallsBound on a loaded machine, in goroutine descriptors (the runtime keeps one per goroutine
// at the peak, for good), pooled buffers and the metrics scrape's own parsing.
func heldByCalls(t *testing.T, s *benchItxd) float64 {
	t.Helper()
	least := -1.0
	for range 3 {
		held := heldByCallsIn(heapProfileText(t, s))
		if least < 0 || held < least {
			least = held
		}
		time.Sleep(20 * time.Millisecond)
	}
	return least
}

// heldByCallsIn sums the in-use bytes of a heap profile's records (debug=1 text) whose stack
// passes through go-capnp or itx, leaving out goroutine descriptors and sync.Pool's buffers.
func heldByCallsIn(profile string) float64 {
	var total float64
	var bytes float64
	var ours, excluded bool
	flush := func() {
		if ours && !excluded {
			total += bytes
		}
		bytes, ours, excluded = 0, false, false
	}
	header := regexp.MustCompile(`^\d+: (\d+) \[\d+: \d+\] @`)
	for _, line := range strings.Split(profile, "\n") {
		if m := header.FindStringSubmatch(line); m != nil {
			flush()
			bytes, _ = strconv.ParseFloat(m[1], 64)
			continue
		}
		if !strings.HasPrefix(line, "#\t") {
			continue
		}
		switch {
		case strings.Contains(line, "runtime.malg"), strings.Contains(line, "sync.(*Pool)"):
			excluded = true
		case strings.Contains(line, "capnproto.org/go/capnp/v3"), strings.Contains(line, "github.com/itx-dev/itx/"):
			ours = true
		}
	}
	flush()
	return total
}

// aliveClient is a well-behaved Go client on a connection of its own, appending now and then.
type aliveClient struct {
	c *client.Conn
	p schema.Project
	s schema.Stream
	n int
}

func dialAlive(t *testing.T, addr, token string) *aliveClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr)
	require.NoError(t, err)
	p := c.Login(context.Background(), token)
	s := client.Stream(context.Background(), p, "/hostile/alive")
	t.Cleanup(func() { s.Release(); p.Release(); c.Close() })
	a := &aliveClient{c: c, p: p, s: s}
	a.requireServed(t, "setup")
	return a
}

// requireServed appends one keyed event and reads it back within 10 s.
func (a *aliveClient) requireServed(t *testing.T, when string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a.n++
	key := fmt.Sprintf("alive-%d", a.n)
	res, err := client.Append(ctx, a.s, []itx.EventInput{keyed("alive", `{}`, key)}, itx.AppendOptions{})
	require.NoError(t, err, "the other client, %s", when)
	evs, err := client.GetEvents(ctx, a.s, itx.Query{After: res.Offsets[0] - 1, Limit: 1})
	require.NoError(t, err, "the other client, %s", when)
	require.Len(t, evs, 1)
	require.Equal(t, key, evs[0].IdempotencyKey)
}

// startLongItxd starts a test build of itxd (-tags itxtest) whose delivery timeout is
// deliveryTimeout, with its metrics and profiler on.
func startLongItxd(t *testing.T, deliveryTimeout time.Duration, extra ...string) *benchItxd {
	return startLongItxdProfiled(t, deliveryTimeout, false, extra...)
}

// startLongItxdProfiled is startLongItxd, with every allocation profiled if profiled (see
// heldByCalls).
func startLongItxdProfiled(t *testing.T, deliveryTimeout time.Duration, profiled bool, extra ...string) *benchItxd {
	t.Helper()
	bin, err := itxdKillPointBin()
	require.NoError(t, err)
	metrics := freeAddr(t)
	env := []string{"ITXD_TEST_DELIVERY_TIMEOUT=" + deliveryTimeout.String()}
	if profiled || os.Getenv("ITX_HOSTILE_LONG_PROFILES") != "" {
		env = append(env, "ITXD_TEST_MEM_PROFILE_RATE=1") // every allocation profiled
	}
	p := startItxdBin(t, bin, env, t.TempDir(),
		append([]string{"--metrics", metrics, "--pprof"}, extra...)...)
	return &benchItxd{itxdProcess: p, metrics: metrics}
}

// saveProfiles writes itxd's goroutine and heap profiles into ITX_HOSTILE_LONG_PROFILES, if set.
func saveProfiles(t *testing.T, s *benchItxd, name string) {
	dir := os.Getenv("ITX_HOSTILE_LONG_PROFILES")
	if dir == "" {
		return
	}
	for _, prof := range []string{"goroutine?debug=1", "heap?gc=1"} {
		resp, err := http.Get("http://" + s.metrics + "/debug/pprof/" + prof)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, os.WriteFile(fmt.Sprintf("%s/%s-%s", dir, name, prof[:strings.IndexByte(prof, '?')]), b, 0o644))
	}
}

// longSoftSteps are the logged-in hostile steps that leave the connection up.
func longSoftSteps() []loggedInStep {
	var soft []loggedInStep
	for _, st := range loggedInSteps() {
		if !st.fatal && !st.mayEnd {
			soft = append(soft, st)
		}
	}
	return soft
}

// longRounds runs rounds of p: four soft hostile steps and a legitimateRound each, after which
// the peer finishes the answers of the rounds older than its window (the window's are finished
// by settle). Every 100 rounds alive must be served, and every returnEvery rounds the peer
// returns itxd's calls so far: a late peer (itxd gave up on most of them after its delivery
// timeout). With no Return at all, go-capnp would keep each call's question until the end
// (bounded by --rpc-max-unreturned-calls, TestItxd_HostileUnreturnedCallsBound). each runs
// after each round.
type longRounds struct {
	p           *longPeer
	soft        []loggedInStep
	window      int
	returnEvery int
	kept        [][2]uint32 // the questions of the rounds in the window
}

func (lr *longRounds) run(t *testing.T, from, to int, alive *aliveClient, each func(i int)) {
	t.Helper()
	p := lr.p
	for i := from; i < to; i++ {
		first := p.nextQ + 1
		for range 4 {
			lr.soft[p.rng.Intn(len(lr.soft))].send(p.loggedIn)
		}
		p.legitimateRound(i)
		p.sync(t)
		lr.kept = append(lr.kept, [2]uint32{first, p.nextQ})
		if len(lr.kept) > lr.window {
			p.finishFrom(lr.kept[0][0], lr.kept[0][1])
			lr.kept = lr.kept[1:]
		}
		if i%100 == 0 {
			alive.requireServed(t, fmt.Sprintf("at round %d", i))
		}
		if i%lr.returnEvery == 0 {
			p.returnAsked()
		}
		if each != nil {
			each(i)
		}
	}
}

// settle finishes the window's answers and returns itxd's calls, waits for what itxd was still
// doing for the peer to time out, and returns the late calls of that time too, until itxd holds
// none of the peer's calls unreturned: the peer then holds only its login. (On a loaded machine
// itxd's timers fire late, and a call made after one round of returns is still the peer's.)
func (lr *longRounds) settle(t *testing.T, s *benchItxd, deliveryTimeout time.Duration) {
	t.Helper()
	p := lr.p
	p.sync(t)
	for _, k := range lr.kept {
		p.finishFrom(k[0], k[1])
	}
	lr.kept = nil
	p.returnAsked()
	time.Sleep(2 * deliveryTimeout) // itxd's own timeouts, in its own process
	deadline := time.Now().Add(20 * time.Second)
	for {
		p.returnAsked()
		p.sync(t) // itxd has read the returns
		u := s.scrape(t, "itx_rpc_unreturned_calls")
		if u == 0 {
			return
		}
		require.True(t, time.Now().Before(deadline), "itxd still holds %v of the peer's calls unreturned", u)
		time.Sleep(10 * time.Millisecond) // polling a condition, not standing in for one
	}
}

// TestItxd_HostileLongConnectionHoldsMemory: one raw connection logs in and runs many rounds of
// the logged-in hostile steps that do not end a connection, each with legitimate calls whose
// answers (and what they hold) the peer keeps for a window of rounds. itxd's calls on the
// peer's sinks and subscribers are answered late or not at all: itxd gives up on each after its
// delivery timeout (1 s in this test build). At the warm-up sample and at the end the peer
// holds only its login, so itxd must hold the same, up to a bound far below what the rounds
// between would leak at a hundred bytes each; the peak in between is bounded by what the peer
// held then. Once the connection closes, itxd is back near where it was before it. Another
// client is served throughout.
func TestItxd_HostileLongConnectionHoldsMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real itxd process")
	}
	rounds := 1500
	if v, err := strconv.Atoi(os.Getenv("ITX_HOSTILE_LONG_ROUNDS")); err == nil {
		rounds = v // longer runs: ITX_HOSTILE_LONG_ROUNDS=20000
	}
	const deliveryTimeout = time.Second
	warm := min(300, rounds/4)
	s := startLongItxd(t, deliveryTimeout)
	token := s.creds.ProjectToken
	alive := dialAlive(t, s.addr, token)

	// A first connection loads what any loads once (the streams the rounds use, their actors).
	first := &longRounds{p: startLongPeer(t, s.addr, token, 0, "/hostile/long"), soft: longSoftSteps(), window: 16, returnEvery: 100}
	first.p.soft = true
	first.run(t, 0, 40, alive, nil)
	first.settle(t, s, deliveryTimeout)
	first.p.r.Close()
	<-first.p.done
	waitUntil(t, "itxd ended the first connection", func() bool { return s.scrape(t, "itx_rpc_connections") == 1 })
	baseHeap, baseG := itxdMemory(t, s)
	saveProfiles(t, s, "base")

	// The warm-up returns itxd's calls less often than the rounds measured, so that what the
	// runtime and the tables keep at their high-water marks (goroutine structures, the
	// question table's slice, maps) is set before the warm sample.
	lr := &longRounds{p: startLongPeer(t, s.addr, token, 1, "/hostile/long"), soft: longSoftSteps(), window: 16, returnEvery: 300}
	p := lr.p
	p.soft = true
	var peakHeap, peakG, peakUnreturned float64
	sample := func(i int) {
		h, g := itxdMemory(t, s)
		u := s.scrape(t, "itx_rpc_unreturned_calls")
		peakHeap, peakG, peakUnreturned = max(peakHeap, h), max(peakG, g), max(peakUnreturned, u)
		t.Logf("round %d: live heap %.2f MiB, %v goroutines; %v calls in flight, %v replies unfinished, %v calls unreturned, %v stream connections open, %v live subscribers",
			i, h/(1<<20), g, s.scrape(t, "itx_rpc_calls_in_flight"), s.scrape(t, "itx_rpc_unfinished_replies"), u,
			s.scrape(t, "itx_open_connections"), s.scrape(t, "itx_live_subscribers"))
	}
	start := time.Now()
	lr.run(t, 0, warm, alive, nil)
	lr.settle(t, s, deliveryTimeout)
	warmHeap, warmG := itxdMemory(t, s)
	saveProfiles(t, s, "warm")
	sample(warm)
	lr.returnEvery = 100
	lr.run(t, warm, rounds, alive, func(i int) {
		if (i-warm)%max(1, (rounds-warm)/4) == 0 {
			sample(i)
		}
	})
	sample(rounds)
	lr.settle(t, s, deliveryTimeout)
	endHeap, endG := itxdMemory(t, s)
	saveProfiles(t, s, "end")
	sample(rounds)
	p.mu.Lock()
	calls, releases := p.calls, p.releases
	p.mu.Unlock()
	t.Logf("%d rounds in %v; itxd called the peer's capabilities %d times, released %d of them; at most %v unreturned at once; live heap and goroutines: baseline %.2f MiB %v, warm (round %d) %.2f MiB %v, peak %.2f MiB %v, end %.2f MiB %v",
		rounds, time.Since(start).Round(time.Millisecond), calls, releases, peakUnreturned, baseHeap/(1<<20), baseG, warm, warmHeap/(1<<20), warmG,
		peakHeap/(1<<20), peakG, endHeap/(1<<20), endG)
	// At the warm sample and at the end the peer held the same (its login): a leak of 100 bytes
	// a round would pass the bound (128 KiB, within a default run).
	after := rounds - warm
	require.Less(t, endHeap-warmHeap, float64(max(128<<10, 100*after)), "itxd's live heap grew over %d rounds of one connection", after)
	require.LessOrEqual(t, endG, warmG+2, "itxd's goroutines grew over %d rounds of one connection", after)
	// In between, the peer held a window of 16 rounds of answers (about 20 capabilities and a
	// stream connection and a live view each) and up to 100 rounds of itxd's calls unreturned: 4 KiB a call unreturned and 64 KiB a round held is far above what each
	// costs, and far below what a leak of the rounds would make.
	require.Less(t, peakHeap-warmHeap, 4<<10*peakUnreturned+16*64<<10, "itxd's live heap while the peer held its window")

	p.r.Close()
	<-p.done
	alive.requireServed(t, "after the long connection")
	// Once it closed, its goroutines are gone, and so is everything it held at the warm sample
	// (its login, its tables): what the process keeps at its high-water marks (the structures of
	// the goroutines of the peak, about 400 bytes each, pools) was there at the warm sample.
	var afterHeap, afterG float64
	deadline := time.Now().Add(10 * time.Second)
	for {
		afterHeap, afterG = itxdMemory(t, s)
		if afterG <= baseG+2 && afterHeap <= warmHeap+64<<10 {
			break
		}
		if time.Now().After(deadline) {
			saveProfiles(t, s, "after")
			t.Fatalf("10 s after the long connection closed, itxd holds %.2f MiB and %v goroutines (warm sample %.2f MiB, baseline %v goroutines)",
				afterHeap/(1<<20), afterG, warmHeap/(1<<20), baseG)
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("after the connection closed: %.2f MiB, %v goroutines", afterHeap/(1<<20), afterG)
}

// A peer that never returns itxd's calls on the capabilities it passed (EventSinks, live-state
// subscribers), while it opens and closes connections and views on one long connection: go-capnp
// keeps each call's question until its Return, also once itxd cancelled it (about 1.4 KiB each,
// measured by TestItxd_HostileLongConnectionHoldsMemory before the peer returned them), so such
// a peer grew itxd for as long as its connection lasted. Past --rpc-max-unreturned-calls its
// connection is aborted with limitExceeded naming the flag; everything is given back, and another
// client is served throughout.
func TestItxd_HostileUnreturnedCallsBound(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real itxd process")
	}
	const bound = 300
	s := startLongItxdProfiled(t, time.Second, true, "--rpc-max-unreturned-calls", strconv.Itoa(bound))
	token := s.creds.ProjectToken
	alive := dialAlive(t, s.addr, token)
	// A first connection loads the stream the peer uses (its actor stays loaded).
	first := startLongPeer(t, s.addr, token, 0, "/hostile/unreturned")
	first.appendKeyed("k0")
	first.sync(t)
	first.r.Close()
	<-first.done
	// The baseline once itxd has ended the first connection (its sessions too): the alive
	// client's is then the only one.
	waitUntil(t, "itxd ended the first connection", func() bool { return s.scrape(t, "itx_rpc_connections") == 1 })
	baseHeld := heldByCalls(t, s)
	baseG := connGoroutinesOf(t, s)
	p := startLongPeer(t, s.addr, token, 1, "/hostile/unreturned")
	deadline := time.Now().Add(15 * time.Second)
	for i := 0; p.end() == ""; i++ {
		require.True(t, time.Now().Before(deadline), "no abort within 15 s; itxd called the peer %d times", p.callCount())
		conn, live := p.nextQ+1, p.nextQ+2
		p.withCallbackKind(0, senderHosted(1000+uint32(i)))
		p.withCallbackKind(1, senderHosted(1<<20+uint32(i)))
		p.appendKeyed(fmt.Sprintf("k%d", i)) // an event for the connections to deliver
		time.Sleep(2 * time.Millisecond)
		p.finish(conn, true) // closed: itxd calls the sink's closed, never returned either
		p.finish(live, true)
		if i%20 == 0 {
			alive.requireServed(t, fmt.Sprintf("at open %d", i))
		}
	}
	<-p.done
	ended, calls := p.end(), p.callCount()
	t.Logf("after %d calls unreturned: %s", calls, ended)
	require.True(t, strings.HasPrefix(ended, "aborted: itx.limitExceeded: "), "%s", ended)
	require.Contains(t, ended, "(--rpc-max-unreturned-calls)")
	require.GreaterOrEqual(t, calls, bound+1)
	require.LessOrEqual(t, calls, bound+16, "itxd went on calling the peer past the bound")
	alive.requireServed(t, "after the abort")
	require.GreaterOrEqual(t, s.scrape(t, "itx_rpc_connections_aborted_total"), 1.0)
	var h float64
	var g int
	deadline = time.Now().Add(10 * time.Second)
	for {
		h = heldByCalls(t, s)
		g = connGoroutinesOf(t, s)
		unreturned, conns, live := s.scrape(t, "itx_rpc_unreturned_calls"), s.scrape(t, "itx_open_connections"), s.scrape(t, "itx_live_subscribers")
		// The heap too: what the calls held goes with the timers and finishes that follow the
		// abort, later on a loaded machine.
		if unreturned == 0 && conns == 0 && live == 0 && g <= baseG+1 && h-baseHeld < float64(128<<10) { // +1: a scrape's transient
			break
		}
		if time.Now().After(deadline) {
			t.Logf("itxd's goroutines:\n%s", goroutineProfile(t, s))
			t.Fatalf("10 s after the abort: %v calls unreturned, %v stream connections open, %v live subscribers, %v goroutines of connections and calls (baseline %v), %.0f KiB held by go-capnp and itx above the baseline",
				unreturned, conns, live, g, baseG, (h-baseHeld)/1024)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// What the peer held is gone: far less than its calls' questions (300 x 1.2 KiB) above the
	// baseline.
	t.Logf("held by go-capnp and itx: baseline %.0f KiB %v goroutines, after %.0f KiB %v", baseHeld/1024, baseG, h/1024, g)
	require.Less(t, h-baseHeld, float64(128<<10))
}

// getStream calls streams.get(path) as question q.
func (p *longPeer) getStream(q uint32, path string) {
	p.r.CallMsg(itxtest.RawCall{Q: q, Target: itxtest.OnAnswer(qStreams, 0), Iface: schema.Streams_TypeID, Method: 0,
		Size: capnp.ObjectSize{PointerCount: 1}, Set: func(s capnp.Struct) error { return s.SetNewText(0, path) }})
}

// requireAbortedFor checks that itxd aborted a connection for a bound, and that the client read
// the Abort, with a reason that starts as want and names flag. (Before itxd gave go-capnp's
// AbortTimeout 5 s, a client aborted while holding thousands of replies or capabilities read
// only the connection's end: "closed: ... EOF".)
func requireAbortedFor(t *testing.T, s *benchItxd, abortsBefore float64, ended, want, flag string) {
	t.Helper()
	require.Equal(t, abortsBefore+1, s.scrape(t, "itx_rpc_connections_aborted_total"), "itxd aborted the connection for a bound: %s", ended)
	require.True(t, strings.HasPrefix(ended, "aborted: itx.limitExceeded: "+want), "%s", ended)
	require.Contains(t, ended, flag)
}

// waitUntilEnded waits (15 s at most) for the connection's end and returns how it ended.
func (p *longPeer) waitUntilEnded(t *testing.T) string {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("the connection did not end within 15 s; itxd called the peer %d times", p.callCount())
	}
	return p.end()
}

// Honest pipelining abuse over one long connection: a client that keeps thousands of replies
// unfinished, thousands of capabilities unreleased, or thousands of calls unanswered meets the
// per-connection bound that applies (README "Limits and protections"), with an Abort naming it
// or with itxd no longer reading it, and itxd does not grow past what that bound allows. Another
// client is served throughout, and once the connection ends itxd gives everything back.
func TestItxd_HostilePipeliningHitsTheSessionBounds(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real itxd process")
	}
	s := startLongItxd(t, time.Second, "--rpc-max-capabilities", "20000")
	token := s.creds.ProjectToken
	alive := dialAlive(t, s.addr, token)
	// A first connection loads the stream the cases use.
	first := startLongPeer(t, s.addr, token, 0, "/hostile/pipelined")
	first.sync(t)
	first.r.Close()
	<-first.done
	baseHeap, baseG := itxdMemory(t, s)
	// backToBase waits for itxd to hold what it held before the case, but for the structures
	// the Go runtime keeps of every goroutine it ran at once (runtime.malg, about 470 bytes each
	// measured: go-capnp runs a goroutine per capability server, one per capability the client
	// held) and 512 KiB.
	backToBase := func(t *testing.T, baseHeap float64, goroutinesAtPeak int) {
		t.Helper()
		alive.requireServed(t, "after the connection ended")
		deadline := time.Now().Add(15 * time.Second)
		for {
			h, g := itxdMemory(t, s)
			calls, unfinished := s.scrape(t, "itx_rpc_calls_in_flight"), s.scrape(t, "itx_rpc_unfinished_replies")
			if g <= baseG+2 && h <= baseHeap+float64(512<<10+512*goroutinesAtPeak) && calls == 0 && unfinished == 0 {
				t.Logf("after: live heap %.2f MiB, %v goroutines (baseline %.2f MiB, %v)", h/(1<<20), g, baseHeap/(1<<20), baseG)
				return
			}
			if time.Now().After(deadline) {
				saveProfiles(t, s, "stuck")
				t.Fatalf("15 s after the connection ended: live heap %.2f MiB, %v goroutines, %v calls in flight, %v replies unfinished (baseline %.2f MiB, %v goroutines)",
					h/(1<<20), g, calls, unfinished, baseHeap/(1<<20), baseG)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}

	t.Run("replies never finished: --rpc-max-unfinished-replies (16,384)", func(t *testing.T) {
		p := startLongPeer(t, s.addr, token, 1, "/hostile/pipelined")
		aborts := s.scrape(t, "itx_rpc_connections_aborted_total")
		var peak float64
		for i := 0; p.end() == ""; i++ {
			p.getStream(p.newQ(), "/hostile/pipelined") // its reply holds a Stream: kept until a Finish that never comes
			if i%2000 == 0 {
				alive.requireServed(t, fmt.Sprintf("at call %d", i))
				h, _ := itxdMemory(t, s)
				peak = max(peak, h)
			}
			require.Less(t, i, 40000, "no abort")
		}
		ended := p.waitUntilEnded(t)
		t.Logf("%s; live heap at most %.2f MiB while the replies were held (baseline %.2f MiB)", ended, peak/(1<<20), baseHeap/(1<<20))
		requireAbortedFor(t, s, aborts, ended, "the client holds 16385 replies", "(--rpc-max-unfinished-replies, --rpc-max-unfinished-reply-bytes)")
		// Each held reply is an answer, its Return message and the Stream capability it
		// holds (a capability server of its own): about 8 KiB each measured; 16 KiB each
		// is what the bound lets one connection hold.
		require.Less(t, peak-baseHeap, float64(16384*16<<10))
		backToBase(t, baseHeap, 16384)
	})

	t.Run("capabilities never released: --rpc-max-capabilities (20,000 here)", func(t *testing.T) {
		p := startLongPeer(t, s.addr, token, 2, "/hostile/pipelined")
		aborts := s.scrape(t, "itx_rpc_connections_aborted_total")
		for range 30000 { // sent while itxd reads them; once it stopped, the sends fail
			q := p.newQ()
			p.getStream(q, "/hostile/pipelined")
			p.r.Finish(q) // finished, keeping the Stream its reply holds: never released
			if p.end() != "" {
				break
			}
		}
		ended := p.waitUntilEnded(t)
		t.Logf("%s", ended)
		requireAbortedFor(t, s, aborts, ended, "the client holds 20", "capabilities of this connection, above its bound of 20000 (--rpc-max-capabilities)")
		backToBase(t, baseHeap, 20000)
	})

	t.Run("calls never answered: --rpc-max-calls (128)", func(t *testing.T) {
		before, _ := itxdMemory(t, s) // with the runtime's goroutine structures of the cases above
		p := startLongPeer(t, s.addr, token, 3, "/hostile/pipelined")
		pauses := s.scrape(t, "itx_rpc_read_pauses_total")
		sent := make(chan struct{})
		go func() { // may block once itxd stops reading: TCP pushes back
			defer close(sent)
			for range 5000 {
				// waitForEvent for a type never appended, for 4 s, and a call pipelined on it.
				// (Not longer: itxd reads nothing of a connection held back at its bound, so
				// it sees the client's close only once a call ends and its Return cannot be
				// written; until then the calls and the connection stay.)
				w := p.newQ()
				p.r.CallMsg(itxtest.RawCall{Q: w, Target: itxtest.OnAnswer(qStream, 0), Iface: schema.Stream_TypeID, Method: 3,
					Size: capnp.ObjectSize{DataSize: 16, PointerCount: 1}, Set: func(s capnp.Struct) error {
						wp := schema.Stream_waitForEvent_Params(s)
						wp.SetTimeoutMs(4000)
						pred, err := wp.NewPredicate()
						if err != nil {
							return err
						}
						types, err := pred.NewTypes(1)
						if err != nil {
							return err
						}
						return types.Set(0, "hostile/never")
					}})
				p.r.CallMsg(itxtest.RawCall{Q: p.newQ(), Target: itxtest.OnAnswer(w, 0), Iface: schema.Stream_TypeID, Method: 4})
			}
		}()
		waitUntil(t, "itxd stopped reading the connection at its calls bound", func() bool {
			return s.scrape(t, "itx_rpc_calls_in_flight") >= 128 && s.scrape(t, "itx_rpc_read_pauses_total") > pauses
		})
		time.Sleep(200 * time.Millisecond)
		h, g := itxdMemory(t, s)
		inFlight := s.scrape(t, "itx_rpc_calls_in_flight")
		t.Logf("%v calls in flight, live heap %.2f MiB, %v goroutines (before %.2f MiB, %v goroutines at the baseline)", inFlight, h/(1<<20), g, before/(1<<20), baseG)
		require.LessOrEqual(t, inFlight, 128.0, "itxd read past --rpc-max-calls")
		require.Empty(t, p.end(), "the connection is held back, not aborted")
		// 128 calls held, each a goroutine or a queued call and its message: 8 KiB each is
		// far above what they cost, and far below 5,000 calls read.
		require.Less(t, h-before, float64(128*8<<10))
		alive.requireServed(t, "while the abusive connection is held back")
		p.r.Close()
		<-sent
		<-p.done
		backToBase(t, before, 2*128)
	})
}
