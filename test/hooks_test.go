package test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/itx-dev/itx"
)

// hook is a real HTTP webhook receiver on loopback. It records every delivery (duplicates
// included) and answers with whatever respond says.
type hook struct {
	t       testing.TB
	srv     *httptest.Server
	mu      sync.Mutex
	bodies  []itx.WebhookBody
	raw     [][]byte // the bytes as sent, for checking signatures independently
	headers []http.Header
	respond func(n int, b itx.WebhookBody) int // n: 0-based request count
	changed chan struct{}
}

func newHook(t testing.TB, respond func(n int, b itx.WebhookBody) int) *hook {
	h := &hook{t: t, respond: respond, changed: make(chan struct{})}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var b itx.WebhookBody
		if err := json.Unmarshal(raw, &b); err != nil {
			w.WriteHeader(400)
			return
		}
		h.mu.Lock()
		n := len(h.bodies)
		h.bodies = append(h.bodies, b)
		h.raw = append(h.raw, raw)
		h.headers = append(h.headers, r.Header.Clone())
		respond := h.respond
		h.mu.Unlock()
		status := 200
		if respond != nil {
			status = respond(n, b)
		}
		w.WriteHeader(status)
		h.mu.Lock()
		close(h.changed)
		h.changed = make(chan struct{})
		h.mu.Unlock()
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hook) url() string { return h.srv.URL + "/hook" }

// received returns the offsets of every request so far, in arrival order.
func (h *hook) received() []int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := []int64{}
	for _, b := range h.bodies {
		out = append(out, b.Event.Offset)
	}
	return out
}

func (h *hook) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.bodies)
}

// distinct returns the offsets seen, first occurrences only, in arrival order.
func (h *hook) distinct() []int64 {
	seen := map[int64]bool{}
	out := []int64{}
	for _, o := range h.received() {
		if !seen[o] {
			seen[o] = true
			out = append(out, o)
		}
	}
	return out
}

// captureRaw replaces a hook's handler with one that keeps the last raw body and headers.
func captureRaw(mu *sync.Mutex, raw *[]byte, hdr *map[string]string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		*raw = b
		*hdr = map[string]string{}
		for k := range r.Header {
			(*hdr)[k] = r.Header.Get(k)
		}
		for _, k := range []string{"webhook-id", "webhook-timestamp", "webhook-signature"} {
			(*hdr)[k] = r.Header.Get(k)
		}
		mu.Unlock()
		w.WriteHeader(200)
	})
}
