package examples_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/itx-dev/itx/processors/examples"
)

// One Complete is at most one request attempt. net/http's Transport treats a POST carrying an
// Idempotency-Key header as replayable: when a reused keep-alive connection breaks after the
// request was written (the server may have read and acted on it), it silently sends the request
// again on a new connection if it can rewind the body. For the agent that would be a second
// vendor call (a second charge) inside one attempt, behind the started fact's back. Here the
// server reads the whole request on a reused connection, then closes it without answering: the
// vendor must see that request once and Complete must fail.
func TestHTTPVendor_CompleteNeverReplaysOnABrokenReusedConnection(t *testing.T) {
	var (
		mu       sync.Mutex
		received = map[string]int{}
		keys     = map[string]string{}
		perConn  = map[string]int{} // requests read per connection (by remote address)
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, err := io.ReadAll(r.Body) // the whole request is in: it may have been acted on
		var req struct {
			RequestID string `json:"requestId"`
		}
		if err == nil {
			err = json.Unmarshal(raw, &req)
		}
		if err != nil {
			t.Errorf("vendor reads the request: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		received[req.RequestID]++
		keys[req.RequestID] = r.Header.Get("Idempotency-Key")
		perConn[r.RemoteAddr]++
		reused := perConn[r.RemoteAddr] > 1
		mu.Unlock()
		if reused {
			// Drop the connection without a response byte: the client reads EOF.
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Errorf("hijack: %v", err)
				return
			}
			_ = conn.Close()
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"text": "ok " + req.RequestID})
	}))
	defer srv.Close()

	// One connection at a time, so the second call reuses the first's.
	client := srv.Client()
	client.Transport.(*http.Transport).MaxConnsPerHost = 1
	v := examples.HTTPVendor{URL: srv.URL, Client: client}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	text, err := v.Complete(examples.WithVendorScope(ctx, "/agents/a"), "msg-1", "first")
	require.NoError(t, err)
	require.Equal(t, "ok msg-1", text)

	_, err = v.Complete(ctx, "msg-2", "second")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, received["msg-2"], "one Complete reached the vendor %d times", received["msg-2"])
	require.Error(t, err, "the broken attempt surfaces as Complete's failure")
	// The key still travels: a real vendor deduplicates by it.
	require.Equal(t, "/agents/a#msg-1", keys["msg-1"], "the key names the agent's stream")
	require.Equal(t, "msg-2", keys["msg-2"])
}
