package test

import (
	"context"
	"fmt"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/wire"
	"github.com/stretchr/testify/require"
)

// pageHook serves getEventPage by reading the real stream over RPC, calling before ahead of
// each page (0, 1, ...); it serves nothing else.
type pageHook struct {
	schema.Stream_Server
	real   schema.Stream
	before func(page int)
	pages  int
}

func (h *pageHook) GetEventPage(ctx context.Context, call schema.Stream_getEventPage) error {
	src, err := call.Args().Query()
	if err != nil {
		return err
	}
	q, err := wire.QueryFromSchema(src)
	if err != nil {
		return err
	}
	h.before(h.pages)
	h.pages++
	page, err := client.GetEventPage(ctx, h.real, q)
	if err != nil {
		return err
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	p, err := res.NewPage()
	if err != nil {
		return err
	}
	return wire.SetPage(p, page)
}

// client.ReadAll pages through one stream. One deleted and created again under its path
// between two pages is another stream, whose offsets started over: its page after the last
// offset read went into the result as if it followed the old ones (new-501 after old-500).
// ReadAll stops instead with notFound, returning the events of the stream it began reading.
func TestClient_ReadAllEndsAtAStreamCreatedAgain(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	s := stream(t, p, "/readall")
	appendMany := func(typ string, n int) {
		for i := 0; i < n; i += 500 {
			var batch []itx.EventInput
			for j := i; j < min(n, i+500); j++ {
				batch = append(batch, ev(fmt.Sprintf("%s-%d", typ, j+1), `{}`))
			}
			mustAppend(t, s, batch...)
		}
	}
	appendMany("old", 1200)
	hook := &pageHook{real: s, before: func(page int) {
		if page == 1 {
			_, err := client.DeleteStream(ctx, p, "/readall", true)
			require.NoError(t, err)
			appendMany("new", 1200)
		}
	}}
	hooked := schema.Stream_ServerToClient(hook)
	defer hooked.Release()
	events, err := client.ReadAll(ctx, hooked, itx.Query{})
	requireCode(t, err, itx.ENotFound)
	require.Contains(t, err.Error(), "was deleted")
	require.Len(t, events, 500, "the first page's events")
	for i, e := range events {
		require.Equal(t, fmt.Sprintf("old-%d", i+1), e.Type)
	}
}
