package test

import (
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors/remote"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// Black-box probes of issues 10 and 11 (processors in-process and remote) over real RPC. The
// other probes (placements, snapshots and runtime state in both placements, the unknown
// contract, a second name running a contract, waits ended by a removal, takeover and another
// token's mount, restarts recording stream/woken, a remote reducer-version change) passed and
// repeat existing tests; this one covers what none did.

// ProcessorHosts.mount refuses a mount it could never serve with invalidArgument, and mounts
// nothing: no name, no contract, a contract announced twice, a contract without a name, a
// reducer version or consumed types, an empty consumed type, a name that is not UTF-8.
func TestBB1011_MountRefusesBadInput(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	good := func() []itx.ProcessorInfo { return referenceHost(t, "guestbook").Contracts() }
	cases := map[string]struct {
		name      string
		contracts func() []itx.ProcessorInfo
	}{
		"empty name":          {"", good},
		"no contracts":        {"h", func() []itx.ProcessorInfo { return nil }},
		"announced twice":     {"h", func() []itx.ProcessorInfo { return append(good(), good()...) }},
		"invalid UTF-8 name":  {"h\xff", good},
		"empty contract name": {"h", func() []itx.ProcessorInfo { c := good(); c[0].Name = ""; return c }},
		"no reducer version":  {"h", func() []itx.ProcessorInfo { c := good(); c[0].ReducerVersion = ""; return c }},
		"no consumed types":   {"h", func() []itx.ProcessorInfo { c := good(); c[0].ConsumedTypes = nil; return c }},
		"empty consumed type": {"h", func() []itx.ProcessorInfo { c := good(); c[0].ConsumedTypes = []string{""}; return c }},
	}
	for what, c := range cases {
		// A host per attempt: a refused mount releases its host, which ends that host's sessions.
		hs := remote.NewHostServer(remote.Config{Host: referenceHost(t, "guestbook"), Logf: t.Logf})
		h, err := mountHostServing(ctx, p, c.name, hs, c.contracts())
		if err == nil {
			h.Release()
		}
		require.Equal(t, itx.EInvalid, itx.ErrorCode(err), "%s: %v", what, err)
	}
	require.Empty(t, listHosts(t, p), "a refused mount mounts nothing")
}
