package server

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
)

func TestRefusedAddr(t *testing.T) {
	for _, tc := range []struct {
		addr    string
		refused bool
	}{
		// IPv4 special-purpose blocks and the edges around them.
		{"0.0.0.0", true}, {"0.1.2.3", true},
		{"10.0.0.1", true}, {"10.255.255.255", true}, {"11.0.0.1", false},
		{"100.63.255.255", false}, {"100.64.0.0", true}, {"100.127.255.255", true}, {"100.128.0.0", false},
		{"127.0.0.1", true}, {"127.255.255.254", true},
		{"169.254.169.254", true},
		{"172.15.255.255", false}, {"172.16.0.1", true}, {"172.31.255.255", true}, {"172.32.0.0", false},
		{"192.0.0.8", true}, {"192.0.0.170", true}, {"192.0.2.1", true},
		{"192.88.99.1", true}, {"192.168.1.1", true},
		{"198.17.255.255", false}, {"198.18.0.0", true}, {"198.19.255.255", true}, {"198.20.0.0", false},
		{"198.51.100.7", true}, {"203.0.113.9", true},
		{"224.0.0.1", true}, {"239.255.255.255", true}, {"240.0.0.1", true}, {"255.255.255.255", true},
		{"8.8.8.8", false}, {"1.1.1.1", false}, {"93.184.216.34", false},
		// IPv6 special-purpose blocks.
		{"::", true}, {"::1", true}, {"::127.0.0.1", true},
		{"64:ff9b:1::1", true}, {"100::1", true},
		{"2001::1", true}, {"2001:2::1", true}, {"2001:db8::1", true}, {"3fff::1", true},
		{"5f00::1", true}, {"2002:c000:0201::1", true},
		{"fc00::1", true}, {"fd12:3456::1", true}, {"fe80::1", true}, {"fe80::1%eth0", true}, {"fec0::1", true},
		{"ff02::1", true}, {"ff0e::1", true},
		{"2606:4700:4700::1111", false}, {"2a00:1450::1", false},
		// IPv4-mapped and translated forms are judged by the IPv4 address they reach.
		{"::ffff:127.0.0.1", true}, {"::ffff:10.1.2.3", true}, {"::ffff:100.64.0.1", true},
		{"::ffff:8.8.8.8", false},
		{"64:ff9b::127.0.0.1", true}, {"64:ff9b::a9fe:a9fe", true}, {"64:ff9b::8.8.8.8", false},
		{"::ffff:0:8.8.8.8", true}, {"::ffff:0:127.0.0.1", true},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			reason, got := refusedAddr(netip.MustParseAddr(tc.addr))
			if got != tc.refused {
				t.Errorf("refused = %v (%s), want %v", got, reason, tc.refused)
			}
		})
	}
}

func TestNumericHost(t *testing.T) {
	for _, tc := range []struct {
		host string
		want string // "" = not numeric
	}{
		{"127.0.0.1", "127.0.0.1"}, {"127.1", "127.0.0.1"}, {"127.0.1", "127.0.0.1"},
		{"2130706433", "127.0.0.1"}, {"0x7f000001", "127.0.0.1"}, {"0X7F000001", "127.0.0.1"},
		{"0177.0.0.1", "127.0.0.1"}, {"0x7f.1", "127.0.0.1"}, {"10.0x10203", "10.1.2.3"},
		{"0", "0.0.0.0"}, {"::1", "::1"}, {"fe80::1%eth0", "fe80::1%eth0"},
		{"4294967296", ""}, {"256.0.0.1", ""}, {"1.2.3.256", ""}, {"1.2.65536", ""}, {"1.2.3.4.5", ""},
		{"0o177.0.0.1", ""}, {"1_0.0.0.1", ""}, {"08.0.0.1", ""}, {"0x", ""}, {"", ""}, {"1..2", ""},
		{"example.com", ""}, {"10.example", ""}, {"+1.0.0.1", ""},
	} {
		t.Run(tc.host, func(t *testing.T) {
			ip, ok := numericHost(tc.host)
			got := ""
			if ok {
				got = ip.String()
			}
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestEgressPolicy_CheckURL(t *testing.T) {
	deny := EgressPolicy{DenyPrivate: true}
	for _, tc := range []struct {
		url     string
		refused bool
	}{
		{"http://127.0.0.1:8080/", true}, {"http://127.1/", true}, {"http://2130706433/", true},
		{"http://0x7f000001/", true}, {"http://0177.0.0.1/", true}, {"http://[::1]/", true},
		{"http://[::ffff:127.0.0.1]/", true}, {"http://100.64.0.1/", true}, {"http://198.18.0.1/", true},
		{"http://localhost:9000/", true}, {"http://LOCALHOST./", true}, {"http://api.localhost/", true},
		{"http://printer.local/", true}, {"http://router.home.arpa/", true}, {"http://db.internal/", true},
		{"http:///path", true},
		{"https://hooks.example.com/x", false}, {"https://8.8.8.8/", false}, {"http://[2606:4700::1]/", false},
		{"http://localhost.example.com/", false},
	} {
		t.Run(tc.url, func(t *testing.T) {
			err := deny.checkURL(tc.url)
			if (err != nil) != tc.refused {
				t.Errorf("checkURL = %v, want refused %v", err, tc.refused)
			}
			if err := (EgressPolicy{}).checkURL(tc.url); err != nil {
				t.Errorf("without DenyPrivate: %v, want nil", err)
			}
		})
	}
}

// TestEgressPolicy_RefusedAtConnect: a name that passes configure but resolves to a refused
// address is refused on the address actually dialled.
func TestEgressPolicy_RefusedAtConnect(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	c := newHTTPClient(EgressPolicy{DenyPrivate: true}, DefaultMaxWebhookResponseHeaderBytes)
	_, err := c.Post(strings.Replace(srv.URL, "127.0.0.1", "localhost", 1), "application/json", nil)
	if err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("got %v, want a refusal naming loopback", err)
	}
	resp, err := newHTTPClient(EgressPolicy{}, DefaultMaxWebhookResponseHeaderBytes).Post(srv.URL, "application/json", nil)
	if err != nil {
		t.Fatalf("without DenyPrivate: %v", err)
	}
	resp.Body.Close()
}

// TestWebhookSender_RefusedAtConnectIsTerminal: a name whose resolved address the policy refuses
// is a terminal failure naming the policy (it halts at once), not an outage that climbs the
// ladder for hours; without the policy the same request goes through.
func TestWebhookSender_RefusedAtConnectIsTerminal(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	s := &Server{clock: clocktest.New(time.Unix(1_700_000_000, 0)), metrics: newMetrics()}
	d := &deliverer{srv: s, name: "hook"}
	batch := &itx.DeliveryBatch{Events: []itx.Event{{Offset: 1, Type: "a", Payload: []byte(`{}`)}}}
	// The URL passes the configure-time check (egress unset here, as for a name that resolves
	// elsewhere at configure); the dialer's check on the resolved address refuses it.
	url := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	w := &webhookSender{client: newHTTPClient(EgressPolicy{DenyPrivate: true}, DefaultMaxWebhookResponseHeaderBytes), url: url}
	_, err := w.send(context.Background(), d, batch)
	if got := classify(err); got != classTerminal {
		t.Fatalf("class %s (%v), want terminal", got, err)
	}
	if msg := err.Error(); !strings.Contains(msg, "egress policy") || !strings.Contains(msg, "--webhook-deny-private") || !strings.Contains(msg, "loopback") {
		t.Fatalf("got %q, want the policy and the refused address named", msg)
	}
	w.client = newHTTPClient(EgressPolicy{}, DefaultMaxWebhookResponseHeaderBytes)
	if _, err := w.send(context.Background(), d, batch); err != nil {
		t.Fatalf("without the policy: %v", err)
	}
}

// TestWebhookSender_URLRefusedBeforeDialIsTerminal: a URL configured before the policy that now
// refuses it (--webhook-allow-host tightened here) is refused before anything is dialled, and
// halts at once.
func TestWebhookSender_URLRefusedBeforeDialIsTerminal(t *testing.T) {
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { requests.Add(1) }))
	defer srv.Close()
	s := &Server{clock: clocktest.New(time.Unix(1_700_000_000, 0)), metrics: newMetrics()}
	d := &deliverer{srv: s, name: "hook"}
	batch := &itx.DeliveryBatch{Events: []itx.Event{{Offset: 1, Type: "a", Payload: []byte(`{}`)}}}
	w := &webhookSender{client: newHTTPClient(EgressPolicy{}, DefaultMaxWebhookResponseHeaderBytes), egress: EgressPolicy{AllowHosts: []string{"hooks.example.com"}}, url: srv.URL}
	_, err := w.send(context.Background(), d, batch)
	if got := classify(err); got != classTerminal || !strings.Contains(err.Error(), "--webhook-allow-host") {
		t.Fatalf("got %v (class %s), want a terminal refusal naming --webhook-allow-host", err, got)
	}
	if n := requests.Load(); n != 0 {
		t.Fatalf("got %d requests, want none", n)
	}
}

// TestWebhookSender_OneSendIsOneRequest: a receiver that read a delivery on a reused connection
// and then dropped it without answering sees it once per send, even when the subscription
// configured an Idempotency-Key header (which makes net/http treat a POST as replayable); the
// send fails and the ladder decides about the retry.
func TestWebhookSender_OneSendIsOneRequest(t *testing.T) {
	var mu sync.Mutex
	perConn := map[string]int{}
	var received atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			t.Errorf("read: %v", err)
			return
		}
		received.Add(1)
		mu.Lock()
		perConn[r.RemoteAddr]++
		reused := perConn[r.RemoteAddr] > 1
		mu.Unlock()
		if reused {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Errorf("hijack: %v", err)
				return
			}
			conn.Close()
		}
	}))
	defer srv.Close()
	s := &Server{clock: clocktest.New(time.Unix(1_700_000_000, 0)), metrics: newMetrics()}
	d := &deliverer{srv: s, name: "hook"}
	batch := &itx.DeliveryBatch{Events: []itx.Event{{Offset: 1, Type: "a", Payload: []byte(`{}`)}}}
	client := newHTTPClient(EgressPolicy{}, DefaultMaxWebhookResponseHeaderBytes)
	client.Transport.(*http.Transport).MaxConnsPerHost = 1
	w := &webhookSender{client: client, url: srv.URL, headers: map[string]string{"Idempotency-Key": "k"}}
	if _, err := w.send(context.Background(), d, batch); err != nil {
		t.Fatalf("first send: %v", err)
	}
	if _, err := w.send(context.Background(), d, batch); err == nil {
		t.Fatal("a send whose connection broke before the answer succeeded")
	}
	if n := received.Load(); n != 2 {
		t.Fatalf("the receiver got %d requests for 2 sends", n)
	}
}
