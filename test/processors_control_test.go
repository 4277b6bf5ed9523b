package test

import (
	"fmt"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// itxd's verdicts on the stream/* events a processor might append (a processor's append has a
// client's authority), which the harness's in-memory stream must give too: the same cases as
// processors/testing's TestMemoryStream_RefusesControlEventsItxdRefuses, from one table.
func TestProcessors_ControlEventAppendsAsTheHarnessJudgesThem(t *testing.T) {
	ts := startServer(t, server.Config{})
	p := ts.project(t)
	for i, tc := range itxtest.ControlAppendCases {
		t.Run(tc.Name, func(t *testing.T) {
			s := stream(t, p, fmt.Sprintf("/control/%d", i))
			// "hook" exists: a webhook nobody answers retries, appending nothing for hours.
			mustAppend(t, s, ev(itx.TypeSubscriptionConfigured,
				`{"name":"hook","receiver":{"action":"webhook-post","url":"http://127.0.0.1:1/"}}`))
			_, err := client.Append(ctxT(t), s, []itx.EventInput{ev(tc.Type, tc.Payload)}, itx.AppendOptions{})
			if tc.OK {
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
