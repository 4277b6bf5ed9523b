package capability

import (
	"context"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/stretchr/testify/require"
)

// A Receiver the registry let go by name (End) answers a delivery that reaches it afterwards as
// absent (capabilityOffline: the subscription parks, or the name's new mount takes the events),
// not as the receiver refusing the events: the call fails on the released capability, which
// would otherwise read as an event-specific refusal and climb toward a skip or a halt.
func TestRemoteReceiver_EndedIsAbsent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc, done := client.ServeReceiverDone(func(context.Context, itx.DeliveryBatch) (int64, error) { return 0, nil })
	r := &remoteReceiver{client: rc}
	_, err := r.Receive(ctx, &itx.DeliveryBatch{})
	require.NoError(t, err, "mounted")
	r.End()
	<-done
	_, err = r.Receive(ctx, &itx.DeliveryBatch{})
	require.Equal(t, itx.ECapabilityOffline, itx.ErrorCode(err), "%v", err)
}
