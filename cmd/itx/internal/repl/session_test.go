package repl

import (
	"context"
	"testing"

	"capnproto.org/go/capnp/v3"
	"github.com/dop251/goja"
	"github.com/stretchr/testify/require"
)

// A Go panic escaping the runtime during an evaluation (a bug behind a function the script
// called) is answered as an internal error, and the session goes on.
func TestEval_RecoversAGoPanic(t *testing.T) {
	s, _ := offlineSession(t, FormatJSON)
	require.NoError(t, s.vm.Set("buggy", func(goja.FunctionCall) goja.Value {
		var m map[string]int
		m["x"] = 1 // a write to a nil map: a runtime fault
		return goja.Undefined()
	}))
	_, err := s.Eval(context.Background(), "<test>", `let before = 1; buggy()`)
	require.Error(t, err)
	f := Describe(err)
	require.Equal(t, "internal", f.Code)
	require.Contains(t, f.Message, "assignment to entry in nil map")

	v, err := s.Eval(context.Background(), "<test>", `[1, 2, 3].map(x => x * 2).join(",")`)
	require.NoError(t, err, "the runtime is usable after the panic")
	require.Equal(t, "2,4,6", v.String())
}

// A runtime fault inside a binding becomes an internal error the script can catch; a thrown
// JavaScript value passes through as it is.
func TestBinding_FaultIsAnInternalError(t *testing.T) {
	s, _ := offlineSession(t, FormatJSON)
	faulty := binding{call: func(context.Context, *Session, capnp.Client, capPath, []goja.Value) (any, error) {
		var p *capPath
		return p.iface, nil
	}}
	_, err := faulty.run(context.Background(), s, capnp.Client{}, capPath{}, nil)
	require.Equal(t, "internal", Describe(err).Code)

	thrown := s.vm.ToValue("thrown")
	throwing := binding{call: func(context.Context, *Session, capnp.Client, capPath, []goja.Value) (any, error) {
		panic(thrown)
	}}
	require.PanicsWithValue(t, thrown, func() { throwing.run(context.Background(), s, capnp.Client{}, capPath{}, nil) })
}
