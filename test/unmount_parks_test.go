package test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/processors/remote"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A receiver's or processor host's going away parks the subscriptions it served at once, caught
// up or not (no event needed to find out), and a new mount resumes them (issue 11: the host's
// disconnect is an eviction).
func TestUnmount_ParksWhatTheMountServed(t *testing.T) {
	t.Run("itx-call receiver released", func(t *testing.T) {
		ts := startServer(t, server.Config{})
		ctx := ctxT(t)
		p := ts.project(t)
		s := stream(t, p, "/calls")
		subs := client.Subscriptions(ctx, s)
		defer subs.Release()
		_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "call", Start: "now",
			Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}})
		require.NoError(t, err)
		var mu sync.Mutex
		var got []int64
		recv := func(_ context.Context, b itx.DeliveryBatch) (int64, error) {
			mu.Lock()
			defer mu.Unlock()
			for _, e := range b.Events {
				got = append(got, e.Offset)
			}
			return 0, nil
		}
		h, err := client.MountReceiver(ctx, p, "inbox", client.ServeReceiver(recv))
		require.NoError(t, err)
		head := mustAppend(t, s, ev("a", `{}`)).HeadOffset
		sub := client.Subscription(ctx, s, "call")
		defer sub.Release()
		_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
		require.NoError(t, err)

		h.Release() // unmounts
		waitUntil(t, "parked with nothing appended", func() bool {
			d, err := client.DescribeSubscription(ctx, sub)
			require.NoError(t, err)
			return d.Status == itx.StatusParked && d.LastError != ""
		})
		d, err := client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		require.Contains(t, d.LastError, "capabilityOffline")
		require.Equal(t, head, d.ConfirmedOffset)

		h, err = client.MountReceiver(ctx, p, "inbox", client.ServeReceiver(recv))
		require.NoError(t, err)
		defer h.Release()
		waitUntil(t, "active again", func() bool {
			d, err := client.DescribeSubscription(ctx, sub)
			require.NoError(t, err)
			return d.Status == itx.StatusActive
		})
		head = mustAppend(t, s, ev("a", `{}`)).HeadOffset
		_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
		require.NoError(t, err)
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, []int64{head - 1, head}, got, "each event once, to the mount of its time")
	})

	t.Run("remote processor host disconnected", func(t *testing.T) {
		ts := startServer(t, server.Config{})
		ctx := ctxT(t)
		p := ts.project(t)
		s := stream(t, p, "/remote/gone")
		configureRemote(t, s, "guestbook")
		stop := mountedRemoteHost(t, remote.Config{Addr: ts.addr, Token: ts.creds.ProjectToken, Name: "short-lived", Host: referenceHost(t, "guestbook")})
		head := mustAppend(t, s, examples.GuestbookSigned.Input(examples.Signed{Name: "ada", Message: "hi"}, "")).HeadOffset
		sub, _ := processorOf(t, s, "guestbook")
		_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
		require.NoError(t, err)

		stop() // the host's connection ends
		waitUntil(t, "parked with nothing appended", func() bool {
			d, err := client.DescribeSubscription(ctx, sub)
			require.NoError(t, err)
			return d.Status == itx.StatusParked
		})
		d, err := client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		require.Contains(t, d.LastError, `no processor host announcing "guestbook" is mounted`)

		awaitMount(t, runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "next", referenceHost(t, "guestbook")))
		head = mustAppend(t, s, examples.GuestbookSigned.Input(examples.Signed{Name: "grace", Message: "hi"}, "")).HeadOffset
		_, err = client.WaitUntilProcessed(ctx, sub, head, 0)
		require.NoError(t, err)
		d, err = client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		require.Equal(t, itx.StatusActive, d.Status)
	})
}

// A provider that lets its mount go while it is answering a delivery (the C++ example cancels
// its handle once its Receiver has the event, before its answer is written) leaves the caught-up
// subscription parked, as a release between deliveries does. The unmount skipped the
// subscription as in flight, the outcome (a success) then left it active, and it showed active
// with nothing mounted until its next event.
func TestUnmount_DuringADeliveryParksOnceItIsAnswered(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	for i := range 5 {
		s := stream(t, p, fmt.Sprintf("/calls/%d", i))
		name, inbox := fmt.Sprintf("call-%d", i), fmt.Sprintf("inbox-%d", i)
		subs := client.Subscriptions(ctx, s)
		_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: name, Start: "now",
			Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: inbox}})
		subs.Release()
		require.NoError(t, err)

		handle := make(chan schema.Handle, 1)
		h, err := client.MountReceiver(ctx, p, inbox, client.ServeReceiver(func(ctx context.Context, _ itx.DeliveryBatch) (int64, error) {
			select {
			case h := <-handle: // the first delivery: unmount before answering it
				f, release := h.Cancel(ctx, nil)
				defer release()
				if _, err := f.Struct(); err != nil {
					return 0, err
				}
			default:
			}
			return 0, nil
		}))
		require.NoError(t, err)
		handle <- h
		head := mustAppend(t, s, ev("a", `{}`)).HeadOffset

		sub := client.Subscription(ctx, s, name)
		require.Eventually(t, func() bool {
			d, err := client.DescribeSubscription(ctx, sub)
			require.NoError(t, err)
			return d.Status == itx.StatusParked && d.ConfirmedOffset == head
		}, 5*time.Second, time.Millisecond, "round %d: parked, its event confirmed, once the mount it answered from is gone", i)
		d, err := client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		require.Contains(t, d.LastError, "capabilityOffline")
		sub.Release()
		h.Release()
	}
}
