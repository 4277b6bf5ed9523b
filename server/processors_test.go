package server

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/stretchr/testify/require"
)

// idleRemoteHost is a mounted processor host these tests never need woken.
type idleRemoteHost struct{}

func (idleRemoteHost) Wake(context.Context, RemoteWake) (int64, int64, error) {
	return 0, 0, itx.Errorf(itx.ECapabilityOffline, "idle test host")
}

func (idleRemoteHost) RuntimeState(context.Context, string, string, string) (json.RawMessage, error) {
	return json.RawMessage(`{}`), nil
}

// mustRemotePorts mounts a host announcing name and returns the ports a wake would hand it.
func mustRemotePorts(t *testing.T, s *Server, ref StreamRef, name string) *ProcessorPorts {
	t.Helper()
	info := []itx.ProcessorInfo{{Name: name, ReducerVersion: "1", ConsumedTypes: []string{"x"}}}
	unmount, err := s.MountProcessorHost(ref.ProjectID, "", "host", idleRemoteHost{}, info)
	require.NoError(t, err)
	t.Cleanup(unmount)
	return &ProcessorPorts{srv: s, ref: ref, name: name, contract: name, gen: s.remoteHost(ref.ProjectID, "", name).gen}
}

// The processors' KV of a stream is bounded in keys and in bytes, for remote hosts and
// in-process processors together, and the totals are the stream's: a restart counts them again
// from the kv table, to the byte.
func TestProcessorKV_Bounds(t *testing.T) {
	ctx := context.Background()
	t.Run("defaults", func(t *testing.T) {
		s, _ := mustOpen(t, Config{DataDir: t.TempDir()})
		require.Equal(t, 10_000, s.cfg.MaxProcessorKVKeys)
		require.Equal(t, int64(64<<20), s.cfg.MaxProcessorKVBytes)
	})

	t.Run("survive a restart", func(t *testing.T) {
		cfg := Config{DataDir: t.TempDir(), MaxProcessorKVKeys: 3, MaxProcessorKVBytes: 100}
		s, projectID := mustOpen(t, cfg)
		ref := StreamRef{ProjectID: projectID, Path: "/kv"}
		_, err := s.Append(ctx, ref, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
		require.NoError(t, err)
		mustRemoteProcessor(t, s, ref, "proc")
		ports := mustRemotePorts(t, s, ref, "proc")
		k := itx.ProcessorKVPrefix("proc") // 15 bytes
		require.NoError(t, ports.KVPut(ctx, k+"a", make([]byte, 25)))
		require.NoError(t, ports.KVPut(ctx, k+"b", make([]byte, 25)))
		a, err := s.acquire(ctx, ref)
		require.NoError(t, err)
		require.NoError(t, procKV{a}.Put(ctx, "c", make([]byte, 10)), "in-process")
		err = procKV{a}.Put(ctx, "d", nil)
		require.Equal(t, itx.ELimitExceeded, itx.ErrorCode(err), "in-process processors share the bound: %v", err)
		s.release(a)
		mustClose(t, s) // 3 keys, 41 + 41 + 11 = 93 bytes

		s, _ = mustOpen(t, cfg)
		ports = mustRemotePorts(t, s, ref, "proc")
		err = ports.KVPut(ctx, k+"d", nil)
		require.Equal(t, itx.ELimitExceeded, itx.ErrorCode(err), "got %v", err)
		require.Contains(t, itx.ErrorMessage(err), "at most 3 keys")
		_, found, err := ports.KVGet(ctx, k+"d")
		require.NoError(t, err)
		require.False(t, found, "the refused put wrote nothing")
		require.NoError(t, ports.KVPut(ctx, k+"b", make([]byte, 32)), "93 - 41 + 48 = 100 bytes: at the bound")
		err = ports.KVPut(ctx, k+"b", make([]byte, 33))
		require.Equal(t, itx.ELimitExceeded, itx.ErrorCode(err), "101 bytes: got %v", err)
		require.Contains(t, itx.ErrorMessage(err), "at most 100 bytes")
		v, _, err := ports.KVGet(ctx, k+"b")
		require.NoError(t, err)
		require.Len(t, v, 32, "the refused put wrote nothing")
	})
}

// mustRemoteProcessor configures a remote processor-wake subscription.
func mustRemoteProcessor(t *testing.T, s *Server, ref StreamRef, name string) {
	t.Helper()
	_, _, err := s.ConfigureSubscription(context.Background(), ref, itx.SubscriptionConfig{Name: name,
		Receiver: itx.Receiver{Action: itx.KindProcessorWake, Placement: "remote"}}, "")
	require.NoError(t, err)
}

// A remote host's ports write the processors' records in the KV only under their own processor's
// prefix (other keys are the stream's shared KV), and only while the processor's progress record
// is at the generation their runner holds, as commits: a reconfigure keeps them writing, while
// the ports of a removed processor (a host that kept them) write nothing into one configured
// anew under the same name, and a newer runner's claim fences a stale one's.
func TestProcessorKV_PortsAreFencedByGeneration(t *testing.T) {
	ctx := context.Background()
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir()})
	ref := StreamRef{ProjectID: projectID, Path: "/kv-fence"}
	_, err := s.Append(ctx, ref, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
	require.NoError(t, err)
	mustRemoteProcessor(t, s, ref, "other")
	mustRemoteProcessor(t, s, ref, "proc")
	old := mustRemotePorts(t, s, ref, "proc")
	_, _, err = old.Claim(ctx, "proc")
	require.NoError(t, err)
	k := itx.ProcessorKVPrefix("proc") + "keepalive"
	require.NoError(t, old.KVPut(ctx, k, []byte(`1`)))

	err = old.KVPut(ctx, itx.ProcessorKVPrefix("other")+"keepalive", []byte(`1`))
	require.Equal(t, itx.EPermissionDenied, itx.ErrorCode(err), "another processor's prefix: %v", err)
	require.NoError(t, old.KVPut(ctx, "shared", []byte(`1`)), "outside the processors' records")

	_, _, err = s.ConfigureSubscription(ctx, ref, itx.SubscriptionConfig{Name: "proc", Description: "reconfigured",
		Receiver: itx.Receiver{Action: itx.KindProcessorWake, Placement: "remote"}}, "")
	require.NoError(t, err)
	require.NoError(t, old.KVPut(ctx, k, []byte(`2`)), "a reconfigured processor's runner still writes")

	_, err = s.RemoveSubscription(ctx, ref, "proc")
	require.NoError(t, err)
	mustRemoteProcessor(t, s, ref, "proc")
	err = old.KVPut(ctx, k, []byte(`3`))
	require.Equal(t, itx.EFailedPrecondition, itx.ErrorCode(err), "the removed processor's ports: %v", err)
	require.Equal(t, itx.EFailedPrecondition, itx.ErrorCode(old.KVDelete(ctx, k)))
	_, found, err := old.KVGet(ctx, k)
	require.NoError(t, err)
	require.False(t, found, "the new processor starts with no records")

	gen, err := func() (int64, error) {
		a, err := s.acquire(ctx, ref)
		if err != nil {
			return 0, err
		}
		defer s.release(a)
		return a.procGeneration(ctx, "proc")
	}()
	require.NoError(t, err)
	fresh := mustRemotePorts(t, s, ref, "proc")
	fresh.wakeGen = gen
	require.NoError(t, fresh.KVPut(ctx, k, []byte(`4`)), "the new processor's wake, before its claim")
	_, _, err = fresh.Claim(ctx, "proc")
	require.NoError(t, err)
	require.NoError(t, fresh.KVPut(ctx, k, []byte(`5`)))
	newer := mustRemotePorts(t, s, ref, "proc")
	_, gen, err = newer.Claim(ctx, "proc")
	require.NoError(t, err)
	err = newer.Check(ctx, "proc", gen+1)
	require.Equal(t, itx.EFailedPrecondition, itx.ErrorCode(err), "a generation ahead of the record: %v", err)
	require.Contains(t, itx.ErrorMessage(err), fmt.Sprintf("generation %d was never claimed", gen+1))
	err = newer.Check(ctx, "proc", gen-1)
	require.Contains(t, itx.ErrorMessage(err), "claimed by a newer incarnation", "a generation behind it: %v", err)
	require.NoError(t, newer.Check(ctx, "proc", gen))
	err = fresh.KVPut(ctx, k, []byte(`6`))
	require.Equal(t, itx.EFailedPrecondition, itx.ErrorCode(err), "a runner a newer claim fenced: %v", err)
	v, _, err := newer.KVGet(ctx, k)
	require.NoError(t, err)
	require.Equal(t, `5`, string(v))
}

// Processor names may hold "/": processor "a"'s prefix ("processor/a/") is a prefix of processor
// "a/b"'s. The ports of "a" still write only "a"'s records, not "a/b"'s keepalive.
func TestProcessorKV_PortsDoNotWriteANestedProcessorsRecords(t *testing.T) {
	ctx := context.Background()
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir()})
	ref := StreamRef{ProjectID: projectID, Path: "/kv-nested"}
	_, err := s.Append(ctx, ref, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
	require.NoError(t, err)
	mustRemoteProcessor(t, s, ref, "a/b")
	mustRemoteProcessor(t, s, ref, "a")
	ports := mustRemotePorts(t, s, ref, "a")
	require.NoError(t, ports.KVPut(ctx, itx.ProcessorKVPrefix("a")+"keepalive", []byte(`1`)), "its own record")
	nested := itx.ProcessorKVPrefix("a/b") + "keepalive"
	err = ports.KVPut(ctx, nested, []byte(`1`))
	require.Equal(t, itx.EPermissionDenied, itx.ErrorCode(err), "processor a/b's record: %v", err)
	require.Equal(t, itx.EPermissionDenied, itx.ErrorCode(ports.KVDelete(ctx, nested)))
	_, found, err := ports.KVGet(ctx, nested)
	require.NoError(t, err)
	require.False(t, found, "nothing written into a/b's records")
}

// Removing processor "a" forgets its records, not those of processor "a/b" (whose prefix starts
// with "a"'s), whether committed or written in the same step.
func TestProcessorKV_RemovalSparesANestedProcessorsRecords(t *testing.T) {
	ctx := context.Background()
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir()})
	ref := StreamRef{ProjectID: projectID, Path: "/kv-nested-removal"}
	_, err := s.Append(ctx, ref, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
	require.NoError(t, err)
	mustRemoteProcessor(t, s, ref, "a")
	mustRemoteProcessor(t, s, ref, "a/b")
	a := mustRemotePorts(t, s, ref, "a")
	require.NoError(t, a.KVPut(ctx, itx.ProcessorKVPrefix("a")+"keepalive", []byte(`a`)))
	ab := mustRemotePorts(t, s, ref, "a/b")
	require.NoError(t, ab.KVPut(ctx, itx.ProcessorKVPrefix("a/b")+"keepalive", []byte(`ab`)))
	_, err = s.RemoveSubscription(ctx, ref, "a")
	require.NoError(t, err)
	v, found, err := ab.KVGet(ctx, itx.ProcessorKVPrefix("a/b")+"keepalive")
	require.NoError(t, err)
	require.True(t, found, "a/b's keepalive")
	require.Equal(t, `ab`, string(v))
	_, found, err = ab.KVGet(ctx, itx.ProcessorKVPrefix("a")+"keepalive")
	require.NoError(t, err)
	require.False(t, found, "a's keepalive is forgotten")
}

// chanSink is a LiveSink handing every frame to the test.
type chanSink chan LiveFrame

func (c chanSink) Send(ctx context.Context, f LiveFrame) error {
	select {
	case c <- f:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// awaitClosed waits for ch to close, failing the test after 10 s.
func awaitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not after 10s", what)
	}
}

// A processor's live engine ends with its subscription: the goroutine exits, the engine leaves
// the stream's map and its subscribers are detached (their count given back), so creating,
// watching and removing subscriptions under new names grows nothing while the stream stays
// loaded. A removed name has no processor to watch.
func TestSubscribeProcessorLive_EngineEndsWithItsSubscription(t *testing.T) {
	ctx := context.Background()
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir()})
	ref := StreamRef{ProjectID: projectID, Path: "/live"}
	_, err := s.Append(ctx, ref, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
	require.NoError(t, err)
	a, err := s.acquire(ctx, ref) // loaded throughout
	require.NoError(t, err)
	defer s.release(a)
	engines := func() map[string]*liveEngine {
		if m := a.procLiveP.Load(); m != nil {
			return *m
		}
		return nil
	}

	for i := range 20 {
		name := fmt.Sprintf("proc-%d", i)
		_, _, err := s.ConfigureSubscription(ctx, ref, itx.SubscriptionConfig{Name: name,
			Receiver: itx.Receiver{Action: itx.KindProcessorWake, Placement: "remote"}}, "")
		require.NoError(t, err)
		sink := make(chanSink, 16)
		cancel, err := s.SubscribeProcessorLive(ctx, ref, name, sink)
		require.NoError(t, err)
		defer cancel()
		select {
		case f := <-sink:
			require.True(t, f.Snapshot, "got %s", f)
		case <-time.After(10 * time.Second):
			t.Fatal("no snapshot")
		}
		e := engines()[name]
		require.NotNil(t, e)
		require.Equal(t, int64(1), a.liveCount.Load())

		_, err = s.RemoveSubscription(ctx, ref, name)
		require.NoError(t, err)
		awaitClosed(t, e.exited, name+"'s engine exits")
		require.NotContains(t, engines(), name)
		require.Eventually(t, func() bool { return a.liveCount.Load() == 0 }, 10*time.Second, time.Millisecond,
			"the subscriber is detached")
		_, err = s.SubscribeProcessorLive(ctx, ref, name, sink)
		require.Equal(t, itx.ENotFound, itx.ErrorCode(err), "got %v", err)
	}
	require.Empty(t, engines())
}

// A remote processor's alarm slice whose subscription was removed is disarmed when it fires,
// not re-armed every remoteAlarmRetry for as long as no host holds a contract of that name (it
// would load the stream every 30 s, forever, for a processor that no longer exists).
func TestRemoteAlarm_RemovedSubscriptionDisarms(t *testing.T) {
	ctx := context.Background()
	clock := clocktest.New(time.Unix(1_800_000_000, 0))
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir(), Clock: clock})
	ref := StreamRef{ProjectID: projectID, Path: "/remote-alarm"}
	_, err := s.Append(ctx, ref, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
	require.NoError(t, err)
	_, _, err = s.ConfigureSubscription(ctx, ref, itx.SubscriptionConfig{Name: "proc",
		Receiver: itx.Receiver{Action: itx.KindProcessorWake, Placement: "remote"}}, "")
	require.NoError(t, err)
	ports := mustRemotePorts(t, s, ref, "proc")
	require.NoError(t, ports.SetAlarm(ctx, itx.UnixMilli(clock.Now().Add(time.Second))))
	_, err = s.RemoveSubscription(ctx, ref, "proc")
	require.NoError(t, err)
	slices := func() map[string]int64 {
		a, err := s.acquire(ctx, ref)
		require.NoError(t, err)
		defer s.release(a)
		raw, err := a.view().store.KV(ctx, procAlarmKey)
		require.NoError(t, err)
		return decodeProcAlarms(raw)
	}
	for range 4 {
		clock.Advance(remoteAlarmRetry)
		require.NoError(t, s.Settle(ctx, ref))
	}
	require.Empty(t, slices(), "the removed processor's alarm slice")
}

func (idleRemoteHost) Stop(context.Context, string, string) error { return nil }
