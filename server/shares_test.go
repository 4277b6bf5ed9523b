package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// A deleted project leaves nothing in the shares: its webhook semaphore, its crossing and its
// itx_project_share_full_total series go with it, while another project's stay.
func TestShares_ForgottenWithTheirProject(t *testing.T) {
	ctx := context.Background()
	s, kept := mustOpen(t, Config{DataDir: t.TempDir()})
	info, _, _, err := s.CreateProject(ctx, Admin{}, "doomed")
	require.NoError(t, err)
	for _, p := range []string{kept, info.ID} {
		s.webhookSlots(p)
		s.shareFull(p, flagWebhookShare, 1)
	}
	require.Equal(t, 2, testutil.CollectAndCount(s.metrics.ShareHits))

	require.NoError(t, s.DeleteProject(ctx, Admin{}, info.ID, true))
	s.shares.mu.Lock()
	_, webhooks := s.shares.webhooks[info.ID]
	_, full := s.shares.full[shareKey{info.ID, flagWebhookShare}]
	_, keptFull := s.shares.full[shareKey{kept, flagWebhookShare}]
	left := len(s.shares.webhooks)
	s.shares.mu.Unlock()
	require.False(t, webhooks, "the deleted project's webhook semaphore")
	require.False(t, full, "the deleted project's crossing")
	require.True(t, keptFull, "the other project's crossing")
	require.Equal(t, 1, left)
	require.Equal(t, 1, testutil.CollectAndCount(s.metrics.ShareHits), "the deleted project's series")
	require.Equal(t, 1, testutil.CollectAndCount(s.metrics.AtShare), "the deleted project's at-share series")
	require.Equal(t, int32(1), s.shares.anyFull.Load())
}

// itx_project_at_share says who stands at a share now: 1 from the refusal at the share until the
// project holds half its share or less (the crossing the logs report), gone then; another
// project is not marked.
func TestShares_AtShareWhileThere(t *testing.T) {
	s, project := mustOpen(t, Config{DataDir: t.TempDir(), MaxLive: 8, MaxLivePerProject: 4})
	at := func() float64 {
		return testutil.ToFloat64(s.metrics.AtShare.WithLabelValues(project, flagLiveShare))
	}
	series := func() int { return testutil.CollectAndCount(s.metrics.AtShare) }
	for range 4 {
		require.NoError(t, s.takeLiveShare(project))
	}
	require.Equal(t, 0, series(), "at its share, not past it: nothing refused yet")
	require.Error(t, s.takeLiveShare(project))
	require.Equal(t, 1, series())
	require.Equal(t, 1.0, at())
	s.releaseLiveShare(project) // 3 of 4: still at it, as the logs say
	require.Equal(t, 1.0, at())
	s.releaseLiveShare(project) // 2 of 4: under it again
	require.Equal(t, 0, series())
}

// pathReceiver is a mounted Receiver that reports each batch's source path, then answers once
// told to (or once the delivery gives up).
type pathReceiver struct {
	got    chan string
	answer chan struct{}
}

func (r pathReceiver) Receive(ctx context.Context, b *itx.DeliveryBatch) (int64, error) {
	r.got <- b.Path
	select {
	case <-r.answer:
		return 0, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// A delivery try a loaded stream starts itself takes the stream in use within its project's
// share of the held streams: past it the try does not start, and starts once the project holds
// fewer (its stream is told, nothing else would step it: it is loaded, so the alarm loop has
// nothing to load). Before, a delivery took the stream in use without looking, so a project's
// deliveries hanging on its loaded idle streams held them past its share.
func TestPinDelivery_WaitsForItsProjectsShare(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The clock stands still: no timer (a cursor flush, the alarm loop) steps the waiting stream.
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	s, p := mustOpen(t, Config{DataDir: t.TempDir(), Clock: clock, MaxHeldStreams: 8, MaxLoadedStreams: 8, MaxHeldStreamsPerProject: 3})
	const streams = 4
	for i := range streams {
		ref := StreamRef{ProjectID: p, Path: fmt.Sprintf("/s%d", i)}
		_, _, err := s.ConfigureSubscription(ctx, ref, itx.SubscriptionConfig{Name: "sub",
			Receiver: itx.Receiver{Action: itx.KindITXCall, Capability: "sink"}}, "")
		require.NoError(t, err)
		_, err = s.Append(ctx, ref, []itx.EventInput{{Type: "x"}}, itx.AppendOptions{})
		require.NoError(t, err)
		require.NoError(t, s.Settle(ctx, ref)) // parked: its receiver is not mounted
	}
	recv := pathReceiver{got: make(chan string, streams), answer: make(chan struct{})}
	unmount, err := s.MountReceiver(p, "", "sink", recv) // every parked subscription resumes
	require.NoError(t, err)
	defer unmount()
	defer close(recv.answer)
	for range 3 {
		select {
		case <-recv.got:
		case <-ctx.Done():
			t.Fatal("the deliveries within the share did not start")
		}
	}
	hits := s.metrics.ShareHits.WithLabelValues(p, flagHeldShare)
	require.Eventually(t, func() bool { return testutil.ToFloat64(hits) > 0 }, 30*time.Second, time.Millisecond,
		"the fourth delivery was not refused at the share")
	select {
	case path := <-recv.got:
		t.Fatalf("a delivery on %s past the project's share of 3 held streams", path)
	default:
	}

	recv.answer <- struct{}{} // one delivery done: its stream is let go, and the waiting one starts
	select {
	case <-recv.got:
	case <-ctx.Done():
		t.Fatal("the delivery waiting for the project's share never started")
	}
}

// alarmHost is a mounted processor host that reports each alarm wake's stream, then, once told
// to, disarms the stream's alarm (so it does not fire again) and answers. It refuses every other
// wake at once.
type alarmHost struct {
	idleRemoteHost
	got    chan string
	answer chan struct{}
}

func (h alarmHost) Wake(ctx context.Context, w RemoteWake) (int64, int64, error) {
	if !w.Alarm {
		return h.idleRemoteHost.Wake(ctx, w)
	}
	h.got <- w.Ref.Path
	select {
	case <-h.answer:
		return 0, 0, w.Ports.SetAlarm(ctx, 0)
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
}

// A processor alarm fire takes its stream in use within its project's share of the held
// streams, as a delivery try does: past it the fire does not start, and starts once the project
// holds fewer (nothing else would step the stream: its slice is due already and the clock stands
// still). Before, a fire took the stream in use without looking, so a remote host hanging on its
// alarm wakes held a project's streams past its share.
func TestPinAlarm_WaitsForItsProjectsShare(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	s, p := mustOpen(t, Config{DataDir: t.TempDir(), Clock: clock, MaxHeldStreams: 8, MaxLoadedStreams: 8, MaxHeldStreamsPerProject: 3})
	const streams = 4
	host := alarmHost{got: make(chan string, streams), answer: make(chan struct{})}
	info := []itx.ProcessorInfo{{Name: "proc", ReducerVersion: "1", ConsumedTypes: []string{"x"}}}
	unmount, err := s.MountProcessorHost(p, "", "host", host, info)
	require.NoError(t, err)
	defer unmount()
	defer close(host.answer)
	due := itx.UnixMilli(clock.Now().Add(time.Second))
	for i := range streams {
		ref := StreamRef{ProjectID: p, Path: fmt.Sprintf("/s%d", i)}
		_, _, err := s.ConfigureSubscription(ctx, ref, itx.SubscriptionConfig{Name: "proc",
			Receiver: itx.Receiver{Action: itx.KindProcessorWake, Placement: "remote"}}, "")
		require.NoError(t, err)
		ports := &ProcessorPorts{srv: s, ref: ref, name: "proc", contract: "proc", gen: s.remoteHost(p, "", "proc").gen}
		require.NoError(t, ports.SetAlarm(ctx, due))
	}
	clock.Advance(time.Second) // every stream's slice comes due at once
	fired := map[string]bool{}
	for range 3 {
		select {
		case path := <-host.got:
			fired[path] = true
		case <-ctx.Done():
			t.Fatal("the alarm fires within the share did not start")
		}
	}
	hits := s.metrics.ShareHits.WithLabelValues(p, flagHeldShare)
	require.Eventually(t, func() bool { return testutil.ToFloat64(hits) > 0 }, 30*time.Second, time.Millisecond,
		"the fourth alarm fire was not refused at the share")
	select {
	case path := <-host.got:
		t.Fatalf("an alarm fire on %s past the project's share of 3 held streams", path)
	default:
	}

	host.answer <- struct{}{} // one fire done: its stream is let go, and the waiting one starts
	select {
	case path := <-host.got:
		require.False(t, fired[path], "got a second fire on %s, want the fire waiting for the share", path)
	case <-ctx.Done():
		t.Fatal("the alarm fire waiting for the project's share never started")
	}
}
