package test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Every live view over RPC has heard serverShuttingDown, once, by the time Server.Close returns
// while its client is still connected: Close waits for each view's notice, and the notice is a
// call the client answers, so no waiting after Close is allowed here. Appends run until Close
// so that frames are in flight toward the views when their engines end. 800 views on 8
// connections: with a view's context back under the server's (the race 0759e09 fixed, which
// TestLive_ShutdownTellsEveryView shows in-process) 5 runs in 5 failed in their first round,
// 8 to 311 views untold; with 100 views, 3 runs in 3 passed.
func TestLive_ShutdownTellsEveryViewOverRPC(t *testing.T) {
	for round := range 2 {
		ts := startServer(t, server.Config{})
		ctx := ctxT(t)
		path := fmt.Sprintf("/live-shutdown-rpc/%d", round)
		writer := stream(t, ts.project(t), path)
		mustAppend(t, writer, ev("a", `{}`))
		var views []*closingLive
		for range 8 {
			s := stream(t, ts.project(t), path)
			for range 100 {
				v := &closingLive{}
				views = append(views, v)
				fut, release := s.LiveState(ctx, func(p schema.Stream_liveState_Params) error {
					return p.SetSubscriber(schema.LiveSubscriber_ServerToClient(v))
				})
				res, err := fut.Struct()
				require.NoError(t, err)
				h := res.Handle().AddRef()
				t.Cleanup(h.Release)
				release()
			}
		}
		waitUntil(t, "every view's first snapshot", func() bool {
			for _, v := range views {
				if rev, _ := v.state(); rev == 0 {
					return false
				}
			}
			return true
		})
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := client.Append(ctx, writer, []itx.EventInput{ev("b", `{}`)}, itx.AppendOptions{}); err != nil {
					return // the server is shutting down
				}
			}
		})
		closeCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
		require.NoError(t, ts.srv.Close(closeCtx))
		cancel()
		close(stop)
		wg.Wait()
		untold := 0
		for _, v := range views {
			switch r := v.reasons(); len(r) {
			case 0:
				untold++
			default:
				require.Equal(t, []schema.CloseReason{schema.CloseReason_serverShuttingDown}, r)
			}
		}
		require.Zero(t, untold, "round %d: views over RPC not told of the shutdown by the time Close returned, of %d", round, len(views))
	}
}
