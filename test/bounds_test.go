package test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// idleHost is a ProcessorHost that is never woken in these tests.
type idleHost struct{}

func (idleHost) Wake(context.Context, schema.ProcessorHost_wake) error {
	return errors.New("not expected")
}

func (idleHost) GetRuntimeState(context.Context, schema.ProcessorHost_getRuntimeState) error {
	return errors.New("not expected")
}

// mountHost mounts an idleHost under name announcing one contract of the same name.
func mountHost(ctx context.Context, p schema.Project, name string) (schema.Handle, error) {
	hf, releaseHosts := p.Processors(ctx, nil)
	defer releaseHosts()
	mf, release := hf.Processors().Mount(ctx, func(a schema.ProcessorHosts_mount_Params) error {
		if err := a.SetName(name); err != nil {
			return err
		}
		if err := a.SetHost(schema.ProcessorHost_ServerToClient(idleHost{})); err != nil {
			return err
		}
		list, err := a.NewContracts(1)
		if err != nil {
			return err
		}
		c := list.At(0)
		if err := c.SetName(name); err != nil {
			return err
		}
		if err := c.SetReducerVersion("1"); err != nil {
			return err
		}
		types, err := c.NewConsumedTypes(1)
		if err != nil {
			return err
		}
		return types.Set(0, "t")
	})
	defer release()
	res, err := mf.Struct()
	if err != nil {
		return schema.Handle{}, err
	}
	return res.Handle().AddRef(), nil
}

// A project holds at most MaxMountsPerProject mounted capabilities, and as many processor hosts:
// one more name is refused with limitExceeded and changes nothing; a name already mounted can
// be mounted again (a reconnecting provider takes over); a released mount frees its place.
func TestMounts_BoundedPerProject(t *testing.T) {
	const max = 3
	ts := startServer(t, server.Config{MaxMountsPerProject: max})
	ctx := ctxT(t)
	p := ts.project(t)
	receiver := func() schema.Receiver {
		return client.ServeReceiver(func(context.Context, itx.DeliveryBatch) (int64, error) { return 0, nil })
	}
	for _, kind := range []struct {
		name  string
		mount func(name string) (schema.Handle, error)
		list  func() int
	}{
		{"capabilities", func(name string) (schema.Handle, error) { return client.MountReceiver(ctx, p, name, receiver()) },
			func() int {
				cf, release := p.Capabilities(ctx, nil)
				defer release()
				l, err := client.ListMounts(ctx, cf.Capabilities())
				require.NoError(t, err)
				return len(l)
			}},
		{"processor hosts", func(name string) (schema.Handle, error) { return mountHost(ctx, p, name) },
			func() int { return len(listHosts(t, p)) }},
	} {
		t.Run(kind.name, func(t *testing.T) {
			var handles []schema.Handle
			defer func() {
				for _, h := range handles {
					h.Release()
				}
			}()
			for i := range max {
				h, err := kind.mount(fmt.Sprintf("m-%d", i))
				require.NoError(t, err)
				handles = append(handles, h)
			}
			_, err := kind.mount("one-more")
			require.Equal(t, itx.ELimitExceeded, itx.ErrorCode(err), "%v", err)
			require.Equal(t, max, kind.list(), "the refused mount changed nothing")

			h, err := kind.mount("m-0") // the same name again replaces, it does not add
			require.NoError(t, err)
			handles = append(handles, h)
			require.Equal(t, max, kind.list())

			cf, release := handles[1].Cancel(ctx, nil)
			_, err = cf.Struct()
			release()
			require.NoError(t, err)
			waitUntil(t, "the released mount's place freed", func() bool { return kind.list() == max-1 })
			h, err = kind.mount("one-more")
			require.NoError(t, err)
			handles = append(handles, h)
		})
	}
}

// A stream holds at most MaxReadersPerStream registered readers: one more name is refused with
// limitExceeded and stored nothing; a registered one still moves; a removed one frees its place.
func TestReaders_BoundedPerStream(t *testing.T) {
	const max = 3
	ts := startServer(t, server.Config{MaxReadersPerStream: max})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/readers/bounded")
	mustAppend(t, s, ev("a", `{}`), ev("a", `{}`))
	rf, releaseReaders := s.Readers(ctx, nil)
	defer releaseReaders()
	r := rf.Readers()
	for i := range max {
		require.NoError(t, client.RegisterReader(ctx, r, fmt.Sprintf("r-%d", i), 1))
	}
	requireCode(t, client.RegisterReader(ctx, r, "one-more", 1), itx.ELimitExceeded)
	list, err := client.ListReaders(ctx, r)
	require.NoError(t, err)
	require.Len(t, list, max, "the refused reader stored nothing")
	require.NoError(t, client.RegisterReader(ctx, r, "r-0", 2), "a registered reader still moves")

	fut, release := r.Remove(ctx, func(p schema.Readers_remove_Params) error { return p.SetName("r-1") })
	_, err = fut.Struct()
	release()
	require.NoError(t, err)
	require.NoError(t, client.RegisterReader(ctx, r, "one-more", 1))
}
