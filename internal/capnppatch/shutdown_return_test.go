package capnppatch

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/rpc"
	"capnproto.org/go/capnp/v3/rpc/transport"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/itx-dev/itx/schema"
	"github.com/stretchr/testify/require"
)

// gatedTransport holds its first outgoing message until gate is closed (the send goroutine is
// busy meanwhile), records the Returns it sends, and closes fifthRecv when it is asked for a
// fifth incoming message.
type gatedTransport struct {
	transport.Transport
	gate      chan struct{}
	fifthRecv chan struct{}
	sends     atomic.Int32
	recvs     atomic.Int32

	mu      sync.Mutex
	returns map[uint32]rpccp.Return_Which
}

func (t *gatedTransport) NewMessage() (transport.OutgoingMessage, error) {
	m, err := t.Transport.NewMessage()
	if err != nil {
		return nil, err
	}
	return gatedMessage{OutgoingMessage: m, t: t}, nil
}

func (t *gatedTransport) RecvMessage() (transport.IncomingMessage, error) {
	if t.recvs.Add(1) == 5 {
		close(t.fifthRecv)
	}
	return t.Transport.RecvMessage()
}

type gatedMessage struct {
	transport.OutgoingMessage
	t *gatedTransport
}

func (m gatedMessage) Send() error {
	if m.t.sends.Add(1) == 1 {
		<-m.t.gate
	}
	if msg := m.Message(); msg.Which() == rpccp.Message_Which_return {
		ret, _ := msg.Return()
		m.t.mu.Lock()
		m.t.returns[ret.AnswerId()] = ret.Which()
		m.t.mu.Unlock()
	}
	return m.OutgoingMessage.Send()
}

// failingHandle's first call waits for its context (the connection shutting down) and fails
// with it; its second reports that the first has returned (the calls run one at a time); all
// but the first fail at once.
type failingHandle struct {
	calls         atomic.Int32
	started       chan struct{}
	firstReturned chan struct{}
}

func (h *failingHandle) Cancel(ctx context.Context, _ schema.Handle_cancel) error {
	switch h.calls.Add(1) {
	case 1:
		close(h.started)
		<-ctx.Done()
		return ctx.Err()
	case 2:
		close(h.firstReturned)
	}
	return errors.New("failingHandle: refused")
}

// A call that fails because its connection is shutting down is never answered as a success.
// Unpatched, prepareSendException skipped building the exception once the connection's context
// was cancelled but still sent the Return, whose union then read as empty results: the caller
// took the failure for a success (itxd took a Receiver's batch for delivered while the client
// closed its connection: TestSubscription_ReceiverReplacedWhileCalledDoesNotPark, 2 runs in 30
// under -race). Whether such a Return leaves depends on the send goroutine's select between the
// cancelled context and its queue (one in two here, with the Returns queued while it is busy
// sending), so the scenario runs 32 times.
func TestRPC_FailedCallIsNotAnsweredAsSuccessOnShutdown(t *testing.T) {
	for i := 0; i < 32; i++ {
		failedCallOnShutdown(t)
	}
}

func failedCallOnShutdown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	serverEnd, clientEnd := net.Pipe()
	tr := &gatedTransport{Transport: rpc.NewStreamTransport(serverEnd), gate: make(chan struct{}),
		fifthRecv: make(chan struct{}), returns: map[uint32]rpccp.Return_Which{}}
	h := &failingHandle{started: make(chan struct{}), firstReturned: make(chan struct{})}
	conn := rpc.NewConn(tr, &rpc.Options{BootstrapClient: capnp.Client(schema.Handle_ServerToClient(h))})

	client := transport.NewStream(clientEnd)
	defer client.Close()
	drained := make(chan struct{})
	go func() { // read whatever the server sends, until it closes
		defer close(drained)
		for {
			in, err := client.RecvMessage()
			if err != nil {
				return
			}
			in.Release()
		}
	}()

	m, err := client.NewMessage()
	require.NoError(t, err)
	b, err := m.Message().NewBootstrap()
	require.NoError(t, err)
	b.SetQuestionId(0)
	require.NoError(t, m.Send()) // its Return is the first message sent: held at the gate
	m.Release()
	for q := uint32(1); q <= 3; q++ {
		rawCall(t, client, q, nil)
	}
	wait := func(ch chan struct{}, what string) {
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatal(what)
		}
	}
	wait(h.started, "the first call never started")
	wait(tr.fifthRecv, "the third call was never read (so the second was never dispatched)")

	closed := make(chan struct{})
	go func() {
		defer close(closed)
		conn.Close() // cancels the first call's context, waits for the calls and the sender
	}()
	wait(h.firstReturned, "the second call never ran")
	close(tr.gate)
	wait(closed, "the connection never closed")
	wait(drained, "the transport was never closed")

	tr.mu.Lock()
	defer tr.mu.Unlock()
	for q := uint32(1); q <= 3; q++ {
		if which, sent := tr.returns[q]; sent {
			require.Equal(t, rpccp.Return_Which_exception, which, "call %d failed, but its Return says %v", q, which)
		}
	}
}
