package client

import (
	"context"
	"encoding/json"
	"net"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/rpc"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/wire"
	"github.com/stretchr/testify/require"
)

// A Receiver served by ServeReceiver, called over a real RPC connection, gets the batch the
// server encoded, field for field, and answers with what the function returns.
func TestServeReceiver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := make(chan itx.DeliveryBatch, 2)
	boot := ServeReceiver(func(ctx context.Context, b itx.DeliveryBatch) (int64, error) {
		got <- b
		if b.Attempt > 1 {
			return 0, itx.Errorf(itx.EUnavailable, "try later")
		}
		return b.Events[0].Offset, nil
	})
	left, right := net.Pipe()
	serverConn := rpc.NewConn(rpc.NewStreamTransport(left), &rpc.Options{BootstrapClient: capnp.Client(boot)})
	defer serverConn.Close()
	clientConn := rpc.NewConn(rpc.NewStreamTransport(right), nil)
	defer clientConn.Close()
	r := schema.Receiver(clientConn.Bootstrap(ctx))
	defer r.Release()

	send := func(b *itx.DeliveryBatch) (int64, error) {
		fut, release := r.Receive(ctx, func(p schema.Receiver_receive_Params) error {
			dst, err := p.NewBatch()
			if err != nil {
				return err
			}
			return wire.SetDeliveryBatch(dst, b)
		})
		defer release()
		res, err := fut.Struct()
		if err != nil {
			return 0, err
		}
		return int64(res.ConfirmedOffset()), nil
	}

	want := itx.DeliveryBatch{
		DeliveryEnvelope: itx.DeliveryEnvelope{StreamID: "sid", Path: "/a", Subscription: "s", ConfiguredAtOffset: 2,
			CursorChangedAtOffset: 3, DeliveryID: "d1", Attempt: 1, HeadOffset: 9},
		Events: []itx.Event{
			{Offset: 4, Type: "note", Payload: json.RawMessage(`{"n":1}`), CreatedAt: 1000},
			{Offset: 5, Type: "note", Payload: json.RawMessage(`{"n":2}`), CreatedAt: 1001, IdempotencyKey: "k"},
		},
	}
	t.Run("decodes the batch and confirms", func(t *testing.T) {
		confirmed, err := send(&want)
		require.NoError(t, err)
		require.Equal(t, int64(4), confirmed)
		require.Equal(t, want, <-got)
	})
	t.Run("an error refuses the batch with its code", func(t *testing.T) {
		retry := want
		retry.Attempt = 2
		_, err := send(&retry)
		require.Equal(t, itx.EUnavailable, itx.ErrorCode(err), "%v", err)
		require.Equal(t, 2, (<-got).Attempt)
	})
}
