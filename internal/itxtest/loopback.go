package itxtest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// An itxd restarted on the address a stopped one had must find it free, and an address that
// nothing listens on must stay so. A port of 127.0.0.1 a test let go of can be taken meanwhile by
// any socket a parallel test opens: a listen on port 0 and an outgoing connection's source port
// both draw from the ephemeral range, on 127.0.0.1 (the source of every connection to
// 127.0.0.0/8) or a wildcard address. So these addresses sit on another IP of 127.0.0.0/8, drawn
// at random, with a port below the ephemeral range (32768 and up on Linux, 49152 and up on
// macOS): only an explicit bind to that very address takes it, and a wildcard listener on that
// port (which would also answer there) makes the first listen fail, and the draw is retried.

// LoopbackTries bounds the draws for a free address.
const LoopbackTries = 8

// spareLoopback reports whether IPs of 127.0.0.0/8 other than 127.0.0.1 can be bound here
// (Linux routes the whole block to lo; macOS has only 127.0.0.1 unless aliased).
var spareLoopback = sync.OnceValue(func() bool {
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		return false
	}
	ln.Close()
	return true
})

// RandomLoopbackAddr draws an address: a random IP of 127.0.0.0/8 (127.0.0.1 where no other is
// bound) and a random port in [10000, 32768).
func RandomLoopbackAddr() string {
	ip := "127.0.0.1"
	if spareLoopback() {
		for ip == "127.0.0.1" {
			ip = fmt.Sprintf("127.%d.%d.%d", rand.IntN(256), rand.IntN(256), 1+rand.IntN(254))
		}
	}
	return net.JoinHostPort(ip, strconv.Itoa(10000+rand.IntN(32768-10000)))
}

// ListenLoopback listens on a freshly drawn loopback address (see RandomLoopbackAddr), drawing
// again when one is taken.
func ListenLoopback(t testing.TB) net.Listener {
	t.Helper()
	var err error
	for range LoopbackTries {
		var ln net.Listener
		if ln, err = net.Listen("tcp", RandomLoopbackAddr()); err == nil {
			return ln
		}
	}
	require.NoError(t, err, "no free loopback address in %d draws", LoopbackTries)
	return nil
}

// FreeLoopbackAddr is a drawn loopback address nothing listens on, for a process to listen on
// next (and again after a restart).
func FreeLoopbackAddr(t testing.TB) string {
	t.Helper()
	ln := ListenLoopback(t)
	defer ln.Close()
	return ln.Addr().String()
}
