package test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/wire"
	"github.com/stretchr/testify/require"
)

// revivingHost is a remote processor host whose first wake appends, through the wake's ports,
// the batches it was given to the home stream, and reports each append's error; every wake then
// reports the head as processed.
type revivingHost struct {
	quietHost
	batches [][]itx.EventInput
	once    sync.Once
	results chan []error
}

func (h *revivingHost) Wake(ctx context.Context, call schema.ProcessorHost_wake) error {
	req, err := call.Args().Request()
	if err != nil {
		return err
	}
	path, err := req.Path()
	if err != nil {
		return err
	}
	head := req.HeadOffset()
	h.once.Do(func() {
		ports := req.Ports()
		var errs []error
		for _, batch := range h.batches {
			fut, release := ports.AppendTo(ctx, func(a schema.ProcessorPorts_appendTo_Params) error {
				if err := a.SetPath(path); err != nil {
					return err
				}
				return wire.SetEventInputs(a.NewEvents, batch)
			})
			_, err := client.Await(ctx, fut)
			client.ReleaseAfter(ctx, release)
			errs = append(errs, err)
		}
		h.results <- errs
	})
	return reportThrough(call, int64(head))
}

func revival(slug string) itx.EventInput {
	return ev(itx.TypeProcessorRevived, fmt.Sprintf(`{"processorSlug":%q,"revivals":1,"version":"v1"}`, slug))
}

// TestRemote_PortsReviveOnlyTheirOwnProcessor: a remote host's ports are its processor's
// authority. A stream/processor-revived appended through them naming another processor (one the
// host does not run) is refused with permissionDenied and writes nothing,
// the rest of its batch included; naming its own processor, as its keepalive does, it lands. The
// same revival through the plain Stream.append, with a token that may append control events,
// still lands: only the ports are narrowed.
func TestRemote_PortsReviveOnlyTheirOwnProcessor(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/revive")
	mustAppend(t, s, ev("a", `{}`))
	// Another processor of the stream, placed remote with no host mounted for it.
	e.configure(t, s, client.SubscriptionConfig{Name: "other",
		Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Placement: "remote", Processor: "other"}})

	h := &revivingHost{
		batches: [][]itx.EventInput{
			{revival("other")},
			{ev("a", `{"before":true}`), revival("other")},
			{revival("c")},
		},
		results: make(chan []error, 1),
	}
	m, err := mountHostServing(e.ctx, e.p, "host", h, []itx.ProcessorInfo{{Name: "c", ReducerVersion: "1", ConsumedTypes: []string{"*"}}})
	require.NoError(t, err)
	defer m.Release()
	e.configure(t, s, client.SubscriptionConfig{Name: "c",
		Receiver: client.Receiver{Kind: client.ReceiverProcessorWake, Placement: "remote", Processor: "c"}})

	var errs []error
	select {
	case errs = <-h.results:
	case <-e.ctx.Done():
		t.Fatal("the host was never woken")
	}
	require.Len(t, errs, 3)
	requireCode(t, errs[0], itx.EPermissionDenied)
	require.Contains(t, errs[0].Error(), `"other"`)
	requireCode(t, errs[1], itx.EPermissionDenied)
	require.NoError(t, errs[2], "a revival of the ports' own processor")

	all, err := client.GetEvents(e.ctx, s, itx.Query{})
	require.NoError(t, err)
	var revived []string
	for _, got := range all {
		require.NotEqual(t, `{"before":true}`, string(got.Payload), "a refused batch wrote an event")
		if got.Type == itx.TypeProcessorRevived {
			var p struct {
				ProcessorSlug string `json:"processorSlug"`
			}
			require.NoError(t, json.Unmarshal(got.Payload, &p))
			revived = append(revived, p.ProcessorSlug)
		}
	}
	require.Equal(t, []string{"c"}, revived)

	// The user's Stream.append is not narrowed: the same fact lands there.
	_, err = client.Append(e.ctx, s, []itx.EventInput{revival("other")}, itx.AppendOptions{})
	require.NoError(t, err)
}
