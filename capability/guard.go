package capability

import (
	"context"
	"fmt"
	"runtime/debug"
	"strings"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/server"
	"github.com/itx-dev/itx"
	itxserver "github.com/itx-dev/itx/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// guard is what a recovered handler panic reports to: the log, with its stack, and a counter.
type guard struct {
	log    zerolog.Logger
	panics *prometheus.CounterVec // by method
}

func guardOf(srv *itxserver.Server) guard {
	return guard{log: srv.Log(), panics: srv.Metrics().HandlerPanics}
}

// guarded serves impl with every one of its methods wrapped: first the access check (the
// session's token still valid, the method's right carried: see methodRights), then the handler,
// so that a panic in a handler is answered as an internal error, logged with its stack and
// counted, instead of ending itxd: go-capnp runs handlers without a recover. Every capability
// this package exports is built through it.
func guarded(g guard, a access, methods []server.Method, impl any) capnp.Client {
	for i := range methods {
		m := &methods[i]
		inner, name := m.Impl, m.InterfaceName+"."+m.MethodName
		rule := ruleName(m.InterfaceName, m.MethodName)
		m.Impl = func(ctx context.Context, call *server.Call) (err error) {
			if err := a.check(rule); err != nil {
				return fail(err)
			}
			defer func() {
				if p := recover(); p != nil {
					g.panics.WithLabelValues(name).Inc()
					g.log.Error().Str("method", name).Interface("panic", p).Str("stack", string(debug.Stack())).
						Msg("a capability handler panicked; the call fails, the server carries on")
					err = fail(itx.Errorf(itx.EInternal, "%s failed inside the server", name))
				}
			}()
			return coded(inner(ctx, call))
		}
	}
	sd, _ := impl.(server.Shutdowner)
	srv := server.New(methods, impl, sd)
	// A method this capability does not have (a client built from a newer schema, or one that
	// sends another interface's method) is answered as a declared but unserved one is: go-capnp's
	// own answer, a bare "unimplemented", carries no itx code for a client to match.
	srv.HandleUnknownMethod = func(m capnp.Method) *server.Method {
		return &server.Method{Method: m, Impl: func(context.Context, *server.Call) error {
			return notYet(fmt.Sprintf("method @%d of interface %#x", m.MethodID, m.InterfaceID))
		}}
	}
	return capnp.NewClient(srv)
}

// ruleName is a method's key in methodRights: "Interface.method", without the schema file the
// generated code puts in front of the interface ("itx.capnp:Stream").
func ruleName(iface, method string) string {
	if i := strings.LastIndexByte(iface, ':'); i >= 0 {
		iface = iface[i+1:]
	}
	return iface + "." + method
}
