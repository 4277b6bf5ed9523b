// Package itxtest starts an in-process itxd on a real loopback TCP port for tests: the same
// server, storage and capability graph as the binary, on a fresh (or given) data directory.
package itxtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx/capability"
	"github.com/itx-dev/itx/server"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// Server is a running in-process itxd.
type Server struct {
	Srv   *server.Server
	Addr  string // host:port of its RPC listener
	Creds server.Credentials
	Dir   string // data directory
}

// Start opens a server on cfg.DataDir (a fresh temporary one if empty) and serves it on TCP.
// Everything is closed when the test ends. ITX_TEST_LOG=1 routes its debug log to the test.
func Start(t testing.TB, cfg server.Config) *Server {
	t.Helper()
	return StartTLS(t, cfg, nil)
}

// StartTLS is Start serving RPC over TLS with tlsConfig (nil: plain TCP).
func StartTLS(t testing.TB, cfg server.Config, tlsConfig *tls.Config) *Server {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	if os.Getenv("ITX_TEST_LOG") != "" {
		cfg.Log = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel)
	}
	srv, err := server.Open(context.Background(), cfg)
	require.NoError(t, err)
	creds, err := server.ReadCredentials(cfg.DataDir)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l := capability.NewListener(srv)
	served := ln
	if tlsConfig != nil {
		served = tls.NewListener(ln, tlsConfig)
	}
	go l.Serve(served)
	t.Cleanup(func() {
		ln.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Close(ctx)
		l.CloseConnections(ctx)
	})
	return &Server{Srv: srv, Addr: ln.Addr().String(), Creds: creds, Dir: cfg.DataDir}
}

// SelfSigned makes a self-signed certificate for 127.0.0.1 and localhost, writes it (PEM) to
// dir/itxd.crt for clients to trust, and returns that file with the server's TLS config.
func SelfSigned(t testing.TB, dir string) (caFile string, cfg *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "itxd"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	caFile = filepath.Join(dir, "itxd.crt")
	require.NoError(t, os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	return caFile, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
}

// StreamDatabases lists the stream database files of a data directory (not their -wal or -shm,
// which come and go as streams load and unload).
func StreamDatabases(t testing.TB, dataDir string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dataDir, "streams"))
	if err != nil {
		t.Fatalf("read %s/streams: %v", dataDir, err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".db") {
			out = append(out, e.Name())
		}
	}
	return out
}
