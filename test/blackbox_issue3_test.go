package test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Black-box probes of issue 3 (subscriptions: cursors, push delivery, the retry ladder) over
// real RPC against a real itxd, written from the issue text. Of the 16 probes written, every one
// passed; the ones other tests already covered (names, bad configs and raw appends, the
// 15-attempt ladder, Standard Webhooks signing and the retry's webhook-id, copy cycles and
// chains, itx-call offline then mounted, the per-stream cap, seeks, exactly-true conditions,
// removal, late answers after a seek, describe) were dropped. Kept: what no other test checks.

// Webhook answers: any 2xx acknowledges (204, 202); a 3xx is not followed and not an ack; a
// receiver that does not answer within the delivery timeout is a failure that retries.
func TestBBIssue3_WebhookAnswers(t *testing.T) {
	e := newSubEnv(t, server.Config{DeliveryTimeout: 300 * time.Millisecond})
	var mu sync.Mutex
	codes := []int{204, 202, 302, -1, 200}
	var n int
	release := make(chan struct{})
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		code := 200
		if n < len(codes) {
			code = codes[n]
		}
		n++
		mu.Unlock()
		switch {
		case code == -1:
			select {
			case <-release:
			case <-r.Context().Done():
			}
		case code == 302:
			w.Header().Set("Location", "/elsewhere")
			w.WriteHeader(302)
		default:
			w.WriteHeader(code)
		}
	}))
	t.Cleanup(hook.Close)
	t.Cleanup(func() { close(release) })
	s := stream(t, e.p, "/bb3/answers")
	e.configure(t, s, client.SubscriptionConfig{Name: "h", Start: "now", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: hook.URL}})
	r := mustAppend(t, s, ev("job", `{}`), ev("job", `{}`), ev("job", `{}`))
	var d itx.SubscriptionDescription
	waitUntil(t, "the 302 failed", func() bool { d = describeSubIn(e.ctx, t, s, "h"); return d.Attempt == 1 })
	require.Equal(t, r.HeadOffset-1, d.ConfirmedOffset, "204 and 202 acknowledged")
	require.Contains(t, d.LastError, "302")
	e.clock.Advance(time.Hour)
	waitUntil(t, "the timeout failed", func() bool {
		e.clock.Advance(100 * time.Millisecond) // the delivery timeout runs on the injected clock
		d = describeSubIn(e.ctx, t, s, "h")
		return d.Attempt == 2
	})
	t.Logf("timeout error: %s", d.LastError)
	e.clock.Advance(time.Hour)
	e.waitProcessed(t, s, "h", r.HeadOffset)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 5, n)
}
