package client

import (
	"testing"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/exc"
	"capnproto.org/go/capnp/v3/rpc"
	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
)

// A call whose message go-capnp could not send because the connection closed meanwhile fails
// "rpc: send message: rpc: connection closed" (an Appender's append sent just after the cut):
// it says disconnected in the SDK's words, without go-capnp's "rpc:" inside the reason either.
// It kept the inner one, and TestClient_LostConnectionIsDisconnected failed under load.
func TestDisconnected_SendOnAClosedConnection(t *testing.T) {
	for _, err := range []error{
		rpc.ExcClosed,
		exc.Annotator("rpc").WrapFailed("send message", rpc.ExcClosed),
		exc.Annotator("itx.capnp:Stream.readers").WrapFailed("send message", rpc.ExcClosed),
	} {
		got := disconnected(err)
		require.Equal(t, itx.EDisconnected, itx.ErrorCode(got), "%v", err)
		require.NotContains(t, got.Error(), "rpc:", "%v", err)
		require.Contains(t, got.Error(), "connection closed", "%v", err)
		require.True(t, capnp.IsDisconnected(got), "%v", err)
		require.ErrorIs(t, got, rpc.ErrConnClosed)
	}
}
