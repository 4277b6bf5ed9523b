package storage

import (
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
)

// TestStream_Events_ScanMatchesDatabaseSQL reads the same pages through the direct scanner and
// through database/sql, including NULL and empty columns, provenance, and rows that overflow
// the scanner's buffer (it then continues the page in a larger one).
func TestStream_Events_ScanMatchesDatabaseSQL(t *testing.T) {
	ctx := context.Background()
	s, _ := mustCreateStream(t)
	if s.scan == nil {
		t.Skip("no direct scanner in this build")
	}
	batch := events(1, 300, 7)
	batch[3].IdempotencyKey = "k3"
	batch[4].Metadata = json.RawMessage(`{"m":1}`)
	batch[5].Metadata = json.RawMessage(`{}`)
	batch[9].Provenance = []itx.Hop{{StreamID: "src", Path: "/src", Offset: 9, Subscription: "copy", CursorChangedAtOffset: 2, Type: "orig"}}
	batch[50].Payload = json.RawMessage(`{"big":"` + strings.Repeat("x", 100_000) + `"}`)
	batch[51].Payload = json.RawMessage(`{"big":"` + strings.Repeat("y", 300_000) + `"}`)
	require.NoError(t, s.Commit(ctx, Commit{Events: batch, HeadOffset: 300}))

	viaSQL := func(q Query) []itx.Event {
		scan := s.scan
		s.scan = nil
		defer func() { s.scan = scan }()
		got, err := s.Events(ctx, q)
		require.NoError(t, err)
		return got
	}
	for _, hint := range []int{1, 64, 256} {
		for _, q := range []Query{
			{After: 0, UpTo: 300, Limit: 1000, IncludeEphemeral: true},
			{After: 0, UpTo: 300, Limit: 1000},
			{After: 40, UpTo: 60, Limit: 5, IncludeEphemeral: true},
			{After: 49, UpTo: 300, Limit: 3},
			{After: 290, UpTo: 300, Limit: 100},
		} {
			s.scan.bytesPerRow = hint
			got, err := s.scan.events(ctx, q)
			require.NoError(t, err)
			want := viaSQL(q)
			require.Equal(t, len(want), len(got), "query %+v, hint %d", q, hint)
			for i := range want {
				require.Equal(t, want[i], got[i], "query %+v, hint %d, row %d", q, hint, i)
			}
		}
	}
}

// TestStream_Close_ClosesScanners checks that a read after Close fails rather than reopening
// a connection on a stream the server let go.
func TestStream_Close_ClosesScanners(t *testing.T) {
	ctx := context.Background()
	s, _ := mustCreateStream(t)
	if s.scan == nil {
		t.Skip("no direct scanner in this build")
	}
	require.NoError(t, s.Commit(ctx, Commit{Events: events(1, 10, 0), HeadOffset: 10}))
	_, err := s.Events(ctx, Query{After: 0, UpTo: 10, Limit: 10})
	require.NoError(t, err)
	require.Len(t, s.scan.idle, 1)
	require.NoError(t, s.Close())
	require.Empty(t, s.scan.idle)
	_, err = s.Events(ctx, Query{After: 0, UpTo: 10, Limit: 10})
	require.Error(t, err)
}

// TestStream_Events_ScannersBounded checks that concurrent readers share at most ReaderConns
// scanners, and that a reader waiting for one gives up with its context.
func TestStream_Events_ScannersBounded(t *testing.T) {
	ctx := context.Background()
	s, _ := mustCreateStream(t)
	if s.scan == nil {
		t.Skip("no direct scanner in this build")
	}
	require.NoError(t, s.Commit(ctx, Commit{Events: events(1, 100, 0), HeadOffset: 100}))
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				got, err := s.Events(ctx, Query{After: 0, UpTo: 100, Limit: 100})
				if err != nil || len(got) != 100 {
					t.Errorf("got %d events, %v", len(got), err)
					return
				}
			}
		}()
	}
	wg.Wait()
	require.LessOrEqual(t, len(s.scan.idle), ReaderConns)

	for range ReaderConns { // every slot taken: the next reader waits until its context ends
		s.scan.slots <- struct{}{}
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err := s.Events(cctx, Query{After: 0, UpTo: 100, Limit: 100})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	for range ReaderConns {
		<-s.scan.slots
	}
}

// A read asking for "everything" (a huge limit) over a short range allocates for the rows the
// range holds, not for the limit: it once allocated 256 bytes per requested row up front.
func TestStream_Events_HugeLimitAllocatesForTheRange(t *testing.T) {
	ctx := context.Background()
	s, _ := mustCreateStream(t)
	require.NoError(t, s.Commit(ctx, Commit{Events: events(1, 10, 7), HeadOffset: 10}))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	got, err := s.Events(ctx, Query{After: 0, UpTo: 10, Limit: 1 << 20, IncludeEphemeral: true})
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	require.Len(t, got, 10)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(8<<20), "bytes allocated for a 10-row read")
}
