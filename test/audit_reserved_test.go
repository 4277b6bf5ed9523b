package test

import (
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Seed 000 "Identity": "One reserved prefix survives: auto-generated names are
// subscription:<offset>". Connection keys and reader names share the subscription name space,
// so they cannot take a name in the reserved prefix: a configure without a name must never be
// refused because a connection or a reader holds the name it generates. One that names an
// existing subscription is the usual collision (failedPrecondition).
func TestAudit_GeneratedNamesAreReserved(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/audit/reserved")
	mustAppend(t, s, ev("a", `{}`)) // 1
	rf, release := s.Readers(e.ctx, nil)
	defer release()
	r := rf.Readers()

	_, err := openConn(t, s, connOpts{key: "subscription:2", noState: true}, newTestSink())
	requireCode(t, err, itx.EInvalid)
	requireCode(t, client.RegisterReader(e.ctx, r, "subscription:2", 1), itx.EInvalid)

	subs := client.Subscriptions(e.ctx, s)
	defer subs.Release()
	name, off, err := client.ConfigureSubscription(e.ctx, subs, client.SubscriptionConfig{IdempotencyKey: "gen",
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "x"}})
	require.NoError(t, err, "a configure without a name is never refused for its generated name")
	require.Equal(t, []any{"subscription:2", int64(2)}, []any{name, off})

	_, err = openConn(t, s, connOpts{key: name, noState: true}, newTestSink())
	requireCode(t, err, itx.EFailedPrecondition)
	requireCode(t, client.RegisterReader(e.ctx, r, name, 1), itx.EFailedPrecondition)
}
