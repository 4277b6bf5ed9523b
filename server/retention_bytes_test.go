package server

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/storage"
	"github.com/stretchr/testify/require"
)

// The size a maxBytes policy keeps is measured a chunk at a time between the stream's steps,
// while appends go on: every chunk's events and every commit's are counted once, so the trim
// keeps exactly the newest events that fit. What to trim is read a chunk at a time too: a pass
// that read a chunk only trims it, and the next pass follows at once.
func TestRetention_MaxBytesMeasuredInChunksWhileAppending(t *testing.T) {
	defer func(n int) { sizeScanRows = n }(sizeScanRows)
	sizeScanRows = 7
	ctx := context.Background()
	clk := clocktest.New(time.Unix(1_800_000_000, 0))
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir(), Clock: clk})
	ref := StreamRef{ProjectID: projectID, Path: "/sized"}
	sized := func(i int) itx.EventInput { // storage.EventSize 100
		body := fmt.Sprintf(`{"i":%d,"pad":""}`, i)
		return itx.EventInput{Type: "e", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d,"pad":"%s"}`, i, strings.Repeat("x", 99-len(body))))}
	}
	for i := 1; i <= 200; i++ {
		_, err := s.Append(ctx, ref, []itx.EventInput{sized(i)}, itx.AppendOptions{})
		require.NoError(t, err)
	}
	// Appends race the measure's chunks (29 of them).
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 201; i <= 260; i++ {
			_, err := s.Append(ctx, ref, []itx.EventInput{sized(i)}, itx.AppendOptions{})
			require.NoError(t, err)
		}
	}()
	require.NoError(t, s.SetRetention(ctx, Admin{}, ref, 0, 0, 5_000))
	wg.Wait()
	clk.Advance(2 * time.Minute)
	_, err := s.Append(ctx, ref, []itx.EventInput{sized(261)}, itx.AppendOptions{}) // the next pass
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := s.Describe(ctx, ref)
		require.NoError(t, err)
		return info.TrimmedThrough == 211
	}, 10*time.Second, time.Millisecond, "the newest 50 events kept")
	page, err := s.ReadEvents(ctx, ref, itx.Query{Limit: 100})
	require.NoError(t, err)
	events := page.Events
	require.Len(t, events, 50)
	var size int64
	for i := range events {
		size += storage.EventSize(&events[i])
	}
	require.Equal(t, int64(5_000), size)
}
