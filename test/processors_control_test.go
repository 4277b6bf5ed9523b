package test

import (
	"fmt"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// itxd's verdicts on the stream/* events a processor might append (a processor's append has a
// client's authority), which the harness's in-memory stream must give too: the same cases as
// processors/testing's TestMemoryStream_RefusesControlEventsItxdRefuses, kept in step by hand.
func TestProcessors_ControlEventAppendsAsTheHarnessJudgesThem(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	for i, tc := range []struct {
		name, typ, payload string
		ok                 bool
	}{
		{"woken is the server's", itx.TypeWoken, `{"incarnationId":"x","reason":"loaded"}`, false},
		{"halted is the server's", itx.TypeSubscriptionHalted, `{"name":"hook","error":"x","attempts":1}`, false},
		{"unknown control type", "stream/made-up", `{}`, false},
		{"configured without a receiver", itx.TypeSubscriptionConfigured, `{"name":"x"}`, false},
		{"configured with an unknown receiver", itx.TypeSubscriptionConfigured, `{"name":"x","receiver":{"action":"nope"}}`, false},
		{"cursor-set with an unknown field", itx.TypeSubscriptionCursorSet, `{"name":"hook","afterOffset":0,"x":1}`, false},
		{"cursor-set without a name", itx.TypeSubscriptionCursorSet, `{"afterOffset":0}`, false},
		{"cursor-set below 0", itx.TypeSubscriptionCursorSet, `{"name":"hook","afterOffset":-1}`, false},
		{"removed without the reason", itx.TypeSubscriptionRemoved, `{"name":"hook"}`, false},
		{"resumed without a name", itx.TypeSubscriptionResumed, `{}`, false},
		{"error-occurred without a message", itx.TypeErrorOccurred, `{"error":{}}`, false},
		{"configured", itx.TypeSubscriptionConfigured, `{"name":"x","receiver":{"action":"processor-wake"}}`, true},
		{"cursor-set", itx.TypeSubscriptionCursorSet, `{"name":"hook","afterOffset":0}`, true},
		{"removed", itx.TypeSubscriptionRemoved, `{"name":"hook","reason":"requested"}`, true},
		{"error-occurred", itx.TypeErrorOccurred, `{"message":"m"}`, true},
		{"an ordinary event", "order/placed", `{}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := stream(t, p, fmt.Sprintf("/control/%d", i))
			// "hook" exists: a webhook nobody answers retries, appending nothing for hours.
			mustAppend(t, s, ev(itx.TypeSubscriptionConfigured,
				`{"name":"hook","receiver":{"action":"webhook-post","url":"http://127.0.0.1:1/"}}`))
			_, err := client.Append(ctxT(t), s, []itx.EventInput{ev(tc.typ, tc.payload)}, itx.AppendOptions{})
			if tc.ok {
				require.NoError(t, err)
				return
			}
			requireCode(t, err, itx.EInvalid)
			info, err := client.Describe(ctxT(t), s)
			require.NoError(t, err)
			require.Equal(t, int64(1), info.HeadOffset, "a refused append wrote nothing")
		})
	}
}
