package capability

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/rpc"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	itxserver "github.com/itx-dev/itx/server"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// panicky is a Stream whose describe panics and whose getEventPage answers an ordinary error.
type panicky struct{ schema.Stream_Server }

func (panicky) Describe(context.Context, schema.Stream_describe) error {
	var m map[string]int
	m["boom"] = 1 // a nil-map write: the kind of bug that must not end itxd
	return nil
}

func (panicky) GetEventPage(context.Context, schema.Stream_getEventPage) error {
	return fail(itx.Errorf(itx.EInvalid, "an ordinary refusal"))
}

// A panic inside a handler, served over real TCP, becomes an internal error for that call; the
// connection and the server carry on, and the panic is logged with its stack.
func TestGuarded_PanicBecomesInternalError(t *testing.T) {
	// The handler logs on the server's goroutine before its reply goes out; the race detector
	// cannot see that ordering through the socket, so the buffer takes a lock.
	var logs lockedBuffer
	impl := panicky{}
	g := guard{log: zerolog.New(&logs), panics: itxserver.NewHandlerPanics()}
	boot := schema.Stream(guarded(g, access{rights: rAll}, schema.Stream_Methods(nil, impl), impl))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		conn := rpc.NewConn(rpc.NewStreamTransport(c), &rpc.Options{BootstrapClient: capnp.Client(boot)})
		<-conn.Done()
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	conn := rpc.NewConn(rpc.NewStreamTransport(nc), nil)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := schema.Stream(conn.Bootstrap(ctx))
	defer s.Release()

	for i := 0; i < 2; i++ { // the second call proves the first did not take the server down
		_, err = client.Describe(ctx, s)
		require.Equal(t, itx.EInternal, itx.ErrorCode(err), "%v", err)
		require.Contains(t, err.Error(), "describe failed inside the server")
	}
	_, err = client.GetEventPage(ctx, s, itx.Query{})
	require.Equal(t, itx.EInvalid, itx.ErrorCode(err), "ordinary errors pass through untouched")

	require.Equal(t, 2.0, testutil.ToFloat64(g.panics.WithLabelValues("itx.capnp:Stream.describe")), "each panic is counted")
	require.Contains(t, logs.String(), "assignment to entry in nil map")
	require.Contains(t, logs.String(), "guard_test.go", "the stack is logged")
}

// lockedBuffer is a bytes.Buffer safe for the logger's goroutine and the test's.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
