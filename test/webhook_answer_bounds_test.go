package test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/stretchr/testify/require"
)

// A webhook receiver answering 200 with a megabyte of header fields: net/http read up to 10 MiB
// of each answer's header and parsed it whole (16 subscriptions answered so took itxd from
// 20 MiB to 1.2 GiB of RSS; --webhook-max-in-flight allows 1,024 such answers at once). itxd now
// reads at most --webhook-max-response-header-bytes (64 KiB) of it: a longer header fails the
// delivery as an outage naming the flag, nothing is acknowledged, and once the receiver answers
// as receivers do, the event is delivered.
func TestItxd_WebhookAnswerHeaderIsBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	var padded atomic.Bool
	padded.Store(true)
	var paddedAnswers atomic.Int64
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if padded.Load() {
			pad := make([]string, (1<<20)/len("X-Pad: 0123456789\r\n"))
			for i := range pad {
				pad[i] = "0123456789"
			}
			w.Header()["X-Pad"] = pad
			paddedAnswers.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer recv.Close()

	p := startItxd(t, t.TempDir())
	ctx := ctxT(t)
	s := stream(t, dial(t, p.addr).Login(ctx, p.creds.ProjectToken), "/padded-answers")
	subs := client.Subscriptions(ctx, s)
	defer subs.Release()
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "hook",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: recv.URL}})
	require.NoError(t, err)
	last := mustAppend(t, s, ev("a", `{}`)).Offsets[0]

	sub := client.Subscription(ctx, s, "hook")
	defer sub.Release()
	var d itx.SubscriptionDescription
	waitUntil(t, "the padded answer fails the delivery, naming the flag", func() bool {
		d, err = client.DescribeSubscription(ctx, sub)
		return err == nil && (d.ConfirmedOffset >= last || strings.Contains(d.LastError, "--webhook-max-response-header-bytes"))
	})
	require.Less(t, d.ConfirmedOffset, last, "an answer past the bound acknowledges nothing")
	require.Positive(t, paddedAnswers.Load())

	padded.Store(false)
	confirmed, err := client.WaitUntilProcessed(ctx, sub, last, 30*time.Second)
	require.NoError(t, err)
	require.GreaterOrEqual(t, confirmed, last)
}
