package server

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/storage"
	"github.com/stretchr/testify/require"
)

// scriptedRemoteHost answers each wake with wake's answer.
type scriptedRemoteHost struct {
	wake func(ctx context.Context, w RemoteWake) (int64, int64, error)
}

func (h scriptedRemoteHost) Wake(ctx context.Context, w RemoteWake) (int64, int64, error) {
	return h.wake(ctx, w)
}

func (scriptedRemoteHost) RuntimeState(context.Context, string, string, string) (json.RawMessage, error) {
	return json.RawMessage(`{}`), nil
}

// A host whose session dies mid-wake after a second host took its contract over (and the
// stream took that mount's presence signal) does not park the subscription: the new holder is
// woken. (The RPC test of the same race for a mounted Receiver is in test/lifecycle_test.go.)
func TestWakeRemote_HostTakenOverThenGoneDoesNotPark(t *testing.T) {
	ctx := context.Background()
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir()})
	ref := StreamRef{ProjectID: projectID, Path: "/remote"}
	info := []itx.ProcessorInfo{{Name: "proc", ReducerVersion: "1", ConsumedTypes: []string{"x"}}}
	woken, gone := make(chan struct{}), make(chan struct{})
	unmountA, err := s.MountProcessorHost(projectID, "", "a", scriptedRemoteHost{wake: func(ctx context.Context, w RemoteWake) (int64, int64, error) {
		close(woken)
		<-gone
		return 0, 0, itx.Errorf(itx.ECapabilityOffline, "the processor host disconnected")
	}}, info)
	require.NoError(t, err)
	defer unmountA()
	_, _, err = s.ConfigureSubscription(ctx, ref, itx.SubscriptionConfig{Name: "proc",
		Receiver: itx.Receiver{Action: itx.KindProcessorWake, Placement: "remote"}}, "")
	require.NoError(t, err)
	res, err := s.Append(ctx, ref, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
	require.NoError(t, err)
	<-woken

	unmountB, err := s.MountProcessorHost(projectID, "", "b", scriptedRemoteHost{wake: func(ctx context.Context, w RemoteWake) (int64, int64, error) {
		return w.Head, w.Head, nil
	}}, info)
	require.NoError(t, err)
	defer unmountB()
	// The stream takes b's presence signal while a's wake is in flight.
	s.pokeCapability(projectID, presenceToken("proc"))
	a, err := s.acquire(ctx, ref)
	require.NoError(t, err)
	defer s.release(a)
	answer := make(chan int, 1)
	a.post(actorMsg{settle: answer})
	require.Equal(t, 1, <-answer, "a's wake is in flight")

	close(gone)
	require.NoError(t, s.Settle(ctx, ref))
	d, err := s.DescribeSubscription(ctx, ref, "proc")
	require.NoError(t, err)
	require.Equal(t, storage.StatusActive, d.Status, d.LastError)
	require.Equal(t, res.HeadOffset, d.ConfirmedOffset, "b did the work")
}

// blockedReceiver is a mounted Receiver that answers each batch with fail once told to.
type blockedReceiver struct {
	called, answer chan struct{}
	fail           error
}

func (r blockedReceiver) Receive(context.Context, *itx.DeliveryBatch) (int64, error) {
	select {
	case r.called <- struct{}{}:
	default:
	}
	<-r.answer
	return 0, r.fail
}

// attemptReceiver is a mounted Receiver that reports each batch's attempt number.
type attemptReceiver struct{ got chan int }

func (r attemptReceiver) Receive(_ context.Context, b *itx.DeliveryBatch) (int64, error) {
	r.got <- b.Attempt
	return 0, nil
}

// A receiver replaced under its name while a batch is in flight to it, that then fails the
// batch with its session alive (a refusal, an outage, a timeout), after the stream took the
// new mount's presence signal: the batch goes to the new receiver at once as the same attempt,
// not back off on the ladder (the clock does not move here, so a backoff would never end) nor
// count as an attempt on the event. (Only a vanished receiver was told apart: TestWakeRemote_
// HostTakenOverThenGoneDoesNotPark.)
func TestDelivery_ReplacedReceiverFailureRedeliversAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir(), Clock: clock, Random: func() float64 { return 0.5 }})
	for i, fail := range []error{
		itx.Errorf(itx.EFailedPrecondition, "the receiver refused the batch"),
		itx.Errorf(itx.EUnavailable, "handing over to the new session"),
		itx.Errorf(itx.EDeadlineExceeded, "the mounted receiver did not answer"),
	} {
		t.Run(string(itx.ErrorCode(fail)), func(t *testing.T) {
			ref := StreamRef{ProjectID: projectID, Path: fmt.Sprintf("/replaced-%d", i)}
			name := fmt.Sprintf("inbox-%d", i)
			old := blockedReceiver{called: make(chan struct{}, 1), answer: make(chan struct{}), fail: fail}
			unmountOld, err := s.MountReceiver(projectID, "", name, old)
			require.NoError(t, err)
			defer unmountOld()
			_, _, err = s.ConfigureSubscription(ctx, ref, itx.SubscriptionConfig{Name: "sub",
				Filter:   &itx.SubscriptionFilter{EventTypes: []string{"x"}},
				Receiver: itx.Receiver{Action: itx.KindITXCall, Capability: name}}, "")
			require.NoError(t, err)
			res, err := s.Append(ctx, ref, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
			require.NoError(t, err)
			<-old.called

			fresh := attemptReceiver{got: make(chan int, 10)}
			unmountFresh, err := s.MountReceiver(projectID, "", name, fresh)
			require.NoError(t, err)
			defer unmountFresh()
			// The stream takes the new mount's presence signal while the old call is in flight.
			s.pokeCapability(projectID, presence("", name))
			a, err := s.acquire(ctx, ref)
			require.NoError(t, err)
			defer s.release(a)
			answer := make(chan int, 1)
			a.post(actorMsg{settle: answer})
			require.Equal(t, 1, <-answer, "the old receiver's call is in flight")

			close(old.answer)
			require.NoError(t, s.Settle(ctx, ref))
			select {
			case attempt := <-fresh.got:
				require.Equal(t, 1, attempt, "no attempt burnt on the old receiver's failure")
			default:
				d, _ := s.DescribeSubscription(ctx, ref, "sub")
				t.Fatalf("nothing delivered to the new receiver: %+v", d.CursorState)
			}
			d, err := s.DescribeSubscription(ctx, ref, "sub")
			require.NoError(t, err)
			require.Equal(t, storage.StatusActive, d.Status, d.LastError)
			require.Equal(t, res.HeadOffset, d.ConfirmedOffset)
			require.Zero(t, d.Attempt)
			require.Zero(t, d.FailingEventSkips)
		})
	}
}

// offlineReceiver is a mounted Receiver whose session is gone (its unmount not yet run).
type offlineReceiver struct{ calls chan struct{} }

func (r offlineReceiver) Receive(context.Context, *itx.DeliveryBatch) (int64, error) {
	select {
	case r.calls <- struct{}{}:
	default:
	}
	return 0, itx.Errorf(itx.ECapabilityOffline, "the mounted receiver disconnected")
}

// A receiver (or host) that vanishes while it is still the one mounted (its unmount runs a
// moment later) parks the subscription, as nothing else is mounted to deliver to: it is not
// retried at once, over and over, until the unmount.
func TestDelivery_VanishedMountStillMountedParks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir()})
	for _, tc := range []struct {
		name  string
		mount func() (func(), error)
		recv  itx.Receiver
	}{
		{"itx-call", func() (func(), error) {
			return s.MountReceiver(projectID, "", "inbox", offlineReceiver{calls: make(chan struct{}, 1)})
		}, itx.Receiver{Action: itx.KindITXCall, Capability: "inbox"}},
		{"remote processor", func() (func(), error) {
			return s.MountProcessorHost(projectID, "", "host", idleRemoteHost{},
				[]itx.ProcessorInfo{{Name: "sub", ReducerVersion: "1", ConsumedTypes: []string{"x"}}})
		}, itx.Receiver{Action: itx.KindProcessorWake, Placement: "remote"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref := StreamRef{ProjectID: projectID, Path: "/" + strings.ReplaceAll(tc.name, " ", "-")}
			unmount, err := tc.mount()
			require.NoError(t, err)
			defer unmount()
			_, _, err = s.ConfigureSubscription(ctx, ref, itx.SubscriptionConfig{Name: "sub", Receiver: tc.recv}, "")
			require.NoError(t, err)
			_, err = s.Append(ctx, ref, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
			require.NoError(t, err)
			require.NoError(t, s.Settle(ctx, ref), "delivery comes to rest")
			d, err := s.DescribeSubscription(ctx, ref, "sub")
			require.NoError(t, err)
			require.Equal(t, storage.StatusParked, d.Status, d.LastError)
		})
	}
}

// recordingReceiver is a mounted Receiver that says which offsets it was given.
type recordingReceiver struct{ got chan []int64 }

func (r recordingReceiver) Receive(_ context.Context, b *itx.DeliveryBatch) (int64, error) {
	var offsets []int64
	for _, e := range b.Events {
		offsets = append(offsets, e.Offset)
	}
	r.got <- offsets
	return 0, nil
}

// A mount's presence signal that cannot load a parked, unloaded stream now (every stream itxd
// may hold is in use: --max-held-streams) is not lost: the stream is loaded as soon as there
// is room, and its subscription resumes. (It was dropped: the subscription stayed parked, with
// its receiver mounted, until the next mount of that name.)
func TestMount_PresenceSignalWaitsForRoom(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	clock := clocktest.New(time.Unix(1_800_000_000, 0))
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir(), Clock: clock, MaxHeldStreams: 2, IdleTimeout: time.Minute})
	ref := StreamRef{ProjectID: projectID, Path: "/parked"}
	res := parkedApp(ctx, t, s, ref)
	clock.Advance(2 * time.Minute)
	s.Sweep()
	require.Equal(t, 0, s.LoadedStreams())

	var held []*actor
	for _, path := range []string{"/held/0", "/held/1"} {
		a, err := s.acquire(ctx, StreamRef{ProjectID: projectID, Path: path})
		require.NoError(t, err)
		held = append(held, a)
	}
	defer func() {
		for _, a := range held {
			s.release(a)
		}
	}()
	// The mount, and its presence signal run to the end here (MountReceiver runs it in the
	// background), while no stream can be loaded.
	recv := recordingReceiver{got: make(chan []int64, 4)}
	s.recv.mu.Lock()
	s.recv.gen++
	s.recv.putLocked(mountKey{projectID, "", "inbox"}, &mount{receiver: recv, gen: s.recv.gen})
	s.recv.mu.Unlock()
	s.pokeCapability(projectID, "inbox")
	require.Equal(t, 2, s.LoadedStreams(), "no room for the parked stream")

	s.release(held[0]) // room again
	held = held[1:]
	var offsets []int64
	require.Eventually(t, func() bool {
		select {
		case offsets = <-recv.got:
			return true
		default:
			clock.Advance(time.Second) // the retry of a load that found no room is timed
			return false
		}
	}, 10*time.Second, time.Millisecond, "the parked subscription resumed")
	require.Equal(t, []int64{res.HeadOffset}, offsets)
}

// A mount whose presence signal runs while a parked stream is being unloaded (the idle sweep
// chose it a moment before) is not lost: the stream records its parked subscription as it
// unloads, and the signal, which waits for that, loads it again. (The signal found the stream
// neither loaded nor yet recorded as parked, and the subscription stayed parked with its
// receiver mounted until the next mount of that name.)
func TestMount_PresenceSignalDuringAnUnload(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir()})
	ref := StreamRef{ProjectID: projectID, Path: "/leaving"}
	res := parkedApp(ctx, t, s, ref)

	// The sweep's choice, as Server.sweep makes it.
	s.mu.Lock()
	a := s.actors[ref]
	require.Zero(t, a.refs)
	delete(s.actors, ref)
	s.unloading[ref] = a
	a.dcancel()
	s.mu.Unlock()

	recv := recordingReceiver{got: make(chan []int64, 4)}
	s.recv.mu.Lock()
	s.recv.gen++
	s.recv.putLocked(mountKey{projectID, "", "inbox"}, &mount{receiver: recv, gen: s.recv.gen})
	s.recv.mu.Unlock()
	poked := make(chan struct{})
	go func() { s.pokeCapability(projectID, "inbox"); close(poked) }()

	a.unload()
	s.mu.Lock()
	delete(s.unloading, ref)
	s.mu.Unlock()
	<-poked
	select {
	case offsets := <-recv.got:
		require.Equal(t, []int64{res.HeadOffset}, offsets)
	case <-ctx.Done():
		t.Fatal("the parked subscription never resumed")
	}
}

// parkedApp configures an itx-call subscription "app" on ref (to "inbox", which nothing mounts),
// appends one event and returns once the subscription has parked, with the append's result.
func parkedApp(ctx context.Context, t *testing.T, s *Server, ref StreamRef) itx.AppendResult {
	t.Helper()
	_, _, err := s.ConfigureSubscription(ctx, ref, itx.SubscriptionConfig{Name: "app",
		Receiver: itx.Receiver{Action: itx.KindITXCall, Capability: "inbox",
			Delivery: &itx.DeliveryPolicy{Start: itx.StartNow, OnFailingEvent: itx.OnFailingHalt}}}, "")
	require.NoError(t, err)
	res, err := s.Append(ctx, ref, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
	require.NoError(t, err)
	require.NoError(t, s.Settle(ctx, ref))
	d, err := s.DescribeSubscription(ctx, ref, "app")
	require.NoError(t, err)
	require.Equal(t, storage.StatusParked, d.Status)
	return res
}

func (scriptedRemoteHost) Stop(context.Context, string, string) error { return nil }

// A host that is mounted and answers a wake with a failure of its own (unavailable, internal)
// is an outage, not an absence: the subscription backs off along the ladder (an attempt burnt, a
// retry time set) and does not park. Only a host that is gone (capabilityOffline) parks it.
func TestWakeRemote_HostFailureBacksOffNotParks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir(), Clock: clock, Random: func() float64 { return 0.5 }})
	for i, fail := range []error{
		itx.Errorf(itx.EUnavailable, "the processor host is draining"),
		itx.Errorf(itx.EInternal, "the processor host broke"),
	} {
		t.Run(string(itx.ErrorCode(fail)), func(t *testing.T) {
			ref := StreamRef{ProjectID: projectID, Path: fmt.Sprintf("/host-fails-%d", i)}
			proc := fmt.Sprintf("proc%d", i)
			info := []itx.ProcessorInfo{{Name: proc, ReducerVersion: "1", ConsumedTypes: []string{"x"}}}
			unmount, err := s.MountProcessorHost(projectID, "", proc, scriptedRemoteHost{wake: func(context.Context, RemoteWake) (int64, int64, error) {
				return 0, 0, fail
			}}, info)
			require.NoError(t, err)
			defer unmount()
			_, _, err = s.ConfigureSubscription(ctx, ref, itx.SubscriptionConfig{Name: proc,
				Receiver: itx.Receiver{Action: itx.KindProcessorWake, Placement: "remote"}}, "")
			require.NoError(t, err)
			_, err = s.Append(ctx, ref, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
			require.NoError(t, err)
			require.NoError(t, s.Settle(ctx, ref))
			d, err := s.DescribeSubscription(ctx, ref, proc)
			require.NoError(t, err)
			require.Equal(t, storage.StatusActive, d.Status, d.LastError)
			require.Equal(t, 1, d.Attempt, d.LastError)
			require.Equal(t, clock.Now().Add(time.Second).UnixMilli(), d.NextAttemptAt, "backs off along the ladder's first rung")
			require.Contains(t, d.LastError, fail.Error())
		})
	}
}
