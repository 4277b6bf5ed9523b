package test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The per-connection session bounds (--rpc-max-unreturned-calls, --rpc-max-capabilities) alone
// let a client grow itxd by connections times them: two connections each staying just under
// their own bound hold twice as much, 4,096 of them (--rpc-max-connections) about 270 million
// unreturned calls or held capabilities (measured: about 1 KiB each for a call, 14 KiB of RSS and a
// goroutine for a capability). Past the global bound the connection holding the most is
// aborted, naming the flag; the other peer, holding less, goes on, and so does a well-behaved
// client.
func TestItxd_HostileGlobalSessionBounds(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real itxd process")
	}
	s := startLongItxd(t, time.Second,
		"--rpc-max-unreturned-calls", "450", "--rpc-global-max-unreturned-calls", "500",
		"--rpc-max-capabilities", "3000", "--rpc-global-max-capabilities", "4000")
	token := s.creds.ProjectToken
	alive := dialAlive(t, s.addr, token)

	t.Run("calls never returned, over two connections", func(t *testing.T) {
		// openUnreturned opens a connection and a live-state view on p, delivers them an
		// event and closes both: itxd's calls on the sink and the subscriber (deliver, state,
		// closed) are never returned. It returns once itxd made at least want calls, or the
		// connection ended.
		openUnreturned := func(p *longPeer, want int, keys string) {
			deadline := time.Now().Add(15 * time.Second)
			for i := 0; p.end() == "" && p.callCount() < want; i++ {
				require.True(t, time.Now().Before(deadline), "itxd called the peer %d times in 15 s", p.callCount())
				conn, live := p.nextQ+1, p.nextQ+2
				p.withCallbackKind(0, senderHosted(1000+uint32(i)))
				p.withCallbackKind(1, senderHosted(1<<20+uint32(i)))
				p.appendKeyed(fmt.Sprintf("%s%d", keys, i))
				time.Sleep(2 * time.Millisecond)
				p.finish(conn, true)
				p.finish(live, true)
			}
		}
		a := startLongPeer(t, s.addr, token, 1, "/hostile/global-a")
		// itxd's calls for a round can come well after it (on a loaded machine a's count went
		// from 250 past 300 after its loop): 150 calls of room under its own bound for them.
		openUnreturned(a, 300, "a")
		a.sync(t)
		require.Empty(t, a.end(), "under its own bound (450), alone under the global one (500)")
		aborts := s.scrape(t, "itx_rpc_connections_aborted_total")
		b := startLongPeer(t, s.addr, token, 2, "/hostile/global-b")
		openUnreturned(b, 250, "b") // 300 + 250 > 500: a holds the most (b is under 200 when the sum passes 500)
		ended := a.waitUntilEnded(t)
		t.Logf("a after %d calls: %s; b at %d calls: %q", a.callCount(), ended, b.callCount(), b.end())
		requireAbortedFor(t, s, aborts, ended, "clients have not returned", "(--rpc-global-max-unreturned-calls)")
		require.Empty(t, b.end(), "the peer holding less goes on")
		alive.requireServed(t, "after the abort")
		b.r.Close()
		<-b.done
	})

	t.Run("capabilities never released, over two connections", func(t *testing.T) {
		hold := func(p *longPeer, n int) {
			for range n {
				q := p.newQ()
				p.getStream(q, "/hostile/global-caps")
				p.r.Finish(q) // keeping the Stream its reply holds: never released
				if p.end() != "" {
					return
				}
			}
		}
		a := startLongPeer(t, s.addr, token, 3, "/hostile/global-caps")
		hold(a, 2500)
		a.sync(t)
		require.Empty(t, a.end(), "under its own bound (3000), alone under the global one (4000)")
		aborts := s.scrape(t, "itx_rpc_connections_aborted_total")
		b := startLongPeer(t, s.addr, token, 4, "/hostile/global-caps")
		hold(b, 2000) // 2500 + 2000 > 4000: a holds the most
		b.sync(t)     // b's last call was read, so its count was taken
		ended := a.waitUntilEnded(t)
		t.Logf("a: %s", ended)
		requireAbortedFor(t, s, aborts, ended, "clients hold ", "(--rpc-global-max-capabilities)")
		require.True(t, strings.Contains(ended, "this one holds the most"), "%s", ended)
		require.Empty(t, b.end(), "the peer holding less goes on")
		alive.requireServed(t, "after the abort")
	})
}
