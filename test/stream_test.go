package test

import (
	"testing"

	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

func TestStream_AppendAndRead(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/a")
	ctx := ctxT(t)

	res := mustAppend(t, s, ev("note", `{"text":"hi"}`), ev("note", `{"text":"there"}`))
	require.Equal(t, []int64{1, 2}, res.Offsets)
	require.Equal(t, int64(2), res.HeadOffset)
	require.NotEmpty(t, res.StreamID)

	page, err := client.GetEventPage(ctx, s, client.Query{})
	require.NoError(t, err)
	require.Equal(t, res.StreamID, page.StreamID)
	require.Equal(t, int64(2), page.StreamMaxOffset)
	require.Len(t, page.Events, 2)
	require.Equal(t, "note", page.Events[0].Type)
	require.JSONEq(t, `{"text":"hi"}`, string(page.Events[0].Payload))
	require.JSONEq(t, `{"text":"there"}`, string(page.Events[1].Payload))
	require.Equal(t, int64(2), page.Events[1].Offset)
	require.NotZero(t, page.Events[0].CreatedAt)
}
