package main

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/cmd/itx/internal/repl"
	"github.com/stretchr/testify/require"
)

// gateWriter holds its first write until open is closed (a paused pipe), then writes into out.
type gateWriter struct {
	once    sync.Once
	blocked chan struct{} // closed when the first write arrived
	open    chan struct{}
	out     *syncBuffer
}

func (w *gateWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.blocked) })
	<-w.open
	return w.out.Write(p)
}

// .tail --from N prints the durable events after N and then everything appended once it is open:
// an ephemeral event the stream held before the tail started is not printed, also when the tail
// opens its connection again still catching up (its output paused until its buffer filled). The
// connection opened again asks for the ephemeral events after the last offset printed, and it
// printed those older ones then, as if they had been appended while it was open.
func TestTail_FromNeverPrintsEphemeralEventsFromBeforeItStarted(t *testing.T) {
	ts := startServer(t)
	// More than the first read and a full buffer (10,000 events each) hold: the tail opens
	// again before the ephemeral event, whatever the batches' timing.
	const total, eph = 25_000, 24_500
	events := make([]itx.EventInput, 0, 1000)
	for i := 1; i <= total; i++ {
		e := itx.EventInput{Type: "d"}
		if i == eph {
			e = itx.EventInput{Type: "typing", Ephemeral: true}
		}
		events = append(events, e)
		if len(events) == 1000 {
			ts.appendDirect(t, "/tail-quiet", events...)
			events = events[:0]
		}
	}
	out := newSyncBuffer()
	w := &gateWriter{blocked: make(chan struct{}), open: make(chan struct{}), out: out}
	errs := newSyncBuffer()
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	rs, err := repl.Connect(cctx, repl.Config{Addr: ts.addr, Token: ts.token, Out: w, Err: errs, Format: repl.FormatTable})
	require.NoError(t, err)
	t.Cleanup(func() { rs.Close() })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cctx2, ccancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer ccancel2()
	result := make(chan error, 1)
	go func() { result <- rs.RunCommand(ctx, "tail /tail-quiet --from 0") }()
	select {
	case <-w.blocked:
	case <-time.After(20 * time.Second):
		t.Fatal("the tail printed nothing")
	}
	// The tail's connection delivered past what its first read and its buffer hold: it
	// overflowed, and opens again, after the last event printed, once its output goes on.
	view, err := client.WatchStream(cctx2, ts.streamDirect(t, cctx2, "/tail-quiet"))
	require.NoError(t, err)
	defer view.Cancel(context.Background())
	_, err = view.StreamState(cctx2, func(st itx.LiveStreamState) bool {
		for _, c := range st.Connections {
			if c.OpenedBy == "itx tail" && c.Delivered >= eph {
				return true
			}
		}
		return false
	})
	require.NoError(t, err)
	// Appended once the tail is open: printed, ephemeral or not.
	ts.appendDirect(t, "/tail-quiet", itx.EventInput{Type: "live", Ephemeral: true}, itx.EventInput{Type: "end"})
	close(w.open) // the output goes on; by now the tail's buffer is full: it opens again
	require.True(t, out.waitFor(" end "), "the last event: %d lines", strings.Count(out.String(), "\n"))
	cancel()
	require.NoError(t, <-result)

	var offsets []int64
	var ephemeral []string
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		first := strings.Fields(line)[0]
		if strings.HasSuffix(first, "~") {
			ephemeral = append(ephemeral, line)
			first = strings.TrimSuffix(first, "~")
		}
		n, err := strconv.ParseInt(first, 10, 64)
		require.NoError(t, err, "line %q", line)
		offsets = append(offsets, n)
	}
	require.Len(t, ephemeral, 1, "only the ephemeral event appended while it was open: %q", ephemeral)
	require.Contains(t, ephemeral[0], "live")
	want := []int64{}
	for i := int64(1); i <= total+2; i++ {
		if i != eph {
			want = append(want, i)
		}
	}
	require.Equal(t, want, offsets, "every durable event once, in order")
}
