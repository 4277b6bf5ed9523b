package test

import (
	"encoding/json"
	"io"
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

// idHook answers 200 to every request once release is closed, except that the first request
// waits for it; it records each request's webhook-id and the offsets it carried.
type idHook struct {
	srv     *httptest.Server
	release chan struct{}
	mu      sync.Mutex
	ids     []string
	offsets [][]int64
}

func newIDHook(t *testing.T, batches bool) *idHook {
	h := &idHook{release: make(chan struct{})}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var offs []int64
		if batches {
			var b itx.WebhookBatchBody
			_ = json.Unmarshal(raw, &b) // a bad body shows as missing offsets
			for _, e := range b.Events {
				offs = append(offs, e.Offset)
			}
		} else {
			var b itx.WebhookBody
			_ = json.Unmarshal(raw, &b) // a bad body shows as missing offsets
			offs = []int64{b.Event.Offset}
		}
		h.mu.Lock()
		first := len(h.ids) == 0
		h.ids = append(h.ids, r.Header.Get("webhook-id"))
		h.offsets = append(h.offsets, offs)
		h.mu.Unlock()
		if first {
			<-h.release // the receiver takes the events; its answer comes too late
		}
		w.WriteHeader(200)
	}))
	t.Cleanup(func() {
		select {
		case <-h.release:
		default:
			close(h.release)
		}
		h.srv.Close()
	})
	return h
}

func (h *idHook) requests() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ids)
}

// The webhook-id names a delivery, not an event (README): a batch taken by the receiver whose
// answer timed out is retried with the events appended meanwhile, under another id, so only
// (streamId, event.offset) finds the events it already processed.
func TestWebhookID_BatchRetryWithMoreEventsHasANewID(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := newIDHook(t, true)
	s := stream(t, e.p, "/ids/batch")
	name, _ := e.configure(t, s, client.SubscriptionConfig{Name: "b", Start: "now", MaxDeliveryEvents: 10,
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.srv.URL}})
	first := mustAppend(t, s, ev("t", `{}`), ev("t", `{}`))
	waitUntil(t, "the first batch is in flight", func() bool { return h.requests() == 1 })
	res := mustAppend(t, s, ev("t", `{}`))
	waitUntil(t, "its deadline is set", func() bool { return e.describe(t, s, name).InFlightDeadlineAt != 0 })
	e.clock.Advance(20 * time.Second) // the delivery timeout: an outage
	waitUntil(t, "timed out", func() bool { return e.describe(t, s, name).Attempt == 1 })
	close(h.release)
	e.toNextRetry(t, s, name)
	e.waitProcessed(t, s, name, res.HeadOffset)

	h.mu.Lock()
	defer h.mu.Unlock()
	require.Equal(t, [][]int64{{first.HeadOffset - 1, first.HeadOffset}, {first.HeadOffset - 1, first.HeadOffset, res.HeadOffset}}, h.offsets)
	require.NotEqual(t, h.ids[0], h.ids[1], "the retry carries more events, under another id")
}

// An event in flight when the config changes is delivered again under the new config, under a
// new id (the seek epoch in it moved), though the receiver took it the first time.
func TestWebhookID_ChangedConfigDeliversAgainUnderANewID(t *testing.T) {
	e := newSubEnv(t, server.Config{})
	h := newIDHook(t, false)
	s := stream(t, e.p, "/ids/config")
	cfg := client.SubscriptionConfig{Name: "c", Start: "now", FilterTypes: []string{"t"},
		Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: h.srv.URL}}
	name, _ := e.configure(t, s, cfg)
	res := mustAppend(t, s, ev("t", `{}`))
	waitUntil(t, "in flight", func() bool { return h.requests() == 1 })
	cfg.Description = "changed"
	e.configure(t, s, cfg)
	close(h.release)
	e.waitProcessed(t, s, name, res.HeadOffset)

	h.mu.Lock()
	defer h.mu.Unlock()
	require.Equal(t, [][]int64{{res.HeadOffset}, {res.HeadOffset}}, h.offsets, "the event went twice")
	require.NotEqual(t, h.ids[0], h.ids[1], "under two ids: dedupe on (streamId, offset)")
}
