package capability

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

// ServerTLSConfig is the RPC listener's TLS: the certificate and key (PEM files), and with
// clientCAFile, mutual TLS: every client must present a certificate signed by one of its CAs.
func ServerTLSConfig(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile}
	if err := r.load(); err != nil {
		return nil, fmt.Errorf("TLS certificate: %w", err)
	}
	cfg := &tls.Config{GetCertificate: r.get, MinVersion: tls.VersionTLS12}
	if clientCAFile != "" {
		pem, err := os.ReadFile(clientCAFile)
		if err != nil {
			return nil, fmt.Errorf("client CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("client CA file %s holds no PEM certificate", clientCAFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// IsLoopback reports whether a listen address (host:port) only accepts connections from this
// machine: a loopback IP, or a name that resolves only to loopback IPs. An empty or unspecified
// host (":7878", "0.0.0.0:7878") listens on every interface.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	ips, err := net.LookupIP(host)
	if err != nil || len(ips) == 0 {
		return false
	}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return false
		}
	}
	return true
}

// certReloader serves the certificate and key files as they are now: a handshake reads them
// again when either file changed (checked at most every certCheckEvery), so a certificate
// renewed in place (certbot, cert-manager) is served without a restart. It was read once at
// start: a 90-day certificate expired under a running itxd, and every client's handshake failed
// until someone restarted it. A pair that does not load (the key written after the certificate,
// half a file) keeps the last good one and is tried again at the next check.
type certReloader struct {
	certFile, keyFile string

	mu              sync.Mutex
	cert            *tls.Certificate
	certMod, keyMod time.Time
	checked         time.Time
}

// certCheckEvery bounds how often handshakes stat the certificate files.
const certCheckEvery = time.Second

func (r *certReloader) load() error {
	ci, err := os.Stat(r.certFile)
	if err != nil {
		return err
	}
	ki, err := os.Stat(r.keyFile)
	if err != nil {
		return err
	}
	if r.cert != nil && ci.ModTime().Equal(r.certMod) && ki.ModTime().Equal(r.keyMod) {
		return nil
	}
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return err
	}
	r.cert, r.certMod, r.keyMod = &cert, ci.ModTime(), ki.ModTime()
	return nil
}

func (r *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); now.Sub(r.checked) >= certCheckEvery {
		r.checked = now
		_ = r.load() // on failure the last good pair stays
	}
	return r.cert, nil
}
