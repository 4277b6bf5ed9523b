package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3/rpc"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/stretchr/testify/require"
)

// stoppableConn is a client socket that stops reading once stop is closed: a client that
// pipelines calls and never reads the replies. Its Close ends a read held so, as a closed
// socket would: the RPC connection over it then ends, with its calls. (Its reads used to wait
// forever: the connection never learnt of the close, and its 100,000 unanswered calls, some
// 26,500 goroutines and 300,000 objects, stayed for the rest of the test process, in every
// heap and goroutine measurement of the tests after it.)
type stoppableConn struct {
	net.Conn
	stop   chan struct{}
	once   sync.Once
	closed chan struct{}
}

func newStoppableConn(c net.Conn) *stoppableConn {
	return &stoppableConn{Conn: c, stop: make(chan struct{}), closed: make(chan struct{})}
}

func (c *stoppableConn) Read(b []byte) (int, error) {
	select {
	case <-c.stop:
		<-c.closed // never read again
		return 0, net.ErrClosed
	default:
	}
	return c.Conn.Read(b)
}

func (c *stoppableConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// kibEvents are n events of about 1 KiB of payload each.
func kibEvents(n, base int) []itx.EventInput {
	pad := strings.Repeat("x", 1000)
	out := make([]itx.EventInput, n)
	for i := range out {
		out[i] = itx.EventInput{Type: "kib", Payload: json.RawMessage(fmt.Sprintf(`{"seq":%d,"pad":%q}`, base+i, pad))}
	}
	return out
}

// pipelineUnread sends n getEventPage(limit 500) calls on a connection that never reads its
// replies, and returns once they are handed to the client's RPC layer.
func pipelineUnread(t testing.TB, addr, token, path string, n int) (closeConn func()) {
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	sc := newStoppableConn(c)
	conn := rpc.NewConn(rpc.NewStreamTransport(sc), nil)
	gw := schema.Gateway(conn.Bootstrap(context.Background()))
	login, _ := gw.Login(context.Background(), func(p schema.Gateway_login_Params) error { return p.SetToken(token) })
	s := client.Stream(context.Background(), login.Project(), path)
	require.NoError(t, s.Resolve(ctxT(t)))
	close(sc.stop)
	for range n {
		s.GetEventPage(context.Background(), func(p schema.Stream_getEventPage_Params) error {
			q, err := p.NewQuery()
			if err != nil {
				return err
			}
			q.SetLimit(500)
			return nil
		})
	}
	return func() { sc.Close() }
}

// scrapeMetric returns the sum of a metric's samples from an itxd /metrics endpoint.
func scrapeMetric(t testing.TB, addr, name string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var sum float64
	for _, line := range strings.Split(string(body), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && (f[0] == name || strings.HasPrefix(f[0], name+"{")) {
			v, err := strconv.ParseFloat(f[1], 64)
			require.NoError(t, err)
			sum += v
		}
	}
	return sum
}

// procStatusMiB reads a field (VmRSS, VmHWM) of /proc/<pid>/status in MiB.
func procStatusMiB(t testing.TB, pid int, field string) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field+":" {
			kb, err := strconv.ParseFloat(f[1], 64)
			require.NoError(t, err)
			return kb / 1024
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// TestItxd_FlowControlBoundsMemory: a client pipelining 100,000 getEventPage(limit 500) calls on
// 1 KiB events without reading a reply (about 50 GiB of replies) keeps itxd under 512 MiB: the
// server stops reading that connection at its bound, and another client is still served.
func TestItxd_FlowControlBoundsMemory(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("needs /proc")
	}
	metrics := freeAddr(t)
	p := startItxd(t, t.TempDir(), "--metrics", metrics)
	ctx := ctxT(t)
	conn := dial(t, p.addr)
	proj := conn.Login(ctx, p.creds.ProjectToken)
	defer proj.Release()
	s := stream(t, proj, "/pages")
	for i := range 10 {
		_, err := client.Append(ctx, s, kibEvents(100, i*100), itx.AppendOptions{})
		require.NoError(t, err)
	}

	closeAbuser := pipelineUnread(t, p.addr, p.creds.ProjectToken, "/pages", 100_000)
	defer closeAbuser()
	// Wait until the server has stopped reading the abuser at one of its bounds: 128 calls
	// unanswered, or 16 MiB of replies unwritten. Which comes first depends on how fast the
	// handlers answer against how fast the calls are read (under load the replies of the first
	// few dozen calls can reach 16 MiB before the 128th call is read).
	require.Eventually(t, func() bool {
		return scrapeMetric(t, metrics, "itx_rpc_read_pauses_total") >= 1 &&
			(scrapeMetric(t, metrics, "itx_rpc_calls_in_flight") >= 128 ||
				scrapeMetric(t, metrics, "itx_rpc_unwritten_bytes") >= 16<<20)
	}, 2*time.Minute, 10*time.Millisecond, "itxd never paused the abusive connection")
	require.LessOrEqual(t, scrapeMetric(t, metrics, "itx_rpc_calls_in_flight"), 128.0+8, "the abuser's calls are bounded")

	// Another client is served meanwhile.
	res, err := client.Append(ctx, s, kibEvents(1, 1000), itx.AppendOptions{})
	require.NoError(t, err)
	require.Equal(t, []int64{1001}, res.Offsets)

	hwm := procStatusMiB(t, p.cmd.Process.Pid, "VmHWM")
	t.Logf("itxd peak RSS %.0f MiB, unwritten reply bytes %.0f MiB", hwm, scrapeMetric(t, metrics, "itx_rpc_unwritten_bytes")/(1<<20))
	require.Less(t, hwm, 512.0, "itxd's peak RSS (MiB)")
	p.kill9(t)
}

// Not reading a connection stops only its next calls: the calls already read each built their
// reply, so a client pipelining 100 reads of 4.5 MiB pages and reading nothing had itxd queue
// about 450 MiB for it, whatever --rpc-max-reply-bytes said (16 MiB by default; measured: 40
// such connections took itxd past 9 GiB of RSS, growing). A read reserves its reply's room first
// and waits while the connection's replies exceed the bound: what is queued stays within the
// bound and one page.
func TestItxd_PipelinedLargeReadsStayWithinTheReplyBound(t *testing.T) {
	metrics := freeAddr(t)
	p := startItxd(t, t.TempDir(), "--metrics", metrics)
	ctx := ctxT(t)
	proj := dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
	defer proj.Release()
	s := stream(t, proj, "/bigpages")
	pad := strings.Repeat("x", 900<<10)
	for i := range 40 {
		_, err := client.Append(ctx, s, []itx.EventInput{{Type: "big", Payload: json.RawMessage(fmt.Sprintf(`{"seq":%d,"pad":%q}`, i, pad))}}, itx.AppendOptions{})
		require.NoError(t, err)
	}

	closeAbuser := pipelineUnread(t, p.addr, p.creds.ProjectToken, "/bigpages", 100)
	defer closeAbuser()
	const page = 5 * 900 << 10 // a page ends after the event that brings it to 4 MiB
	var peak float64
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		peak = max(peak, scrapeMetric(t, metrics, "itx_rpc_unwritten_bytes"))
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("unwritten reply bytes at most %.1f MiB, %v calls in flight", peak/(1<<20), scrapeMetric(t, metrics, "itx_rpc_calls_in_flight"))
	require.Greater(t, peak, float64(page), "the abuser's first replies were queued")
	require.LessOrEqual(t, peak, float64(16<<20+2*page), "the replies queued for a client that reads nothing stay within --rpc-max-reply-bytes and a page")

	// Another client is served meanwhile, its reads too.
	evs, err := client.GetEvents(ctx, s, itx.Query{After: 38})
	require.NoError(t, err)
	require.Len(t, evs, 2)
}

// pausableConn is a client socket whose reads wait while it is paused: a client that stops
// reading its replies for a while.
type pausableConn struct {
	net.Conn
	paused chan struct{} // closed: reads wait for resumed
	resume chan struct{}
}

func (c *pausableConn) Read(b []byte) (int, error) {
	select {
	case <-c.paused:
		<-c.resume
	default:
	}
	return c.Conn.Read(b)
}

// Long polls pipelined by a client that reads no replies would each hold their match (up to an
// event's 1 MiB) while their replies wait for room. A waitForEvent whose reply waits lets go of
// its match and reads it again once there is room: so a match trimmed meanwhile is answered
// notFound, where a held one would still be sent.
func TestItxd_PipelinedWaitsDoNotHoldTheirMatch(t *testing.T) {
	metrics := freeAddr(t)
	p := startItxd(t, t.TempDir(), "--metrics", metrics)
	ctx := ctxT(t)
	proj := dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
	defer proj.Release()
	s := stream(t, proj, "/bigwait")
	pad := strings.Repeat("x", 900<<10)
	_, err := client.Append(ctx, s, []itx.EventInput{{Type: "big", Payload: json.RawMessage(fmt.Sprintf(`{"pad":%q}`, pad))},
		{Type: "small", Payload: json.RawMessage(`{}`)}}, itx.AppendOptions{})
	require.NoError(t, err)

	c, err := net.Dial("tcp", p.addr)
	require.NoError(t, err)
	pc := &pausableConn{Conn: c, paused: make(chan struct{}), resume: make(chan struct{})}
	conn := rpc.NewConn(rpc.NewStreamTransport(pc), nil)
	defer conn.Close()
	gw := schema.Gateway(conn.Bootstrap(ctx))
	login, _ := gw.Login(ctx, func(l schema.Gateway_login_Params) error { return l.SetToken(p.creds.ProjectToken) })
	as := client.Stream(ctx, login.Project(), "/bigwait")
	require.NoError(t, as.Resolve(ctx))
	close(pc.paused)

	const waits = 60 // about 17 replies of 900 KiB fill the connection's 16 MiB
	answers := make(chan error, waits)
	for range waits {
		go func() {
			e, err := client.WaitForEvent(ctx, as, itx.Predicate{Types: []string{"big"}}, 0, 2*time.Second)
			if err == nil && e.Offset != 1 {
				err = fmt.Errorf("matched offset %d, want 1", e.Offset)
			}
			answers <- err
		}()
	}
	waitUntil(t, "replies wait for room", func() bool { return scrapeMetric(t, metrics, "itx_rpc_replies_waiting") >= 10 })
	_, err = client.Trim(ctx, s, 1)
	require.NoError(t, err)
	close(pc.resume)

	var found, trimmed, later int
	for range waits {
		switch err := <-answers; {
		case err == nil:
			found++
		case itx.ErrorCode(err) == itx.ENotFound && strings.Contains(err.Error(), "trimmed before its reply"):
			trimmed++
		case itx.ErrorCode(err) == itx.EDeadlineExceeded:
			later++ // read by itxd only after the trim: nothing matches since
		default:
			t.Fatalf("a wait answered: %v", err)
		}
	}
	t.Logf("%d waits answered with the event, %d found it trimmed, %d began after the trim", found, trimmed, later)
	require.Positive(t, found, "the replies that had room carry the event")
	require.Positive(t, trimmed, "the replies that waited for room did not hold the event")
	require.Zero(t, scrapeMetric(t, metrics, "itx_rpc_replies_waiting"))
}

// listScheduled answers a page as large as a read's (500 scheduled events or 4 MiB) and did not
// reserve its room: a client pipelining 100 of them on a stream holding 4.5 MiB of scheduled
// events, reading no reply, had itxd queue every page for it, past --rpc-max-reply-bytes. It
// reserves the room first now, as getEventPage does.
func TestItxd_PipelinedListScheduledStaysWithinTheReplyBound(t *testing.T) {
	metrics := freeAddr(t)
	p := startItxd(t, t.TempDir(), "--metrics", metrics)
	ctx := ctxT(t)
	proj := dial(t, p.addr).Login(ctx, p.creds.ProjectToken)
	defer proj.Release()
	s := stream(t, proj, "/bigschedule")
	mustAppend(t, s, ev("created", `{}`))
	pad := strings.Repeat("x", 900<<10)
	due := time.Now().Add(time.Hour)
	for i := range 6 {
		_, _, err := client.Schedule(ctx, s, itx.EventInput{Type: "big", IdempotencyKey: fmt.Sprintf("k%d", i),
			Payload: json.RawMessage(fmt.Sprintf(`{"seq":%d,"pad":%q}`, i, pad))}, due)
		require.NoError(t, err)
	}

	c, err := net.Dial("tcp", p.addr)
	require.NoError(t, err)
	sc := newStoppableConn(c)
	defer sc.Close()
	conn := rpc.NewConn(rpc.NewStreamTransport(sc), nil)
	gw := schema.Gateway(conn.Bootstrap(context.Background()))
	token := p.creds.ProjectToken
	login, _ := gw.Login(context.Background(), func(a schema.Gateway_login_Params) error { return a.SetToken(token) })
	abused := client.Stream(context.Background(), login.Project(), "/bigschedule")
	require.NoError(t, abused.Resolve(ctx))
	close(sc.stop) // reads no reply from now on
	for range 100 {
		abused.ListScheduled(context.Background(), nil)
	}

	const page = 5 * 900 << 10 // a page ends after the event that brings it to 4 MiB
	var peak float64
	waitUntil(t, "the abuser's first page is queued and the rest wait or are queued", func() bool {
		peak = max(peak, scrapeMetric(t, metrics, "itx_rpc_unwritten_bytes"))
		return peak > page && (scrapeMetric(t, metrics, "itx_rpc_replies_waiting") >= 1 || peak > 16<<20+2*page)
	})
	require.LessOrEqual(t, peak, float64(16<<20+2*page), "the pages queued for a client that reads nothing stay within --rpc-max-reply-bytes and a page")

	// Another client is served meanwhile.
	list, err := client.ListScheduled(ctx, s)
	require.NoError(t, err)
	require.Equal(t, 5, len(list), "a page ends after the scheduled event that brings it to 4 MiB")
}
