package test

import (
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A connection's openedBy is bounded as every name is, in characters (README: 1-500 characters):
// 500 two-byte characters open, as a 500-character key does; 501 are invalidArgument.
func TestConnection_OpenedByIsBoundedInCharacters(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/c")
	mustAppend(t, s, ev("note", `{}`))
	ctx := ctxT(t)
	open := func(key, openedBy string) error {
		fut, release := s.OpenConnection(ctx, func(p schema.Stream_openConnection_Params) error {
			opts, err := p.NewOptions()
			if err != nil {
				return err
			}
			opts.SetNoState(true)
			if err := opts.SetKey(key); err != nil {
				return err
			}
			if err := opts.SetOpenedBy(openedBy); err != nil {
				return err
			}
			return p.SetSink(schema.EventSink_ServerToClient(quietSink{}))
		})
		defer release()
		res, err := fut.Struct()
		if err == nil {
			res.Connection().Release()
		}
		return err
	}
	err := open("  ", "")
	requireCode(t, err, itx.EInvalid)
	require.Contains(t, itx.ErrorMessage(err), `connection key "  " is blank`, "a blank key is refused, not taken for one left out")
	require.NoError(t, open(strings.Repeat("é", itx.MaxSubscriptionNameLength), ""), "a key of 500 characters")
	require.NoError(t, open("", strings.Repeat("é", itx.MaxSubscriptionNameLength)), "an openedBy of 500 characters")
	requireCode(t, open("", strings.Repeat("é", itx.MaxSubscriptionNameLength+1)), itx.EInvalid)
	requireCode(t, open("", strings.Repeat("x", 4*itx.MaxSubscriptionNameLength+1)), itx.EInvalid)
}

// A read as a subscription names it; a blank name is refused (invalidArgument), not read as no
// subscription, which would hand back events its filter drops.
func TestGetEventPage_BlankSubscriptionIsRefused(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/q")
	mustAppend(t, s, ev("note", `{}`))
	_, err := client.GetEventPage(ctxT(t), s, itx.Query{Subscription: " "})
	requireCode(t, err, itx.EInvalid)
	require.Contains(t, itx.ErrorMessage(err), `subscription " " is blank`)
}
