package test

import (
	"context"
	"fmt"
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

// A stream with work due (here a webhook retry) whose project holds its whole share of the
// loaded streams cannot be woken; the alarm loop tries again every second. It logged its
// warning at every try, a line a second for as long as the project sat at its share; it now
// logs it once, names the project, and says once that the streams load again.
func TestItxd_DueStreamsWaitingAreLoggedOncePerCrossing(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the itxd binary")
	}
	metrics := freeAddr(t)
	p := startItxd(t, t.TempDir(), "--metrics", metrics, "--log-format", "json", "--log-level", "info",
		"--max-held-streams", "8", "--max-loaded-streams", "8", "--max-held-streams-per-project", "2", "--idle-timeout", "200ms")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	proj := dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
	defer proj.Release()

	var posts atomic.Int64
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable) // an outage: retried along the ladder
	}))
	defer hook.Close()
	s := stream(t, proj, "/a/hook")
	subs := client.Subscriptions(ctx, s)
	_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "h", Start: "now",
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: hook.URL}})
	require.NoError(t, err)
	mustAppend(t, s, ev("a/x", `{}`))
	waitUntil(t, "the webhook failed once, a retry due", func() bool {
		list, err := client.ListSubscriptions(ctx, subs)
		return err == nil && len(list) == 1 && list[0].Attempt >= 1 && list[0].NextAttemptAt > 0
	})
	subs.Release()

	// The project holds its share (2) of the streams in use by connections on two others.
	var conns []*client.Connection
	for i := range 2 {
		waitUntil(t, "a connection opens", func() bool { // refused while the retry's delivery holds /a/hook
			c, err := client.OpenConnection(ctx, stream(t, proj, fmt.Sprintf("/a/held-%d", i)), client.ConnectionOptions{},
				client.ConnectionHandler{Deliver: func(context.Context, itx.DeliveryBatch) error { return nil }})
			if err != nil {
				requireCode(t, err, itx.ELimitExceeded)
				return false
			}
			conns = append(conns, c)
			return true
		})
	}
	const warning = "streams with work due wait"
	waitUntil(t, "the alarm loop finds /a/hook due and cannot load it", func() bool { return strings.Contains(p.logs.String(), warning) })
	base := scrapeMetric(t, metrics, "itx_project_share_full_total")
	waitUntil(t, "the alarm loop tried 3 times more", func() bool {
		return scrapeMetric(t, metrics, "itx_project_share_full_total") >= base+3
	})
	require.Equal(t, 1, strings.Count(p.logs.String(), warning), "one warning while the project sits at its share")
	for _, line := range strings.Split(p.logs.String(), "\n") {
		if strings.Contains(line, warning) {
			require.Contains(t, line, `"projects":["`+p.creds.ProjectID+`"]`, "the warning names the project")
		}
	}

	for _, c := range conns {
		c.Close(ctx)
		c.Release()
	}
	waitUntil(t, "the due stream loads again and says so", func() bool {
		return strings.Contains(p.logs.String(), "streams with work due load again")
	})
	waitUntil(t, "the retry is delivered", func() bool { return posts.Load() >= 2 })
	require.Equal(t, 1, strings.Count(p.logs.String(), warning))
}
