// Command populate fills a running itxd with a bit of everything its commit stores (streams,
// idempotency keys, metadata, ephemeral events, subscriptions of every kind at various cursors, a
// halted and a parked one, readers, scheduled appends, projects and scoped tokens) and writes
// what it was acknowledged to expected.json. It is built inside a worktree of an OLD commit
// (gen.sh copies it there), against that commit's client package; the sections between
// "//<TAG>{" and "//}<TAG>" lines are cut by gen.sh for commits without that feature.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
)

// HookAddr is where the webhook subscription posts; the upgrade test listens there.
const HookAddr = "127.0.0.1:47613"

type expected struct {
	Commit        string            `json:"commit"`
	Events        map[string][]ev   `json:"events"` // path in the default project -> every event, ephemeral too
	Heads         map[string]int64  `json:"heads"`
	Subscriptions map[string]sub    `json:"subscriptions"` // on /a
	Readers       map[string]int64  `json:"readers"`       // on /a
	Scheduled     map[string]int64  `json:"scheduled"`     // key -> due, epoch ms, on /a
	HookSecret    string            `json:"hookSecret"`
	Tokens        map[string]string `json:"tokens"` // label -> token
	OtherProject  string            `json:"otherProject"`
	RevokedToken  string            `json:"revokedToken,omitempty"`
	// Trimmed is what /trimmed was trimmed through (its readers: TrimReaders), 0 for a build
	// without Stream.trim.
	Trimmed     int64            `json:"trimmed,omitempty"`
	TrimReaders map[string]int64 `json:"trimReaders,omitempty"`
}

type ev struct {
	Offset    int64           `json:"offset"`
	Type      string          `json:"type"`
	Payload   json.RawMessage `json:"payload"`
	Metadata  json.RawMessage `json:"metadata,omitempty"`
	Key       string          `json:"key,omitempty"`
	Ephemeral bool            `json:"ephemeral,omitempty"`
}

type sub struct {
	Kind      string `json:"kind"`
	Status    string `json:"status"`
	Confirmed int64  `json:"confirmed"`
}

func main() {
	addr := flag.String("addr", "", "itxd address")
	data := flag.String("data", "", "itxd data directory (for credentials.json)")
	commit := flag.String("commit", "", "the commit itxd was built from")
	traffic := flag.Bool("traffic", false, "after expected.json, append keyed events to /a until itxd dies, recording each acknowledged one in acked.jsonl")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	must := func(err error, what string) {
		if err != nil {
			log.Fatalf("%s: %v", what, err)
		}
	}
	b, err := os.ReadFile(filepath.Join(*data, "credentials.json"))
	must(err, "credentials")
	var creds struct{ ProjectToken, DeploymentToken string }
	must(json.Unmarshal(b, &creds), "credentials")

	// The webhook receiver acknowledges until hookOpen is cleared, then answers 503 (an outage:
	// the cursor stays where it was).
	var hookOpen atomic.Bool
	hookOpen.Store(true)
	var mu sync.Mutex
	var hooked []int64
	ln, err := net.Listen("tcp", HookAddr)
	must(err, "listen "+HookAddr)
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/bad" {
			w.WriteHeader(400) // the receiver refuses this event: skipped into the dead letters
			return
		}
		if !hookOpen.Load() {
			w.WriteHeader(503)
			return
		}
		var e struct{ Event struct{ Offset int64 } }
		json.NewDecoder(r.Body).Decode(&e)
		mu.Lock()
		hooked = append(hooked, e.Event.Offset)
		mu.Unlock()
		w.WriteHeader(204)
	}))

	conn, err := client.Dial(ctx, *addr)
	must(err, "dial")
	defer conn.Close()
	project := conn.Login(ctx, creds.ProjectToken)
	a := client.Stream(ctx, project, "/a")
	exp := expected{Commit: *commit, Events: map[string][]ev{}, Heads: map[string]int64{}, Subscriptions: map[string]sub{},
		Readers: map[string]int64{}, Scheduled: map[string]int64{}, Tokens: map[string]string{"project": creds.ProjectToken, "deployment": creds.DeploymentToken}}
	exp.HookSecret = "whsec_dXBncmFkZS10ZXN0LXNlY3JldC0xMjM0NTY3OA=="

	appendOne := func(in itx.EventInput) {
		_, err := client.Append(ctx, a, []itx.EventInput{in}, itx.AppendOptions{})
		must(err, "append "+in.Type)
	}
	appendOne(itx.EventInput{Type: "note", Payload: json.RawMessage(`{"n":1}`)})
	subs := client.Subscriptions(ctx, a)
	configure := func(cfg client.SubscriptionConfig) {
		_, _, err := client.ConfigureSubscription(ctx, subs, cfg)
		must(err, "configure "+cfg.Name)
	}
	configure(client.SubscriptionConfig{Name: "mirror", Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/mirror"}})
	configure(client.SubscriptionConfig{Name: "hook", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: "http://" + HookAddr + "/hook", Secret: exp.HookSecret}})
	configure(client.SubscriptionConfig{Name: "guestbook", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}})
	configure(client.SubscriptionConfig{Name: "forwarder", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}})
	configure(client.SubscriptionConfig{Name: "nosuch", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}})
	//MOUNT{
	var callMu sync.Mutex
	var called []int64
	rx := client.ServeReceiver(func(ctx context.Context, batch itx.DeliveryBatch) (int64, error) {
		callMu.Lock()
		defer callMu.Unlock()
		for _, e := range batch.Events {
			called = append(called, e.Offset)
		}
		return 0, nil
	})
	handle, err := client.MountReceiver(ctx, project, "rx", rx)
	must(err, "mount rx")
	configure(client.SubscriptionConfig{Name: "call", Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "rx"}})
	//}MOUNT
	//ACK{
	// An offset-acking receiver: it takes every event and confirms nothing by its answer; the
	// populate confirms through offset 9 later, so 10..head are delivered and unconfirmed.
	var ackMu sync.Mutex
	ackTaken := map[int64]bool{}
	ackRx := client.ServeReceiver(func(ctx context.Context, batch itx.DeliveryBatch) (int64, error) {
		ackMu.Lock()
		defer ackMu.Unlock()
		for _, e := range batch.Events {
			ackTaken[e.Offset] = true
		}
		return 0, nil
	})
	ackHandle, err := client.MountReceiver(ctx, project, "acker", ackRx)
	must(err, "mount acker")
	configure(client.SubscriptionConfig{Name: "acking", Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "acker"}, ConfirmWindow: 100})
	configure(client.SubscriptionConfig{Name: "dl", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: "http://" + HookAddr + "/bad"},
		FilterTypes: []string{"poison"}, OnFailingEvent: "skip", DeadLetterPath: "/dead"})
	//}ACK

	for i := 2; i <= 4; i++ {
		appendOne(itx.EventInput{Type: "note", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
	}
	appendOne(itx.EventInput{Type: "guestbook/signed", Payload: json.RawMessage(`{"name":"ada","message":"hi"}`), IdempotencyKey: "k1"})
	appendOne(itx.EventInput{Type: "inbox/message", Payload: json.RawMessage(`{"m":1}`)})
	appendOne(itx.EventInput{Type: "inbox/message", Payload: json.RawMessage(`{"m":2}`)})
	appendOne(itx.EventInput{Type: "note", Payload: json.RawMessage(`{"n":5}`), Metadata: json.RawMessage(`{"trace":"t-5"}`)})
	appendOne(itx.EventInput{Type: "tick", Payload: json.RawMessage(`{"e":1}`), Ephemeral: true})
	appendOne(itx.EventInput{Type: "note", Payload: json.RawMessage(`{"n":6}`), IdempotencyKey: "k2"})

	head := func(s schema.Stream) int64 {
		p, err := client.GetEventPage(ctx, s, itx.Query{After: 0, Limit: 1})
		must(err, "head")
		return p.StreamMaxOffset
	}
	wait := func(name string, off int64) {
		_, err := client.WaitUntilProcessed(ctx, client.Subscription(ctx, a, name), off, 20*time.Second)
		must(err, "wait "+name)
	}
	// The guestbook processor is hosted in-process only by builds that ship it: elsewhere its
	// subscription halts (no such processor), which the upgrade must keep as it is.
	waitProcessor := func(off int64) {
		for _, name := range []string{"guestbook", "forwarder"} {
			if _, err := client.WaitUntilProcessed(ctx, client.Subscription(ctx, a, name), off, 3*time.Second); err != nil {
				log.Printf("%s not processed (kept as it is): %v", name, err)
			}
		}
	}
	h := head(a)
	waitProcessor(h)
	h = head(a) // the forwarder's own appends
	wait("hook", h)
	wait("mirror", h)
	waitProcessor(h)
	//MOUNT{
	wait("call", h)
	cancelFut, cancelRel := handle.Cancel(ctx, nil)
	_, err = cancelFut.Struct()
	must(err, "unmount")
	cancelRel()
	handle.Release()
	//}MOUNT
	hookOpen.Store(false)
	//ACK{
	appendOne(itx.EventInput{Type: "poison", Payload: json.RawMessage(`{"bad":true}`)})
	wait("dl", head(a))
	for deadline := time.Now().Add(20 * time.Second); ; {
		ackMu.Lock()
		n := ackTaken[h]
		ackMu.Unlock()
		if n {
			break
		}
		if time.Now().After(deadline) {
			log.Fatal("acker never took the head")
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, err = client.ConfirmSubscription(ctx, client.Subscription(ctx, a, "acking"), 9)
	must(err, "confirm 9")
	cancelFut2, cancelRel2 := ackHandle.Cancel(ctx, nil)
	_, err = cancelFut2.Struct()
	must(err, "unmount acker")
	cancelRel2()
	ackHandle.Release()
	//}ACK

	// Past here the webhook is out and the itx-call receiver is gone: their cursors stay.
	appendOne(itx.EventInput{Type: "note", Payload: json.RawMessage(`{"n":7}`), IdempotencyKey: "k3"})
	appendOne(itx.EventInput{Type: "guestbook/signed", Payload: json.RawMessage(`{"name":"bob","message":"yo"}`)})
	appendOne(itx.EventInput{Type: "tick", Payload: json.RawMessage(`{"e":2}`), Ephemeral: true})
	appendOne(itx.EventInput{Type: "inbox/message", Payload: json.RawMessage(`{"m":3}`)})
	appendOne(itx.EventInput{Type: "note", Payload: json.RawMessage(`{"n":8}`)})
	h = head(a)
	waitProcessor(h)
	h = head(a) // the forwarder's own appends
	waitProcessor(h)
	wait("mirror", h)

	readersFut, readersRel := a.Readers(ctx, nil)
	defer readersRel()
	readers := readersFut.Readers()
	must(client.RegisterReader(ctx, readers, "r1", 3), "reader r1")
	must(client.RegisterReader(ctx, readers, "r2", h), "reader r2")
	exp.Readers["r1"], exp.Readers["r2"] = 3, h

	//SCHED{
	soon := time.Now().Add(4 * time.Second)
	later := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
	_, _, err = client.Schedule(ctx, a, itx.EventInput{Type: "timer", Payload: json.RawMessage(`{"t":"soon"}`), IdempotencyKey: "soon"}, soon)
	must(err, "schedule soon")
	_, _, err = client.Schedule(ctx, a, itx.EventInput{Type: "timer", Payload: json.RawMessage(`{"t":"later"}`), IdempotencyKey: "later"}, later)
	must(err, "schedule later")
	exp.Scheduled["soon"], exp.Scheduled["later"] = soon.UnixMilli(), later.UnixMilli()
	//}SCHED

	//ADMIN{
	deployment := conn.Login(ctx, creds.DeploymentToken)
	admin := client.Admin(ctx, deployment)
	info, otherToken, _, err := client.CreateProject(ctx, admin, "other")
	must(err, "create project")
	exp.OtherProject = info.ID
	exp.Tokens["other"] = otherToken
	other := conn.Login(ctx, otherToken)
	_, err = client.Append(ctx, client.Stream(ctx, other, "/x/1"), []itx.EventInput{{Type: "o", Payload: json.RawMessage(`{}`)}}, itx.AppendOptions{})
	must(err, "append other")
	scoped, _, err := client.CreateToken(ctx, admin, info.ID, client.TokenOptions{Label: "reader", Scope: itx.Scope{Prefix: "/x", Rights: []itx.Right{itx.RightRead}}})
	must(err, "scoped token")
	exp.Tokens["scoped"] = scoped
	second, _, err := client.CreateToken(ctx, client.Admin(ctx, project), "", client.TokenOptions{Label: "second"})
	must(err, "second token")
	exp.Tokens["second"] = second
	expiring, _, err := client.CreateToken(ctx, client.Admin(ctx, project), "", client.TokenOptions{Label: "expiring", Expires: time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)})
	must(err, "expiring token")
	exp.Tokens["expiring"] = expiring
	revoked, revokedInfo, err := client.CreateToken(ctx, client.Admin(ctx, project), "", client.TokenOptions{Label: "revoked"})
	must(err, "revoked token")
	must(client.RevokeToken(ctx, client.Admin(ctx, project), "", revokedInfo.ID), "revoke")
	exp.RevokedToken = revoked
	//}ADMIN

	paths := []string{"/a", "/mirror"}
	//TRIM{
	// A stream trimmed through 10 of its 20 keyed events (stream migration 005), with a reader
	// registered by the project's token, which holds back trims (its owner, 006), and one
	// registered through a read-only attenuation, which does not (007).
	trimmed := client.Stream(ctx, project, "/trimmed")
	for i := 1; i <= 20; i++ {
		_, err := client.Append(ctx, trimmed, []itx.EventInput{{Type: "t", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), IdempotencyKey: fmt.Sprintf("t-%d", i)}}, itx.AppendOptions{})
		must(err, "append /trimmed")
	}
	tr, err := client.Trim(ctx, trimmed, 10)
	must(err, "trim")
	exp.Trimmed = tr.TrimmedThrough
	must(client.RegisterReader(ctx, client.Readers(ctx, trimmed), "holds", 12), "reader holds")
	must(client.RegisterReader(ctx, client.Readers(ctx, client.ReadOnly(ctx, trimmed)), "looks", 11), "reader looks")
	exp.TrimReaders = map[string]int64{"holds": 12, "looks": 11}
	paths = append(paths, "/trimmed")
	//}TRIM
	//ACK{
	paths = append(paths, "/dead")
	//}ACK
	for _, path := range paths {
		s := client.Stream(ctx, project, path)
		events, err := client.ReadAll(ctx, s, itx.Query{IncludeEphemeral: true})
		must(err, "read "+path)
		for _, e := range events {
			exp.Events[path] = append(exp.Events[path], ev{Offset: e.Offset, Type: e.Type, Payload: e.Payload, Metadata: e.Metadata, Key: e.IdempotencyKey, Ephemeral: e.Ephemeral})
		}
		exp.Heads[path] = head(s)
	}
	list, err := client.ListSubscriptions(ctx, subs)
	must(err, "list subscriptions")
	for _, s := range list {
		exp.Subscriptions[s.Name] = sub{Kind: s.Kind, Status: s.Status, Confirmed: s.ConfirmedOffset}
	}
	out, _ := json.MarshalIndent(exp, "", "  ")
	must(os.WriteFile(filepath.Join(*data, "expected.json"), out, 0o644), "write expected.json")
	fmt.Println(string(out))
	if !*traffic {
		return
	}
	acked, err := os.Create(filepath.Join(*data, "acked.jsonl"))
	must(err, "acked.jsonl")
	defer acked.Close()
	for i := 0; ; i++ {
		key := fmt.Sprintf("load-%d", i)
		res, err := client.Append(ctx, a, []itx.EventInput{{Type: "load", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), IdempotencyKey: key}}, itx.AppendOptions{})
		if err != nil {
			return // itxd was killed: everything acknowledged is in acked.jsonl
		}
		fmt.Fprintf(acked, "{\"offset\":%d,\"key\":%q}\n", res.Offsets[0], key)
	}
}
