package test

import (
	"context"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A payload may hold a JSON number beyond float64's range (1e400: valid JSON, kept in the log
// as sent). JSONata sees it as JavaScript's JSON.parse does, as Infinity, and sees the rest of
// the event as it is: a where clause, a filterCondition and a transform over the payload's other
// members work as for any event. They saw no payload at all: waitForEvent never matched
// payload.m = 7, a filtered copy passed the event over without a word, and a transform copied
// {} in place of {"x": 7}. A transform that would put the infinite number in the copy fails on
// the event, loudly (lastError), rather than copy something else.
func TestJSONata_PayloadWithANumberBeyondFloat64(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	s := stream(t, e.p, "/numbers/huge")
	huge := mustAppend(t, s, ev("n", `{"n": 1e400, "m": 7, "deep": {"v": -1e999, "w": [2e500, 3]}}`)).HeadOffset

	// Each finds the event in the log at once (the virtual clock would never end a wait).
	wctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	got, err := client.WaitForEvent(wctx, s, itx.Predicate{Where: "payload.m = 7 and payload.deep.w[1] = 3"}, 0, 0)
	require.NoError(t, err)
	require.Equal(t, huge, got.Offset)
	got, err = client.WaitForEvent(wctx, s, itx.Predicate{Where: "payload.n > 1e308 and payload.deep.v < -1e308"}, 0, 0)
	require.NoError(t, err, "the numbers read as +Infinity and -Infinity")
	require.Equal(t, huge, got.Offset)

	filtered, _ := e.configure(t, s, client.SubscriptionConfig{Name: "filtered", FilterCondition: "payload.m = 7",
		Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/numbers/filtered"}})
	shaped, _ := e.configure(t, s, client.SubscriptionConfig{Name: "shaped", FilterTypes: []string{"n"},
		Transform: `{"payload": {"x": payload.m}}`, Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/numbers/shaped"}})
	whole, _ := e.configure(t, s, client.SubscriptionConfig{Name: "whole", FilterTypes: []string{"n"},
		Transform: `{"payload": {"x": payload.n}}`, Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/numbers/whole"}})
	head := mustDescribe(t, s).HeadOffset
	e.waitProcessed(t, s, filtered, head)
	e.waitProcessed(t, s, shaped, head)

	copies, err := client.ReadAll(e.ctx, stream(t, e.p, "/numbers/filtered"), itx.Query{Types: []string{"n"}})
	require.NoError(t, err)
	require.Len(t, copies, 1, "the filter matched the event")
	require.Equal(t, `{"n":1e400,"m":7,"deep":{"v":-1e999,"w":[2e500,3]}}`, string(copies[0].Payload), "copied as sent")
	copies, err = client.ReadAll(e.ctx, stream(t, e.p, "/numbers/shaped"), itx.Query{Types: []string{"n"}})
	require.NoError(t, err)
	require.Len(t, copies, 1)
	require.JSONEq(t, `{"x": 7}`, string(copies[0].Payload))

	e.settle(t, "/numbers/huge")
	d := e.describe(t, s, whole)
	require.Zero(t, d.ConfirmedOffset, "no copy stands in for the event")
	require.Equal(t, huge, d.FailingEventOffset)
	require.Contains(t, d.LastError, "transform failed on offset 1")
	n, err := client.ReadAll(e.ctx, stream(t, e.p, "/numbers/whole"), itx.Query{})
	require.NoError(t, err)
	require.Empty(t, n)
}
