package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
)

// TestLinearizability_StreamsUnderKill9 checks the history of concurrent operations on a few
// streams against a sequential model of a stream, with porcupine. Several clients, each on its
// own TCP connection to a real itxd process, append (single events and batches, with and
// without idempotency keys, retries of a key with its body and with another body, conditional
// appends, ephemeral events, batches holding a bad event), read (getEventPage and getEvents
// ranges with types and includeEphemeral, describe's head), register, move, list and remove
// readers, and open connections at an offset, recording what each batch delivers. itxd is
// killed with SIGKILL at random points and started again on its data directory; the clients
// dial again. Every other process unloads streams as soon as they are idle (at most one
// loaded, 20 ms idle timeout), so they load and unload under the clients too. An operation
// whose answer was lost (disconnected) may or may not have taken
// effect: the model takes both, and it cannot have taken effect after the process died, which
// bounds it (its return time is the death).
//
// The model is README's stream: offsets dense from 1 and shared by durable and ephemeral rows,
// an append atomic (one bad event refuses the call), a key's retry with its body answered with
// the first offset, another body an idempotencyConflict writing nothing, a conditional append
// committing only at the expected head unless every event is a duplicate, reads returning
// exactly the events in their range (ephemeral ones only with includeEphemeral, and then each
// either there or swept), a page's streamMaxOffset the head and its nextAfter where the next
// page starts, a reader's checkpoint at most the head, and connections delivering in order
// with no gap and no duplicate. After every restart (and at the end) every stream is read
// whole: each acknowledged durable event must be at its offset, byte for byte, and those reads
// join the history.
//
// ITX_LIN_SEED, ITX_LIN_SECONDS (workload time, 20 by default), ITX_LIN_CLIENTS (6),
// ITX_LIN_STREAMS (3), ITX_LIN_KILL_MS (mean time between kills, 2500) and
// ITX_LIN_CHECK_SECONDS (porcupine's budget, 120) make a long run; a failure prints its seed.
// The crash timing is not in the seed: a replay runs the same operations, killed elsewhere.
func TestLinearizability_StreamsUnderKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills real itxd processes")
	}
	cfg := linConfig{
		seed:      linEnvInt(t, "ITX_LIN_SEED", 1),
		seconds:   linEnvInt(t, "ITX_LIN_SECONDS", 20),
		clients:   int(linEnvInt(t, "ITX_LIN_CLIENTS", 6)),
		streams:   int(linEnvInt(t, "ITX_LIN_STREAMS", 3)),
		killEvery: time.Duration(linEnvInt(t, "ITX_LIN_KILL_MS", 2500)) * time.Millisecond,
		checkFor:  time.Duration(linEnvInt(t, "ITX_LIN_CHECK_SECONDS", 120)) * time.Second,
	}
	t.Logf("ITX_LIN_SEED=%d ITX_LIN_SECONDS=%d clients %d streams %d kill every ~%v", cfg.seed, cfg.seconds, cfg.clients, cfg.streams, cfg.killEvery)
	runLinearizability(t, cfg)
}

type linConfig struct {
	seed, seconds    int64
	clients, streams int
	killEvery        time.Duration
	checkFor         time.Duration
}

func linEnvInt(t *testing.T, name string, def int64) int64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a non-negative integer", name, v)
	}
	return n
}

// linBody is one event body a client sent (interned: a retry of a key's body is the same body).
type linBody struct {
	typ, payload, metadata, key string
	ephemeral                   bool
}

func (b linBody) input() itx.EventInput {
	in := itx.EventInput{Type: b.typ, Payload: json.RawMessage(b.payload), IdempotencyKey: b.key, Ephemeral: b.ephemeral}
	if b.metadata != "" {
		in.Metadata = json.RawMessage(b.metadata)
	}
	return in
}

// The operations' inputs and outputs (porcupine's Input and Output).
type (
	linAppendIn struct {
		stream      int
		bodies      []int // into linHistory.bodies
		bad         bool  // one event of the call is invalid: the call must be refused whole
		conditional bool
		expected    int64
	}
	linAppendOut struct {
		unknown   bool // the answer was lost: it may or may not have taken effect
		code      itx.Code
		offsets   []int64
		duplicate []bool
		head      int64
	}
	linReadKind int
	linReadIn   struct {
		stream           int
		kind             linReadKind
		after, before    int64
		limit            int
		typ              string // "": every type
		includeEphemeral bool
	}
	linReadOut struct {
		events    []linSeen
		maxOffset int64 // getEventPage's streamMaxOffset, describe's head
		nextAfter int64
	}
	linSeen struct {
		offset int64
		body   int
	}
	linReaderIn struct {
		stream     int
		op         string // "register", "remove", "list"
		reader     int
		checkpoint int64
	}
	linReaderOut struct {
		unknown bool
		code    itx.Code
		listed  map[int][2]int64 // reader -> checkpoint, lag
	}
)

const (
	linPage linReadKind = iota
	linEvents
	linDescribe
	linDelivered // a connection's batch: input after is the offset it delivered through before
)

const linReaders = 2 // reader names per stream: r0, r1

// linHistory is what the run recorded, shared by the clients.
type linHistory struct {
	mu       sync.Mutex
	bodies   []linBody
	interned map[linBody]int
	keyed    [][]int // per stream: keyed bodies sent, for retries and conflicts
	ops      []porcupine.Operation
	gens     []*linGen // every itxd process started, in order
	acked    []map[int64]int
	eph      [][]linEphemeral // per stream: ephemeral events acknowledged
	failures []string
	start    time.Time
}

func (h *linHistory) now() int64 { return int64(time.Since(h.start)) }

func (h *linHistory) intern(b linBody) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if id, ok := h.interned[b]; ok {
		return id
	}
	h.bodies = append(h.bodies, b)
	id := len(h.bodies) - 1
	h.interned[b] = id
	return id
}

// lookup finds the body an event read back is, byte for byte; -1 for one nobody sent.
func (h *linHistory) lookup(e itx.Event) int {
	b := linBody{typ: e.Type, payload: string(e.Payload), metadata: string(e.Metadata), key: e.IdempotencyKey, ephemeral: e.Ephemeral}
	h.mu.Lock()
	defer h.mu.Unlock()
	if id, ok := h.interned[b]; ok {
		return id
	}
	return -1
}

func (h *linHistory) fail(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failures = append(h.failures, fmt.Sprintf(format, args...))
}

func (h *linHistory) record(op porcupine.Operation) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, op)
}

// linEphemeral is an acknowledged ephemeral event and when its append was sent.
type linEphemeral struct {
	offset int64
	body   int
	call   int64
}

// linGen is one itxd process: its address and when it died.
type linGen struct {
	n     int
	addr  string
	dead  chan struct{} // closed once the process is gone
	death int64         // h.now() once it is gone
}

// linCluster hands the clients the current itxd process.
type linCluster struct {
	mu      sync.Mutex
	cur     *linGen
	changed chan struct{} // closed and replaced when cur changes
	over    chan struct{} // closed when the run ends
}

func (c *linCluster) current() (*linGen, chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur, c.changed
}

func (c *linCluster) publish(g *linGen) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cur = g
	close(c.changed)
	c.changed = make(chan struct{})
}

// next waits for a process after g; nil once the run is over.
func (c *linCluster) next(g *linGen) *linGen {
	for {
		cur, changed := c.current()
		if cur != nil && (g == nil || cur.n > g.n) {
			return cur
		}
		select {
		case <-changed:
		case <-c.over:
			return nil
		}
	}
}

func runLinearizability(t *testing.T, cfg linConfig) {
	h := &linHistory{interned: map[linBody]int{}, keyed: make([][]int, cfg.streams), start: time.Now()}
	for range cfg.streams {
		h.acked = append(h.acked, map[int64]int{})
		h.eph = append(h.eph, nil)
	}
	dir := t.TempDir()
	cl := &linCluster{changed: make(chan struct{}), over: make(chan struct{})}
	rng := rand.New(rand.NewPCG(uint64(cfg.seed), 0))

	var token string
	var proc *itxdProcess
	start := func() {
		// Every other process (by the seed) unloads each stream as soon as it is idle, so
		// streams load and unload under the clients all along.
		var args []string
		if rng.IntN(2) == 0 {
			args = []string{"--max-loaded-streams", "1", "--idle-timeout", "20ms"}
		}
		proc = startItxd(t, dir, args...)
		if token == "" {
			token = proc.creds.ProjectToken
		}
		g := &linGen{n: len(h.gens), addr: proc.addr, dead: make(chan struct{})}
		h.mu.Lock()
		h.gens = append(h.gens, g)
		h.mu.Unlock()
		// Every acknowledged event is there before the clients go on.
		linVerify(t, h, g, token, cfg.streams)
		cl.publish(g)
	}
	kill := func() {
		g, _ := cl.current()
		proc.kill9(t)
		g.death = h.now()
		close(g.dead)
	}
	start()

	var wg sync.WaitGroup
	var stop atomic.Bool
	for i := range cfg.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &linClient{id: i, h: h, cl: cl, token: func() string { return token }, streams: cfg.streams,
				rng: rand.New(rand.NewPCG(uint64(cfg.seed), uint64(i+1))), heads: make([]int64, cfg.streams)}
			c.run(&stop)
		}()
	}

	deadline := time.Now().Add(time.Duration(cfg.seconds) * time.Second)
	kills := 0
	for time.Now().Before(deadline) && len(linFailures(h)) == 0 {
		wait := time.Duration(rng.Int64N(int64(2*cfg.killEvery))) + 50*time.Millisecond
		timer := time.NewTimer(min(wait, time.Until(deadline)))
		<-timer.C
		if !time.Now().Before(deadline) {
			break
		}
		kill()
		kills++
		start()
	}
	stop.Store(true)
	// The clients finish the operation they are in; one waiting for a process gets none.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the clients did not stop within 2 minutes of the end of the run")
	}
	// A last kill and restart: what the last process acknowledged is there too.
	kill()
	close(cl.over)
	start()
	kill()

	h.mu.Lock()
	ops := slices.Clone(h.ops)
	failures := slices.Clone(h.failures)
	h.mu.Unlock()
	for i := range ops {
		// An answer lost with its process: the call took effect before that death or never.
		if ops[i].Return == linUnknownReturn {
			ops[i].Return = max(ops[i].Metadata.(*linGen).death, ops[i].Call)
			ops[i].Metadata = nil
		}
	}
	counts := map[string]int{}
	for _, op := range ops {
		switch in := op.Input.(type) {
		case linAppendIn:
			out := op.Output.(linAppendOut)
			switch {
			case out.unknown:
				counts["append unknown"]++
			case out.code != "":
				counts["append "+string(out.code)]++
			default:
				counts["append ok"]++
			}
		case linReadIn:
			counts[[]string{"page", "events", "describe", "delivered"}[in.kind]]++
		case linReaderIn:
			counts["reader "+in.op]++
		}
	}
	t.Logf("%d kills, %d operations: %v", kills, len(ops), counts)
	if len(failures) > 0 {
		for _, f := range failures {
			t.Error(f)
		}
		t.Fatalf("failed with ITX_LIN_SEED=%d (the crash timing is not in the seed)", cfg.seed)
	}
	linCheck(t, h, ops, cfg)
}

func linFailures(h *linHistory) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failures
}

// linCheck runs porcupine over each stream's operations.
func linCheck(t *testing.T, h *linHistory, ops []porcupine.Operation, cfg linConfig) {
	model := linModel(h)
	parts := model.Partition(ops)
	for _, part := range parts {
		stream := linStreamOf(part[0].Input)
		// ITX_LIN_NO_DIRECT=1 leaves the search alone to judge (to see that it can fail).
		if bad := linDirect(h, part); len(bad) > 0 && os.Getenv("ITX_LIN_NO_DIRECT") == "" {
			for _, b := range bad {
				t.Errorf("stream %d: %s", stream, b)
			}
			continue
		}
		began := time.Now()
		res, info := porcupine.CheckOperationsVerbose(model, part, cfg.checkFor)
		t.Logf("stream %d: %d operations: %s in %v", stream, len(part), res, time.Since(began).Round(time.Millisecond))
		if res != porcupine.Ok {
			linDiagnose(t, h, model, part, info)
		}
		switch res {
		case porcupine.Illegal:
			file := filepath.Join(os.TempDir(), fmt.Sprintf("itx-lin-seed%d-stream%d.html", cfg.seed, stream))
			if err := porcupine.VisualizePath(model, info, file); err != nil {
				t.Logf("visualizing: %v", err)
			}
			t.Errorf("stream %d: the history is not linearizable against the model (ITX_LIN_SEED=%d); porcupine's view: %s", stream, cfg.seed, file)
		case porcupine.Unknown:
			t.Errorf("stream %d: porcupine could not decide within %v (ITX_LIN_CHECK_SECONDS)", stream, cfg.checkFor)
		}
	}
}

func linStreamOf(in any) int {
	switch in := in.(type) {
	case linAppendIn:
		return in.stream
	case linReadIn:
		return in.stream
	case linReaderIn:
		return in.stream
	}
	panic(fmt.Sprintf("operation %T", in))
}

func linPath(stream int) string { return fmt.Sprintf("/lin/s%d", stream) }

// linVerify reads every stream whole on process g: each acknowledged durable event must be
// there at its offset, byte for byte. The reads join the history.
func linVerify(t *testing.T, h *linHistory, g *linGen, token string, streams int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := client.Dial(ctx, g.addr)
	if err != nil {
		t.Fatalf("dial itxd %d: %v", g.n, err)
	}
	defer conn.Close()
	p := conn.Login(ctx, token)
	defer p.Release()
	for s := range streams {
		st := client.Stream(ctx, p, linPath(s))
		h.mu.Lock()
		acked := make(map[int64]int, len(h.acked[s]))
		for off, b := range h.acked[s] {
			acked[off] = b
		}
		h.mu.Unlock()
		got := map[int64]int{}
		var head int64
		for after := int64(0); ; {
			in := linReadIn{stream: s, kind: linPage, after: after, limit: 500}
			call := h.now()
			page, err := client.GetEventPage(ctx, st, itx.Query{After: after, Limit: 500})
			if err != nil {
				t.Fatalf("itxd %d: reading %s after %d: %v", g.n, linPath(s), after, err)
			}
			out := linReadOut{maxOffset: page.StreamMaxOffset, nextAfter: page.NextAfter}
			for _, e := range page.Events {
				b := h.lookup(e)
				if b < 0 {
					t.Fatalf("itxd %d: %s holds an event at %d that no client sent: %+v", g.n, linPath(s), e.Offset, e)
				}
				out.events = append(out.events, linSeen{e.Offset, b})
				got[e.Offset] = b
			}
			h.record(porcupine.Operation{ClientId: 0, Input: in, Call: call, Output: out, Return: h.now()})
			head = page.StreamMaxOffset
			if page.NextAfter >= page.StreamMaxOffset {
				break
			}
			if page.NextAfter <= after {
				t.Fatalf("itxd %d: %s: a page after %d says nextAfter %d, head %d", g.n, linPath(s), after, page.NextAfter, page.StreamMaxOffset)
			}
			after = page.NextAfter
		}
		st.Release()
		offs := make([]int64, 0, len(acked))
		for off := range acked {
			offs = append(offs, off)
		}
		sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
		for _, off := range offs {
			want := acked[off]
			if off > head {
				t.Fatalf("itxd %d: %s: offset %d was acknowledged, the head is %d", g.n, linPath(s), off, head)
			}
			b, ok := got[off]
			if !ok {
				t.Fatalf("itxd %d: %s: the acknowledged event at %d is gone: %+v", g.n, linPath(s), off, h.bodies[want])
			}
			if b != want {
				h.mu.Lock()
				gb, wb := h.bodies[b], h.bodies[want]
				h.mu.Unlock()
				t.Fatalf("itxd %d: %s: at %d reads %+v, acknowledged %+v", g.n, linPath(s), off, gb, wb)
			}
		}
	}
}

// linClient runs random operations on one TCP connection at a time.
type linClient struct {
	id      int
	h       *linHistory
	cl      *linCluster
	token   func() string
	streams int
	rng     *rand.Rand
	heads   []int64 // the highest head seen per stream: at most the head now

	gen     *linGen
	conn    *client.Conn
	project schema.Project
	stream  []schema.Stream
	readers []schema.Readers
	seq     int
}

func (c *linClient) run(stop *atomic.Bool) {
	defer c.disconnect()
	for !stop.Load() {
		if c.conn == nil && !c.connect() {
			return
		}
		c.step()
	}
}

func (c *linClient) connect() bool {
	g := c.cl.next(c.gen)
	if g == nil {
		return false
	}
	c.gen = g
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, g.addr)
	if err != nil {
		select {
		case <-g.dead: // killed since (or being killed): wait for the next one
			return true
		case <-time.After(5 * time.Second):
		}
		c.h.fail("client %d: dial itxd %d at %s: %v", c.id, g.n, g.addr, err)
		return false
	}
	c.conn = conn
	c.project = conn.Login(context.Background(), c.token())
	c.stream = make([]schema.Stream, c.streams)
	c.readers = make([]schema.Readers, c.streams)
	for s := range c.streams {
		c.stream[s] = client.Stream(context.Background(), c.project, linPath(s))
		c.readers[s] = client.Readers(context.Background(), c.stream[s])
	}
	return true
}

func (c *linClient) disconnect() {
	if c.conn == nil {
		return
	}
	for s := range c.streams {
		c.readers[s].Release()
		c.stream[s].Release()
	}
	c.project.Release()
	c.conn.Close()
	c.conn = nil
}

// lost classifies an error: true when the call's fate is unknown (the answer was lost). The
// connection is dropped then, to be dialed again (on the next process if this one died).
func (c *linClient) lost(err error) bool {
	switch itx.ErrorCode(err) {
	case itx.EDisconnected, itx.ECancelled:
		select {
		case <-c.gen.dead:
		default:
			// The process is alive: a lost answer is a failure of its own unless it dies soon
			// (the kill may be under way). Dial it again; the operation stays unknown.
			select {
			case <-c.gen.dead:
			case <-time.After(5 * time.Second):
				c.h.fail("client %d: a call failed %v while itxd %d was alive", c.id, err, c.gen.n)
			}
		}
		c.disconnect()
		return true
	}
	return false
}

// linUnknownReturn marks the return of an operation whose answer was lost: once the run is
// over (every process has died by then) it becomes the death of the process the operation was
// sent to, the latest it could take effect.
const linUnknownReturn = -1

func (c *linClient) finish(op porcupine.Operation, unknown bool) {
	if unknown {
		op.Return = linUnknownReturn
		op.Metadata = c.gen
	} else {
		op.Return = c.h.now()
	}
	c.h.record(op)
}

func (c *linClient) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

func (c *linClient) step() {
	s := c.rng.IntN(c.streams)
	switch r := c.rng.IntN(100); {
	case r < 40:
		c.append(s)
	case r < 62:
		c.read(s)
	case r < 72:
		c.describe(s)
	case r < 86:
		c.reader(s)
	default:
		c.connection(s)
	}
}

var linStrings = []string{
	`"plain"`, `"h\u00e9llo"`, `"\ud83d\ude00"`, `"tab\tq\"uote\\"`, `"日本語"`, `"<&>"`, `""`,
	`"\u0000nul"`, `"\u2028"`,
}

var linNumbers = []string{`0`, `-0`, `1e3`, `12345678901234567890`, `3.25`, `-7`}

func (c *linClient) newBody(s int, keyed, ephemeral bool) linBody {
	c.seq++
	typ := []string{"lin/a", "lin/b"}[c.rng.IntN(2)]
	payload := fmt.Sprintf(`{"c":%d,"n":%d,"s":%s,"x":%s,"l":[%s,{"k":null}]}`, c.id, c.seq,
		linStrings[c.rng.IntN(len(linStrings))], linNumbers[c.rng.IntN(len(linNumbers))], linStrings[c.rng.IntN(len(linStrings))])
	if c.rng.IntN(20) == 0 {
		payload = fmt.Sprintf(`{"c":%d,"n":%d,"big":"%s"}`, c.id, c.seq, strings.Repeat("z", 20000+c.rng.IntN(40000)))
	}
	b := linBody{typ: typ, payload: payload, ephemeral: ephemeral}
	if c.rng.IntN(4) == 0 {
		b.metadata = fmt.Sprintf(`{"m":%d}`, c.seq)
	}
	if keyed {
		b.key = fmt.Sprintf("k-%d-%d", c.id, c.seq)
	}
	return b
}

// pickKeyed returns a keyed body sent to stream s (by any client), or -1.
func (c *linClient) pickKeyed(s int) int {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	k := c.h.keyed[s]
	if len(k) == 0 {
		return -1
	}
	// Mostly recent ones: those are the ones whose fate may still be open.
	i := len(k) - 1 - c.rng.IntN(min(len(k), 20))
	if c.rng.IntN(4) == 0 {
		i = c.rng.IntN(len(k))
	}
	return k[i]
}

func (c *linClient) append(s int) {
	in := linAppendIn{stream: s}
	var inputs []itx.EventInput
	add := func(b linBody) {
		id := c.h.intern(b)
		if b.key != "" {
			c.h.mu.Lock()
			c.h.keyed[s] = append(c.h.keyed[s], id)
			c.h.mu.Unlock()
		}
		in.bodies = append(in.bodies, id)
		inputs = append(inputs, b.input())
	}
	n := 1
	if c.rng.IntN(3) == 0 {
		n = 2 + c.rng.IntN(6)
	}
	for range n {
		switch r := c.rng.IntN(100); {
		case r < 35:
			add(c.newBody(s, false, false))
		case r < 60:
			add(c.newBody(s, true, false))
		case r < 72: // a retry of a key with its body
			if id := c.pickKeyed(s); id >= 0 {
				c.h.mu.Lock()
				b := c.h.bodies[id]
				c.h.mu.Unlock()
				add(b)
			} else {
				add(c.newBody(s, true, false))
			}
		case r < 80: // a key's retry with another body
			if id := c.pickKeyed(s); id >= 0 {
				c.h.mu.Lock()
				b := c.h.bodies[id]
				c.h.mu.Unlock()
				nb := c.newBody(s, false, false)
				nb.key = b.key
				add(nb)
			} else {
				add(c.newBody(s, true, false))
			}
		default:
			add(c.newBody(s, false, true))
		}
	}
	if c.rng.IntN(25) == 0 {
		// A bad event anywhere in the call: refused whole, nothing written.
		bad := []itx.EventInput{
			{Type: "has space", Payload: json.RawMessage(`{}`)},
			{Type: "lin/a", Payload: json.RawMessage(`[1]`)},
			{Type: "lin/a", Payload: json.RawMessage(`{"a":`)},
			{Type: "lin/a", Payload: json.RawMessage(`{}`), IdempotencyKey: "eph-key", Ephemeral: true},
			{Type: "stream/whatever", Payload: json.RawMessage(`{}`), Ephemeral: true},
		}[c.rng.IntN(5)]
		at := c.rng.IntN(len(inputs) + 1)
		inputs = slices.Insert(inputs, at, bad)
		in.bad = true
	}
	var opts itx.AppendOptions
	if c.rng.IntN(4) == 0 {
		in.conditional, opts.Conditional = true, true
		in.expected = c.heads[s]
		if c.rng.IntN(3) == 0 {
			in.expected = max(0, in.expected+int64(c.rng.IntN(5))-2)
		}
		opts.ExpectedHeadOffset = in.expected
	}
	ctx, cancel := c.ctx()
	defer cancel()
	op := porcupine.Operation{ClientId: c.id + 1, Input: in, Call: c.h.now()}
	res, err := client.Append(ctx, c.stream[s], inputs, opts)
	if err != nil {
		if c.lost(err) {
			op.Output = linAppendOut{unknown: true}
			c.finish(op, true)
			return
		}
		switch code := itx.ErrorCode(err); code {
		case itx.EIdempotencyConflict, itx.EOffsetConflict, itx.EInvalid:
			op.Output = linAppendOut{code: code}
			c.finish(op, false)
		default:
			c.h.fail("client %d: append to %s: unexpected %v", c.id, linPath(s), err)
		}
		return
	}
	op.Output = linAppendOut{offsets: res.Offsets, duplicate: res.Duplicate, head: res.HeadOffset}
	c.finish(op, false)
	c.heads[s] = max(c.heads[s], res.HeadOffset)
	if len(res.Offsets) != len(in.bodies) {
		c.h.fail("client %d: append of %d events to %s answered %d offsets", c.id, len(in.bodies), linPath(s), len(res.Offsets))
		return
	}
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	for j, id := range in.bodies {
		if c.h.bodies[id].ephemeral {
			c.h.eph[s] = append(c.h.eph[s], linEphemeral{res.Offsets[j], id, op.Call})
			continue
		}
		if was, ok := c.h.acked[s][res.Offsets[j]]; ok && was != id {
			c.h.failures = append(c.h.failures, fmt.Sprintf("client %d: %s: offset %d acknowledged for two bodies: %+v and %+v",
				c.id, linPath(s), res.Offsets[j], c.h.bodies[was], c.h.bodies[id]))
		}
		c.h.acked[s][res.Offsets[j]] = id
	}
}

func (c *linClient) pickAfter(s int) int64 {
	switch c.rng.IntN(4) {
	case 0:
		return 0
	case 1:
		return c.heads[s] + int64(c.rng.IntN(3)) // at the head, or past it
	}
	return c.rng.Int64N(c.heads[s] + 1)
}

func (c *linClient) read(s int) {
	in := linReadIn{stream: s, kind: linPage, after: c.pickAfter(s), includeEphemeral: c.rng.IntN(2) == 0}
	if c.rng.IntN(3) == 0 {
		in.kind = linEvents
	}
	if c.rng.IntN(3) == 0 {
		in.before = in.after + 1 + int64(c.rng.IntN(20))
	}
	if c.rng.IntN(2) == 0 {
		in.limit = 1 + c.rng.IntN(30)
	}
	if c.rng.IntN(4) == 0 {
		in.typ = []string{"lin/a", "lin/b"}[c.rng.IntN(2)]
	}
	q := itx.Query{After: in.after, Before: in.before, Limit: in.limit, IncludeEphemeral: in.includeEphemeral}
	if in.typ != "" {
		q.Types = []string{in.typ}
	}
	ctx, cancel := c.ctx()
	defer cancel()
	op := porcupine.Operation{ClientId: c.id + 1, Input: in, Call: c.h.now()}
	var events []itx.Event
	var out linReadOut
	var err error
	if in.kind == linPage {
		var page itx.Page
		page, err = client.GetEventPage(ctx, c.stream[s], q)
		events, out.maxOffset, out.nextAfter = page.Events, page.StreamMaxOffset, page.NextAfter
	} else {
		events, err = client.GetEvents(ctx, c.stream[s], q)
	}
	if err != nil {
		if !c.lost(err) {
			c.h.fail("client %d: read %s %+v: %v", c.id, linPath(s), q, err)
		}
		return // a read that did not answer says nothing
	}
	op.Return = c.h.now()
	if out.events = c.seen(s, events); out.events == nil && len(events) > 0 {
		return
	}
	op.Output = out
	c.h.record(op)
	c.heads[s] = max(c.heads[s], out.maxOffset)
}

// seen turns events read back into the bodies sent; nil (and a failure) for one nobody sent.
func (c *linClient) seen(s int, events []itx.Event) []linSeen {
	var out []linSeen
	for _, e := range events {
		b := c.h.lookup(e)
		if b < 0 {
			c.h.fail("client %d: %s read an event at %d that no client sent: %+v", c.id, linPath(s), e.Offset, e)
			return nil
		}
		out = append(out, linSeen{e.Offset, b})
	}
	return out
}

func (c *linClient) describe(s int) {
	ctx, cancel := c.ctx()
	defer cancel()
	op := porcupine.Operation{ClientId: c.id + 1, Input: linReadIn{stream: s, kind: linDescribe}, Call: c.h.now()}
	info, err := client.Describe(ctx, c.stream[s])
	if err != nil {
		if !c.lost(err) {
			c.h.fail("client %d: describe %s: %v", c.id, linPath(s), err)
		}
		return
	}
	op.Output = linReadOut{maxOffset: info.HeadOffset}
	op.Return = c.h.now()
	c.h.record(op)
	c.heads[s] = max(c.heads[s], info.HeadOffset)
}

func (c *linClient) reader(s int) {
	in := linReaderIn{stream: s, reader: c.rng.IntN(linReaders)}
	switch r := c.rng.IntN(10); {
	case r < 5:
		in.op = "register"
		in.checkpoint = c.rng.Int64N(c.heads[s] + 1)
		if c.rng.IntN(6) == 0 {
			in.checkpoint = c.heads[s] + 1 + int64(c.rng.IntN(3)) // perhaps past the head
		}
	case r < 7:
		in.op = "remove"
	default:
		in.op = "list"
	}
	name := fmt.Sprintf("r%d", in.reader)
	ctx, cancel := c.ctx()
	defer cancel()
	op := porcupine.Operation{ClientId: c.id + 1, Input: in, Call: c.h.now()}
	var err error
	var out linReaderOut
	switch in.op {
	case "register":
		err = client.RegisterReader(ctx, c.readers[s], name, in.checkpoint)
	case "remove":
		err = client.RemoveReader(ctx, c.readers[s], name)
	default:
		var list []itx.ReaderInfo
		list, err = client.ListReaders(ctx, c.readers[s])
		out.listed = map[int][2]int64{}
		for _, r := range list {
			var i int
			if _, serr := fmt.Sscanf(r.Name, "r%d", &i); serr != nil || i < 0 || i >= linReaders {
				c.h.fail("client %d: %s lists a reader nobody registered: %+v", c.id, linPath(s), r)
				return
			}
			out.listed[i] = [2]int64{r.Checkpoint, r.Lag}
		}
	}
	if err != nil {
		if c.lost(err) {
			if in.op == "list" {
				return
			}
			op.Output = linReaderOut{unknown: true}
			c.finish(op, true)
			return
		}
		switch code := itx.ErrorCode(err); {
		case code == itx.EInvalid && in.op == "register", code == itx.ENotFound && in.op == "remove":
			out.code = code
		default:
			c.h.fail("client %d: reader %s %s on %s: %v", c.id, in.op, name, linPath(s), err)
			return
		}
	}
	op.Output = out
	c.finish(op, false)
}

// connection opens a connection at an offset and records each batch it is delivered until it
// has caught up with the head this client knew (or for a moment when it knew nothing to wait
// for), then closes it.
func (c *linClient) connection(s int) {
	after := max(0, c.heads[s]-c.rng.Int64N(100))
	if c.rng.IntN(5) == 0 {
		after = c.rng.Int64N(c.heads[s] + 1)
	}
	// Every durable event acknowledged before the open is delivered (an ephemeral one at the
	// head may never be: it is delivered only to connections open when it was appended).
	var target int64
	c.h.mu.Lock()
	for off := range c.h.acked[s] {
		target = max(target, off)
	}
	c.h.mu.Unlock()
	var typ string
	if c.rng.IntN(4) == 0 {
		typ = []string{"lin/a", "lin/b"}[c.rng.IntN(2)]
	}
	includeEphemeral := c.rng.IntN(2) == 0
	ctx, cancel := c.ctx()
	defer cancel()
	var mu sync.Mutex
	last := after
	delivered := map[int64]int{}
	reached := make(chan struct{})
	var once sync.Once
	o := client.ConnectionOptions{After: after, IncludeEphemeral: includeEphemeral}
	if c.rng.IntN(3) == 0 {
		o.MaxDeliveryEvents = 1 + c.rng.IntN(50)
	}
	if typ != "" {
		o.Types = []string{typ}
	}
	conn, err := client.OpenConnection(ctx, c.stream[s], o, client.ConnectionHandler{
		Deliver: func(_ context.Context, b itx.DeliveryBatch) error {
			mu.Lock()
			defer mu.Unlock()
			if len(b.Events) == 0 {
				c.h.fail("client %d: a connection on %s delivered an empty batch", c.id, linPath(s))
				return nil
			}
			events := c.seen(s, b.Events)
			if events == nil {
				return nil
			}
			in := linReadIn{stream: s, kind: linDelivered, after: last, typ: typ, includeEphemeral: true}
			// The events were committed before they were pushed, and the log only grows: it
			// holds them when the batch arrives, an instant that pins the operation down.
			at := c.h.now()
			c.h.record(porcupine.Operation{ClientId: c.id + 1, Input: in, Call: at, Output: linReadOut{events: events}, Return: at})
			for _, e := range events {
				delivered[e.offset] = e.body
			}
			last = b.Events[len(b.Events)-1].Offset
			if last >= target {
				once.Do(func() { close(reached) })
			}
			return nil
		},
	})
	if err != nil {
		if !c.lost(err) {
			c.h.fail("client %d: open a connection on %s after %d: %v", c.id, linPath(s), after, err)
		}
		return
	}
	opened := c.h.now()
	defer conn.Close(context.Background())
	// An ephemeral event appended while the connection is open reaches it ("those appended
	// while it is open always arrive"): each one whose append was sent after the open was
	// answered, at or below what the connection delivered, must be among what it delivered.
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		c.h.mu.Lock()
		defer c.h.mu.Unlock()
		for _, e := range c.h.eph[s] {
			if e.call > opened && e.offset > after && e.offset <= last && (typ == "" || c.h.bodies[e.body].typ == typ) && delivered[e.offset] != e.body {
				c.h.failures = append(c.h.failures, fmt.Sprintf("client %d: a connection on %s opened after %d delivered through %d without the ephemeral event at %d, appended while it was open",
					c.id, linPath(s), after, last, e.offset))
			}
		}
	}()
	wait := time.NewTimer(time.Duration(50+c.rng.IntN(250)) * time.Millisecond)
	defer wait.Stop()
	if target > after && typ == "" {
		wait.Reset(20 * time.Second) // caught up by then, or a failure
	}
	select {
	case <-reached:
	case <-wait.C:
		if target > after && typ == "" {
			select {
			case <-c.gen.dead:
			default:
				mu.Lock()
				c.h.fail("client %d: a connection on %s after %d delivered through %d in 20 s, the head was at least %d", c.id, linPath(s), after, last, target)
				mu.Unlock()
			}
		}
	case <-conn.Done():
		var why *client.ConnectionClosed
		if errors.As(conn.Err(), &why) && why.Why != schema.CloseReason_connectionLost && why.Why != schema.CloseReason_serverShuttingDown {
			c.h.fail("client %d: a connection on %s ended: %v", c.id, linPath(s), conn.Err())
		}
		c.lost(itx.Errorf(itx.EDisconnected, "connection ended"))
	}
}

// linModel is the sequential specification of one stream.
func linModel(h *linHistory) porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			by := map[int][]porcupine.Operation{}
			for _, op := range history {
				s := linStreamOf(op.Input)
				by[s] = append(by[s], op)
			}
			keys := make([]int, 0, len(by))
			for k := range by {
				keys = append(keys, k)
			}
			sort.Ints(keys)
			var out [][]porcupine.Operation
			for _, k := range keys {
				out = append(out, by[k])
			}
			return out
		},
		Init: func() []any { return []any{&linState{readers: [linReaders]int64{-1, -1}}} },
		Step: func(state, input, output any) []any {
			return linStep(h, state.(*linState), input, output)
		},
		Equal: func(a, b any) bool { return a.(*linState).equal(b.(*linState)) },
		Hash:  func(s any) uint64 { return s.(*linState).hash() },
		DescribeOperation: func(input, output any) string {
			return linOpString(h, input, output)
		},
		DescribeState: func(s any) string { return s.(*linState).String() },
	}
	return nm.ToModel()
}

// linNode is one row of the modelled log, newest first (states share their older rows).
type linNode struct {
	prev   *linNode
	offset int64
	body   int
	sum    uint64 // a hash of the log through this row
}

type linState struct {
	top     *linNode
	readers [linReaders]int64 // -1: not registered
}

func (s *linState) head() int64 {
	if s.top == nil {
		return 0
	}
	return s.top.offset
}

func (s *linState) hash() uint64 {
	h := uint64(0)
	if s.top != nil {
		h = s.top.sum
	}
	for _, r := range s.readers {
		h = h*1099511628211 + uint64(r+2)
	}
	return h
}

func (s *linState) equal(o *linState) bool {
	if s.readers != o.readers || s.head() != o.head() || s.hash() != o.hash() {
		return false
	}
	for a, b := s.top, o.top; a != b; a, b = a.prev, b.prev {
		if a == nil || b == nil || a.body != b.body || a.offset != b.offset {
			return false
		}
	}
	return true
}

func (s *linState) String() string {
	var rows []string
	for n := s.top; n != nil && len(rows) < 12; n = n.prev {
		rows = append(rows, fmt.Sprintf("%d:b%d", n.offset, n.body))
	}
	slices.Reverse(rows)
	return fmt.Sprintf("head %d readers %v [... %s]", s.head(), s.readers, strings.Join(rows, " "))
}

func (s *linState) push(body int) *linState {
	sum := uint64(14695981039346656037)
	if s.top != nil {
		sum = s.top.sum
	}
	off := s.head() + 1
	sum = (sum ^ uint64(body+1)) * 1099511628211
	sum = (sum ^ uint64(off)) * 1099511628211
	return &linState{top: &linNode{prev: s.top, offset: off, body: body, sum: sum}, readers: s.readers}
}

// find returns the row holding a body with key, or nil.
func (s *linState) find(bodies []linBody, key string) *linNode {
	for n := s.top; n != nil; n = n.prev {
		if bodies[n.body].key == key {
			return n
		}
	}
	return nil
}

// rows returns the rows with after < offset <= upTo, oldest first.
func (s *linState) rows(after, upTo int64) []*linNode {
	var out []*linNode
	for n := s.top; n != nil && n.offset > after; n = n.prev {
		if n.offset <= upTo {
			out = append(out, n)
		}
	}
	slices.Reverse(out)
	return out
}

// apply is an append call on the model: the state after it and its answer.
func (s *linState) apply(bodies []linBody, in linAppendIn) (*linState, linAppendOut) {
	if in.bad {
		return s, linAppendOut{code: itx.EInvalid}
	}
	next := s
	out := linAppendOut{offsets: make([]int64, len(in.bodies)), duplicate: make([]bool, len(in.bodies))}
	fresh := 0
	for j, id := range in.bodies {
		b := bodies[id]
		if b.key != "" {
			if n := next.find(bodies, b.key); n != nil {
				if n.body != id {
					return s, linAppendOut{code: itx.EIdempotencyConflict}
				}
				out.offsets[j], out.duplicate[j] = n.offset, true
				continue
			}
		}
		next = next.push(id)
		out.offsets[j] = next.head()
		fresh++
	}
	if fresh > 0 && in.conditional && in.expected != s.head() {
		return s, linAppendOut{code: itx.EOffsetConflict}
	}
	out.head = next.head()
	return next, out
}

func linStep(h *linHistory, s *linState, input, output any) []any {
	switch in := input.(type) {
	case linAppendIn:
		out := output.(linAppendOut)
		next, want := s.apply(h.bodies, in)
		if out.unknown {
			if want.code == "" && next != s {
				return []any{next, s}
			}
			return []any{s}
		}
		if out.code != want.code {
			return nil
		}
		if out.code != "" {
			return []any{s}
		}
		if out.head != want.head || !slices.Equal(out.offsets, want.offsets) || !slices.Equal(out.duplicate, want.duplicate) {
			return nil
		}
		return []any{next}
	case linReadIn:
		if linReadHolds(h, s, in, output.(linReadOut)) {
			return []any{s}
		}
		return nil
	case linReaderIn:
		out := output.(linReaderOut)
		var next *linState
		var code itx.Code
		switch in.op {
		case "register":
			if in.checkpoint > s.head() {
				code = itx.EInvalid
			} else {
				next = &linState{top: s.top, readers: s.readers}
				next.readers[in.reader] = in.checkpoint
			}
		case "remove":
			if s.readers[in.reader] < 0 {
				code = itx.ENotFound
			} else {
				next = &linState{top: s.top, readers: s.readers}
				next.readers[in.reader] = -1
			}
		case "list":
			for i, cp := range s.readers {
				got, listed := out.listed[i]
				if listed != (cp >= 0) || listed && got != [2]int64{cp, s.head() - cp} {
					return nil
				}
			}
			return []any{s}
		}
		if out.unknown {
			if next != nil {
				return []any{next, s}
			}
			return []any{s}
		}
		if out.code != code {
			return nil
		}
		if next == nil {
			return []any{s}
		}
		return []any{next}
	}
	panic(fmt.Sprintf("operation %T", input))
}

// linReadHolds reports whether a read's answer is the model's at state s.
func linReadHolds(h *linHistory, s *linState, in linReadIn, out linReadOut) bool {
	head := s.head()
	switch in.kind {
	case linDescribe:
		return out.maxOffset == head
	case linDelivered:
		if len(out.events) == 0 {
			return false
		}
		last := out.events[len(out.events)-1].offset
		if last > head {
			return false
		}
		ok, _ := linMatch(h, s.rows(in.after, last), in, out.events)
		return ok
	}
	if in.kind == linPage && out.maxOffset != head {
		return false
	}
	upTo := head
	if in.before > 0 && in.before-1 < upTo {
		upTo = in.before - 1
	}
	limit := in.limit
	if limit == 0 {
		limit = itx.MaxPageLimit
	}
	if len(out.events) > limit {
		return false
	}
	if in.after >= upTo {
		return len(out.events) == 0 && (in.kind != linPage || out.nextAfter == max(in.after, upTo))
	}
	ok, rest := linMatch(h, s.rows(in.after, upTo), in, out.events)
	if !ok {
		return false
	}
	size := 0
	for _, e := range out.events {
		b := h.bodies[e.body]
		size += len(b.typ) + len(b.payload) + len(b.metadata) + len(b.key)
	}
	full := len(out.events) == limit || size >= itx.MaxPageBytes // cut: the next page goes on
	if !full && rest {
		return false // a short page left out an event it should have held
	}
	if in.kind == linPage {
		want := upTo
		if full {
			want = out.events[len(out.events)-1].offset
		}
		if out.nextAfter != want {
			return false
		}
	}
	return true
}

// linMatch walks the model's rows against the events read, in order: each event read must be
// the next row it may be (of its type filter; an ephemeral row only when asked for, and then
// perhaps swept), and no durable row it must hold may be passed over. rest reports whether a
// row the read should have held is left after the last event read.
func linMatch(h *linHistory, rows []*linNode, in linReadIn, got []linSeen) (ok, rest bool) {
	i := 0
	for _, n := range rows {
		b := h.bodies[n.body]
		if in.typ != "" && b.typ != in.typ {
			continue
		}
		if b.ephemeral && !in.includeEphemeral {
			continue
		}
		if i < len(got) && got[i].offset == n.offset {
			if got[i].body != n.body {
				return false, false
			}
			i++
			continue
		}
		if b.ephemeral {
			continue // swept, or (on a connection) appended before it opened
		}
		if i < len(got) {
			return false, false // a durable row passed over
		}
		return true, true
	}
	return i == len(got), false
}

func linOpString(h *linHistory, input, output any) string {
	switch in := input.(type) {
	case linAppendIn:
		out := output.(linAppendOut)
		var bs []string
		for _, id := range in.bodies {
			b := h.bodies[id]
			d := fmt.Sprintf("b%d", id)
			if b.key != "" {
				d += "[" + b.key + "]"
			}
			if b.ephemeral {
				d += "~"
			}
			bs = append(bs, d)
		}
		cond := ""
		if in.conditional {
			cond = fmt.Sprintf(" if head=%d", in.expected)
		}
		if in.bad {
			cond += " +bad"
		}
		switch {
		case out.unknown:
			return fmt.Sprintf("append(%s)%s -> ?", strings.Join(bs, ","), cond)
		case out.code != "":
			return fmt.Sprintf("append(%s)%s -> %s", strings.Join(bs, ","), cond, out.code)
		}
		return fmt.Sprintf("append(%s)%s -> %v dup %v head %d", strings.Join(bs, ","), cond, out.offsets, out.duplicate, out.head)
	case linReadIn:
		out := output.(linReadOut)
		var es []string
		for _, e := range out.events {
			es = append(es, fmt.Sprintf("%d:b%d", e.offset, e.body))
		}
		switch in.kind {
		case linDescribe:
			return fmt.Sprintf("describe -> head %d", out.maxOffset)
		case linDelivered:
			return fmt.Sprintf("delivered after %d type %q -> %s", in.after, in.typ, strings.Join(es, " "))
		}
		return fmt.Sprintf("%s(after %d before %d limit %d type %q eph %v) -> [%s] max %d next %d",
			[]string{"page", "events"}[in.kind], in.after, in.before, in.limit, in.typ, in.includeEphemeral, strings.Join(es, " "), out.maxOffset, out.nextAfter)
	case linReaderIn:
		return fmt.Sprintf("reader %s r%d %d -> %+v", in.op, in.reader, in.checkpoint, output)
	}
	return fmt.Sprintf("%v -> %v", input, output)
}

// linDiagnose logs where the longest linearization porcupine found stops: the model's state
// there and the first operations it could not place, each with whether the model takes it from
// that state.
func linDiagnose(t *testing.T, h *linHistory, model porcupine.Model, part []porcupine.Operation, info porcupine.LinearizationInfo) {
	var longest []porcupine.Operation
	for _, p := range info.PartialLinearizationsOperations() {
		for _, l := range p {
			if len(l) > len(longest) {
				longest = l
			}
		}
	}
	state := model.Init()
	placed := map[int64]map[int64]bool{} // call -> return: operations are told apart by their times
	for _, op := range longest {
		_, state = model.Step(state, op.Input, op.Output)
		if placed[op.Call] == nil {
			placed[op.Call] = map[int64]bool{}
		}
		placed[op.Call][op.Return] = true
	}
	t.Logf("the longest linearization places %d of %d operations; the model's state then: %s", len(longest), len(part), model.DescribeState(state))
	var rest []porcupine.Operation
	for _, op := range part {
		if !placed[op.Call][op.Return] {
			rest = append(rest, op)
		}
	}
	sort.Slice(rest, func(i, j int) bool { return rest[i].Call < rest[j].Call })
	for i, op := range rest {
		if i == 12 {
			break
		}
		ok, _ := model.Step(state, op.Input, op.Output)
		t.Logf("  unplaced [%v..%v] client %d: %s (the model takes it there: %v)", time.Duration(op.Call), time.Duration(op.Return), op.ClientId, linOpString(h, op.Input, op.Output), ok)
	}
}

// linDirect checks what can be checked without a search, and names the operations at fault:
// one body per offset across every answer and read, each read's events against that log, and
// heads in real time (an append answered before a read began is in the read's head; a read
// answered before an append began does not hold it).
func linDirect(h *linHistory, part []porcupine.Operation) []string {
	var out []string
	report := func(format string, args ...any) {
		if len(out) < 20 {
			out = append(out, fmt.Sprintf(format, args...))
		}
	}
	truth := map[int64]int{}
	from := map[int64]porcupine.Operation{}
	note := func(off int64, body int, op porcupine.Operation) {
		if was, ok := truth[off]; ok && was != body {
			report("offset %d holds b%d for %s [%v..%v] and b%d for %s [%v..%v]", off, was, linOpString(h, from[off].Input, from[off].Output),
				time.Duration(from[off].Call), time.Duration(from[off].Return), body, linOpString(h, op.Input, op.Output), time.Duration(op.Call), time.Duration(op.Return))
			return
		}
		truth[off], from[off] = body, op
	}
	type mark struct {
		at, off int64
		op      porcupine.Operation
	}
	var acked []mark // each answered append's highest offset, by its return
	var began []mark // each answered append's lowest new offset, by its call
	var heads []mark // each page and describe's head
	for _, op := range part {
		switch in := op.Input.(type) {
		case linAppendIn:
			o := op.Output.(linAppendOut)
			if o.unknown || o.code != "" {
				continue
			}
			lowest := int64(-1)
			for j, off := range o.offsets {
				note(off, in.bodies[j], op)
				if !o.duplicate[j] && (lowest < 0 || off < lowest) {
					lowest = off
				}
			}
			acked = append(acked, mark{op.Return, slices.Max(o.offsets), op})
			if lowest > 0 {
				began = append(began, mark{op.Call, lowest, op})
			}
		case linReadIn:
			o := op.Output.(linReadOut)
			for _, e := range o.events {
				note(e.offset, e.body, op)
			}
			if in.kind == linPage || in.kind == linDescribe {
				heads = append(heads, mark{op.Call, o.maxOffset, op})
			}
		}
	}
	sort.Slice(acked, func(i, j int) bool { return acked[i].at < acked[j].at })
	sort.Slice(heads, func(i, j int) bool { return heads[i].at < heads[j].at })
	i := 0
	var best mark
	for _, r := range heads {
		for i < len(acked) && acked[i].at < r.at {
			if acked[i].off > best.off {
				best = acked[i]
			}
			i++
		}
		if r.off < best.off {
			report("%s [%v..%v] began after %s [%v..%v] was answered", linOpString(h, r.op.Input, r.op.Output), time.Duration(r.op.Call), time.Duration(r.op.Return),
				linOpString(h, best.op.Input, best.op.Output), time.Duration(best.op.Call), time.Duration(best.op.Return))
		}
	}
	// A read answered before an append began cannot hold the append's offsets.
	sort.Slice(began, func(i, j int) bool { return began[i].at < began[j].at })
	for _, r := range heads {
		k := sort.Search(len(began), func(k int) bool { return began[k].at > r.op.Return })
		for _, a := range began[k:] {
			if a.off <= r.off {
				report("%s [%v..%v] holds offset %d, which %s [%v..%v] appended after it was answered", linOpString(h, r.op.Input, r.op.Output), time.Duration(r.op.Call), time.Duration(r.op.Return),
					a.off, linOpString(h, a.op.Input, a.op.Output), time.Duration(a.op.Call), time.Duration(a.op.Return))
				break
			}
		}
	}
	// Each read against the one log: an offset nobody saw is taken for a swept ephemeral row.
	var top *linNode
	offs := make([]int64, 0, len(truth))
	for off := range truth {
		offs = append(offs, off)
	}
	sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
	for _, off := range offs {
		top = &linNode{prev: top, offset: off, body: truth[off]}
	}
	full := &linState{top: top}
	for _, op := range part {
		in, ok := op.Input.(linReadIn)
		if !ok || in.kind == linDescribe {
			continue
		}
		o := op.Output.(linReadOut)
		upTo := int64(1) << 62
		switch in.kind {
		case linPage:
			upTo = o.maxOffset
		case linDelivered:
			upTo = o.events[len(o.events)-1].offset
		}
		if in.before > 0 {
			upTo = min(upTo, in.before-1)
		}
		if ok, _ := linMatch(h, full.rows(in.after, upTo), in, o.events); !ok {
			report("%s [%v..%v] does not match the log the history holds", linOpString(h, op.Input, op.Output), time.Duration(op.Call), time.Duration(op.Return))
		}
	}
	return out
}
