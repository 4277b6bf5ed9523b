package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The REPL drives an offset-acking webhook subscription end to end: configure with
// confirmWindow, list and describe show deliveredOffset ahead of confirmedOffset, confirm moves
// the cursor, and a confirm without an offset, or of something not delivered, is refused.
func TestEval_OffsetAckingWebhookConfirm(t *testing.T) {
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"confirmedOffset": 0}`)
	}))
	defer hook.Close()
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var ak = project.streams.get("/acking-hook"); ak.append({type: "note"})`)
	s.mustEval(t, fmt.Sprintf(`ak.subscriptions.configure({name: "loader", start: "now", receiver: {type: "webhook-post", url: %q}, confirmWindow: 2, filterTypes: ["row"]})`, hook.URL))
	s.mustEval(t, `ak.append([{type: "row"}, {type: "row"}, {type: "row"}])`)
	require.Eventually(t, func() bool {
		row := obj(t, arr(t, s.mustEval(t, `ak.subscriptions.list()`))[0])
		return row["deliveredOffset"] == 4.0
	}, 10*time.Second, 10*time.Millisecond)
	row := obj(t, arr(t, s.mustEval(t, `ak.subscriptions.list()`))[0])
	require.Equal(t, 2.0, row["confirmedOffset"])
	d := obj(t, s.mustEval(t, `ak.subscriptions.get("loader").describe()`))
	require.Equal(t, 4.0, d["deliveredOffset"])
	require.Equal(t, 2.0, obj(t, d["config"])["confirmWindow"])

	f := s.failure(t, `ak.subscriptions.get("loader").confirm()`)
	require.Equal(t, "invalidArgument", f.Code, f.Message)
	f = s.failure(t, `ak.subscriptions.get("loader").confirm(5)`)
	require.Equal(t, "invalidArgument", f.Code, f.Message)
	require.Equal(t, 3.0, obj(t, s.mustEval(t, `ak.subscriptions.get("loader").confirm(3)`))["confirmedOffset"])
	require.Eventually(t, func() bool {
		return obj(t, s.mustEval(t, `ak.subscriptions.get("loader").describe()`))["deliveredOffset"] == 5.0
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, 5.0, obj(t, s.mustEval(t, `ak.subscriptions.get("loader").confirm({offset: 5})`))["confirmedOffset"])
	require.Equal(t, 5.0, obj(t, s.mustEval(t, `ak.subscriptions.get("loader").waitUntilProcessed(5)`))["confirmedOffset"])
}
