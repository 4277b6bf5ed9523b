package test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/wire"
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
	return mountHostContract(ctx, p, name, name, "1", []string{"t"})
}

// mountHostContract mounts an idleHost under name announcing one contract as given.
func mountHostContract(ctx context.Context, p schema.Project, name, contract, version string, consumed []string) (schema.Handle, error) {
	return mountHostServing(ctx, p, name, idleHost{}, []itx.ProcessorInfo{{Name: contract, ReducerVersion: version, ConsumedTypes: consumed}})
}

// mountHostServing mounts host under name in p, announcing contracts, and returns its handle (releasing
// it unmounts).
func mountHostServing(ctx context.Context, p schema.Project, name string, host schema.ProcessorHost_Server, contracts []itx.ProcessorInfo) (schema.Handle, error) {
	hf, releaseHosts := p.Processors(ctx, nil)
	defer releaseHosts()
	mf, release := hf.Processors().Mount(ctx, func(a schema.ProcessorHosts_mount_Params) error {
		if err := a.SetName(name); err != nil {
			return err
		}
		list, err := a.NewContracts(int32(len(contracts)))
		if err != nil {
			return err
		}
		if err := wire.SetProcessorContracts(list, contracts); err != nil {
			return err
		}
		return a.SetHost(schema.ProcessorHost_ServerToClient(host))
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

// A stream's processors' KV holds at most MaxProcessorKVKeys keys and MaxProcessorKVBytes bytes
// of keys and values, whatever a processor host sends through its ports: a put of one more key,
// or one growing the bytes past the bound, is refused with limitExceeded and writes nothing;
// overwrites within the bound are taken, and one that shrinks a value makes room.
func TestProcessorKV_BoundedPerStream(t *testing.T) {
	ts := startServer(t, server.Config{MaxProcessorKVKeys: 3, MaxProcessorKVBytes: 64})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/kv/bounded")
	configureRemote(t, s, "forwarder")
	spy := &spyHost{woken: make(chan struct{})}
	mountSpy(t, ts, spy)
	mustAppend(t, s, ev(string(examples.InboxMessage), `{"n":0}`))
	put := spyKVPut(t, spy)
	get := func(key string) (int, bool) {
		fut, release := spy.ports.KvGet(ctx, func(p schema.ProcessorPorts_kvGet_Params) error { return p.SetKey(key) })
		defer release()
		res, err := fut.Struct()
		require.NoError(t, err)
		v, err := res.Value()
		require.NoError(t, err)
		return len(v), res.Found()
	}

	require.NoError(t, put("a", 10))
	require.NoError(t, put("b", 10))
	require.NoError(t, put("c", 0), "an empty value is a value")
	n, found := get("c")
	require.True(t, found)
	require.Equal(t, 0, n)
	err := put("d", 1)
	requireCode(t, err, itx.ELimitExceeded)
	require.Contains(t, err.Error(), "at most 3 keys")
	_, found = get("d")
	require.False(t, found, "the refused put wrote nothing")
	require.NoError(t, put("a", 20), "an overwrite adds no key")

	// 1+20 + 1+10 + 1+0 = 33 bytes: 32 more would pass 64.
	err = put("c", 32)
	requireCode(t, err, itx.ELimitExceeded)
	require.Contains(t, err.Error(), "at most 64 bytes")
	n, _ = get("c")
	require.Equal(t, 0, n, "the refused put wrote nothing")
	require.NoError(t, put("a", 0), "a smaller value makes room")
	require.NoError(t, put("c", 32))

	// A delete frees its key and its bytes (kvDelete); deleting an absent key is no error.
	del := func(key string) error {
		fut, release := spy.ports.KvDelete(ctx, func(p schema.ProcessorPorts_kvDelete_Params) error { return p.SetKey(key) })
		defer release()
		_, err := fut.Struct()
		return err
	}
	requireCode(t, put("d", 1), itx.ELimitExceeded)
	require.NoError(t, del("c"))
	_, found = get("c")
	require.False(t, found, "deleted")
	require.NoError(t, del("c"), "deleting an absent key")
	require.NoError(t, put("d", 40), "the deleted key's room is free: 3 keys, 1+0 + 1+10 + 1+40 bytes")
	requireCode(t, put("e", 0), itx.ELimitExceeded)
}

// What one processor host announces is kept for its mount's life, and a project may hold
// --max-mounts-per-project hosts: 1,000 contracts of 1,000 consumed types made up to 16 MiB
// (the message bound) per host. A mount announcing more than 256 KiB of contracts (names,
// versions, types) is refused with tooLarge and mounts nothing.
func TestProcessorHosts_AnnouncedContractsAreBounded(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	types := make([]string, 100)
	for i := range types {
		types[i] = fmt.Sprintf("t%03d.%s", i, strings.Repeat("x", 90))
	}
	var contracts []itx.ProcessorInfo
	for i := range 100 { // about 1 MiB
		contracts = append(contracts, itx.ProcessorInfo{Name: fmt.Sprintf("c%d", i), ReducerVersion: "1", ConsumedTypes: types})
	}
	_, err := mountHostServing(ctx, p, "big", idleHost{}, contracts)
	requireCode(t, err, itx.ETooLarge)
	require.Contains(t, itx.ErrorMessage(err), "--max-host-contract-bytes")
	require.Empty(t, listHosts(t, p), "the refused mount mounted nothing")

	h, err := mountHostServing(ctx, p, "fits", idleHost{}, contracts[:20]) // about 200 KiB
	require.NoError(t, err)
	defer h.Release()
	require.Len(t, listHosts(t, p), 1)

	// Short types cost more to keep than their bytes: 66,000 of 2 to 4 bytes were 256,000 bytes,
	// under the bound, and each such mount held 1.8 MiB of itxd's memory. Each counts
	// HostContractEntryBytes more now, and the mount is refused.
	var short []itx.ProcessorInfo
	raw := 0
	for i := range 66 {
		c := itx.ProcessorInfo{Name: fmt.Sprintf("s%d", i), ReducerVersion: "1"}
		for j := range 1000 {
			c.ConsumedTypes = append(c.ConsumedTypes, fmt.Sprintf("t%d", j))
			raw += len(c.ConsumedTypes[j])
		}
		short = append(short, c)
	}
	require.Less(t, raw, server.DefaultMaxHostContractBytes, "the types' bytes alone are under the bound")
	_, err = mountHostServing(ctx, p, "short-types", idleHost{}, short)
	requireCode(t, err, itx.ETooLarge)
	require.Contains(t, itx.ErrorMessage(err), "--max-host-contract-bytes")
	require.Len(t, listHosts(t, p), 1, "the refused mount mounted nothing")
}

func (idleHost) Stop(context.Context, schema.ProcessorHost_stop) error { return nil }

// An append too large for itxd is refused by the client before it is sent, with the error itxd
// gives (tooLarge), and the RPC connection goes on: one above the message bound
// (--rpc-max-message-bytes, 16 MiB) used to end the whole connection, every capability on it
// with it.
func TestAppend_TooLargeIsRefusedAndTheConnectionLives(t *testing.T) {
	ts := startServer(t, server.Config{})
	s := stream(t, ts.project(t), "/bounds/huge")
	ctx := ctxT(t)
	payload := `{"x":"` + strings.Repeat("x", itx.MaxEventBytes-64) + `"}`
	huge := make([]itx.EventInput, 17) // 17 MiB: above the message bound as well
	for i := range huge {
		huge[i] = ev("big", payload)
	}
	_, err := client.Append(ctx, s, huge, itx.AppendOptions{})
	requireCode(t, err, itx.ETooLarge)

	// Refused the same by the pipelining appender, and by itxd itself for a batch the
	// client cannot size up front (whitespace compacted away: 9 MiB raw, 8 MiB + 4 events
	// stored; the client sends it and itxd refuses it).
	a := client.NewAppender(s, 4)
	_, err = a.Append(ctx, huge, itx.AppendOptions{})
	requireCode(t, err, itx.ETooLarge)
	spaced := make([]itx.EventInput, 9)
	for i := range spaced {
		spaced[i] = ev("big", `{"x":"`+strings.Repeat("x", (itx.MaxAppendBytes+64)/8)+`"}`+strings.Repeat(" ", 100_000))
	}
	_, err = client.Append(ctx, s, spaced, itx.AppendOptions{})
	requireCode(t, err, itx.ETooLarge)

	res := mustAppend(t, s, ev("small", `{}`))
	require.Equal(t, []int64{1}, res.Offsets, "nothing of the refused appends was written, and the connection serves calls")
}

// spyKVPut waits for spy's first wake and returns a put of size zero bytes under key through the
// ports it was handed (released when the test ends).
func spyKVPut(t *testing.T, spy *spyHost) func(key string, size int) error {
	t.Helper()
	ctx := ctxT(t)
	select {
	case <-spy.woken:
	case <-ctx.Done():
		t.Fatal("the host was never woken")
	}
	t.Cleanup(spy.ports.Release)
	return func(key string, size int) error {
		fut, release := spy.ports.KvPut(ctx, func(p schema.ProcessorPorts_kvPut_Params) error {
			if err := p.SetKey(key); err != nil {
				return err
			}
			return p.SetValue(make([]byte, size))
		})
		defer release()
		_, err := fut.Struct()
		return err
	}
}
