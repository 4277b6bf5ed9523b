package test

import (
	"context"
	"database/sql"
	"encoding/json"
	"path/filepath"
	"sort"
	"sync"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	_ "github.com/mattn/go-sqlite3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Mounts are namespaced by the mounting session's scope: a token limited to a prefix mounts,
// lists and unmounts only among its own prefix's mounts, and a subscription it configures reaches
// only those. These tests run over RPC against a real itxd, with two tenants of one project
// (tokens limited to /tenantA and /tenantB) and the project's own whole-project token.

// payloadRecorder is a Receiver that keeps the payloads it was handed.
type payloadRecorder struct {
	mu       sync.Mutex
	payloads []string
}

func (r *payloadRecorder) receiver() schema.Receiver {
	return client.ServeReceiver(func(_ context.Context, b itx.DeliveryBatch) (int64, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, e := range b.Events {
			r.payloads = append(r.payloads, string(e.Payload))
		}
		return 0, nil
	})
}

// has reports whether a payload containing the JSON value want was received.
func (r *payloadRecorder) has(t *testing.T, want string) bool {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.payloads {
		var got, w any
		require.NoError(t, json.Unmarshal([]byte(p), &got))
		require.NoError(t, json.Unmarshal([]byte(want), &w))
		if assert.ObjectsAreEqual(w, got) {
			return true
		}
	}
	return false
}

// mountRecorder mounts a new recorder under name in p until the test ends.
func mountRecorder(t *testing.T, p schema.Project, name string) *payloadRecorder {
	t.Helper()
	r := &payloadRecorder{}
	h, err := client.MountReceiver(ctxT(t), p, name, r.receiver())
	require.NoError(t, err, "mount %q", name)
	t.Cleanup(h.Release)
	return r
}

// configureCall configures an itx-call subscription sub on s delivering to capability.
func configureCall(t *testing.T, s schema.Stream, sub, capability string) {
	t.Helper()
	ctx := ctxT(t)
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: sub,
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: capability}})
	require.NoError(t, err)
}

func listMounts(t *testing.T, p schema.Project) []itx.MountInfo {
	t.Helper()
	ctx := ctxT(t)
	caps, release := p.Capabilities(ctx, nil)
	defer release()
	list, err := client.ListMounts(ctx, caps.Capabilities())
	require.NoError(t, err)
	sort.Slice(list, func(i, j int) bool { return list[i].Scope < list[j].Scope })
	return list
}

func unmount(t *testing.T, p schema.Project, name string) error {
	t.Helper()
	ctx := ctxT(t)
	caps, release := p.Capabilities(ctx, nil)
	defer release()
	return client.Unmount(ctx, caps.Capabilities(), name)
}

type mountView struct{ Name, Scope string }

func mountViews(list []itx.MountInfo) []mountView {
	out := make([]mountView, len(list))
	for i, m := range list {
		out[i] = mountView{m.Name, m.Scope}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Scope+"\x00"+out[i].Name < out[j].Scope+"\x00"+out[j].Name })
	return out
}

// tenants starts a server and logs in the project's whole-project token and two tokens limited
// to /tenantA and /tenantB.
func tenants(t *testing.T) (ts *testServer, full, a, b schema.Project) {
	ts = startServer(t, server.Config{})
	tokA, _ := ts.token(t, itx.Scope{Prefix: "/tenantA"})
	tokB, _ := ts.token(t, itx.Scope{Prefix: "/tenantB"})
	return ts, ts.project(t), ts.login(t, tokA), ts.login(t, tokB)
}

// (a) Tenant B's itx-call subscription naming the capability tenant A mounted does not reach A's
// receiver: it parks, nothing being mounted under that name in B's namespace, and delivers once
// B mounts its own receiver under the name, while A's keeps receiving A's events only. (b) B
// mounting the name replaces nothing of A's, and B can neither unmount nor list A's mount.
// (c) The whole project's session lists every mount with its scope.
func TestAccess_MountsAreNamespacedByScope(t *testing.T) {
	ts, full, a, b := tenants(t)
	_ = ts
	recA := mountRecorder(t, a, "inbox")
	sA := stream(t, a, "/tenantA/s")
	configureCall(t, sA, "sub", "inbox")
	mustAppend(t, sA, ev("note", `{"from": "A", "n": 1}`))
	waitUntil(t, "A's receiver gets A's event", func() bool { return recA.has(t, `{"from": "A", "n": 1}`) })

	sB := stream(t, b, "/tenantB/s")
	configureCall(t, sB, "sub", "inbox")
	mustAppend(t, sB, ev("note", `{"from": "B", "n": 1}`))
	waitUntil(t, "B's subscription parks: nothing is mounted under inbox in B's namespace", func() bool {
		return describeSub(t, sB, "sub").Status == itx.StatusParked
	})
	require.False(t, recA.has(t, `{"from": "B", "n": 1}`), "B's events reached A's receiver")

	// B can neither see nor remove A's mount.
	require.Empty(t, listMounts(t, b), "B lists A's mount")
	requireCode(t, unmount(t, b, "inbox"), itx.ENotFound)
	mustAppend(t, sA, ev("note", `{"from": "A", "n": 2}`))
	waitUntil(t, "A's receiver is still mounted", func() bool { return recA.has(t, `{"from": "A", "n": 2}`) })

	// B mounts its own inbox: its parked subscription delivers there, and A's is not replaced.
	recB := mountRecorder(t, b, "inbox")
	waitUntil(t, "B's receiver gets B's parked event", func() bool { return recB.has(t, `{"from": "B", "n": 1}`) })
	mustAppend(t, sA, ev("note", `{"from": "A", "n": 3}`))
	mustAppend(t, sB, ev("note", `{"from": "B", "n": 2}`))
	waitUntil(t, "A's receiver gets A's next event", func() bool { return recA.has(t, `{"from": "A", "n": 3}`) })
	waitUntil(t, "B's receiver gets B's next event", func() bool { return recB.has(t, `{"from": "B", "n": 2}`) })
	require.False(t, recA.has(t, `{"from": "B", "n": 1}`) || recA.has(t, `{"from": "B", "n": 2}`), "B's events reached A's receiver")
	require.False(t, recB.has(t, `{"from": "A", "n": 3}`), "A's events reached B's receiver")

	// Each tenant lists its own mount only, with its scope.
	require.Equal(t, []mountView{{"inbox", "/tenantA"}}, mountViews(listMounts(t, a)))
	require.Equal(t, []mountView{{"inbox", "/tenantB"}}, mountViews(listMounts(t, b)))

	// (c) The whole project lists both, with their scopes, beside its own.
	recFull := mountRecorder(t, full, "inbox")
	require.Equal(t, []mountView{{"inbox", ""}, {"inbox", "/tenantA"}, {"inbox", "/tenantB"}}, mountViews(listMounts(t, full)))

	// B unmounts its own inbox only: A's stays, and B's subscription parks again.
	require.NoError(t, unmount(t, b, "inbox"))
	require.Equal(t, []mountView{{"inbox", ""}, {"inbox", "/tenantA"}}, mountViews(listMounts(t, full)))
	mustAppend(t, sB, ev("note", `{"from": "B", "n": 3}`))
	waitUntil(t, "B's subscription parks again", func() bool { return describeSub(t, sB, "sub").Status == itx.StatusParked })
	mustAppend(t, sA, ev("note", `{"from": "A", "n": 4}`))
	waitUntil(t, "A's receiver gets A's next event", func() bool { return recA.has(t, `{"from": "A", "n": 4}`) })
	require.False(t, recA.has(t, `{"from": "B", "n": 3}`) || recFull.has(t, `{"from": "B", "n": 3}`), "B's event reached another namespace's receiver")
}

// A tenant's subscription does not reach the whole project's mounts either: the project's own
// receiver is not handed events a tenant routed to it (and a whole-project subscription reaches
// the whole project's receiver, not a tenant's under the same name).
func TestAccess_ScopedSubscriptionDoesNotReachTheProjectsMount(t *testing.T) {
	_, full, a, b := tenants(t)
	recFull := mountRecorder(t, full, "billing")
	sB := stream(t, b, "/tenantB/s")
	configureCall(t, sB, "sub", "billing")
	mustAppend(t, sB, ev("note", `{"from": "B"}`))
	waitUntil(t, "B's subscription parks", func() bool { return describeSub(t, sB, "sub").Status == itx.StatusParked })
	require.False(t, recFull.has(t, `{"from": "B"}`), "a tenant pushed events into the project's receiver")
	require.Empty(t, listMounts(t, b), "a tenant lists the project's mounts")

	recA := mountRecorder(t, a, "billing")
	sFull := stream(t, full, "/tenantA/owned")
	configureCall(t, sFull, "sub", "billing")
	mustAppend(t, sFull, ev("note", `{"from": "project"}`))
	waitUntil(t, "the project's receiver gets the project's event", func() bool { return recFull.has(t, `{"from": "project"}`) })
	require.False(t, recA.has(t, `{"from": "project"}`), "a whole-project subscription reached a tenant's receiver")
}

// wakeRecorder is a ProcessorHost that records the paths it is woken for and reports them
// processed through the head.
type wakeRecorder struct {
	mu    sync.Mutex
	paths []string
}

func (h *wakeRecorder) Wake(ctx context.Context, call schema.ProcessorHost_wake) error {
	req, err := call.Args().Request()
	if err != nil {
		return err
	}
	path, err := req.Path()
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.paths = append(h.paths, path)
	h.mu.Unlock()
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	report, err := res.NewReport()
	if err != nil {
		return err
	}
	report.SetProcessedOffset(req.HeadOffset())
	return nil
}

func (h *wakeRecorder) woken() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.paths...)
}

func (h *wakeRecorder) GetRuntimeState(ctx context.Context, call schema.ProcessorHost_getRuntimeState) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return res.SetState(`{}`)
}

func (h *wakeRecorder) Stop(context.Context, schema.ProcessorHost_stop) error { return nil }

var forwarderContract = []itx.ProcessorInfo{{Name: "forwarder", ReducerVersion: "1", ConsumedTypes: []string{string(examples.InboxMessage)}}}

func mountWakeRecorder(t *testing.T, p schema.Project, name string) *wakeRecorder {
	t.Helper()
	h := &wakeRecorder{}
	handle, err := mountHostServing(ctxT(t), p, name, h, forwarderContract)
	require.NoError(t, err, "mount host %q", name)
	t.Cleanup(handle.Release)
	return h
}

// (d) A processor host mounted by tenant B announcing the contract tenant A's remote processor
// runs is not woken for A's stream (it would be handed A's events and A's processor records),
// nor does it take the contract over from A's host; B lists only its own host.
func TestAccess_ScopedProcessorHostIsNotWokenForAnotherScope(t *testing.T) {
	_, full, a, b := tenants(t)
	ctx := ctxT(t)
	hostA := mountWakeRecorder(t, a, "host")
	sA := stream(t, a, "/tenantA/p")
	configureInstance(t, sA, "forwarder", "", "remote")
	head := mustAppend(t, sA, examples.InboxMessage.Input(json.RawMessage(`{"n":0}`), "")).HeadOffset
	sub := client.Subscription(ctx, sA, "forwarder")
	defer sub.Release()
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	require.Contains(t, hostA.woken(), "/tenantA/p")

	hostB := mountWakeRecorder(t, b, "host")
	head = mustAppend(t, sA, examples.InboxMessage.Input(json.RawMessage(`{"n":1}`), "")).HeadOffset
	_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	require.Empty(t, hostB.woken(), "B's host was woken for A's stream (A's host keeps its contract)")

	hosts := listHosts(t, b)
	require.Len(t, hosts, 1)
	require.Equal(t, "/tenantB", hosts[0].Scope)
	require.Len(t, hosts[0].Contracts, 1, "B's host holds the contract in B's namespace")
	require.Len(t, listHosts(t, full), 2)

	// B's own remote processor runs on B's host.
	sB := stream(t, b, "/tenantB/p")
	configureInstance(t, sB, "forwarder", "", "remote")
	head = mustAppend(t, sB, examples.InboxMessage.Input(json.RawMessage(`{"n":0}`), "")).HeadOffset
	subB := client.Subscription(ctx, sB, "forwarder")
	defer subB.Release()
	_, err = client.WaitUntilProcessed(ctx, subB, head, 0)
	require.NoError(t, err)
	require.NotEmpty(t, hostB.woken())
	for _, path := range hostB.woken() {
		require.Equal(t, "/tenantB/p", path, "B's host was woken for another stream")
	}
	require.NotContains(t, hostA.woken(), "/tenantB/p")
}

// A tenant's remote processor is not woken on the whole project's host announcing its contract:
// it parks until a host of its own namespace mounts.
func TestAccess_ScopedProcessorDoesNotReachTheProjectsHost(t *testing.T) {
	_, full, _, b := tenants(t)
	hostFull := mountWakeRecorder(t, full, "host")
	sB := stream(t, b, "/tenantB/p")
	configureInstance(t, sB, "forwarder", "", "remote")
	mustAppend(t, sB, examples.InboxMessage.Input(json.RawMessage(`{"n":0}`), ""))
	waitUntil(t, "B's remote processor parks", func() bool { return describeSub(t, sB, "forwarder").Status == itx.StatusParked })
	require.Empty(t, hostFull.woken(), "the project's host was woken for a tenant's processor")
	require.Empty(t, listHosts(t, b), "a tenant lists the project's hosts")

	hostB := mountWakeRecorder(t, b, "host")
	waitUntil(t, "B's host is woken", func() bool { return len(hostB.woken()) > 0 })
	require.Empty(t, hostFull.woken())
}

// A tenant cannot claim another's namespace by writing the scope into a raw configured event:
// the server records the appending token's, however the field is spelt (the config's fields
// match under Unicode case folding, where "ſcope" is "scope"), so the subscription parks in the
// tenant's own namespace rather than reaching the other's receiver.
func TestAccess_RawConfiguredEventCannotChooseItsScope(t *testing.T) {
	_, full, a, b := tenants(t)
	ctx := ctxT(t)
	recA := mountRecorder(t, a, "inbox")
	sB := stream(t, b, "/tenantB/raw")
	for i, key := range []string{"scope", "Scope", "SCOPE", "ſcope", "ſCOPE"} {
		name := "raw" + itoa(i)
		payload := `{"name": "` + name + `", "` + key + `": "/tenantA", "receiver": {"action": "itx-call", "capability": "inbox"}}`
		_, err := client.Append(ctx, sB, []itx.EventInput{{Type: itx.TypeSubscriptionConfigured, Payload: []byte(payload)}}, itx.AppendOptions{})
		require.NoError(t, err, "%s", payload)
	}
	mustAppend(t, sB, ev("note", `{"from": "B"}`))
	for i := range 5 {
		name := "raw" + itoa(i)
		waitUntil(t, name+" parks in B's namespace", func() bool { return describeSub(t, sB, name).Status == itx.StatusParked })
	}
	require.False(t, recA.has(t, `{"from": "B"}`), "a raw configured event chose A's namespace")

	// The whole project's token may place a subscription in a tenant's namespace: it can do
	// everything a tenant can.
	sOwned := stream(t, full, "/tenantA/owned")
	payload := `{"name": "placed", "scope": "/tenantA", "receiver": {"action": "itx-call", "capability": "inbox"}}`
	_, err := client.Append(ctx, sOwned, []itx.EventInput{{Type: itx.TypeSubscriptionConfigured, Payload: []byte(payload)}, ev("note", `{"from": "project"}`)}, itx.AppendOptions{})
	require.NoError(t, err)
	waitUntil(t, "A's receiver gets the project's event", func() bool { return recA.has(t, `{"from": "project"}`) })
}

// parkedTenantStream makes a /tenantB token, configures on path (under /tenantB) an itx-call
// subscription "app" waiting for capability, appends one note with payload, and returns the
// token once the subscription is parked and the stream unloaded.
func parkedTenantStream(t *testing.T, e *subEnv, path, capability, payload string) (tokB string) {
	t.Helper()
	tokB, _ = e.ts.token(t, itx.Scope{Prefix: "/tenantB"})
	s := stream(t, e.ts.login(t, tokB), path)
	configureCall(t, s, "app", capability)
	mustAppend(t, s, ev("note", payload))
	waitUntil(t, "parked", func() bool { return describeSub(t, s, "app").Status == itx.StatusParked })
	s.Release()
	e.unloadAll(t)
	return tokB
}

// A tenant's subscription parked on a stream that has since been unloaded resumes when the
// tenant mounts its receiver (the mount alone loads the stream), and not into the whole
// project's receiver mounted under the same name first.
func TestAccess_ScopedMountResumesAnUnloadedParkedStream(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	tokB := parkedTenantStream(t, e, "/tenantB/away", "late-inbox", `{"from": "B"}`)

	recFull := mountRecorder(t, e.p, "late-inbox")
	recB := mountRecorder(t, e.ts.login(t, tokB), "late-inbox")
	waitUntil(t, "B's mount resumes B's unloaded parked stream", func() bool { return recB.has(t, `{"from": "B"}`) })
	require.False(t, recFull.has(t, `{"from": "B"}`), "the project's receiver got a tenant's event")
}

// A tenant's stream that parked before mounts had scopes recorded the bare name its subscription
// waits for in the directory: a mount of that name in the tenant's scope still loads and resumes
// it (the upgrade from a directory written before scoped mounts).
func TestAccess_ScopedMountResumesAStreamParkedBeforeScopes(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	tokB := parkedTenantStream(t, e, "/tenantB/old", "old-inbox", `{"from": "B, before the upgrade"}`)
	// As the directory held it before scoped mounts: the bare name.
	db, err := sql.Open("sqlite3", filepath.Join(e.ts.dir, "directory.db")+"?_busy_timeout=10000")
	require.NoError(t, err)
	defer db.Close()
	res, err := db.Exec(`update parked set capability = 'old-inbox' where capability = ?`, "/tenantB\x1fold-inbox")
	require.NoError(t, err)
	n, err := res.RowsAffected()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the stream parked on its scoped token")

	recB := mountRecorder(t, e.ts.login(t, tokB), "old-inbox")
	waitUntil(t, "B's mount resumes the stream parked on the bare name", func() bool { return recB.has(t, `{"from": "B, before the upgrade"}`) })
}

// A whole-project token cannot place a subscription of a stream outside a tenant's prefix in
// that tenant's namespace: the tenant's receiver would be handed a stream it may not read.
func TestAccess_RawConfiguredScopeMustContainTheStream(t *testing.T) {
	_, full, a, _ := tenants(t)
	recA := mountRecorder(t, a, "inbox")
	s := stream(t, full, "/elsewhere/s")
	payload := `{"name": "placed", "scope": "/tenantA", "receiver": {"action": "itx-call", "capability": "inbox"}}`
	_, err := client.Append(ctxT(t), s, []itx.EventInput{{Type: itx.TypeSubscriptionConfigured, Payload: []byte(payload)}, ev("note", `{"from": "elsewhere"}`)}, itx.AppendOptions{})
	requireCode(t, err, itx.EInvalid)
	subs, err := client.ListSubscriptions(ctxT(t), client.Subscriptions(ctxT(t), s))
	require.NoError(t, err)
	require.Empty(t, subs)
	require.False(t, recA.has(t, `{"from": "elsewhere"}`))
}

// A tenant runs its own remote processors: a processor host mounted with a token limited to
// /tenantB is woken for the tenant's stream and processes it through its ports.
func TestAccess_ScopedRemoteHostRunsItsTenantsProcessor(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	tokB, _ := ts.token(t, itx.Scope{Prefix: "/tenantB"})
	b := ts.login(t, tokB)
	awaitMount(t, runRemoteHost(t, ts.addr, tokB, "worker", referenceHost(t, "forwarder")))
	s := stream(t, b, "/tenantB/remote")
	configureRemote(t, s, "forwarder")
	head := mustAppend(t, s, examples.InboxMessage.Input(json.RawMessage(`{"n":0}`), "")).HeadOffset
	sub := client.Subscription(ctx, s, "forwarder")
	defer sub.Release()
	_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
	require.NoError(t, err)
	require.Equal(t, 1, countType(t, s, string(examples.OutboxForwarded)))
	hosts := listHosts(t, ts.project(t))
	require.Len(t, hosts, 1)
	require.Equal(t, "/tenantB", hosts[0].Scope)
}

// A mount without the capability to mount is refused invalidArgument (it panicked in the
// handler: a null Receiver or ProcessorHost reached SetFlowLimiter), and mounts nothing.
func TestMounts_WithoutACapabilityAreRefused(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)

	caps, release := p.Capabilities(ctx, nil)
	defer release()
	fut, rel := caps.Capabilities().Mount(ctx, func(a schema.Capabilities_mount_Params) error {
		return a.SetName("inbox") // and no receiver
	})
	_, err := fut.Struct()
	rel()
	requireCode(t, err, itx.EInvalid)
	list, err := client.ListMounts(ctx, caps.Capabilities())
	require.NoError(t, err)
	require.Empty(t, list, "nothing was mounted")
	// Unmounting a name no mount could have is the caller's mistake, not a mount that is gone.
	requireCode(t, client.Unmount(ctx, caps.Capabilities(), ""), itx.EInvalid)

	hosts, hrelease := p.Processors(ctx, nil)
	defer hrelease()
	hfut, hrel := hosts.Processors().Mount(ctx, func(a schema.ProcessorHosts_mount_Params) error {
		return a.SetName("host") // and no host
	})
	_, err = hfut.Struct()
	hrel()
	requireCode(t, err, itx.EInvalid)
	require.Zero(t, testutil.CollectAndCount(ts.srv.Metrics().HandlerPanics), "no handler panicked")
}
