package examples

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
)

// EchoVendor answers every prompt with itself: the agent's vendor when none is configured.
type EchoVendor struct{}

// Complete returns "echo: " and the prompt.
func (EchoVendor) Complete(ctx context.Context, requestID, prompt string) (string, error) {
	return "echo: " + prompt, nil
}

// vendorScope is the context key of WithVendorScope.
type vendorScope struct{}

// WithVendorScope returns ctx carrying the scope a vendor call's idempotency key is qualified
// with. The agent gives its stream's path: request ids (msg-<offset>) repeat across agent
// streams, and two agents sharing one vendor account must never share a key there (a vendor
// that deduplicates by it would answer one agent's request with the other's answer).
func WithVendorScope(ctx context.Context, scope string) context.Context {
	return context.WithValue(ctx, vendorScope{}, scope)
}

// VendorKey is the idempotency key of requestID under ctx's scope: "<scope>#<requestID>", or
// the request id alone without a scope.
func VendorKey(ctx context.Context, requestID string) string {
	if scope, _ := ctx.Value(vendorScope{}).(string); scope != "" {
		return scope + "#" + requestID
	}
	return requestID
}

// HTTPVendor calls an LLM-like endpoint: POST {"requestId", "prompt"} (the Idempotency-Key
// header is VendorKey: the agent's stream path, "#" and the request id), answered by {"text"}. Any other status is a failure. Complete
// sends at most one request: the HTTP transport never retries it on its own.
type HTTPVendor struct {
	URL    string
	Client *http.Client // nil: a client with a 2-minute timeout
}

// Complete posts one completion request.
func (v HTTPVendor) Complete(ctx context.Context, requestID, prompt string) (string, error) {
	body, _ := json.Marshal(map[string]string{"requestId": requestID, "prompt": prompt})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, v.URL, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", VendorKey(ctx, requestID))
	// One Complete is one attempt. net/http's Transport takes an Idempotency-Key header as leave
	// to replay a POST whose reused keep-alive connection broke, even after the request was
	// written and the vendor may have acted on it, provided it can rewind the body (GetBody, which
	// NewRequest sets for a bytes.Reader). Without GetBody it cannot: the broken attempt fails
	// here and the agent decides (a started attempt that failed is settled, never re-driven).
	// The key stays, for the vendor to deduplicate by. It also keeps a 307/308 redirect from
	// resending the body.
	req.GetBody = nil
	c := v.Client
	if c == nil {
		c = &http.Client{Timeout: 2 * time.Minute}
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("vendor answered %s: %s", resp.Status, strings.TrimSpace(string(raw)))
	}
	var out struct {
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return "", fmt.Errorf("vendor answer does not decode: %w", err)
	}
	return out.Text, nil
}

// HostOptions configures the reference processors a host runs.
type HostOptions struct {
	Clock  itx.Clock
	Vendor Vendor // the agent's; nil: EchoVendor
	Agent  AgentConfig
}

// Names are the reference processors' contract names, in the order AddTo takes them.
var Names = []string{"guestbook", "forwarder", "agent", "router"}

// AddTo registers the named reference processors with h.
func AddTo(h *processors.Host, names []string, o HostOptions) error {
	if o.Clock == nil {
		o.Clock = itx.SystemClock{}
	}
	if o.Vendor == nil {
		o.Vendor = EchoVendor{}
	}
	if o.Agent == (AgentConfig{}) {
		o.Agent = DefaultAgentConfig
	}
	for _, name := range names {
		var err error
		switch strings.TrimSpace(name) {
		case "guestbook":
			err = processors.Add(h, Guestbook)
		case "forwarder":
			err = processors.Add(h, Forwarder)
		case "router":
			err = processors.Add(h, Router)
		case "agent":
			err = processors.Add(h, func() processors.Contract[AgentState] { return Agent(o.Clock, o.Vendor, o.Agent) })
		case "":
			continue
		default:
			err = itx.Errorf(itx.EInvalid, "no reference processor is called %q (there are %s)", name, strings.Join(Names, ", "))
		}
		if err != nil {
			return err
		}
	}
	return nil
}
