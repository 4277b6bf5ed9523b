package test

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
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/stretchr/testify/require"
)

// testCA is a certificate authority made for one test, written as PEM files.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // the CA certificate, PEM
}

func newTestCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	file := filepath.Join(dir, name+".crt")
	require.NoError(t, os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	return &testCA{cert: cert, key: key, file: file}
}

// issue writes a certificate for 127.0.0.1 (server or client use) signed by the CA, and its key.
func (ca *testCA) issue(t *testing.T, dir, name string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
	return certFile, keyFile
}

// dialTLS connects to a TLS itxd and makes one call: describe of the project.
func describeOverTLS(ctx context.Context, addr, token string, cfg *tls.Config) error {
	conn, err := client.DialWith(ctx, addr, client.Options{TLS: cfg})
	if err != nil {
		return err
	}
	defer conn.Close()
	p := conn.Login(ctx, token)
	defer p.Release()
	_, err = client.DescribeProject(ctx, p)
	return err
}

func TestTLS_RealHandshake(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	wrong := newTestCA(t, dir, "wrong-ca")
	cert, key := ca.issue(t, dir, "server", x509.ExtKeyUsageServerAuth)
	p := startItxd(t, t.TempDir(), "--tls-cert", cert, "--tls-key", key)
	ctx := ctxT(t)

	cfg, err := client.TLSConfig(ca.file, "", "")
	require.NoError(t, err)
	conn, err := client.DialWith(ctx, p.addr, client.Options{TLS: cfg})
	require.NoError(t, err)
	defer conn.Close()
	s := client.Stream(ctx, conn.Login(ctx, p.creds.ProjectToken), "/tls")
	defer s.Release()
	res, err := client.Append(ctx, s, []itx.EventInput{ev("note", `{"over": "tls"}`)}, itx.AppendOptions{})
	require.NoError(t, err)
	require.Equal(t, []int64{1}, res.Offsets)

	t.Run("a wrong CA is refused", func(t *testing.T) {
		bad, err := client.TLSConfig(wrong.file, "", "")
		require.NoError(t, err)
		err = describeOverTLS(ctx, p.addr, p.creds.ProjectToken, bad)
		require.Error(t, err)
		require.Contains(t, err.Error(), "certificate signed by unknown authority")
	})
	t.Run("the system roots do not know a self-signed CA", func(t *testing.T) {
		sys, err := client.TLSConfig("", "", "")
		require.NoError(t, err)
		require.Error(t, describeOverTLS(ctx, p.addr, p.creds.ProjectToken, sys))
	})
	t.Run("a session bound aborts a TLS connection with its reason", func(t *testing.T) {
		tc, err := tls.Dial("tcp", p.addr, cfg)
		require.NoError(t, err)
		r := itxtest.NewRawClient(t, tc)
		for q := uint32(0); q <= 100; q++ {
			r.Bootstrap(q) // never finished: past --rpc-preauth-max-unfinished-replies (64)
		}
		_, reason := r.UntilAbort()
		require.True(t, strings.HasPrefix(reason, "itx.limitExceeded: "), "abort reason %q", reason)
		require.Contains(t, reason, "--rpc-preauth-max-unfinished-replies")
	})
	t.Run("plaintext gets no answer", func(t *testing.T) {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		require.Error(t, describeOverTLS(cctx, p.addr, p.creds.ProjectToken, nil))
	})
}

func TestTLS_MutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	clientCA := newTestCA(t, dir, "client-ca")
	other := newTestCA(t, dir, "other-ca")
	cert, key := ca.issue(t, dir, "server", x509.ExtKeyUsageServerAuth)
	p := startItxd(t, t.TempDir(), "--tls-cert", cert, "--tls-key", key, "--tls-client-ca", clientCA.file)
	ctx := ctxT(t)

	ccert, ckey := clientCA.issue(t, dir, "client", x509.ExtKeyUsageClientAuth)
	good, err := client.TLSConfig(ca.file, ccert, ckey)
	require.NoError(t, err)
	require.NoError(t, describeOverTLS(ctx, p.addr, p.creds.ProjectToken, good))

	none, err := client.TLSConfig(ca.file, "", "")
	require.NoError(t, err)
	require.Error(t, describeOverTLS(ctx, p.addr, p.creds.ProjectToken, none), "no client certificate")

	ocert, okey := other.issue(t, dir, "stranger", x509.ExtKeyUsageClientAuth)
	stranger, err := client.TLSConfig(ca.file, ocert, okey)
	require.NoError(t, err)
	require.Error(t, describeOverTLS(ctx, p.addr, p.creds.ProjectToken, stranger), "a client certificate from another CA")
}

// itxd refuses plaintext on an address other machines reach, unless told --insecure, and
// writes nothing when it refuses.
func TestItxd_RefusesPlaintextOffLoopback(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	out, err := exec.Command(itxdBin, "--listen", "0.0.0.0:0", "--data", data).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "refusing to serve plaintext RPC")
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	require.Equal(t, 2, exit.ExitCode(), "a flag combination refused, as for a flag that does not parse")
	_, statErr := os.Stat(data)
	require.True(t, os.IsNotExist(statErr), "nothing is written")

	out, err = exec.Command(itxdBin, "--tls-client-ca", "x.pem", "--data", data).CombinedOutput()
	require.Error(t, err)
	require.True(t, strings.Contains(string(out), "--tls-client-ca needs"), "%s", out)

	// With --insecure it serves (on every interface; the test connects through loopback).
	p := startItxd(t, t.TempDir(), "--listen", "0.0.0.0:0", "--insecure")
	_, port, err := net.SplitHostPort(p.addr)
	require.NoError(t, err)
	conn := dial(t, net.JoinHostPort("127.0.0.1", port))
	_, err = client.DescribeProject(ctxT(t), conn.Login(ctxT(t), p.creds.ProjectToken))
	require.NoError(t, err)
}

// A certificate renewed in place (certbot, cert-manager write new files at the same paths) is
// served without a restart: itxd read the files once at start, so a 90-day certificate expired
// under a running server and every handshake failed until someone restarted it.
func TestTLS_RenewedCertificateServedWithoutRestart(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	cert, key := ca.issue(t, dir, "server", x509.ExtKeyUsageServerAuth)
	p := startItxd(t, t.TempDir(), "--tls-cert", cert, "--tls-key", key)
	ctx := ctxT(t)
	oldCfg, err := client.TLSConfig(ca.file, "", "")
	require.NoError(t, err)
	require.NoError(t, describeOverTLS(ctx, p.addr, p.creds.ProjectToken, oldCfg))

	renewed := t.TempDir()
	next := newTestCA(t, renewed, "next-ca")
	newCert, newKey := next.issue(t, renewed, "server", x509.ExtKeyUsageServerAuth)
	require.NoError(t, os.Rename(newKey, key))
	require.NoError(t, os.Rename(newCert, cert))
	newCfg, err := client.TLSConfig(next.file, "", "")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return describeOverTLS(ctx, p.addr, p.creds.ProjectToken, newCfg) == nil },
		20*time.Second, 50*time.Millisecond, "the renewed certificate is served")
	require.Error(t, describeOverTLS(ctx, p.addr, p.creds.ProjectToken, oldCfg), "the old one is not")
}
