package main

// Processors hosted in a separate program (-remotehost): processors/examples/remotehost runs the
// reference processors (agent, forwarder, router, guestbook) mounted on itxd, placed "remote",
// with the agent's vendor pointed at an HTTP server in this process. With -host-crash-every that
// program is killed with SIGKILL and started again on its own schedule, beside -crash-every's
// kills of itxd. The checks at the end are seed 002's and the agent's promises: every prompt
// ends in exactly one settlement (none for a message retracted before its request), the vendor
// is dialed at most once per request, only after the request's started fact and before its
// expiry, a success carries the vendor's answer, every forward lands exactly once, and each
// processor's snapshot equals its contract's Reduce folded over its log.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/examples"
)

// The remote processors' streams.
const (
	remoteFwdPath    = "/soak/remote/fwd"
	remoteRouterPath = "/soak/remote/router"
	remoteGuestPath  = "/soak/remote/guestbook"
	remoteThreads    = 5 // threads t0..t4 of the router
)

func agentPath(i int) string { return fmt.Sprintf("/soak/remote/agent/%d", i) }

// The vendor's misbehaviour: out of 1,000 calls, this many answer 503 and this many hang until
// the caller gives up (the agent's budget: what is left of the request's expiry less the
// reserve).
const (
	vendorFailPerMille = 50
	vendorHangPerMille = 30
	vendorHangBound    = 10 * time.Minute // a hung call ends by itself after this, whoever waits
)

// vendorCall is one request the vendor received.
type vendorCall struct {
	key, prompt string
	at          time.Time
	status      int    // 200, 503, or 0 when it hung until the caller left
	text        string // the answer given with 200
}

// vendor is the agent's LLM: a real HTTP server taking examples.HTTPVendor's POST {requestId,
// prompt} with the Idempotency-Key header. It records every call it receives.
type vendor struct {
	mu    sync.Mutex
	calls map[string][]vendorCall // by requestId
	bad   []string                // requests it could not read
}

func answerText(requestID, prompt string) string { return "answer to " + requestID + ": " + prompt }

func (v *vendor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	raw, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	var body struct{ RequestID, Prompt string }
	if err == nil {
		err = json.Unmarshal(raw, &body)
	}
	if err != nil || body.RequestID == "" {
		v.mu.Lock()
		v.bad = append(v.bad, fmt.Sprintf("%v: %q", err, raw))
		v.mu.Unlock()
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	call := vendorCall{key: r.Header.Get("Idempotency-Key"), prompt: body.Prompt, at: at}
	fate := rand.IntN(1000)
	switch {
	case fate < vendorFailPerMille:
		call.status = http.StatusServiceUnavailable
	case fate < vendorFailPerMille+vendorHangPerMille:
		// status 0: hung; recorded before it hangs, so a call whose caller is killed counts.
	default:
		call.status, call.text = http.StatusOK, answerText(body.RequestID, body.Prompt)
	}
	v.mu.Lock()
	v.calls[body.RequestID] = append(v.calls[body.RequestID], call)
	v.mu.Unlock()
	switch call.status {
	case 0:
		t := time.NewTimer(vendorHangBound)
		defer t.Stop()
		select {
		case <-r.Context().Done():
		case <-t.C:
		}
		http.Error(w, "hung", http.StatusGatewayTimeout)
	case http.StatusServiceUnavailable:
		http.Error(w, "overloaded", call.status)
	default:
		// A little latency, so kills land during calls too.
		t := time.NewTimer(time.Duration(rand.IntN(300)) * time.Millisecond)
		defer t.Stop()
		select {
		case <-r.Context().Done():
		case <-t.C:
		}
		json.NewEncoder(w).Encode(map[string]string{"text": call.text})
	}
}

// remoteHost is the remotehost process: started, and with -host-crash-every killed with SIGKILL
// and started again.
type remoteHost struct {
	bin  string
	args []string
	log  *os.File

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	killing bool
	starts  atomic.Int64
	kills   atomic.Int64
}

func (h *remoteHost) start() error {
	cmd := exec.Command(h.bin, h.args...)
	cmd.Stdout, cmd.Stderr = h.log, h.log
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	h.mu.Lock()
	h.cmd, h.exited, h.killing = cmd, exited, false
	h.mu.Unlock()
	h.starts.Add(1)
	go func() {
		err := cmd.Wait()
		h.mu.Lock()
		killed := h.killing && h.cmd == cmd
		h.mu.Unlock()
		if !killed {
			fail("remotehost exited on its own: %v (its log: %s)", err, h.log.Name())
		}
		close(exited)
	}()
	return nil
}

// kill ends the process with SIGKILL and waits for it.
func (h *remoteHost) kill() {
	h.mu.Lock()
	cmd, exited := h.cmd, h.exited
	h.killing = true
	h.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// agentLog is what the load knows of one agent stream: the prompts and retractions it had
// acknowledged.
type agentLog struct {
	path      string
	mu        sync.Mutex
	prompts   map[int64]bool // offsets of acknowledged agent/message-added
	retracted map[int64]bool // message offsets whose retraction was acknowledged
}

// remoteLoad is the load on the remote processors and what it needs to check them.
type remoteLoad struct {
	host     *remoteHost
	vendor   *vendor
	agents   []*agentLog
	agentCfg examples.AgentConfig
	appended atomic.Int64 // events acknowledged on the remote processors' streams
}

// startRemote starts the vendor and remotehost and configures the remote subscriptions.
func startRemote(ctx context.Context, setup *session, addr, token, bin, vendorListen, logPath string, agents int, hesitation, expiry time.Duration) *remoteLoad {
	v := &vendor{calls: map[string][]vendorCall{}}
	ln, err := net.Listen("tcp", vendorListen)
	must(err, "vendor listener")
	go http.Serve(ln, v)
	logFile, err := os.Create(logPath)
	must(err, "remotehost log")
	cfg := examples.DefaultAgentConfig
	cfg.HesitationMs, cfg.ExpiryMs = hesitation.Milliseconds(), expiry.Milliseconds()
	rl := &remoteLoad{vendor: v, agentCfg: cfg, host: &remoteHost{bin: bin, log: logFile, args: []string{
		"--addr", addr, "--token", token, "--name", "soak-host", "--processors", strings.Join(examples.Names, ","),
		"--agent-vendor-url", "http://" + ln.Addr().String() + "/complete",
		"--agent-hesitation", hesitation.String(), "--agent-expiry", expiry.String()}}}
	configure := func(path, name string) {
		_, _, err := client.ConfigureSubscription(ctx, client.Subscriptions(ctx, setup.stream(ctx, path)), client.SubscriptionConfig{Name: name,
			Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Placement: "remote"}})
		must(err, "configure remote "+name+" on "+path)
	}
	for i := range agents {
		rl.agents = append(rl.agents, &agentLog{path: agentPath(i), prompts: map[int64]bool{}, retracted: map[int64]bool{}})
		configure(agentPath(i), "agent")
	}
	configure(remoteFwdPath, "forwarder")
	configure(remoteRouterPath, "router")
	configure(remoteGuestPath, "guestbook")
	must(rl.host.start(), "start remotehost")
	return rl
}

// crashLoop kills remotehost with SIGKILL every `every` (give or take a fifth) and starts it
// again after a pause of up to a second, until ctx ends; it leaves the host running.
func (rl *remoteLoad) crashLoop(ctx context.Context, every time.Duration) {
	for {
		jitter := time.Duration(rand.Int64N(int64(every)/5+1)) - every/10
		if client.Sleep(ctx, every+jitter) != nil {
			return
		}
		rl.host.kill()
		rl.host.kills.Add(1)
		client.Sleep(ctx, time.Duration(rand.IntN(1000))*time.Millisecond) // a host down a while: its subscriptions park
		if err := rl.host.start(); err != nil {
			fail("restart remotehost: %v", err)
			return
		}
	}
}

// appendKeyed appends events that all carry idempotency keys, sending them again on a new
// session after a failure (with -crash-every, itxd may have been killed; the keys make the
// retry's answer the original offsets). It returns false once ctx ends.
func appendKeyed(ctx context.Context, redial func(context.Context) *session, s **session, crashing bool, path string, events []itx.EventInput) (itx.AppendResult, bool) {
	for {
		if *s == nil {
			if *s = redial(ctx); *s == nil {
				return itx.AppendResult{}, false
			}
		}
		r, err := client.Append(ctx, (*s).stream(ctx, path), events, itx.AppendOptions{})
		if err == nil {
			return r, true
		}
		if over(ctx) {
			return itx.AppendResult{}, false
		}
		lost(crashing, err, "append to %s", path)
		if !crashing {
			return itx.AppendResult{}, false
		}
		(*s).close()
		*s = nil
	}
}

// promptLoop sends prompts to one agent stream every `every`, retracting about one in ten
// (sometimes at once, sometimes after the next prompt, so the retraction lands before, during or
// after the request).
func (rl *remoteLoad) promptLoop(ctx context.Context, redial func(context.Context) *session, crashing bool, al *agentLog, every time.Duration) {
	var s *session
	defer func() {
		if s != nil {
			s.close()
		}
	}()
	var toRetract []int64
	for i := 0; ; i++ {
		text := fmt.Sprintf("prompt %d to %s", i, al.path)
		r, ok := appendKeyed(ctx, redial, &s, crashing, al.path, []itx.EventInput{examples.MessageAdded.Input(examples.Message{Text: text}, fmt.Sprintf("soak-prompt-%d", i))})
		if !ok {
			return
		}
		rl.appended.Add(1)
		al.mu.Lock()
		al.prompts[r.Offsets[0]] = true
		al.mu.Unlock()
		if i%10 == 3 {
			toRetract = append(toRetract, r.Offsets[0])
		}
		if len(toRetract) > 0 && (i%10 != 3 || rand.IntN(2) == 0) {
			off := toRetract[0]
			toRetract = toRetract[1:]
			if _, ok := appendKeyed(ctx, redial, &s, crashing, al.path, []itx.EventInput{examples.MessageRetracted.Input(examples.MessageRef{MessageOffset: off}, fmt.Sprintf("soak-retract-%d", off))}); !ok {
				return
			}
			rl.appended.Add(1)
			al.mu.Lock()
			al.retracted[off] = true
			al.mu.Unlock()
		}
		if client.Sleep(ctx, every) != nil {
			return
		}
	}
}

// feedLoop appends to the remote forwarder's inbox, the router (one message in 13 naming no
// usable thread) and the guestbook, a call of 1-3 events to each every 20 ms.
func (rl *remoteLoad) feedLoop(ctx context.Context, redial func(context.Context) *session, crashing bool) {
	var s *session
	defer func() {
		if s != nil {
			s.close()
		}
	}()
	for i := 0; ; i++ {
		for _, path := range []string{remoteFwdPath, remoteRouterPath, remoteGuestPath} {
			events := make([]itx.EventInput, 1+rand.IntN(3))
			for j := range events {
				key := fmt.Sprintf("soak-%d-%d", i, j)
				switch path {
				case remoteFwdPath:
					events[j] = examples.InboxMessage.Input(json.RawMessage(fmt.Sprintf(`{"i":%d,"j":%d}`, i, j)), key)
				case remoteRouterPath:
					thread := fmt.Sprintf("t%d", (i+j)%remoteThreads)
					if (i*3+j)%13 == 0 {
						thread = "no/such"
					}
					events[j] = examples.RouterMessage.Input(examples.Routed{Thread: thread, Text: key}, key)
				case remoteGuestPath:
					events[j] = examples.GuestbookSigned.Input(examples.Signed{Name: fmt.Sprintf("guest %d", j), Message: key}, key)
				}
			}
			if _, ok := appendKeyed(ctx, redial, &s, crashing, path, events); !ok {
				return
			}
			rl.appended.Add(int64(len(events)))
		}
		if client.Sleep(ctx, 20*time.Millisecond) != nil {
			return
		}
	}
}

// foldCheck compares a processor's snapshot with c's Reduce folded over the consumed (and
// valid) events of its log through the snapshot's reduced offset, and says the last consumed
// offset of the log, which the snapshot must have reduced.
func foldCheck[S any](c processors.Contract[S], events []itx.Event, snap client.ProcessorSnapshot) error {
	consumed := map[string]bool{}
	for _, t := range c.ConsumedTypes {
		consumed[t] = true
	}
	st, last := c.InitialState(), int64(0)
	for _, e := range events {
		if !consumed[e.Type] || (c.Validate != nil && c.Validate(e) != nil) {
			continue
		}
		last = e.Offset
		if e.Offset <= snap.ReducedOffset {
			st = c.Reduce(st, e)
		}
	}
	if snap.ReducedOffset < last {
		return fmt.Errorf("snapshot reduced through %d, the log's last consumed event is %d", snap.ReducedOffset, last)
	}
	want, err := json.Marshal(st)
	if err != nil {
		return err
	}
	var got S
	if err := json.Unmarshal([]byte(snap.State), &got); err != nil {
		return fmt.Errorf("snapshot state does not decode: %w", err)
	}
	gotJSON, _ := json.Marshal(got)
	if !bytes.Equal(gotJSON, want) {
		return fmt.Errorf("snapshot %.300s, fold %.300s", gotJSON, want)
	}
	return nil
}

// remoteSub is one remote processor-wake subscription and its snapshot check.
type remoteSub struct {
	path, name string
	check      func(events []itx.Event, snap client.ProcessorSnapshot) error
}

// verifyRemote waits for the remote processors to finish their work and checks it.
func (rl *remoteLoad) verify(addr, token string, expiry time.Duration) {
	ctx := context.Background()
	conn, err := client.Dial(ctx, addr)
	must(err, "dial to check the remote processors")
	defer conn.Close()
	project := conn.Login(ctx, token)
	defer project.Release()
	readAll := func(path string) []itx.Event {
		st := client.Stream(ctx, project, path)
		defer st.Release()
		events, err := client.ReadAll(ctx, st, itx.Query{})
		must(err, "read "+path)
		return events
	}
	agentContract := examples.Agent(itx.SystemClock{}, nil, rl.agentCfg)
	subs := []remoteSub{
		{remoteFwdPath, "forwarder", func(ev []itx.Event, s client.ProcessorSnapshot) error { return foldCheck(examples.Forwarder(), ev, s) }},
		{remoteRouterPath, "router", func(ev []itx.Event, s client.ProcessorSnapshot) error { return foldCheck(examples.Router(), ev, s) }},
		{remoteGuestPath, "guestbook", func(ev []itx.Event, s client.ProcessorSnapshot) error { return foldCheck(examples.Guestbook(), ev, s) }},
	}
	for _, al := range rl.agents {
		subs = append(subs, remoteSub{al.path, "agent", func(ev []itx.Event, s client.ProcessorSnapshot) error { return foldCheck(agentContract, ev, s) }})
	}

	// Every agent prompt settles within its expiry (a hung vendor call ends at the budget, an
	// orphan is settled at the next caught-up pass): wait for that, on the log.
	deadline := time.Now().Add(expiry + 3*time.Minute)
	for {
		open, where, head := 0, "", int64(0)
		for _, al := range rl.agents {
			events := readAll(al.path)
			if n := len(openObligations(events)); n > 0 && open == 0 {
				where, head = al.path, events[len(events)-1].Offset
			}
			open += len(openObligations(events))
		}
		if open == 0 {
			break
		}
		if time.Now().After(deadline) {
			fail("agents: %d prompts still without their outcome %v after the load (first on %s)", open, expiry+3*time.Minute, where)
			break
		}
		st := client.Stream(ctx, project, where)
		client.WaitForEvent(ctx, st, itx.Predicate{Types: []string{string(examples.LLMSettled), string(examples.LLMRequested)}}, head, 15*time.Second)
		st.Release()
	}

	// Then every remote processor catches up with its stream's head, is active, and its
	// snapshot is the fold of its log.
	folded, caughtUp := 0, 0
	for _, rs := range subs {
		st := client.Stream(ctx, project, rs.path)
		info, err := client.Describe(ctx, st)
		must(err, "describe "+rs.path)
		sub := client.Subscription(ctx, st, rs.name)
		if _, err := client.WaitUntilProcessed(ctx, sub, info.HeadOffset, 5*time.Minute); err != nil {
			fail("remote %s on %s did not reach %d: %v", rs.name, rs.path, info.HeadOffset, err)
		}
		d, err := client.DescribeSubscription(ctx, sub)
		if err != nil {
			fail("describe remote %s on %s: %v", rs.name, rs.path, err)
		} else if d.Status != itx.StatusActive || d.ConfirmedOffset < info.HeadOffset {
			fail("remote %s on %s: status %s, confirmed %d of head %d, last error %q", rs.name, rs.path, d.Status, d.ConfirmedOffset, info.HeadOffset, d.LastError)
		} else {
			caughtUp++
		}
		proc := client.Processor(ctx, sub)
		snap, err := client.Snapshot(ctx, proc)
		if err != nil {
			fail("snapshot of remote %s on %s: %v", rs.name, rs.path, err)
		} else if err := rs.check(readAll(rs.path), snap); err != nil {
			fail("remote %s on %s: snapshot is not the fold of its log: %v", rs.name, rs.path, err)
		} else {
			folded++
		}
		if rt, err := client.RuntimeState(ctx, proc); err != nil {
			fail("runtime state of remote %s on %s: %v", rs.name, rs.path, err)
		} else {
			var r itx.ProcessorRuntimeState
			if json.Unmarshal([]byte(rt), &r) != nil || r.Fenced != "" || r.ProcessedThrough < info.HeadOffset {
				fail("remote %s on %s: runtime state %s, head %d", rs.name, rs.path, rt, info.HeadOffset)
			}
		}
		proc.Release()
		sub.Release()
		st.Release()
	}
	fmt.Printf("remote processors: %d of %d active and confirmed through their stream's head; %d of %d snapshots equal their contract's fold of the log\n", caughtUp, len(subs), folded, len(subs))

	rl.verifyAgents(readAll)
	rl.verifyForwards(readAll)
	fmt.Printf("remotehost: %d starts, %d SIGKILLs\n", rl.host.starts.Load(), rl.host.kills.Load())
}

// openObligations lists the prompts of an agent log that have not reached their outcome yet: a
// message not retracted without a settlement, or a request (of a retracted message) without one.
func openObligations(events []itx.Event) []string {
	retracted, settled, requested := map[int64]bool{}, map[string]bool{}, map[string]bool{}
	var messages []int64
	for _, e := range events {
		switch e.Type {
		case string(examples.MessageAdded):
			messages = append(messages, e.Offset)
		case string(examples.MessageRetracted):
			r, _ := examples.MessageRetracted.Decode(e)
			retracted[r.MessageOffset] = true
		case string(examples.LLMRequested):
			r, _ := examples.LLMRequested.Decode(e)
			requested[r.RequestID] = true
		case string(examples.LLMSettled):
			s, _ := examples.LLMSettled.Decode(e)
			settled[s.RequestID] = true
		}
	}
	var open []string
	for _, m := range messages {
		id := fmt.Sprintf("msg-%d", m)
		if !settled[id] && (!retracted[m] || requested[id]) {
			open = append(open, id)
		}
	}
	return open
}

// verifyAgents checks every agent stream's log against the prompts acknowledged and the calls
// the vendor received.
func (rl *remoteLoad) verifyAgents(readAll func(string) []itx.Event) {
	type obligation struct {
		message, retracted bool
		text               string // the message's
		messageAt          int64  // the message's createdAt
		requested, started int
		retractedOffset    int64 // the retraction's offset
		requestedOffset    int64 // the request's offset
		request            examples.LLMRequest
		settled            []examples.Result
		settledAt          int64
		startedAt          int64
	}
	outcomes := map[string]int{}
	var prompts, retractions, requests, missing, revived, lateSuccess int
	otherReasons := map[string]int{}
	wrongObligations, wrongCalls := 0, 0
	// The first 20 of each kind are printed; every one fails the soak.
	agentFail := func(format string, args ...any) {
		if wrongObligations++; wrongObligations <= 20 {
			fail(format, args...)
		}
		failed.Store(true)
	}
	vendorFail := func(format string, args ...any) {
		if wrongCalls++; wrongCalls <= 20 {
			fail(format, args...)
		}
		failed.Store(true)
	}
	all := map[string]*obligation{} // by requestId, across streams (the vendor keys by requestId alone)
	streamOf := map[string]string{}
	for _, al := range rl.agents {
		events := readAll(al.path)
		obs := map[string]*obligation{}
		ob := func(id string) *obligation {
			if obs[id] == nil {
				obs[id] = &obligation{}
			}
			return obs[id]
		}
		stored := map[int64]bool{}
		for _, e := range events {
			stored[e.Offset] = true
			switch e.Type {
			case string(examples.MessageAdded):
				m, _ := examples.MessageAdded.Decode(e)
				o := ob(fmt.Sprintf("msg-%d", e.Offset))
				o.message, o.text, o.messageAt = true, m.Text, e.CreatedAt
			case string(examples.MessageRetracted):
				r, _ := examples.MessageRetracted.Decode(e)
				o := ob(fmt.Sprintf("msg-%d", r.MessageOffset))
				o.retracted, o.retractedOffset = true, e.Offset
			case string(examples.LLMRequested):
				r, _ := examples.LLMRequested.Decode(e)
				o := ob(r.RequestID)
				o.requested++
				o.request, o.requestedOffset = r, e.Offset
			case string(examples.LLMStarted):
				r, _ := examples.LLMStarted.Decode(e)
				o := ob(r.RequestID)
				o.started++
				o.startedAt = e.CreatedAt
			case string(examples.LLMSettled):
				s, _ := examples.LLMSettled.Decode(e)
				ob(s.RequestID).settled = append(ob(s.RequestID).settled, s.Result)
				ob(s.RequestID).settledAt = e.CreatedAt
			case itx.TypeProcessorRevived:
				revived++
			}
		}
		al.mu.Lock()
		for off := range al.prompts {
			if !stored[off] {
				missing++
			}
		}
		prompts += len(al.prompts)
		retractions += len(al.retracted)
		al.mu.Unlock()
		for id, o := range obs {
			where := al.path + " " + id
			switch {
			case !o.message:
				agentFail("agent %s: requested %d, started %d, settled %d times, for no agent/message-added", where, o.requested, o.started, len(o.settled))
				continue
			case o.requested > 1 || o.started > 1 || len(o.settled) > 1:
				agentFail("agent %s: requested %d, started %d, settled %d times (want at most once each)", where, o.requested, o.started, len(o.settled))
			case (o.started > 0 || len(o.settled) > 0) && o.requested == 0:
				agentFail("agent %s: started %d, settled %d times, never requested", where, o.started, len(o.settled))
			case !o.retracted && (o.requested != 1 || len(o.settled) != 1):
				agentFail("agent %s: requested %d, settled %d times (want exactly once)", where, o.requested, len(o.settled))
			case o.retracted && o.requested != len(o.settled):
				agentFail("agent %s (retracted): requested %d, settled %d times", where, o.requested, len(o.settled))
			case !o.retracted && o.settled[0].Kind == examples.ResultCancellation:
				agentFail("agent %s: cancelled, but its message was never retracted", where)
			case o.retracted && o.requested == 1 && o.retractedOffset < o.requestedOffset &&
				(o.started > 0 || o.settled[0].Kind != examples.ResultCancellation):
				// The retraction is in the log before the request (a pass decided on the message
				// while the retraction was landing): the request must never start.
				agentFail("agent %s: retracted at offset %d, requested at %d, then started %d times and settled %+v", where, o.retractedOffset, o.requestedOffset, o.started, o.settled[0])
			}
			if o.requested > 0 {
				requests++
				// The request is a function of its message (seed 002: a per-event append under a
				// key has a deterministic body; the deadline anchored to createdAt).
				want := examples.LLMRequest{RequestID: id, Prompt: o.text,
					ExpiresAt: o.messageAt + rl.agentCfg.HesitationMs + rl.agentCfg.ExpiryMs}
				if o.request != want {
					agentFail("agent %s: requested %+v, want %+v", where, o.request, want)
				}
			}
			if len(o.settled) > 0 {
				class := outcomeClass(o.settled[0])
				outcomes[class]++
				if class == "failure other" {
					otherReasons[o.settled[0].Reason]++
				}
				if o.settled[0].Kind == examples.ResultSuccess && o.settledAt > o.request.ExpiresAt {
					lateSuccess++
				}
			}
			all[id+"@"+al.path] = o
			streamOf[id+"@"+al.path] = al.path
		}
	}
	if missing > 0 {
		fail("agents: %d acknowledged prompts missing from their streams", missing)
	}
	var classes []string
	for c, n := range outcomes {
		classes = append(classes, fmt.Sprintf("%s %d", c, n))
	}
	sort.Strings(classes)
	fmt.Printf("agents: %d streams, %d prompts (%d retracted), %d requests, outcomes: %s; %d obligations wrong; %d successes settled past their expiry; %d stream/processor-revived\n",
		len(rl.agents), prompts, retractions, requests, strings.Join(classes, ", "), wrongObligations, lateSuccess, revived)
	for reason, n := range otherReasons {
		fmt.Printf("  failure other: %d x %.160s\n", n, reason)
	}

	// The vendor: each call belongs to one started request, at most one call per request, with
	// "<stream path>#<request id>" as its Idempotency-Key, before the request's expiry; a success carries the
	// vendor's answer, a 5xx failure follows a 503.
	rl.vendor.mu.Lock()
	defer rl.vendor.mu.Unlock()
	for _, b := range rl.vendor.bad {
		fail("vendor: a request it could not read: %s", b)
	}
	byID := map[string][]vendorCall{}
	for id, calls := range rl.vendor.calls {
		byID[id] = calls
	}
	calls, twice, hung, failed503, answeredNotSuccess := 0, 0, 0, 0, 0
	// The vendor sees request ids, which repeat across agent streams (msg-<offset>): match a
	// call to its stream by its prompt, which names the stream.
	for id, cs := range byID {
		perStream := map[string][]vendorCall{}
		for _, c := range cs {
			calls++
			path := c.prompt[strings.LastIndex(c.prompt, " ")+1:]
			if want := examples.VendorKey(examples.WithVendorScope(context.Background(), path), id); c.key != want {
				fail("vendor: a call for %s of %s carried Idempotency-Key %q, want %q", id, path, c.key, want)
			}
			perStream[path] = append(perStream[path], c)
			switch c.status {
			case 0:
				hung++
			case http.StatusServiceUnavailable:
				failed503++
			}
		}
		for path, cs := range perStream {
			o := all[id+"@"+path]
			where := path + " " + id
			if len(cs) > 1 {
				twice++
				vendorFail("vendor: %s received %d times", where, len(cs))
			}
			if o == nil || o.started == 0 {
				vendorFail("vendor: %s received without a started fact on the stream", where)
				continue
			}
			c := cs[0]
			if c.at.UnixMilli() >= o.request.ExpiresAt {
				vendorFail("vendor: %s received at %d, past its expiry %d", where, c.at.UnixMilli(), o.request.ExpiresAt)
			}
			if c.at.UnixMilli() < o.startedAt {
				vendorFail("vendor: %s received at %d, before its started fact (createdAt %d)", where, c.at.UnixMilli(), o.startedAt)
			}
			if c.prompt != o.request.Prompt {
				vendorFail("vendor: %s received prompt %q, the request's is %q", where, c.prompt, o.request.Prompt)
			}
			if len(o.settled) == 0 {
				continue
			}
			res := o.settled[0]
			switch {
			case res.Kind == examples.ResultSuccess && (c.status != http.StatusOK || res.Text != c.text):
				vendorFail("vendor: %s settled success with %q, the vendor answered %d %q", where, res.Text, c.status, c.text)
			case res.Kind == examples.ResultSuccess:
			case strings.Contains(res.Reason, "vendor answered 503") && c.status != http.StatusServiceUnavailable:
				vendorFail("vendor: %s settled %q, the vendor answered %d", where, res.Reason, c.status)
			case c.status == http.StatusOK:
				answeredNotSuccess++ // the answer died with its host or itxd: orphaned, or past expiry
			}
		}
	}
	for key, o := range all {
		if len(o.settled) > 0 && o.settled[0].Kind == examples.ResultSuccess {
			id := key[:strings.Index(key, "@")]
			found := false
			for _, c := range byID[id] {
				if strings.HasSuffix(c.prompt, " "+streamOf[key]) {
					found = true
				}
			}
			if !found {
				vendorFail("agent %s %s: settled success without a vendor call", streamOf[key], id)
			}
		}
	}
	fmt.Printf("vendor: %d calls for %d request ids, %d received twice, %d wrong; %d answered 503, %d hung until the caller left, %d answered 200 but settled otherwise (their attempt died)\n",
		calls, len(byID), twice, wrongCalls, failed503, hung, answeredNotSuccess)
}

// outcomeClass names a settlement for the summary.
func outcomeClass(r examples.Result) string {
	switch {
	case r.Kind != examples.ResultFailure:
		return r.Kind
	case r.Reason == examples.ReasonExpired:
		return "failure expired"
	case r.Reason == examples.ReasonOrphaned:
		return "failure orphaned"
	case strings.Contains(r.Reason, "vendor answered 503"):
		return "failure vendor 503"
	default:
		return "failure other"
	}
}

// verifyForwards checks the remote forwarder and router: every message forwarded exactly once,
// nothing forwarded that was not a message.
func (rl *remoteLoad) verifyForwards(readAll func(string) []itx.Event) {
	inbox, forwards := 0, map[int64]int{}
	fwdEvents := readAll(remoteFwdPath)
	for _, e := range fwdEvents {
		switch e.Type {
		case string(examples.InboxMessage):
			inbox++
		case string(examples.OutboxForwarded):
			f, _ := examples.OutboxForwarded.Decode(e)
			forwards[f.SourceOffset]++
		}
	}
	wrong := 0
	for _, e := range fwdEvents {
		if e.Type == string(examples.InboxMessage) && forwards[e.Offset] != 1 {
			if wrong++; wrong <= 10 {
				fail("remote forwarder: offset %d forwarded %d times", e.Offset, forwards[e.Offset])
			}
		}
		delete(forwards, e.Offset)
	}
	for off := range forwards {
		wrong++
		fail("remote forwarder: a forward of offset %d, which is no inbox message", off)
	}
	fmt.Printf("remote forwarder: %d inbox messages, %d not forwarded exactly once\n", inbox, wrong)

	routed, unroutable := map[int64]int{}, 0
	for t := range remoteThreads {
		for _, e := range readAll(examples.ThreadPath(remoteRouterPath, fmt.Sprintf("t%d", t))) {
			if e.Type == string(examples.ThreadMessage) {
				f, _ := examples.ThreadMessage.Decode(e)
				routed[f.SourceOffset]++
			}
		}
	}
	messages, wrongRoutes := 0, 0
	for _, e := range readAll(remoteRouterPath) {
		if e.Type != string(examples.RouterMessage) {
			continue
		}
		m, _ := examples.RouterMessage.Decode(e)
		want := 1
		if examples.ThreadPath(remoteRouterPath, m.Thread) == "" {
			want = 0
			unroutable++
		} else {
			messages++
		}
		if routed[e.Offset] != want {
			if wrongRoutes++; wrongRoutes <= 10 {
				fail("remote router: offset %d (thread %q) routed %d times, want %d", e.Offset, m.Thread, routed[e.Offset], want)
			}
		}
		delete(routed, e.Offset)
	}
	for off := range routed {
		wrongRoutes++
		fail("remote router: a thread message from offset %d, which is no router message", off)
	}
	fmt.Printf("remote router: %d messages to %d threads and %d unroutable, %d not routed exactly as often as they should (once; never)\n", messages, remoteThreads, unroutable, wrongRoutes)
}

// raceReported says whether the remotehost's log holds a report of the race detector.
func (h *remoteHost) raceReported() bool {
	b, err := os.ReadFile(h.log.Name())
	return err == nil && bytes.Contains(b, []byte(raceMarker))
}
