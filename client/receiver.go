package client

import (
	"context"
	"sync"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/wire"
)

// ServeReceiver returns a Receiver capability that hands each batch the server pushes to f,
// decoded, and answers with the offset f confirmed through (0: the whole batch; for an
// offset-acking subscription, SubscriptionConfig.ConfirmWindow, 0 confirms nothing yet: the batch
// counts as delivered, and ConfirmSubscription confirms it once durable). An error from f
// is the receiver refusing the batch: the server retries it along its ladder (an error carrying
// an itx code, such as unavailable, keeps that code). Batches arrive one at a time, in order:
// f is not called again until it has returned.
func ServeReceiver(f func(ctx context.Context, batch itx.DeliveryBatch) (confirmedOffset int64, err error)) schema.Receiver {
	return schema.Receiver_ServerToClient(receiverFunc(f))
}

type receiverFunc func(ctx context.Context, batch itx.DeliveryBatch) (int64, error)

// ServeReceiverDone is ServeReceiver with a channel closed once itxd let the Receiver go: its
// mount replaced by another mount of its name (by this token's login on another connection),
// unmounted by name (Capabilities.unmount, by its mounter or the admin right), its handle
// cancelled or released, or the connection lost. From then on no subscription delivers to it:
// a provider that should go on receiving mounts again (a replacement already took its place).
func ServeReceiverDone(f func(ctx context.Context, batch itx.DeliveryBatch) (confirmedOffset int64, err error)) (schema.Receiver, <-chan struct{}) {
	r := &endingReceiver{receiverFunc: f, done: make(chan struct{})}
	return schema.Receiver_ServerToClient(r), r.done
}

// endingReceiver is a receiverFunc that closes done when its last reference goes.
type endingReceiver struct {
	receiverFunc
	done chan struct{}
	once sync.Once
}

// Shutdown runs once, when the capability's last reference is released (go-capnp): itxd released
// it, or the connection ended.
func (r *endingReceiver) Shutdown() { r.once.Do(func() { close(r.done) }) }

// batchOf decodes a pushed batch (a Receiver's or an EventSink's).
func batchOf(b schema.DeliveryBatch, err error) (itx.DeliveryBatch, error) {
	if err != nil {
		return itx.DeliveryBatch{}, err
	}
	return wire.DeliveryBatchFromSchema(b)
}

func (f receiverFunc) Receive(ctx context.Context, call schema.Receiver_receive) error {
	batch, err := batchOf(call.Args().Batch())
	if err != nil {
		return err
	}
	confirmed, err := f(ctx, batch)
	if err != nil {
		return err
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	res.SetConfirmedOffset(uint64(confirmed))
	return nil
}

// MountReceiver mounts r under name in a project and returns the mount's handle: releasing it,
// cancelling it or closing the connection unmounts r. It takes ownership of r.
func MountReceiver(ctx context.Context, project schema.Project, name string, r schema.Receiver) (schema.Handle, error) {
	if err := NotSent(ctx, "MountReceiver"); err != nil {
		r.Release()
		return schema.Handle{}, err
	}
	cf, releaseCaps := project.Capabilities(ctx, nil)
	defer ReleaseAfter(ctx, releaseCaps)
	mf, releaseMount := cf.Capabilities().Mount(ctx, func(a schema.Capabilities_mount_Params) error {
		if err := a.SetName(name); err != nil {
			return err
		}
		return a.SetReceiver(r)
	})
	defer ReleaseAfter(ctx, releaseMount)
	if _, err := Await(ctx, mf); err != nil {
		return schema.Handle{}, err
	}
	return mf.Handle().AddRef(), nil
}
