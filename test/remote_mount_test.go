package test

import (
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

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
