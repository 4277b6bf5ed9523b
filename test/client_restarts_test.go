package test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/processors/remote"
	"github.com/itx-dev/itx/schema"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// A remote processor host and a client.Follow, both in this process, across several itxd
// restarts in a row (SIGKILL, SIGTERM, SIGKILL): each time both come back on their own, the
// forwarder forwards every message once (no side effect twice, none lost), Follow delivers
// each offset once, in order, and once both are stopped nothing of theirs is left running (a
// connection, a session or a watchdog kept from an earlier incarnation of itxd would show).
func TestClient_SDKAcrossRepeatedRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	dataDir, addr := t.TempDir(), freeAddr(t)
	proc := startItxd(t, dataDir, "--listen", addr, "--processors", "")
	ctx := ctxLong(t)
	// The goroutines of itxd's processes (their watchers and log copiers), started along the
	// way, are the test's, not the client's.
	opts := append(clientLeakOptions(),
		goleak.IgnoreAnyFunction("github.com/itx-dev/itx/test.startItxdBin.func1"),
		goleak.IgnoreAnyFunction("os/exec.(*Cmd).writerDescriptor.func1"))

	hostCtx, stopHost := context.WithCancel(ctx)
	hostDone := make(chan error, 1)
	mounted := make(chan struct{}, 16)
	go func() {
		hostDone <- remote.Run(hostCtx, remote.Config{Addr: addr, Token: proc.creds.ProjectToken, Name: "restarts",
			Host: referenceHost(t, "forwarder"), MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
			Logf: t.Logf, Mounted: func() { mounted <- struct{}{} }})
	}()
	defer func() { stopHost(); <-hostDone }()
	awaitMount(t, mounted)

	var mu sync.Mutex
	var followed []int64
	connected := make(chan struct{}, 16)
	followCtx, stopFollow := context.WithCancel(ctx)
	followDone := make(chan error, 1)
	go func() {
		_, err := client.Follow(followCtx, client.FollowConfig{Addr: addr, Token: proc.creds.ProjectToken, Path: "/restarts/queue",
			MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Logf: t.Logf,
			Connected: func() { connected <- struct{}{} }},
			func(_ context.Context, b itx.DeliveryBatch) error {
				mu.Lock()
				defer mu.Unlock()
				for _, e := range b.Events {
					followed = append(followed, e.Offset)
				}
				return nil
			})
		followDone <- err
	}()
	defer func() { stopFollow(); <-followDone }()
	<-connected

	// withProject runs f on a connection of its own, closed after.
	withProject := func(f func(s schema.Stream)) {
		conn, err := client.Dial(ctx, addr)
		require.NoError(t, err)
		defer conn.Close()
		p := conn.Login(ctx, proc.creds.ProjectToken)
		defer p.Release()
		s := client.Stream(ctx, p, "/restarts/queue")
		defer s.Release()
		f(s)
	}
	withProject(func(s schema.Stream) { configureRemote(t, s, "forwarder") })

	sent := 0
	for round, how := range []string{"SIGKILL", "SIGTERM", "SIGKILL", ""} {
		var head int64
		withProject(func(s schema.Stream) {
			for range 3 {
				in := examples.InboxMessage.Input(json.RawMessage(fmt.Sprintf(`{"n":%d}`, sent)), fmt.Sprintf("m-%d", sent))
				head = mustAppend(t, s, in).HeadOffset
				sent++
			}
			sub := client.Subscription(ctx, s, "forwarder")
			defer sub.Release()
			_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
			require.NoError(t, err, "round %d", round)
			require.Equal(t, sent, countType(t, s, string(examples.OutboxForwarded)), "round %d: each message forwarded once", round)
		})
		waitUntil(t, "followed", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(followed) > 0 && followed[len(followed)-1] >= head
		})
		switch how {
		case "SIGKILL":
			proc.kill9(t)
		case "SIGTERM":
			require.NoError(t, proc.stop(t))
		default:
			continue
		}
		proc = startItxd(t, dataDir, "--listen", addr, "--processors", "")
		awaitMount(t, mounted)
		select {
		case <-connected:
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: Follow did not connect again", round)
		}
	}
	mu.Lock()
	for i := 1; i < len(followed); i++ {
		require.Greater(t, followed[i], followed[i-1], "Follow delivered offsets once, in order: %v", followed)
	}
	mu.Unlock()

	stopHost()
	require.NoError(t, <-hostDone)
	hostDone <- nil
	stopFollow()
	<-followDone
	followDone <- nil
	verifyNoLeak(t, opts...)
}
