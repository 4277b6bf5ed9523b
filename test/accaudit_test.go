package test

import (
	"context"
	"errors"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// mintedProject is a client-side Project whose Streams.get answers one capability, whatever the
// path: it lets the stream-level cases of methodCases run on a minted (attenuated) Stream.
type mintedProject struct{ s schema.Stream }

func (m mintedProject) Streams(_ context.Context, call schema.Project_streams) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return res.SetStreams(schema.Streams_ServerToClient(mintedStreams(m)))
}

func (mintedProject) Capabilities(context.Context, schema.Project_capabilities) error {
	return errors.New("not served by the minted-capability proxy")
}
func (mintedProject) Processors(context.Context, schema.Project_processors) error {
	return errors.New("not served by the minted-capability proxy")
}
func (mintedProject) Describe(context.Context, schema.Project_describe) error {
	return errors.New("not served by the minted-capability proxy")
}
func (mintedProject) Admin(context.Context, schema.Project_admin) error {
	return errors.New("not served by the minted-capability proxy")
}

type mintedStreams struct{ s schema.Stream }

func (m mintedStreams) Get(_ context.Context, call schema.Streams_get) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return res.SetStream(m.s.AddRef())
}

func (mintedStreams) List(context.Context, schema.Streams_list) error {
	return errors.New("not served by the minted-capability proxy")
}

// A capability minted with Stream.readOnly() or Stream.appendOnly() refuses, with
// permissionDenied, every method of the schema reachable from it that its rights do not cover
// (through navigation too: its subscriptions, a subscription, its readers, a connection or a live
// view opened on it), and allows the rest; narrowing twice, or narrowing a token that lacks the
// right, leaves nothing. Table-driven over methodCases, so a new stream-level method is covered.
func TestAccAudit_MintedCapabilitiesEveryStreamMethod(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	full := ts.project(t)
	s := stream(t, full, "/in/s")
	mustAppend(t, s, ev("note", `{"n": 1}`))
	subs := client.Subscriptions(ctx, s)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "sub",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "rcv"}})
	subs.Release()
	require.NoError(t, err)
	appendTok, _ := ts.token(t, itx.Scope{Rights: []itx.Right{itx.RightAppend}})
	appender := stream(t, ts.login(t, appendTok), "/in/s")

	ro := client.ReadOnly(ctx, s)
	defer ro.Release()
	ao := client.AppendOnly(ctx, s)
	defer ao.Release()
	none := client.AppendOnly(ctx, ro)
	defer none.Release()
	readOfAppender := client.ReadOnly(ctx, appender)
	defer readOfAppender.Release()
	minted := []struct {
		name   string
		s      schema.Stream
		rights []itx.Right
	}{
		{"readOnly", ro, []itx.Right{itx.RightRead}},
		{"appendOnly", ao, []itx.Right{itx.RightAppend}},
		{"appendOnly of readOnly", none, nil},
		{"readOnly of an append-only token's stream", readOfAppender, nil},
	}
	has := func(rights []itx.Right, r itx.Right) bool {
		for _, x := range rights {
			if x == r {
				return true
			}
		}
		return false
	}
	for _, m := range served(t) {
		c := methodCases[m]
		if !c.pathed || c.viaWake || c.unserved || m == "Streams.get" {
			continue
		}
		t.Run(m, func(t *testing.T) {
			for _, mc := range minted {
				p := schema.Project_ServerToClient(mintedProject{s: mc.s})
				err := c.call(ctxT(t), p, "/in/s")
				p.Release()
				allowed := c.right == "" || has(mc.rights, c.right)
				if c.andRead && !has(mc.rights, itx.RightRead) {
					allowed = false
				}
				if allowed {
					require.NotEqual(t, itx.EPermissionDenied, itx.ErrorCode(err), "%s through a %s capability: %v", m, mc.name, err)
				} else {
					require.Equal(t, itx.EPermissionDenied, itx.ErrorCode(err), "%s through a %s capability must be refused: %v", m, mc.name, err)
				}
			}
		})
	}
}
