package test

import (
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Holding a stream's events back from trims and the retention policy is a consumer's, and
// attaching one is what the subscribe right grants: a reader registered, or a connection opened,
// through a capability without it (a read-only token, a readOnly() attenuation) shows its lag
// but holds nothing back, while one registered with subscribe still does. Before, a read-only
// token registering a reader at checkpoint 0 (or opening a connection and never reading it)
// kept every event from the administrator's trims and retention policy for good.
func TestRetention_ReadOnlyConsumersHoldNothing(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	writer := stream(t, ts.project(t), "/log")
	for range 6 {
		mustAppend(t, writer, ev("line", `{}`))
	}
	readTok, _ := ts.token(t, itx.Scope{Rights: []itx.Right{itx.RightRead}})
	pinner := stream(t, ts.login(t, readTok), "/log")
	require.NoError(t, client.RegisterReader(ctx, client.Readers(ctx, pinner), "pin", 0))
	stuck := newTestSink()
	stuck.block = make(chan struct{}) // never answers a delivery: its delivered offset stays 0
	defer close(stuck.block)
	_, err := openConn(t, pinner, connOpts{noState: true}, stuck)
	require.NoError(t, err)
	fullReadOnly := client.ReadOnly(ctx, stream(t, ts.project(t), "/log"))
	require.NoError(t, client.RegisterReader(ctx, client.Readers(ctx, fullReadOnly), "browser", 0))

	keeperTok, _ := ts.token(t, itx.Scope{Rights: []itx.Right{itx.RightRead, itx.RightSubscribe}})
	keeper := client.Readers(ctx, stream(t, ts.login(t, keeperTok), "/log"))
	require.NoError(t, client.RegisterReader(ctx, keeper, "keeper", 2))

	res, err := client.Trim(ctx, writer, 4)
	require.NoError(t, err)
	require.EqualValues(t, 2, res.TrimmedThrough, "the subscribe token's reader holds the trim back, the read-only ones do not")

	require.NoError(t, client.RemoveReader(ctx, keeper, "keeper"))
	require.NoError(t, client.SetRetention(ctx, writer, client.Retention{MaxEvents: 1}))
	waitUntil(t, "the policy trimmed past the read-only reader and connection", func() bool {
		info, err := client.Describe(ctx, writer)
		require.NoError(t, err)
		return info.TrimmedThrough == 5
	})
	list, err := client.ListReaders(ctx, client.Readers(ctx, pinner))
	require.NoError(t, err)
	require.Len(t, list, 2, "the read-only readers stay registered, their lag visible")
}
