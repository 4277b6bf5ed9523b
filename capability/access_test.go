package capability

import (
	"strings"
	"testing"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/schemas"
	capschema "capnproto.org/go/capnp/v3/std/capnp/schema"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/stretchr/testify/require"
)

// schemaMethods lists every method of every interface of schema/itx.capnp as "Interface.method",
// read from the schema the generated code embeds, so a method or an interface added to the
// schema shows up here without anyone listing it.
func schemaMethods(t *testing.T) map[string][]string {
	t.Helper()
	var reg schemas.Registry
	schema.RegisterSchema(&reg)
	data, err := reg.Find(schema.Stream_TypeID)
	require.NoError(t, err)
	msg, err := capnp.Unmarshal(data)
	require.NoError(t, err)
	req, err := capschema.ReadRootCodeGeneratorRequest(msg)
	require.NoError(t, err)
	nodes, err := req.Nodes()
	require.NoError(t, err)
	out := map[string][]string{}
	for i := 0; i < nodes.Len(); i++ {
		n := nodes.At(i)
		if n.Which() != capschema.Node_Which_interface {
			continue
		}
		name, err := n.DisplayName()
		require.NoError(t, err)
		name = name[n.DisplayNamePrefixLength():]
		methods, err := n.Interface().Methods()
		require.NoError(t, err)
		for j := 0; j < methods.Len(); j++ {
			m, err := methods.At(j).Name()
			require.NoError(t, err)
			out[name] = append(out[name], m)
		}
	}
	require.Contains(t, out, "Stream")
	return out
}

// Every method of every interface itxd serves has a scope rule, and every rule names a schema
// method: a method added to the schema is denied (and this test fails) until its right is
// decided in methodRights.
func TestMethodRights_CoverSchema(t *testing.T) {
	methods := schemaMethods(t)
	seen := map[string]bool{}
	for iface, ms := range methods {
		for _, m := range ms {
			name := iface + "." + m
			seen[name] = true
			if clientServed[iface] {
				require.NotContains(t, methodRights, name, "%s is served by clients, not by itxd", name)
				continue
			}
			require.Contains(t, methodRights, name, "schema method %s has no scope rule in methodRights", name)
		}
	}
	for name := range methodRights {
		require.True(t, seen[name], "methodRights names %s, which the schema does not declare", name)
	}
	for iface := range clientServed {
		require.Contains(t, methods, iface)
	}
}

// The guard's rule key matches the names the generated code gives its methods.
func TestRuleName_MatchesGeneratedMethods(t *testing.T) {
	for _, m := range schema.Stream_Methods(nil, nil) {
		name := ruleName(m.InterfaceName, m.MethodName)
		require.True(t, strings.HasPrefix(name, "Stream."), name)
		require.Contains(t, methodRights, name)
	}
}

func TestAccess_Check(t *testing.T) {
	full := access{rights: rAll}
	require.NoError(t, full.check("Stream.append"))
	ro := full.narrow(rRead)
	require.Equal(t, itx.EPermissionDenied, itx.ErrorCode(ro.check("Stream.append")))
	require.NoError(t, ro.check("Stream.getEvents"))
	require.NoError(t, ro.check("Stream.readOnly"), "attenuating further is always allowed")
	none := ro.narrow(rAppend)
	require.Equal(t, itx.EPermissionDenied, itx.ErrorCode(none.check("Stream.getEvents")))
	require.Equal(t, itx.EPermissionDenied, itx.ErrorCode(full.check("Stream.noSuchMethod")), "a method without a rule is refused")
	admin := access{prefix: "/a", rights: rAdmin | rRead}
	require.True(t, itx.Scope{Prefix: "/a/b", Rights: []itx.Right{itx.RightRead}}.Within(admin.scope()))
	require.False(t, itx.Scope{Prefix: "/a/b"}.Within(admin.scope()), "every right is more than read and admin")
	require.False(t, itx.Scope{Prefix: "/b", Rights: []itx.Right{itx.RightRead}}.Within(admin.scope()))
	require.False(t, itx.Scope{Rights: []itx.Right{itx.RightRead}}.Within(admin.scope()), "every path is more than /a")
}

func TestAccess_ListPrefix(t *testing.T) {
	a := access{prefix: "/a", rights: rAll}
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{{"", "/a", true}, {"/", "/a", true}, {"/a/b", "/a/b", true}, {"/b", "", false}, {"/a", "/a", true}} {
		got, ok := a.listPrefix(tc.in)
		require.Equal(t, tc.ok, ok, tc.in)
		if ok {
			require.Equal(t, tc.want, got, tc.in)
		}
	}
	require.Error(t, a.reaches("/ab"), "prefixes are by segments")
	require.NoError(t, a.reaches("/a/b"))
}
