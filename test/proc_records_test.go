package test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// bigStateHost is a remote processor host whose every wake claims the instance and commits a
// progress record holding a state of stateBytes, processed through the head.
type bigStateHost struct{ stateBytes int }

func (h bigStateHost) Wake(ctx context.Context, call schema.ProcessorHost_wake) error {
	req, err := call.Args().Request()
	if err != nil {
		return err
	}
	name, err := req.Name()
	if err != nil {
		return err
	}
	ports := req.Ports()
	cf, release := ports.Claim(ctx, func(a schema.ProcessorPorts_claim_Params) error { return a.SetName(name) })
	defer release()
	claimed, err := client.Await(ctx, cf)
	if err != nil {
		return err
	}
	head := int64(req.HeadOffset())
	progress, err := json.Marshal(itx.ProcessorProgress{ReducerVersion: "1", ReducedThrough: head, ProcessedThrough: head,
		State: json.RawMessage(`"` + strings.Repeat("s", h.stateBytes) + `"`)})
	if err != nil {
		return err
	}
	mf, release2 := ports.Commit(ctx, func(a schema.ProcessorPorts_commit_Params) error {
		a.SetGeneration(claimed.Generation())
		if err := a.SetName(name); err != nil {
			return err
		}
		return a.SetProgress(string(progress))
	})
	defer release2()
	if _, err := client.Await(ctx, mf); err != nil {
		return err
	}
	return reportThrough(call, head)
}

func (bigStateHost) Stop(context.Context, schema.ProcessorHost_stop) error { return nil }

func (bigStateHost) GetRuntimeState(context.Context, schema.ProcessorHost_getRuntimeState) error {
	return fmt.Errorf("not kept")
}

// heapMiB is the live heap after two collections. One is not enough: go-capnp returns message
// buffers (up to 1 MiB each, a 900 KiB state's commit among them) to a sync.Pool, whose
// collection only moves them to its victim cache, still live, and drops them at the next. After
// one collection a run here counted ~1.8 MiB of pooled buffers, and one in a loaded -count=3 run
// of ./test/ counted 18 MiB (more messages at once, more buffers pooled), over the bound.
func heapMiB() float64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapAlloc) / (1 << 20)
}

// TestProcessors_RemovedRecordsLeaveMemory: a processor's progress record (its state: up to
// 1 MiB) is cached in its loaded stream; a client configuring processor-wake subscriptions under
// new names and removing them, while a host commits a large state for each, grew that cache by a
// record per name for as long as the stream stayed loaded. A removed subscription's record
// leaves memory (it stays on disk, fencing a late incarnation, and is read again if the name
// comes back).
func TestProcessors_RemovedRecordsLeaveMemory(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	const stateBytes = 900 << 10
	h, err := mountHostServing(ctx, p, "host", bigStateHost{stateBytes: stateBytes},
		[]itx.ProcessorInfo{{Name: "c", ReducerVersion: "1", ConsumedTypes: []string{"*"}}})
	require.NoError(t, err)
	defer h.Release()
	s := stream(t, p, "/records")
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	mustAppend(t, s, ev("a", `{}`))
	base := heapMiB()
	const n = 40
	for i := range n {
		name := fmt.Sprintf("p-%d", i)
		_, at, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: name,
			Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Placement: "remote", Processor: "c"}})
		require.NoError(t, err)
		sub := client.Subscription(ctx, s, name)
		_, err = client.WaitUntilProcessed(ctx, sub, at, 0)
		sub.Release()
		require.NoError(t, err, "the host committed %s", name)
		_, err = client.RemoveSubscription(ctx, subs, name)
		require.NoError(t, err)
	}
	grown := heapMiB() - base
	t.Logf("live heap grew %.0f MiB over %d removed processors of %d KiB each", grown, n, stateBytes>>10)
	require.Less(t, grown, float64(n*stateBytes>>20)/2, "removed processors' records are still held")

	// A name that comes back finds its record again: the fence and the progress are on disk.
	_, at, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "p-0",
		Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Placement: "remote", Processor: "c"}})
	require.NoError(t, err)
	sub := client.Subscription(ctx, s, "p-0")
	defer sub.Release()
	_, err = client.WaitUntilProcessed(ctx, sub, at, 0)
	require.NoError(t, err)
}

// portsKeeper is bigStateHost keeping the ports of each wake, as a host whose session of a
// processor outlives it (a stop it missed) may.
type portsKeeper struct {
	bigStateHost
	mu    sync.Mutex
	ports []schema.ProcessorPorts
}

func (h *portsKeeper) Wake(ctx context.Context, call schema.ProcessorHost_wake) error {
	req, err := call.Args().Request()
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.ports = append(h.ports, req.Ports().AddRef())
	h.mu.Unlock()
	return h.bigStateHost.Wake(ctx, call)
}

func (h *portsKeeper) last() schema.ProcessorPorts {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ports[len(h.ports)-1]
}

// A removed processor's KV (itx.ProcessorKVPrefix) is not written by its late runners: a host
// that kept the ports of the removed processor's wake is refused, so a subscription created anew
// under the name starts without the removed one's records, as the reset at removal means.
func TestProcessors_RemovedProcessorsKVIsNotWrittenLate(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	host := &portsKeeper{bigStateHost: bigStateHost{stateBytes: 1}}
	h, err := mountHostServing(ctx, p, "keeper", host, []itx.ProcessorInfo{{Name: "c", ReducerVersion: "1", ConsumedTypes: []string{"*"}}})
	require.NoError(t, err)
	defer h.Release()
	s := stream(t, p, "/late-kv")
	mustAppend(t, s, ev("a", `{}`))
	run := func() {
		t.Helper()
		configureInstance(t, s, "a", "c", "remote")
		head := mustAppend(t, s, ev("a", `{}`)).HeadOffset
		sub := client.Subscription(ctx, s, "a")
		defer sub.Release()
		_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
		require.NoError(t, err)
	}
	key := itx.ProcessorKVPrefix("a") + "breaker"
	run()
	removeSubscription(t, s, "a")
	put, release := host.last().KvPut(ctx, func(a schema.ProcessorPorts_kvPut_Params) error {
		if err := a.SetKey(key); err != nil {
			return err
		}
		return a.SetValue([]byte("the removed processor's"))
	})
	_, err = put.Struct()
	release()
	t.Logf("the late put: %v", err)

	run()
	get, release := host.last().KvGet(ctx, func(a schema.ProcessorPorts_kvGet_Params) error { return a.SetKey(key) })
	defer release()
	got, err := get.Struct()
	require.NoError(t, err)
	v, _ := got.Value()
	require.False(t, got.Found(), "the new processor reads the removed one's record %q", v)
}
