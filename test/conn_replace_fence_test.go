package test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A replaced connection receives nothing appended after the replacing open was answered: it is
// closed by then, and a closed connection receives nothing more. Appends run all along, so the
// old connection's reader is at work (between commits, or reading one) when the replace lands.
func TestConnection_ReplacedGetsNothingAppendedAfterTheReplace(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/replace-fence")
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // one event per call, as fast as they commit
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := client.Append(ctx, s, []itx.EventInput{ev("a", `{}`)}, itx.AppendOptions{}); err != nil {
				return
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	old := &orderedSink{}
	_, err := openConn(t, s, connOpts{key: "k", maxEvents: 1, noState: true}, old)
	require.NoError(t, err)
	for round := range 40 {
		waitUntil(t, "the connection receives", func() bool {
			old.mu.Lock()
			defer old.mu.Unlock()
			return len(old.events) > 0
		})
		next := &orderedSink{}
		_, err := openConn(t, s, connOpts{key: "k", after: uint64(mustDescribe(t, s).HeadOffset), maxEvents: 1, noState: true}, next)
		require.NoError(t, err)
		head := mustDescribe(t, s).HeadOffset // at or after the head when the replace committed
		waitUntil(t, "the replaced one told", func() bool { _, r := old.snapshot(); return r != nil })
		log, r := old.snapshot()
		require.Equal(t, schema.CloseReason_replaced, *r)
		require.Equal(t, "closed replaced", log[len(log)-1], "nothing after the close: %v", log)
		old.mu.Lock()
		for _, o := range old.events {
			require.LessOrEqual(t, o, head, fmt.Sprintf("round %d: the replaced connection got %d, appended after the replace answered (head %d then)", round, o, head))
		}
		old.mu.Unlock()
		old = next
	}
}
