package test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// refoldingHost is a remote processor host that processes through the head until it is rewound;
// from then on each wake refolds one more event of the history (its reduction lagging the
// processing cursor the rewind set) and commits that, never getting past the cursor: a refold
// far slower than a wake's bound, as a new reducer over a long history is.
type refoldingHost struct {
	quietHost
	mu        sync.Mutex
	processed int64 // the rewind's cursor, once rewound
	reduced   int64
	refolds   int // wakes since the rewind
}

func (h *refoldingHost) Wake(ctx context.Context, call schema.ProcessorHost_wake) error {
	req, err := call.Args().Request()
	if err != nil {
		return err
	}
	name, err := req.Name()
	if err != nil {
		return err
	}
	head := int64(req.HeadOffset())
	h.mu.Lock()
	if from := int64(req.ReprocessFrom()); from > 0 && h.processed == 0 {
		h.processed = from - 1
	}
	progress := itx.ProcessorProgress{ReducerVersion: "1", ReducedThrough: head, ProcessedThrough: head, State: json.RawMessage(`{}`)}
	if h.processed > 0 {
		h.reduced++
		h.refolds++
		progress.ReducedThrough, progress.ProcessedThrough = h.reduced, h.processed
	}
	h.mu.Unlock()
	ports := req.Ports()
	cf, release := ports.Claim(ctx, func(a schema.ProcessorPorts_claim_Params) error { return a.SetName(name) })
	defer client.ReleaseAfter(ctx, release)
	// Awaited under ctx, which ends when the connection closes: a bare Struct() would hold the
	// connection's Close (at the test's end, with a wake in flight) waiting for this handler.
	claimed, err := client.Await(ctx, cf)
	if err != nil {
		return err
	}
	raw, err := json.Marshal(progress)
	if err != nil {
		return err
	}
	mf, release2 := ports.Commit(ctx, func(a schema.ProcessorPorts_commit_Params) error {
		a.SetGeneration(claimed.Generation())
		if err := a.SetName(name); err != nil {
			return err
		}
		return a.SetProgress(string(raw))
	})
	defer client.ReleaseAfter(ctx, release2)
	if _, err := client.Await(ctx, mf); err != nil {
		return err
	}
	return reportAt(call, progress.ProcessedThrough, progress.ReducedThrough)
}

func (h *refoldingHost) refoldWakes() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.refolds
}

// TestRemote_RefoldProgressStartsTheLadderOver: a remote processor rewound over a history whose
// refold takes many wakes commits its reduction further at each, without getting past the
// cursor until it is done. Each such wake is an outage (no progress past the cursor, or cut off
// by the bound), but the processor is progressing: the ladder starts over at its first rung
// every time. It climbed instead (1 s, 2 s, 4 s, ... between wakes, and a halt after 15), so a
// refold through a slow reducer on a loaded machine outlasted TestProcessors_RemoteSlowRewindResumes'
// 60 s, and one needing 15 bounds halted the processor.
func TestRemote_RefoldProgressStartsTheLadderOver(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := &refoldingHost{}
	m, err := mountHostServing(e.ctx, e.p, "host", h, []itx.ProcessorInfo{{Name: "c", ReducerVersion: "1", ConsumedTypes: []string{"*"}}})
	require.NoError(t, err)
	defer m.Release()
	s := stream(t, e.p, "/refold")
	var inputs []itx.EventInput
	for i := range 20 {
		inputs = append(inputs, ev("a", fmt.Sprintf(`{"i":%d}`, i)))
	}
	mustAppend(t, s, inputs...)
	e.configure(t, s, client.SubscriptionConfig{Name: "c",
		Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Placement: "remote", Processor: "c"}})
	head := mustAppend(t, s, ev("a", `{}`)).HeadOffset
	e.waitProcessed(t, s, "c", head)

	_, err = client.SetSubscriptionCursor(e.ctx, s, "c", 10)
	require.NoError(t, err)
	var last int64
	for wake := 1; wake <= 6; wake++ {
		var d itx.SubscriptionDescription
		waitUntil(t, fmt.Sprintf("refold wake %d failed", wake), func() bool {
			d = e.describe(t, s, "c")
			return h.refoldWakes() == wake && d.InFlightDeadlineAt == 0 && d.NextAttemptAt != 0 && d.NextAttemptAt != last
		})
		last = d.NextAttemptAt
		require.Equal(t, int64(10), d.ConfirmedOffset)
		require.True(t, strings.Contains(d.LastError, "no progress past the cursor"), "lastError %q", d.LastError)
		require.Equal(t, 1, d.Attempt, "refold wake %d: the ladder climbed though the reduction moved", wake)
		require.Equal(t, "active", d.Status)
		e.toNextRetry(t, s, "c")
	}
}
