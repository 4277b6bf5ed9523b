package test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// routerHost hosts "router": each "msg" {"thread": t} is forwarded to <base>/threads/<t> with
// Args.AppendTo, keyed per source event; an "escape" event forwards to /elsewhere and a
// "control" one forwards a control event, their errors recorded in refused.
func routerHost(version, base string, refused *sync.Map) *processors.Host {
	h := processors.NewHost(version)
	if err := processors.Add(h, func() processors.Contract[int] {
		return processors.Contract[int]{
			Name: "router", ConsumedTypes: []string{"msg", "escape", "control"}, ReducerVersion: "1",
			InitialState: func() int { return 0 },
			Reduce:       func(n int, e itx.Event) int { return n + 1 },
			ProcessEvent: func(ctx context.Context, a *processors.Args[int]) error {
				if a.Event == nil {
					return nil
				}
				switch a.Event.Type {
				case "escape":
					_, err := a.AppendTo(ctx, "/elsewhere", itx.EventInput{Type: "forwarded"})
					refused.Store("escape", itx.ErrorCode(err))
					return nil
				case "control":
					_, err := a.AppendTo(ctx, base+"/threads/c", itx.EventInput{Type: itx.TypeSubscriptionRemoved, Payload: json.RawMessage(`{"name":"x"}`)})
					refused.Store("control", itx.ErrorCode(err))
					return nil
				}
				var m struct{ Thread string }
				if err := json.Unmarshal(a.Event.Payload, &m); err != nil {
					return err
				}
				_, err := a.AppendTo(ctx, base+"/threads/"+m.Thread, itx.EventInput{Type: "forwarded", Payload: a.Event.Payload,
					IdempotencyKey: a.IdempotencyKey("forward", a.Event)})
				return err
			},
		}
	}); err != nil {
		panic(err)
	}
	return h
}

func msg(thread string) itx.EventInput {
	return itx.EventInput{Type: "msg", Payload: json.RawMessage(`{"thread":"` + thread + `"}`)}
}

// A processor forwards to other streams of its project (Args.AppendTo), in-process and from a
// remote host over RPC: once per source event, a rewind forwarding nothing twice (the keys); a
// control event is refused, and a remote host's forward stays under its subscription's scope.
func TestProcessors_AppendToForwardsToOtherStreams(t *testing.T) {
	t.Run("in-process", func(t *testing.T) {
		var refused sync.Map
		ts := startServer(t, server.Config{Processors: routerHost("v1", "", &refused)})
		ctx := ctxT(t)
		p := ts.project(t)
		s := stream(t, p, "/router")
		configureProcessor(t, s, "router")
		mustAppend(t, s, msg("a"), msg("b"))
		head := mustAppend(t, s, msg("a"), itx.EventInput{Type: "control"}).HeadOffset
		sub, _ := processorOf(t, s, "router")
		_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
		require.NoError(t, err)
		requireForwards := func() {
			t.Helper()
			for path, want := range map[string]int{"/threads/a": 2, "/threads/b": 1} {
				events, err := client.ReadAll(ctx, stream(t, p, path), itx.Query{Types: []string{"forwarded"}})
				require.NoError(t, err)
				require.Len(t, events, want, path)
			}
		}
		requireForwards()
		code, _ := refused.Load("control")
		require.Equal(t, itx.EInvalid, code)

		// Rewound to the start, the processor forwards again: the keys keep one forward each.
		_, err = client.SetSubscriptionCursor(ctx, s, "router", 0)
		require.NoError(t, err)
		_, err = client.WaitUntilProcessed(ctx, sub, head+1, 0)
		require.NoError(t, err)
		requireForwards()
	})

	t.Run("remote, scoped", func(t *testing.T) {
		var refused sync.Map
		ts := startServer(t, server.Config{})
		ctx := ctxT(t)
		tok, _ := ts.token(t, itx.Scope{Prefix: "/team"})
		p := ts.login(t, tok)
		s := stream(t, p, "/team/router")
		configureRemote(t, s, "router")
		awaitMount(t, runRemoteHost(t, ts.addr, tok, "team-host", routerHost("v1", "/team", &refused)))
		mustAppend(t, s, msg("a"), itx.EventInput{Type: "escape"})
		head := mustAppend(t, s, msg("b"), msg("a")).HeadOffset
		sub, _ := processorOf(t, s, "router")
		_, err := client.WaitUntilProcessed(ctx, sub, head, 0)
		require.NoError(t, err)
		for path, want := range map[string]int{"/team/threads/a": 2, "/team/threads/b": 1} {
			events, err := client.ReadAll(ctx, stream(t, p, path), itx.Query{Types: []string{"forwarded"}})
			require.NoError(t, err)
			require.Len(t, events, want, path)
		}
		code, _ := refused.Load("escape")
		require.Equal(t, itx.EPermissionDenied, code, "outside the subscription's scope")
		_, err = client.ReadAll(ctx, stream(t, ts.project(t), "/elsewhere"), itx.Query{})
		require.NoError(t, err)
		info, err := client.Describe(ctx, stream(t, ts.project(t), "/elsewhere"))
		require.NoError(t, err)
		require.Zero(t, info.HeadOffset, "nothing reached /elsewhere")
	})
}
