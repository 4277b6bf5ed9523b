package test

import (
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/remote"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A remote host whose first connection is accepted and then never answered (a stalled proxy or
// load balancer in front of itxd) gives up on it after its mount timeout and reconnects, instead
// of waiting on its login and mount for as long as it runs.
func TestRemote_StalledConnectionIsAbandoned(t *testing.T) {
	ts := startServer(t, server.Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if accepted.Add(1) == 1 {
				t.Cleanup(func() { c.Close() }) // the black hole: held open, never answered
				continue
			}
			up, err := net.Dial("tcp", ts.addr)
			if err != nil {
				c.Close()
				continue
			}
			go func() { io.Copy(up, c); up.Close() }()
			go func() { io.Copy(c, up); c.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close() })

	mounted := make(chan struct{}, 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = remote.Run(ctx, remote.Config{Addr: ln.Addr().String(), Token: ts.creds.ProjectToken, Name: "stalled",
			Host: referenceHost(t, "guestbook"), MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
			MountTimeout: 300 * time.Millisecond,
			Logf:         func(f string, a ...any) { t.Logf(f, a...) }, Mounted: func() { mounted <- struct{}{} }})
	}()
	t.Cleanup(func() { cancel(); <-done })
	awaitMount(t, mounted)
	require.GreaterOrEqual(t, accepted.Load(), int32(2), "mounted over a second connection")
}

// slowForwarder forwards each "slow/in" as one "slow/out", a blocker that takes per (a vendor
// round trip, say) for each event.
func slowForwarder(per time.Duration) processors.Contract[int] {
	return processors.Contract[int]{
		Name: "slow", ConsumedTypes: []string{"slow/in"}, ReducerVersion: "1",
		InitialState: func() int { return 0 },
		Reduce:       func(n int, e itx.Event) int { return n + 1 },
		ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
			if a.Event == nil {
				return nil
			}
			out := itx.EventInput{Type: "slow/out", IdempotencyKey: a.IdempotencyKey("out", a.Event)}
			// Blocking: the forward is the event's whole consequence.
			a.BlockProcessorWhile("out", func(ctx context.Context) error {
				t := time.NewTimer(per)
				defer t.Stop()
				select {
				case <-t.C:
				case <-ctx.Done():
					return ctx.Err()
				}
				_, err := a.Append(ctx, out)
				return err
			})
			return nil
		},
	}
}

// A remote host's wake budget ends a wake between frames, not inside one: a backlog whose one
// frame (a page) takes longer than the budget still commits, and the next wake goes on from there.
// The budget cut the frame in progress, so such a backlog was redelivered whole, forever.
func TestRemote_WakeBudgetDoesNotCutAFrame(t *testing.T) {
	ts := startServer(t, server.Config{})
	host := processors.NewHost("test")
	require.NoError(t, processors.Add(host, func() processors.Contract[int] { return slowForwarder(20 * time.Millisecond) }))
	mounted := make(chan struct{}, 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = remote.Run(ctx, remote.Config{Addr: ts.addr, Token: ts.creds.ProjectToken, Name: "slow-host", Host: host,
			WakeBudget: 100 * time.Millisecond, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
			Logf: func(f string, a ...any) { t.Logf(f, a...) }, Mounted: func() { mounted <- struct{}{} }})
	}()
	t.Cleanup(func() { cancel(); <-done })
	awaitMount(t, mounted)
	s := stream(t, ts.project(t), "/remote/slow")
	inputs := make([]itx.EventInput, 20)
	for i := range inputs {
		inputs[i] = ev("slow/in", `{}`)
	}
	head := mustAppend(t, s, inputs...).HeadOffset
	configureInstance(t, s, "slow", "", "remote")
	sub, _ := processorOf(t, s, "slow")
	_, err := client.WaitUntilProcessed(ctxT(t), sub, head, 0)
	require.NoError(t, err)
	require.Equal(t, 20, countType(t, s, "slow/out"))
}
